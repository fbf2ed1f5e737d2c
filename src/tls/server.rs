//! The ext_proc listener's TLS credentials, which follow the files on disk
//! (B86).
//!
//! The certificate and key come as two PEM files (a Kubernetes TLS Secret's
//! `tls.crt` and `tls.key`), with an optional client CA: with one, only a
//! client whose certificate that CA signed completes the handshake. Every
//! file is checked by [`crate::tls::pem`] (the key must match the
//! certificate) before gRPC sees it: at startup a bad set is an error
//! naming the flag, and at rotation it is refused, logged once, and the
//! last good set stays in use.
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
}

impl ServerCredentialFiles {
    /// Reads and checks the files: an error names the flag, the path and
    /// why (startup refuses it, B70).
    pub fn load(files: ServerFiles) -> Result<Arc<ServerCredentialFiles>, CredentialsError> {
        let checked = Arc::new(check(&files)?);
        Ok(Arc::new(ServerCredentialFiles {
            files,
            current: Mutex::new(Current { generation: 1, checked, rejected: None }),
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
                current.checked = Arc::new(checked);
                current.generation += 1;
                current.rejected = None;
                log::info!("ext_proc TLS credentials changed on disk: new connections use them");
                return;
            }
            Err(e) => e.to_string(),
        };
        if current.rejected.as_deref() != Some(problem.as_str()) {
            log::warn!("ext_proc TLS credentials not reloaded, keeping the last good ones: {problem}");
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
    let (chain, key) = named(KEY_FLAG, &files.key, pem::key_pair(&chain, &key, &which))?;
    let client_ca = match &files.client_ca {
        Some(path) => Some(named(CLIENT_CA_FLAG, path, pem::certificates(&contents[2]))?),
        None => None,
    };
    Ok(Checked { read: contents, chain, key, client_ca })
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
    use crate::tls::pem::testing::pair;

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

    #[test]
    fn b86_a_rotation_is_checked_before_it_is_used() {
        let dir = dir("rotation");
        let files = ServerFiles { cert: dir.0.join("tls.crt"), key: dir.0.join("tls.key"), client_ca: None };
        let (cert, key) = pair(1);
        std::fs::write(&files.cert, &cert).unwrap();
        std::fs::write(&files.key, &key).unwrap();
        let source = ServerCredentialFiles::load(files.clone()).unwrap();
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
