//! A planned restart, `SIGHUP`, over real gRPC (B75): the router starts its
//! successor on the same ports, the successor serves, the old router
//! finishes what it holds and exits 0. What the clients saw is the truth.
// The router's internals and the simulator: `--features testkit` (make test).
#![cfg(feature = "testkit")]

mod common;

use std::os::unix::net::UnixDatagram;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use atenet_router::ateapi::resume::Code;
use atenet_router::proto::external_processor::{ProcessingRequest, ProcessingResponse};
use atenet_router::tools::sim::{Answer, Sim};
use common::process::{
    eventually_within, router_args, signal, spawn_router, wait_exit, word_after, RouterProcess,
};
use common::*;
use futures::executor::block_on;

fn scripted_sim() -> Sim {
    let sim = empty_sim();
    sim.script("demo/a", vec![Answer::ok("10.0.0.1", false)]);
    sim
}

/// A free port for the router: a handover needs a fixed one, as Envoy's.
fn free_port() -> String {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port().to_string()
}

/// A successor, which is no child of this test: killed when dropped, so a
/// failed test leaves no router behind.
struct SuccessorGuard(u32);

impl Drop for SuccessorGuard {
    fn drop(&mut self) {
        let _ = std::process::Command::new("kill").args(["-KILL", &self.0.to_string()]).status();
    }
}

/// The successor's pid, from the old router's log (which it shares).
fn successor_pid(router: &RouterProcess) -> SuccessorGuard {
    let mut pid = None;
    eventually_within(PATIENCE, "the successor serves", || {
        let log = router.process.log.lock();
        pid = log
            .iter()
            .find(|l| l.contains("handover: successor "))
            .map(|l| word_after(l, "successor ").parse().unwrap());
        pid.is_some()
    });
    SuccessorGuard(pid.unwrap())
}

/// One exchange; `None` when the stream was cancelled before any reply.
fn try_exchange(client: &Envoy, request: ProcessingRequest) -> Option<ProcessingResponse> {
    use futures::{SinkExt, StreamExt};
    block_on(async {
        let mut stream = client.open();
        stream.tx.send((request, grpcio::WriteFlags::default())).await.ok()?;
        let reply = stream.rx.next().await?.ok()?;
        stream.tx.cancel();
        Some(reply)
    })
}

#[test]
fn b75_sighup_hands_over_with_no_failed_request() {
    let sim = scripted_sim();
    let (port, metrics) = (free_port(), format!("127.0.0.1:{}", free_port()));
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
                    let reply = match try_exchange(&client, request.clone()) {
                        Some(reply) => reply,
                        None => try_exchange(&Envoy::connect(addr), request.clone())
                            .expect("the retry is answered"),
                    };
                    verdicts.push(reply);
                }
                verdicts
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    signal(&router.process.child, "HUP");
    let successor = successor_pid(&router);
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

#[test]
fn b75_a_successor_that_fails_leaves_the_router_serving() {
    let sim = scripted_sim();
    let dir = std::env::temp_dir().join(format!("atenet-handover-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let binary = dir.join("atenet-router");
    std::fs::copy(common::process::ROUTER_BIN, &binary).unwrap();
    let port = free_port();
    let args = router_args(&sim.addr().to_string(), &["--port-extproc", &port]);
    let mut router =
        RouterProcess::from(common::process::spawn_until(binary.to_str().unwrap(), &args, "serving"));
    // The binary on disk is now one that fails at once.
    std::fs::remove_file(&binary).unwrap();
    std::fs::write(&binary, "#!/bin/sh\nexit 1\n").unwrap();
    std::fs::set_permissions(&binary, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
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
    let port = free_port();
    let args = router_args(&sim.addr().to_string(), &["--port-extproc", &port]);
    let mut child = std::process::Command::new(common::process::ROUTER_BIN)
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
