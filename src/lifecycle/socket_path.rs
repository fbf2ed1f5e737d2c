//! The path of ext_proc's Unix socket (B99, B100): what may be found
//! there before a router binds, and how its socket gets there.
//!
//! gRPC core unlinks whatever socket sits at the path it binds, and
//! unlinks that path again when its server shuts down
//! (`tcp_server_posix.cc`, `unix_sockets_posix.cc`). Bound at the public
//! path, a successor would steal it from a predecessor still serving, and
//! the predecessor, shutting down after the hand-over, would delete the
//! successor's name. So a router binds a private name beside the public
//! one (`<path>.<pid>`), gives the socket its mode and group there, and
//! renames it onto the public path: rename(2) replaces the name in one
//! step, so a client's connect() finds the old socket or the new one,
//! never none, and the new one already with its final mode. gRPC's later
//! unlink of the private name finds nothing.
//!
//! Depends on nothing of the crate.

use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// What a starting router found at the public path.
#[derive(Debug, PartialEq, Eq)]
pub enum Found {
    /// Nothing.
    Nothing,
    /// A socket nothing listens on (a crashed router's): connect() is
    /// refused. The rename replaces it.
    Stale,
}

/// Why the public path cannot be taken; each keeps what it saw.
#[derive(Debug)]
pub enum PathError {
    /// The path's directory is missing or no directory.
    NoDirectory { dir: PathBuf, source: io::Error },
    /// Something that is no socket sits at the path (left as it is).
    NotASocket { path: PathBuf, kind: &'static str },
    /// A process listens on the socket: connect() succeeded.
    InUse { path: PathBuf },
    /// The socket there could not be tried (connect() failed otherwise
    /// than refused, such as EACCES for another user's socket).
    Untried { path: PathBuf, source: io::Error },
}

impl PathError {
    /// Whether the error is in the path the operator gave, which no
    /// restart fixes (exit 2, B64); a socket in use may free up.
    pub fn is_configuration(&self) -> bool {
        matches!(self, PathError::NoDirectory { .. } | PathError::NotASocket { .. })
    }
}

impl std::fmt::Display for PathError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PathError::NoDirectory { dir, source } => {
                write!(f, "the socket's directory {} is not there ({source})", dir.display())
            }
            PathError::NotASocket { path, kind } => {
                write!(f, "{} is a {kind}, not a socket: left as it is", path.display())
            }
            PathError::InUse { path } => write!(f, "{} is in use: a process listens on it", path.display()),
            PathError::Untried { path, source } => {
                write!(f, "{}: cannot tell whether a process listens on it ({source})", path.display())
            }
        }
    }
}

impl std::error::Error for PathError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            PathError::NoDirectory { source, .. } | PathError::Untried { source, .. } => Some(source),
            PathError::NotASocket { .. } | PathError::InUse { .. } => None,
        }
    }
}

/// What a router that is no successor may take the public path over
/// from: nothing, or a stale socket. A live one is refused, as is
/// anything that is not a socket; nothing is deleted either way. A
/// router checks, binds and renames under the path's start lock
/// (`start_lock`): between this check and its rename, another router's
/// would find nothing and take the path too.
pub fn check_free(public: &Path) -> Result<Found, PathError> {
    if !check_kind(public)? {
        return Ok(Found::Nothing);
    }
    match std::os::unix::net::UnixStream::connect(public) {
        Ok(_) => Err(PathError::InUse { path: public.to_path_buf() }),
        Err(e) if e.raw_os_error() == Some(libc::ECONNREFUSED) => Ok(Found::Stale),
        // Gone between the look and the try: as free as before.
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Found::Nothing),
        Err(source) => Err(PathError::Untried { path: public.to_path_buf(), source }),
    }
}

/// Whether a socket sits at `public` (a successor's check: its
/// predecessor's is expected there). Its directory must exist and
/// anything but a socket is refused.
pub fn check_kind(public: &Path) -> Result<bool, PathError> {
    let dir = public.parent().unwrap_or(Path::new("/"));
    match std::fs::metadata(dir) {
        Ok(meta) if meta.is_dir() => {}
        Ok(_) => {
            let source = io::Error::from_raw_os_error(libc::ENOTDIR);
            return Err(PathError::NoDirectory { dir: dir.to_path_buf(), source });
        }
        Err(source) => return Err(PathError::NoDirectory { dir: dir.to_path_buf(), source }),
    }
    match std::fs::symlink_metadata(public) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(source) => Err(PathError::Untried { path: public.to_path_buf(), source }),
        Ok(meta) => {
            let kind = meta.file_type();
            let kind = match () {
                _ if kind.is_socket() => return Ok(true),
                _ if kind.is_file() => "regular file",
                _ if kind.is_dir() => "directory",
                _ if kind.is_symlink() => "symbolic link",
                _ => "special file",
            };
            Err(PathError::NotASocket { path: public.to_path_buf(), kind })
        }
    }
}

/// The name a router binds before it renames its socket onto `public`.
pub fn private_name(public: &Path, pid: u32) -> PathBuf {
    let mut name = public.as_os_str().to_owned();
    name.push(format!(".{pid}"));
    PathBuf::from(name)
}

/// The process's umask, narrowed for as long as it lives, so that a
/// socket bound meanwhile is born reachable by its owner only (mode
/// 0600): no window in which it has a wider mode than the one it is given
/// next. The umask is the process's: nothing else creates files while the
/// router starts.
pub struct OwnerOnly {
    previous: libc::mode_t,
}

impl OwnerOnly {
    pub fn narrow() -> OwnerOnly {
        // SAFETY: umask(2) cannot fail.
        OwnerOnly { previous: unsafe { libc::umask(0o177) } }
    }
}

impl Drop for OwnerOnly {
    fn drop(&mut self) {
        // SAFETY: as above.
        unsafe { libc::umask(self.previous) };
    }
}

/// Gives the socket bound at `private` its group and `mode`, then renames
/// it onto `public`, replacing whatever socket was there in one step. On
/// failure the private name is removed (it is this process's), and the
/// public path keeps what it had.
pub fn publish(private: &Path, public: &Path, mode: u32, group: Option<u32>) -> io::Result<()> {
    let done = set_owner_and_mode(private, mode, group).and_then(|()| std::fs::rename(private, public));
    if done.is_err() {
        let _ = std::fs::remove_file(private);
    }
    done
}

/// The filesystem inode of the socket file at `path` (which a rename
/// keeps): how a router tells its own socket from a successor's.
pub fn inode(path: &Path) -> io::Result<u64> {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(path).map(|meta| meta.ino())
}

/// Before a hand-over: gives this router's socket (inode `own`), which
/// `public` names, a second name `private`, so that it can take `public`
/// back should the successor rename its socket there and then fail. A
/// left-over `private` of this same socket is replaced. Once the hand-over
/// succeeds gRPC's shutdown unlinks `private` (it is the path it bound).
pub fn keep_second_name(public: &Path, private: &Path, own: u64) -> io::Result<()> {
    if inode(public)? != own {
        return Err(io::Error::other("the public path names another socket"));
    }
    if inode(private).is_ok_and(|ino| ino == own) {
        std::fs::remove_file(private)?;
    }
    std::fs::hard_link(public, private)
}

/// After a hand-over that failed: takes `public` back from a successor that
/// renamed its socket there before it failed (true), by renaming `private`
/// onto it; else drops the second name (false).
pub fn reclaim(public: &Path, private: &Path, own: u64) -> io::Result<bool> {
    if inode(public).is_ok_and(|ino| ino == own) {
        std::fs::remove_file(private)?;
        return Ok(false);
    }
    std::fs::rename(private, public)?;
    Ok(true)
}

fn set_owner_and_mode(path: &Path, mode: u32, group: Option<u32>) -> io::Result<()> {
    if let Some(gid) = group {
        let name = std::ffi::CString::new(path.as_os_str().as_bytes())
            .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        // SAFETY: lchown reads a NUL-terminated path; uid -1 keeps the owner.
        if unsafe { libc::lchown(name.as_ptr(), u32::MAX, gid) } != 0 {
            let e = io::Error::last_os_error();
            return Err(io::Error::new(e.kind(), format!("giving the socket group {gid}: {e}")));
        }
    }
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .map_err(|e| io::Error::new(e.kind(), format!("setting the socket's mode {mode:04o}: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;
    use std::os::unix::net::UnixListener;

    fn dir() -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "atenet-socket-path-{}-{}",
            std::process::id(),
            fastrand::u64(..)
        ));
        std::fs::create_dir(&dir).unwrap();
        dir
    }

    #[test]
    fn b99_nothing_stale_live_and_what_is_no_socket() {
        let dir = dir();
        let public = dir.join("extproc.sock");
        assert_eq!(check_free(&public).unwrap(), Found::Nothing);
        let live = UnixListener::bind(&public).unwrap();
        assert!(matches!(check_free(&public), Err(PathError::InUse { .. })), "someone listens");
        drop(live);
        assert_eq!(check_free(&public).unwrap(), Found::Stale, "the file stays, nothing listens");
        assert!(check_kind(&public).unwrap());
        std::fs::remove_file(&public).unwrap();
        std::fs::write(&public, "keep me").unwrap();
        let e = check_free(&public).unwrap_err();
        assert!(e.is_configuration() && e.to_string().contains("regular file"), "{e}");
        assert_eq!(std::fs::read_to_string(&public).unwrap(), "keep me", "deleted nothing");
        let missing = dir.join("nowhere").join("extproc.sock");
        assert!(matches!(check_free(&missing), Err(PathError::NoDirectory { .. })));
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn b100_published_with_its_mode_and_replacing_a_socket_in_one_step() {
        let dir = dir();
        let public = dir.join("extproc.sock");
        let first = UnixListener::bind(&public).unwrap();
        let private = private_name(&public, 42);
        assert_eq!(private.file_name().unwrap(), "extproc.sock.42");
        let second = {
            let _narrow = OwnerOnly::narrow();
            UnixListener::bind(&private).unwrap()
        };
        let born = std::fs::symlink_metadata(&private).unwrap().mode() & 0o777;
        assert_eq!(born, 0o600, "bound under the narrowed umask");
        publish(&private, &public, 0o640, None).unwrap();
        assert!(!private.exists(), "renamed away");
        assert_eq!(std::fs::symlink_metadata(&public).unwrap().mode() & 0o777, 0o640);
        let client = std::os::unix::net::UnixStream::connect(&public).unwrap();
        second.set_nonblocking(true).unwrap();
        assert!(second.accept().is_ok(), "the new socket has the name");
        first.set_nonblocking(true).unwrap();
        assert!(first.accept().is_err(), "the old one gets nothing new");
        drop(client);
        // A hand-over that fails after the successor took the name.
        let own = inode(&public).unwrap();
        keep_second_name(&public, &private, own).unwrap();
        keep_second_name(&public, &private, own).expect("a left-over second name is replaced");
        let taker = dir.join("taker.sock");
        let _taken = UnixListener::bind(&taker).unwrap();
        std::fs::rename(&taker, &public).unwrap();
        assert!(reclaim(&public, &private, own).unwrap(), "taken back");
        assert_eq!(inode(&public).unwrap(), own);
        keep_second_name(&public, &private, own).unwrap();
        assert!(!reclaim(&public, &private, own).unwrap(), "still ours: the second name dropped");
        assert!(!private.exists());
        let gone = dir.join("gone.sock.1");
        assert!(publish(&gone, &public, 0o600, None).is_err(), "nothing bound there");
        assert!(public.exists(), "the public path keeps its socket");
        std::fs::remove_dir_all(dir).unwrap();
    }
}
