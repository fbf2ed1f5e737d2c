//! The ext_proc service: one task per Envoy stream (B1-B13).
//!
//! Each stream is a future spawned on a grpcio completion-queue thread. It
//! answers every message Envoy sends before the verdict with exactly one
//! reply of the matching kind; a `request_headers` message is resolved
//! to a routing verdict.
//! While a request waits for its actor, the task also watches its own call:
//! when the client (or Envoy) resets it or its deadline passes, dropping the
//! wait frees the request's lot slot at once (B27, B28). A flight that runs
//! past its budget makes the task ask Envoy, once, to keep waiting for the
//! late verdict (`override_message_timeout`).
//!
//! The request_headers verdict is the stream's last message: the call's OK
//! status goes out right behind it and the task ends, rather than
//! reading on until Envoy resets the stream. That saves a read, a wake-up
//! and a status batch that would fail on the reset. Once the router stops,
//! Envoy ends each stream instead, so that gRPC never closes a connection
//! on a verdict Envoy has not read (`ending`).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use futures::future::{select, Either};
use futures::{Sink, SinkExt, StreamExt};
use grpcio::{
    Deadline, DuplexSink, RequestStream, RpcContext, RpcStatus, RpcStatusCode, Service, ServiceBuilder,
    WriteFlags,
};
use protobuf::well_known_types::struct_::{Struct, Value};
use protobuf::well_known_types::wrappers::BoolValue;
use protobuf::MessageField;

use crate::actor::resume::{BadWorkerIp, Resumed};
use crate::actor::target::{self, ActorId, Target, ACTOR_HEADER};
use crate::cli::config::CidrRange;
use crate::envoy::ending::{Ending, StreamEndings, ENVOY_END_PATIENCE};
use crate::envoy::streams::{StreamSlots, FIRST_MESSAGE_TIMEOUT};
use crate::envoy::verdict::{self, Rejection, RouteOutcome, Verdict};
use crate::parking::band::{self, Band, Priority};
use crate::parking::deadline::{self, CallerTimeout};
use crate::parking::flight::{FlightEvent, FlightWait};
use crate::parking::resolver::{Abandon, ResolveError, Resolver, ResumeLabel, ResumeOutcome};
use crate::parking::timer::{sleep_until, Scheduler, Sleep};
use crate::proto::base::{
    header_value_option::HeaderAppendAction, HeaderMap, HeaderValue, HeaderValueOption,
};
use crate::proto::external_processor::{
    processing_request, BodyResponse, CommonResponse, GrpcStatus, HeaderMutation, HeadersResponse,
    ImmediateResponse, ProcessingRequest, ProcessingResponse, TrailersResponse,
};
use crate::proto::http_status::HttpStatus;
use crate::proto::EXT_PROC_PROCESS;
use crate::telemetry::logging::Throttle;
use crate::telemetry::metrics::{AtespaceShare, Metrics};
use crate::telemetry::recent::{Answered, RecentRequests, RecentVerdict};
use crate::trace::context::parent_in;
use crate::trace::span::{FlightPlace, RouteEnd, RouteTrace, Tracer};

/// The dynamic-metadata namespace Envoy's ORIGINAL_DST cluster reads.
pub const ORIGINAL_DST_NAMESPACE: &str = "envoy.filters.listener.original_dst";

/// Serves ext_proc streams.
pub struct ExtProc {
    resolver: Resolver,
    metrics: Metrics,
    worker_port: u16,
    /// The networks workers are in; empty: any.
    worker_networks: Vec<CidrRange>,
    /// Sent once per stream as `override_message_timeout` when its flight
    /// goes into overtime; zero disables.
    late_serve_limit: Duration,
    /// Envoy's `message_timeout`: how long it waits for a verdict.
    message_timeout: Duration,
    /// Cleared when a drain starts.
    ready: Arc<AtomicBool>,
    recent: Arc<RecentRequests>,
    /// Whether callers' deadline headers are honoured.
    caller_deadlines: bool,
    streams: Arc<StreamSlots>,
    endings: Arc<StreamEndings>,
    scheduler: Arc<dyn Scheduler>,
    routing_failures: Throttle,
    resume_errors: Throttle,
    /// With `--otlp-traces-address` only.
    tracer: Option<Tracer>,
}

/// At most one warning per this interval for each kind of server-side
/// failure (routing failed, resume error or timeout).
pub const ERROR_LOG_INTERVAL: Duration = Duration::from_secs(10);

/// Settings of the ext_proc service.
pub struct ExtProcSettings {
    pub worker_port: u16,
    /// `--worker-networks`.
    pub worker_networks: Vec<CidrRange>,
    pub late_serve_limit: Duration,
    /// Envoy's `message_timeout`.
    pub message_timeout: Duration,
    pub ready: Arc<AtomicBool>,
    pub recent: Arc<RecentRequests>,
    pub caller_deadlines: bool,
    /// The open streams and their cap.
    pub streams: Arc<StreamSlots>,
    /// Who ends a stream after its verdict.
    pub endings: Arc<StreamEndings>,
    /// Closes silent streams.
    pub scheduler: Arc<dyn Scheduler>,
    /// Where route spans go, with `--otlp-traces-address`.
    pub tracer: Option<Tracer>,
}

/// The status of a stream refused at `--extproc-max-streams`.
const STREAMS_FULL: &str = "atenet-router: too many ext_proc streams open (--extproc-max-streams)";

impl ExtProc {
    pub fn new(resolver: Resolver, metrics: Metrics, settings: ExtProcSettings) -> Arc<ExtProc> {
        Arc::new(ExtProc {
            resolver,
            metrics,
            worker_port: settings.worker_port,
            worker_networks: settings.worker_networks,
            late_serve_limit: settings.late_serve_limit,
            message_timeout: settings.message_timeout,
            ready: settings.ready,
            recent: settings.recent,
            caller_deadlines: settings.caller_deadlines,
            streams: settings.streams,
            endings: settings.endings,
            scheduler: settings.scheduler,
            routing_failures: Throttle::new(ERROR_LOG_INTERVAL),
            resume_errors: Throttle::new(ERROR_LOG_INTERVAL),
            tracer: settings.tracer,
        })
    }

    /// The grpcio service to register on a server.
    pub fn service(self: &Arc<Self>) -> Service {
        let this = Arc::clone(self);
        ServiceBuilder::new()
            .add_duplex_streaming_handler(&EXT_PROC_PROCESS, move |ctx: RpcContext<'_>, stream, sink| {
                let deadline = ctx.deadline();
                let trace = this.tracer.as_ref().and_then(|tracer| route_trace(tracer, &ctx));
                ctx.spawn(Arc::clone(&this).serve(stream, sink, deadline, trace));
            })
            .build()
    }

    /// One stream's task. Written as a function returning an `async move`
    /// block rather than an `async fn` spawned through a wrapper: each layer
    /// of async would store the stream and sink again, and the task's size
    /// is paid once per parked request.
    #[allow(clippy::manual_async_fn, reason = "an async fn would store its arguments twice")]
    fn serve(
        self: Arc<Self>,
        mut stream: RequestStream<ProcessingRequest>,
        mut sink: DuplexSink<ProcessingResponse>,
        deadline: Deadline,
        mut trace: Option<Box<RouteTrace>>,
    ) -> impl Future<Output = ()> + Send + 'static {
        async move {
            // A stream reset before its task ran (a burst of resets queues
            // them) needs no slot: it is over.
            if Gone::now(&mut sink) {
                return;
            }
            let Some(mut slot) = self.streams.open() else {
                let full = RpcStatus::with_message(RpcStatusCode::RESOURCE_EXHAUSTED, STREAMS_FULL.into());
                let _ = sink.fail(full).await;
                return;
            };
            // Envoy's first message comes the moment it opens a stream; a
            // stream silent for longer is not Envoy's (B74).
            let mut silence =
                Some(sleep_until(Arc::clone(&self.scheduler), Instant::now() + FIRST_MESSAGE_TIMEOUT));
            loop {
                // None ends the request stream before any verdict: a
                // half-close, owed the call's status, or a reset, which
                // grpcio reports the same way. On a reset the status batch
                // fails inside gRPC core, about 1 % of a request's
                // instructions more than dropping the call (callgrind), so
                // both get it. Err is a read gRPC could not even start.
                let next = match silence.take() {
                    None => stream.next().await,
                    Some(silence) => match select(stream.next(), silence).await {
                        Either::Left((next, _)) => next,
                        Either::Right(_) => {
                            self.metrics.count_stream_silent_closed();
                            let why = format!(
                                "atenet-router: no message within {} of opening the stream",
                                crate::cli::godur::format(FIRST_MESSAGE_TIMEOUT)
                            );
                            let silent = RpcStatus::with_message(RpcStatusCode::DEADLINE_EXCEEDED, why);
                            let _ = sink.fail(silent).await;
                            return;
                        }
                    },
                };
                slot.spoke();
                let request = match next {
                    Some(Ok(request)) => request,
                    None => break,
                    Some(Err(_)) => return,
                };
                // In observability mode Envoy neither reads a reply nor waits
                // for one (wire.md): a verdict would change nothing, so no
                // actor is resumed for it either.
                if request.observability_mode {
                    continue;
                }
                // Two steps, so that no reply-sized value is held while a
                // request waits: every byte here is paid per parked request.
                let verdict = match self.prepare(request, &mut trace) {
                    Prepared::Reply(reply) => {
                        if send(&mut sink, reply).await.is_err() {
                            return;
                        }
                        continue;
                    }
                    Prepared::Ignore => continue,
                    Prepared::Verdict(verdict) => verdict,
                    Prepared::Route(pending) => match self.route(pending, &mut sink, deadline).await {
                        Some(verdict) => verdict,
                        None => return,
                    },
                };
                match self.endings.begin() {
                    // Nothing follows the verdict on this stream.
                    Ending::Close(closing) => {
                        let _ = verdict_then_status(sink, verdict).await;
                        drop(closing);
                    }
                    Ending::LetEnvoyEnd => {
                        if send(&mut sink, verdict).await.is_ok() {
                            self.await_envoy_end(&mut stream, &mut sink).await;
                            let _ = sink.fail(RpcStatus::ok()).await;
                        }
                    }
                }
                return;
            }
            let _ = Box::pin(sink.close()).await;
        }
    }

    /// Once the router stops, after a verdict (B104): until Envoy resets the
    /// stream (it does the moment it has the verdict), half-closes it, or
    /// sends another message (later phases configured), at most
    /// [`ENVOY_END_PATIENCE`]. Boxed, so that the stream's task is no larger
    /// for a wait only a stop takes.
    fn await_envoy_end<'a>(
        &self,
        stream: &'a mut RequestStream<ProcessingRequest>,
        sink: &'a mut DuplexSink<ProcessingResponse>,
    ) -> Pin<Box<dyn Future<Output = ()> + Send + 'a>> {
        let patience = sleep_until(Arc::clone(&self.scheduler), Instant::now() + ENVOY_END_PATIENCE);
        Box::pin(async move {
            let _ = select(select(stream.next(), Gone { sink }), patience).await;
        })
    }

    /// Everything about a message that needs no waiting: the empty reply of
    /// its kind, or the 404 for a bad target (B4), or the target to
    /// resolve. The message itself, headers included, is dropped here, so a
    /// parked request keeps only what its verdict and the status page need.
    fn prepare(&self, request: ProcessingRequest, trace: &mut Option<Box<RouteTrace>>) -> Prepared {
        let received = Instant::now();
        match classify(request) {
            Classified::Reply(reply) => Prepared::Reply(reply),
            Classified::Ignore => {
                log::debug!("ext_proc message with no known request kind; ignored");
                Prepared::Ignore
            }
            Classified::Route(target, line, timeout, protocol, priority) => {
                #[cfg(feature = "fault-injection")]
                if target.actor.as_str() == "fault-injection/panic" {
                    panic!("injected fault: a request for {}", target.actor);
                }
                if let Some(header) = timeout.malformed {
                    log::debug!(actor = target.actor.as_str(); "ignored a malformed {header} header");
                }
                // Only parsed here: only a parked caller's wait looks at it.
                let deadline =
                    timeout.timeout.filter(|_| self.caller_deadlines).and_then(|t| received.checked_add(t));
                if priority.unknown {
                    self.metrics.count_priority_unknown();
                }
                Prepared::Route(Pending {
                    target,
                    line,
                    received,
                    deadline,
                    protocol,
                    band: priority.band,
                    trace: trace.take(),
                })
            }
            Classified::InvalidTarget(line, protocol) => {
                self.metrics.count_invalid_target();
                let (verdict, label) = verdict::invalid_target();
                self.finish(&line, "", &verdict, received, label, ResumeLabel::Unknown);
                end_route(trace.take(), "", label, false, &verdict, None, received);
                Prepared::Verdict(response_for(&verdict, protocol))
            }
        }
    }

    /// Resolves one request's actor to its reply; `None` when the stream
    /// ended first.
    ///
    /// While the request waits, only the call's end is watched: Envoy sends
    /// nothing more on the stream before it has this reply (anything it did
    /// send would wait in gRPC's flow-control window and be answered after),
    /// and not keeping a read posted saves memory per parked request.
    #[allow(clippy::manual_async_fn, reason = "an async fn would store its arguments twice")]
    fn route<'a>(
        &'a self,
        mut pending: Pending,
        sink: &'a mut DuplexSink<ProcessingResponse>,
        deadline: Deadline,
    ) -> impl Future<Output = Option<ProcessingResponse>> + Send + 'a {
        async move {
            let (target, received) = (&pending.target, pending.received);
            // A stream reset before its request was even read costs nothing
            // more: no flight, no ResumeActor call. A client that sends
            // random actors and resets at once loads the control plane only
            // with the requests that outlive their own reading.
            if Gone::now(sink) {
                self.resolver.note_left_early();
                self.observe(received, RouteOutcome::Cancelled, ResumeLabel::Unknown);
                return None;
            }
            let mut resolving = self.resolver.resolve_traced(
                &target.actor,
                pending.deadline,
                pending.band,
                pending.trace.as_deref(),
            );
            let place = pending.trace.as_ref().and_then(|_| resolving.flight_place());
            let mut overtime_pending = true;
            // Armed only once the budget has passed with an attempt still
            // running: the router's own 504 before Envoy gives up (B81).
            let mut envoy_ceiling: Option<Sleep> = None;
            let outcome = loop {
                let overtime = overtime_pending.then(|| resolving.overtime()).flatten();
                let watch = select(Overtime(overtime), Ceiling(envoy_ceiling.as_mut()));
                let woken = match select(&mut resolving, select(Gone { sink: &mut *sink }, watch)).await {
                    Either::Left((outcome, _)) => break outcome,
                    Either::Right((Either::Left(_), _)) => Woken::Gone,
                    Either::Right((Either::Right((Either::Left(_), _)), _)) => Woken::Overtime,
                    Either::Right((Either::Right((Either::Right(_), _)), _)) => Woken::Ceiling,
                };
                match woken {
                    Woken::Overtime => {
                        overtime_pending = false;
                        // Envoy answers 504 itself once it has waited its
                        // message timeout from the request, or the late-serve
                        // limit from the override, which restarts its clock.
                        let gives_up = if self.late_serve_limit.is_zero() {
                            Some(received + self.message_timeout)
                        } else if send(sink, override_timeout(self.late_serve_limit)).await.is_ok() {
                            Some(Instant::now() + self.late_serve_limit)
                        } else {
                            // The call ended under the override (a client that
                            // left while it was written). The sink has seen the
                            // call's end, and grpcio panics if it is polled for
                            // it again: the caller is gone, as below, without
                            // another look.
                            log::debug!("stream for {} ended before the late-serve override", target.actor);
                            None
                        };
                        if let Some(gives_up) = gives_up {
                            let answer_at = gives_up.checked_sub(ENVOY_CEILING_MARGIN).unwrap_or(gives_up);
                            envoy_ceiling = Some(sleep_until(Arc::clone(&self.scheduler), answer_at));
                            continue;
                        }
                    }
                    Woken::Ceiling => {
                        // The attempt goes on; this caller has waited
                        // all Envoy would, and gets the router's reason.
                        let parked = resolving.parked();
                        resolving.abandon(Abandon::Timeout);
                        let (verdict, label) = verdict::resume_timeout(&target.actor);
                        if let Some(suppressed) = self.resume_errors.allow(Instant::now()) {
                            log::warn!(
                                actor = target.actor.as_str(), suppressed;
                                "ResumeActor for {} is still unanswered past the budget: answering 504", target.actor
                            );
                        }
                        self.finish(
                            &pending.line,
                            target.actor.as_str(),
                            &verdict,
                            received,
                            label,
                            ResumeLabel::Unknown,
                        );
                        end_route(
                            pending.trace,
                            target.actor.as_str(),
                            label,
                            parked,
                            &verdict,
                            place,
                            received,
                        );
                        return Some(response_for(&verdict, pending.protocol));
                    }
                    Woken::Gone => {}
                }
                let (reason, label) = if deadline.exceeded() {
                    (Abandon::Timeout, RouteOutcome::Timeout)
                } else {
                    (Abandon::Canceled, RouteOutcome::Cancelled)
                };
                log::debug!("stream for {} ended while waiting ({})", target.actor, label.name());
                if let Some(trace) = pending.trace.take() {
                    trace.end(RouteEnd {
                        actor: target.actor.as_str(),
                        parked: resolving.parked(),
                        outcome: label.name(),
                        rejected: None,
                        flight: place,
                        elapsed: received.elapsed(),
                    });
                }
                resolving.abandon(reason);
                self.observe(received, label, ResumeLabel::Unknown);
                return None;
            };
            let retry_after = self.resolver.lot().map_or(1, |lot| lot.retry_after());
            let outcome = self.within_worker_networks(outcome);
            let (verdict, label) = verdict::for_outcome(target, &outcome, self.worker_port, retry_after);
            if let Verdict::Reject(r) = &verdict {
                self.log_rejection(&target.actor, r, &outcome.result);
            }
            self.finish(&pending.line, target.actor.as_str(), &verdict, received, label, outcome.resume);
            end_route(pending.trace, target.actor.as_str(), label, outcome.parked, &verdict, place, received);
            Some(response_for(&verdict, pending.protocol))
        }
    }

    /// Logs why a request was refused. The server-side failures (500, 504)
    /// are warnings, at most one line per [`ERROR_LOG_INTERVAL`] each, saying
    /// how many were left out: in a control-plane incident every request
    /// fails the same way, and one line per request would flood the log
    /// from the completion-queue threads. Everything else is debug.
    fn log_rejection(&self, actor: &ActorId, rejection: &Rejection, result: &Result<Resumed, ResolveError>) {
        match result {
            Err(ResolveError::FlightsFull) => self.metrics.count_flight_rejected(),
            Err(ResolveError::AtespaceFlightsFull) => {
                self.metrics.count_atespace_refused(AtespaceShare::Flights)
            }
            Err(ResolveError::AtespaceRequestsFull) => {
                self.metrics.count_atespace_refused(AtespaceShare::Requests)
            }
            _ => {}
        }
        let now = Instant::now();
        match result {
            Ok(Resumed { worker: Err(BadWorkerIp(ip)), .. }) => {
                if let Some(suppressed) = self.routing_failures.allow(now) {
                    log::warn!(
                        actor = actor.as_str(), status = rejection.status, worker_ip = ip.as_str(), suppressed;
                        "{}: ateapi gave no usable worker IP", rejection.body
                    );
                }
            }
            Ok(_) => {}
            Err(e) if rejection.status >= 500 && rejection.status != 503 => {
                if let Some(suppressed) = self.resume_errors.allow(now) {
                    log::warn!(
                        actor = actor.as_str(), status = rejection.status, error:% = e, suppressed;
                        "{}", rejection.body
                    );
                }
            }
            Err(e) => {
                log::debug!(actor = actor.as_str(), status = rejection.status, error:% = e; "{}", rejection.body)
            }
        }
    }

    /// A worker address outside `--worker-networks` is no usable worker IP
    /// (B83): the routing failure B8 gives, logged with the address.
    fn within_worker_networks(&self, mut outcome: ResumeOutcome) -> ResumeOutcome {
        if let Ok(Resumed { worker, .. }) = &mut outcome.result {
            if let Ok(ip) = *worker {
                if !self.worker_networks.is_empty()
                    && !self.worker_networks.iter().any(|net| net.contains(ip))
                {
                    *worker = Err(BadWorkerIp(ip.to_string()));
                }
            }
        }
        outcome
    }

    /// Records a verdict: route metric, drain count, recent requests.
    fn finish(
        &self,
        request: &RequestLine,
        actor: &str,
        verdict: &Verdict,
        received: Instant,
        label: RouteOutcome,
        resume: ResumeLabel,
    ) {
        self.observe(received, label, resume);
        if !self.ready.load(Ordering::Acquire) {
            self.metrics.count_drain_verdict();
        }
        let (summary, worker) = match verdict {
            Verdict::Route { worker, .. } => (RecentVerdict::Routed, worker.as_str()),
            Verdict::Reject(r) => (RecentVerdict::Rejected { status: r.status, reason: r.reason }, ""),
        };
        self.recent.record(Answered {
            method: request.method(),
            path: request.path(),
            actor,
            verdict: summary,
            target: worker,
            duration: received.elapsed(),
        });
    }

    fn observe(&self, received: Instant, outcome: RouteOutcome, resume: ResumeLabel) {
        self.metrics.observe_route(outcome, resume, received.elapsed().as_secs_f64());
    }
}

/// The route span of a stream whose metadata carries a sampled
/// `traceparent` (B121, B123): Envoy's ext_proc span is its parent.
fn route_trace(tracer: &Tracer, ctx: &RpcContext<'_>) -> Option<Box<RouteTrace>> {
    let parent = parent_in(ctx.request_headers().iter())?;
    Some(Box::new(RouteTrace::new(tracer.clone(), parent)))
}

/// Ends a request's route span, if it has one, with its verdict.
fn end_route(
    trace: Option<Box<RouteTrace>>,
    actor: &str,
    label: RouteOutcome,
    parked: bool,
    verdict: &Verdict,
    flight: Option<FlightPlace>,
    received: Instant,
) {
    let Some(trace) = trace else { return };
    let rejected = match verdict {
        Verdict::Route { .. } => None,
        Verdict::Reject(r) => Some((r.reason, r.status)),
    };
    trace.end(RouteEnd {
        actor,
        parked,
        outcome: label.name(),
        rejected,
        flight,
        elapsed: received.elapsed(),
    });
}

/// Sends one reply. The send future holds the message, so it lives on the
/// heap only while sending: every stream task keeps its state machine for
/// its whole life, and a parked request should not carry room for a reply
/// it has not built yet.
fn send(
    sink: &mut DuplexSink<ProcessingResponse>,
    reply: ProcessingResponse,
) -> Pin<Box<dyn Future<Output = grpcio::Result<()>> + Send + '_>> {
    Box::pin(sink.send((reply, WriteFlags::default())))
}

/// Sends the request_headers verdict and the call's OK status right behind
/// it (B77): the status batch starts without waiting for the verdict's to
/// complete, so gRPC core may write both at once, and no read is posted
/// after the verdict. Completes once the call is closed. Boxed, like
/// [`send`], so that the stream's task is no larger for it.
fn verdict_then_status(
    mut sink: DuplexSink<ProcessingResponse>,
    verdict: ProcessingResponse,
) -> Pin<Box<dyn Future<Output = grpcio::Result<()>> + Send>> {
    Box::pin(async move {
        futures::future::poll_fn(|cx| Pin::new(&mut sink).poll_ready(cx)).await?;
        Pin::new(&mut sink).start_send((verdict, WriteFlags::default()))?;
        // `fail` sends any status, OK included, without first awaiting the
        // pending message as `close` would.
        sink.fail(RpcStatus::ok()).await
    })
}

/// What a message asks for, decided without waiting or side effects.
#[derive(Debug)]
pub enum Classified {
    /// The empty reply of the message's own kind.
    Reply(ProcessingResponse),
    /// No known request kind: nothing to answer.
    Ignore,
    /// request_headers for an actor, what its headers say about its
    /// caller's patience, the protocol its client reads, and its band.
    Route(Target, RequestLine, CallerTimeout, ClientProtocol, Priority),
    /// request_headers naming no valid actor: the 404.
    InvalidTarget(RequestLine, ClientProtocol),
}

/// How the client reads a rejection: an HTTP status, or a gRPC status.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClientProtocol {
    Http,
    Grpc,
}

impl ClientProtocol {
    /// gRPC exactly when Envoy takes the request for one, so that the
    /// status the router sets is the one Envoy sends: a `content-type` of
    /// `application/grpc` or `application/grpc+<codec>` (what Envoy's
    /// `Grpc::Common::isGrpcRequestHeaders` accepts). gRPC-Web is not gRPC
    /// here, as it is not to Envoy's local replies.
    fn of(headers: &HeaderMap) -> ClientProtocol {
        let Some(value) = target::header(headers, "content-type") else { return ClientProtocol::Http };
        match value.strip_prefix(b"application/grpc") {
            Some(b"") => ClientProtocol::Grpc,
            Some(codec) if codec.starts_with(b"+") => ClientProtocol::Grpc,
            _ => ClientProtocol::Http,
        }
    }
}

/// Classifies one message from Envoy. Pure, so it can be fuzzed.
pub fn classify(request: ProcessingRequest) -> Classified {
    let headers = match request.request {
        Some(processing_request::Request::RequestHeaders(headers)) => headers,
        Some(other) => return Classified::Reply(empty_reply(&other)),
        None => return Classified::Ignore,
    };
    let header_map = headers.headers.into_option().unwrap_or_default();
    let line = RequestLine::of(&header_map);
    let protocol = ClientProtocol::of(&header_map);
    match target::resolve(&header_map, &request.attributes) {
        Ok(target) => {
            let timeout = deadline::caller_timeout(&header_map);
            Classified::Route(target, line, timeout, protocol, band::priority(&header_map))
        }
        Err(_) => Classified::InvalidTarget(line, protocol),
    }
}

/// What [`ExtProc::prepare`] made of a message.
enum Prepared {
    /// The empty reply of another phase; the stream goes on.
    Reply(ProcessingResponse),
    Ignore,
    /// The request_headers verdict, known at once; the stream ends.
    Verdict(ProcessingResponse),
    Route(Pending),
}

/// A request waiting for its actor.
struct Pending {
    target: Target,
    line: RequestLine,
    received: Instant,
    /// The caller's own deadline.
    deadline: Option<Instant>,
    protocol: ClientProtocol,
    /// The caller's band.
    band: Band,
    /// Its route span, when its stream is sampled; boxed, so that an
    /// untraced request pays a pointer.
    trace: Option<Box<RouteTrace>>,
}

/// Why a waiting request woke before its outcome.
enum Woken {
    Gone,
    Overtime,
    /// Envoy's ceiling is near.
    Ceiling,
}

/// How long before Envoy would answer 504 itself the router answers a
/// caller still waiting on a running attempt: room for the timer's
/// and the completion queue's lateness on a loaded host.
const ENVOY_CEILING_MARGIN: Duration = Duration::from_secs(1);

/// Completes when its sleep does; never, without one.
struct Ceiling<'a>(Option<&'a mut Sleep>);

impl Future for Ceiling<'_> {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        match &mut self.0 {
            Some(sleep) => Pin::new(&mut **sleep).poll(cx),
            None => Poll::Pending,
        }
    }
}

/// The method and path of a request, for the status page; the path's
/// query string is dropped by [`RecentRequests::record`].
///
/// One allocation, method then path without its query, both bounded: it
/// is held for as long as the request waits.
#[derive(Debug)]
pub struct RequestLine {
    bytes: Box<[u8]>,
    method_len: usize,
}

impl RequestLine {
    fn of(headers: &HeaderMap) -> RequestLine {
        let method = target::header(headers, ":method").unwrap_or_default();
        let method = &method[..method.len().min(16)];
        let path = target::header(headers, ":path").unwrap_or_default();
        let path = path.split(|b| *b == b'?' || *b == b'#').next().unwrap_or_default();
        let path = &path[..path.len().min(256)];
        RequestLine { bytes: [method, path].concat().into_boxed_slice(), method_len: method.len() }
    }

    pub fn method(&self) -> &[u8] {
        &self.bytes[..self.method_len]
    }

    /// The path, without its query string.
    pub fn path(&self) -> &[u8] {
        &self.bytes[self.method_len..]
    }
}

/// Completes when the flight goes into overtime; never, without a wait.
struct Overtime(Option<FlightWait>);

impl Future for Overtime {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        match &mut self.0 {
            Some(wait) => match Pin::new(wait).poll(cx) {
                Poll::Ready(FlightEvent::Overtime) => Poll::Ready(()),
                // The flight ended: the outcome arrives through the caller's
                // own wait; nothing to extend.
                Poll::Ready(_) => {
                    self.0 = None;
                    Poll::Pending
                }
                Poll::Pending => Poll::Pending,
            },
            None => Poll::Pending,
        }
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
/// `tests/parking.rs` exercises.
struct Gone<'a> {
    sink: &'a mut DuplexSink<ProcessingResponse>,
}

impl Gone<'_> {
    /// Whether the call is already over, without waiting.
    fn now(sink: &mut DuplexSink<ProcessingResponse>) -> bool {
        let waker = futures::task::noop_waker();
        Pin::new(&mut Gone { sink }).poll(&mut Context::from_waker(&waker)).is_ready()
    }
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
pub fn response_for(verdict: &Verdict, protocol: ClientProtocol) -> ProcessingResponse {
    match verdict {
        Verdict::Route { actor, worker, target_port, set_actor_header } => {
            let mut headers = HeadersResponse::new();
            // Every mutation counts against Envoy's header limit, so none is
            // sent when the header already stands alone as it should (B6).
            if *set_actor_header {
                let mut mutation = HeaderMutation::new();
                mutation.set_headers.push(overwrite(ACTOR_HEADER, actor.as_str()));
                let mut common = CommonResponse::new();
                common.header_mutation = MessageField::some(mutation);
                headers.response = MessageField::some(common);
            }

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
        Verdict::Reject(rejection) => immediate(rejection, protocol),
    }
}

/// An ImmediateResponse. For a gRPC client it also carries the gRPC status,
/// which Envoy sends as `grpc-status` with the body as `grpc-message` in a
/// trailers-only answer (HTTP 200, `content-type: application/grpc`, so no
/// `text/plain` here), and the retry hint in gRFC A6's
/// `grpc-retry-pushback-ms` beside `retry-after` (B73).
fn immediate(rejection: &Rejection, protocol: ClientProtocol) -> ProcessingResponse {
    let mut headers = HeaderMutation::new();
    let mut response = ImmediateResponse::new();
    match protocol {
        ClientProtocol::Http => headers.set_headers.push(overwrite("content-type", "text/plain")),
        ClientProtocol::Grpc => {
            let mut grpc = GrpcStatus::new();
            grpc.status = rejection.grpc_status() as u32;
            response.grpc_status = MessageField::some(grpc);
        }
    }
    headers.set_headers.push(overwrite("x-atenet-reason", rejection.reason));
    if let Some(seconds) = rejection.retry_after {
        headers.set_headers.push(overwrite("retry-after", &seconds.to_string()));
        if protocol == ClientProtocol::Grpc {
            headers.set_headers.push(overwrite("grpc-retry-pushback-ms", &(seconds * 1000).to_string()));
        }
    }
    let mut status = HttpStatus::new();
    status.code = protobuf::EnumOrUnknown::from_i32(i32::from(rejection.status));
    response.status = MessageField::some(status);
    response.headers = MessageField::some(headers);
    response.body = rejection.body.clone().into_bytes();
    response.details = rejection.reason.to_string();
    let mut reply = ProcessingResponse::new();
    reply.set_immediate_response(response);
    reply
}

/// A header set as `raw_value` only, replacing any existing value:
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
    use crate::actor::resume::Code;
    use crate::proto::external_processor::HttpHeaders;
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

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let raw: Vec<(&str, &[u8])> = pairs.iter().map(|(k, v)| (*k, v.as_bytes())).collect();
        crate::actor::target::test_headers(&raw)
    }

    #[test]
    fn b73_grpc_is_what_envoy_takes_for_grpc() {
        let of = |value: &str| ClientProtocol::of(&headers(&[("content-type", value)]));
        assert_eq!(of("application/grpc"), ClientProtocol::Grpc);
        assert_eq!(of("application/grpc+proto"), ClientProtocol::Grpc);
        assert_eq!(
            ClientProtocol::of(&headers(&[("Content-Type", "application/grpc+json")])),
            ClientProtocol::Grpc
        );
        for http in ["application/grpc-web", "application/grpcx", "text/plain", "application/json", ""] {
            assert_eq!(of(http), ClientProtocol::Http, "{http:?}");
        }
        assert_eq!(ClientProtocol::of(&headers(&[])), ClientProtocol::Http);
    }

    #[test]
    fn b73_a_grpc_rejection_carries_its_status_and_pushback() {
        let rejection = Rejection {
            status: 503,
            body: "actor \"demo/a\" unavailable: router at capacity".into(),
            reason: "atenet_lot_full",
            retry_after: Some(3),
        };
        let header_list = |reply: &ProcessingResponse| -> Vec<(String, String)> {
            let headers = reply.immediate_response().headers.clone().unwrap();
            headers
                .set_headers
                .iter()
                .map(|o| (o.header.key.clone(), String::from_utf8(o.header.raw_value.clone()).unwrap()))
                .collect()
        };
        let grpc = immediate(&rejection, ClientProtocol::Grpc);
        assert_eq!(grpc.immediate_response().grpc_status.status, Code::Unavailable as u32);
        assert_eq!(grpc.immediate_response().status.code.value(), 503);
        assert_eq!(grpc.immediate_response().body, rejection.body.as_bytes());
        assert_eq!(
            header_list(&grpc),
            [
                ("x-atenet-reason".to_string(), "atenet_lot_full".to_string()),
                ("retry-after".into(), "3".into()),
                ("grpc-retry-pushback-ms".into(), "3000".into())
            ]
        );
        let http = immediate(&rejection, ClientProtocol::Http);
        assert!(http.immediate_response().grpc_status.is_none(), "HTTP clients see no change");
        assert_eq!(
            header_list(&http),
            [
                ("content-type".to_string(), "text/plain".to_string()),
                ("x-atenet-reason".into(), "atenet_lot_full".into()),
                ("retry-after".into(), "3".into())
            ]
        );
        let no_hint = Rejection { status: 404, reason: "atenet_not_found", retry_after: None, ..rejection };
        let reply = immediate(&no_hint, ClientProtocol::Grpc);
        assert_eq!(reply.immediate_response().grpc_status.status, Code::NotFound as u32);
        assert_eq!(header_list(&reply), [("x-atenet-reason".to_string(), "atenet_not_found".to_string())]);
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
