//! Go-style durations (`5s`, `100ms`, `1m30s`, `-2s`), the format operators
//! already use for every other atenet component's flags.
//!
//! Negative values parse (as a sign plus a magnitude) so that validation can
//! name the flag and say "must not be negative" instead of a parse error.

use std::fmt;
use std::time::Duration;

/// A parsed duration that remembers its sign.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SignedDuration {
    /// True for a value below zero.
    pub negative: bool,
    /// The magnitude.
    pub magnitude: Duration,
}

impl SignedDuration {
    /// The value when it is strictly positive.
    pub fn positive(self) -> Option<Duration> {
        (!self.negative && !self.magnitude.is_zero()).then_some(self.magnitude)
    }
}

/// Why a string is not a duration.
#[derive(Debug, PartialEq, Eq)]
pub struct ParseError(String);

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ParseError {}

/// Parses a Go duration: an optional sign, then one or more decimal numbers
/// each followed by a unit (`ns`, `us`, `µs`, `ms`, `s`, `m`, `h`). A bare
/// `0` is allowed, as in Go.
pub fn parse(input: &str) -> Result<SignedDuration, ParseError> {
    let invalid = || ParseError(format!("invalid duration {input:?} (use e.g. 5s, 100ms, 1m30s)"));
    let too_long = || ParseError(format!("duration {input:?} is out of range (at most about 2562047h)"));
    let (negative, mut rest) = match input.as_bytes().first() {
        Some(b'-') => (true, &input[1..]),
        Some(b'+') => (false, &input[1..]),
        _ => (false, input),
    };
    if rest == "0" {
        return Ok(SignedDuration { negative: false, magnitude: Duration::ZERO });
    }
    if rest.is_empty() {
        return Err(invalid());
    }
    let mut total_nanos: u128 = 0;
    while !rest.is_empty() {
        let number_len = rest.find(|c: char| !(c.is_ascii_digit() || c == '.')).ok_or_else(invalid)?;
        let (number, after) = rest.split_at(number_len);
        let unit_len = after.find(|c: char| c.is_ascii_digit() || c == '.').unwrap_or(after.len());
        let (unit, after) = after.split_at(unit_len);
        let unit_nanos: u128 = match unit {
            "ns" => 1,
            "us" | "µs" | "μs" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60_000_000_000,
            "h" => 3_600_000_000_000,
            _ => return Err(invalid()),
        };
        let nanos = match scaled(number, unit_nanos) {
            Ok(nanos) => nanos,
            Err(Number::Malformed) => return Err(invalid()),
            Err(Number::TooLarge) => return Err(too_long()),
        };
        total_nanos = total_nanos.checked_add(nanos).ok_or_else(too_long)?;
        rest = after;
    }
    // Go's durations are int64 nanoseconds; so are these.
    let nanos = i64::try_from(total_nanos).map_err(|_| too_long())? as u64;
    Ok(SignedDuration { negative: negative && nanos > 0, magnitude: Duration::from_nanos(nanos) })
}

/// Why a number in a duration was refused.
enum Number {
    Malformed,
    TooLarge,
}

/// `number` (decimal, maybe with a fraction) times `unit_nanos`, exactly.
fn scaled(number: &str, unit_nanos: u128) -> Result<u128, Number> {
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    let digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    if (whole.is_empty() && fraction.is_empty()) || !digits(whole) || !digits(fraction) {
        return Err(Number::Malformed);
    }
    // Digits only, so a failed parse means too many of them.
    let whole: u128 = if whole.is_empty() { 0 } else { whole.parse().map_err(|_| Number::TooLarge)? };
    let mut nanos = whole.checked_mul(unit_nanos).ok_or(Number::TooLarge)?;
    let mut scale = unit_nanos;
    for digit in fraction.bytes() {
        scale /= 10;
        nanos = nanos.checked_add(u128::from(digit - b'0') * scale).ok_or(Number::TooLarge)?;
    }
    Ok(nanos)
}

/// Formats a duration the way Go's `time.Duration.String` does: `5s`,
/// `100ms`, `1m30s`, `1h0m0s`, `0s`.
pub fn format(d: Duration) -> String {
    let nanos = d.as_nanos();
    if nanos == 0 {
        return "0s".to_string();
    }
    if nanos < 1_000 {
        return format!("{nanos}ns");
    }
    if nanos < 1_000_000 {
        return format!("{}µs", decimal(nanos, 1_000));
    }
    if nanos < 1_000_000_000 {
        return format!("{}ms", decimal(nanos, 1_000_000));
    }
    let secs = nanos / 1_000_000_000;
    let frac = nanos % 1_000_000_000;
    let seconds_part = decimal((secs % 60) * 1_000_000_000 + frac, 1_000_000_000);
    let (hours, minutes) = (secs / 3600, (secs / 60) % 60);
    if hours > 0 {
        format!("{hours}h{minutes}m{seconds_part}s")
    } else if minutes > 0 {
        format!("{minutes}m{seconds_part}s")
    } else {
        format!("{seconds_part}s")
    }
}

/// `value / unit` as a decimal with trailing zeros trimmed.
fn decimal(value: u128, unit: u128) -> String {
    let whole = value / unit;
    let rest = value % unit;
    if rest == 0 {
        return whole.to_string();
    }
    let width = unit.ilog10() as usize;
    let fraction = format!("{rest:0width$}");
    format!("{whole}.{}", fraction.trim_end_matches('0'))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn parses_go_forms() {
        assert_eq!(parse("5s").unwrap().magnitude, ms(5000));
        assert_eq!(parse("100ms").unwrap().magnitude, ms(100));
        assert_eq!(parse("1m30s").unwrap().magnitude, ms(90_000));
        assert_eq!(parse("1.5h").unwrap().magnitude, ms(5_400_000));
        assert_eq!(parse("250us").unwrap().magnitude, Duration::from_micros(250));
        assert_eq!(parse("0").unwrap().magnitude, Duration::ZERO);
        assert_eq!(parse(".5s").unwrap().magnitude, ms(500));
        let negative = parse("-2s").unwrap();
        assert!(negative.negative);
        assert_eq!(negative.magnitude, ms(2000));
        assert!(!parse("-0s").unwrap().negative);
    }

    #[test]
    fn rejects_garbage() {
        for bad in ["", "5", "s", "5x", "1m30", "--1s", "1..2s", "-", "abc", "5 s"] {
            assert!(parse(bad).is_err(), "{bad:?} should not parse");
        }
    }

    #[test]
    fn out_of_range_is_an_error_not_a_wrap() {
        let max = "9223372036854775807ns";
        assert_eq!(parse(max).unwrap().magnitude, Duration::from_nanos(i64::MAX as u64));
        assert!(parse("2562047h").is_ok());
        for big in [
            "9223372036854775808ns",
            "2562048h",
            "340282366920938463463374607431768211455ns1ns",
            "99999999999999999999999999999999999999999h",
            "9999999999999999999.5h",
        ] {
            let e = parse(big).unwrap_err().to_string();
            assert!(e.contains("out of range"), "{big}: {e}");
        }
    }

    #[test]
    fn formats_like_go() {
        assert_eq!(format(ms(5000)), "5s");
        assert_eq!(format(ms(100)), "100ms");
        assert_eq!(format(ms(90_000)), "1m30s");
        assert_eq!(format(ms(300_000)), "5m0s");
        assert_eq!(format(ms(3_600_000)), "1h0m0s");
        assert_eq!(format(ms(1500)), "1.5s");
        assert_eq!(format(Duration::ZERO), "0s");
        assert_eq!(format(Duration::from_micros(1500)), "1.5ms");
    }

    #[test]
    fn round_trips() {
        for text in ["5s", "100ms", "1m30s", "13s", "20s", "1.25s"] {
            assert_eq!(format(parse(text).unwrap().magnitude), text);
        }
    }
}
