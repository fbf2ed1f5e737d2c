//! Malformed OTLP collector answers (B133), through the real binary against
//! a raw HTTP/2 peer as the collector: an OK status without a message
//! (trailers only, or headers then trailers), a length prefix longer than
//! its message, two messages. Each fails its export, whose spans are counted
//! as dropped (B124), and the router serves on. Truth is the calls the
//! collector saw and the router process itself: grpcio's blocking unary
//! call panicked on the first two, and B59 aborted the router.

// The router's internals: `--features testkit` (make test).
#![cfg(feature = "testkit")]

use crate::common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::h2peer::{running, Answer, H2Peer};
use common::process::{router_args, spawn_router, terminate, RouterProcess};
use common::{http_get, routed, Metrics, PATIENCE};

use atenet_router::proto::EXT_PROC_PROCESS;
use atenet_router::tools::load::headers_request;
use atenet_router::trace::context::TRACEPARENT;
use futures::{SinkExt, StreamExt};
use grpcio::{CallOption, ChannelBuilder, Client, EnvBuilder, MetadataBuilder, WriteFlags};

/// Routes `actor` on a stream whose metadata carries a sampled
/// `traceparent`, as Envoy's ext_proc filter sends it: the router exports
/// the request's spans.
fn traced_route(client: &Client, actor: &str) {
    let mut headers = MetadataBuilder::new();
    headers.add_str(TRACEPARENT, "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01").unwrap();
    let options = CallOption::default().headers(headers.build()).timeout(PATIENCE);
    let reply = futures::executor::block_on(async {
        let (mut tx, mut rx) = client.duplex_streaming(&EXT_PROC_PROCESS, options).unwrap();
        tx.send((headers_request(&[("ate-target-actor", actor)]), WriteFlags::default())).await.unwrap();
        loop {
            let reply = rx.next().await.expect("a reply").expect("the stream is open");
            if reply.response.is_some() {
                return reply;
            }
        }
    });
    let (_, worker, _) = routed(&reply);
    assert!(worker.starts_with("10.0.0.7:"), "{actor} routed to {worker}");
}

fn dropped(router: &RouterProcess) -> f64 {
    Metrics(http_get(router.metrics, "/metrics").1).value("atenet_router_trace_spans_dropped_total", &[])
}

/// Waits until the collector has had `calls` exports, the router still
/// running meanwhile.
fn exported(router: &mut RouterProcess, collector: &H2Peer, calls: usize, what: &str) {
    let deadline = Instant::now() + PATIENCE;
    while collector.calls() < calls {
        if let Some(status) = router.process.child.try_wait().unwrap() {
            panic!("{what}: the router died on the collector's answer: {status}");
        }
        assert!(Instant::now() < deadline, "{what}: no export reached the collector");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn b133_a_collector_answer_that_breaks_the_unary_protocol_fails_its_export_and_the_router_serves_on() {
    let ateapi = H2Peer::start(Answer::Message(running()));
    // An empty ExportTraceServiceResponse is a message of no bytes.
    let collector = H2Peer::start(Answer::Message(Vec::new()));
    let address = collector.addr.to_string();
    let mut router =
        spawn_router(&router_args(&ateapi.addr.to_string(), &["--otlp-traces-address", &address]));
    let env = Arc::new(EnvBuilder::new().cq_count(1).build());
    let client = Client::new(ChannelBuilder::new(env).connect(&router.extproc.to_string()));
    // A valid answer: the export succeeds, nothing is dropped.
    traced_route(&client, "demo/valid");
    exported(&mut router, &collector, 1, "a valid answer");
    for (i, answer) in [
        Answer::OkWithoutMessage,
        Answer::HeadersThenOk,
        Answer::ShortMessage,
        Answer::TwoMessages(Vec::new()),
    ]
    .into_iter()
    .enumerate()
    {
        let what = format!("{answer:?}");
        let before = dropped(&router);
        collector.set_default(answer);
        let calls = collector.calls();
        traced_route(&client, &format!("demo/broken-{i}"));
        exported(&mut router, &collector, calls + 1, &what);
        // The failed export is counted once its answer is read.
        let deadline = Instant::now() + PATIENCE;
        loop {
            if let Some(status) = router.process.child.try_wait().unwrap() {
                panic!("{what}: the router died on the collector's answer: {status}");
            }
            if dropped(&router) > before {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{what}: the failed export's spans were not counted as dropped"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        // And the router serves on; its spans are exported before the next
        // answer is set, so that each broken answer meets its own export.
        collector.set_default(Answer::Message(Vec::new()));
        let calls = collector.calls();
        traced_route(&client, &format!("demo/after-{i}"));
        exported(&mut router, &collector, calls + 1, "a valid answer after it");
    }
    assert_eq!(terminate(&mut router.process.child), 0, "the router drains and exits cleanly");
}
