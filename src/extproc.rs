//! The ext_proc service: one task per Envoy stream (B1-B13).
//!
//! Each stream is a future spawned on a grpcio completion-queue thread. It
//! answers every message Envoy sends with exactly one reply of the matching
//! kind (B9); a `request_headers` message is resolved to a routing verdict.
//! While a request waits for its actor, the task also watches its own stream:
//! an error there means the client (or Envoy) went away, and dropping the
//! wait frees the request's lot slot at once (B27, B28).

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use futures::future::{select, Either};
use futures::{Sink, SinkExt, StreamExt};
use grpcio::{Deadline, DuplexSink, RequestStream, RpcContext, Service, ServiceBuilder, WriteFlags};
use protobuf::well_known_types::struct_::{Struct, Value};
use protobuf::well_known_types::wrappers::BoolValue;
use protobuf::MessageField;

use crate::flight::FlightEvent;
use crate::metrics::Metrics;
use crate::proto::base::{
    header_value_option::HeaderAppendAction, HeaderMap, HeaderValue, HeaderValueOption,
};
use crate::proto::external_processor::{
    processing_request, BodyResponse, CommonResponse, HeaderMutation, HeadersResponse, HttpHeaders,
    ImmediateResponse, ProcessingRequest, ProcessingResponse, TrailersResponse,
};
use crate::proto::http_status::HttpStatus;
use crate::proto::EXT_PROC_PROCESS;
use crate::resolver::{Abandon, Resolver, ResumeLabel};
use crate::status::{RecentRequest, RecentRequests};
use crate::target::{self, ACTOR_HEADER};
use crate::verdict::{self, Rejection, Verdict};

/// The dynamic-metadata namespace Envoy's ORIGINAL_DST cluster reads (B7).
pub const ORIGINAL_DST_NAMESPACE: &str = "envoy.filters.listener.original_dst";

/// Serves ext_proc streams.
pub struct ExtProc {
    resolver: Resolver,
    metrics: Metrics,
    worker_port: u16,
    /// Sent once per stream as `override_message_timeout` when its flight
    /// goes into overtime; zero disables.
    late_serve_limit: Duration,
    /// Cleared when a drain starts.
    ready: Arc<AtomicBool>,
    recent: Arc<RecentRequests>,
}

/// Settings of the ext_proc service.
pub struct ExtProcSettings {
    pub worker_port: u16,
    pub late_serve_limit: Duration,
    pub ready: Arc<AtomicBool>,
    pub recent: Arc<RecentRequests>,
}

impl ExtProc {
    pub fn new(resolver: Resolver, metrics: Metrics, settings: ExtProcSettings) -> Arc<ExtProc> {
        Arc::new(ExtProc {
            resolver,
            metrics,
            worker_port: settings.worker_port,
            late_serve_limit: settings.late_serve_limit,
            ready: settings.ready,
            recent: settings.recent,
        })
    }

    /// The grpcio service to register on a server.
    pub fn service(self: &Arc<Self>) -> Service {
        let this = Arc::clone(self);
        ServiceBuilder::new()
            .add_duplex_streaming_handler(&EXT_PROC_PROCESS, move |ctx: RpcContext<'_>, stream, sink| {
                let this = Arc::clone(&this);
                let deadline = ctx.deadline();
                ctx.spawn(async move { this.serve(stream, sink, deadline).await });
            })
            .build()
    }

    async fn serve(
        &self,
        mut stream: RequestStream<ProcessingRequest>,
        mut sink: DuplexSink<ProcessingResponse>,
        deadline: Deadline,
    ) {
        self.metrics.streams_active.inc();
        let _open = StreamGauge(&self.metrics);
        let mut incoming = Incoming { stream: &mut stream, backlog: VecDeque::new(), closed: false };
        while let Some(request) = incoming.next().await {
            let Some(request) = request else {
                // Envoy resets the stream after the exchange: normal end.
                return;
            };
            let observe_only = request.observability_mode;
            let reply = match request.request {
                Some(processing_request::Request::RequestHeaders(headers)) => {
                    let attributes = request.attributes;
                    match self.route(&headers, &attributes, &mut incoming, &mut sink, deadline).await {
                        Some(reply) => reply,
                        None => return,
                    }
                }
                Some(other) => empty_reply(&other),
                None => {
                    crate::debug!("ext_proc message with no known request kind; ignored");
                    continue;
                }
            };
            // In observability mode Envoy does not read replies (wire.md).
            if observe_only {
                continue;
            }
            if sink.send((reply, WriteFlags::default())).await.is_err() {
                return;
            }
        }
        let _ = sink.close().await;
    }

    /// Resolves one request_headers message to its reply; `None` when the
    /// stream ended first.
    async fn route(
        &self,
        headers: &HttpHeaders,
        attributes: &target::Attributes,
        incoming: &mut Incoming<'_>,
        sink: &mut DuplexSink<ProcessingResponse>,
        deadline: Deadline,
    ) -> Option<ProcessingResponse> {
        let received = Instant::now();
        let empty = Default::default();
        let header_map = headers.headers.as_ref().unwrap_or(&empty);
        let target = match target::resolve(header_map, attributes) {
            Ok(target) => target,
            Err(_) => {
                let (verdict, label) = verdict::invalid_target();
                self.finish(header_map, "", &verdict, received, label, ResumeLabel::Unknown);
                return Some(response_for(&verdict));
            }
        };
        let mut resolving = self.resolver.resolve(&target.actor);
        let mut override_pending = !self.late_serve_limit.is_zero();
        let outcome = loop {
            let watch = async {
                if incoming.closed {
                    Gone { sink: &mut *sink }.await;
                    return Wake::Gone;
                }
                match select(incoming.stream.next(), Gone { sink: &mut *sink }).await {
                    Either::Left((message, _)) => Wake::Message(message),
                    Either::Right(((), _)) => Wake::Gone,
                }
            };
            let overtime_wait = override_pending.then(|| resolving.overtime());
            let overtime = async {
                if let Some(wait) = overtime_wait {
                    if let FlightEvent::Overtime = wait.await {
                        return Wake::Overtime;
                    }
                }
                futures::future::pending().await
            };
            let wake = match select(&mut resolving, select(Box::pin(watch), Box::pin(overtime))).await {
                Either::Left((outcome, _)) => break outcome,
                Either::Right((Either::Left((wake, _)) | Either::Right((wake, _)), _)) => wake,
            };
            match wake {
                // Envoy may send more before our reply; answer it afterwards.
                Wake::Message(Some(Ok(message))) => incoming.backlog.push_back(message),
                // End of the request stream: a half-close, or the read side of
                // a cancel. Only the call's end tells them apart.
                Wake::Message(None) => incoming.closed = true,
                Wake::Overtime => {
                    override_pending = false;
                    let extend = override_timeout(self.late_serve_limit);
                    if sink.send((extend, WriteFlags::default())).await.is_err() {
                        crate::debug!("stream for {} ended before the late-serve override", target.actor);
                    }
                }
                Wake::Message(Some(Err(_))) | Wake::Gone => {
                    let (reason, label) = if deadline.exceeded() {
                        (Abandon::Timeout, "timeout")
                    } else {
                        (Abandon::Canceled, "cancelled")
                    };
                    crate::debug!("stream for {} ended while waiting ({label})", target.actor);
                    resolving.abandon(reason);
                    self.observe(received, label, ResumeLabel::Unknown);
                    return None;
                }
            }
        };
        let retry_after = self.resolver.lot().map_or(1, |lot| lot.retry_after());
        let (verdict, label) = verdict::for_outcome(&target, &outcome, self.worker_port, retry_after);
        if let (Verdict::Reject(r), Err(e)) = (&verdict, &outcome.result) {
            if r.status >= 500 && r.status != 503 {
                crate::warn!("actor {}: {} ({e:?})", target.actor, r.body);
            } else {
                crate::debug!("actor {}: {} ({e:?})", target.actor, r.body);
            }
        }
        self.finish(header_map, target.actor.as_str(), &verdict, received, label, outcome.resume);
        Some(response_for(&verdict))
    }

    /// Records a verdict: route metric, drain count, recent requests.
    fn finish(
        &self,
        headers: &HeaderMap,
        actor: &str,
        verdict: &Verdict,
        received: Instant,
        label: &str,
        resume: ResumeLabel,
    ) {
        self.observe(received, label, resume);
        if !self.ready.load(Ordering::Acquire) {
            self.metrics.drain_verdicts.inc();
        }
        let (summary, worker) = match verdict {
            Verdict::Route { worker, .. } => ("200 routed".to_string(), worker.clone()),
            Verdict::Reject(r) => (format!("{} {}", r.status, r.reason), String::new()),
        };
        self.recent.record(RecentRequest::new(
            target::header(headers, ":method").unwrap_or_default(),
            target::header(headers, ":path").unwrap_or_default(),
            actor,
            summary,
            worker,
            received.elapsed(),
        ));
    }

    fn observe(&self, received: Instant, outcome: &str, resume: ResumeLabel) {
        self.metrics.observe_route(outcome, resume.as_str(), received.elapsed().as_secs_f64());
    }
}

/// What interrupted a request's wait.
enum Wake {
    Message(Option<grpcio::Result<ProcessingRequest>>),
    Gone,
    Overtime,
}

/// Keeps `atenet_router_extproc_streams_active` exact however a stream ends.
struct StreamGauge<'a>(&'a Metrics);

impl Drop for StreamGauge<'_> {
    fn drop(&mut self) {
        self.0.streams_active.dec();
    }
}

/// `override_message_timeout`: asks Envoy to keep waiting `limit` for the
/// real verdict of a request whose flight runs past its budget.
fn override_timeout(limit: Duration) -> ProcessingResponse {
    let mut timeout = protobuf::well_known_types::duration::Duration::new();
    timeout.seconds = limit.as_secs() as i64;
    timeout.nanos = limit.subsec_nanos() as i32;
    let mut reply = ProcessingResponse::new();
    reply.override_message_timeout = MessageField::some(timeout);
    reply
}

/// Completes when the call is over from the server's side: cancelled by the
/// client or Envoy, or past its deadline.
///
/// grpcio reports a cancel on the read side only as the end of the request
/// stream, the same as a half-close. Its sink, though, checks the call's
/// close-on-server operation before anything else in `poll_ready`, fails
/// with `RemoteStopped` once the call is finished, and otherwise leaves this
/// task's waker registered on that operation; so polling `poll_ready` is a
/// precise, allocation-free cancel signal. Relies on grpcio 0.13's sink, which
/// `tests/parking.rs` (B27) exercises.
struct Gone<'a> {
    sink: &'a mut DuplexSink<ProcessingResponse>,
}

impl Future for Gone<'_> {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        match Pin::new(&mut *self.sink).poll_ready(cx) {
            Poll::Ready(Err(_)) => Poll::Ready(()),
            _ => Poll::Pending,
        }
    }
}

/// The stream's messages, with those that arrived while a request waited.
struct Incoming<'a> {
    stream: &'a mut RequestStream<ProcessingRequest>,
    backlog: VecDeque<ProcessingRequest>,
    closed: bool,
}

impl Incoming<'_> {
    /// The next message: `None` at the end of the stream, `Some(None)` when
    /// the stream failed.
    async fn next(&mut self) -> Option<Option<ProcessingRequest>> {
        if let Some(message) = self.backlog.pop_front() {
            return Some(Some(message));
        }
        if self.closed {
            return None;
        }
        match self.stream.next().await {
            Some(Ok(message)) => Some(Some(message)),
            Some(Err(_)) => Some(None),
            None => {
                self.closed = true;
                None
            }
        }
    }
}

/// The empty reply of the matching kind for a message other than
/// request_headers (B9).
fn empty_reply(request: &processing_request::Request) -> ProcessingResponse {
    use crate::proto::external_processor::processing_response::Response;
    use processing_request::Request;
    let response = match request {
        Request::RequestHeaders(_) => Response::RequestHeaders(HeadersResponse::new()),
        Request::ResponseHeaders(_) => Response::ResponseHeaders(HeadersResponse::new()),
        Request::RequestBody(_) => Response::RequestBody(BodyResponse::new()),
        Request::ResponseBody(_) => Response::ResponseBody(BodyResponse::new()),
        Request::RequestTrailers(_) => Response::RequestTrailers(TrailersResponse::new()),
        Request::ResponseTrailers(_) => Response::ResponseTrailers(TrailersResponse::new()),
    };
    let mut reply = ProcessingResponse::new();
    reply.response = Some(response);
    reply
}

/// The wire form of a verdict (B6, B7, B10).
pub fn response_for(verdict: &Verdict) -> ProcessingResponse {
    match verdict {
        Verdict::Route { actor, worker, target_port } => {
            let mut mutation = HeaderMutation::new();
            mutation.set_headers.push(overwrite(ACTOR_HEADER, actor.as_str()));
            let mut common = CommonResponse::new();
            common.header_mutation = MessageField::some(mutation);
            let mut headers = HeadersResponse::new();
            headers.response = MessageField::some(common);

            let mut original_dst = Struct::new();
            original_dst.fields.insert("local".into(), string_value(worker));
            original_dst.fields.insert("port".into(), string_value(&target_port.to_string()));
            let mut namespace = Value::new();
            namespace.set_struct_value(original_dst);
            let mut metadata = Struct::new();
            metadata.fields.insert(ORIGINAL_DST_NAMESPACE.into(), namespace);

            let mut reply = ProcessingResponse::new();
            reply.set_request_headers(headers);
            reply.dynamic_metadata = MessageField::some(metadata);
            reply
        }
        Verdict::Reject(rejection) => immediate(rejection),
    }
}

fn immediate(rejection: &Rejection) -> ProcessingResponse {
    let mut headers = HeaderMutation::new();
    headers.set_headers.push(overwrite("content-type", "text/plain"));
    headers.set_headers.push(overwrite("x-atenet-reason", rejection.reason));
    if let Some(seconds) = rejection.retry_after {
        headers.set_headers.push(overwrite("retry-after", &seconds.to_string()));
    }
    let mut status = HttpStatus::new();
    status.code = protobuf::EnumOrUnknown::from_i32(i32::from(rejection.status));
    let mut response = ImmediateResponse::new();
    response.status = MessageField::some(status);
    response.headers = MessageField::some(headers);
    response.body = rejection.body.clone().into_bytes();
    response.details = rejection.reason.to_string();
    let mut reply = ProcessingResponse::new();
    reply.set_immediate_response(response);
    reply
}

/// A header set as `raw_value` only, replacing any existing value (B6):
/// `append` unset, which Envoy reads as overwrite, and `append_action`
/// OVERWRITE_IF_EXISTS_OR_ADD for processors that read that instead.
fn overwrite(key: &str, value: &str) -> HeaderValueOption {
    let mut header = HeaderValue::new();
    header.key = key.to_string();
    header.raw_value = value.as_bytes().to_vec();
    let mut option = HeaderValueOption::new();
    option.header = MessageField::some(header);
    option.append = MessageField::<BoolValue>::none();
    option.append_action = HeaderAppendAction::OVERWRITE_IF_EXISTS_OR_ADD.into();
    option
}

fn string_value(s: &str) -> Value {
    let mut value = Value::new();
    value.set_string_value(s.to_string());
    value
}

#[cfg(test)]
mod tests {
    use super::*;
    use protobuf::Message;

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    #[test]
    fn golden_vectors_from_wire_md() {
        let mut r = ProcessingResponse::new();
        let mut ir = ImmediateResponse::new();
        let mut st = HttpStatus::new();
        st.code = protobuf::EnumOrUnknown::from_i32(503);
        ir.status = MessageField::some(st);
        ir.body = b"x".to_vec();
        r.set_immediate_response(ir);
        assert_eq!(hex(&r.write_to_bytes().unwrap()), "3a080a0308f7031a0178");

        let mut h = HeaderValue::new();
        h.key = "x-backend-addr".into();
        h.raw_value = b"127.0.0.1:8081".to_vec();
        let mut opt = HeaderValueOption::new();
        opt.header = MessageField::some(h);
        let mut m = HeaderMutation::new();
        m.set_headers.push(opt);
        let mut c = CommonResponse::new();
        c.header_mutation = MessageField::some(m);
        let mut hr = HeadersResponse::new();
        hr.response = MessageField::some(c);
        let mut r = ProcessingResponse::new();
        r.set_request_headers(hr);
        assert_eq!(
            hex(&r.write_to_bytes().unwrap()),
            "0a280a2612240a220a200a0e782d6261636b656e642d616464721a0e3132372e302e302e313a38303831"
        );

        let b9 = |kind: processing_request::Request| hex(&empty_reply(&kind).write_to_bytes().unwrap());
        assert_eq!(b9(processing_request::Request::RequestHeaders(HttpHeaders::new())), "0a00");
        assert_eq!(b9(processing_request::Request::ResponseHeaders(HttpHeaders::new())), "1200");

        let mut r = ProcessingResponse::new();
        let mut d = protobuf::well_known_types::duration::Duration::new();
        d.seconds = 2;
        r.override_message_timeout = MessageField::some(d);
        assert_eq!(hex(&r.write_to_bytes().unwrap()), "52020802");
    }

    #[test]
    fn decodes_envoy_request_vector() {
        let bytes: Vec<u8> = (0..)
            .step_by(2)
            .take_while(|&i| i < ENVOY_REQUEST.len())
            .map(|i| u8::from_str_radix(&ENVOY_REQUEST[i..i + 2], 16).unwrap())
            .collect();
        let request = ProcessingRequest::parse_from_bytes(&bytes).unwrap();
        let headers = request.request_headers().headers.clone().unwrap();
        assert_eq!(target::header(&headers, ":path"), Some(&b"/api/v1/items?x=1"[..]));
        assert!(request.request_headers().end_of_stream);
        assert!(request.metadata_context.is_some());
    }

    const ENVOY_REQUEST: &str = "12740a700a190a0a3a617574686f726974791a0b6578616d706c652e636f6d0a1a0a053a706174681a112f6170692f76312f6974656d733f783d310a0e0a073a6d6574686f641a034745540a0f0a073a736368656d651a04687474700a160a0a757365722d6167656e741a086375726c2f382e3018014200";
}
