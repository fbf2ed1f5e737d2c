//! The panic policy on the real binary (B59): a panic nobody foresaw ends
//! the process at once, logged at error level, instead of leaving a
//! half-dead router that still answers `/healthz`.
//!
//! The fault exists only in a test build (`--features fault-injection`,
//! which `make test` sets): a request for `fault-injection/panic` panics on
//! the completion-queue thread that handles it.
#![cfg(all(feature = "testkit", feature = "fault-injection"))]

use crate::common;

use std::time::{Duration, Instant};

use atenet_router::tools::sim::Answer;
use common::process::{router_args, spawn_router, wait_exit};
use common::{headers_request, http_get, Envoy, PATIENCE};

#[test]
fn b59_a_panic_on_a_completion_queue_thread_ends_the_process() {
    let sim = common::empty_sim();
    sim.script("demo/a", vec![Answer::ok("10.0.0.1", false)]);
    let mut router = spawn_router(&router_args(&sim.addr().to_string(), &[]));
    let envoy = Envoy::connect(router.extproc);
    assert!(envoy.route_now("demo/a").has_request_headers(), "serving before the fault");
    assert_eq!(http_get(router.metrics, "/healthz").0, 200);

    let started = Instant::now();
    let crashing = envoy.clone();
    // The faulting request never gets a verdict; its stream fails when the
    // process goes.
    std::thread::spawn(move || {
        let mut stream = crashing.open();
        futures::executor::block_on(async {
            stream.send(headers_request(&[("ate-target-actor", "fault-injection/panic")])).await;
            let _ = futures::StreamExt::next(&mut stream.rx).await;
        });
    });
    let code = wait_exit(&mut router.process.child, PATIENCE);
    assert_ne!(code, 0, "a panic exits non-zero");
    assert!(started.elapsed() < Duration::from_secs(10), "at once, not after a drain");
    eventually_log(&router.process.log, "ERROR panic on thread");
    let log = router.process.log.lock().join("\n");
    assert!(log.contains("injected fault: a request for fault-injection/panic"), "{log}");
    assert!(log.contains("atenet-grpc"), "names the completion-queue thread: {log}");
    assert!(std::net::TcpStream::connect(router.metrics).is_err(), "no half-dead process answers /healthz");
}

fn eventually_log(log: &parking_lot::Mutex<Vec<String>>, needle: &str) {
    let deadline = Instant::now() + PATIENCE;
    while !log.lock().iter().any(|l| l.contains(needle)) {
        assert!(Instant::now() < deadline, "no log line with {needle:?}: {:#?}", log.lock());
        std::thread::sleep(Duration::from_millis(20));
    }
}
