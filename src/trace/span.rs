//! The router's spans (B121, B122), built from what the router already
//! knows when a request, a flight or an attempt ends, and queued for the
//! exporter without waiting (B124).
//!
//! - `atenet.route`: one request, from its headers to its verdict, child
//!   of Envoy's ext_proc span; a joiner's links to its flight's resume span;
//! - `atenet.resume`: one flight, child of its leader's route span;
//! - `ateapi.Control/ResumeActor`: one attempt, child of its flight's span.

use std::time::{Duration, SystemTime};

use crossbeam_channel::{Receiver, Sender, TrySendError};
use prometheus::IntCounter;

use crate::trace::context::{Parent, SpanContext};

/// What a span is to its service, as OTLP's `SpanKind` says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Internal,
    Server,
    Client,
}

/// An attribute's value.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    Str(String),
    Bool(bool),
    Int(i64),
}

/// One finished span.
#[derive(Clone, Debug, PartialEq)]
pub struct Span {
    pub context: SpanContext,
    pub parent: [u8; 8],
    pub tracestate: String,
    pub name: &'static str,
    pub kind: Kind,
    pub start: SystemTime,
    pub end: SystemTime,
    pub attributes: Vec<(&'static str, Value)>,
    pub links: Vec<SpanContext>,
    /// The span's status is ERROR (else unset).
    pub error: bool,
}

impl Span {
    /// The value of attribute `key`, if set (for the tests).
    #[cfg(test)]
    pub fn attribute(&self, key: &str) -> Option<&Value> {
        self.attributes.iter().find(|(k, _)| *k == key).map(|(_, v)| v)
    }
}

/// The route span's name.
pub const ROUTE: &str = "atenet.route";
/// The flight span's name.
pub const RESUME: &str = "atenet.resume";
/// The attempt span's name: the RPC's own, as OpenTelemetry names RPC spans.
pub const RESUME_ACTOR: &str = "ateapi.Control/ResumeActor";

/// Hands finished spans to the exporter thread. Never blocks: a full queue
/// drops the span and counts it (B124).
#[derive(Clone)]
pub struct Tracer {
    queue: Sender<Span>,
    dropped: IntCounter,
}

impl Tracer {
    /// A tracer whose queue holds `capacity` spans, and the exporter's end
    /// of it; `dropped` counts what does not fit.
    pub fn new(capacity: usize, dropped: IntCounter) -> (Tracer, Receiver<Span>) {
        let (queue, spans) = crossbeam_channel::bounded(capacity);
        (Tracer { queue, dropped }, spans)
    }

    /// Queues `span`, or drops and counts it.
    pub fn record(&self, span: Span) {
        if let Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) = self.queue.try_send(span) {
            self.dropped.inc();
        }
    }
}

/// One request's route span in the making: Envoy's span is its parent, its
/// own id is known from the start so that a flight it leads can name it
/// (B121).
pub struct RouteTrace {
    tracer: Tracer,
    parent: Parent,
    pub span: SpanContext,
}

/// A caller's place on its flight, for its route span.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FlightPlace {
    pub leader: bool,
    /// The flight's resume span, when the flight is traced: a joiner's
    /// route span links to it (B121).
    pub resume: Option<SpanContext>,
}

/// How a request ended, for its route span.
pub struct RouteEnd<'a> {
    pub actor: &'a str,
    pub parked: bool,
    /// The route outcome label the metrics use (B35).
    pub outcome: &'static str,
    /// The `x-atenet-reason` token and HTTP status, when not routed.
    pub rejected: Option<(&'static str, u16)>,
    /// `None` when the request joined no flight.
    pub flight: Option<FlightPlace>,
    /// How long ago the request's headers arrived.
    pub elapsed: Duration,
}

impl RouteTrace {
    /// The route span of a request whose stream names `parent`.
    pub fn new(tracer: Tracer, parent: Parent) -> RouteTrace {
        let span = parent.context.child();
        RouteTrace { tracer, parent, span }
    }

    /// Ends the span and queues it.
    pub fn end(self, end: RouteEnd<'_>) {
        let now = SystemTime::now();
        let mut attributes = vec![
            ("atenet.actor", Value::Str(end.actor.to_string())),
            ("atenet.parked", Value::Bool(end.parked)),
            ("atenet.outcome", Value::Str(end.outcome.to_string())),
        ];
        if let Some((reason, _)) = end.rejected {
            attributes.push(("atenet.reason", Value::Str(reason.to_string())));
        }
        let mut links = Vec::new();
        if let Some(place) = end.flight {
            let role = if place.leader { "leader" } else { "joiner" };
            attributes.push(("atenet.flight.role", Value::Str(role.to_string())));
            // The leader's route span is its flight's parent already.
            if !place.leader {
                links.extend(place.resume);
            }
        }
        self.tracer.record(Span {
            context: self.span,
            parent: self.parent.context.span_id,
            tracestate: self.parent.tracestate,
            name: ROUTE,
            kind: Kind::Server,
            start: now.checked_sub(end.elapsed).unwrap_or(now),
            end: now,
            attributes,
            links,
            // A server span is an error for the router's own failures only.
            error: end.rejected.is_some_and(|(_, status)| status >= 500),
        });
    }
}

/// A traced flight: its resume span, in its leader's trace (B121).
pub struct FlightTrace {
    tracer: Tracer,
    pub resume: SpanContext,
    leader_route: [u8; 8],
    tracestate: String,
    started: SystemTime,
}

/// A traced attempt: its span's identity, which the call's `traceparent`
/// carries (B122), and when it started.
pub struct AttemptTrace {
    pub span: SpanContext,
    number: u32,
    started: SystemTime,
}

impl FlightTrace {
    /// The trace of a flight `leader` starts now.
    pub fn led_by(leader: &RouteTrace) -> FlightTrace {
        FlightTrace {
            tracer: leader.tracer.clone(),
            resume: leader.span.child(),
            leader_route: leader.span.span_id,
            tracestate: leader.parent.tracestate.clone(),
            started: SystemTime::now(),
        }
    }

    /// The span of attempt `number`, starting now.
    pub fn attempt(&self, number: u32) -> AttemptTrace {
        AttemptTrace { span: self.resume.child(), number, started: SystemTime::now() }
    }

    /// Ends an attempt's span with the gRPC status `code` it answered.
    pub fn attempt_answered(&self, attempt: &AttemptTrace, actor: &str, code: i64) {
        self.tracer.record(Span {
            context: attempt.span,
            parent: self.resume.span_id,
            tracestate: self.tracestate.clone(),
            name: RESUME_ACTOR,
            kind: Kind::Client,
            start: attempt.started,
            end: SystemTime::now(),
            attributes: vec![
                ("rpc.system", Value::Str("grpc".into())),
                ("rpc.service", Value::Str("ateapi.Control".into())),
                ("rpc.method", Value::Str("ResumeActor".into())),
                ("rpc.grpc.status_code", Value::Int(code)),
                ("atenet.actor", Value::Str(actor.to_string())),
                ("atenet.attempt", Value::Int(i64::from(attempt.number))),
            ],
            links: Vec::new(),
            error: code != 0,
        });
    }

    /// Ends the flight's span: `outcome` is how it ended (`resumed`,
    /// `budget_exhausted`, `failed` or `abandoned`) after `attempts`.
    pub fn ended(&self, actor: &str, outcome: &'static str, attempts: u32) {
        self.tracer.record(Span {
            context: self.resume,
            parent: self.leader_route,
            tracestate: self.tracestate.clone(),
            name: RESUME,
            kind: Kind::Internal,
            start: self.started,
            end: SystemTime::now(),
            attributes: vec![
                ("atenet.actor", Value::Str(actor.to_string())),
                ("atenet.outcome", Value::Str(outcome.to_string())),
                ("atenet.resume.attempts", Value::Int(i64::from(attempts))),
            ],
            links: Vec::new(),
            error: outcome != "resumed",
        });
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::trace::context::sampled_parent;

    pub(crate) fn tracer(capacity: usize) -> (Tracer, Receiver<Span>, IntCounter) {
        let dropped = IntCounter::new("dropped", "dropped").unwrap();
        let (tracer, spans) = Tracer::new(capacity, dropped.clone());
        (tracer, spans, dropped)
    }

    pub(crate) fn envoy_parent() -> Parent {
        sampled_parent(b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", &[b"k=v"]).unwrap()
    }

    #[test]
    fn b124_a_full_queue_drops_and_counts_without_waiting() {
        let (tracer, spans, dropped) = tracer(2);
        for _ in 0..5 {
            RouteTrace::new(tracer.clone(), envoy_parent()).end(RouteEnd {
                actor: "a/b",
                parked: false,
                outcome: "ok",
                rejected: None,
                flight: None,
                elapsed: Duration::ZERO,
            });
        }
        assert_eq!(spans.try_iter().count(), 2);
        assert_eq!(dropped.get(), 3);
    }

    #[test]
    fn b121_leader_flight_and_attempts_nest_and_a_joiner_links() {
        let (tracer, spans, _) = tracer(16);
        let leader = RouteTrace::new(tracer.clone(), envoy_parent());
        let flight = FlightTrace::led_by(&leader);
        for (number, code) in [(1, 8), (2, 0)] {
            let attempt = flight.attempt(number);
            flight.attempt_answered(&attempt, "a/b", code);
        }
        flight.ended("a/b", "resumed", 2);
        let leader_span = leader.span;
        let place = |leader| Some(FlightPlace { leader, resume: Some(flight.resume) });
        leader.end(RouteEnd {
            actor: "a/b",
            parked: true,
            outcome: "ok",
            rejected: None,
            flight: place(true),
            elapsed: Duration::from_millis(5),
        });
        let joiner = RouteTrace::new(tracer, envoy_parent());
        let joiner_span = joiner.span;
        joiner.end(RouteEnd {
            actor: "a/b",
            parked: false,
            outcome: "unavailable",
            rejected: Some(("atenet_budget_exhausted", 503)),
            flight: place(false),
            elapsed: Duration::ZERO,
        });
        let spans: Vec<Span> = spans.try_iter().collect();
        let [first, second, resume, route, joined] = &spans[..] else { panic!("{spans:?}") };
        for attempt in [first, second] {
            assert_eq!((attempt.name, attempt.parent), (RESUME_ACTOR, resume.context.span_id));
            assert_eq!(attempt.attribute("rpc.system"), Some(&Value::Str("grpc".into())));
        }
        assert_eq!(first.attribute("rpc.grpc.status_code"), Some(&Value::Int(8)));
        assert!(first.error && !second.error);
        assert_eq!((resume.name, resume.parent), (RESUME, leader_span.span_id));
        assert_eq!(resume.attribute("atenet.resume.attempts"), Some(&Value::Int(2)));
        assert_eq!((route.name, route.context), (ROUTE, leader_span));
        assert_eq!(route.parent, envoy_parent().context.span_id);
        assert_eq!(route.attribute("atenet.flight.role"), Some(&Value::Str("leader".into())));
        assert_eq!(route.attribute("atenet.parked"), Some(&Value::Bool(true)));
        assert_eq!(route.attribute("atenet.reason"), None);
        assert!(route.links.is_empty());
        assert!(route.end.duration_since(route.start).unwrap() >= Duration::from_millis(5));
        assert_eq!(joined.context, joiner_span);
        assert_eq!(joined.links, [resume.context]);
        assert_eq!(joined.attribute("atenet.flight.role"), Some(&Value::Str("joiner".into())));
        assert_eq!(joined.attribute("atenet.reason"), Some(&Value::Str("atenet_budget_exhausted".into())));
        assert!(joined.error);
        for span in &spans {
            assert_eq!(span.context.trace_id, envoy_parent().context.trace_id);
            assert_eq!(span.tracestate, "k=v");
        }
    }
}

/// A traced flight against a scripted control plane and manual time: the
/// spans the flight table emits at its attempt and flight hooks (B121,
/// B122), with no network.
#[cfg(test)]
mod flight_tests {
    use std::sync::Arc;
    use std::time::Duration;

    use parking_lot::Mutex;
    use prometheus::IntCounter;

    use super::tests::{envoy_parent, tracer};
    use crate::actor::resume::{Code, ResumeError, Resumed};
    use crate::actor::target::ActorId;
    use crate::parking::backoff::{BackoffPolicy, Dispatch};
    use crate::parking::band::Band;
    use crate::parking::clock::ManualClock;
    use crate::parking::flight::{AttemptDone, FlightPolicy, FlightTable, Resumer, Role};
    use crate::parking::share::SharePolicy;
    use crate::parking::timer::ManualScheduler;
    use crate::trace::context::hex;
    use crate::trace::span::{RouteTrace, Span, Value, RESUME, RESUME_ACTOR};

    /// Records each attempt's `traceparent` and holds it for the test to answer.
    #[derive(Default)]
    struct Recording {
        attempts: Mutex<Vec<AttemptDone>>,
        traceparents: Mutex<Vec<Option<String>>>,
    }

    impl Resumer for Recording {
        fn start(&self, _actor: &ActorId, done: AttemptDone) {
            self.traceparents.lock().push(done.traceparent());
            self.attempts.lock().push(done);
        }
    }

    impl Recording {
        fn answer(&self, code: Code) {
            let done = self.attempts.lock().remove(0);
            done.complete(match code {
                Code::Ok => Ok(Resumed::from_pod_ips(true, &["10.0.0.7".into()])),
                code => Err(ResumeError::new(code, "scripted")),
            });
        }
    }

    fn table() -> (FlightTable, Arc<Recording>, ManualScheduler) {
        let clock = ManualClock::new();
        let scheduler = ManualScheduler::new(clock.clone());
        let resumer = Arc::new(Recording::default());
        let policy = FlightPolicy {
            budget: Duration::from_secs(5),
            backoff: BackoffPolicy { interval: Duration::from_millis(100), factor: 1.0, jitter: 0.0 },
            parking_enabled: true,
            max_flights: 10,
            atespace_share: SharePolicy::capped(10, 10),
            dispatch: Dispatch::SaturationGroup,
            fleet_size: 1,
        };
        let abandoned = IntCounter::new("abandoned", "abandoned").unwrap();
        let table = FlightTable::new(
            policy,
            Arc::new(clock),
            Arc::new(scheduler.clone()),
            Arc::clone(&resumer) as Arc<dyn Resumer>,
            abandoned,
        );
        (table, resumer, scheduler)
    }

    #[test]
    fn b121_b122_a_traced_flight_spans_its_attempts_and_sends_their_context() {
        let (table, resumer, scheduler) = table();
        let (tracer, spans, _) = tracer(16);
        let actor = ActorId::parse("demo/a").unwrap();
        let leader = RouteTrace::new(tracer.clone(), envoy_parent());
        let (led, role) = table.join_traced(&actor, Band::Standard, Some(&leader)).unwrap();
        assert_eq!(role, Role::Leader);
        // A traced joiner joins the leader's flight, in its own trace.
        let joiner = RouteTrace::new(tracer, envoy_parent());
        let (joined, role) = table.join_traced(&actor, Band::Standard, Some(&joiner)).unwrap();
        assert_eq!(role, Role::Joiner);
        assert_eq!(joined.resume_span(), led.resume_span());
        for code in [Code::ResourceExhausted, Code::ResourceExhausted, Code::Ok] {
            resumer.answer(code);
            scheduler.advance(Duration::from_millis(100));
        }
        let spans: Vec<Span> = spans.try_iter().collect();
        let resume = led.resume_span().unwrap();
        let [a1, a2, a3, flight] = &spans[..] else { panic!("{spans:?}") };
        assert_eq!((flight.name, flight.context, flight.parent), (RESUME, resume, leader.span.span_id));
        assert_eq!(flight.attribute("atenet.outcome"), Some(&Value::Str("resumed".into())));
        let codes: Vec<_> =
            [a1, a2, a3].iter().map(|a| a.attribute("rpc.grpc.status_code").cloned()).collect();
        assert_eq!(codes, [Some(Value::Int(8)), Some(Value::Int(8)), Some(Value::Int(0))]);
        // One attempt span per call, each the call's traceparent.
        let sent: Vec<String> = resumer.traceparents.lock().iter().map(|t| t.clone().unwrap()).collect();
        for (attempt, traceparent) in [a1, a2, a3].iter().zip(&sent) {
            assert_eq!((attempt.name, attempt.parent), (RESUME_ACTOR, resume.span_id));
            let expected =
                format!("00-{}-{}-01", hex(&attempt.context.trace_id), hex(&attempt.context.span_id));
            assert_eq!(traceparent, &expected);
            assert_eq!(attempt.context.trace_id, envoy_parent().context.trace_id);
        }
        assert_eq!(sent.len(), 3);
    }

    #[test]
    fn b123_an_untraced_flight_emits_nothing_and_sends_no_traceparent() {
        let (table, resumer, _) = table();
        let actor = ActorId::parse("demo/a").unwrap();
        let (caller, _) = table.join_traced(&actor, Band::Standard, None).unwrap();
        assert_eq!(caller.resume_span(), None);
        resumer.answer(Code::Ok);
        assert_eq!(*resumer.traceparents.lock(), [None]);
    }
}
