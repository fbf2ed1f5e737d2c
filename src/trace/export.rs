//! The exporter: one thread that takes spans off the queue and sends them
//! to the collector over OTLP/gRPC, in batches of [`BATCH`] spans or every
//! [`INTERVAL`], whichever comes first (B124).
//!
//! A request never waits for it: spans are queued with `try_send`, and an
//! export that fails or times out ([`EXPORT_TIMEOUT`]) only costs the
//! batch, counted as dropped. A collector that never answers thus makes the
//! queue fill and the spans beyond it drop, nothing more, and one whose
//! answer breaks gRPC's unary protocol fails its export (B133). No async
//! runtime: this thread blocks on the call, read by `unary`.

use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crossbeam_channel::{Receiver, RecvTimeoutError};
use grpcio::{CallOption, ChannelBuilder, Client, EnvBuilder};
use prometheus::IntCounter;
use protobuf::MessageField;

use crate::proto::common::{any_value, AnyValue, InstrumentationScope, KeyValue};
use crate::proto::resource::Resource;
use crate::proto::trace::{span, status, ResourceSpans, ScopeSpans, Span as OtlpSpan, Status};
use crate::proto::trace_service::ExportTraceServiceRequest;
use crate::proto::OTLP_TRACE_EXPORT;
use crate::trace::span::{Kind, Span, Value};
use crate::unary::{self, Failure};

/// Spans the queue holds before it drops (B124): a few seconds of a busy
/// router's sampled requests.
pub const QUEUE: usize = 8192;
/// Spans per export at most.
pub const BATCH: usize = 512;
/// A batch goes out at least this often when it has spans.
pub const INTERVAL: Duration = Duration::from_secs(1);
/// How long one export may take before its batch is given up.
pub const EXPORT_TIMEOUT: Duration = Duration::from_secs(2);

/// How often, at most, a failing collector is logged.
const WARN_INTERVAL: Duration = Duration::from_secs(60);

/// Starts the exporter thread, sending to `address` (`HOST:PORT`,
/// plaintext) the spans from `spans` as service `atenet-router` at
/// `version`; `dropped` counts the spans of batches that failed. The thread
/// ends when every [`crate::trace::span::Tracer`] is gone.
pub fn start(
    address: &str,
    version: &str,
    spans: Receiver<Span>,
    dropped: IntCounter,
) -> std::io::Result<JoinHandle<()>> {
    // Its own completion queue: the exporter never runs on, or waits
    // behind, the threads that serve ext_proc streams.
    let env = Arc::new(EnvBuilder::new().cq_count(1).name_prefix("atenet-otlp").build());
    let client = Client::new(ChannelBuilder::new(env).connect(address));
    let resource = resource(version);
    let address = address.to_string();
    std::thread::Builder::new().name("atenet-otlp".into()).spawn(move || {
        let mut warned: Option<Instant> = None;
        while let Some(batch) = next_batch(&spans, BATCH, INTERVAL) {
            let count = batch.len() as u64;
            let request = to_request(&resource, batch);
            if let Err(e) = export(&client, &request) {
                dropped.inc_by(count);
                if warned.is_none_or(|at| at.elapsed() >= WARN_INTERVAL) {
                    warned = Some(Instant::now());
                    log::warn!("exporting {count} spans to the OTLP collector at {address} failed: {e}");
                }
            }
        }
    })
}

/// One export, answered within [`EXPORT_TIMEOUT`]. Sent as a
/// server-streaming call, the same call on the wire, and read by `unary`:
/// grpcio's blocking unary call panics on an OK status without a message
/// (B133).
fn export(client: &Client, request: &ExportTraceServiceRequest) -> Result<(), Failure> {
    let options = CallOption::default().timeout(EXPORT_TIMEOUT);
    let answer = client.server_streaming(&OTLP_TRACE_EXPORT, request, options).map_err(Failure::Grpc)?;
    futures::executor::block_on(unary::answer(answer)).map(drop)
}

/// The next batch: once `size` spans are in, or `interval` after the first
/// one came; `None` once the queue is closed and empty.
pub fn next_batch(spans: &Receiver<Span>, size: usize, interval: Duration) -> Option<Vec<Span>> {
    let first = spans.recv().ok()?;
    let due = Instant::now() + interval;
    let mut batch = Vec::with_capacity(size);
    batch.push(first);
    while batch.len() < size {
        match spans.recv_deadline(due) {
            Ok(span) => batch.push(span),
            Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => break,
        }
    }
    Some(batch)
}

/// The router's resource: `service.name` and `service.version`.
fn resource(version: &str) -> Resource {
    let mut resource = Resource::new();
    resource.attributes = vec![
        key_value("service.name", &Value::Str("atenet-router".into())),
        key_value("service.version", &Value::Str(version.to_string())),
    ];
    resource
}

/// One OTLP export of `spans`.
pub fn to_request(resource: &Resource, spans: Vec<Span>) -> ExportTraceServiceRequest {
    let mut scope = ScopeSpans::new();
    let mut name = InstrumentationScope::new();
    name.name = "atenet-router".into();
    scope.scope = MessageField::some(name);
    scope.spans = spans.into_iter().map(otlp_span).collect();
    let mut resource_spans = ResourceSpans::new();
    resource_spans.resource = MessageField::some(resource.clone());
    resource_spans.scope_spans = vec![scope];
    let mut request = ExportTraceServiceRequest::new();
    request.resource_spans = vec![resource_spans];
    request
}

fn otlp_span(span: Span) -> OtlpSpan {
    let mut out = OtlpSpan::new();
    out.trace_id = span.context.trace_id.to_vec();
    out.span_id = span.context.span_id.to_vec();
    out.parent_span_id = span.parent.to_vec();
    out.trace_state = span.tracestate;
    out.name = span.name.to_string();
    out.kind = match span.kind {
        Kind::Internal => span::SpanKind::SPAN_KIND_INTERNAL,
        Kind::Server => span::SpanKind::SPAN_KIND_SERVER,
        Kind::Client => span::SpanKind::SPAN_KIND_CLIENT,
    }
    .into();
    // The W3C sampled flag, and "the parent's remoteness is known" (bit 8)
    // with the parent local or not (bit 9): only the route span's parent,
    // Envoy's, is remote.
    out.flags = 0x1 | 0x100 | if span.kind == Kind::Server { 0x200 } else { 0 };
    out.start_time_unix_nano = unix_nanos(span.start);
    out.end_time_unix_nano = unix_nanos(span.end);
    out.attributes = span.attributes.iter().map(|(k, v)| key_value(k, v)).collect();
    out.links = span
        .links
        .iter()
        .map(|context| {
            let mut link = span::Link::new();
            link.trace_id = context.trace_id.to_vec();
            link.span_id = context.span_id.to_vec();
            link.flags = 0x1 | 0x100;
            link
        })
        .collect();
    if span.error {
        let mut status = Status::new();
        status.code = status::StatusCode::STATUS_CODE_ERROR.into();
        out.status = MessageField::some(status);
    }
    out
}

fn key_value(key: &str, value: &Value) -> KeyValue {
    let mut any = AnyValue::new();
    any.value = Some(match value {
        Value::Str(s) => any_value::Value::StringValue(s.clone()),
        Value::Bool(b) => any_value::Value::BoolValue(*b),
        Value::Int(i) => any_value::Value::IntValue(*i),
    });
    let mut kv = KeyValue::new();
    kv.key = key.to_string();
    kv.value = MessageField::some(any);
    kv
}

fn unix_nanos(at: SystemTime) -> u64 {
    at.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::span::tests::{envoy_parent, tracer};
    use crate::trace::span::{RouteEnd, RouteTrace};

    fn route(tracer: &crate::trace::span::Tracer) {
        RouteTrace::new(tracer.clone(), envoy_parent()).end(RouteEnd {
            actor: "a/b",
            parked: true,
            outcome: "ok",
            rejected: None,
            flight: None,
            elapsed: Duration::ZERO,
        });
    }

    #[test]
    fn b124_batches_by_size_then_by_time_and_end_with_the_queue() {
        let (tracer, spans, _) = tracer(16);
        for _ in 0..5 {
            route(&tracer);
        }
        assert_eq!(next_batch(&spans, 2, Duration::from_secs(3600)).unwrap().len(), 2);
        assert_eq!(next_batch(&spans, 2, Duration::from_secs(3600)).unwrap().len(), 2);
        // One span left and none coming: it goes out when its time is up.
        assert_eq!(next_batch(&spans, 2, Duration::from_millis(1)).unwrap().len(), 1);
        route(&tracer);
        drop(tracer);
        assert_eq!(next_batch(&spans, 2, Duration::from_secs(3600)).unwrap().len(), 1, "flushed at the end");
        assert!(next_batch(&spans, 2, Duration::from_secs(3600)).is_none());
    }

    #[test]
    fn b121_spans_become_otlp_with_the_routers_resource() {
        let (tracer, spans, _) = tracer(4);
        route(&tracer);
        let request = to_request(&resource("1.2.3"), spans.try_iter().collect());
        let resource_spans = &request.resource_spans[0];
        let attributes: Vec<(&str, &AnyValue)> =
            resource_spans.resource.attributes.iter().map(|kv| (kv.key.as_str(), &*kv.value)).collect();
        assert_eq!(attributes[0].0, "service.name");
        assert_eq!(attributes[0].1.string_value(), "atenet-router");
        assert_eq!(attributes[1].1.string_value(), "1.2.3");
        let span = &resource_spans.scope_spans[0].spans[0];
        assert_eq!(span.name, "atenet.route");
        assert_eq!(span.trace_id, envoy_parent().context.trace_id);
        assert_eq!(span.parent_span_id, envoy_parent().context.span_id);
        assert_eq!(span.kind.enum_value(), Ok(span::SpanKind::SPAN_KIND_SERVER));
        let parked = span.attributes.iter().find(|kv| kv.key == "atenet.parked").unwrap();
        assert!(parked.value.bool_value());
        assert!(span.status.is_none());
    }
}
