//! The lock that makes a starting router's check of its ports and its
//! binding of them one claim (B75, B99).
//!
//! Every listener binds with `SO_REUSEPORT` (B75), so the bind itself
//! refuses no router; a router that is no successor first checks that
//! each port is free (a plain bind) and that nothing listens on its
//! socket's path (a connect). Two routers started at the same instant both
//! passed those checks before either bound, and both served: on one TCP
//! port, or on one socket path (one of them then on a socket with no
//! name). So a starting router takes a lock for each of its ports and for
//! its socket's path before it checks them, and holds the locks until every
//! listener is bound and its socket has its name: a router that comes
//! second waits for them, then finds the first one's listeners and fails
//! its check, as it would have a moment later. A successor takes none: it
//! binds beside its predecessor by design, and a router checking meanwhile
//! finds the predecessor's listeners.
//!
//! Each lock is an abstract Unix socket named after what it guards: the
//! kernel gives a name to one socket at a time and frees it when that
//! socket closes, however the process ends, and no file is left behind.
//! Abstract names belong to a network namespace, as ports do. A socket
//! path is named by its directory's device and inode (whatever the
//! spelling of the path) and a hash of its file name: two paths whose
//! hashes collide only wait for each other. Routers in two network
//! namespaces that share a socket directory are not serialized by the
//! lock; their check still refuses a path a router already serves.
//!
//! Depends on nothing of the crate.

use std::io;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::{SocketAddr, UnixListener};
use std::path::Path;
use std::time::{Duration, Instant};

/// How often a router waiting for a lock tries it again.
const RETRY: Duration = Duration::from_millis(10);

/// What one lock guards.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Guarded {
    /// The abstract socket's name: what orders the locks.
    name: String,
    /// What an operator reads in a message: `port 9001`, `unix:/path`.
    what: String,
}

impl Guarded {
    /// A TCP port, on any address: routers on one port at different
    /// addresses only wait for each other's start.
    pub fn port(port: u16) -> Guarded {
        Guarded { name: format!("atenet-router/port/{port}"), what: format!("port {port}") }
    }

    /// A Unix socket's path; `None` when its directory cannot be looked
    /// at (the path's own check then refuses it).
    pub fn socket_path(path: &Path) -> Option<Guarded> {
        use std::os::unix::fs::MetadataExt;
        let dir = std::fs::metadata(path.parent()?).ok()?;
        let file = path.file_name()?.as_bytes();
        let hash = file.iter().fold(0xcbf2_9ce4_8422_2325_u64, |h, &b| {
            (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3) // FNV-1a
        });
        Some(Guarded {
            name: format!("atenet-router/path/{:x}.{:x}/{hash:016x}", dir.dev(), dir.ino()),
            what: format!("unix:{}", path.display()),
        })
    }
}

/// Why the locks could not be taken.
#[derive(Debug)]
pub enum LockError {
    /// Another router held one for the whole patience: it has been
    /// starting that long (or hangs in its start).
    Held { what: String, patience: Duration },
    /// The lock's socket could not be made or bound.
    Failed { what: String, source: io::Error },
}

impl std::fmt::Display for LockError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LockError::Held { what, patience } => write!(
                f,
                "another router has been starting on {what} for {} s: not waiting longer",
                patience.as_secs()
            ),
            LockError::Failed { what, source } => write!(f, "cannot take the start lock of {what}: {source}"),
        }
    }
}

impl std::error::Error for LockError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            LockError::Held { .. } => None,
            LockError::Failed { source, .. } => Some(source),
        }
    }
}

/// The locks a starting router holds; dropped, they are free.
#[derive(Debug)]
pub struct StartLock {
    _held: Vec<UnixListener>,
}

impl StartLock {
    /// Takes a lock for each of `guarded`, in the order of their names (so
    /// that two routers that want some of the same never wait for each
    /// other in a circle), waiting at most `patience` for each one another
    /// router holds.
    pub fn take(mut guarded: Vec<Guarded>, patience: Duration) -> Result<StartLock, LockError> {
        guarded.sort();
        guarded.dedup_by(|a, b| a.name == b.name);
        let held = guarded.iter().map(|g| take_one(g, patience)).collect::<Result<_, _>>()?;
        Ok(StartLock { _held: held })
    }
}

fn take_one(guarded: &Guarded, patience: Duration) -> Result<UnixListener, LockError> {
    let failed = |source| LockError::Failed { what: guarded.what.clone(), source };
    let name = SocketAddr::from_abstract_name(guarded.name.as_bytes()).map_err(failed)?;
    let deadline = Instant::now() + patience;
    let mut waited = false;
    loop {
        match UnixListener::bind_addr(&name) {
            Ok(lock) => return Ok(lock),
            Err(e) if e.kind() == io::ErrorKind::AddrInUse => {
                if Instant::now() >= deadline {
                    return Err(LockError::Held { what: guarded.what.clone(), patience });
                }
                if !waited {
                    log::info!("another router is starting on {}: waiting for it", guarded.what);
                    waited = true;
                }
                std::thread::sleep(RETRY);
            }
            Err(e) => return Err(failed(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unique_port() -> u16 {
        // A port number no other test locks: the lock is only a name.
        std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
    }

    #[test]
    fn b75_a_held_lock_waits_then_is_taken_once_freed() {
        let port = unique_port();
        let first = StartLock::take(vec![Guarded::port(port)], Duration::ZERO).unwrap();
        let e = StartLock::take(vec![Guarded::port(port)], Duration::from_millis(50)).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!("another router has been starting on port {port} for 0 s: not waiting longer")
        );
        let waiter =
            std::thread::spawn(move || StartLock::take(vec![Guarded::port(port)], Duration::from_secs(30)));
        // Most likely the waiter is retrying by now; taken at once if not.
        std::thread::sleep(Duration::from_millis(50));
        drop(first);
        waiter.join().unwrap().expect("taken once freed");
    }

    #[test]
    fn b75_locks_are_taken_in_one_order_and_each_once() {
        let (a, b) = (unique_port(), unique_port());
        let both =
            StartLock::take(vec![Guarded::port(b), Guarded::port(a), Guarded::port(b)], Duration::ZERO)
                .expect("a port named twice is locked once");
        assert!(StartLock::take(vec![Guarded::port(a)], Duration::ZERO).is_err());
        assert!(StartLock::take(vec![Guarded::port(b)], Duration::ZERO).is_err());
        drop(both);
        StartLock::take(vec![Guarded::port(a), Guarded::port(b)], Duration::ZERO).unwrap();
    }

    #[test]
    fn b99_a_socket_path_is_one_lock_however_spelled() {
        let dir = std::env::temp_dir().join(format!(
            "atenet-start-lock-{}-{}",
            std::process::id(),
            fastrand::u64(..)
        ));
        std::fs::create_dir(&dir).unwrap();
        let path = dir.join("extproc.sock");
        let spelled = dir.join(".").join("extproc.sock");
        let other = dir.join("other.sock");
        let (a, b) = (Guarded::socket_path(&path).unwrap(), Guarded::socket_path(&spelled).unwrap());
        assert_eq!(a.name, b.name);
        assert_ne!(a.name, Guarded::socket_path(&other).unwrap().name);
        assert!(a.name.len() < 107, "fits an abstract name: {}", a.name);
        let held = StartLock::take(vec![a], Duration::ZERO).unwrap();
        assert!(StartLock::take(vec![b], Duration::ZERO).is_err());
        StartLock::take(vec![Guarded::socket_path(&other).unwrap()], Duration::ZERO).unwrap();
        drop(held);
        assert!(Guarded::socket_path(&dir.join("missing").join("x.sock")).is_none());
        std::fs::remove_dir_all(dir).unwrap();
    }
}
