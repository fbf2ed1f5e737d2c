//! Flights and parking over real gRPC against the simulated control plane
//! (B14-B36).
// The router's internals and the simulator: `--features testkit` (make test).
#![cfg(feature = "testkit")]

use crate::common;

use std::time::{Duration, Instant};

use atenet_router::actor::resume::Code;
use atenet_router::tools::sim::Answer;
use common::*;
use futures::executor::block_on;
use futures::future::join_all;

const FULL: &str = "no free workers available";

/// A budget that no machine hiccup uses up: for tests whose steps must all
/// happen while a flight is still retrying.
const LONG_BUDGET: &str = "60s";

fn exhausted() -> Answer {
    Answer::error(Code::ResourceExhausted, FULL)
}

#[test]
fn b16_b32_park_then_served_after_two_resource_exhausted() {
    let stack = Stack::start(&["--parked-request-retry-interval", "10ms"]);
    stack.sim.script("demo/a", vec![exhausted(), exhausted(), Answer::ok("10.0.0.5", true)]);
    let reply = stack.envoy.route_now("demo/a");
    assert_eq!(routed(&reply).1, "10.0.0.5:443");
    assert_eq!(stack.sim.calls("demo/a"), 3);
    let m = stack.metrics();
    assert_eq!(m.value("atenet_router_parking_wait_duration_seconds_count", &[("outcome", "served")]), 1.0);
    assert_eq!(
        m.value("atenet_router_route_duration_seconds_count", &[("outcome", "ok"), ("resume", "triggered")]),
        1.0
    );
    assert_eq!(m.value("atenet_router_resume_attempts_total", &[("code", "ResourceExhausted")]), 2.0);
    assert_eq!(m.value("atenet_router_resume_attempts_total", &[("code", "OK")]), 1.0);
    stack.assert_quiescent();
}

#[test]
fn b19_budget_exhaustion_body_and_code() {
    let stack =
        Stack::start(&["--parked-request-budget", "300ms", "--parked-request-retry-interval", "20ms"]);
    stack.sim.script("demo/a", vec![exhausted()]);
    let started = Instant::now();
    let reply = immediate(&stack.envoy.route_now("demo/a"));
    assert!(started.elapsed() >= Duration::from_millis(300), "budget honoured");
    assert_eq!(reply.status, 503);
    assert_eq!(reply.body, format!("actor demo/a unavailable: {FULL}"));
    assert_eq!(reply.details, "atenet_budget_exhausted");
    let m = stack.metrics();
    assert_eq!(
        m.value("atenet_router_parking_wait_duration_seconds_count", &[("outcome", "budget_exhausted")]),
        1.0
    );
    assert_eq!(
        m.value(
            "atenet_router_route_duration_seconds_count",
            &[("outcome", "no_capacity"), ("resume", "unknown")]
        ),
        1.0
    );
    stack.assert_quiescent();
}

#[test]
fn b19_late_success_after_budget_is_served() {
    let stack = Stack::start(&["--parked-request-budget", "1s", "--parked-request-retry-interval", "10ms"]);
    stack.sim.script(
        "demo/slow",
        vec![exhausted(), Answer::ok("10.0.0.8", true).after(Duration::from_millis(2500))],
    );
    let started = Instant::now();
    let replies = block_on(stack.envoy.exchange_all(headers_request(&[("ate-target-actor", "demo/slow")])));
    assert!(started.elapsed() >= Duration::from_millis(2500));
    assert_eq!(replies.len(), 2, "the late-serve override, then the verdict");
    let extend = &replies[0];
    assert!(extend.response.is_none() && extend.dynamic_metadata.is_none());
    assert_eq!(extend.override_message_timeout.seconds, 30, "--late-serve-limit default");
    assert_eq!(routed(&replies[1]).1, "10.0.0.8:443", "B19: a late success is served");
    assert_eq!(stack.sim.calls("demo/slow"), 2, "B19: no attempt after the deadline");
    stack.assert_quiescent();
}

#[test]
fn late_serve_disabled_sends_no_override() {
    let stack = Stack::start(&[
        "--parked-request-budget",
        "500ms",
        "--parked-request-retry-interval",
        "10ms",
        "--late-serve-limit",
        "0",
    ]);
    stack.sim.script(
        "demo/slow",
        vec![exhausted(), Answer::ok("10.0.0.8", true).after(Duration::from_millis(1500))],
    );
    let replies = block_on(stack.envoy.exchange_all(headers_request(&[("ate-target-actor", "demo/slow")])));
    assert_eq!(replies.len(), 1);
    assert_eq!(routed(&replies[0]).0, None);
}

/// A ResumeActor that never answers (B81): the caller is answered by the
/// router, with its reason, once it has waited all Envoy would; the attempt
/// itself is never cancelled (B15) and still ends the flight when it
/// answers.
#[test]
fn b81_an_attempt_that_never_answers_gets_the_routers_504_with_late_serve() {
    let stack = Stack::start(&["--parked-request-budget", "1s", "--late-serve-limit", "6s"]);
    stack.sim.script("demo/stuck", vec![Answer::ok("10.0.0.8", true).held()]);
    let replies = block_on(stack.envoy.exchange_all(headers_request(&[("ate-target-actor", "demo/stuck")])));
    assert_eq!(replies.len(), 2, "the late-serve override, then the router's own verdict: {replies:?}");
    assert_eq!(replies[0].override_message_timeout.seconds, 6);
    let answer = immediate(&replies[1]);
    assert_eq!(answer.status, 504);
    assert_eq!(answer.headers["x-atenet-reason"], "atenet_resume_timeout");
    assert_eq!(answer.body, "actor demo/stuck request timed out: ateapi has not answered the resume");
    assert_eq!((stack.sim.calls("demo/stuck"), stack.sim.unanswered()), (1, 1), "the attempt still runs");
    assert_eq!(stack.router().resolver().flights().len(), 1, "and the flight awaits it");
    assert_eq!(
        stack.metrics().value("atenet_router_route_duration_seconds_count", &[("outcome", "timeout")]),
        1.0
    );
    assert_eq!(stack.sim.release("demo/stuck"), 1);
    stack.assert_quiescent();
}

#[test]
fn b81_without_late_serve_the_routers_504_comes_before_envoys_message_timeout() {
    let stack = Stack::start(&["--parked-request-budget", "1s", "--late-serve-limit", "0"]);
    stack.sim.script("demo/stuck", vec![Answer::ok("10.0.0.8", true).held()]);
    let replies = block_on(stack.envoy.exchange_all(headers_request(&[("ate-target-actor", "demo/stuck")])));
    assert_eq!(replies.len(), 1, "no override without late serve: {replies:?}");
    assert_eq!(immediate(&replies[0]).headers["x-atenet-reason"], "atenet_resume_timeout");
    assert_eq!(stack.sim.unanswered(), 1);
    stack.sim.release("demo/stuck");
    stack.assert_quiescent();
}

#[test]
fn budget_exhausted_503_carries_retry_after() {
    let stack =
        Stack::start(&["--parked-request-budget", "200ms", "--parked-request-retry-interval", "10ms"]);
    stack.sim.script("demo/a", vec![exhausted()]);
    let reply = immediate(&stack.envoy.route_now("demo/a"));
    assert_eq!(reply.status, 503);
    assert_eq!(reply.headers["retry-after"], "1", "nothing served yet: the floor of 1 s");
    stack.sim.script("demo/nf", vec![Answer::error(Code::NotFound, "x")]);
    assert!(!immediate(&stack.envoy.route_now("demo/nf")).headers.contains_key("retry-after"));
}

#[test]
fn b20_late_terminal_error_wins() {
    let stack = Stack::start(&["--parked-request-budget", "1s", "--parked-request-retry-interval", "10ms"]);
    stack.sim.script(
        "demo/doomed",
        vec![exhausted(), Answer::error(Code::NotFound, "deleted").after(Duration::from_millis(2000))],
    );
    let reply = immediate(&stack.envoy.route_now("demo/doomed"));
    assert_eq!((reply.status, reply.body.as_str()), (404, "actor demo/doomed not found"));
    let m = stack.metrics();
    assert_eq!(m.value("atenet_router_parking_wait_duration_seconds_count", &[("outcome", "error")]), 1.0);
    stack.assert_quiescent();
}

#[test]
fn b14_b21_b25_fifty_callers_one_rpc_per_attempt() {
    let stack =
        Stack::start(&["--parked-request-retry-interval", "10ms", "--parked-request-budget", LONG_BUDGET]);
    stack.sim.script("demo/hot", vec![exhausted().held(), Answer::ok("10.0.0.3", true)]);
    let envoy = stack.envoy.clone();
    let requests = std::thread::spawn(move || block_on(join_all((0..50).map(|_| envoy.route("demo/hot")))));
    stack.wait_for_waiters("demo/hot", 50);
    stack.eventually("the first attempt held at the sim", |s| s.sim.release("demo/hot") == 1);
    let replies = requests.join().unwrap();
    assert!(replies.iter().all(|r| !routed(r).1.is_empty()));
    assert_eq!(stack.sim.calls("demo/hot"), 2, "one RPC per attempt for 50 callers");
    let m = stack.metrics();
    let route = |resume| {
        m.value("atenet_router_route_duration_seconds_count", &[("outcome", "ok"), ("resume", resume)])
    };
    assert_eq!((route("triggered"), route("joined")), (1.0, 49.0), "B21");
    assert_eq!(
        m.value("atenet_router_parking_wait_duration_seconds_count", &[("outcome", "served")]),
        50.0,
        "B25: each parked"
    );
    stack.assert_quiescent();
}

#[test]
fn b24_b26_full_lot_sheds_at_park_transition_running_actor_still_served() {
    let stack = Stack::start(&[
        "--parked-request-max",
        "2",
        "--parked-request-retry-interval",
        "10ms",
        "--parked-request-budget",
        LONG_BUDGET,
    ]);
    stack.sim.script("demo/hot", vec![exhausted()]);
    stack.sim.script("demo/running", vec![Answer::ok("10.0.0.4", false)]);
    let envoy = stack.envoy.clone();
    let parked = std::thread::spawn(move || block_on(join_all((0..2).map(|_| envoy.route("demo/hot")))));
    stack.eventually("two parked", |s| s.metrics().value("atenet_router_parking_active", &[]) == 2.0);
    let shed = immediate(&stack.envoy.route_now("demo/hot"));
    assert_eq!(shed.body, "actor \"demo/hot\" unavailable: router at capacity");
    let fast = stack.envoy.route_now("demo/running");
    assert_eq!(routed(&fast).1, "10.0.0.4:443", "B24: a full lot never affects running actors");
    stack.sim.script("demo/hot", vec![Answer::ok("10.0.0.3", true)]);
    assert!(parked.join().unwrap().iter().all(|r| !routed(r).1.is_empty()), "the flight went on");
    let m = stack.metrics();
    assert_eq!(m.value("atenet_router_parking_rejected_total", &[]), 1.0, "B34");
    assert_eq!(
        m.value("atenet_router_parking_wait_duration_seconds_count", &[]),
        2.0,
        "B32: no sample for shed"
    );
    assert_eq!(m.value("atenet_router_route_duration_seconds_count", &[("resume", "none")]), 1.0);
    stack.assert_quiescent();
}

#[test]
fn b27_b28_client_cancel_while_parked_frees_slot_at_once() {
    let stack =
        Stack::start(&["--parked-request-retry-interval", "20ms", "--parked-request-budget", LONG_BUDGET]);
    stack.sim.script("demo/hot", vec![exhausted()]);
    let mut streams: Vec<_> = (0..2).map(|_| stack.envoy.open()).collect();
    for stream in &mut streams {
        block_on(stream.send(headers_request(&[("ate-target-actor", "demo/hot")])));
    }
    stack.eventually("parked", |s| s.metrics().value("atenet_router_parking_active", &[]) == 2.0);
    streams[0].tx.cancel();
    stack.eventually("slot freed", |s| s.metrics().value("atenet_router_parking_active", &[]) == 1.0);
    let calls = stack.sim.calls("demo/hot");
    assert!(
        stack.sim.wait_for_calls("demo/hot", calls + 1, PATIENCE),
        "B28: the flight goes on for the other"
    );
    let m = stack.metrics();
    assert_eq!(m.value("atenet_router_parking_wait_duration_seconds_count", &[("outcome", "canceled")]), 1.0);
    assert_eq!(m.value("atenet_router_route_duration_seconds_count", &[("outcome", "cancelled")]), 1.0);
    // The last caller gone, the flight ends at once (B78).
    streams[1].tx.cancel();
    stack.eventually("slot freed", |s| s.metrics().value("atenet_router_parking_active", &[]) == 0.0);
    stack.assert_quiescent();
}

#[test]
fn b22_parking_disabled() {
    let stack = Stack::start(&["--parked-request-max", "0", "--parked-request-retry-interval", "10ms"]);
    stack.sim.script("demo/full", vec![exhausted()]);
    stack.sim.script("demo/down", vec![Answer::error(Code::Unavailable, "restarting")]);
    stack.sim.script("demo/locked", vec![Answer::error(Code::Aborted, "busy"), Answer::ok("10.0.0.2", true)]);
    assert_eq!(immediate(&stack.envoy.route_now("demo/full")).status, 503);
    assert_eq!(immediate(&stack.envoy.route_now("demo/down")).status, 503);
    assert_eq!((stack.sim.calls("demo/full"), stack.sim.calls("demo/down")), (1, 1), "exactly one attempt");
    assert_eq!(routed(&stack.envoy.route_now("demo/locked")).0, None, "Aborted still retried");
    assert_eq!(stack.sim.calls("demo/locked"), 2);
    let m = stack.metrics();
    assert_eq!(m.value("atenet_router_parking_wait_duration_seconds_count", &[]), 0.0, "no parking metrics");
    assert_eq!(m.value("atenet_router_parking_rejected_total", &[]), 0.0);
    stack.assert_quiescent();
}

#[test]
fn b29_exact_admission_under_concurrency() {
    let stack = Stack::start(&[
        "--parked-request-max",
        "5",
        "--parked-request-retry-interval",
        "10ms",
        "--parked-request-budget",
        LONG_BUDGET,
    ]);
    stack.sim.script("demo/hot", vec![exhausted().held(), exhausted().held(), Answer::ok("10.0.0.1", true)]);
    let envoy = stack.envoy.clone();
    let requests = std::thread::spawn(move || block_on(join_all((0..20).map(|_| envoy.route("demo/hot")))));
    stack.wait_for_waiters("demo/hot", 20);
    stack.eventually("the first attempt held at the sim", |s| s.sim.release("demo/hot") == 1);
    // All 20 reach the park transition together; the second attempt is held
    // so no one can be served before admission is decided.
    stack.eventually("admission decided", |s| {
        let m = s.metrics();
        m.value("atenet_router_parking_active", &[]) + m.value("atenet_router_parking_rejected_total", &[])
            == 20.0
    });
    assert!(stack.sim.wait_for_calls("demo/hot", 2, PATIENCE));
    stack.eventually("second attempt held", |s| s.sim.release("demo/hot") == 1);
    let replies = requests.join().unwrap();
    let served = replies.iter().filter(|r| r.has_request_headers()).count();
    let shed = replies
        .iter()
        .filter(|r| r.has_immediate_response() && immediate(r).details == "atenet_lot_full")
        .count();
    assert_eq!((served, shed), (5, 15), "exactly K of N admitted");
    let m = stack.metrics();
    assert_eq!(m.value("atenet_router_parking_rejected_total", &[]), 15.0);
    assert_eq!(m.value("atenet_router_parking_wait_duration_seconds_count", &[("outcome", "served")]), 5.0);
    stack.assert_quiescent();
}

/// B32, B35: every request_headers exchange is counted exactly once, and
/// every admitted park has exactly one wait sample.
#[test]
fn b32_b35_metrics_count_exactly_once() {
    let stack =
        Stack::start(&["--parked-request-budget", "500ms", "--parked-request-retry-interval", "10ms"]);
    stack.sim.script("demo/ok", vec![Answer::ok("10.0.0.1", false)]);
    stack.sim.script("demo/parks", vec![exhausted(), Answer::ok("10.0.0.1", true)]);
    // In an atespace of its own: scripted per actor, its answers are no
    // pool's, and in demo's saturation group its budget, ending first,
    // would keep demo/parks behind it to the end (B111).
    stack.sim.script("full/never", vec![exhausted()]);
    stack.sim.script("demo/gone", vec![Answer::error(Code::NotFound, "x")]);
    let actors = ["demo/ok", "demo/parks", "full/never", "demo/gone", "Bad/ref"];
    let envoy = stack.envoy.clone();
    block_on(join_all(actors.iter().cycle().take(25).map(|a| envoy.route(a))));
    let m = stack.metrics();
    assert_eq!(m.value("atenet_router_route_duration_seconds_count", &[]), 25.0);
    for (outcome, n) in [("ok", 10.0), ("no_capacity", 5.0), ("not_found", 10.0)] {
        assert_eq!(
            m.value("atenet_router_route_duration_seconds_count", &[("outcome", outcome)]),
            n,
            "{outcome}"
        );
    }
    let parks = m.value("atenet_router_parking_wait_duration_seconds_count", &[]);
    assert!(parks >= 5.0, "every full/never caller parked");
    assert_eq!(
        parks,
        m.value("atenet_router_parking_wait_duration_seconds_count", &[("outcome", "served")])
            + m.value(
                "atenet_router_parking_wait_duration_seconds_count",
                &[("outcome", "budget_exhausted")]
            )
    );
    stack.assert_quiescent();
}

#[test]
fn b14_no_caching_each_new_request_calls_resume() {
    let stack = Stack::start(&[]);
    stack.sim.script("demo/a", vec![Answer::ok("10.0.0.1", false)]);
    for _ in 0..3 {
        routed(&stack.envoy.route_now("demo/a"));
    }
    assert_eq!(stack.sim.calls("demo/a"), 3);
}

#[test]
fn b41_health_and_readiness() {
    let stack = Stack::start(&[]);
    let addr = stack.router().metrics_addr();
    assert_eq!(http_get(addr, "/healthz"), (200, "ok".into()));
    assert_eq!(http_get(addr, "/readyz"), (200, "ok".into()));
    stack.router().set_ready(false);
    assert_eq!(http_get(addr, "/readyz"), (503, "draining".into()));
    assert_eq!(http_get(addr, "/healthz"), (200, "ok".into()));
}
