//! A planned restart that fails no request (B75, B94).
//!
//! On `SIGHUP` the router starts its successor: the binary on disk with the
//! same arguments. The successor binds the same ports beside it (every
//! listener has `SO_REUSEPORT`, `listen`), and says it serves by writing to
//! a pipe whose descriptor it finds in [`HANDOVER_FD`]. Only then does the
//! predecessor stop: its HTTP listeners first, then ext_proc, whose GOAWAY
//! moves Envoy's new streams onto the successor while every stream it holds,
//! parked ones included, finishes. Envoy is left alone: no health check
//! fails and no listener drains.
//!
//! A successor that exits, closes the pipe, stays silent, or is overtaken
//! by a SIGTERM or SIGINT is killed with its whole process group (it leads
//! one of its own: a wrapper script that forks without `exec` leaves no
//! orphan), and reaped; the thread that watched it is joined and every
//! descriptor of the attempt closed, so a failed attempt leaves nothing
//! behind. The predecessor then serves on, or drains for the signal.

use std::ffi::OsString;
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command};
use std::time::Duration;

use crossbeam_channel::{select, Receiver};

/// The environment variable naming the successor's end of the pipe.
pub const HANDOVER_FD: &str = "ATENET_HANDOVER_FD";

/// What the successor writes once every listener is bound.
const READY: &[u8] = b"ready\n";

/// Why a successor does not serve.
#[derive(Debug, PartialEq, Eq)]
pub enum NotServing {
    /// It failed: the reason, for the log.
    Failed(String),
    /// A SIGTERM or SIGINT (its number) came while it started.
    Stopped(i32),
}

/// A successor being started.
pub struct Successor {
    child: Child,
    ready: File,
    /// Readable once the child has exited (pidfd), when the kernel has them.
    exited: Option<OwnedFd>,
    /// A pipe whose write end, closed, ends the watch of the successor.
    cancel: OwnedFd,
    cancelled: OwnedFd,
}

impl Successor {
    /// Starts `exe` with `args` as the leader of a process group of its own,
    /// handing it the write end of a pipe.
    pub fn start(exe: &Path, args: &[OsString]) -> io::Result<Successor> {
        let (cancelled, cancel) = pipe()?;
        let (ready, writer) = pipe()?;
        let inherited = writer.as_raw_fd();
        let mut command = Command::new(exe);
        command.args(args).env(HANDOVER_FD, inherited.to_string()).process_group(0);
        // SAFETY: the closure runs in the child between fork and exec and
        // calls only fcntl, which is async-signal-safe; it clears
        // FD_CLOEXEC on the write end so that the child alone inherits it.
        unsafe {
            command.pre_exec(move || match libc::fcntl(inherited, libc::F_SETFD, 0) {
                0 => Ok(()),
                _ => Err(io::Error::last_os_error()),
            });
        }
        let child = command.spawn();
        // Only the child keeps the write end: its exit then ends our read.
        drop(writer);
        let child = child?;
        let exited = pidfd(child.id());
        Ok(Successor { child, ready: File::from(ready), exited, cancel, cancelled })
    }

    /// Waits until the successor serves, at most `patience`, or until a
    /// signal arrives on `stops`: its pid, or why not (it is then killed
    /// with its process group, and reaped).
    pub fn wait_ready(self, patience: Duration, stops: &Receiver<i32>) -> Result<u32, NotServing> {
        let Successor { mut child, ready, exited, cancel, cancelled } = self;
        let (tx, rx) = crossbeam_channel::bounded(1);
        let watch = Watch { ready, exited, cancelled, pid: child.id() };
        let spawned = std::thread::Builder::new().name("atenet-handover".into()).spawn(move || {
            let _ = tx.send(watch.run());
        });
        let watcher = match spawned {
            Ok(watcher) => watcher,
            Err(e) => {
                kill_group(&child);
                let _ = child.wait();
                return Err(NotServing::Failed(format!("cannot watch the successor: {e}")));
            }
        };
        let attempt = Attempt { child, cancel, watcher };
        let deadline = crossbeam_channel::after(patience);
        select! {
            recv(rx) -> seen => match seen {
                Ok(Seen::Ready) => Ok(attempt.served()),
                Ok(Seen::Exited) => Err(attempt.abandon(Abandoned::Exited)),
                Ok(Seen::Said(said)) => Err(attempt.abandon(Abandoned::Failed(format!(
                    "the successor said {:?} instead of {:?}",
                    String::from_utf8_lossy(&said),
                    String::from_utf8_lossy(READY)
                )))),
                Ok(Seen::Failed(e)) => Err(attempt.abandon(Abandoned::Failed(format!("watching the successor failed ({e})")))),
                Ok(Seen::Cancelled) | Err(_) => Err(attempt.abandon(Abandoned::Failed("the successor's watcher ended".into()))),
            },
            recv(stops) -> signal => match signal {
                Ok(signal) => Err(attempt.abandon(Abandoned::Stopped(signal))),
                Err(_) => Err(attempt.abandon(Abandoned::Failed("the signal thread ended".into()))),
            },
            recv(deadline) -> _ => Err(attempt.abandon(Abandoned::Failed(format!(
                "the successor did not serve within {}",
                crate::cli::godur::format(patience)
            )))),
        }
    }
}

/// A started successor, the watcher's thread and its cancel pipe: what an
/// attempt holds until it ends one way or the other.
struct Attempt {
    child: Child,
    /// Closing it ends the watcher's poll.
    cancel: OwnedFd,
    watcher: std::thread::JoinHandle<()>,
}

/// Why an attempt is given up.
enum Abandoned {
    /// The successor exited on its own.
    Exited,
    Failed(String),
    Stopped(i32),
}

impl Attempt {
    /// The successor serves: the watcher is joined, the successor left
    /// running.
    fn served(self) -> u32 {
        drop(self.cancel);
        let _ = self.watcher.join();
        self.child.id()
    }

    /// Kills the successor's process group, reaps the successor and joins
    /// the watcher.
    fn abandon(mut self, why: Abandoned) -> NotServing {
        kill_group(&self.child);
        let status = self.child.wait();
        // Closing the cancel pipe ends the watcher's poll in any case.
        drop(self.cancel);
        let _ = self.watcher.join();
        match why {
            Abandoned::Exited => NotServing::Failed(match status {
                Ok(status) => format!("the successor exited ({status}) before it served"),
                Err(e) => format!("the successor exited before it served ({e})"),
            }),
            Abandoned::Failed(why) => NotServing::Failed(why),
            Abandoned::Stopped(signal) => NotServing::Stopped(signal),
        }
    }
}

/// Kills the process group `leader` leads. The leader must not be reaped
/// yet (the watcher only looks, with WNOWAIT): then its pid, which is the
/// group's id, cannot have been reused, and this kills nothing but the
/// group, whether the leader still runs or is a zombie.
fn kill_group(leader: &Child) {
    // SAFETY: kill(2) with a negative pid signals a process group.
    unsafe { libc::kill(-(leader.id() as libc::pid_t), libc::SIGKILL) };
}

/// What the watcher saw first.
enum Seen {
    Ready,
    /// The successor exited.
    Exited,
    /// The pipe said something else than [`READY`].
    Said(Vec<u8>),
    Failed(io::Error),
    /// The attempt ended without it.
    Cancelled,
}

/// The descriptors a watcher polls: the pipe, the successor's pidfd, and
/// the read end of a pipe whose closing cancels the watch.
struct Watch {
    ready: File,
    exited: Option<OwnedFd>,
    cancelled: OwnedFd,
    pid: u32,
}

/// Without a pidfd (a kernel before 5.3), how often the watcher looks
/// whether the successor exited.
const EXIT_CHECK_MS: libc::c_int = 20;

impl Watch {
    fn run(mut self) -> Seen {
        let mut said = Vec::new();
        // Until the pipe closes: every writer gone means the successor and
        // whatever it forked closed it, most likely by exiting, which the
        // pidfd says next.
        let mut reading = true;
        loop {
            let pipe = if reading { self.ready.as_raw_fd() } else { -1 };
            let exited = self.exited.as_ref().map_or(-1, AsRawFd::as_raw_fd);
            let mut fds = [
                libc::pollfd { fd: self.cancelled.as_raw_fd(), events: libc::POLLIN, revents: 0 },
                libc::pollfd { fd: pipe, events: libc::POLLIN, revents: 0 },
                libc::pollfd { fd: exited, events: libc::POLLIN, revents: 0 },
            ];
            let timeout = if self.exited.is_some() { -1 } else { EXIT_CHECK_MS };
            // SAFETY: `fds` is a valid array of three pollfd structs; poll
            // ignores those whose fd is negative.
            if unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout) } < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Seen::Failed(e);
            }
            if fds[0].revents != 0 {
                return Seen::Cancelled;
            }
            if fds[1].revents != 0 {
                let mut buf = [0u8; 16];
                match self.ready.read(&mut buf) {
                    Ok(0) => reading = false,
                    Ok(n) => said.extend_from_slice(&buf[..n]),
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return Seen::Failed(e),
                }
                if said.len() >= READY.len() {
                    return if said.starts_with(READY) { Seen::Ready } else { Seen::Said(said) };
                }
            }
            if fds[2].revents != 0 || (self.exited.is_none() && has_exited(self.pid)) {
                return Seen::Exited;
            }
        }
    }
}

/// Whether the child `pid` has exited, leaving it to be reaped.
fn has_exited(pid: u32) -> bool {
    // SAFETY: waitid fills one siginfo_t; WNOWAIT leaves the child waitable.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    let flags = libc::WEXITED | libc::WNOHANG | libc::WNOWAIT;
    // SAFETY: as above; `info` outlives the call.
    let r = unsafe { libc::waitid(libc::P_PID, pid as libc::id_t, &mut info, flags) };
    // SAFETY: si_pid is set by waitid when a child changed state, 0 if none.
    r == 0 && unsafe { info.si_pid() } != 0
}

/// A pidfd for `pid`, when the kernel has pidfd_open (Linux 5.3).
fn pidfd(pid: u32) -> Option<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor
    // (close-on-exec) or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    // SAFETY: a non-negative result is a descriptor nothing else owns.
    (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// A pipe, both ends close-on-exec: (read, write).
fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds: [RawFd; 2] = [-1; 2];
    // SAFETY: pipe2 writes two descriptors into `fds`.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: both descriptors are fresh and owned here from now on.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
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
