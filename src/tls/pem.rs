//! PEM credential files, checked by OpenSSL before gRPC sees them (B60).
//!
//! gRPC's credential API takes PEM as C strings and trusts what it is
//! given: a NUL byte (a DER file passed by mistake) panics inside grpcio,
//! an empty or half-written CA file silently makes every handshake fail,
//! and a key that does not belong to its certificate fails every handshake
//! at run time. So each file is read here first, by the `openssl` crate on
//! the same system OpenSSL that gRPC links: every certificate is parsed as
//! X.509, every key as the kind its label names, and a key is refused
//! unless its public half is the first certificate's. What gRPC then gets
//! is OpenSSL's own rendering of what it parsed (certificates as
//! `CERTIFICATE`, keys as PKCS#8), never the operator's bytes.
//!
//! Only the file's layout is read by hand: which blocks it holds and
//! whether each is complete, so that a truncated file or a bundle without a
//! key gets a message that says so rather than OpenSSL's "no start line".
//!
//! A certificate the router presents (the ext_proc listener's, the client
//! bundle's) must also be valid now (B106): every peer refuses an expired
//! or not-yet-valid one, so taking it would fail every handshake.

use std::fmt;
use std::time::{SystemTime, UNIX_EPOCH};

use openssl::asn1::{Asn1Time, Asn1TimeRef};
use openssl::pkey::{PKey, Private};
use openssl::x509::X509;

/// One `-----BEGIN <label>-----` ... `-----END <label>-----` block.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Block<'a> {
    pub label: &'a str,
    /// The block as it appeared, markers included.
    pub text: &'a str,
}

/// Why a file is not usable PEM.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PemError {
    /// Not text: NUL or non-UTF-8 bytes, as in a DER (binary) file.
    NotText,
    /// A block without its end marker: a file cut short.
    Unterminated(String),
    /// No block of the kind needed.
    Missing(&'static str),
    /// More than one private key in a bundle.
    SeveralKeys,
    /// A CERTIFICATE block OpenSSL cannot read as X.509: its reason.
    NotCertificate(String),
    /// A key block OpenSSL cannot read as the key its label names.
    NotKey { label: String, reason: String },
    /// A private key gRPC cannot use: encrypted, or of a kind it does not
    /// read.
    UnsupportedKey(String),
    /// The key's public half is not the certificate's: every handshake
    /// would fail. Says which certificate.
    KeyMismatch(String),
    /// The first certificate's notAfter has passed: its date, as OpenSSL
    /// prints it.
    Expired(String),
    /// The first certificate's notBefore is still to come: its date.
    NotYetValid(String),
}

impl fmt::Display for PemError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PemError::NotText => f.write_str("not a PEM file (binary content: DER must be converted to PEM)"),
            PemError::Unterminated(label) => {
                write!(f, "the {label} block has no end marker (file cut short?)")
            }
            PemError::Missing(what) => write!(f, "no {what} in the file"),
            PemError::SeveralKeys => f.write_str("more than one private key"),
            PemError::NotCertificate(reason) => {
                write!(f, "a CERTIFICATE block does not hold an X.509 certificate ({reason})")
            }
            PemError::NotKey { label, reason } => {
                write!(f, "the {label} block does not hold such a key ({reason})")
            }
            PemError::UnsupportedKey(label) if label == "ENCRYPTED PRIVATE KEY" => f.write_str(
                "the private key is encrypted and gRPC has no passphrase \
                 (decrypt it: openssl pkey -in key.pem -out plain.pem)",
            ),
            PemError::UnsupportedKey(label) => write!(
                f,
                "a {label} is not a key gRPC loads (PRIVATE KEY, RSA PRIVATE KEY or EC PRIVATE KEY)"
            ),
            PemError::KeyMismatch(certificate) => write!(
                f,
                "the private key does not belong to {certificate}: their public keys differ, so every \
                 handshake would fail"
            ),
            PemError::Expired(not_after) => write!(
                f,
                "its first certificate expired on {not_after} (notAfter): every peer would refuse it"
            ),
            PemError::NotYetValid(not_before) => write!(
                f,
                "its first certificate is not valid yet: not before {not_before} (notBefore; or this \
                 host's clock is behind): every peer would refuse it"
            ),
        }
    }
}

impl std::error::Error for PemError {}

/// Every block in `bytes`, each checked to be complete.
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
        let end = body_start + body_len + end_marker.len();
        found.push(Block { label, text: &block[..end] });
        rest = &block[end..];
    }
    Ok(found)
}

/// OpenSSL's reasons for its last failure, short: the error queue's
/// reason strings, without file names and line numbers.
fn reason(errors: &openssl::error::ErrorStack) -> String {
    let reasons: Vec<&str> = errors.errors().iter().filter_map(|e| e.reason()).collect();
    if reasons.is_empty() {
        "OpenSSL gave no reason".into()
    } else {
        reasons.join("; ")
    }
}

fn certificate(block: &Block<'_>) -> Result<X509, PemError> {
    X509::from_pem(block.text.as_bytes()).map_err(|e| PemError::NotCertificate(reason(&e)))
}

/// The private keys gRPC loads from PEM: PKCS#8, PKCS#1 (RSA) and SEC1
/// (EC), each read as the kind its label names; an encrypted key or any
/// other kind is refused without asking OpenSSL, which would otherwise ask
/// a terminal for the passphrase.
fn key(block: &Block<'_>) -> Result<PKey<Private>, PemError> {
    // OpenSSL's legacy encryption keeps the label and adds a header.
    let label =
        if block.text.contains("Proc-Type: 4,ENCRYPTED") { "ENCRYPTED PRIVATE KEY" } else { block.label };
    if !["PRIVATE KEY", "RSA PRIVATE KEY", "EC PRIVATE KEY"].contains(&label) {
        return Err(PemError::UnsupportedKey(label.to_string()));
    }
    // No passphrase: an encrypted key that slipped past the label check
    // fails to decrypt instead of prompting.
    PKey::private_key_from_pem_callback(block.text.as_bytes(), |_| Ok(0))
        .map_err(|e| PemError::NotKey { label: block.label.to_string(), reason: reason(&e) })
}

fn pem_of(certificates: &[X509]) -> Result<Vec<u8>, PemError> {
    let mut pem = Vec::new();
    for certificate in certificates {
        pem.extend(certificate.to_pem().map_err(|e| PemError::NotCertificate(reason(&e)))?);
    }
    Ok(pem)
}

/// The certificates of a CA file or a certificate chain: at least one,
/// each parsed; blocks of other kinds (parameters, say) are left out.
pub fn certificate_chain(bytes: &[u8]) -> Result<Vec<X509>, PemError> {
    let chain: Vec<X509> = blocks(bytes)?
        .iter()
        .filter(|b| b.label == "CERTIFICATE")
        .map(certificate)
        .collect::<Result<_, _>>()?;
    if chain.is_empty() {
        return Err(PemError::Missing("CERTIFICATE block"));
    }
    Ok(chain)
}

/// The certificates of a CA file, as PEM; at least one.
pub fn certificates(bytes: &[u8]) -> Result<Vec<u8>, PemError> {
    pem_of(&certificate_chain(bytes)?)
}

/// The one private key of a key file or bundle.
pub fn private_key(bytes: &[u8]) -> Result<PKey<Private>, PemError> {
    let mut found = None;
    for block in blocks(bytes)?.iter().filter(|b| b.label.ends_with("PRIVATE KEY")) {
        if found.replace(key(block)?).is_some() {
            return Err(PemError::SeveralKeys);
        }
    }
    found.ok_or(PemError::Missing("PRIVATE KEY block"))
}

/// A certificate chain and its key, as PEM for gRPC, once the key is known
/// to belong to the chain's first certificate (`which` names that
/// certificate in the error).
pub fn key_pair(chain: &[X509], key: &PKey<Private>, which: &str) -> Result<(Vec<u8>, Vec<u8>), PemError> {
    let leaf = chain.first().ok_or(PemError::Missing("CERTIFICATE block"))?;
    let public = leaf.public_key().map_err(|e| PemError::NotCertificate(reason(&e)))?;
    if !public.public_eq(key) {
        return Err(PemError::KeyMismatch(which.to_string()));
    }
    let key = key
        .private_key_to_pem_pkcs8()
        .map_err(|e| PemError::NotKey { label: "PRIVATE KEY".into(), reason: reason(&e) })?;
    Ok((pem_of(chain)?, key))
}

/// Splits a client bundle into its certificate chain and its private key,
/// each as PEM, as gRPC's credential API wants them apart, once the key is
/// known to match the first certificate and that certificate to be valid
/// at `now`; with that certificate's notAfter (Unix seconds).
pub fn split_bundle(bundle: &[u8], now: i64) -> Result<(Vec<u8>, Vec<u8>, i64), PemError> {
    let chain = certificate_chain(bundle)?;
    let key = private_key(bundle)?;
    let (chain_pem, key_pem) = key_pair(&chain, &key, "the bundle's first certificate")?;
    let not_after = valid_at(&chain, now)?;
    Ok((chain_pem, key_pem, not_after))
}

/// Seconds since the Unix epoch, as certificates' dates are compared with.
pub fn unix_now() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

/// A certificate's date as Unix seconds.
fn unix_seconds(time: &Asn1TimeRef) -> Result<i64, PemError> {
    let epoch = Asn1Time::from_unix(0).map_err(|e| PemError::NotCertificate(reason(&e)))?;
    let since = epoch.diff(time).map_err(|e| PemError::NotCertificate(reason(&e)))?;
    Ok(i64::from(since.days) * 86_400 + i64::from(since.secs))
}

/// The notAfter (Unix seconds) of a chain's first certificate, once that
/// certificate is known to be valid at `now`, notBefore and notAfter
/// included (B106). Only the first is read: the rest of a chain is for the
/// peer to build a path with, and a chain may rightly carry an expired
/// cross-signed certificate that current peers skip.
pub fn valid_at(chain: &[X509], now: i64) -> Result<i64, PemError> {
    let leaf = chain.first().ok_or(PemError::Missing("CERTIFICATE block"))?;
    if now < unix_seconds(leaf.not_before())? {
        return Err(PemError::NotYetValid(leaf.not_before().to_string()));
    }
    let not_after = unix_seconds(leaf.not_after())?;
    if now > not_after {
        return Err(PemError::Expired(leaf.not_after().to_string()));
    }
    Ok(not_after)
}

/// Self-signed certificates and keys made with the `openssl` crate, for
/// the unit tests here and in `server`.
#[cfg(test)]
pub mod testing {
    use openssl::asn1::Asn1Time;
    use openssl::bn::BigNum;
    use openssl::ec::{EcGroup, EcKey};
    use openssl::hash::MessageDigest;
    use openssl::nid::Nid;
    use openssl::pkey::{PKey, Private};
    use openssl::x509::{X509Name, X509};

    /// A P-256 key.
    pub fn key() -> PKey<Private> {
        let group = EcGroup::from_curve_name(Nid::X9_62_PRIME256V1).unwrap();
        PKey::from_ec_key(EcKey::generate(&group).unwrap()).unwrap()
    }

    /// A self-signed certificate for `key`, with `serial`, valid from now
    /// for two days.
    pub fn certificate(key: &PKey<Private>, serial: u32) -> X509 {
        let now = super::unix_now();
        dated(key, serial, now, now + 2 * 86_400)
    }

    /// A self-signed certificate for `key`, with `serial`, valid from
    /// `not_before` to `not_after` (Unix seconds).
    pub fn dated(key: &PKey<Private>, serial: u32, not_before: i64, not_after: i64) -> X509 {
        let mut name = X509Name::builder().unwrap();
        name.append_entry_by_text("CN", "test").unwrap();
        let name = name.build();
        let mut builder = X509::builder().unwrap();
        builder.set_version(2).unwrap();
        builder.set_serial_number(&BigNum::from_u32(serial).unwrap().to_asn1_integer().unwrap()).unwrap();
        builder.set_subject_name(&name).unwrap();
        builder.set_issuer_name(&name).unwrap();
        builder.set_pubkey(key).unwrap();
        builder.set_not_before(&Asn1Time::from_unix(not_before).unwrap()).unwrap();
        builder.set_not_after(&Asn1Time::from_unix(not_after).unwrap()).unwrap();
        builder.sign(key, MessageDigest::sha256()).unwrap();
        builder.build()
    }

    /// `(certificate PEM, PKCS#8 key PEM)` of a fresh pair.
    pub fn pair(serial: u32) -> (String, String) {
        let key = key();
        let cert = certificate(&key, serial);
        (
            String::from_utf8(cert.to_pem().unwrap()).unwrap(),
            String::from_utf8(key.private_key_to_pem_pkcs8().unwrap()).unwrap(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::testing::pair;
    use super::*;

    #[test]
    fn a_ca_needs_a_complete_certificate() {
        let (ca1, key) = pair(1);
        let (ca2, _) = pair(2);
        let two = format!("{ca1}junk between\n{ca2}");
        assert_eq!(
            String::from_utf8(certificates(two.as_bytes()).unwrap()).unwrap().matches("BEGIN").count(),
            2
        );
        assert_eq!(certificates(b""), Err(PemError::Missing("CERTIFICATE block")));
        assert_eq!(certificates(key.as_bytes()), Err(PemError::Missing("CERTIFICATE block")));
        assert_eq!(certificates(&[0x30, 0x82, 0x01, 0x00, 0x00]), Err(PemError::NotText), "DER");
        let cut = &ca1[..ca1.len() / 2];
        assert_eq!(certificates(cut.as_bytes()), Err(PemError::Unterminated("CERTIFICATE".into())));
        for bad in [
            "-----BEGIN CERTIFICATE-----\nnot base64!\n-----END CERTIFICATE-----\n".to_string(),
            "-----BEGIN CERTIFICATE-----\naGVsbG8=\n-----END CERTIFICATE-----\n".to_string(),
            key.replace("PRIVATE KEY", "CERTIFICATE"),
        ] {
            assert!(matches!(certificates(bad.as_bytes()), Err(PemError::NotCertificate(_))), "{bad}");
        }
    }

    #[test]
    fn a_bundle_needs_a_chain_and_one_matching_key() {
        let (cert, key) = pair(1);
        let (ca, other_key) = pair(2);
        let params = "-----BEGIN EC PARAMETERS-----\nBggqhkjOPQMBBw==\n-----END EC PARAMETERS-----\n";
        let bundle = format!("{cert}{ca}{params}{key}");
        let (chain, pkcs8, _) = split_bundle(bundle.as_bytes(), unix_now()).unwrap();
        assert_eq!(String::from_utf8(chain).unwrap().matches("BEGIN CERTIFICATE").count(), 2);
        assert!(String::from_utf8(pkcs8).unwrap().starts_with("-----BEGIN PRIVATE KEY-----"));
        assert_eq!(split_bundle(cert.as_bytes(), unix_now()), Err(PemError::Missing("PRIVATE KEY block")));
        assert_eq!(split_bundle(key.as_bytes(), unix_now()), Err(PemError::Missing("CERTIFICATE block")));
        assert_eq!(
            split_bundle(format!("{cert}{key}{key}").as_bytes(), unix_now()),
            Err(PemError::SeveralKeys)
        );
        let mismatch = split_bundle(format!("{cert}{other_key}").as_bytes(), unix_now()).unwrap_err();
        assert_eq!(mismatch, PemError::KeyMismatch("the bundle's first certificate".into()));
        assert!(
            mismatch.to_string().contains("does not belong to the bundle's first certificate"),
            "{mismatch}"
        );
        // The key must match the first certificate, not any of the chain.
        assert!(matches!(
            split_bundle(format!("{ca}{cert}{key}").as_bytes(), unix_now()),
            Err(PemError::KeyMismatch(_))
        ));
    }

    #[test]
    fn keys_grpc_loads_and_keys_it_does_not() {
        let key = testing::key();
        let cert = String::from_utf8(testing::certificate(&key, 7).to_pem().unwrap()).unwrap();
        let sec1 = String::from_utf8(key.ec_key().unwrap().private_key_to_pem().unwrap()).unwrap();
        assert!(sec1.starts_with("-----BEGIN EC PRIVATE KEY-----"));
        assert!(split_bundle(format!("{cert}{sec1}").as_bytes(), unix_now()).is_ok(), "SEC1");
        let rsa = PKey::from_rsa(openssl::rsa::Rsa::generate(2048).unwrap()).unwrap();
        let rsa_cert = String::from_utf8(testing::certificate(&rsa, 8).to_pem().unwrap()).unwrap();
        let pkcs1 = String::from_utf8(rsa.rsa().unwrap().private_key_to_pem().unwrap()).unwrap();
        assert!(pkcs1.starts_with("-----BEGIN RSA PRIVATE KEY-----"));
        assert!(split_bundle(format!("{rsa_cert}{pkcs1}").as_bytes(), unix_now()).is_ok(), "PKCS#1");
        // A key under another kind's label.
        let wrong = sec1.replace("EC PRIVATE KEY", "RSA PRIVATE KEY");
        assert!(matches!(
            split_bundle(format!("{cert}{wrong}").as_bytes(), unix_now()),
            Err(PemError::NotKey { label, .. }) if label == "RSA PRIVATE KEY"
        ));
        let encrypted =
            key.private_key_to_pem_pkcs8_passphrase(openssl::symm::Cipher::aes_256_cbc(), b"s3cr3t").unwrap();
        let e = split_bundle(&[cert.as_bytes(), &encrypted].concat(), unix_now()).unwrap_err();
        assert_eq!(e, PemError::UnsupportedKey("ENCRYPTED PRIVATE KEY".into()));
        assert!(e.to_string().contains("encrypted"));
        let legacy = String::from_utf8(
            key.ec_key()
                .unwrap()
                .private_key_to_pem_passphrase(openssl::symm::Cipher::aes_128_cbc(), b"pw")
                .unwrap(),
        )
        .unwrap();
        assert!(legacy.contains("Proc-Type: 4,ENCRYPTED"));
        assert_eq!(
            split_bundle(format!("{cert}{legacy}").as_bytes(), unix_now()),
            Err(PemError::UnsupportedKey("ENCRYPTED PRIVATE KEY".into())),
            "never asks for a passphrase"
        );
        let dsa = "-----BEGIN DSA PRIVATE KEY-----\nMAMCAQU=\n-----END DSA PRIVATE KEY-----\n";
        assert_eq!(
            split_bundle(format!("{cert}{dsa}").as_bytes(), unix_now()),
            Err(PemError::UnsupportedKey("DSA PRIVATE KEY".into()))
        );
    }

    #[test]
    fn b106_a_presented_certificate_must_be_valid_now() {
        let key = testing::key();
        let now = unix_now();
        let pem = |cert: &X509| String::from_utf8(cert.to_pem().unwrap()).unwrap();
        let pkcs8 = String::from_utf8(key.private_key_to_pem_pkcs8().unwrap()).unwrap();
        // 2001-01-01T00:00:00Z to 2002-01-01T00:00:00Z.
        let (from, to) = (978_307_200, 1_009_843_200);
        let past = testing::dated(&key, 1, from, to);
        assert_eq!(valid_at(std::slice::from_ref(&past), from), Ok(to), "notBefore itself is valid");
        assert_eq!(valid_at(std::slice::from_ref(&past), to), Ok(to), "and notAfter");
        let expired = valid_at(std::slice::from_ref(&past), to + 1).unwrap_err();
        assert_eq!(expired, PemError::Expired("Jan  1 00:00:00 2002 GMT".into()));
        assert!(expired.to_string().contains("expired on Jan  1 00:00:00 2002 GMT"), "{expired}");
        let early = valid_at(std::slice::from_ref(&past), from - 1).unwrap_err();
        assert_eq!(early, PemError::NotYetValid("Jan  1 00:00:00 2001 GMT".into()));
        assert!(early.to_string().contains("not valid yet: not before Jan  1 00:00:00 2001 GMT"), "{early}");
        // In a bundle, checked against the clock; only the first certificate.
        let bundle = format!("{}{pkcs8}", pem(&past));
        assert_eq!(
            split_bundle(bundle.as_bytes(), now),
            Err(PemError::Expired("Jan  1 00:00:00 2002 GMT".into()))
        );
        let future = testing::dated(&key, 2, now + 86_400, now + 2 * 86_400);
        let bundle = format!("{}{pkcs8}", pem(&future));
        assert!(matches!(split_bundle(bundle.as_bytes(), now), Err(PemError::NotYetValid(_))));
        let current = testing::dated(&key, 3, now - 60, now + 86_400);
        let bundle = format!("{}{}{pkcs8}", pem(&current), pem(&past));
        assert_eq!(
            split_bundle(bundle.as_bytes(), now).map(|b| b.2),
            Ok(now + 86_400),
            "an expired CA after it"
        );
    }
}
