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

/// The longest `tracestate` carried on (W3C's limit); a longer one is
/// dropped, not cut, as cutting could leave a vendor's entry half.
pub const TRACESTATE_MAX: usize = 512;

/// The parent in a stream's `traceparent`, when it is valid and sampled;
/// `None` otherwise, and then nothing is traced (B123): Envoy's sampling
/// decides, the router starts no trace of its own. `tracestate` is the
/// header's values, in order, joined as one list.
pub fn sampled_parent(traceparent: &[u8], tracestate: &[&[u8]]) -> Option<Parent> {
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
    let values: Option<Vec<&str>> =
        tracestate.iter().map(|v| std::str::from_utf8(v).ok().map(str::trim)).collect();
    let tracestate = values.map(|v| v.join(",")).filter(|s| s.len() <= TRACESTATE_MAX).unwrap_or_default();
    Some(Parent { context: SpanContext { trace_id, span_id }, tracestate })
}

/// The sampled parent a stream's metadata names (B123): exactly one
/// `traceparent` (two name no one parent), and its `tracestate` values.
pub fn parent_in<'a>(metadata: impl Iterator<Item = (&'a str, &'a [u8])>) -> Option<Parent> {
    let (mut traceparents, mut tracestate) = (Vec::new(), Vec::new());
    for (key, value) in metadata {
        match key {
            TRACEPARENT => traceparents.push(value),
            TRACESTATE => tracestate.push(value),
            _ => {}
        }
    }
    let [traceparent] = traceparents[..] else { return None };
    sampled_parent(traceparent, &tracestate)
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
        let parent = sampled_parent(ENVOY.as_bytes(), &[b"congo=t61rcWkgMzE"]).unwrap();
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
            assert_eq!(sampled_parent(bad.as_bytes(), &[]), None, "{bad:?}");
        }
        let later = "01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-what-comes";
        assert!(
            sampled_parent(later.as_bytes(), &[]).is_some(),
            "a later version's extra fields are ignored"
        );
    }

    #[test]
    fn b123_one_traceparent_names_the_parent_two_name_none() {
        let one = [("grpc-timeout", &b"1S"[..]), (TRACEPARENT, ENVOY.as_bytes()), (TRACESTATE, b"a=1")];
        assert_eq!(parent_in(one.into_iter()).unwrap().tracestate, "a=1");
        let two = [(TRACEPARENT, &b"garbage"[..]), (TRACEPARENT, ENVOY.as_bytes())];
        assert_eq!(parent_in(two.into_iter()), None);
        assert_eq!(parent_in([(TRACESTATE, &b"a=1"[..])].into_iter()), None);
    }

    #[test]
    fn b123_tracestate_values_join_and_an_oversized_one_is_dropped() {
        let joined = sampled_parent(ENVOY.as_bytes(), &[b"a=1", b" b=2 "]).unwrap();
        assert_eq!(joined.tracestate, "a=1,b=2");
        let long = format!("a={}", "x".repeat(TRACESTATE_MAX));
        assert_eq!(sampled_parent(ENVOY.as_bytes(), &[long.as_bytes()]).unwrap().tracestate, "");
        let at_limit = format!("a={}", "x".repeat(TRACESTATE_MAX - 2));
        assert_eq!(sampled_parent(ENVOY.as_bytes(), &[at_limit.as_bytes()]).unwrap().tracestate, at_limit);
        assert_eq!(sampled_parent(ENVOY.as_bytes(), &[b"a=1", b"\xff"]).unwrap().tracestate, "");
    }

    #[test]
    fn a_child_keeps_the_trace_and_takes_a_new_id() {
        let parent = sampled_parent(ENVOY.as_bytes(), &[]).unwrap().context;
        let child = parent.child();
        assert_eq!(child.trace_id, parent.trace_id);
        assert_ne!(child.span_id, parent.span_id);
        assert_ne!(child.span_id, [0; 8]);
    }
}
