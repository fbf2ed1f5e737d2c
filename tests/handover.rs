//! A planned restart, `SIGHUP`, over real gRPC (B75): the router starts its
//! successor on the same ports, the successor serves, the old router
//! finishes what it holds and exits 0. What the clients saw is the truth.
// The router's internals and the simulator: `--features testkit` (make test).
#![cfg(feature = "testkit")]

use crate::common;

use std::os::unix::net::UnixDatagram;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use atenet_router::actor::resume::Code;
use atenet_router::proto::external_processor::ProcessingResponse;
use atenet_router::tools::sim::{Answer, Sim};
use common::process::{
    eventually_within, install_executable, install_script, race_two, router_args, signal, spawn_router,
    successor_pid, terminate, wait_exit, word_after, RouterProcess, SuccessorGuard, ROUTER_BIN,
};
use common::*;
use futures::executor::block_on;

fn scripted_sim() -> Sim {
    let sim = empty_sim();
    sim.script("demo/a", vec![Answer::ok("10.0.0.1", false)]);
    sim
}

#[test]
fn b75_sighup_hands_over_with_no_failed_request() {
    let sim = scripted_sim();
    let (port, metrics) = (free_port().to_string(), format!("127.0.0.1:{}", free_port()));
    let mut router = spawn_router(&router_args(
        &sim.addr().to_string(),
        &[
            "--port-extproc",
            &port,
            "--metrics-listen-addr",
            &metrics,
            "--parked-request-retry-interval",
            "10ms",
        ],
    ));
    // A request parked across the handover: its actor is resumed only later.
    sim.script("demo/parked", vec![Answer::error(Code::ResourceExhausted, "no free workers available")]);
    let envoy = Envoy::connect(router.extproc);
    let parked = {
        let envoy = envoy.clone();
        std::thread::spawn(move || envoy.route_now("demo/parked"))
    };
    eventually_within(PATIENCE, "one request parked", || {
        Metrics(http_get(router.metrics, "/metrics").1).value("atenet_router_parking_active", &[]) == 1.0
    });
    // Continuous load on one connection (as Envoy keeps one) and on fresh ones.
    let stop = Arc::new(AtomicBool::new(false));
    let load: Vec<_> = [false, true]
        .into_iter()
        .map(|fresh| {
            let (stop, addr, kept) = (Arc::clone(&stop), router.extproc, envoy.clone());
            std::thread::spawn(move || {
                let mut verdicts = Vec::new();
                let request = headers_request(&[("ate-target-actor", "demo/a")]);
                while !stop.load(Ordering::Acquire) {
                    let client = if fresh { Envoy::connect(addr) } else { kept.clone() };
                    // A stream that reached the old router after its shutdown
                    // began is cancelled before any reply; Envoy retries it
                    // (retry_on cancelled, B67) on a new connection, which
                    // reaches the successor: so does this client, once.
                    let reply = match client.try_exchange(request.clone()) {
                        Some(reply) => reply,
                        None => {
                            Envoy::connect(addr).try_exchange(request.clone()).expect("the retry is answered")
                        }
                    };
                    verdicts.push(reply);
                }
                verdicts
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    signal(&router.process.child, "HUP");
    let successor = successor_pid(&router.process);
    sim.script("demo/parked", vec![Answer::ok("10.0.0.2", true)]);
    assert_eq!(wait_exit(&mut router.process.child, PATIENCE), 0, "the old router exits 0");
    std::thread::sleep(Duration::from_millis(300));
    stop.store(true, Ordering::Release);
    let verdicts: Vec<_> = load.into_iter().flat_map(|t| t.join().unwrap()).collect();
    let answered = verdicts.iter().filter(|r| r.has_request_headers()).count();
    assert_eq!(answered, verdicts.len(), "every request before, during and after the handover routed");
    assert!(verdicts.len() > 20, "load ran through the handover: {}", verdicts.len());
    assert_eq!(routed(&parked.join().unwrap()).1, "10.0.0.2:443", "the parked request's normal verdict");
    // The successor serves the same ports.
    assert_eq!(routed(&Envoy::connect(router.extproc).route_now("demo/a")).1, "10.0.0.1:443");
    assert_eq!(http_get(router.metrics, "/readyz").0, 200);
    let log = router.process.log.lock().join("\n");
    assert!(log.contains("handover complete: every stream finished"), "{log}");
    drop(successor);
}

/// B75: of two routers started at the same instant on one port, exactly
/// one serves and the other exits 1 as for a port held. Before, the check
/// of the port and the bind (with SO_REUSEPORT, which a successor needs)
/// were two steps, and both routers served in 9-15 of the 20 pairs of each
/// run (50 of 80); the pairs are many so that the old code fails every run.
#[test]
fn b75_of_two_routers_started_at_once_on_one_port_one_serves_and_the_other_exits_1() {
    let sim = scripted_sim();
    let pairs = 20;
    let mut wrong = Vec::new();
    for pair in 1..=pairs {
        let port = free_port();
        let args = router_args(&sim.addr().to_string(), &["--port-extproc", &port.to_string()]);
        let refusal = format!("cannot listen for ext_proc on 127.0.0.1:{port}: Address already in use");
        let (mut racers, winner, why) = race_two(&args, &refusal);
        wrong.extend(why.map(|why| format!("pair {pair}: {why}")));
        let Some(winner) = winner else { continue };
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
        assert_eq!(
            routed(&Envoy::connect(addr).route_now("demo/a")).1,
            "10.0.0.1:443",
            "pair {pair}: served"
        );
        assert_eq!(terminate(&mut racers[winner].child), 0);
    }
    eprintln!("{} of {pairs} pairs wrong: {wrong:#?}", wrong.len());
    assert!(wrong.is_empty(), "{} of {pairs} pairs wrong: {wrong:#?}", wrong.len());
}

#[test]
fn b75_a_successor_that_fails_leaves_the_router_serving() {
    let sim = scripted_sim();
    let dir = std::env::temp_dir().join(format!("atenet-handover-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let binary = dir.join("atenet-router");
    install_executable(ROUTER_BIN.as_ref(), &binary);
    let port = free_port().to_string();
    let args = router_args(&sim.addr().to_string(), &["--port-extproc", &port]);
    let mut router =
        RouterProcess::from(common::process::spawn_until(binary.to_str().unwrap(), &args, "serving"));
    // The binary on disk is now one that fails at once.
    install_script("#!/bin/sh\nexit 1\n", &binary);
    signal(&router.process.child, "HUP");
    eventually_within(PATIENCE, "the refusal logged", || {
        router.process.log.lock().iter().any(|l| l.contains("handover refused"))
    });
    let log = router.process.log.lock().join("\n");
    assert!(
        log.contains("the successor exited (exit status: 1) before it served; this router serves on"),
        "{log}"
    );
    assert_eq!(
        routed(&Envoy::connect(router.extproc).route_now("demo/a")).1,
        "10.0.0.1:443",
        "still serving"
    );
    assert_eq!(http_get(router.metrics, "/readyz").0, 200);
    signal(&router.process.child, "TERM");
    assert_eq!(wait_exit(&mut router.process.child, PATIENCE), 0);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn b75_under_systemd_the_successor_becomes_the_main_process() {
    let sim = scripted_sim();
    let path = std::env::temp_dir().join(format!("atenet-handover-notify-{}.sock", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let socket = UnixDatagram::bind(&path).unwrap();
    socket.set_read_timeout(Some(PATIENCE)).unwrap();
    let receive = || {
        let mut buf = [0u8; 4096];
        let n = socket.recv(&mut buf).expect("a notification within the patience");
        String::from_utf8_lossy(&buf[..n]).into_owned()
    };
    let port = free_port().to_string();
    let args = router_args(&sim.addr().to_string(), &["--port-extproc", &port]);
    let mut child = std::process::Command::new(ROUTER_BIN)
        .args(&args)
        .env("NOTIFY_SOCKET", &path)
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let first = receive();
    assert!(first.contains(&format!("MAINPID={}", child.id())) && first.contains("READY=1"), "{first:?}");
    signal(&child, "HUP");
    let handed = receive();
    let pid: u32 = handed.lines().find_map(|l| l.strip_prefix("MAINPID=")).expect("MAINPID").parse().unwrap();
    let _successor = SuccessorGuard(pid);
    assert_ne!(pid, child.id(), "the successor names itself the main process: {handed:?}");
    assert!(handed.lines().any(|l| l == "READY=1"), "{handed:?}");
    assert_eq!(wait_exit(&mut child, PATIENCE), 0, "the old router exits 0");
    let _ = std::fs::remove_file(&path);
}

/// B101: a hand-over is not held by a connection without streams whose
/// peer never answers gRPC's GOAWAY (found in CI: the old router waited out
/// gRPC core's 20 s for the GOAWAY's ping on a client connection nobody
/// polled any more). What the mute client saw is the truth.
#[test]
fn b101_a_mute_connection_does_not_hold_a_handover() {
    let sim = scripted_sim();
    let port = free_port().to_string();
    let mut router = spawn_router(&router_args(
        &sim.addr().to_string(),
        &["--port-extproc", &port, "--drain-timeout", "1h"],
    ));
    let mut mute = mute_http2_connection(router.extproc);
    signal(&router.process.child, "HUP");
    let successor = successor_pid(&router.process);
    let served = std::time::Instant::now();
    assert!(closed_by_peer(&mut mute), "the old router closed the mute connection");
    let closed_after = served.elapsed();
    assert_eq!(wait_exit(&mut router.process.child, PATIENCE), 0, "the old router exits 0");
    assert!(
        closed_after < GRPC_GOAWAY_PING_TIMEOUT / 2,
        "closed {closed_after:?} after the successor served"
    );
    eventually_within(PATIENCE, "the last line", || lines_with(&router, "handover complete") == 1);
    let log = router.process.log.lock().join("\n");
    assert!(log.contains("handover complete: every stream finished"), "{log}");
    assert_eq!(
        routed(&Envoy::connect(router.extproc).route_now("demo/a")).1,
        "10.0.0.1:443",
        "the successor serves"
    );
    drop(successor);
}

/// A copy of the router binary in a directory of its own, which a test may
/// replace (a handover starts the binary at the path it was started from).
struct Binary {
    dir: std::path::PathBuf,
    path: std::path::PathBuf,
}

impl Binary {
    fn copy(name: &str) -> Binary {
        let dir = std::env::temp_dir().join(format!("atenet-handover-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("atenet-router");
        install_executable(ROUTER_BIN.as_ref(), &path);
        Binary { dir, path }
    }

    /// Replaces the binary on disk with a shell script; `{dir}` in it names
    /// this binary's directory.
    fn replace_with_script(&self, script: &str) {
        install_script(&script.replace("{dir}", self.dir.to_str().unwrap()), &self.path);
    }

    fn file(&self, name: &str) -> std::path::PathBuf {
        self.dir.join(name)
    }
}

impl Drop for Binary {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The pids a script wrote to `file`, one a line (none before it exists).
fn pids_in(file: &std::path::Path) -> Vec<u32> {
    std::fs::read_to_string(file).unwrap_or_default().lines().filter_map(|l| l.trim().parse().ok()).collect()
}

/// Whether `pid` runs (a zombie has finished: it only waits to be reaped).
fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat.rsplit_once(") ").is_some_and(|(_, rest)| !rest.starts_with('Z')),
        Err(_) => false,
    }
}

/// Open descriptors and threads of `pid`.
fn fds_and_threads(pid: u32) -> (usize, usize) {
    let count = |what| std::fs::read_dir(format!("/proc/{pid}/{what}")).unwrap().count();
    (count("fd"), count("task"))
}

fn lines_with(router: &RouterProcess, what: &str) -> usize {
    router.process.log.lock().iter().filter(|l| l.contains(what)).count()
}

/// Kills a process group started by a handover (a successor is the leader
/// of a group of its own, B94), when dropped.
struct GroupGuard(u32);

impl Drop for GroupGuard {
    fn drop(&mut self) {
        let _ = std::process::Command::new("kill").args(["-KILL", "--", &format!("-{}", self.0)]).status();
        let _ = std::process::Command::new("kill").args(["-KILL", &self.0.to_string()]).status();
    }
}

/// Held requests, each `Some(reply)`, or `None` when its stream ended
/// without one (cut).
fn hold(
    envoy: &Envoy,
    actor: &'static str,
    n: usize,
) -> std::thread::JoinHandle<Vec<Option<ProcessingResponse>>> {
    let envoy = envoy.clone();
    std::thread::spawn(move || {
        block_on(futures::future::join_all((0..n).map(|_| async {
            use futures::{SinkExt, StreamExt};
            let mut stream = envoy.open();
            let request = headers_request(&[("ate-target-actor", actor)]);
            stream.tx.send((request, grpcio::WriteFlags::default())).await.ok()?;
            let reply = stream.rx.next().await?.ok();
            stream.tx.cancel();
            reply
        })))
    })
}

/// B94: SIGHUPs that arrive while a handover runs, one while the successor
/// starts and one while the old router finishes its streams, are logged
/// and ignored: they neither cut the streams it holds nor start another
/// successor.
#[test]
fn b94_sighups_during_a_handover_are_ignored() {
    let sim = scripted_sim();
    let port = free_port().to_string();
    let mut router = spawn_router(&router_args(
        &sim.addr().to_string(),
        &[
            "--port-extproc",
            &port,
            "--parked-request-retry-interval",
            "10ms",
            "--parked-request-budget",
            "60s",
        ],
    ));
    sim.script("demo/held", vec![Answer::error(Code::ResourceExhausted, "no free workers available")]);
    let envoy = Envoy::connect(router.extproc);
    let held = hold(&envoy, "demo/held", 10);
    eventually_within(PATIENCE, "ten parked", || {
        Metrics(http_get(router.metrics, "/metrics").1).value("atenet_router_parking_active", &[]) == 10.0
    });
    signal(&router.process.child, "HUP");
    eventually_within(PATIENCE, "the successor starting", || lines_with(&router, "handover: starting") == 1);
    signal(&router.process.child, "HUP");
    let successor = successor_pid(&router.process);
    let _group = GroupGuard(successor.0);
    signal(&router.process.child, "HUP");
    // Both logged before the held requests are let go, so that the last
    // HUP reaches a router that still finishes its streams.
    let deadline = std::time::Instant::now() + PATIENCE;
    while lines_with(&router, "SIGHUP ignored") < 2 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    sim.script("demo/held", vec![Answer::ok("10.0.0.2", true)]);
    let replies = held.join().unwrap();
    let routed = replies.iter().flatten().filter(|r| r.has_request_headers()).count();
    assert_eq!(routed, 10, "every held request got its verdict: {replies:?}");
    assert_eq!(wait_exit(&mut router.process.child, PATIENCE), 0, "the old router exits 0");
    eventually_within(PATIENCE, "the last line", || lines_with(&router, "handover complete") == 1);
    let log = router.process.log.lock().join("\n");
    assert!(log.contains("handover complete: every stream finished"), "{log}");
    assert_eq!(lines_with(&router, "handover: starting"), 1, "one successor only: {log}");
    assert_eq!(lines_with(&router, "SIGHUP ignored"), 2, "{log}");
}

/// The state letter of `pid` in /proc (`T` stopped, `Z` a zombie).
fn state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(") ")?.1.chars().next()
}

/// The processes whose parent is `pid`.
fn children_of(pid: u32) -> Vec<u32> {
    let entries = std::fs::read_dir("/proc").unwrap();
    let pids = entries.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok());
    pids.filter(|&p| {
        let stat = std::fs::read_to_string(format!("/proc/{p}/stat")).unwrap_or_default();
        stat.rsplit_once(") ").and_then(|(_, rest)| rest.split(' ').nth(1)) == Some(&pid.to_string())
    })
    .collect()
}

/// B105: a successor stopped (SIGSTOP) when its predecessor exits gets
/// SIGHUP and SIGCONT from the kernel (its process group is orphaned with
/// a member stopped). That SIGHUP is nobody's request for a hand-over: it
/// is logged and ignored, the successor serves on and starts no successor
/// of its own. Before, it started a second hand-over (3 of 3).
#[test]
fn b105_a_successor_stopped_when_its_predecessor_exits_does_not_hand_over_again() {
    let sim = scripted_sim();
    let port = free_port().to_string();
    let mut router = spawn_router(&router_args(
        &sim.addr().to_string(),
        &[
            "--port-extproc",
            &port,
            "--parked-request-retry-interval",
            "10ms",
            "--parked-request-budget",
            "60s",
        ],
    ));
    // A parked request keeps the old router until the successor is stopped.
    sim.script("demo/held", vec![Answer::error(Code::ResourceExhausted, "no free workers available")]);
    let held = hold(&Envoy::connect(router.extproc), "demo/held", 1);
    eventually_within(PATIENCE, "one parked", || {
        Metrics(http_get(router.metrics, "/metrics").1).value("atenet_router_parking_active", &[]) == 1.0
    });
    signal(&router.process.child, "HUP");
    let successor = successor_pid(&router.process);
    let _group = GroupGuard(successor.0);
    signal_pid(successor.0, "STOP");
    eventually_within(PATIENCE, "the successor stopped", || state(successor.0) == Some('T'));
    sim.script("demo/held", vec![Answer::ok("10.0.0.2", true)]);
    let replies = held.join().unwrap();
    assert!(replies.iter().flatten().all(|r| r.has_request_headers()) && replies[0].is_some(), "{replies:?}");
    assert_eq!(wait_exit(&mut router.process.child, PATIENCE), 0, "the old router exits 0");
    // The kernel's SIGHUP and SIGCONT: the successor runs again and says
    // what it made of the hangup (or, as before, hands over to a third).
    eventually_within(PATIENCE, "the successor's answer to the hangup", || {
        lines_with(&router, "SIGHUP ignored") + lines_with(&router, "handover: successor ") >= 2
    });
    let log = router.process.log.lock().join("\n");
    let _third: Vec<SuccessorGuard> = log
        .lines()
        .filter(|l| l.contains("handover: successor "))
        .map(|l| word_after(l, "successor ").parse().unwrap())
        .filter(|&pid| pid != successor.0)
        .map(SuccessorGuard)
        .collect();
    assert_eq!(lines_with(&router, "handover: starting"), 1, "no second hand-over: {log}");
    assert!(log.contains("SIGHUP ignored: the kernel sent it, not a process"), "{log}");
    eventually_within(PATIENCE, "the successor continued", || state(successor.0).is_some_and(|s| s != 'T'));
    assert_eq!(children_of(successor.0), Vec::<u32>::new(), "no third process");
    assert_eq!(
        routed(&Envoy::connect(router.extproc).route_now("demo/a")).1,
        "10.0.0.1:443",
        "the successor serves"
    );
    signal_pid(successor.0, "TERM");
    eventually_within(PATIENCE, "the successor drained and gone", || !alive(successor.0));
}

/// B94: a successor that forks, as a wrapper script without `exec` does,
/// and fails: each attempt is refused as soon as the script exits, and
/// leaves no descriptor and no thread in the old router and no process
/// behind (its whole process group is killed). A wrapper whose router
/// serves hands over as a direct successor does.
#[test]
fn b94_failed_attempts_leave_no_descriptor_thread_or_process_behind() {
    let sim = scripted_sim();
    let binary = Binary::copy("forks");
    let port = free_port().to_string();
    let args = router_args(&sim.addr().to_string(), &["--port-extproc", &port]);
    let mut router =
        RouterProcess::from(common::process::spawn_until(binary.path.to_str().unwrap(), &args, "serving"));
    let pid = router.process.child.id();
    // The orphan holds the pipe the successor was to say `ready` on.
    binary.replace_with_script("#!/bin/sh\nsleep 1000 &\necho $! >> {dir}/orphans\nexit 1\n");
    let mut baseline = None;
    let attempts = 4;
    for attempt in 1..=attempts {
        let started = std::time::Instant::now();
        signal(&router.process.child, "HUP");
        eventually_within(PATIENCE, "the refusal", || lines_with(&router, "handover refused") == attempt);
        eprintln!("attempt {attempt} refused after {:?}", started.elapsed());
        // The first attempt may start threads that stay (gRPC core's pools
        // grow lazily); every later one must add nothing.
        if attempt == 1 {
            baseline = Some(fds_and_threads(pid));
        }
    }
    let log = router.process.log.lock().join("\n");
    assert_eq!(
        lines_with(&router, "the successor exited (exit status: 1) before it served; this router serves on"),
        attempts,
        "{log}"
    );
    assert_eq!(fds_and_threads(pid), baseline.unwrap(), "descriptors and threads after {attempts} attempts");
    let orphans = pids_in(&binary.file("orphans"));
    assert_eq!(orphans.len(), attempts);
    eventually_within(PATIENCE, "every forked process gone", || !orphans.iter().any(|&p| alive(p)));
    assert_eq!(
        routed(&Envoy::connect(router.extproc).route_now("demo/a")).1,
        "10.0.0.1:443",
        "still serving"
    );

    // A wrapper without `exec` whose router serves.
    install_executable(ROUTER_BIN.as_ref(), &binary.file("real-router"));
    binary.replace_with_script("#!/bin/sh\n{dir}/real-router \"$@\"\n");
    signal(&router.process.child, "HUP");
    let successor = successor_pid(&router.process);
    let _group = GroupGuard(successor.0);
    assert_eq!(wait_exit(&mut router.process.child, PATIENCE), 0, "the old router exits 0");
    assert_eq!(routed(&Envoy::connect(router.extproc).route_now("demo/a")).1, "10.0.0.1:443");
}

/// B94: SIGTERM while a successor hangs in its start ends the start at once
/// (the successor's whole process group is killed) and drains as any
/// SIGTERM does: STOPPING=1 to systemd, Envoy's health check failed, exit 0.
/// Before, the signal waited for the successor's 30 s.
#[test]
fn b94_sigterm_while_a_successor_starts_ends_the_start_and_drains() {
    let sim = scripted_sim();
    let admin = common::admin::FakeAdmin::start(vec![0]);
    let binary = Binary::copy("hangs");
    let notify = binary.file("notify.sock");
    let socket = UnixDatagram::bind(&notify).unwrap();
    // Within the successor's 30 s: a router that waits them out fails here.
    socket.set_read_timeout(Some(PATIENCE)).unwrap();
    let port = free_port().to_string();
    let args = router_args(
        &sim.addr().to_string(),
        &["--port-extproc", &port, "--envoy-admin-address", &admin.addr],
    );
    let mut router = RouterProcess::from(common::process::spawn_until_with(
        binary.path.to_str().unwrap(),
        &args,
        &[("NOTIFY_SOCKET", notify.to_str().unwrap())],
        "serving",
    ));
    let receive = || {
        let mut buf = [0u8; 4096];
        let n = socket.recv(&mut buf).expect("a notification within the patience");
        String::from_utf8_lossy(&buf[..n]).into_owned()
    };
    assert!(receive().contains("READY=1"));
    // A wrapper that forks and never serves.
    binary.replace_with_script(
        "#!/bin/sh\necho $$ >> {dir}/started\nsleep 1000 &\necho $! >> {dir}/started\nwait\n",
    );
    signal(&router.process.child, "HUP");
    eventually_within(PATIENCE, "the successor and its child started", || {
        pids_in(&binary.file("started")).len() == 2
    });
    let started = pids_in(&binary.file("started"));
    let _group = GroupGuard(started[0]);
    signal(&router.process.child, "TERM");
    let stopping = receive();
    assert!(stopping.contains("STOPPING=1"), "{stopping:?}");
    assert_eq!(wait_exit(&mut router.process.child, PATIENCE), 0);
    assert!(admin.log.lock().contains(&"POST /healthcheck/fail".to_string()), "{:?}", admin.log.lock());
    eventually_within(PATIENCE, "the successor's group gone", || !started.iter().any(|&p| alive(p)));
    eventually_within(PATIENCE, "the last line", || lines_with(&router, "drain complete") == 1);
    let log = router.process.log.lock().join("\n");
    assert!(log.contains("handover refused: signal 15 received while the successor started"), "{log}");
}

/// What one probe connection saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Probe {
    /// The listener answered (an HTTP response, or gRPC's HTTP/2 settings).
    Answered,
    Refused,
    Reset,
    /// Closed without a byte of answer.
    ClosedSilently,
    Other,
}

/// One connection to `addr`: for the HTTP listener a `/healthz`, for
/// ext_proc an HTTP/2 preface and settings, to which gRPC answers with its
/// own settings.
fn probe(addr: std::net::SocketAddr, http: bool) -> Probe {
    use std::io::{ErrorKind, Read, Write};
    let sort = |e: std::io::Error| match e.kind() {
        ErrorKind::ConnectionRefused => Probe::Refused,
        ErrorKind::ConnectionReset | ErrorKind::BrokenPipe => Probe::Reset,
        _ => Probe::Other,
    };
    let mut stream = match std::net::TcpStream::connect(addr) {
        Ok(stream) => stream,
        Err(e) => return sort(e),
    };
    let _ = stream.set_read_timeout(Some(PATIENCE));
    let hello: &[u8] = if http {
        b"GET /healthz HTTP/1.1\r\nHost: probe\r\nConnection: close\r\n\r\n"
    } else {
        b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0"
    };
    if let Err(e) = stream.write_all(hello) {
        return sort(e);
    }
    let mut answer = [0u8; 16];
    let mut seen = 0;
    while seen < 9 {
        match stream.read(&mut answer[seen..]) {
            Ok(0) => break,
            Ok(n) => seen += n,
            Err(e) => return sort(e),
        }
    }
    match seen {
        0 => Probe::ClosedSilently,
        _ if !http || answer.starts_with(b"HTTP/1.1 200") => Probe::Answered,
        _ => Probe::Other,
    }
}

/// B95: connections that reach a router's ports while it hands over, to
/// the HTTP listener and to ext_proc, are all answered, by the old router
/// or by its successor: none is reset from an accept queue that closed
/// (measured before: 25 and 16 of about 140 k). Five chained handovers
/// under probes from eight threads; what the clients saw is the truth.
#[test]
fn b95_connections_queued_during_handovers_are_answered_never_reset() {
    let sim = scripted_sim();
    let (port, metrics) = (free_port().to_string(), format!("127.0.0.1:{}", free_port()));
    let mut router = spawn_router(&router_args(
        &sim.addr().to_string(),
        &["--port-extproc", &port, "--metrics-listen-addr", &metrics],
    ));
    let stop = Arc::new(AtomicBool::new(false));
    let probes: Vec<_> = (0..8)
        .map(|i| {
            let (stop, http) = (Arc::clone(&stop), i % 2 == 0);
            let addr = if http { router.metrics } else { router.extproc };
            std::thread::spawn(move || {
                let mut seen = std::collections::HashMap::<(&str, Probe), usize>::new();
                let port = if http { "http" } else { "ext_proc" };
                while !stop.load(Ordering::Acquire) {
                    let p = probe(addr, http);
                    if p != Probe::Answered {
                        eprintln!("probe of {port}: {p:?} at {:?}", std::time::SystemTime::now());
                    }
                    *seen.entry((port, p)).or_default() += 1;
                }
                seen
            })
        })
        .collect();
    let handovers = 5;
    let mut current = router.process.child.id();
    // Every router of the chain, killed at the end: a guard dropped early
    // would kill a router still finishing its handover.
    let mut guards = Vec::new();
    for n in 1..=handovers {
        std::thread::sleep(Duration::from_millis(200));
        signal_pid(current, "HUP");
        let mut next = None;
        eventually_within(PATIENCE, "the successor serves", || {
            let log = router.process.log.lock();
            let successors: Vec<u32> = log
                .iter()
                .filter(|l| l.contains("handover: successor "))
                .map(|l| word_after(l, "successor ").parse().unwrap())
                .collect();
            next = successors.get(n - 1).copied();
            next.is_some()
        });
        let next = next.unwrap();
        guards.push(SuccessorGuard(next));
        if n == 1 {
            assert_eq!(wait_exit(&mut router.process.child, PATIENCE), 0, "the first router exits 0");
        } else {
            eventually_within(PATIENCE, "the old router gone", || !alive(current));
        }
        current = next;
    }
    std::thread::sleep(Duration::from_millis(200));
    stop.store(true, Ordering::Release);
    let mut seen = std::collections::HashMap::<(&str, Probe), usize>::new();
    for t in probes {
        for (what, count) in t.join().unwrap() {
            *seen.entry(what).or_default() += count;
        }
    }
    eprintln!("probes over {handovers} handovers: {seen:?}");
    for port in ["http", "ext_proc"] {
        let answered = seen.remove(&(port, Probe::Answered)).unwrap_or(0);
        assert!(answered > 500, "the {port} probes ran: {answered}");
    }
    assert!(seen.is_empty(), "every probe answered, none reset or refused: {seen:?}");
    let log = router.process.log.lock().join("\n");
    assert_eq!(log.matches("handover complete: every stream finished").count(), handovers, "{log}");
    drop(guards);
}

fn signal_pid(pid: u32, name: &str) {
    let status = std::process::Command::new("kill").args([&format!("-{name}"), &pid.to_string()]).status();
    assert!(status.unwrap().success(), "kill -{name} {pid}");
}
