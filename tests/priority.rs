//! Priority bands through the real router over real gRPC against the
//! simulated control plane (B115-B119): what each client received, and
//! what the control plane was asked.
// The router's internals and the simulator: `--features testkit` (make test).
#![cfg(feature = "testkit")]

use crate::common;

use std::thread::JoinHandle;

use atenet_router::actor::resume::Code;
use atenet_router::proto::external_processor::ProcessingResponse;
use atenet_router::tools::sim::Answer;
use common::*;
use futures::executor::block_on;

fn exhausted() -> Answer {
    Answer::error(Code::ResourceExhausted, "no free workers available")
}

/// One request for `actor` in `band`, answered on its own thread.
fn request(stack: &Stack, actor: &'static str, band: &'static str) -> JoinHandle<ProcessingResponse> {
    let envoy = stack.envoy.clone();
    std::thread::spawn(move || {
        block_on(envoy.exchange(headers_request(&[("ate-target-actor", actor), ("ate-priority", band)])))
    })
}

/// Parks one request (its actor answers ResourceExhausted until released)
/// and waits until the lot holds `parked`.
fn park(
    stack: &Stack,
    actor: &'static str,
    band: &'static str,
    parked: f64,
) -> JoinHandle<ProcessingResponse> {
    let handle = request(stack, actor, band);
    stack.eventually(&format!("{actor} parked"), |s| {
        s.metrics().value("atenet_router_parking_active", &[]) == parked
    });
    handle
}

/// The reply `handle` gets, within the harness's patience: a request that
/// is never answered fails the test rather than hanging it.
fn answered(stack: &Stack, handle: JoinHandle<ProcessingResponse>) -> ProcessingResponse {
    stack.eventually("an answer", |_| handle.is_finished());
    handle.join().unwrap()
}

fn reason(reply: &ProcessingResponse) -> (i32, String) {
    let reply = immediate(reply);
    (reply.status, reply.details)
}

#[test]
fn b118_a_full_lot_gives_way_to_higher_bands_newest_sheddable_first() {
    let status_port = free_port().to_string();
    let stack = Stack::start_with(
        &[
            "--parked-request-max",
            "4",
            "--parked-request-retry-interval",
            "10ms",
            "--parked-request-budget",
            "60s",
        ],
        &status_port,
    );
    for actor in ["demo/s1", "demo/s2", "demo/t1", "demo/t2", "demo/t3", "demo/t4"] {
        stack.sim.script(actor, vec![exhausted()]);
    }
    // The critical actor resumes once the test lets its second attempt go.
    stack.sim.script("demo/c", vec![exhausted(), Answer::ok("10.0.0.9", true).held()]);
    let s1 = park(&stack, "demo/s1", "sheddable", 1.0);
    let s2 = park(&stack, "demo/s2", "Sheddable", 2.0);
    let t1 = park(&stack, "demo/t1", "standard", 3.0);
    let t2 = park(&stack, "demo/t2", "", 4.0);
    let critical = request(&stack, "demo/c", "CRITICAL");
    let s2 = answered(&stack, s2);
    assert_eq!(reason(&s2), (503, "atenet_preempted".into()), "the newest sheddable");
    let s2 = immediate(&s2);
    assert_eq!(s2.body, "actor \"demo/s2\" unavailable: router at capacity");
    assert!(s2.headers.contains_key("retry-after"));
    let t3 = request(&stack, "demo/t3", "standard");
    assert_eq!(reason(&answered(&stack, s1)), (503, "atenet_preempted".into()), "then the other");
    let shed = answered(&stack, request(&stack, "demo/t4", "standard"));
    assert_eq!(reason(&shed), (503, "atenet_lot_full".into()), "nothing lower is parked");
    assert!(immediate(&shed).headers.contains_key("retry-after"));
    // The lot holds its size, by band, on the status page.
    let (_, json) = http_get(stack.router().status_addr().unwrap(), "/statusz?format=json");
    let json: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(
        json["parking"]["active_by_band"],
        serde_json::json!({"sheddable": 0, "standard": 3, "critical": 1}),
        "{json}"
    );
    // The preempted callers' flights had no other caller: the control
    // plane is asked no more for them.
    let m = stack.metrics();
    assert_eq!(m.value("atenet_router_parking_preempted_total", &[("band", "sheddable")]), 2.0);
    assert_eq!(m.value("atenet_router_parking_rejected_total", &[("band", "standard")]), 1.0);
    assert_eq!(m.value("atenet_router_priority_unknown_total", &[]), 1.0, "t2's empty value, as standard");
    stack.eventually("the sheddable flights ended", |s| {
        let flights = s.router().resolver().flights().snapshot();
        !flights.iter().any(|f| f.actor.as_str() == "demo/s1" || f.actor.as_str() == "demo/s2")
    });
    let asked = (stack.sim.calls("demo/s1"), stack.sim.calls("demo/s2"));
    assert_eq!(stack.sim.calls("demo/t4"), 1, "the shed request's flight made its one attempt");
    // The critical request is routed when its actor resumes.
    assert!(stack.sim.wait_for_calls("demo/c", 2, PATIENCE));
    stack.eventually("the resume held at the sim", |s| s.sim.release("demo/c") == 1);
    let (_, local, _) = routed(&answered(&stack, critical));
    assert!(local.starts_with("10.0.0.9:"), "{local}");
    assert_eq!((stack.sim.calls("demo/s1"), stack.sim.calls("demo/s2")), asked, "not asked again");
    let m = stack.metrics();
    let waits = |outcome, band| {
        m.value("atenet_router_parking_wait_duration_seconds_count", &[("outcome", outcome), ("band", band)])
    };
    assert_eq!((waits("preempted", "sheddable"), waits("served", "critical")), (2.0, 1.0));
    // The standard requests still parked go when their actors do.
    for actor in ["demo/t1", "demo/t2", "demo/t3"] {
        stack.sim.script(actor, vec![Answer::ok("10.0.0.8", true)]);
    }
    for handle in [t1, t2, t3] {
        routed(&answered(&stack, handle));
    }
    assert_eq!(waits("preempted", "standard"), 0.0);
}
