//! PEM credential files, checked before gRPC sees them (B60).
//!
//! gRPC's credential API takes PEM as C strings and trusts what it is
//! given: a NUL byte (a DER file passed by mistake) panics inside grpcio,
//! and an empty or half-written CA file silently makes every handshake fail.
//! So each file is parsed here first: every block must be complete, its
//! base64 must decode, and its content must be a DER structure; a CA file
//! must hold at least one certificate, a client bundle a certificate chain
//! and exactly one private key of a kind gRPC loads; each certificate and
//! key must have the shape its label promises. Whether the key matches the
//! certificate is not checked (that needs the key's algorithm): a mismatch
//! fails every handshake (README, "The control plane").

use std::fmt;

/// One `-----BEGIN <label>-----` ... `-----END <label>-----` block.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Block<'a> {
    pub label: &'a str,
    /// The block as it appeared, markers included.
    pub text: &'a str,
    /// The DER between the markers, decoded once here.
    der: Vec<u8>,
}

/// Why a file is not usable PEM.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PemError {
    /// Not text: NUL or non-UTF-8 bytes, as in a DER (binary) file.
    NotText,
    /// A block without its end marker: a file cut short.
    Unterminated(String),
    /// A block whose body is not base64 of a DER structure.
    BadBody(String),
    /// No block of the kind needed.
    Missing(&'static str),
    /// More than one private key in a bundle.
    SeveralKeys,
    /// A CERTIFICATE block whose DER is not an X.509 certificate.
    NotCertificate,
    /// A key block whose DER is not the key its label names.
    NotKey(String),
    /// A private key gRPC cannot load: encrypted, or of a kind it does not
    /// read.
    UnsupportedKey(String),
}

impl fmt::Display for PemError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PemError::NotText => f.write_str("not a PEM file (binary content: DER must be converted to PEM)"),
            PemError::Unterminated(label) => {
                write!(f, "the {label} block has no end marker (file cut short?)")
            }
            PemError::BadBody(label) => write!(f, "the {label} block's content is not valid base64 DER"),
            PemError::Missing(what) => write!(f, "no {what} in the file"),
            PemError::SeveralKeys => f.write_str("more than one private key"),
            PemError::NotCertificate => {
                f.write_str("a CERTIFICATE block does not hold an X.509 certificate")
            }
            PemError::NotKey(label) => write!(f, "the {label} block does not hold such a key"),
            PemError::UnsupportedKey(label) if label == "ENCRYPTED PRIVATE KEY" => f.write_str(
                "the private key is encrypted and gRPC has no passphrase \
                 (decrypt it: openssl pkey -in key.pem -out plain.pem)",
            ),
            PemError::UnsupportedKey(label) => write!(
                f,
                "a {label} is not a key gRPC loads (PRIVATE KEY, RSA PRIVATE KEY or EC PRIVATE KEY)"
            ),
        }
    }
}

impl std::error::Error for PemError {}

/// Every block in `bytes`, each checked to be complete base64 DER.
pub fn blocks(bytes: &[u8]) -> Result<Vec<Block<'_>>, PemError> {
    if bytes.contains(&0) {
        return Err(PemError::NotText);
    }
    let text = std::str::from_utf8(bytes).map_err(|_| PemError::NotText)?;
    let mut found = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find("-----BEGIN ") {
        let block = &rest[start..];
        let after_begin = &block["-----BEGIN ".len()..];
        let label_len = after_begin.find("-----").ok_or_else(|| PemError::Unterminated("PEM".into()))?;
        let label = &after_begin[..label_len];
        if label.contains('\n') {
            return Err(PemError::Unterminated("PEM".into()));
        }
        let end_marker = format!("-----END {label}-----");
        let body_start = "-----BEGIN ".len() + label_len + "-----".len();
        let body_len =
            block[body_start..].find(&end_marker).ok_or_else(|| PemError::Unterminated(label.to_string()))?;
        let der = base64(&block[body_start..body_start + body_len])
            .filter(|der| is_der(der))
            .ok_or_else(|| PemError::BadBody(label.to_string()))?;
        let end = body_start + body_len + end_marker.len();
        found.push(Block { label, text: &block[..end], der });
        rest = &block[end..];
    }
    Ok(found)
}

/// The certificates of a CA file, as PEM; at least one.
pub fn certificates(bytes: &[u8]) -> Result<Vec<u8>, PemError> {
    let mut pem = String::new();
    for block in blocks(bytes)?.iter().filter(|b| b.label == "CERTIFICATE") {
        check_certificate(block)?;
        pem.push_str(block.text);
        pem.push('\n');
    }
    if pem.is_empty() {
        return Err(PemError::Missing("CERTIFICATE block"));
    }
    Ok(pem.into_bytes())
}

/// Splits a client bundle into its certificate chain and its private key,
/// each as PEM, as gRPC's credential API wants them apart.
pub fn split_bundle(bundle: &[u8]) -> Result<(Vec<u8>, Vec<u8>), PemError> {
    let (mut chain, mut key) = (String::new(), None);
    for block in blocks(bundle)? {
        if block.label == "CERTIFICATE" {
            check_certificate(&block)?;
            chain.push_str(block.text);
            chain.push('\n');
        } else if block.label.ends_with("PRIVATE KEY") {
            check_key(&block)?;
            if key.replace(format!("{}\n", block.text)).is_some() {
                return Err(PemError::SeveralKeys);
            }
        }
    }
    if chain.is_empty() {
        return Err(PemError::Missing("CERTIFICATE block"));
    }
    let key = key.ok_or(PemError::Missing("PRIVATE KEY block"))?;
    Ok((chain.into_bytes(), key.into_bytes()))
}

/// Whether `der` is one whole DER element (tag, length, contents): what
/// every certificate, key and parameter block is.
fn is_der(der: &[u8]) -> bool {
    matches!(element(der), Some((_, _, rest)) if rest.is_empty())
}

/// The first DER element of `der`: its tag, its contents and what follows
/// it; `None` when it is cut short or uses a form no credential file does.
fn element(der: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, &first) = (der.first()?, der.get(1)?);
    if tag & 0x1f == 0x1f {
        return None; // multi-byte tags appear in no credential file
    }
    let (header, length) = if first < 0x80 {
        (2, usize::from(first))
    } else {
        let count = usize::from(first & 0x7f);
        if count == 0 || count > 4 || der.len() < 2 + count {
            return None;
        }
        (2 + count, der[2..2 + count].iter().fold(0usize, |n, b| (n << 8) | usize::from(*b)))
    };
    let end = header.checked_add(length).filter(|&end| end <= der.len())?;
    Some((tag, &der[header..end], &der[end..]))
}

/// The tags of the first elements inside a SEQUENCE, at most `n` of them;
/// `None` when `der` is not a SEQUENCE of whole elements.
fn sequence_tags(der: &[u8], n: usize) -> Option<Vec<u8>> {
    let (tag, mut contents, _) = element(der)?;
    if tag != SEQUENCE {
        return None;
    }
    let mut tags = Vec::new();
    while !contents.is_empty() && tags.len() < n {
        let (tag, _, rest) = element(contents)?;
        tags.push(tag);
        contents = rest;
    }
    Some(tags)
}

const SEQUENCE: u8 = 0x30;
const INTEGER: u8 = 0x02;
const BIT_STRING: u8 = 0x03;
const OCTET_STRING: u8 = 0x04;

/// An X.509 certificate is a SEQUENCE of exactly the to-be-signed
/// SEQUENCE, the signature algorithm SEQUENCE and the signature BIT
/// STRING: enough to tell a certificate from a key or a stray structure
/// pasted under the wrong label, which gRPC would take and then fail every
/// handshake with.
fn check_certificate(block: &Block<'_>) -> Result<(), PemError> {
    match sequence_tags(&block.der, 4) {
        Some(tags) if tags == [SEQUENCE, SEQUENCE, BIT_STRING] => Ok(()),
        _ => Err(PemError::NotCertificate),
    }
}

/// The private keys gRPC (BoringSSL) loads from PEM: PKCS#8, PKCS#1 (RSA)
/// and SEC1 (EC), each checked for the shape its label promises; an
/// encrypted key or any other kind is refused.
fn check_key(block: &Block<'_>) -> Result<(), PemError> {
    let expected: &[u8] = match block.label {
        // PrivateKeyInfo: version, algorithm, key.
        "PRIVATE KEY" => &[INTEGER, SEQUENCE, OCTET_STRING],
        // RSAPrivateKey: version, modulus, public exponent.
        "RSA PRIVATE KEY" => &[INTEGER, INTEGER, INTEGER],
        // ECPrivateKey: version, key.
        "EC PRIVATE KEY" => &[INTEGER, OCTET_STRING],
        other => return Err(PemError::UnsupportedKey(other.to_string())),
    };
    match sequence_tags(&block.der, expected.len()) {
        Some(tags) if tags == expected => Ok(()),
        _ => Err(PemError::NotKey(block.label.to_string())),
    }
}

/// Decodes standard base64, ignoring whitespace; `None` when malformed.
fn base64(text: &str) -> Option<Vec<u8>> {
    // Padded to whole groups of four, as PEM's base64 always is.
    if text.bytes().filter(|b| !b.is_ascii_whitespace()).count() % 4 != 0 {
        return None;
    }
    let mut out = Vec::with_capacity(text.len() * 3 / 4);
    let (mut acc, mut bits, mut padding) = (0u32, 0u32, 0usize);
    for byte in text.bytes().filter(|b| !b.is_ascii_whitespace()) {
        let value = match byte {
            b'A'..=b'Z' => byte - b'A',
            b'a'..=b'z' => byte - b'a' + 26,
            b'0'..=b'9' => byte - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            b'=' => {
                padding += 1;
                continue;
            }
            _ => return None,
        };
        if padding > 0 {
            return None;
        }
        acc = (acc << 6) | u32::from(value);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    (padding <= 2 && bits < 6 && acc == 0).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The smallest DER of each shape: a certificate (three elements:
    /// SEQUENCE, SEQUENCE, BIT STRING), PKCS#8, PKCS#1 and SEC1 keys, and a
    /// structure that is none of them (a SEQUENCE holding an INTEGER 5).
    const CERTIFICATE: &str = "MAcwADAAAwEA";
    const PKCS8: &str = "MAcCAQAwAAQA";
    const PKCS1: &str = "MAkCAQACAQUCAQM=";
    const SEC1: &str = "MAUCAQEEAA==";
    const OTHER: &str = "MAMCAQU=";

    fn block_of(label: &str, body: &str) -> String {
        format!("-----BEGIN {label}-----\n{body}\n-----END {label}-----\n")
    }

    fn block(label: &str) -> String {
        let body = match label {
            "CERTIFICATE" => CERTIFICATE,
            "PRIVATE KEY" => PKCS8,
            "RSA PRIVATE KEY" => PKCS1,
            "EC PRIVATE KEY" => SEC1,
            _ => OTHER,
        };
        block_of(label, body)
    }

    #[test]
    fn decodes_base64() {
        assert_eq!(base64(OTHER).unwrap(), vec![0x30, 0x03, 0x02, 0x01, 0x05]);
        assert_eq!(base64(CERTIFICATE).unwrap(), vec![0x30, 0x07, 0x30, 0x00, 0x30, 0x00, 0x03, 0x01, 0x00]);
        assert_eq!(base64("aGVsbG8=").unwrap(), b"hello");
        assert_eq!(base64("aGVs\nbG8h").unwrap(), b"hello!");
        for bad in ["aGVsbG8", "aGVs*G8=", "aG=V", "a===", "aGVsbG8=="] {
            assert!(base64(bad).is_none(), "{bad}");
        }
    }

    #[test]
    fn a_ca_needs_a_complete_certificate() {
        let two = format!("{}junk between\n{}", block("CERTIFICATE"), block("CERTIFICATE"));
        assert_eq!(
            String::from_utf8(certificates(two.as_bytes()).unwrap()).unwrap().matches("BEGIN").count(),
            2
        );
        assert_eq!(certificates(b""), Err(PemError::Missing("CERTIFICATE block")));
        assert_eq!(
            certificates(block("PRIVATE KEY").as_bytes()),
            Err(PemError::Missing("CERTIFICATE block"))
        );
        assert_eq!(certificates(&[0x30, 0x82, 0x01, 0x00, 0x00]), Err(PemError::NotText), "DER");
        let cut = &block("CERTIFICATE")[..30];
        assert_eq!(certificates(cut.as_bytes()), Err(PemError::Unterminated("CERTIFICATE".into())));
        let bad = "-----BEGIN CERTIFICATE-----\nnot base64!\n-----END CERTIFICATE-----\n";
        assert_eq!(certificates(bad.as_bytes()), Err(PemError::BadBody("CERTIFICATE".into())));
        let not_der = "-----BEGIN CERTIFICATE-----\naGVsbG8=\n-----END CERTIFICATE-----\n";
        assert_eq!(certificates(not_der.as_bytes()), Err(PemError::BadBody("CERTIFICATE".into())));
        for wrong in [OTHER, PKCS8, SEC1] {
            let pem = block_of("CERTIFICATE", wrong);
            assert_eq!(certificates(pem.as_bytes()), Err(PemError::NotCertificate), "{wrong}");
        }
    }

    #[test]
    fn a_bundle_needs_a_chain_and_one_key() {
        let params = "-----BEGIN EC PARAMETERS-----\nBggqhkjOPQMBBw==\n-----END EC PARAMETERS-----\n";
        let bundle =
            format!("{}{}{params}{}", block("CERTIFICATE"), block("CERTIFICATE"), block("EC PRIVATE KEY"));
        let (chain, key) = split_bundle(bundle.as_bytes()).unwrap();
        assert_eq!(String::from_utf8(chain).unwrap().matches("BEGIN CERTIFICATE").count(), 2);
        assert!(String::from_utf8(key).unwrap().starts_with("-----BEGIN EC PRIVATE KEY-----"));
        assert_eq!(
            split_bundle(block("CERTIFICATE").as_bytes()),
            Err(PemError::Missing("PRIVATE KEY block"))
        );
        assert_eq!(
            split_bundle(block("PRIVATE KEY").as_bytes()),
            Err(PemError::Missing("CERTIFICATE block"))
        );
        let two_keys = format!("{}{}{}", block("CERTIFICATE"), block("PRIVATE KEY"), block("PRIVATE KEY"));
        assert_eq!(split_bundle(two_keys.as_bytes()), Err(PemError::SeveralKeys));
    }

    #[test]
    fn keys_grpc_loads_and_keys_it_does_not() {
        for label in ["PRIVATE KEY", "RSA PRIVATE KEY", "EC PRIVATE KEY"] {
            let bundle = format!("{}{}", block("CERTIFICATE"), block(label));
            assert!(split_bundle(bundle.as_bytes()).is_ok(), "{label}");
        }
        for (label, body) in [("PRIVATE KEY", SEC1), ("RSA PRIVATE KEY", PKCS8), ("EC PRIVATE KEY", OTHER)] {
            let bundle = format!("{}{}", block("CERTIFICATE"), block_of(label, body));
            assert_eq!(split_bundle(bundle.as_bytes()), Err(PemError::NotKey(label.into())), "{label}");
        }
        for label in ["ENCRYPTED PRIVATE KEY", "DSA PRIVATE KEY"] {
            let bundle = format!("{}{}", block("CERTIFICATE"), block(label));
            assert_eq!(split_bundle(bundle.as_bytes()), Err(PemError::UnsupportedKey(label.into())), "{label}");
        }
        assert!(PemError::UnsupportedKey("ENCRYPTED PRIVATE KEY".into()).to_string().contains("encrypted"));
        let not_a_chain = format!("{}{}", block_of("CERTIFICATE", PKCS8), block("PRIVATE KEY"));
        assert_eq!(split_bundle(not_a_chain.as_bytes()), Err(PemError::NotCertificate));
    }
}
