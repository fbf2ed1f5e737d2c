//! Routing verdicts and error mapping over real gRPC (B1-B13).
// The router's internals and the simulator: `--features testkit` (make test).
#![cfg(feature = "testkit")]

use crate::common;

use std::time::Duration;

use atenet_router::actor::resume::Code;
use atenet_router::proto::external_processor::{HttpBody, HttpHeaders, HttpTrailers, ProcessingRequest};
use atenet_router::tools::sim::Answer;
use common::*;
use futures::executor::block_on;
use futures::StreamExt;

#[test]
fn b6_b7_success_verdict_ipv4_and_ipv6() {
    let stack = Stack::start(&[]);
    stack.sim.script("demo/v4", vec![Answer::ok("10.1.2.3", true)]);
    stack.sim.script(
        "demo/v6",
        vec![Answer { ips: vec!["fd00::52".into(), "10.0.0.1".into()], ..Answer::ok("x", true) }],
    );
    let (actor, local, port) = routed(&stack.envoy.route_now("demo/v4"));
    assert_eq!(
        (actor, local.as_str(), port.as_str()),
        (None, "10.1.2.3:443", "80"),
        "B6: header carried alone"
    );
    let (_, local, _) = routed(&stack.envoy.route_now("demo/v6"));
    assert_eq!(local, "[fd00::52]:443", "B7: IPv6 bracketed, first IP");
    // Repeated, the header is set to the canonical id alone.
    let twice = headers_request(&[("ate-target-actor", "demo/v4"), ("ate-target-actor", "demo/v6")]);
    let reply = block_on(stack.envoy.exchange(twice));
    assert_eq!(routed(&reply).0.as_deref(), Some("demo/v4"));
    let set = &reply.request_headers().response.header_mutation.set_headers[0];
    assert_eq!(set.header.key, "ate-target-actor");
    assert!(set.header.value.is_empty(), "B6: raw_value only");
    assert!(set.append.is_none(), "B6: append unset means overwrite");
    stack.assert_quiescent();
}

#[test]
fn b7_worker_port_flag() {
    let stack = Stack::start(&["--worker-port", "8443"]);
    stack.sim.script("demo/a", vec![Answer::ok("10.0.0.9", false)]);
    assert_eq!(routed(&stack.envoy.route_now("demo/a")).1, "10.0.0.9:8443");
}

#[test]
fn b5_connect_and_authority_attribute_ports() {
    let stack = Stack::start(&[]);
    stack.sim.script("demo/a", vec![Answer::ok("10.0.0.9", false)]);
    let connect = headers_request(&[
        (":method", "CONNECT"),
        (":authority", "db.internal:5432"),
        ("ate-target-actor", "demo/a"),
    ]);
    assert_eq!(routed(&block_on(stack.envoy.exchange(connect.clone()))).2, "5432");
    let get =
        headers_request(&[(":method", "GET"), (":authority", "h:8080"), ("ate-target-actor", "demo/a")]);
    assert_eq!(routed(&block_on(stack.envoy.exchange(get))).2, "80", "B5: non-CONNECT host port never used");
    let with_attr = with_attribute(connect, "filter_state['dev.ate.connect.authority']", "tunnel:9000");
    assert_eq!(routed(&block_on(stack.envoy.exchange(with_attr))).2, "9000");
}

#[test]
fn b2_actor_from_filter_state_attribute() {
    let stack = Stack::start(&[]);
    stack.sim.script("space/from-attr", vec![Answer::ok("10.0.0.1", false)]);
    let request = with_attribute(
        headers_request(&[(":path", "/")]),
        "filter_state['dev.ate.target.actor']",
        "space/from-attr",
    );
    assert_eq!(routed(&block_on(stack.envoy.exchange(request))).0.as_deref(), Some("space/from-attr"));
}

#[test]
fn b4_invalid_reference_is_404_without_calling_ateapi() {
    let stack = Stack::start(&[]);
    for bad in ["", "demo", "Demo/a", "demo/a/b", "demo/..", "demo/a%2Fb", "demo/a b"] {
        let reply = immediate(&stack.envoy.route_now(bad));
        assert_eq!((reply.status, reply.body.as_str()), (404, "invalid actor reference"), "{bad:?}");
        assert_eq!(reply.headers["content-type"], "text/plain", "B10");
        assert_eq!(reply.headers["x-atenet-reason"], "atenet_invalid_target");
        assert_eq!(reply.details, "atenet_invalid_target");
    }
    let reply = immediate(&block_on(stack.envoy.exchange(headers_request(&[(":path", "/")]))));
    assert_eq!(reply.status, 404);
    assert_eq!(stack.sim.total_calls(), 0, "B4: ateapi not called");
}

/// One scripted actor per row of B11.
#[test]
fn b11_every_row_parking_disabled_terminal_codes() {
    let stack = Stack::start(&["--parked-request-max", "0"]);
    let rows: Vec<(&str, Answer, i32, &str, &str)> = vec![
        (
            "demo/notfound",
            Answer::error(Code::NotFound, "gone"),
            404,
            "actor demo/notfound not found",
            "atenet_not_found",
        ),
        (
            "demo/exhausted",
            Answer::error(Code::ResourceExhausted, "no free workers available"),
            503,
            "actor demo/exhausted unavailable: no free workers available",
            "atenet_no_capacity",
        ),
        (
            "demo/precondition",
            Answer::error(Code::FailedPrecondition, "actor is suspending"),
            503,
            "actor demo/precondition unavailable: actor is suspending",
            "atenet_failed_precondition",
        ),
        (
            "demo/unavailable",
            Answer::error(Code::Unavailable, "connection refused"),
            503,
            "actor demo/unavailable unavailable",
            "atenet_unavailable",
        ),
        (
            "demo/deadline",
            Answer::error(Code::DeadlineExceeded, "slow"),
            504,
            "actor demo/deadline request timed out",
            "atenet_timeout",
        ),
        (
            "demo/denied",
            Answer::error(Code::PermissionDenied, "no"),
            403,
            "actor demo/denied access denied",
            "atenet_access_denied",
        ),
        (
            "demo/unauth",
            Answer::error(Code::Unauthenticated, "who"),
            401,
            "actor demo/unauth authentication required",
            "atenet_unauthenticated",
        ),
        (
            "demo/internal",
            Answer::error(Code::Internal, "stack trace here"),
            500,
            "error resuming actor demo/internal",
            "atenet_resume_error",
        ),
        (
            "demo/noip",
            Answer { ips: vec![], ..Answer::ok("x", true) },
            500,
            "actor demo/noip routing failed",
            "atenet_routing_failed",
        ),
        (
            "demo/badip",
            Answer::ok("not-an-ip", true),
            500,
            "actor demo/badip routing failed",
            "atenet_routing_failed",
        ),
        (
            "demo/metadata",
            Answer::ok("169.254.169.254", true),
            500,
            "actor demo/metadata routing failed",
            "atenet_routing_failed",
        ),
    ];
    for (actor, answer, status, body, reason) in rows {
        stack.sim.script(actor, vec![answer]);
        let reply = immediate(&stack.envoy.route_now(actor));
        assert_eq!(
            (reply.status, reply.body.as_str(), reply.details.as_str()),
            (status, body, reason),
            "{actor}"
        );
        assert_eq!(reply.headers["x-atenet-reason"], reason);
        assert_eq!(reply.headers["content-type"], "text/plain");
        assert_eq!(stack.sim.calls(actor), 1, "B22: {actor} gets exactly one attempt");
    }
    stack.assert_quiescent();
}

#[test]
fn b11_b12_aborted_row_and_budget_exhausted_body() {
    let stack =
        Stack::start(&["--parked-request-budget", "300ms", "--parked-request-retry-interval", "20ms"]);
    stack.sim.script("demo/locked", vec![Answer::error(Code::Aborted, "concurrent operation in progress")]);
    let reply = immediate(&stack.envoy.route_now("demo/locked"));
    assert_eq!(reply.status, 503);
    assert_eq!(reply.body, "actor demo/locked unavailable: concurrent operation in progress");
    assert_eq!(reply.details, "atenet_budget_exhausted");
    assert!(!reply.body.contains("rpc error"), "B12: no wrapper text");
    assert!(stack.sim.calls("demo/locked") >= 2, "Aborted is retried");
    stack.assert_quiescent();
}

#[test]
fn b11_lot_full_row_quotes_the_id() {
    let stack = Stack::start(&["--parked-request-max", "1", "--parked-request-retry-interval", "10ms"]);
    stack.sim.script("demo/hot", vec![Answer::error(Code::ResourceExhausted, "no free workers available")]);
    let envoy = stack.envoy.clone();
    let first = std::thread::spawn(move || envoy.route_now("demo/hot"));
    stack.eventually("one request parked", |s| s.metrics().value("atenet_router_parking_active", &[]) == 1.0);
    let reply = immediate(&stack.envoy.route_now("demo/hot"));
    assert_eq!(reply.status, 503);
    assert_eq!(reply.body, "actor \"demo/hot\" unavailable: router at capacity");
    assert_eq!(reply.details, "atenet_lot_full");
    stack.sim.script("demo/hot", vec![Answer::ok("10.0.0.1", true)]);
    assert_eq!(routed(&first.join().unwrap()).0, None);
    stack.assert_quiescent();
}

/// How long a test waits for the router to end a stream (B77).
const ENDS_WITHIN: Duration = Duration::from_secs(30);

/// B9: every other message kind that comes before the verdict gets one
/// empty reply of its own kind; B77: the verdict then ends the stream with
/// OK, without the client ending it.
#[test]
fn b9_every_other_phase_gets_its_own_empty_reply() {
    let stack = Stack::start(&[]);
    stack.sim.script("demo/a", vec![Answer::ok("10.0.0.1", false)]);
    let kinds: Vec<(ProcessingRequest, &str)> = vec![
        (
            {
                let mut r = ProcessingRequest::new();
                r.set_request_body(HttpBody::new());
                r
            },
            "request_body",
        ),
        (
            {
                let mut r = ProcessingRequest::new();
                r.set_request_trailers(HttpTrailers::new());
                r
            },
            "request_trailers",
        ),
        (
            {
                let mut r = ProcessingRequest::new();
                r.set_response_headers(HttpHeaders::new());
                r
            },
            "response_headers",
        ),
        (
            {
                let mut r = ProcessingRequest::new();
                r.set_response_body(HttpBody::new());
                r
            },
            "response_body",
        ),
        (
            {
                let mut r = ProcessingRequest::new();
                r.set_response_trailers(HttpTrailers::new());
                r
            },
            "response_trailers",
        ),
    ];
    block_on(async {
        let mut stream = stack.envoy.open_within(ENDS_WITHIN);
        for (request, kind) in kinds {
            stream.send(request).await;
            let reply = stream.recv().await;
            let got = match () {
                _ if reply.has_request_body() => "request_body",
                _ if reply.has_request_trailers() => "request_trailers",
                _ if reply.has_response_headers() => "response_headers",
                _ if reply.has_response_body() => "response_body",
                _ if reply.has_response_trailers() => "response_trailers",
                _ => "other",
            };
            assert_eq!(got, kind, "B9");
            assert!(reply.dynamic_metadata.is_none());
        }
        stream.send(headers_request(&[("ate-target-actor", "demo/a")])).await;
        assert_eq!(routed(&stream.recv().await).0, None);
        assert!(stream.rx.next().await.is_none(), "B77: the verdict ends the stream with OK");
    });
}

/// B77: a verdict given at once (B4's 404) ends its stream, as a route does.
#[test]
fn b76_every_verdict_ends_its_stream_with_ok() {
    let stack = Stack::start(&[]);
    stack.sim.script("demo/a", vec![Answer::ok("10.0.0.1", false)]);
    block_on(async {
        let mut stream = stack.envoy.open_within(ENDS_WITHIN);
        stream.send(headers_request(&[("ate-target-actor", "Not/Valid")])).await;
        assert_eq!(immediate(&stream.recv().await).status, 404);
        assert!(stream.rx.next().await.is_none(), "B77: after an ImmediateResponse");
        let mut stream = stack.envoy.open_within(ENDS_WITHIN);
        stream.send(headers_request(&[("ate-target-actor", "demo/a")])).await;
        assert_eq!(routed(&stream.recv().await).0, None);
        assert!(stream.rx.next().await.is_none(), "B77: after a route");
    });
}

#[test]
fn observability_mode_gets_no_reply() {
    let stack = Stack::start(&[]);
    stack.sim.script("demo/a", vec![Answer::ok("10.0.0.1", false)]);
    block_on(async {
        let mut stream = stack.envoy.open();
        let mut observed = ProcessingRequest::new();
        observed.set_response_headers(HttpHeaders::new());
        observed.observability_mode = true;
        stream.send(observed).await;
        let mut observed_headers = headers_request(&[("ate-target-actor", "demo/observed")]);
        observed_headers.observability_mode = true;
        stream.send(observed_headers).await;
        stream.send(headers_request(&[("ate-target-actor", "demo/a")])).await;
        // The first reply is the routing verdict: the observed messages got none.
        assert_eq!(routed(&stream.recv().await).0, None);
        stream.tx.cancel();
    });
    assert_eq!(stack.sim.calls("demo/observed"), 0, "no actor is resumed for an observed request");
}

#[test]
fn b1_first_duplicate_header_counts_and_case_insensitive() {
    let stack = Stack::start(&[]);
    stack.sim.script("demo/first", vec![Answer::ok("10.0.0.1", false)]);
    let request = headers_request(&[("ATE-Target-Actor", "demo/first"), ("ate-target-actor", "demo/second")]);
    assert_eq!(routed(&block_on(stack.envoy.exchange(request))).0.as_deref(), Some("demo/first"));
    assert_eq!(stack.sim.calls("demo/second"), 0);
}

#[test]
fn half_closed_stream_still_gets_its_verdict() {
    let stack = Stack::start(&["--parked-request-retry-interval", "10ms"]);
    stack.sim.script(
        "demo/a",
        vec![
            Answer::error(Code::ResourceExhausted, "full"),
            Answer::ok("10.0.0.1", true).after(Duration::from_millis(50)),
        ],
    );
    block_on(async {
        let mut stream = stack.envoy.open();
        stream.send(headers_request(&[("ate-target-actor", "demo/a")])).await;
        futures::SinkExt::close(&mut stream.tx).await.unwrap();
        assert_eq!(routed(&stream.recv().await).0, None);
    });
    stack.assert_quiescent();
}

/// B13: a long control-plane message reaches the body only as a bounded,
/// clean part of itself; one too large for gRPC to receive is a failure of
/// the router's own client, answered at once, never retried as a full pool,
/// and no library text reaches the client.
#[test]
fn b13_long_control_plane_messages_are_bounded_and_unreceivable_ones_are_the_routers_own() {
    let stack =
        Stack::start(&["--parked-request-budget", "300ms", "--parked-request-retry-interval", "20ms"]);
    let long = "no free workers ".repeat(1_250);
    assert_eq!(long.len(), 20_000);
    stack.sim.script("demo/long", vec![Answer::error(Code::ResourceExhausted, &long)]);
    let reply = immediate(&stack.envoy.route_now("demo/long"));
    assert_eq!((reply.status, reply.headers["x-atenet-reason"].as_str()), (503, "atenet_budget_exhausted"));
    let shown = reply.body.strip_prefix("actor demo/long unavailable: ").expect("B11's body");
    assert_eq!(shown, format!("{}…", &long[..256]), "at most 256 characters of the message");
    assert!(!reply.body.contains("metadata"), "{}", reply.body);

    stack.sim.script("demo/huge", vec![Answer::error(Code::ResourceExhausted, &"x".repeat(100_000))]);
    let reply = immediate(&stack.envoy.route_now("demo/huge"));
    assert_eq!(
        (reply.status, reply.body.as_str(), reply.headers["x-atenet-reason"].as_str()),
        (500, "error resuming actor demo/huge", "atenet_resume_error")
    );
    assert_eq!(stack.sim.calls("demo/huge"), 1, "an answer the router cannot read is not retried");
    stack.assert_quiescent();
}

/// `--worker-networks` (B83): an address outside them is a routing
/// failure, as an unusable one is (B8); inside, the request is routed.
#[test]
fn b83_worker_addresses_outside_the_worker_networks_are_routing_failures() {
    let stack = Stack::start(&["--worker-networks", "10.0.0.0/8, fd00::/8"]);
    let rows = [
        ("demo/inside", "10.1.2.3", Some("10.1.2.3:443")),
        ("demo/inside6", "fd00::5", Some("[fd00::5]:443")),
        ("demo/mapped", "::ffff:10.9.9.9", Some("[::ffff:10.9.9.9]:443")),
        ("demo/outside", "192.168.1.5", None),
        ("demo/loopback", "127.0.0.1", None),
        ("demo/outside6", "fc00::1", None),
    ];
    for (actor, ip, worker) in rows {
        stack.sim.script(actor, vec![Answer::ok(ip, true)]);
        let reply = stack.envoy.route_now(actor);
        match worker {
            Some(worker) => assert_eq!(routed(&reply).1, worker, "{actor}"),
            None => {
                let answer = immediate(&reply);
                assert_eq!(
                    (answer.status, answer.details.as_str()),
                    (500, "atenet_routing_failed"),
                    "{actor}"
                );
            }
        }
    }
    stack.assert_quiescent();
}
