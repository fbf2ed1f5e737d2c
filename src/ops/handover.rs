//! A planned restart that fails no request (B75).
//!
//! On `SIGHUP` the router starts its successor: the binary on disk with the
//! same arguments. The successor binds the same ports beside it (every
//! listener has `SO_REUSEPORT`, `listen`), and says it serves by writing to
//! a pipe whose descriptor it finds in [`HANDOVER_FD`]. Only then does the
//! predecessor stop: its HTTP listeners first, then ext_proc, whose GOAWAY
//! moves Envoy's new streams onto the successor while every stream it holds,
//! parked ones included, finishes. Envoy is left alone: no health check
//! fails and no listener drains. A successor that exits or stays silent is
//! killed, and the predecessor serves on.

use std::ffi::OsString;
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{FromRawFd, RawFd};
use std::path::Path;
use std::process::{Child, Command};
use std::time::Duration;

/// The environment variable naming the successor's end of the pipe.
pub const HANDOVER_FD: &str = "ATENET_HANDOVER_FD";

/// What the successor writes once every listener is bound.
const READY: &[u8] = b"ready\n";

/// A successor being started.
pub struct Successor {
    child: Child,
    ready: File,
}

impl Successor {
    /// Starts `exe` with `args`, handing it the write end of a pipe.
    pub fn start(exe: &Path, args: &[OsString]) -> io::Result<Successor> {
        let mut fds: [RawFd; 2] = [-1; 2];
        // SAFETY: pipe2 writes two descriptors into `fds`. The write end is
        // left without O_CLOEXEC so that the child inherits it; the read end
        // gets it below.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), 0) } != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: both descriptors are fresh and owned here from now on.
        let (ready, writer) = unsafe { (File::from_raw_fd(fds[0]), File::from_raw_fd(fds[1])) };
        // SAFETY: F_SETFD on a descriptor this process owns.
        if unsafe { libc::fcntl(fds[0], libc::F_SETFD, libc::FD_CLOEXEC) } != 0 {
            return Err(io::Error::last_os_error());
        }
        let child = Command::new(exe).args(args).env(HANDOVER_FD, fds[1].to_string()).spawn();
        // Only the child keeps the write end: its exit then ends our read.
        drop(writer);
        Ok(Successor { child: child?, ready })
    }

    /// Waits until the successor serves, at most `patience`: its pid, or
    /// why not (it is then killed and reaped).
    pub fn wait_ready(mut self, patience: Duration) -> Result<u32, String> {
        let (tx, rx) = crossbeam_channel::bounded(1);
        let mut ready = self.ready;
        std::thread::spawn(move || {
            let mut said = Vec::new();
            let _ = (&mut ready).take(READY.len() as u64).read_to_end(&mut said);
            let _ = tx.send(said);
        });
        let why = match rx.recv_timeout(patience) {
            Ok(said) if said == READY => return Ok(self.child.id()),
            Ok(_) => match self.child.wait() {
                Ok(status) => format!("the successor exited ({status}) before it served"),
                Err(e) => format!("the successor ended its pipe before it served ({e})"),
            },
            Err(_) => format!("the successor did not serve within {}", crate::cli::godur::format(patience)),
        };
        let _ = self.child.kill();
        let _ = self.child.wait();
        Err(why)
    }
}

/// In a successor: tells the predecessor that every listener is bound.
/// Without [`HANDOVER_FD`] (a router started by hand or by systemd) it
/// does nothing.
pub fn announce_ready() {
    let Some(fd) = std::env::var(HANDOVER_FD).ok().and_then(|v| v.parse::<RawFd>().ok()) else { return };
    // Only a pipe is written to: a stale variable must not make this
    // process write into some other file it has open.
    // SAFETY: fstat fills one stat struct; an invalid descriptor fails.
    let mut stat: libc::stat = unsafe { std::mem::zeroed() };
    if unsafe { libc::fstat(fd, &mut stat) } != 0 || stat.st_mode & libc::S_IFMT != libc::S_IFIFO {
        log::warn!("handover: {HANDOVER_FD}={fd} is not a pipe; no predecessor to tell");
        return;
    }
    // SAFETY: the predecessor passed this pipe for this one write; nothing
    // else in this process uses it, and it is closed here.
    let mut pipe = unsafe { File::from_raw_fd(fd) };
    if let Err(e) = pipe.write_all(READY) {
        log::warn!("handover: cannot tell the predecessor that this router serves: {e}");
    }
}

/// Whether this process was started by a predecessor handing over.
pub fn is_successor() -> bool {
    std::env::var_os(HANDOVER_FD).is_some()
}
