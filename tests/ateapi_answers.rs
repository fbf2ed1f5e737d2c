//! Malformed control-plane answers (B108), through the real binary against a
//! raw HTTP/2 peer: an OK status without a message, two messages for one
//! call, a length prefix longer than its message, a message over gRPC's
//! 4 MiB limit. Each is an error verdict at once; the router keeps serving,
//! keeps no call slot, and does not retry gRPC's own refusal as a full
//! pool. Truth is the verdict the client got and the calls the peer saw.

// The router's internals and the simulator: `--features testkit` (make test).
#![cfg(feature = "testkit")]

use crate::common;

use common::h2peer::{running, Answer, H2Peer};
use common::process::{router_args, spawn_router, terminate, RouterProcess};
use common::{http_get, immediate, routed, Envoy, Metrics, PATIENCE};

use atenet_router::proto::external_processor::ProcessingResponse;
use atenet_router::tools::load::headers_request;

fn router(peer: &H2Peer, extra: &[&str]) -> RouterProcess {
    let mut flags = vec!["--parked-request-budget", "30s"];
    flags.extend(extra);
    spawn_router(&router_args(&peer.addr.to_string(), &flags))
}

/// The verdict for `actor`; a router that gives none within [`PATIENCE`]
/// fails the test (DEADLINE_EXCEEDED) instead of hanging it.
fn verdict(envoy: &Envoy, actor: &str) -> ProcessingResponse {
    futures::executor::block_on(async {
        let mut stream = envoy.open_within(PATIENCE);
        stream.send(headers_request(&[("ate-target-actor", actor)])).await;
        loop {
            let reply = stream.recv().await;
            if reply.response.is_some() {
                return reply;
            }
        }
    })
}

/// The router is alive and serves a valid answer.
fn serves(router: &mut RouterProcess, envoy: &Envoy, actor: &str) {
    assert!(router.process.child.try_wait().unwrap().is_none(), "the router is still running");
    let reply = verdict(envoy, actor);
    let (_, worker, _) = routed(&reply);
    assert!(worker.starts_with("10.0.0.7:"), "{actor} routed to {worker}");
}

#[test]
fn b108_an_answer_that_breaks_the_unary_protocol_is_an_error_verdict_and_the_router_serves_on() {
    let peer = H2Peer::start(Answer::Message(running()));
    let mut router = router(&peer, &[]);
    let envoy = Envoy::connect(router.extproc);
    serves(&mut router, &envoy, "demo/first");
    for (i, answer) in [
        Answer::OkWithoutMessage,
        Answer::HeadersThenOk,
        Answer::ShortMessage,
        Answer::TwoMessages(running()),
    ]
    .into_iter()
    .enumerate()
    {
        let what = format!("{answer:?}").chars().take(40).collect::<String>();
        peer.script([answer]);
        let calls = peer.calls();
        let verdict = immediate(&verdict(&envoy, &format!("demo/broken-{i}")));
        assert_eq!(verdict.status, 500, "{what}: {verdict:?}");
        assert_eq!(peer.calls(), calls + 1, "{what}: one call, not retried");
        assert!(!verdict.body.contains("unwrap"), "{what}: {verdict:?}");
        serves(&mut router, &envoy, &format!("demo/after-{i}"));
    }
    assert_eq!(terminate(&mut router.process.child), 0);
}

#[test]
fn b108_answers_with_two_messages_keep_no_call_slot() {
    let peer = H2Peer::start(Answer::TwoMessages(running()));
    // One call open at a time: an answer that kept its call would leave
    // every later request without one.
    let mut router = router(&peer, &["--ateapi-max-calls", "1", "--ateapi-max-calls-per-atespace", "1"]);
    let envoy = Envoy::connect(router.extproc);
    for i in 0..7 {
        let verdict = immediate(&verdict(&envoy, &format!("demo/double-{i}")));
        assert_eq!(verdict.status, 500, "{verdict:?}");
    }
    assert_eq!(peer.calls(), 7, "each request's call was sent: none waited for a slot");
    peer.set_default(Answer::Message(running()));
    serves(&mut router, &envoy, "demo/other");
    let metrics = Metrics(http_get(router.metrics, "/metrics").1);
    assert_eq!(metrics.value("atenet_router_resume_calls_open", &[]), 0.0, "no call left open");
    assert_eq!(terminate(&mut router.process.child), 0);
}

#[test]
fn b108_an_answer_over_grpcs_message_limit_is_no_full_pool() {
    let peer = H2Peer::start(Answer::Big(5 * 1024 * 1024));
    let mut router = router(&peer, &[]);
    let envoy = Envoy::connect(router.extproc);
    let verdict = immediate(&verdict(&envoy, "demo/huge"));
    assert_eq!(verdict.status, 500, "not a 503 after a budget of retries: {verdict:?}");
    assert_eq!(peer.calls(), 1, "gRPC's own refusal is not retried as saturation");
    assert!(!verdict.body.contains("larger than max"), "B13: no library text in the body: {verdict:?}");
    assert!(verdict.headers.get("x-atenet-reason").is_none_or(|r| r != "atenet_budget_exhausted"));
    peer.set_default(Answer::Message(running()));
    serves(&mut router, &envoy, "demo/small");
    assert_eq!(terminate(&mut router.process.child), 0);
}
