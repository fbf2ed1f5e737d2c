//! Process-wide policies: what a panic does and how many files the process
//! may open (the `serve` command's), and how the commands write to stdout.

use std::io::{self, Write};
use std::process::ExitCode;

/// A panic anywhere ends the process at once (B59).
///
/// A panic unwinds only its own thread. On a completion-queue thread that
/// strands every request whose verdict was in that task; on the timer thread
/// it stops every retry; and the process would still answer `/healthz`. A
/// half-dead router is worse than a restarted one, so the panic is logged at
/// error level, with where it happened, and the process aborts; systemd or
/// Kubernetes starts a fresh one.
pub fn install_panic_policy() {
    std::panic::set_hook(Box::new(|info| {
        let thread = std::thread::current();
        let backtrace = std::backtrace::Backtrace::capture();
        log::error!(
            "panic on thread {}: {info}; aborting so that the router restarts whole\n{backtrace}",
            thread.name().unwrap_or("<unnamed>")
        );
        std::process::abort();
    }));
}

/// Raises the soft limit on open files to the hard limit, as Go's runtime
/// does: every HTTP connection, ext_proc connection and credential read
/// needs a descriptor, and the soft default (often 1024) is far below what
/// the hard limit allows. Returns the (old, new) soft limit.
pub fn raise_fd_limit() -> io::Result<(u64, u64)> {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes one rlimit struct, which `limit` is.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let old = limit.rlim_cur;
    if limit.rlim_cur < limit.rlim_max {
        limit.rlim_cur = limit.rlim_max;
        // SAFETY: setrlimit reads one valid rlimit struct.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) } != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok((old, limit.rlim_cur))
}

/// Writes `text` to stdout for a command that then exits with the status
/// this returns. A reader that went away (`envoy-config | head`) ends the
/// output quietly, with success, as ripgrep does: `print!` would panic.
/// Any other failure (a full disk under `> file`) is reported and fails the
/// command, so a truncated output never looks complete.
pub fn print(text: &str) -> ExitCode {
    let mut out = io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("cannot write to stdout: {e}");
            ExitCode::FAILURE
        }
    }
}
