//! The router's Prometheus instruments (B31-B36).
//!
//! Names follow Prometheus conventions for the OpenTelemetry instruments of
//! the design document (`atenet.router.parking.active` becomes
//! `atenet_router_parking_active`). Each router instance owns its own
//! registry, so tests can run several routers in one process and read exact
//! counts.

use prometheus::{
    Encoder, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, Opts, Registry,
    TextEncoder,
};

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

/// Every instrument the router records.
#[derive(Clone)]
pub struct Metrics {
    registry: Registry,
    pub parking_active: IntGauge,
    pub parking_wait: HistogramVec,
    pub parking_rejected: IntCounter,
    pub route_duration: HistogramVec,
    pub resume_attempts: IntCounterVec,
    pub streams_active: IntGauge,
    pub parking_lot_max: IntGauge,
    pub drain_verdicts: IntCounter,
    pub drain_cancelled: IntCounter,
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
        let drain_verdicts =
            IntCounter::new("atenet_router_drain_verdicts_total", "Verdicts given after a drain started.")
                .expect("valid metric");
        let drain_cancelled = IntCounter::new(
            "atenet_router_drain_cancelled_total",
            "ext_proc streams cut by the final cancel when the drain timeout passed.",
        )
        .expect("valid metric");
        for collector in [
            Box::new(parking_active.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(parking_wait.clone()),
            Box::new(parking_rejected.clone()),
            Box::new(route_duration.clone()),
            Box::new(resume_attempts.clone()),
            Box::new(streams_active.clone()),
            Box::new(parking_lot_max.clone()),
            Box::new(drain_verdicts.clone()),
            Box::new(drain_cancelled.clone()),
        ] {
            registry.register(collector).expect("unique metric names");
        }
        Metrics {
            registry,
            parking_active,
            parking_wait,
            parking_rejected,
            route_duration,
            resume_attempts,
            streams_active,
            parking_lot_max,
            drain_verdicts,
            drain_cancelled,
        }
    }

    /// The wait histogram for one outcome.
    pub fn wait(&self, outcome: WaitOutcome) -> Histogram {
        self.parking_wait.with_label_values(&[outcome.label()])
    }

    /// Counts one ResumeActor attempt (B36).
    pub fn count_attempt(&self, code: Code) {
        self.resume_attempts.with_label_values(&[code.name()]).inc();
    }

    /// Records one request_headers exchange (B35).
    pub fn observe_route(&self, outcome: &str, resume: &str, seconds: f64) {
        self.route_duration.with_label_values(&[outcome, resume]).observe(seconds);
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
