//! Priority bands (B115): which requests a full lot refuses last.
//!
//! A request's band comes from its `ate-priority` header, which only the
//! operator's Envoy may set (B116): `critical`, `standard` (the default) or
//! `sheddable`, compared case-insensitively; anything else is `standard`,
//! and counted, so that a typo shows. A flight acts with the highest band of
//! the callers waiting on it.

use crate::actor::target;
use crate::proto::base::HeaderMap;

/// The request header naming a request's band.
pub const PRIORITY_HEADER: &str = "ate-priority";

/// A request's priority band; ordered so that the higher band compares
/// greater (`Critical > Standard > Sheddable`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Band {
    /// Shed first, admitted last: at most its share of the lot (B117).
    Sheddable,
    #[default]
    Standard,
    /// Takes a lower band's slot when the lot is full (B118).
    Critical,
}

impl Band {
    /// Every value, lowest first, in the order of their discriminants.
    pub const ALL: [Band; 3] = [Band::Sheddable, Band::Standard, Band::Critical];

    /// The label value, and the header's value.
    pub fn name(self) -> &'static str {
        match self {
            Band::Sheddable => "sheddable",
            Band::Standard => "standard",
            Band::Critical => "critical",
        }
    }

    /// The band a header value names, if it names one.
    pub fn parse(value: &[u8]) -> Option<Band> {
        Band::ALL.into_iter().find(|band| value.eq_ignore_ascii_case(band.name().as_bytes()))
    }
}

/// What a request's headers say about its band.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Priority {
    pub band: Band,
    /// The header was present and named no band (treated as standard).
    pub unknown: bool,
}

/// Reads `ate-priority` (its first occurrence, as for every header, B1).
pub fn priority(headers: &HeaderMap) -> Priority {
    match target::header(headers, PRIORITY_HEADER) {
        None => Priority::default(),
        Some(value) => match Band::parse(value) {
            Some(band) => Priority { band, unknown: false },
            None => Priority { band: Band::Standard, unknown: true },
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::base::HeaderValue;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (key, value) in pairs {
            let mut header = HeaderValue::new();
            header.key = key.to_string();
            header.raw_value = value.as_bytes().to_vec();
            map.headers.push(header);
        }
        map
    }

    #[test]
    fn b115_bands_are_ordered_and_read_case_insensitively() {
        assert!(Band::Critical > Band::Standard && Band::Standard > Band::Sheddable);
        assert!(Band::ALL.iter().enumerate().all(|(i, b)| *b as usize == i));
        assert_eq!(priority(&headers(&[])), Priority { band: Band::Standard, unknown: false });
        let of = |v: &str| priority(&headers(&[("Ate-Priority", v)]));
        assert_eq!(of("CRITICAL"), Priority { band: Band::Critical, unknown: false });
        assert_eq!(of("Sheddable"), Priority { band: Band::Sheddable, unknown: false });
        assert_eq!(of("standard"), Priority { band: Band::Standard, unknown: false });
        assert_eq!(of("urgent"), Priority { band: Band::Standard, unknown: true }, "a typo is standard");
        assert_eq!(of(""), Priority { band: Band::Standard, unknown: true });
        let first = priority(&headers(&[("ate-priority", "sheddable"), ("ate-priority", "critical")]));
        assert_eq!(first.band, Band::Sheddable, "the first occurrence counts");
    }
}
