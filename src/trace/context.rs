//! W3C trace context (<https://www.w3.org/TR/trace-context/>): the
//! `traceparent` Envoy puts in the ext_proc stream's metadata, and the one
//! the router sends with each ResumeActor call (B122).

/// The `traceparent` metadata key.
pub const TRACEPARENT: &str = "traceparent";
/// The `tracestate` metadata key.
pub const TRACESTATE: &str = "tracestate";

/// A span's identity: its trace and its own id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SpanContext {
    pub trace_id: [u8; 16],
    pub span_id: [u8; 8],
}

impl SpanContext {
    /// A new span in this one's trace.
    pub fn child(&self) -> SpanContext {
        SpanContext { trace_id: self.trace_id, span_id: new_span_id() }
    }

    /// The `traceparent` value naming this span as the parent, sampled.
    pub fn traceparent(&self) -> String {
        format!("00-{}-{}-01", hex(&self.trace_id), hex(&self.span_id))
    }
}

/// A sampled parent from Envoy: the span its ext_proc call opened, and the
/// vendors' `tracestate` the router's spans carry on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Parent {
    pub context: SpanContext,
    pub tracestate: String,
}

/// The parent in a stream's `traceparent`, when it is valid and sampled;
/// `None` otherwise, and then nothing is traced (B123): Envoy's sampling
/// decides, the router starts no trace of its own.
pub fn sampled_parent(traceparent: &[u8], tracestate: Option<&[u8]>) -> Option<Parent> {
    let text = std::str::from_utf8(traceparent).ok()?.trim();
    let mut fields = text.split('-');
    let (version, trace_id, span_id, flags) =
        (fields.next()?, fields.next()?, fields.next()?, fields.next()?);
    // Version 00 has exactly four fields; a later version may append more,
    // which a reader of 00 ignores. ff is never valid.
    let version = from_hex::<1>(version)?[0];
    if version == 0xff || (version == 0 && fields.next().is_some()) {
        return None;
    }
    let (trace_id, span_id) = (from_hex::<16>(trace_id)?, from_hex::<8>(span_id)?);
    let flags = from_hex::<1>(flags)?[0];
    if trace_id == [0; 16] || span_id == [0; 8] || flags & 1 == 0 {
        return None;
    }
    let tracestate = tracestate.and_then(|s| std::str::from_utf8(s).ok()).unwrap_or_default().trim();
    Some(Parent { context: SpanContext { trace_id, span_id }, tracestate: tracestate.to_string() })
}

/// A random, non-zero span id.
pub fn new_span_id() -> [u8; 8] {
    loop {
        let id = fastrand::u64(..).to_be_bytes();
        if id != [0; 8] {
            return id;
        }
    }
}

/// Lowercase hex, as trace context writes ids.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Exactly `N` bytes of lowercase hex (upper case is invalid in trace
/// context).
fn from_hex<const N: usize>(text: &str) -> Option<[u8; N]> {
    let digits = text.as_bytes();
    if digits.len() != 2 * N {
        return None;
    }
    let digit = |d: u8| match d {
        b'0'..=b'9' => Some(d - b'0'),
        b'a'..=b'f' => Some(d - b'a' + 10),
        _ => None,
    };
    let mut out = [0; N];
    for (i, pair) in digits.chunks(2).enumerate() {
        out[i] = digit(pair[0])? << 4 | digit(pair[1])?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const ENVOY: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";

    #[test]
    fn b123_a_sampled_parent_is_read_with_its_state() {
        let parent = sampled_parent(ENVOY.as_bytes(), Some(b"congo=t61rcWkgMzE")).unwrap();
        assert_eq!(hex(&parent.context.trace_id), "0af7651916cd43dd8448eb211c80319c");
        assert_eq!(hex(&parent.context.span_id), "b7ad6b7169203331");
        assert_eq!(parent.tracestate, "congo=t61rcWkgMzE");
        assert_eq!(parent.context.traceparent(), ENVOY);
    }

    #[test]
    fn b123_unsampled_or_invalid_parents_trace_nothing() {
        for bad in [
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00",
            "00-00000000000000000000000000000000-b7ad6b7169203331-01",
            "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",
            "00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01",
            "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-extra",
            "00-0af7651916cd43dd8448eb211c80319-b7ad6b7169203331-01",
            "",
            "garbage",
        ] {
            assert_eq!(sampled_parent(bad.as_bytes(), None), None, "{bad:?}");
        }
        let later = "01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-what-comes";
        assert!(
            sampled_parent(later.as_bytes(), None).is_some(),
            "a later version's extra fields are ignored"
        );
    }

    #[test]
    fn a_child_keeps_the_trace_and_takes_a_new_id() {
        let parent = sampled_parent(ENVOY.as_bytes(), None).unwrap().context;
        let child = parent.child();
        assert_eq!(child.trace_id, parent.trace_id);
        assert_ne!(child.span_id, parent.span_id);
        assert_ne!(child.span_id, [0; 8]);
    }
}
