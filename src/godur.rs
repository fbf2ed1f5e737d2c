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
        total_nanos += scaled(number, unit_nanos).ok_or_else(invalid)?;
        rest = after;
    }
    let nanos = u64::try_from(total_nanos).map_err(|_| invalid())?;
    Ok(SignedDuration { negative: negative && nanos > 0, magnitude: Duration::from_nanos(nanos) })
}

/// `number` (decimal, maybe with a fraction) times `unit_nanos`, exactly.
fn scaled(number: &str, unit_nanos: u128) -> Option<u128> {
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if whole.is_empty() && fraction.is_empty() {
        return None;
    }
    let whole: u128 = if whole.is_empty() { 0 } else { whole.parse().ok()? };
    let mut nanos = whole.checked_mul(unit_nanos)?;
    let mut scale = unit_nanos;
    for digit in fraction.bytes() {
        if !digit.is_ascii_digit() {
            return None;
        }
        scale /= 10;
        nanos += u128::from(digit - b'0') * scale;
    }
    Some(nanos)
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
