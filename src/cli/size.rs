//! Byte sizes as Kubernetes writes memory quantities in binary units
//! (`512Mi`, `2Gi`), so that a flag and the container limit sized from it
//! read the same way. A bare number is bytes.

use std::fmt;

/// The units a size may carry: powers of 1024, as Kubernetes spells them.
const UNITS: [(&str, u64); 4] = [("Ti", 1 << 40), ("Gi", 1 << 30), ("Mi", 1 << 20), ("Ki", 1 << 10)];

/// Why a string is not a size.
#[derive(Debug, PartialEq, Eq)]
pub struct ParseError(String);

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ParseError {}

/// Parses `<digits>` (bytes) or `<digits><unit>` with a unit of
/// [`UNITS`]. No fractions, no signs, no decimal units (`M`, `G`): a
/// quantity with one would be easy to misread against the binary ones.
pub fn parse(text: &str) -> Result<u64, ParseError> {
    let text = text.trim();
    let (digits, multiplier) = UNITS
        .iter()
        .find_map(|(unit, bytes)| text.strip_suffix(unit).map(|digits| (digits, *bytes)))
        .unwrap_or((text, 1));
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(ParseError(format!(
            "{text:?} is not a size: digits, then Ki, Mi, Gi or Ti (powers of 1024) or nothing (bytes)"
        )));
    }
    digits
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(multiplier))
        .ok_or_else(|| ParseError(format!("{text:?} is too large a size")))
}

/// The largest unit that divides `bytes` exactly: `1Gi`, `1536Mi`, `100`.
pub fn format(bytes: u64) -> String {
    UNITS
        .iter()
        .find(|(_, unit)| bytes != 0 && bytes.is_multiple_of(*unit))
        .map_or_else(|| bytes.to_string(), |(name, unit)| format!("{}{name}", bytes / unit))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_binary_units_and_bytes() {
        assert_eq!(parse("1Gi"), Ok(1 << 30));
        assert_eq!(parse(" 512Mi "), Ok(512 << 20));
        assert_eq!(parse("64Ki"), Ok(64 << 10));
        assert_eq!(parse("2Ti"), Ok(2 << 40));
        assert_eq!(parse("1048576"), Ok(1 << 20));
        assert_eq!(parse("0"), Ok(0));
    }

    #[test]
    fn refuses_what_it_cannot_read_exactly() {
        for bad in ["", "Gi", "1.5Gi", "-1Gi", "1G", "1 Gi", "1gi", "1GiB", "0x10", "+5"] {
            let e = parse(bad).unwrap_err();
            assert!(e.to_string().contains("is not a size"), "{bad:?}: {e}");
        }
        assert!(parse("18446744073709551615Ki").unwrap_err().to_string().contains("too large"));
        assert!(parse("99999999999999999999").unwrap_err().to_string().contains("too large"));
    }

    #[test]
    fn formats_in_the_largest_exact_unit() {
        assert_eq!(format(1 << 30), "1Gi");
        assert_eq!(format(1536 << 20), "1536Mi");
        assert_eq!(format(1000), "1000");
        assert_eq!(format(0), "0");
        for text in ["1Gi", "1536Mi", "3Ki", "7"] {
            assert_eq!(format(parse(text).unwrap()), text);
        }
    }
}
