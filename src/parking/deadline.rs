//! A caller's own deadline, from the headers its client or a proxy in
//! front sets (B68): `grpc-timeout` (gRPC's wire format) and
//! `x-envoy-expected-rq-timeout-ms`. The smaller wins; a malformed value is
//! ignored, never an error: a client's header must not turn a request that
//! would have been served into a failure.

use std::time::Duration;

use crate::actor::target;
use crate::proto::base::HeaderMap;

/// The gRPC deadline header.
pub const GRPC_TIMEOUT: &str = "grpc-timeout";
/// The header Envoy (or a gateway) sets with the route's timeout.
pub const ENVOY_EXPECTED_TIMEOUT: &str = "x-envoy-expected-rq-timeout-ms";

/// What a request's headers say about its caller's patience.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CallerTimeout {
    /// The smallest valid timeout among the headers, if any.
    pub timeout: Option<Duration>,
    /// A header that was present but malformed (ignored), for the debug log.
    pub malformed: Option<&'static str>,
}

/// Reads both headers (their first occurrences, as for every header, B1).
pub fn caller_timeout(headers: &HeaderMap) -> CallerTimeout {
    let mut found = CallerTimeout::default();
    for (name, parse) in
        [(GRPC_TIMEOUT, grpc_timeout as fn(&[u8]) -> Option<Duration>), (ENVOY_EXPECTED_TIMEOUT, millis)]
    {
        let Some(value) = target::header(headers, name) else { continue };
        match parse(value) {
            Some(timeout) => found.timeout = Some(found.timeout.map_or(timeout, |t| t.min(timeout))),
            None => found.malformed = Some(name),
        }
    }
    found
}

/// gRPC's `TimeoutValue TimeoutUnit`: 1 to 8 ASCII digits, then one of
/// `H M S m u n` (hours, minutes, seconds, milli-, micro-, nanoseconds).
pub fn grpc_timeout(value: &[u8]) -> Option<Duration> {
    let (&unit, digits) = value.split_last()?;
    if digits.is_empty() || digits.len() > 8 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    // At most 8 digits: fits a u64 whatever the unit.
    let n: u64 = std::str::from_utf8(digits).ok()?.parse().ok()?;
    Some(match unit {
        b'H' => Duration::from_secs(n * 3600),
        b'M' => Duration::from_secs(n * 60),
        b'S' => Duration::from_secs(n),
        b'm' => Duration::from_millis(n),
        b'u' => Duration::from_micros(n),
        b'n' => Duration::from_nanos(n),
        _ => return None,
    })
}

/// A non-negative integer of milliseconds.
pub fn millis(value: &[u8]) -> Option<Duration> {
    if value.is_empty() || !value.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(value).ok()?.parse().ok().map(Duration::from_millis)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let raw: Vec<(&str, &[u8])> = pairs.iter().map(|(k, v)| (*k, v.as_bytes())).collect();
        crate::actor::target::test_headers(&raw)
    }

    #[test]
    fn b68_grpc_timeout_in_every_unit() {
        let ms = Duration::from_millis;
        assert_eq!(grpc_timeout(b"2H"), Some(Duration::from_secs(7200)));
        assert_eq!(grpc_timeout(b"3M"), Some(Duration::from_secs(180)));
        assert_eq!(grpc_timeout(b"4S"), Some(Duration::from_secs(4)));
        assert_eq!(grpc_timeout(b"300m"), Some(ms(300)));
        assert_eq!(grpc_timeout(b"250000u"), Some(ms(250)));
        assert_eq!(grpc_timeout(b"5000000n"), Some(ms(5)));
        assert_eq!(grpc_timeout(b"99999999H"), Some(Duration::from_secs(99_999_999 * 3600)));
        assert_eq!(grpc_timeout(b"0m"), Some(Duration::ZERO));
        for bad in
            [&b""[..], b"m", b"300", b"300x", b"123456789m", b"-1m", b"1.5S", b" 1S", b"1 S", b"\xff1S"]
        {
            assert_eq!(grpc_timeout(bad), None, "{:?}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn b68_envoy_expected_timeout_in_milliseconds() {
        assert_eq!(millis(b"1500"), Some(Duration::from_millis(1500)));
        assert_eq!(millis(b"0"), Some(Duration::ZERO));
        for bad in [&b""[..], b"-5", b"1.5", b"15s", b"99999999999999999999999"] {
            assert_eq!(millis(bad), None, "{:?}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn b68_the_smaller_wins_and_malformed_values_are_ignored() {
        let both =
            caller_timeout(&headers(&[("grpc-timeout", "2S"), ("x-envoy-expected-rq-timeout-ms", "700")]));
        assert_eq!(both, CallerTimeout { timeout: Some(Duration::from_millis(700)), malformed: None });
        let both =
            caller_timeout(&headers(&[("X-Envoy-Expected-Rq-Timeout-Ms", "5000"), ("Grpc-Timeout", "300m")]));
        assert_eq!(both.timeout, Some(Duration::from_millis(300)), "names are case-insensitive");
        let one_bad =
            caller_timeout(&headers(&[("grpc-timeout", "soon"), ("x-envoy-expected-rq-timeout-ms", "900")]));
        assert_eq!(
            one_bad,
            CallerTimeout { timeout: Some(Duration::from_millis(900)), malformed: Some(GRPC_TIMEOUT) }
        );
        assert_eq!(caller_timeout(&headers(&[("grpc-timeout", "1x")])).timeout, None);
        assert_eq!(caller_timeout(&headers(&[])), CallerTimeout::default());
        let first = caller_timeout(&headers(&[("grpc-timeout", "1S"), ("grpc-timeout", "1m")]));
        assert_eq!(first.timeout, Some(Duration::from_secs(1)), "the first occurrence counts");
    }
}
