//! The ext_proc listener's TLS credentials, which follow the files on disk
//! (B86).
//!
//! The certificate and key come as two PEM files (a Kubernetes TLS Secret's
//! `tls.crt` and `tls.key`), with an optional client CA: with one, only a
//! client whose certificate that CA signed completes the handshake. Every
//! file is checked by [`crate::tls::pem`] (the key must match the
//! certificate, which must be valid now, B106) before gRPC sees it: at
//! startup a bad set is an error naming the flag, and at rotation it is
//! refused, logged once, and the last good set stays in use. The
//! certificate in use's notAfter is kept in a gauge, for an alert ahead
//! of its expiry (B106).
//!
//! Rotation costs no handshake anything: [`ServerCredentialFiles::refresh`]
//! re-reads the files on the router's credentials thread (every second),
//! and gRPC, which asks its fetcher before every new connection's
//! handshake, only compares a generation number. New connections then use
//! the new certificate; established ones keep their session.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use grpcio::{CertificateRequestType, ServerCredentials, ServerCredentialsBuilder, ServerCredentialsFetcher};
use parking_lot::Mutex;
use prometheus::IntGauge;

use crate::tls::files::{named, read, CredentialsError};
use crate::tls::pem;

/// The files of the ext_proc listener's credentials.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerFiles {
    /// `--extproc-cert-file`: the certificate chain, leaf first.
    pub cert: PathBuf,
    /// `--extproc-key-file`: the leaf's private key.
    pub key: PathBuf,
    /// `--extproc-client-ca-file`: CAs a client certificate must chain to.
    pub client_ca: Option<PathBuf>,
}

const CERT_FLAG: &str = "--extproc-cert-file";
const KEY_FLAG: &str = "--extproc-key-file";
const CLIENT_CA_FLAG: &str = "--extproc-client-ca-file";

/// One checked set, as gRPC takes it, and the bytes it came from.
struct Checked {
    /// The files' contents as read, to tell a change.
    read: Vec<Vec<u8>>,
    chain: Vec<u8>,
    key: Vec<u8>,
    client_ca: Option<Vec<u8>>,
    /// The certificate's notAfter, Unix seconds.
    not_after: i64,
}

/// The set in use and its generation, bumped at each accepted change.
struct Current {
    generation: u64,
    checked: Arc<Checked>,
    /// The problem last logged, so a bad file is reported once.
    rejected: Option<String>,
}

/// The ext_proc listener's credentials: read at startup, re-read on
/// [`ServerCredentialFiles::refresh`].
pub struct ServerCredentialFiles {
    files: ServerFiles,
    current: Mutex<Current>,
    /// The notAfter of the certificate in use.
    expiry: IntGauge,
}

impl ServerCredentialFiles {
    /// Reads and checks the files: an error names the flag, the path and
    /// why (startup refuses it, B70). `expiry` is set to the certificate's
    /// notAfter, now and at each accepted rotation.
    pub fn load(
        files: ServerFiles,
        expiry: IntGauge,
    ) -> Result<Arc<ServerCredentialFiles>, CredentialsError> {
        let checked = Arc::new(check(&files)?);
        expiry.set(checked.not_after);
        Ok(Arc::new(ServerCredentialFiles {
            files,
            current: Mutex::new(Current { generation: 1, checked, rejected: None }),
            expiry,
        }))
    }

    /// Re-reads the files; a changed set that passes every check is what
    /// new connections get. A set that does not keeps the last good one,
    /// and is logged once.
    pub fn refresh(&self) {
        let mut current = self.current.lock();
        let problem = match reread(&self.files, &current.checked) {
            Ok(None) => {
                current.rejected = None;
                return;
            }
            Ok(Some(checked)) => {
                self.expiry.set(checked.not_after);
                current.checked = Arc::new(checked);
                current.generation += 1;
                current.rejected = None;
                log::info!("ext_proc TLS credentials changed on disk: new connections use them");
                return;
            }
            Err(e) => e,
        };
        let (level, problem) = (problem.rotation_level(), problem.to_string());
        if current.rejected.as_deref() != Some(problem.as_str()) {
            log::log!(level, "ext_proc TLS credentials not reloaded, keeping the last good ones: {problem}");
            current.rejected = Some(problem);
        }
    }

    /// gRPC server credentials that fetch from these files: the set in use
    /// at each new connection's handshake.
    pub fn credentials(self: &Arc<Self>) -> ServerCredentials {
        let request = if self.files.client_ca.is_some() {
            CertificateRequestType::RequestAndRequireClientCertificateAndVerify
        } else {
            CertificateRequestType::DontRequestClientCertificate
        };
        let fetcher = Fetcher { source: Arc::clone(self), delivered: AtomicU64::new(0) };
        ServerCredentials::with_fetcher(Box::new(fetcher), request)
    }

    fn current(&self) -> (u64, Arc<Checked>) {
        let current = self.current.lock();
        (current.generation, Arc::clone(&current.checked))
    }
}

/// The files' contents, read in one go.
fn read_all(files: &ServerFiles) -> Result<Vec<Vec<u8>>, CredentialsError> {
    let mut contents = vec![read(CERT_FLAG, &files.cert)?, read(KEY_FLAG, &files.key)?];
    if let Some(ca) = &files.client_ca {
        contents.push(read(CLIENT_CA_FLAG, ca)?);
    }
    Ok(contents)
}

/// Reads and checks every file.
fn check(files: &ServerFiles) -> Result<Checked, CredentialsError> {
    checked(files, read_all(files)?)
}

/// A new checked set when the files changed since `last`.
fn reread(files: &ServerFiles, last: &Checked) -> Result<Option<Checked>, CredentialsError> {
    let contents = read_all(files)?;
    if contents == last.read {
        return Ok(None);
    }
    checked(files, contents).map(Some)
}

fn checked(files: &ServerFiles, contents: Vec<Vec<u8>>) -> Result<Checked, CredentialsError> {
    let chain = named(CERT_FLAG, &files.cert, pem::certificate_chain(&contents[0]))?;
    let key = named(KEY_FLAG, &files.key, pem::private_key(&contents[1]))?;
    let which = format!("{CERT_FLAG} {}'s first certificate", files.cert.display());
    let (chain_pem, key) = named(KEY_FLAG, &files.key, pem::key_pair(&chain, &key, &which))?;
    // A client CA's dates are not checked: which of its certificates
    // matter depends on the chains clients send (B106).
    let not_after = named(CERT_FLAG, &files.cert, pem::valid_at(&chain, pem::unix_now()))?;
    let client_ca = match &files.client_ca {
        Some(path) => Some(named(CLIENT_CA_FLAG, path, pem::certificates(&contents[2]))?),
        None => None,
    };
    Ok(Checked { read: contents, chain: chain_pem, key, client_ca, not_after })
}

/// What gRPC asks before each new connection's handshake: the set in use,
/// when it is not the one it has.
struct Fetcher {
    source: Arc<ServerCredentialFiles>,
    /// The generation last handed to gRPC (0: none yet).
    delivered: AtomicU64,
}

impl ServerCredentialsFetcher for Fetcher {
    fn fetch(&self) -> Result<Option<ServerCredentialsBuilder>, Box<dyn std::error::Error>> {
        let (generation, checked) = self.source.current();
        if self.delivered.swap(generation, Ordering::AcqRel) == generation {
            return Ok(None);
        }
        // The PEM is OpenSSL's own rendering: no NUL, so grpcio's C strings
        // cannot panic on it.
        let mut builder =
            ServerCredentialsBuilder::new().add_cert(checked.chain.clone(), checked.key.clone());
        if let Some(ca) = &checked.client_ca {
            // The request type here is not read on a fetcher's path: the
            // one given to `with_fetcher` is.
            builder = builder
                .root_cert(ca.clone(), CertificateRequestType::RequestAndRequireClientCertificateAndVerify);
        }
        Ok(Some(builder))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tls::pem::testing::{self, pair};

    struct Dir(PathBuf);

    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn dir(name: &str) -> Dir {
        let dir = std::env::temp_dir().join(format!("atenet-tls-server-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        Dir(dir)
    }

    fn gauge() -> IntGauge {
        IntGauge::new("expiry", "the certificate's notAfter").unwrap()
    }

    /// `(certificate PEM, PKCS#8 key PEM)` of a pair valid from
    /// `not_before` to `not_after`.
    fn dated_pair(serial: u32, not_before: i64, not_after: i64) -> (String, String) {
        let key = testing::key();
        let cert = testing::dated(&key, serial, not_before, not_after);
        (
            String::from_utf8(cert.to_pem().unwrap()).unwrap(),
            String::from_utf8(key.private_key_to_pem_pkcs8().unwrap()).unwrap(),
        )
    }

    #[test]
    fn b106_a_certificate_out_of_its_dates_is_refused_and_the_gauge_follows_the_one_in_use() {
        let dir = dir("dates");
        let files = ServerFiles { cert: dir.0.join("tls.crt"), key: dir.0.join("tls.key"), client_ca: None };
        let now = pem::unix_now();
        let write = |(cert, key): (String, String)| {
            std::fs::write(&files.key, key).unwrap();
            std::fs::write(&files.cert, cert).unwrap();
        };
        let error = |files: &ServerFiles| check(files).err().expect("refused");
        write(dated_pair(1, now - 86_400, now - 60));
        let expired = error(&files);
        assert_eq!(expired.rotation_level(), log::Level::Error);
        let text = expired.to_string();
        assert!(
            text.starts_with("--extproc-cert-file ")
                && text.contains("tls.crt: its first certificate expired on"),
            "{text}"
        );
        write(dated_pair(2, now + 3600, now + 86_400));
        assert!(error(&files).to_string().contains("not valid yet"), "{}", error(&files));

        write(dated_pair(3, now - 60, now + 86_400));
        let expiry = gauge();
        let source = ServerCredentialFiles::load(files.clone(), expiry.clone()).unwrap();
        assert_eq!(expiry.get(), now + 86_400, "the notAfter of the certificate in use");
        for (serial, from, to) in [(4, now - 86_400, now - 60), (5, now + 3600, now + 86_400)] {
            write(dated_pair(serial, from, to));
            source.refresh();
            assert_eq!(source.current().0, 1, "serial {serial}: the last good set stays");
            assert_eq!(expiry.get(), now + 86_400, "and so does its notAfter");
        }
        write(dated_pair(6, now - 60, now + 2 * 86_400));
        source.refresh();
        assert_eq!((source.current().0, expiry.get()), (2, now + 2 * 86_400), "a valid rotation is taken");
        // Refused while not yet valid, taken once it is: refused files are
        // re-read every refresh.
        let soon = pem::unix_now() + 2;
        write(dated_pair(7, soon, soon + 86_400));
        source.refresh();
        if pem::unix_now() < soon {
            assert_eq!(source.current().0, 2, "not before its notBefore");
        }
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while source.current().0 == 2 {
            assert!(std::time::Instant::now() < deadline, "taken once valid");
            std::thread::sleep(std::time::Duration::from_millis(50));
            source.refresh();
        }
        assert_eq!(expiry.get(), soon + 86_400);
    }

    #[test]
    fn b86_a_rotation_is_checked_before_it_is_used() {
        let dir = dir("rotation");
        let files = ServerFiles { cert: dir.0.join("tls.crt"), key: dir.0.join("tls.key"), client_ca: None };
        let (cert, key) = pair(1);
        std::fs::write(&files.cert, &cert).unwrap();
        std::fs::write(&files.key, &key).unwrap();
        let source = ServerCredentialFiles::load(files.clone(), gauge()).unwrap();
        let fetcher = Fetcher { source: Arc::clone(&source), delivered: AtomicU64::new(0) };
        assert!(fetcher.fetch().unwrap().is_some(), "the first handshake gets the set");
        assert!(fetcher.fetch().unwrap().is_none(), "then nothing changed");
        source.refresh();
        assert!(fetcher.fetch().unwrap().is_none(), "the same files are no change");
        // Half a rotation: a new certificate beside the old key.
        let (new_cert, new_key) = pair(2);
        std::fs::write(&files.cert, &new_cert).unwrap();
        source.refresh();
        assert!(fetcher.fetch().unwrap().is_none(), "a key that does not match is not used");
        assert_eq!(source.current().0, 1);
        std::fs::write(&files.key, &new_key).unwrap();
        source.refresh();
        assert!(fetcher.fetch().unwrap().is_some(), "the completed rotation is");
        assert_eq!(source.current().1.chain, new_cert.as_bytes(), "OpenSSL's PEM of the new certificate");
        // Checked holds a key: no Debug, so no unwrap_err.
        let error = |files: &ServerFiles| check(files).err().expect("refused").to_string();
        let other = ServerFiles { key: dir.0.join("other.key"), ..files };
        assert!(error(&other).contains("--extproc-key-file"), "a missing key names the flag");
        std::fs::write(&other.key, pair(3).1).unwrap();
        let e = error(&other);
        assert!(e.contains("does not belong to --extproc-cert-file") && e.contains("tls.crt"), "{e}");
    }
}
