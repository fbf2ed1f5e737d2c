//! The router's Prometheus instruments (B31-B36).
//!
//! Names follow Prometheus conventions for the OpenTelemetry instruments of
//! the design document (`atenet.router.parking.active` becomes
//! `atenet_router_parking_active`). Each router instance owns its own
//! registry, so tests can run several routers in one process and read exact
//! counts.

use prometheus::{
    Encoder, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts,
    Registry, TextEncoder,
};

use crate::lot::LotDecision;
use crate::resume::Code;

/// B32's buckets: from a millisecond up to the longest plausible park.
const WAIT_BUCKETS: &[f64] =
    &[0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 15.0, 30.0, 45.0, 60.0];

/// How a parked caller's wait ended (B33).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WaitOutcome {
    Served,
    BudgetExhausted,
    Canceled,
    Timeout,
    Error,
}

impl WaitOutcome {
    pub fn label(self) -> &'static str {
        match self {
            WaitOutcome::Served => "served",
            WaitOutcome::BudgetExhausted => "budget_exhausted",
            WaitOutcome::Canceled => "canceled",
            WaitOutcome::Timeout => "timeout",
            WaitOutcome::Error => "error",
        }
    }
}

/// B35's `outcome` values.
pub const ROUTE_OUTCOMES: [&str; 9] = [
    "ok",
    "not_found",
    "no_capacity",
    "unavailable",
    "lock_conflict",
    "failed_precondition",
    "timeout",
    "cancelled",
    "resume_error",
];
/// B21's `resume` values.
pub const RESUME_LABELS: [&str; 4] = ["triggered", "joined", "none", "unknown"];
const WAIT_OUTCOMES: [WaitOutcome; 5] = [
    WaitOutcome::Served,
    WaitOutcome::BudgetExhausted,
    WaitOutcome::Canceled,
    WaitOutcome::Timeout,
    WaitOutcome::Error,
];

/// Label lookups resolved once: the hot path then touches only atomics,
/// never the label-hashing map inside a metric vector.
struct Handles {
    decisions: Vec<IntCounter>,
    route: Vec<Histogram>,
    wait: Vec<Histogram>,
    attempts: Vec<IntCounter>,
}

/// Every instrument the router records.
#[derive(Clone)]
pub struct Metrics {
    handles: std::sync::Arc<Handles>,
    registry: Registry,
    pub parking_active: IntGauge,
    pub parking_wait: HistogramVec,
    pub parking_rejected: IntCounter,
    pub route_duration: HistogramVec,
    pub resume_attempts: IntCounterVec,
    pub streams_active: IntGauge,
    pub parking_lot_max: IntGauge,
    pub timer_lateness: Histogram,
    pub drain_verdicts: IntCounter,
    pub drain_cancelled: IntCounter,
    pub park_decisions: IntCounterVec,
    pub invalid_targets: IntCounter,
    pub flights_active: IntGauge,
    pub flights_rejected: IntCounter,
}

impl Metrics {
    /// Registers every instrument in a fresh registry.
    pub fn new() -> Metrics {
        let registry = Registry::new();
        let parking_active =
            IntGauge::new("atenet_router_parking_active", "Requests currently parked (lot slots held).")
                .expect("valid metric");
        let parking_wait = HistogramVec::new(
            HistogramOpts::new(
                "atenet_router_parking_wait_duration_seconds",
                "Time each parked request spent parked, recorded once when its wait ends.",
            )
            .buckets(WAIT_BUCKETS.to_vec()),
            &["outcome"],
        )
        .expect("valid metric");
        let parking_rejected = IntCounter::new(
            "atenet_router_parking_rejected_total",
            "Requests shed at the park transition because the lot was full.",
        )
        .expect("valid metric");
        let route_duration = HistogramVec::new(
            HistogramOpts::new(
                "atenet_router_route_duration_seconds",
                "Time from request_headers receipt to verdict, per request.",
            )
            .buckets(WAIT_BUCKETS.to_vec()),
            &["outcome", "resume"],
        )
        .expect("valid metric");
        let resume_attempts = IntCounterVec::new(
            Opts::new("atenet_router_resume_attempts_total", "ResumeActor attempts by gRPC result code."),
            &["code"],
        )
        .expect("valid metric");
        let streams_active = IntGauge::new(
            "atenet_router_extproc_streams_active",
            "ext_proc streams open now (each holds one Envoy circuit-breaker slot).",
        )
        .expect("valid metric");
        let parking_lot_max = IntGauge::new(
            "atenet_router_parking_lot_max",
            "The lot's capacity (--parked-request-max); 0 when parking is disabled.",
        )
        .expect("valid metric");
        let timer_lateness = Histogram::with_opts(
            HistogramOpts::new(
                "atenet_router_timer_lateness_seconds",
                "How late the timer thread ran each retry or deadline against its schedule.",
            )
            .buckets(vec![0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25]),
        )
        .expect("valid metric");
        let drain_verdicts =
            IntCounter::new("atenet_router_drain_verdicts_total", "Verdicts given after a drain started.")
                .expect("valid metric");
        let drain_cancelled = IntCounter::new(
            "atenet_router_drain_cancelled_total",
            "ext_proc streams cut by the final cancel when the drain timeout passed.",
        )
        .expect("valid metric");
        let park_decisions = IntCounterVec::new(
            Opts::new(
                "atenet_router_park_decisions_total",
                "Callers at the lot decision: fast (no slot needed), admitted, shed, left (gone first).",
            ),
            &["decision"],
        )
        .expect("valid metric");
        let invalid_targets = IntCounter::new(
            "atenet_router_invalid_target_total",
            "Requests answered 404 invalid actor reference (B4).",
        )
        .expect("valid metric");
        let flights_active = IntGauge::new(
            "atenet_router_flights_active",
            "Flights in progress: actors being resumed, each with at most one ResumeActor call running.",
        )
        .expect("valid metric");
        let flights_rejected = IntCounter::new(
            "atenet_router_flights_rejected_total",
            "Requests refused because --flight-max flights were in progress (B58).",
        )
        .expect("valid metric");
        let build_info = IntGaugeVec::new(
            Opts::new("atenet_router_build_info", "Always 1; the labels say which build is running."),
            &["version", "revision"],
        )
        .expect("valid metric");
        build_info.with_label_values(&[crate::version::VERSION, crate::version::REVISION]).set(1);
        // RSS, CPU, threads and open files of this process, as
        // process_resident_memory_bytes, process_threads, process_open_fds...
        registry
            .register(Box::new(prometheus::process_collector::ProcessCollector::for_self()))
            .expect("unique metric names");
        for collector in [
            Box::new(build_info) as Box<dyn prometheus::core::Collector>,
            Box::new(parking_active.clone()),
            Box::new(parking_wait.clone()),
            Box::new(parking_rejected.clone()),
            Box::new(route_duration.clone()),
            Box::new(resume_attempts.clone()),
            Box::new(streams_active.clone()),
            Box::new(parking_lot_max.clone()),
            Box::new(timer_lateness.clone()),
            Box::new(drain_verdicts.clone()),
            Box::new(drain_cancelled.clone()),
            Box::new(park_decisions.clone()),
            Box::new(invalid_targets.clone()),
            Box::new(flights_active.clone()),
            Box::new(flights_rejected.clone()),
        ] {
            registry.register(collector).expect("unique metric names");
        }
        let handles = std::sync::Arc::new(Handles {
            decisions: [LotDecision::Fast, LotDecision::Admitted, LotDecision::Shed, LotDecision::Left]
                .iter()
                .map(|d| park_decisions.with_label_values(&[d.label()]))
                .collect(),
            route: ROUTE_OUTCOMES
                .iter()
                .flat_map(|o| RESUME_LABELS.iter().map(|r| route_duration.with_label_values(&[o, r])))
                .collect(),
            wait: WAIT_OUTCOMES.iter().map(|o| parking_wait.with_label_values(&[o.label()])).collect(),
            attempts: (0..17)
                .map(|i| resume_attempts.with_label_values(&[Code::from_i32(i).name()]))
                .collect(),
        });
        // Creating the handles also exports every series from the start, at
        // zero: rate() and absent-series alerts then behave from the first
        // scrape, as Prometheus recommends.
        Metrics {
            handles,
            registry,
            parking_active,
            parking_wait,
            parking_rejected,
            route_duration,
            resume_attempts,
            streams_active,
            parking_lot_max,
            timer_lateness,
            drain_verdicts,
            drain_cancelled,
            park_decisions,
            invalid_targets,
            flights_active,
            flights_rejected,
        }
    }

    /// The wait histogram for one outcome.
    pub fn wait(&self, outcome: WaitOutcome) -> &Histogram {
        let i = WAIT_OUTCOMES.iter().position(|o| *o == outcome).expect("every outcome is listed");
        &self.handles.wait[i]
    }

    /// The counter for one lot decision.
    pub fn decision(&self, decision: LotDecision) -> &IntCounter {
        &self.handles.decisions[decision as usize]
    }

    /// Counts one ResumeActor attempt (B36).
    pub fn count_attempt(&self, code: Code) {
        self.handles.attempts[code.as_i32() as usize].inc();
    }

    /// Records one request_headers exchange (B35). `outcome` and `resume`
    /// are values of [`ROUTE_OUTCOMES`] and [`RESUME_LABELS`].
    pub fn observe_route(&self, outcome: &str, resume: &str, seconds: f64) {
        let o = ROUTE_OUTCOMES.iter().position(|v| *v == outcome);
        let r = RESUME_LABELS.iter().position(|v| *v == resume);
        match (o, r) {
            (Some(o), Some(r)) => self.handles.route[o * RESUME_LABELS.len() + r].observe(seconds),
            _ => self.route_duration.with_label_values(&[outcome, resume]).observe(seconds),
        }
    }

    /// The registry, for callers that add their own collectors.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// Text exposition format, as served on `/metrics`.
    pub fn render(&self) -> String {
        let mut out = Vec::new();
        TextEncoder::new().encode(&self.registry.gather(), &mut out).expect("encoding to memory");
        String::from_utf8(out).expect("text exposition is UTF-8")
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}
