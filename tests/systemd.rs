//! The router under systemd, faked: the notify protocol against a datagram
//! socket of the test's own (B64), and journald's stream detection (B63).
// The router's internals and the simulator: `--features testkit` (make test).
#![cfg(feature = "testkit")]

use crate::common;

use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpStream};
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::net::UnixDatagram;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use atenet_router::tools::sim::Sim;
use common::process::{router_args, signal, wait_exit, ROUTER_BIN};
use common::{free_port, PATIENCE};

fn scripted_sim() -> Sim {
    common::empty_sim()
}

fn receive(socket: &UnixDatagram) -> String {
    let mut buf = [0u8; 4096];
    let n = socket.recv(&mut buf).expect("a notification within the patience");
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

fn accepts(addr: SocketAddr) -> bool {
    TcpStream::connect_timeout(&addr, Duration::from_secs(1)).is_ok()
}

#[test]
fn b64_ready_only_once_every_port_accepts_and_stopping_with_a_timeout_extension_on_sigterm() {
    let sim = scripted_sim();
    let dir = std::env::temp_dir().join(format!("atenet-notify-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("notify.sock");
    let socket = UnixDatagram::bind(&path).unwrap();
    socket.set_read_timeout(Some(PATIENCE)).unwrap();
    let (extproc, metrics, status) = (free_port(), free_port(), free_port());
    let ports = [extproc, metrics, status].map(|p| SocketAddr::from(([127, 0, 0, 1], p)));
    let args = router_args(
        &sim.addr().to_string(),
        &[
            "--port-extproc",
            &extproc.to_string(),
            "--metrics-listen-addr",
            &format!("127.0.0.1:{metrics}"),
            "--status-port",
            &status.to_string(),
            "--drain-delay",
            "2s",
        ],
    );
    let mut child = Command::new(ROUTER_BIN)
        .args(&args)
        .env("NOTIFY_SOCKET", &path)
        .stderr(Stdio::null())
        .spawn()
        .unwrap();

    let ready = receive(&socket);
    // The moment READY=1 is read, every port must already accept.
    let accepting: Vec<bool> = ports.iter().map(|a| accepts(*a)).collect();
    assert!(ready.lines().any(|l| l == "READY=1"), "{ready:?}");
    assert!(ready.contains(&format!("MAINPID={}", child.id())), "{ready:?}");
    assert_eq!(accepting, [true, true, true], "ext_proc, metrics and status accept once READY=1 is sent");

    signal(&child, "TERM");
    let stopping = receive(&socket);
    assert!(stopping.lines().any(|l| l == "STOPPING=1"), "{stopping:?}");
    let extension = |message: &str| -> Option<u64> {
        message.lines().find_map(|l| l.strip_prefix("EXTEND_TIMEOUT_USEC=")).map(|v| v.parse().unwrap())
    };
    let first = extension(&stopping).expect("the stop timeout is extended when the drain starts");
    // Drain delay 2 s, no Envoy, drain timeout 35 s, slack: the bound covers
    // the whole drain.
    assert!(first >= 37_000_000, "{first} µs");
    let next = extension(&receive(&socket)).expect("extended again before the next step");
    assert!(next < first, "what is left shrinks: {next} after {first}");
    assert_eq!(wait_exit(&mut child, PATIENCE), 0);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn b64_an_abstract_notify_socket_works_too() {
    let sim = scripted_sim();
    let name = format!("atenet-notify-test-{}", std::process::id());
    let addr = <std::os::unix::net::SocketAddr as std::os::linux::net::SocketAddrExt>::from_abstract_name(
        name.as_bytes(),
    )
    .unwrap();
    let socket = UnixDatagram::bind_addr(&addr).unwrap();
    socket.set_read_timeout(Some(PATIENCE)).unwrap();
    let mut child = Command::new(ROUTER_BIN)
        .args(router_args(&sim.addr().to_string(), &[]))
        .env("NOTIFY_SOCKET", format!("@{name}"))
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    assert!(receive(&socket).lines().any(|l| l == "READY=1"));
    signal(&child, "TERM");
    assert!(receive(&socket).contains("STOPPING=1"));
    assert_eq!(wait_exit(&mut child, PATIENCE), 0);
}

/// Runs the router with its stderr on a pipe the test made, and returns the
/// lines it wrote up to its "serving" line, with `journal` as JOURNAL_STREAM
/// (`None`: the pipe's own device and inode, as systemd would set it).
fn first_lines(journal: Option<&str>) -> Vec<String> {
    let sim = scripted_sim();
    let mut fds = [0; 2];
    // SAFETY: pipe(2) fills two descriptors this test then owns.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    // SAFETY: both descriptors are fresh and owned here.
    let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    let mut stat = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: fstat on a valid descriptor writes one stat struct.
    assert_eq!(unsafe { libc::fstat(fds[1], stat.as_mut_ptr()) }, 0);
    // SAFETY: initialised by the successful fstat.
    let stat = unsafe { stat.assume_init() };
    let stream = journal.map_or_else(|| format!("{}:{}", stat.st_dev, stat.st_ino), str::to_string);
    let mut child = Command::new(ROUTER_BIN)
        .args(router_args(&sim.addr().to_string(), &["--log-level", "debug"]))
        .env("JOURNAL_STREAM", stream)
        .stderr(Stdio::from(write))
        .spawn()
        .unwrap();
    let mut lines = Vec::new();
    for line in BufReader::new(std::fs::File::from(read)).lines().map_while(Result::ok) {
        let serving = line.contains("serving");
        lines.push(line);
        if serving {
            break;
        }
    }
    signal(&child, "TERM");
    assert_eq!(wait_exit(&mut child, PATIENCE), 0);
    lines
}

#[test]
fn b63_under_journald_each_line_carries_its_syslog_priority() {
    let started = Instant::now();
    let lines = first_lines(None);
    assert!(lines.last().unwrap().starts_with("<6>INFO atenet-router "), "{lines:#?}");
    assert!(lines.iter().all(|l| l.starts_with('<')), "every line has a priority: {lines:#?}");
    assert!(lines.iter().any(|l| l.starts_with("<7>DEBUG ")), "debug at <7>: {lines:#?}");
    // A JOURNAL_STREAM that names another stream (stderr redirected after
    // systemd set it) is not taken at its word.
    let lines = first_lines(Some("1:1"));
    assert!(lines.last().unwrap().contains(" INFO atenet-router "), "{lines:#?}");
    assert!(!lines.last().unwrap().starts_with('<'), "{lines:#?}");
    assert!(started.elapsed() < PATIENCE * 2);
}
