//! Hostile input over real gRPC: each gets a clear verdict or a clean stream
//! end, and the router keeps serving afterwards (issue "Reliability").
// The router's internals and the simulator: `--features testkit` (make test).
#![cfg(feature = "testkit")]

use crate::common;

use std::time::Duration;

use atenet_router::actor::resume::Code;
use atenet_router::proto::external_processor::{HttpBody, HttpTrailers, ProcessingRequest};
use atenet_router::tools::sim::Answer;
use common::*;
use futures::executor::block_on;
use futures::{SinkExt, StreamExt};
use grpcio::WriteFlags;
use protobuf::Message;

/// The router still answers a normal request, and holds nothing.
fn still_serving(stack: &Stack) {
    stack.sim.script("demo/canary", vec![Answer::ok("10.0.0.1", false)]);
    assert_eq!(routed(&stack.envoy.route_now("demo/canary")).0, None);
    stack.assert_quiescent();
    stack.eventually("no stream open", |s| {
        s.metrics().value("atenet_router_extproc_streams_active", &[]) == 0.0
    });
}

fn request_with_raw(headers: &[(&str, Vec<u8>)]) -> ProcessingRequest {
    let mut request = headers_request(&[]);
    let map = request.mut_request_headers().headers.mut_or_insert_default();
    for (key, raw) in headers {
        let mut h = atenet_router::proto::base::HeaderValue::new();
        h.key = key.to_string();
        h.raw_value = raw.clone();
        map.headers.push(h);
    }
    request
}

#[test]
fn huge_header_values_64k_and_1m() {
    let stack = Stack::start(&[]);
    stack.sim.script("demo/a", vec![Answer::ok("10.0.0.1", false)]);
    for size in [64 * 1024, 1024 * 1024] {
        let big = vec![b'x'; size];
        let request = request_with_raw(&[("ate-target-actor", b"demo/a".to_vec()), ("x-big", big.clone())]);
        assert_eq!(routed(&block_on(stack.envoy.exchange(request))).0, None, "{size}-byte header");
        let as_actor = request_with_raw(&[("ate-target-actor", big)]);
        assert_eq!(immediate(&block_on(stack.envoy.exchange(as_actor))).status, 404, "{size}-byte actor");
    }
    still_serving(&stack);
}

#[test]
fn non_utf8_raw_values() {
    let stack = Stack::start(&[]);
    stack.sim.script("demo/a", vec![Answer::ok("10.0.0.1", false)]);
    let bad_actor =
        request_with_raw(&[("ate-target-actor", vec![b'd', b'/', 0xc3, 0x28]), (":path", vec![0xff, 0xfe])]);
    assert_eq!(immediate(&block_on(stack.envoy.exchange(bad_actor))).body, "invalid actor reference");
    let bad_other =
        request_with_raw(&[("ate-target-actor", b"demo/a".to_vec()), (":path", vec![b'/', 0xff])]);
    assert_eq!(routed(&block_on(stack.envoy.exchange(bad_other))).0, None);
    still_serving(&stack);
}

#[test]
fn odd_actor_ids_are_404_without_a_control_plane_call() {
    let stack = Stack::start(&[]);
    let long = "a".repeat(64);
    for id in [
        "demo/..",
        "../etc",
        "demo/a%2Fb",
        "demo/a b",
        " demo/a",
        "Demo/A",
        &format!("demo/{long}"),
        "demo//a",
        "/",
        "demo/a\n",
    ] {
        assert_eq!(immediate(&stack.envoy.route_now(id)).status, 404, "{id:?}");
    }
    assert_eq!(stack.sim.total_calls(), 0);
    still_serving(&stack);
}

#[test]
fn message_with_only_unknown_fields_is_ignored_and_the_stream_goes_on() {
    let stack = Stack::start(&[]);
    stack.sim.script("demo/a", vec![Answer::ok("10.0.0.1", false)]);
    block_on(async {
        let mut stream = stack.envoy.open();
        let mut unknown = ProcessingRequest::new();
        unknown.mut_unknown_fields().add_varint(4242, 7);
        unknown.mut_unknown_fields().add_length_delimited(99, b"junk".to_vec());
        assert!(!unknown.write_to_bytes().unwrap().is_empty());
        stream.send(unknown).await;
        stream.send(headers_request(&[("ate-target-actor", "demo/a")])).await;
        assert_eq!(routed(&stream.recv().await).0, None, "the first reply answers the headers");
        stream.tx.cancel();
    });
    still_serving(&stack);
}

#[test]
fn bodies_and_trailers_before_headers_and_nothing_after_the_verdict() {
    let stack = Stack::start(&[]);
    stack.sim.script("demo/a", vec![Answer::ok("10.0.0.1", false)]);
    stack.sim.script("demo/b", vec![Answer::ok("10.0.0.2", false)]);
    block_on(async {
        let mut stream = stack.envoy.open_within(Duration::from_secs(30));
        let mut body = ProcessingRequest::new();
        body.set_request_body(HttpBody::new());
        stream.send(body).await;
        assert!(stream.recv().await.has_request_body());
        let mut trailers = ProcessingRequest::new();
        trailers.set_request_trailers(HttpTrailers::new());
        stream.send(trailers).await;
        assert!(stream.recv().await.has_request_trailers());
        stream.send(headers_request(&[("ate-target-actor", "demo/a")])).await;
        assert_eq!(routed(&stream.recv().await).0, None);
        // The verdict ends the stream (B77): a second request_headers, which
        // Envoy never sends, is not read, and resumes nothing.
        let _ =
            stream.tx.send((headers_request(&[("ate-target-actor", "demo/b")]), WriteFlags::default())).await;
        assert!(stream.rx.next().await.is_none(), "the stream ended with OK after the verdict");
    });
    assert_eq!(stack.sim.calls("demo/b"), 0);
    still_serving(&stack);
}

#[test]
fn stream_closed_before_any_message() {
    let stack = Stack::start(&[]);
    block_on(async {
        let mut stream = stack.envoy.open();
        futures::SinkExt::close(&mut stream.tx).await.unwrap();
        assert!(stream.rx.next().await.is_none(), "the router ends the stream cleanly");
        let mut reset = stack.envoy.open();
        reset.tx.cancel();
    });
    still_serving(&stack);
}

#[test]
fn ten_thousand_streams_opened_and_reset_at_once() {
    // The flight must still be retrying when the last of the 5,000 parks:
    // a budget no slow machine can use up.
    let stack = Stack::start(&[
        "--parked-request-max",
        "20000",
        "--parked-request-retry-interval",
        "50ms",
        "--parked-request-budget",
        "60s",
    ]);
    stack.sim.script("demo/hot", vec![Answer::error(Code::ResourceExhausted, "no free workers available")]);
    let mut streams: Vec<Stream> = (0..10_000).map(|_| stack.envoy.open()).collect();
    block_on(async {
        for (i, stream) in streams.iter_mut().enumerate() {
            // Half of them park first; the other half are reset before sending.
            if i % 2 == 0 {
                stream.send(headers_request(&[("ate-target-actor", "demo/hot")])).await;
            }
        }
    });
    stack.eventually("5,000 parked", |s| s.metrics().value("atenet_router_parking_active", &[]) == 5000.0);
    for stream in &mut streams {
        stream.tx.cancel();
    }
    drop(streams);
    stack.eventually("every slot freed", |s| s.metrics().value("atenet_router_parking_active", &[]) == 0.0);
    let m = stack.metrics();
    assert_eq!(
        m.value("atenet_router_parking_wait_duration_seconds_count", &[("outcome", "canceled")]),
        5000.0
    );
    stack.sim.script("demo/hot", vec![Answer::ok("10.0.0.1", true)]);
    still_serving(&stack);
}

/// B74: streams that never send are capped and closed. Over
/// `--extproc-max-streams` a stream is refused with RESOURCE_EXHAUSTED at
/// once; a silent stream is closed with DEADLINE_EXCEEDED after 5 s; and the
/// router serves on afterwards with nothing left open.
#[test]
fn b74_silent_streams_are_capped_and_closed() {
    let stack = Stack::start(&[
        "--parked-request-max",
        "2",
        "--extproc-max-requests",
        "3",
        "--extproc-max-streams",
        "3",
    ]);
    let mut silent: Vec<Stream> = (0..3).map(|_| stack.envoy.open()).collect();
    stack.eventually("three streams open", |s| {
        s.metrics().value("atenet_router_extproc_streams_active", &[]) == 3.0
    });
    let mut refused = stack.envoy.open();
    match block_on(refused.rx.next()) {
        Some(Err(grpcio::Error::RpcFailure(status))) => {
            assert_eq!(status.code(), grpcio::RpcStatusCode::RESOURCE_EXHAUSTED);
            assert!(status.message().contains("--extproc-max-streams"), "{}", status.message());
        }
        other => panic!("a fourth stream is refused, got {other:?}"),
    }
    assert_eq!(stack.metrics().value("atenet_router_extproc_streams_refused_total", &[]), 1.0);
    for stream in &mut silent {
        match block_on(stream.rx.next()) {
            Some(Err(grpcio::Error::RpcFailure(status))) => {
                assert_eq!(status.code(), grpcio::RpcStatusCode::DEADLINE_EXCEEDED, "{}", status.message())
            }
            other => panic!("a silent stream is closed by the router, got {other:?}"),
        }
    }
    assert_eq!(stack.metrics().value("atenet_router_extproc_streams_silent_closed_total", &[]), 3.0);
    still_serving(&stack);
}
