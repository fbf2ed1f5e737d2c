//! The real binaries as child processes: start, read where they listen,
//! collect their logs, signal them.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

pub const ROUTER_BIN: &str = env!("CARGO_BIN_EXE_atenet-router");
pub const SIM_BIN: &str = env!("CARGO_BIN_EXE_ateapi-sim");

/// `serve` flags for a router on loopback, any free ports, plaintext to
/// `ateapi`, and no drain waits or Envoy admin; flags in `extra` replace
/// these defaults or add to them.
pub fn router_args(ateapi: &str, extra: &[&str]) -> Vec<String> {
    let defaults = [
        ("--ateapi-address", ateapi),
        ("--port-extproc", "0"),
        ("--metrics-listen-addr", "127.0.0.1:0"),
        ("--status-port", "0"),
        ("--drain-delay", "0s"),
        ("--envoy-admin-address", ""),
        ("--drain-complete-file", ""),
    ];
    let mut args = vec!["serve".to_string(), "--ateapi-insecure".to_string()];
    for (flag, value) in defaults {
        if !extra.contains(&flag) {
            args.extend([flag.to_string(), value.to_string()]);
        }
    }
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

/// A child process and its stderr, line by line. Killed when dropped, so a
/// failed test leaves no process behind.
pub struct Spawned {
    pub child: Child,
    /// The first line containing the marker it was started with.
    pub line: String,
    /// Every later stderr line.
    pub log: Arc<Mutex<Vec<String>>>,
}

impl Drop for Spawned {
    fn drop(&mut self) {
        // A failing test shows what the process said (cargo test prints a
        // failed test's output only).
        if std::thread::panicking() {
            eprintln!(
                "--- stderr of pid {} ---\n{}\n{}",
                self.child.id(),
                self.line,
                self.log.lock().join("\n")
            );
        }
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Starts `program` and waits for a stderr line containing `marker`.
pub fn spawn_until<S: AsRef<std::ffi::OsStr>>(program: &str, args: &[S], marker: &str) -> Spawned {
    spawn_until_with(program, args, &[], marker)
}

/// As [`spawn_until`], with environment variables `env` added.
pub fn spawn_until_with<S: AsRef<std::ffi::OsStr>>(
    program: &str,
    args: &[S],
    env: &[(&str, &str)],
    marker: &str,
) -> Spawned {
    let mut child = Command::new(program)
        .args(args)
        .envs(env.iter().copied())
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .expect("spawn");
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    // What came before the marker, for the message of one that never does.
    let mut before = Vec::new();
    let line = loop {
        match lines.next() {
            Some(Ok(line)) if line.contains(marker) => break line,
            Some(Ok(line)) => before.push(line),
            _ => panic!("{program} exited before printing {marker:?}:\n{}", before.join("\n")),
        }
    };
    let log = Arc::new(Mutex::new(Vec::new()));
    let sink = Arc::clone(&log);
    // Keep draining stderr so the child never blocks on a full pipe.
    std::thread::spawn(move || lines.map_while(Result::ok).for_each(|l| sink.lock().push(l)));
    Spawned { child, line, log }
}

/// The word after `prefix` in a line (up to a space or comma).
pub fn word_after<'a>(line: &'a str, prefix: &str) -> &'a str {
    let start = line.find(prefix).unwrap_or_else(|| panic!("{prefix:?} in {line:?}")) + prefix.len();
    line[start..].split([' ', ',']).next().unwrap()
}

/// Puts an executable copy of `from` at `to` (replacing it), written by a
/// child process: a file this process held open for writing is inherited
/// by whatever child another test thread forks at that moment, and
/// executing the file fails with ETXTBSY ("Text file busy") until that
/// child execs.
pub fn install_executable(from: &std::path::Path, to: &std::path::Path) {
    let _ = std::fs::remove_file(to);
    let status = Command::new("install").arg("-m").arg("0755").arg(from).arg(to).status().expect("install");
    assert!(status.success(), "install {} {}", from.display(), to.display());
}

/// Puts an executable script with `text` at `to`, as
/// [`install_executable`] does.
pub fn install_script(text: &str, to: &std::path::Path) {
    let draft = to.with_extension("draft");
    std::fs::write(&draft, text).unwrap();
    install_executable(&draft, to);
    std::fs::remove_file(&draft).unwrap();
}

/// A running router binary.
pub struct RouterProcess {
    pub process: Spawned,
    pub extproc: SocketAddr,
    pub metrics: SocketAddr,
}

/// Starts the router binary with `args` (see [`router_args`]).
pub fn spawn_router(args: &[String]) -> RouterProcess {
    RouterProcess::from(spawn_until(ROUTER_BIN, args, "serving"))
}

impl From<Spawned> for RouterProcess {
    /// A router whose "serving" line `process` has read.
    fn from(process: Spawned) -> RouterProcess {
        let extproc = word_after(&process.line, "ext_proc on ").parse().unwrap();
        let metrics =
            word_after(&process.line, "metrics on http://").trim_end_matches("/metrics").parse().unwrap();
        RouterProcess { process, extproc, metrics }
    }
}

/// Sends a signal by name (`TERM`, `INT`).
pub fn signal(child: &Child, name: &str) {
    let status = Command::new("kill").args([&format!("-{name}"), &child.id().to_string()]).status().unwrap();
    assert!(status.success());
}

/// Waits for the child to exit; panics after `limit`.
pub fn wait_exit(child: &mut Child, limit: Duration) -> i32 {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status.code().unwrap_or(-1);
        }
        assert!(Instant::now() < deadline, "process did not exit within {limit:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Runs `command`, which should refuse to start: its exit code and
/// stderr. One still running after [`super::PATIENCE`] (it took what it
/// should have refused, and serves) is killed and gets no code, so the
/// test fails instead of waiting for ever.
pub fn run_refused(command: &mut Command) -> (Option<i32>, String) {
    let mut child = command.stdout(Stdio::null()).stderr(Stdio::piped()).spawn().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = std::io::Read::read_to_string(&mut stderr, &mut text);
        text
    });
    let deadline = Instant::now() + super::PATIENCE;
    let code = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status.code();
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    (code, reader.join().unwrap())
}

/// SIGTERM, then the exit code.
pub fn terminate(child: &mut Child) -> i32 {
    signal(child, "TERM");
    wait_exit(child, super::PATIENCE)
}

/// Polls until `check` holds; panics with `what` after `limit`.
pub fn eventually_within(limit: Duration, what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A successor (B75), which is no child of the test: killed when dropped,
/// so a failed test leaves no router behind.
pub struct SuccessorGuard(pub u32);

impl Drop for SuccessorGuard {
    fn drop(&mut self) {
        let _ = Command::new("kill").args(["-KILL", &self.0.to_string()]).status();
    }
}

/// The successor's pid, from the old router's log (which it shares).
pub fn successor_pid(router: &Spawned) -> SuccessorGuard {
    let mut pid = None;
    eventually_within(super::PATIENCE, "the successor serves", || {
        let log = router.log.lock();
        pid = log
            .iter()
            .find(|l| l.contains("handover: successor "))
            .map(|l| word_after(l, "successor ").parse().unwrap());
        pid.is_some()
    });
    SuccessorGuard(pid.unwrap())
}
