//! Reading one credential file: a regular file, at most
//! [`MAX_CREDENTIAL_FILE`], opened so that nothing can block the reader
//! (B71), with errors that name the flag and the path (B60, B70).

use std::fs;
use std::io::Read;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use crate::tls::pem::PemError;

/// Why a credential file cannot be used (B60): which flag, which file, and
/// the cause.
#[derive(Debug)]
pub enum CredentialsError {
    /// The file could not be read.
    Unreadable { flag: &'static str, path: PathBuf, source: std::io::Error },
    /// The router may not read the file: which user and group it runs as
    /// (a container's UID 65532, systemd's dynamic user) is what the
    /// operator needs to fix the file's owner or mode.
    Denied { flag: &'static str, path: PathBuf, uid: u32, gid: u32, source: std::io::Error },
    /// The path names a FIFO, a device, a directory or a socket: reading
    /// one could block for ever or never end.
    NotRegular { flag: &'static str, path: PathBuf, kind: &'static str },
    /// The file is far larger than any credential file.
    TooLarge { flag: &'static str, path: PathBuf },
    /// A certificate, CA or key file that is not usable PEM, or a key that
    /// does not match its certificate.
    Pem { flag: &'static str, path: PathBuf, source: PemError },
    /// A token file that holds no usable bearer token (the reason never
    /// quotes the token).
    Token { flag: &'static str, path: PathBuf, reason: String },
}

impl std::fmt::Display for CredentialsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CredentialsError::Unreadable { flag, path, source } => {
                write!(f, "{flag} {}: {source}", path.display())
            }
            CredentialsError::Denied { flag, path, uid, gid, .. } => write!(
                f,
                "{flag} {}: permission denied (the router runs as uid {uid}, gid {gid})",
                path.display()
            ),
            CredentialsError::NotRegular { flag, path, kind } => {
                write!(f, "{flag} {}: a {kind}, not a regular file", path.display())
            }
            CredentialsError::TooLarge { flag, path } => write!(
                f,
                "{flag} {}: larger than {} KiB: not a credential file",
                path.display(),
                MAX_CREDENTIAL_FILE / 1024
            ),
            CredentialsError::Pem { flag, path, source } => write!(f, "{flag} {}: {source}", path.display()),
            CredentialsError::Token { flag, path, reason } => {
                write!(f, "{flag} {}: {reason}", path.display())
            }
        }
    }
}

impl CredentialsError {
    /// The level a refused rotation is logged at (B60, B106): a warning for
    /// a file caught half-way through a rotation, which the next write
    /// completes; an error for a certificate outside its validity period,
    /// the issuer's mistake or the clock's, which no write in progress
    /// explains.
    pub fn rotation_level(&self) -> log::Level {
        match self {
            CredentialsError::Pem { source: PemError::Expired(_) | PemError::NotYetValid(_), .. } => {
                log::Level::Error
            }
            _ => log::Level::Warn,
        }
    }
}

impl std::error::Error for CredentialsError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            CredentialsError::Unreadable { source, .. } | CredentialsError::Denied { source, .. } => {
                Some(source)
            }
            CredentialsError::Pem { source, .. } => Some(source),
            CredentialsError::TooLarge { .. }
            | CredentialsError::NotRegular { .. }
            | CredentialsError::Token { .. } => None,
        }
    }
}

/// Credential files are small; anything bigger is the wrong file (or a
/// device), and is refused rather than read without bound.
pub const MAX_CREDENTIAL_FILE: u64 = 1024 * 1024;

/// The contents of the credential file `path` that `flag` names.
pub fn read(flag: &'static str, path: &Path) -> Result<Vec<u8>, CredentialsError> {
    let unreadable = |source: std::io::Error| {
        let path = path.to_path_buf();
        if source.kind() == std::io::ErrorKind::PermissionDenied {
            // SAFETY: geteuid and getegid cannot fail and touch no memory.
            let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
            CredentialsError::Denied { flag, path, uid, gid, source }
        } else {
            CredentialsError::Unreadable { flag, path, source }
        }
    };
    // O_NONBLOCK: opening a FIFO for reading otherwise waits for a writer,
    // for ever, at startup (deaf to SIGTERM) or on the watcher thread. The
    // type is then checked on the open file, so a path swapped in between
    // cannot slip past.
    let file =
        fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK).open(path).map_err(unreadable)?;
    let file_type = file.metadata().map_err(unreadable)?.file_type();
    if !file_type.is_file() {
        let kind = if file_type.is_fifo() {
            "FIFO"
        } else if file_type.is_dir() {
            "directory"
        } else if file_type.is_char_device() || file_type.is_block_device() {
            "device"
        } else if file_type.is_socket() {
            "socket"
        } else {
            "special file"
        };
        return Err(CredentialsError::NotRegular { flag, path: path.to_path_buf(), kind });
    }
    let mut bytes = Vec::new();
    file.take(MAX_CREDENTIAL_FILE + 1).read_to_end(&mut bytes).map_err(unreadable)?;
    if bytes.len() as u64 > MAX_CREDENTIAL_FILE {
        return Err(CredentialsError::TooLarge { flag, path: path.to_path_buf() });
    }
    Ok(bytes)
}

/// `result` with a PEM error named by its flag and path.
pub fn named<T>(flag: &'static str, path: &Path, result: Result<T, PemError>) -> Result<T, CredentialsError> {
    result.map_err(|source| CredentialsError::Pem { flag, path: path.to_path_buf(), source })
}
