//! What the router logs, read from the real binary's stderr.
// The router's internals and the simulator: `--features testkit` (make test).
#![cfg(feature = "testkit")]

use crate::common;

use std::time::{Duration, Instant};

use atenet_router::actor::resume::Code;
use atenet_router::tools::sim::{Answer, Sim};
use common::process::{router_args, spawn_router, terminate, RouterProcess};
use common::{immediate, Envoy, PATIENCE};
use futures::executor::block_on;
use futures::future::join_all;

fn scripted_sim() -> Sim {
    common::empty_sim()
}

fn lines_with(router: &RouterProcess, needle: &str) -> Vec<String> {
    router.process.log.lock().iter().filter(|l| l.contains(needle)).cloned().collect()
}

fn wait_for_line(router: &RouterProcess, needle: &str) {
    let deadline = Instant::now() + PATIENCE;
    while lines_with(router, needle).is_empty() {
        assert!(Instant::now() < deadline, "no log line with {needle:?}: {:#?}", router.process.log.lock());
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn b62_request_path_failures_are_logged_with_a_rate_limit_and_the_bad_worker_ip() {
    let sim = scripted_sim();
    sim.script("demo/noip", vec![Answer::ok("not-an-ip", true)]);
    sim.script("demo/broken", vec![Answer::error(Code::Internal, "database on fire")]);
    let router = spawn_router(&router_args(&sim.addr().to_string(), &[]));
    let envoy = Envoy::connect(router.extproc);
    // An incident: 200 requests fail each way, well within one interval.
    let replies =
        block_on(join_all((0..200).flat_map(|_| [envoy.route("demo/noip"), envoy.route("demo/broken")])));
    assert!(replies.iter().all(|r| immediate(r).status == 500));
    wait_for_line(&router, "routing failed");
    wait_for_line(&router, "error resuming actor demo/broken");
    let routing = lines_with(&router, "routing failed");
    assert_eq!(routing.len(), 1, "one line for 200 failures: {routing:#?}");
    assert!(
        routing[0].contains("WARN") && routing[0].contains("worker_ip=not-an-ip"),
        "names the bad IP: {routing:?}"
    );
    let errors = lines_with(&router, "error resuming actor");
    assert_eq!(errors.len(), 1, "{errors:#?}");
    assert!(errors[0].contains("database on fire"), "{errors:?}");
    // After the interval, the next failure is logged with what was left out.
    std::thread::sleep(atenet_router::envoy::extproc::ERROR_LOG_INTERVAL);
    let _ = envoy.route_now("demo/noip");
    let deadline = Instant::now() + PATIENCE;
    while lines_with(&router, "routing failed").len() < 2 {
        assert!(Instant::now() < deadline, "the next interval's line");
        std::thread::sleep(Duration::from_millis(20));
    }
    let routing = lines_with(&router, "routing failed");
    assert!(routing[1].contains("suppressed=199"), "says what it left out: {routing:#?}");
    let mut router = router;
    assert_eq!(terminate(&mut router.process.child), 0);
}

#[test]
fn b63_json_lines_carry_time_level_message_and_the_fields() {
    let sim = scripted_sim();
    sim.script("demo/noip", vec![Answer::ok("not-an-ip", true)]);
    let router = spawn_router(&router_args(&sim.addr().to_string(), &["--log-format", "json"]));
    assert!(router.process.line.starts_with("{\"time\":\""), "{}", router.process.line);
    assert!(
        router.process.line.contains("\"level\":\"info\",\"message\":\"atenet-router "),
        "{}",
        router.process.line
    );
    let envoy = Envoy::connect(router.extproc);
    assert_eq!(immediate(&envoy.route_now("demo/noip")).status, 500);
    wait_for_line(&router, "routing failed");
    let line = lines_with(&router, "routing failed").remove(0);
    for field in [
        "\"level\":\"warn\"",
        "\"actor\":\"demo/noip\"",
        "\"worker_ip\":\"not-an-ip\"",
        "\"status\":\"500\"",
        "\"suppressed\":\"0\"",
    ] {
        assert!(line.contains(field), "{field} in {line}");
    }
    assert!(line.starts_with('{') && line.ends_with('}'), "{line}");
    let mut router = router;
    assert_eq!(terminate(&mut router.process.child), 0);
}
