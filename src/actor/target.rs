//! Actor addressing: which actor a request is for, and which port on it
//! (rules B1-B5).
//!
//! Everything here is a pure function of the request's headers and ext_proc
//! attributes, so a bad reference is answered with a 404 before any control
//! plane call is made (B4).

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use protobuf::well_known_types::struct_::{value, Struct};

use crate::proto::base::HeaderMap;

/// The request header naming the target actor.
pub const ACTOR_HEADER: &str = "ate-target-actor";
/// The filter-state attribute consulted when the header is absent (B2).
pub const ACTOR_ATTRIBUTE: &str = "filter_state['dev.ate.target.actor']";
/// The filter-state attribute holding a CONNECT tunnel's `host:port` (B5).
pub const AUTHORITY_ATTRIBUTE: &str = "filter_state['dev.ate.connect.authority']";
/// The port used when no other rule names one (B5).
pub const DEFAULT_TARGET_PORT: u16 = 80;

/// A canonical actor id, `atespace/name`, both parts DNS-1123 labels.
///
/// Cheap to clone: flights, metrics and status entries all share one
/// allocation.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ActorId(Arc<str>);

impl ActorId {
    /// Parses a reference per B3: split at the first `/`, both parts labels.
    pub fn parse(reference: &str) -> Result<ActorId, InvalidTarget> {
        let (atespace, name) = reference.split_once('/').ok_or(InvalidTarget)?;
        if is_dns1123_label(atespace) && is_dns1123_label(name) {
            Ok(ActorId(Arc::from(reference)))
        } else {
            Err(InvalidTarget)
        }
    }

    /// The whole canonical id.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The part before the `/`.
    pub fn atespace(&self) -> &str {
        self.0.split_once('/').map_or("", |(a, _)| a)
    }

    /// The part after the `/`.
    pub fn name(&self) -> &str {
        self.0.split_once('/').map_or("", |(_, n)| n)
    }
}

impl fmt::Display for ActorId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for ActorId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ActorId({})", self.0)
    }
}

/// The request names no valid actor (B3, B4).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InvalidTarget;

/// Where a request goes: the actor and the port on its worker.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    pub actor: ActorId,
    pub port: u16,
    /// The canonical id is already the request's one `ate-target-actor`
    /// header, so a route needs no header mutation.
    pub carries_actor_header: bool,
}

/// Attributes as Envoy sends them: filter name to a struct of attributes.
pub type Attributes = HashMap<String, Struct>;

/// Resolves the target of a request from its headers and attributes.
pub fn resolve(headers: &HeaderMap, attributes: &Attributes) -> Result<Target, InvalidTarget> {
    let (reference, from_header) = match header(headers, ACTOR_HEADER) {
        Some(value) if !value.is_empty() => (value, true),
        _ => (attribute(attributes, ACTOR_ATTRIBUTE).unwrap_or_default().as_bytes(), false),
    };
    let reference = std::str::from_utf8(reference).map_err(|_| InvalidTarget)?;
    // A valid reference is canonical as it stands (B3 normalises nothing):
    // the header needs setting only when it is absent or repeated.
    let actor = ActorId::parse(reference)?;
    let carries_actor_header = from_header
        && headers.headers.iter().filter(|h| h.key.eq_ignore_ascii_case(ACTOR_HEADER)).count() == 1;
    Ok(Target { actor, port: target_port(headers, attributes), carries_actor_header })
}

/// The target port per B5.
pub fn target_port(headers: &HeaderMap, attributes: &Attributes) -> u16 {
    if let Some(authority) = attribute(attributes, AUTHORITY_ATTRIBUTE).filter(|a| !a.is_empty()) {
        return port_of(authority.as_bytes()).unwrap_or(DEFAULT_TARGET_PORT);
    }
    if header(headers, ":method").is_some_and(|m| m.eq_ignore_ascii_case(b"CONNECT")) {
        if let Some(authority) = header(headers, ":authority") {
            return port_of(authority).unwrap_or(DEFAULT_TARGET_PORT);
        }
    }
    DEFAULT_TARGET_PORT
}

/// The first value of a header, compared case-insensitively (B1). The value
/// is `raw_value`, or `value` when `raw_value` is empty. When a header is
/// repeated, the first occurrence counts.
pub fn header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a [u8]> {
    headers.headers.iter().find(|h| h.key.eq_ignore_ascii_case(name)).map(|h| {
        if h.raw_value.is_empty() {
            h.value.as_bytes()
        } else {
            h.raw_value.as_slice()
        }
    })
}

/// A string attribute, under whichever filter-name key it arrives (B2).
fn attribute<'a>(attributes: &'a Attributes, name: &str) -> Option<&'a str> {
    let mut keys: Vec<&String> = attributes.keys().collect();
    // Deterministic when (unusually) several filters send the same attribute.
    keys.sort();
    keys.into_iter().find_map(|key| match &attributes[key].fields.get(name)?.kind {
        Some(value::Kind::StringValue(s)) => Some(s.as_str()),
        _ => None,
    })
}

/// The port of `host:port`, `[v6]:port`; `None` when absent or out of range.
fn port_of(authority: &[u8]) -> Option<u16> {
    let authority = std::str::from_utf8(authority).ok()?;
    let (host, port) = authority.rsplit_once(':')?;
    // A bare IPv6 address has colons but no port.
    if host.contains(':') && !(host.starts_with('[') && host.ends_with(']')) {
        return None;
    }
    if port.is_empty() || !port.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    port.parse::<u16>().ok().filter(|&p| p != 0)
}

/// 1-63 chars of `[a-z0-9-]`, starting and ending alphanumeric.
fn is_dns1123_label(label: &str) -> bool {
    let bytes = label.as_bytes();
    let alnum = |b: &u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    (1..=63).contains(&bytes.len())
        && bytes.iter().all(|b| alnum(b) || *b == b'-')
        && bytes.first().is_some_and(alnum)
        && bytes.last().is_some_and(alnum)
}

/// Headers as Envoy sends them, raw values, for the unit tests of every
/// module that reads them.
#[cfg(test)]
pub(crate) fn test_headers(pairs: &[(&str, &[u8])]) -> HeaderMap {
    let mut map = HeaderMap::new();
    for (key, raw) in pairs {
        let mut h = crate::proto::base::HeaderValue::new();
        h.key = key.to_string();
        h.raw_value = raw.to_vec();
        map.headers.push(h);
    }
    map
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::base::HeaderValue;
    use protobuf::well_known_types::struct_::Value;

    fn attrs(name: &str, value: &str) -> Attributes {
        let mut s = Struct::new();
        let mut v = Value::new();
        v.set_string_value(value.to_string());
        s.fields.insert(name.to_string(), v);
        HashMap::from([("envoy.filters.http.ext_proc".to_string(), s)])
    }

    #[test]
    fn b1_header_case_insensitive_raw_value() {
        let t = resolve(&test_headers(&[("ATE-Target-Actor", b"demo/actor-0")]), &Attributes::new());
        assert_eq!(t.unwrap().actor.as_str(), "demo/actor-0");
    }

    #[test]
    fn b1_falls_back_to_value_when_raw_value_empty() {
        let mut map = HeaderMap::new();
        let mut h = HeaderValue::new();
        h.key = ACTOR_HEADER.into();
        h.value = "demo/a".into();
        map.headers.push(h);
        assert_eq!(resolve(&map, &Attributes::new()).unwrap().actor.as_str(), "demo/a");
    }

    #[test]
    fn b1_first_duplicate_header_counts() {
        let map = test_headers(&[(ACTOR_HEADER, b"demo/first"), (ACTOR_HEADER, b"demo/second")]);
        assert_eq!(resolve(&map, &Attributes::new()).unwrap().actor.as_str(), "demo/first");
    }

    #[test]
    fn b2_attribute_used_when_header_absent_or_empty_and_header_wins() {
        let a = attrs(ACTOR_ATTRIBUTE, "space/from-attr");
        assert_eq!(resolve(&test_headers(&[]), &a).unwrap().actor.as_str(), "space/from-attr");
        let empty = test_headers(&[(ACTOR_HEADER, b"")]);
        assert_eq!(resolve(&empty, &a).unwrap().actor.as_str(), "space/from-attr");
        let both = test_headers(&[(ACTOR_HEADER, b"space/from-header")]);
        assert_eq!(resolve(&both, &a).unwrap().actor.as_str(), "space/from-header");
    }

    #[test]
    fn b3_b4_invalid_references() {
        let long = "a".repeat(64);
        let cases: Vec<Vec<u8>> = vec![
            b"".to_vec(),
            b"demo".to_vec(),
            b"/actor".to_vec(),
            b"demo/".to_vec(),
            b"demo/a/b".to_vec(),
            b"Demo/actor".to_vec(),
            b"demo/-actor".to_vec(),
            b"demo/actor-".to_vec(),
            b"demo/act_or".to_vec(),
            b"demo/act or".to_vec(),
            b"demo/..".to_vec(),
            b"demo/a%2Fb".to_vec(),
            format!("demo/{long}").into_bytes(),
            vec![b'd', b'/', 0xff, 0xfe],
        ];
        for raw in cases {
            let got = resolve(&test_headers(&[(ACTOR_HEADER, &raw)]), &Attributes::new());
            assert_eq!(got, Err(InvalidTarget), "{:?}", String::from_utf8_lossy(&raw));
        }
        assert_eq!(resolve(&test_headers(&[]), &Attributes::new()), Err(InvalidTarget));
        let max = "b".repeat(63);
        let ok = format!("{max}/{max}");
        assert!(resolve(&test_headers(&[(ACTOR_HEADER, ok.as_bytes())]), &Attributes::new()).is_ok());
    }

    #[test]
    fn b5_ports() {
        let actor: (&str, &[u8]) = (ACTOR_HEADER, b"demo/a");
        let port = |h: &[(&str, &[u8])], a: &Attributes| resolve(&test_headers(h), a).unwrap().port;
        let none = Attributes::new();
        assert_eq!(port(&[actor], &none), 80);
        assert_eq!(port(&[actor, (":method", b"GET"), (":authority", b"h:8443")], &none), 80);
        assert_eq!(port(&[actor, (":method", b"CONNECT"), (":authority", b"h:8443")], &none), 8443);
        assert_eq!(port(&[actor, (":method", b"CONNECT"), (":authority", b"[fd00::1]:22")], &none), 22);
        assert_eq!(port(&[actor, (":method", b"CONNECT"), (":authority", b"h:99999")], &none), 80);
        assert_eq!(port(&[actor, (":method", b"CONNECT"), (":authority", b"h:0")], &none), 80);
        assert_eq!(port(&[actor, (":method", b"CONNECT"), (":authority", b"fd00::1")], &none), 80);
        let auth = attrs(AUTHORITY_ATTRIBUTE, "backend:9000");
        assert_eq!(port(&[actor, (":method", b"CONNECT"), (":authority", b"h:8443")], &auth), 9000);
        assert_eq!(port(&[actor], &attrs(AUTHORITY_ATTRIBUTE, "backend:http")), 80);
    }
}
