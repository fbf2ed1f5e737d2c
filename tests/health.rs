//! gRPC's health service on the ext_proc port (B84), over real gRPC: what
//! `Check` answers, that it costs no ext_proc stream slot and counts as no
//! request, and that a drain flips it while a hand-over does not.
// The router's internals and the simulator: `--features testkit` (make test).
#![cfg(feature = "testkit")]

use crate::common;

use std::net::SocketAddr;
use std::sync::Arc;

use atenet_router::actor::resume::Code;
use atenet_router::proto::health::health_check_response::ServingStatus;
use atenet_router::proto::health::{HealthCheckRequest, HealthCheckResponse};
use atenet_router::proto::HEALTH_CHECK;
use atenet_router::tools::sim::Answer;
use common::*;
use futures::StreamExt;
use grpcio::{CallOption, ChannelBuilder, Client, EnvBuilder, Marshaller, Method, MethodType, RpcStatusCode};

/// A health client on a connection of its own, as Envoy's health checker has.
fn health_client(addr: SocketAddr) -> Client {
    let env = Arc::new(EnvBuilder::new().cq_count(1).name_prefix("test-health").build());
    Client::new(ChannelBuilder::new(env).connect(&addr.to_string()))
}

/// `Check(service)`: the status, or the call's failure code.
fn check(client: &Client, service: &str) -> Result<ServingStatus, RpcStatusCode> {
    let mut request = HealthCheckRequest::new();
    request.service = service.into();
    match client.unary_call(&HEALTH_CHECK, &request, CallOption::default().timeout(PATIENCE)) {
        Ok(response) => Ok(response.status.enum_value().expect("a known status")),
        Err(grpcio::Error::RpcFailure(status)) => Err(status.code()),
        Err(e) => panic!("Check failed outside gRPC: {e}"),
    }
}

/// The protocol's streaming method, which the router does not serve.
const HEALTH_WATCH: Method<HealthCheckRequest, HealthCheckResponse> = Method {
    ty: MethodType::ServerStreaming,
    name: "/grpc.health.v1.Health/Watch",
    req_mar: Marshaller { ser: grpcio::pb_ser, de: grpcio::pb_de },
    resp_mar: Marshaller { ser: grpcio::pb_ser, de: grpcio::pb_de },
};

#[test]
fn b84_check_says_serving_until_the_drain_and_not_found_for_other_services() {
    let stack = Stack::start(&[]);
    let client = health_client(stack.router().extproc_addr());
    assert_eq!(check(&client, ""), Ok(ServingStatus::SERVING));
    assert_eq!(check(&client, "envoy.service.ext_proc.v3.ExternalProcessor"), Ok(ServingStatus::SERVING));
    assert_eq!(check(&client, "ateapi.Control"), Err(RpcStatusCode::NOT_FOUND));
    let mut watch = client
        .server_streaming(&HEALTH_WATCH, &HealthCheckRequest::new(), CallOption::default().timeout(PATIENCE))
        .unwrap();
    match futures::executor::block_on(watch.next()) {
        Some(Err(grpcio::Error::RpcFailure(status))) => {
            assert_eq!(status.code(), RpcStatusCode::UNIMPLEMENTED)
        }
        other => panic!("Watch is not served: {other:?}"),
    }
    // What the drain does first (B43).
    stack.router().set_ready(false);
    assert_eq!(check(&client, ""), Ok(ServingStatus::NOT_SERVING));
    assert_eq!(
        check(&health_client(stack.router().extproc_addr()), "envoy.service.ext_proc.v3.ExternalProcessor"),
        Ok(ServingStatus::NOT_SERVING),
        "on a new connection too"
    );
    assert_eq!(
        routed(&{
            stack.sim.script("demo/a", vec![Answer::ok("10.0.0.1", true)]);
            stack.envoy.route_now("demo/a")
        })
        .1,
        "10.0.0.1:443",
        "ext_proc still serves while the drain delay runs"
    );
}

#[test]
fn b84_checks_take_no_stream_slot_and_count_as_no_request() {
    // Room for exactly one ext_proc stream (B74).
    let stack = Stack::start(&[
        "--parked-request-max",
        "1",
        "--extproc-max-requests",
        "1",
        "--extproc-max-streams",
        "1",
    ]);
    stack.sim.script(
        "demo/held",
        vec![Answer::error(Code::ResourceExhausted, "full").held(), Answer::ok("10.0.0.2", true)],
    );
    let envoy = stack.envoy.clone();
    let parked = std::thread::spawn(move || envoy.route_now("demo/held"));
    stack.wait_for_waiters("demo/held", 1);
    let client = health_client(stack.router().extproc_addr());
    for _ in 0..50 {
        assert_eq!(
            check(&client, ""),
            Ok(ServingStatus::SERVING),
            "a check is never refused for want of a slot"
        );
    }
    let metrics = stack.metrics();
    assert_eq!(metrics.value("atenet_router_extproc_streams_active", &[]), 1.0, "only the parked stream");
    assert_eq!(metrics.value("atenet_router_extproc_streams_refused_total", &[]), 0.0);
    assert_eq!(metrics.value("atenet_router_route_duration_seconds_count", &[]), 0.0, "no request counted");
    // And the one slot is the parked request's: a second stream is refused.
    let refused = futures::executor::block_on(async {
        let mut stream = stack.envoy.open();
        // The router may refuse the stream before this is even sent.
        let _ = futures::SinkExt::send(
            &mut stream.tx,
            (headers_request(&[("ate-target-actor", "demo/other")]), grpcio::WriteFlags::default()),
        )
        .await;
        stream.rx.next().await
    });
    assert!(
        matches!(&refused, Some(Err(grpcio::Error::RpcFailure(s))) if s.code() == RpcStatusCode::RESOURCE_EXHAUSTED),
        "{refused:?}"
    );
    assert_eq!(stack.sim.release("demo/held"), 1);
    assert_eq!(routed(&parked.join().unwrap()).1, "10.0.0.2:443");
}

#[test]
fn b84_a_hand_over_keeps_serving_while_the_predecessor_finishes() {
    let mut stack = Stack::start(&[]);
    stack.sim.script(
        "demo/held",
        vec![Answer::error(Code::ResourceExhausted, "full").held(), Answer::ok("10.0.0.2", true)],
    );
    let envoy = stack.envoy.clone();
    let parked = std::thread::spawn(move || envoy.route_now("demo/held"));
    stack.wait_for_waiters("demo/held", 1);
    let addr = stack.router().extproc_addr();
    let router = stack.router.take().unwrap();
    let health = Arc::clone(router.health());
    let resolver = router.resolver().clone();
    let handing_over =
        std::thread::spawn(move || router.hand_over(PATIENCE, &crossbeam_channel::never::<()>()));
    // The predecessor is stopping (no new stream is accepted) and still
    // holds the parked request.
    let deadline = std::time::Instant::now() + PATIENCE;
    while std::net::TcpStream::connect(addr).is_ok() {
        assert!(std::time::Instant::now() < deadline, "the predecessor stops listening");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert!(!resolver.flights().is_empty(), "the parked request is still held");
    assert_eq!(health.status(), ServingStatus::SERVING, "a hand-over is no drain: the port serves on");
    assert_eq!(stack.sim.release("demo/held"), 1);
    assert_eq!(routed(&parked.join().unwrap()).1, "10.0.0.2:443");
    assert_eq!(handing_over.join().unwrap(), (true, 0));
}
