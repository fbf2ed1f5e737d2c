//! Deadline-aware parking (B68) and per-atespace fair shares (B69) over real
//! gRPC against the simulated control plane.
//!
//! Flights run with a budget no machine hiccup uses up, so every verdict
//! here comes from a caller's deadline, the estimate or a share, never from
//! the budget; held answers decide when a park is served.
// The router's internals and the simulator: `--features testkit` (make test).
#![cfg(feature = "testkit")]

use crate::common;

use std::time::{Duration, Instant};

use atenet_router::actor::resume::Code;
use atenet_router::proto::external_processor::ProcessingResponse;
use atenet_router::tools::sim::Answer;
use common::*;
use futures::executor::block_on;
use futures::future::join_all;

const FULL: &str = "no free workers available";

fn exhausted() -> Answer {
    Answer::error(Code::ResourceExhausted, FULL)
}

fn stack(extra: &[&str]) -> Stack {
    let mut flags = vec![
        "--parked-request-budget",
        "60s",
        "--parked-request-retry-interval",
        "10ms",
        "--parked-request-max",
        "16",
    ];
    flags.extend_from_slice(extra);
    Stack::start(&flags)
}

fn request(
    actor: &str,
    headers: &[(&str, &str)],
) -> atenet_router::proto::external_processor::ProcessingRequest {
    let mut all = vec![("ate-target-actor", actor)];
    all.extend_from_slice(headers);
    headers_request(&all)
}

/// Sends one request on its own thread.
fn send(stack: &Stack, actor: &str, headers: &[(&str, &str)]) -> std::thread::JoinHandle<ProcessingResponse> {
    let envoy = stack.envoy.clone();
    let request = request(actor, headers);
    std::thread::spawn(move || block_on(envoy.exchange(request)))
}

/// A request that parks (its actor answers ResourceExhausted, then an OK held
/// until the sim has been called `held_at` times) and is then served, so
/// its deadline, if the router saw one, had the whole park to pass.
fn parked_then_served(stack: &Stack, actor: &str, headers: &[(&str, &str)]) -> ProcessingResponse {
    stack.sim.script(actor, vec![exhausted(), Answer::ok("10.0.0.7", true).held()]);
    let reply = send(stack, actor, headers);
    assert!(stack.sim.wait_for_calls(actor, 2, PATIENCE), "the retry reached the sim");
    // The caller parked at least one retry interval ago; a deadline shorter
    // than that has passed. Give a misread one some more time to show.
    std::thread::sleep(Duration::from_millis(50));
    stack.eventually("the held answer released", |s| s.sim.release(actor) == 1);
    reply.join().unwrap()
}

fn waits(stack: &Stack, outcome: &str) -> f64 {
    stack.metrics().value("atenet_router_parking_wait_duration_seconds_count", &[("outcome", outcome)])
}

fn assert_caller_deadline(reply: &ProcessingResponse, actor: &str) {
    let reply = immediate(reply);
    assert_eq!(reply.status, 504, "{reply:?}");
    assert_eq!(reply.body, format!("actor {actor} request timed out"));
    assert_eq!(reply.details, "atenet_caller_deadline");
    assert_eq!(reply.headers["x-atenet-reason"], "atenet_caller_deadline");
}

#[test]
fn b68_grpc_timeout_in_every_unit() {
    // Long deadlines: the park (at least 60 ms) does not reach them, so a
    // unit read as a smaller one would fail these with 504.
    for value in ["1H", "1M", "30S", "20000m", "20000000u"] {
        let stack = stack(&[]);
        let reply = parked_then_served(&stack, "demo/long", &[("grpc-timeout", value)]);
        assert_eq!(routed(&reply).1, "10.0.0.7:443", "grpc-timeout {value}");
        assert_eq!(waits(&stack, "served"), 1.0, "{value}");
    }
    // Short deadlines (8 digits of nanoseconds is at most 0.1 s); the
    // flight retries for 60 s, so only the deadline can end these waits.
    for value in ["300m", "300000u", "99999999n", "1S"] {
        let stack = stack(&[]);
        stack.sim.script("demo/short", vec![exhausted()]);
        let started = Instant::now();
        let reply = block_on(stack.envoy.exchange(request("demo/short", &[("grpc-timeout", value)])));
        let waited = started.elapsed();
        assert_caller_deadline(&reply, "demo/short");
        let least = match value {
            "1S" => Duration::from_secs(1),
            "99999999n" => Duration::from_nanos(99_999_999),
            _ => Duration::from_millis(300),
        };
        assert!(waited >= least, "grpc-timeout {value}: answered after {waited:?}");
        let m = stack.metrics();
        assert_eq!(
            m.value("atenet_router_parking_wait_duration_seconds_count", &[("outcome", "deadline")]),
            1.0
        );
        assert_eq!(
            m.value(
                "atenet_router_route_duration_seconds_count",
                &[("outcome", "timeout"), ("resume", "unknown")]
            ),
            1.0
        );
        assert_eq!(m.value("atenet_router_park_decisions_total", &[("decision", "admitted")]), 1.0);
        // Its only caller gone, the flight ends and asks ateapi no more (B78).
        stack.eventually("the flight ended", |s| s.router().resolver().flights().is_empty());
        let calls = stack.sim.calls("demo/short");
        std::thread::sleep(Duration::from_millis(200));
        assert_eq!(stack.sim.calls("demo/short"), calls, "20 retry intervals later, no call");
    }
}

#[test]
fn b68_envoy_expected_timeout_and_the_smaller_header_wins() {
    let cases: &[&[(&str, &str)]] = &[
        &[("x-envoy-expected-rq-timeout-ms", "300")],
        &[("grpc-timeout", "1H"), ("x-envoy-expected-rq-timeout-ms", "300")],
        &[("x-envoy-expected-rq-timeout-ms", "3600000"), ("grpc-timeout", "300m")],
        // A malformed header does not hide a valid one.
        &[("grpc-timeout", "soon"), ("x-envoy-expected-rq-timeout-ms", "300")],
    ];
    for headers in cases {
        let stack = stack(&[]);
        stack.sim.script("demo/a", vec![exhausted()]);
        let started = Instant::now();
        let reply = block_on(stack.envoy.exchange(request("demo/a", headers)));
        assert_caller_deadline(&reply, "demo/a");
        assert!(started.elapsed() >= Duration::from_millis(300), "{headers:?}");
        stack.sim.script("demo/a", vec![Answer::ok("10.0.0.7", true)]);
    }
}

#[test]
fn b68_malformed_values_are_ignored() {
    let malformed: &[(&str, &str)] = &[
        ("grpc-timeout", "123456789m"),
        ("grpc-timeout", "300000000n"),
        ("grpc-timeout", "5x"),
        ("grpc-timeout", "m"),
        ("grpc-timeout", "-1S"),
        ("grpc-timeout", " 1m"),
        ("grpc-timeout", ""),
        ("x-envoy-expected-rq-timeout-ms", "-5"),
        ("x-envoy-expected-rq-timeout-ms", "1.5"),
        ("x-envoy-expected-rq-timeout-ms", "99999999999999999999999"),
        ("x-envoy-expected-rq-timeout-ms", "ten"),
    ];
    for header in malformed {
        let stack = stack(&[]);
        let reply = parked_then_served(&stack, "demo/odd", &[*header]);
        assert_eq!(routed(&reply).1, "10.0.0.7:443", "{header:?} is no deadline");
    }
}

#[test]
fn b68_the_fast_path_ignores_deadlines() {
    let stack = stack(&[]);
    stack.sim.script("demo/up", vec![Answer::ok("10.0.0.3", false)]);
    for header in [("grpc-timeout", "1n"), ("x-envoy-expected-rq-timeout-ms", "0")] {
        let reply = block_on(stack.envoy.exchange(request("demo/up", &[header])));
        assert_eq!(routed(&reply).1, "10.0.0.3:443", "{header:?}");
    }
    assert_eq!(stack.metrics().value("atenet_router_park_decisions_total", &[("decision", "fast")]), 2.0);
}

#[test]
fn b68_a_deadline_passes_while_parked_and_the_others_stay() {
    let stack = stack(&[]);
    stack.sim.script("demo/hot", vec![exhausted()]);
    let patient = send(&stack, "demo/hot", &[]);
    let hurried = send(&stack, "demo/hot", &[("grpc-timeout", "300m")]);
    assert_caller_deadline(&hurried.join().unwrap(), "demo/hot");
    assert_eq!(waits(&stack, "deadline"), 1.0);
    stack.eventually("one slot left", |s| s.metrics().value("atenet_router_parking_active", &[]) == 1.0);
    assert!(!patient.is_finished(), "the other caller still parks");
    stack.sim.script("demo/hot", vec![Answer::ok("10.0.0.9", true)]);
    assert_eq!(routed(&patient.join().unwrap()).1, "10.0.0.9:443");
    assert_eq!(waits(&stack, "served"), 1.0);
}

#[test]
fn b68_caller_deadlines_false_ignores_the_headers() {
    let stack = stack(&["--caller-deadlines", "false"]);
    let reply = parked_then_served(
        &stack,
        "demo/a",
        &[("grpc-timeout", "1m"), ("x-envoy-expected-rq-timeout-ms", "1")],
    );
    assert_eq!(routed(&reply).1, "10.0.0.7:443");
    assert_eq!(waits(&stack, "deadline"), 0.0);
}

#[test]
fn b68_early_rejection_once_parks_are_known_to_take_longer() {
    let stack = stack(&[]);
    // No served park yet: no estimate, a hurried caller parks (and times out).
    stack.sim.script("demo/cold", vec![exhausted()]);
    let reply =
        block_on(stack.envoy.exchange(request("demo/cold", &[("x-envoy-expected-rq-timeout-ms", "100")])));
    assert_caller_deadline(&reply, "demo/cold");
    stack.sim.script("demo/cold", vec![Answer::ok("10.0.0.7", true)]);
    // One park served after at least 1.5 s makes the estimate.
    stack.sim.script("demo/slow", vec![exhausted(), Answer::ok("10.0.0.7", true).held()]);
    let first = send(&stack, "demo/slow", &[]);
    assert!(stack.sim.wait_for_calls("demo/slow", 2, PATIENCE));
    std::thread::sleep(Duration::from_millis(1500));
    stack.eventually("the held answer released", |s| s.sim.release("demo/slow") == 1);
    routed(&first.join().unwrap());
    // Callers with 200 ms left are refused at once. With no park served for
    // 1 s one of them may be admitted as a probe (and then time out), never
    // more than one of three sent together.
    stack.sim.script("demo/b", vec![exhausted()]);
    let replies: Vec<ProcessingResponse> = block_on(join_all(
        (0..3).map(|_| stack.envoy.exchange(request("demo/b", &[("x-envoy-expected-rq-timeout-ms", "200")]))),
    ));
    let replies: Vec<Immediate> = replies.iter().map(immediate).collect();
    let early: Vec<&Immediate> =
        replies.iter().filter(|r| r.details == "atenet_deadline_too_short").collect();
    assert!(early.len() >= 2, "{replies:?}");
    for r in &early {
        assert_eq!(r.status, 503);
        assert_eq!(r.body, format!("actor demo/b unavailable: {FULL}"));
        assert_eq!(r.headers["x-atenet-reason"], "atenet_deadline_too_short");
        assert_eq!(r.headers["retry-after"], "2", "the estimate, rounded up");
    }
    assert!(replies
        .iter()
        .all(|r| r.details == "atenet_deadline_too_short" || r.details == "atenet_caller_deadline"));
    let m = stack.metrics();
    assert_eq!(m.value("atenet_router_parking_early_rejected_total", &[]), early.len() as f64);
    assert_eq!(
        m.value("atenet_router_park_decisions_total", &[("decision", "early_rejected")]),
        early.len() as f64
    );
    assert_eq!(
        m.value("atenet_router_parking_wait_duration_seconds_count", &[("outcome", "deadline")]),
        1.0 + (3 - early.len()) as f64,
        "early rejections record no wait"
    );
    // A patient caller still parks and is served.
    let patient = send(&stack, "demo/b", &[("grpc-timeout", "1H")]);
    stack.wait_for_waiters("demo/b", 1);
    stack.eventually("parked", |s| s.metrics().value("atenet_router_parking_active", &[]) == 1.0);
    stack.sim.script("demo/b", vec![Answer::ok("10.0.0.8", true)]);
    assert_eq!(routed(&patient.join().unwrap()).1, "10.0.0.8:443");
}

#[test]
fn b69_two_atespaces_compete_for_a_small_lot() {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port().to_string();
    let stack = Stack::start_with(
        &[
            "--parked-request-budget",
            "60s",
            "--parked-request-retry-interval",
            "10ms",
            "--parked-request-max",
            "4",
            "--parked-request-max-per-atespace",
            "2",
        ],
        &port,
    );
    let greedy: Vec<String> = (0..6).map(|i| format!("greedy/a{i}")).collect();
    for actor in greedy.iter().map(String::as_str).chain(["polite/b", "polite/c"]) {
        stack.sim.script(actor, vec![exhausted()]);
    }
    // Six greedy callers at once: exactly two park, four are shed by the cap.
    let mut callers: Vec<_> = greedy.iter().map(|a| send(&stack, a, &[])).collect();
    stack.eventually("four greedy callers answered", |_| {
        callers.iter().filter(|c| c.is_finished()).count() == 4
    });
    let (shed, parked): (Vec<_>, Vec<_>) = callers.drain(..).partition(|c| c.is_finished());
    for caller in shed {
        let reply = immediate(&caller.join().unwrap());
        assert_eq!(reply.status, 503);
        assert!(
            reply.body.starts_with("actor \"greedy/a")
                && reply.body.ends_with("\" unavailable: atespace at capacity")
        );
        assert_eq!(reply.details, "atenet_atespace_full");
        assert_eq!(reply.headers["x-atenet-reason"], "atenet_atespace_full");
        assert_eq!(reply.headers["retry-after"], "1", "no park served yet");
    }
    // The other atespace still parks, up to the lot's size.
    let polite: Vec<_> = ["polite/b", "polite/c"].iter().map(|a| send(&stack, a, &[])).collect();
    stack.eventually("the lot full", |s| s.metrics().value("atenet_router_parking_active", &[]) == 4.0);
    let m = stack.metrics();
    assert_eq!(m.value("atenet_router_parking_atespace_rejected_total", &[]), 4.0);
    assert_eq!(m.value("atenet_router_park_decisions_total", &[("decision", "atespace_full")]), 4.0);
    assert_eq!(m.value("atenet_router_parking_rejected_total", &[]), 0.0, "nobody shed by the lot");
    assert!(polite.iter().all(|c| !c.is_finished()));
    let status = stack.router().status_addr().unwrap();
    let (_, json) = http_get(status, "/statusz?format=json");
    for (atespace, sheds) in [("greedy", 4), ("polite", 0)] {
        let row = format!("{{\"atespace\":\"{atespace}\",\"slots\":2,\"oldest_wait_seconds\":");
        let at = json.find(&row).unwrap_or_else(|| panic!("{atespace} in {json}"));
        let rest = &json[at + row.len()..];
        assert!(
            rest.split('}').next().unwrap().ends_with(&format!(",\"sheds_last_minute\":{sheds}")),
            "{json}"
        );
    }
    let (_, html) = http_get(status, "/statusz");
    assert!(
        html.contains("<table class=\"rows\" id=\"atespaces\">")
            && html.contains(
                "<td data-label=\"atespace\">greedy</td><td class=\"n\" data-label=\"slots\">2</td>"
            ),
        "{html}"
    );
    // The pool frees up: every parked caller is served.
    for actor in greedy.iter().map(String::as_str).chain(["polite/b", "polite/c"]) {
        stack.sim.script(actor, vec![Answer::ok("10.0.0.5", true)]);
    }
    for caller in parked.into_iter().chain(polite) {
        assert_eq!(routed(&caller.join().unwrap()).1, "10.0.0.5:443");
    }
}

#[test]
fn b69_k_free_slots_of_an_atespace_admit_exactly_k_of_many() {
    let stack = stack(&["--parked-request-max-per-atespace", "3"]);
    stack.sim.script("crowd/hot", vec![exhausted()]);
    let callers: Vec<_> = (0..12).map(|_| send(&stack, "crowd/hot", &[])).collect();
    stack.eventually("nine callers answered", |_| callers.iter().filter(|c| c.is_finished()).count() == 9);
    stack.eventually("three parked", |s| s.metrics().value("atenet_router_parking_active", &[]) == 3.0);
    stack.sim.script("crowd/hot", vec![Answer::ok("10.0.0.5", true)]);
    let replies: Vec<ProcessingResponse> = callers.into_iter().map(|c| c.join().unwrap()).collect();
    let served = replies.iter().filter(|r| r.has_request_headers()).count();
    let shed = replies
        .iter()
        .filter(|r| r.has_immediate_response() && immediate(r).details == "atenet_atespace_full");
    assert_eq!((served, shed.count()), (3, 9));
    assert_eq!(stack.metrics().value("atenet_router_parking_atespace_rejected_total", &[]), 9.0);
}
