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

/// One of two processes [`start_together`] started: its stderr read line
/// by line as it comes. Killed when dropped, so a failed test leaves no
/// process behind.
pub struct Racer {
    pub child: Child,
    pub log: Arc<Mutex<Vec<String>>>,
    reader: Option<std::thread::JoinHandle<()>>,
}

/// What a [`Racer`] came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Came {
    /// It said `marker` and runs.
    Serving,
    /// It exited with this status, having said this.
    Exited(i32, String),
}

impl Racer {
    /// Waits until it has said `marker` or exited, at most `limit`.
    pub fn came_to(&mut self, marker: &str, limit: Duration) -> Came {
        let deadline = Instant::now() + limit;
        loop {
            if self.log.lock().iter().any(|l| l.contains(marker)) {
                return Came::Serving;
            }
            if let Some(status) = self.child.try_wait().unwrap() {
                // Everything it wrote, read to the end.
                let _ = self.reader.take().map(std::thread::JoinHandle::join);
                if self.log.lock().iter().any(|l| l.contains(marker)) {
                    return Came::Serving;
                }
                return Came::Exited(status.code().unwrap_or(-1), self.log.lock().join("\n"));
            }
            assert!(Instant::now() < deadline, "neither {marker:?} nor an exit within {limit:?}");
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

impl Drop for Racer {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("--- stderr of pid {} ---\n{}", self.child.id(), self.log.lock().join("\n"));
        }
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Starts two routers with `args` at the same instant (B75, B99) and reads
/// what each came to: the racers, which one serves (`None`: neither), and
/// what is wrong, if anything: neither served, both did, or the other did
/// not exit 1 saying `refusal`.
pub fn race_two(args: &[String], refusal: &str) -> ([Racer; 2], Option<usize>, Option<String>) {
    let mut racers = start_together(ROUTER_BIN, [args, args]);
    let came: Vec<Came> =
        racers.iter_mut().map(|r| r.came_to("serving: ext_proc on", super::PATIENCE)).collect();
    let Some(winner) = came.iter().position(|c| *c == Came::Serving) else {
        return (racers, None, Some(format!("none served: {came:?}")));
    };
    let wrong = match &came[1 - winner] {
        Came::Serving => Some("both served".to_string()),
        Came::Exited(1, said) if said.contains(refusal) => None,
        other => Some(format!("the second {other:?}")),
    };
    (racers, Some(winner), wrong)
}

/// Starts `program` twice, with `args[0]` and with `args[1]`, at the same
/// instant: each child is forked and held just before its exec, and both
/// are let go by one write, so that neither has a head start of more than
/// the scheduler's (two operators starting a router at once).
pub fn start_together(program: &str, args: [&[String]; 2]) -> [Racer; 2] {
    use std::os::unix::process::CommandExt;
    let pipe = || {
        let mut fds = [-1; 2];
        // SAFETY: pipe2 writes two descriptors into `fds`.
        assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
        fds
    };
    // `forked`: each child says it is about to exec; `gate`: the byte
    // each child waits for.
    let ([forked_r, forked_w], [gate_r, gate_w]) = (pipe(), pipe());
    let spawners: Vec<_> = args
        .iter()
        .map(|args| {
            let mut command = Command::new(program);
            command.args(args.iter()).stderr(Stdio::piped()).stdout(Stdio::null());
            // SAFETY: between fork and exec the closure calls only write
            // and read, which are async-signal-safe; both pipes are
            // close-on-exec, so the router execs without them.
            unsafe {
                command.pre_exec(move || {
                    let mut byte = 0u8;
                    if libc::write(forked_w, (&byte as *const u8).cast(), 1) != 1
                        || libc::read(gate_r, (&mut byte as *mut u8).cast(), 1) != 1
                    {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
            // spawn() returns once the child has exec'd: on a thread of its own.
            std::thread::spawn(move || command.spawn().expect("spawn"))
        })
        .collect();
    let mut forked = 0;
    let deadline = Instant::now() + super::PATIENCE;
    while forked < 2 {
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(!left.is_zero(), "both children forked within {:?}", super::PATIENCE);
        let mut fd = libc::pollfd { fd: forked_r, events: libc::POLLIN, revents: 0 };
        // SAFETY: poll reads and writes one pollfd.
        if unsafe { libc::poll(&mut fd, 1, left.as_millis() as libc::c_int) } == 1 {
            let mut bytes = [0u8; 2];
            // SAFETY: read writes at most two bytes into `bytes`.
            let n = unsafe { libc::read(forked_r, bytes.as_mut_ptr().cast(), 2 - forked) };
            assert!(n > 0, "reading the forked pipe");
            forked += n as usize;
        }
    }
    // SAFETY: write reads two bytes from a valid buffer.
    assert_eq!(unsafe { libc::write(gate_w, [0u8; 2].as_ptr().cast(), 2) }, 2, "both let go");
    for fd in [forked_r, forked_w, gate_r, gate_w] {
        // SAFETY: each is this process's own descriptor, closed once.
        unsafe { libc::close(fd) };
    }
    let racers: Vec<Racer> = spawners
        .into_iter()
        .map(|spawner| {
            let mut child = spawner.join().unwrap();
            let stderr = BufReader::new(child.stderr.take().unwrap());
            let log = Arc::new(Mutex::new(Vec::new()));
            let sink = Arc::clone(&log);
            let reader = std::thread::spawn(move || {
                stderr.lines().map_while(Result::ok).for_each(|l| sink.lock().push(l))
            });
            Racer { child, log, reader: Some(reader) }
        })
        .collect();
    racers.try_into().unwrap_or_else(|_| unreachable!("two racers"))
}
