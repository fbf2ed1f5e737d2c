//! The router's Prometheus instruments (B31-B36, B55-B58, B65).
//!
//! Names follow Prometheus conventions for the OpenTelemetry instruments of
//! the design document (`atenet.router.parking.active` becomes
//! `atenet_router_parking_active`). Each router instance owns its own
//! registry, so tests can run several routers in one process and read exact
//! counts.
//!
//! Each label set is an enum owned by the module whose concept it is
//! ([`RouteOutcome`], [`ResumeLabel`], [`Code`], and the lot's), listing its
//! values in `ALL`; every labelled series is resolved once here, so the hot
//! path touches only atomics, and exported from the start at zero, so
//! `rate()` and absent-series alerts behave from the first scrape.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use prometheus::core::{Collector, Metric as _};
use prometheus::{
    Encoder, Gauge, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec,
    Opts, Registry, TextEncoder,
};

use crate::actor::resume::Code;
use crate::envoy::verdict::RouteOutcome;
use crate::parking::band::Band;
use crate::parking::calls::CallGauges;
use crate::parking::lot::{LotDecision, LotInstruments, WaitOutcome};
use crate::parking::resolver::ResumeLabel;

/// B32's buckets: from a millisecond up to the longest plausible park.
const WAIT_BUCKETS: &[f64] =
    &[0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 15.0, 30.0, 45.0, 60.0];

/// Every instrument the router records; cheap to clone.
#[derive(Clone)]
pub struct Metrics {
    inner: Arc<Instruments>,
}

struct Instruments {
    registry: Registry,
    lot: LotInstruments,
    /// `atenet_router_route_duration_seconds` by (outcome, resume).
    route: Vec<Histogram>,
    /// `atenet_router_resume_attempts_total` by code.
    attempts: Vec<IntCounter>,
    streams_active: IntGauge,
    parking_lot_max: IntGauge,
    timer_lateness: Histogram,
    drain_verdicts: IntCounter,
    drain_cancelled: IntCounter,
    invalid_targets: IntCounter,
    flights_active: IntGauge,
    oldest_attempt: Gauge,
    saturation_groups: IntGauge,
    saturation_group_flights: IntGauge,
    flights_rejected: IntCounter,
    flights_abandoned: IntCounter,
    calls: CallGauges,
    /// `atenet_router_atespace_refused_total` by [`AtespaceShare`].
    atespace_refused: [IntCounter; 2],
    streams_refused: IntCounter,
    streams_silent_closed: IntCounter,
    priority_unknown: IntCounter,
    /// `atenet_router_certificate_expiry_timestamp_seconds` by
    /// [`CertificateRole`]; a series appears once its certificate is used.
    certificate_expiry: IntGaugeVec,
}

fn gauge(name: &str, help: &str) -> IntGauge {
    IntGauge::new(name, help).expect("a valid metric name")
}

fn counter(name: &str, help: &str) -> IntCounter {
    IntCounter::new(name, help).expect("a valid metric name")
}

/// Which share of an atespace refused a caller: the `share`
/// label of `atenet_router_atespace_refused_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AtespaceShare {
    Flights,
    Requests,
}

impl AtespaceShare {
    /// Every value, in the order of their discriminants.
    pub const ALL: [AtespaceShare; 2] = [AtespaceShare::Flights, AtespaceShare::Requests];

    /// The label value.
    pub fn name(self) -> &'static str {
        match self {
            AtespaceShare::Flights => "flights",
            AtespaceShare::Requests => "requests",
        }
    }
}

/// Which certificate of the router's own an expiry gauge is about:
/// the `certificate` label of
/// `atenet_router_certificate_expiry_timestamp_seconds`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CertificateRole {
    /// `--extproc-cert-file`, presented to Envoy.
    Extproc,
    /// `--ateapi-client-cert`, presented to the control plane.
    AteapiClient,
}

impl CertificateRole {
    /// The label value.
    pub fn name(self) -> &'static str {
        match self {
            CertificateRole::Extproc => "extproc",
            CertificateRole::AteapiClient => "ateapi_client",
        }
    }
}

impl Metrics {
    /// Registers every instrument in a fresh registry.
    pub fn new() -> Metrics {
        let registry = Registry::new();
        let register =
            |collector: Box<dyn Collector>| registry.register(collector).expect("unique metric names");

        let parking_active =
            gauge("atenet_router_parking_active", "Requests currently parked (lot slots held).");
        let parking_rejected = IntCounterVec::new(
            Opts::new(
                "atenet_router_parking_rejected_total",
                "Requests shed at the park transition because the lot (or the sheddable band's share of \
                 it) was full, by band.",
            ),
            &["band"],
        )
        .expect("a valid metric");
        let parking_preempted = IntCounterVec::new(
            Opts::new(
                "atenet_router_parking_preempted_total",
                "Parked requests whose slot a higher band took when the lot was full (B118), by their band.",
            ),
            &["band"],
        )
        .expect("a valid metric");
        let early_rejected = counter(
            "atenet_router_parking_early_rejected_total",
            "Requests refused at the park transition: their deadline was shorter than the time to serve a park.",
        );
        let atespace_rejected = counter(
            "atenet_router_parking_atespace_rejected_total",
            "Requests shed at the park transition because their atespace held its share of the lot.",
        );
        let parking_wait = HistogramVec::new(
            HistogramOpts::new(
                "atenet_router_parking_wait_duration_seconds",
                "Time each parked request spent parked, recorded once when its wait ends.",
            )
            .buckets(WAIT_BUCKETS.to_vec()),
            &["outcome", "band"],
        )
        .expect("a valid metric");
        let park_decisions = IntCounterVec::new(
            Opts::new(
                "atenet_router_park_decisions_total",
                "Callers at the lot decision: fast (no slot needed), admitted, shed, left (gone first).",
            ),
            &["decision"],
        )
        .expect("a valid metric");
        let route_duration = HistogramVec::new(
            HistogramOpts::new(
                "atenet_router_route_duration_seconds",
                "Time from request_headers receipt to verdict, per request.",
            )
            .buckets(WAIT_BUCKETS.to_vec()),
            &["outcome", "resume"],
        )
        .expect("a valid metric");
        let resume_attempts = IntCounterVec::new(
            Opts::new("atenet_router_resume_attempts_total", "ResumeActor attempts by gRPC result code."),
            &["code"],
        )
        .expect("a valid metric");
        let build_info = IntGaugeVec::new(
            Opts::new("atenet_router_build_info", "Always 1; the labels say which build is running."),
            &["version", "revision"],
        )
        .expect("a valid metric");
        build_info
            .with_label_values(&[crate::telemetry::version::VERSION, crate::telemetry::version::REVISION])
            .set(1);
        let timer_lateness = Histogram::with_opts(
            HistogramOpts::new(
                "atenet_router_timer_lateness_seconds",
                "How late the timer thread ran each retry or deadline against its schedule.",
            )
            .buckets(vec![0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25]),
        )
        .expect("a valid metric");

        let lot = LotInstruments {
            active: parking_active.clone(),
            rejected: Band::ALL.map(|b| parking_rejected.with_label_values(&[b.name()])),
            preempted: Band::ALL.map(|b| parking_preempted.with_label_values(&[b.name()])),
            early_rejected: early_rejected.clone(),
            atespace_rejected: atespace_rejected.clone(),
            decisions: LotDecision::ALL.map(|d| park_decisions.with_label_values(&[d.name()])),
            waits: WaitOutcome::ALL
                .map(|o| Band::ALL.map(|b| parking_wait.with_label_values(&[o.name(), b.name()]))),
            longest_wait_micros: Arc::default(),
        };
        let route = RouteOutcome::ALL
            .iter()
            .flat_map(|o| {
                ResumeLabel::ALL.iter().map(|r| route_duration.with_label_values(&[o.name(), r.name()]))
            })
            .collect();
        let attempts = Code::ALL.iter().map(|c| resume_attempts.with_label_values(&[c.name()])).collect();
        let atespace_refused = IntCounterVec::new(
            Opts::new(
                "atenet_router_atespace_refused_total",
                "Requests refused at once because their atespace held its share of the flights or of the \
                 requests the router holds (B79, B80).",
            ),
            &["share"],
        )
        .expect("a valid metric");
        let instruments = Instruments {
            lot,
            route,
            attempts,
            streams_active: gauge(
                "atenet_router_extproc_streams_active",
                "ext_proc streams open now (each holds one Envoy circuit-breaker slot).",
            ),
            parking_lot_max: gauge(
                "atenet_router_parking_lot_max",
                "The lot's capacity (--parked-request-max); 0 when parking is disabled.",
            ),
            timer_lateness,
            drain_verdicts: counter("atenet_router_drain_verdicts_total", "Verdicts given after a drain started."),
            drain_cancelled: counter(
                "atenet_router_drain_cancelled_total",
                "ext_proc streams cut by the final cancel when the drain timeout passed.",
            ),
            invalid_targets: counter(
                "atenet_router_invalid_target_total",
                "Requests answered 404 invalid actor reference (B4).",
            ),
            flights_active: gauge(
                "atenet_router_flights_active",
                "Flights in progress: actors being resumed, each with at most one ResumeActor call running.",
            ),
            oldest_attempt: Gauge::new(
                "atenet_router_oldest_attempt_seconds",
                "How long the longest-running ResumeActor attempt has run; 0 when none runs (B92).",
            )
            .expect("a valid metric name"),
            saturation_groups: gauge(
                "atenet_router_saturation_groups",
                "Saturation groups with flights waiting: full worker pools, or the control plane (B112).",
            ),
            saturation_group_flights: gauge(
                "atenet_router_saturation_group_flights",
                "Flights waiting in saturation groups for their turn to ask ResumeActor (B112).",
            ),
            flights_rejected: counter(
                "atenet_router_flights_rejected_total",
                "Requests refused because --flight-max flights were in progress (B58).",
            ),
            flights_abandoned: counter(
                "atenet_router_flights_abandoned_total",
                "Flights ended without an outcome because no caller was left when a retry was due (B78).",
            ),
            calls: CallGauges {
                open: gauge(
                    "atenet_router_resume_calls_open",
                    "ResumeActor calls open now, at most --ateapi-max-calls (B97).",
                ),
                waiting: gauge(
                    "atenet_router_resume_attempts_waiting",
                    "ResumeActor attempts waiting, unsent, for one of --ateapi-max-calls calls to end (B97).",
                ),
            },
            atespace_refused: AtespaceShare::ALL.map(|s| atespace_refused.with_label_values(&[s.name()])),
            streams_refused: counter(
                "atenet_router_extproc_streams_refused_total",
                "ext_proc streams refused with RESOURCE_EXHAUSTED because --extproc-max-streams were open (B74).",
            ),
            streams_silent_closed: counter(
                "atenet_router_extproc_streams_silent_closed_total",
                "ext_proc streams closed because they sent no message within 5 s of opening (B74).",
            ),
            priority_unknown: counter(
                "atenet_router_priority_unknown_total",
                "Requests whose ate-priority header named no band, treated as standard (B115).",
            ),
            certificate_expiry: IntGaugeVec::new(
                Opts::new(
                    "atenet_router_certificate_expiry_timestamp_seconds",
                    "The notAfter of the certificate the router presents, as Unix seconds, by which \
                     certificate (B106).",
                ),
                &["certificate"],
            )
            .expect("a valid metric"),
            registry: registry.clone(),
        };
        for collector in [
            Box::new(build_info) as Box<dyn Collector>,
            // RSS, CPU, threads and open files of this process, as
            // process_resident_memory_bytes, process_threads, ...
            Box::new(prometheus::process_collector::ProcessCollector::for_self()),
            Box::new(parking_active),
            Box::new(parking_wait),
            Box::new(parking_rejected),
            Box::new(parking_preempted),
            Box::new(early_rejected),
            Box::new(atespace_rejected),
            Box::new(park_decisions),
            Box::new(route_duration),
            Box::new(resume_attempts),
            Box::new(instruments.streams_active.clone()),
            Box::new(instruments.parking_lot_max.clone()),
            Box::new(instruments.timer_lateness.clone()),
            Box::new(instruments.drain_verdicts.clone()),
            Box::new(instruments.drain_cancelled.clone()),
            Box::new(instruments.invalid_targets.clone()),
            Box::new(instruments.flights_active.clone()),
            Box::new(instruments.oldest_attempt.clone()),
            Box::new(instruments.saturation_groups.clone()),
            Box::new(instruments.saturation_group_flights.clone()),
            Box::new(instruments.flights_rejected.clone()),
            Box::new(instruments.flights_abandoned.clone()),
            Box::new(instruments.calls.open.clone()),
            Box::new(instruments.calls.waiting.clone()),
            Box::new(atespace_refused),
            Box::new(instruments.streams_refused.clone()),
            Box::new(instruments.streams_silent_closed.clone()),
            Box::new(instruments.priority_unknown.clone()),
            Box::new(instruments.certificate_expiry.clone()),
        ] {
            register(collector);
        }
        Metrics { inner: Arc::new(instruments) }
    }

    /// The lot's instruments, for [`crate::parking::lot::ParkingLot::new`].
    pub fn lot_instruments(&self) -> LotInstruments {
        self.inner.lot.clone()
    }

    /// Records one request_headers exchange.
    pub fn observe_route(&self, outcome: RouteOutcome, resume: ResumeLabel, seconds: f64) {
        self.inner.route[outcome as usize * ResumeLabel::ALL.len() + resume as usize].observe(seconds);
    }

    /// Counts one ResumeActor attempt.
    pub fn count_attempt(&self, code: Code) {
        self.inner.attempts[code as usize].inc();
    }

    /// ResumeActor attempts so far that ended with `code`.
    pub fn attempts(&self, code: Code) -> u64 {
        self.inner.attempts[code as usize].get()
    }

    /// The parked-wait histogram of every outcome together: its
    /// bucket bounds, and the cumulative count of each bucket with `+Inf`
    /// last, for the status page's wait percentiles.
    pub fn parked_wait_buckets(&self) -> (&'static [f64], Vec<u64>) {
        let mut cumulative = vec![0; WAIT_BUCKETS.len() + 1];
        for histogram in self.inner.lot.waits.iter().flatten() {
            let metric = histogram.metric();
            let histogram = metric.get_histogram();
            for (sum, bucket) in cumulative.iter_mut().zip(histogram.get_bucket()) {
                *sum += bucket.get_cumulative_count();
            }
            cumulative[WAIT_BUCKETS.len()] += histogram.get_sample_count();
        }
        (WAIT_BUCKETS, cumulative)
    }

    /// The longest parked wait recorded since the last call, which it
    /// starts again.
    pub fn take_longest_parked_wait(&self) -> Duration {
        Duration::from_micros(self.inner.lot.longest_wait_micros.swap(0, Ordering::Relaxed))
    }

    /// Requests shed by a full lot so far.
    pub fn parking_rejected(&self) -> u64 {
        self.inner.lot.rejected.iter().map(IntCounter::get).sum()
    }

    /// Counts a request whose `ate-priority` named no band.
    pub fn count_priority_unknown(&self) {
        self.inner.priority_unknown.inc();
    }

    /// `atenet_router_extproc_streams_active`: one more stream open, or one
    /// fewer (`delta` of 1 or -1).
    pub fn streams_opened(&self, delta: i64) {
        self.inner.streams_active.add(delta);
    }

    /// ext_proc streams open now.
    #[cfg(test)]
    pub fn streams_active(&self) -> i64 {
        self.inner.streams_active.get()
    }

    /// A stream refused at the cap (B74).
    pub fn count_stream_refused(&self) {
        self.inner.streams_refused.inc();
    }

    /// Streams refused at the cap so far.
    #[cfg(test)]
    pub fn streams_refused(&self) -> u64 {
        self.inner.streams_refused.get()
    }

    /// A stream closed for sending nothing (B74).
    pub fn count_stream_silent_closed(&self) {
        self.inner.streams_silent_closed.inc();
    }

    /// Sets `atenet_router_parking_lot_max`.
    pub fn set_lot_max(&self, max: usize) {
        self.inner.parking_lot_max.set(i64::try_from(max).unwrap_or(i64::MAX));
    }

    /// Sets `atenet_router_flights_active`.
    pub fn set_flights_active(&self, flights: usize) {
        self.inner.flights_active.set(i64::try_from(flights).unwrap_or(i64::MAX));
    }

    /// Sets `atenet_router_oldest_attempt_seconds`: 0 when no attempt runs.
    pub fn set_oldest_attempt(&self, running_for: Option<std::time::Duration>) {
        self.inner.oldest_attempt.set(running_for.map_or(0.0, |d| d.as_secs_f64()));
    }

    /// Sets the saturation gauges: groups with flights waiting, and those
    /// flights (B112).
    pub fn set_saturation(&self, (groups, flights): (usize, usize)) {
        self.inner.saturation_groups.set(i64::try_from(groups).unwrap_or(i64::MAX));
        self.inner.saturation_group_flights.set(i64::try_from(flights).unwrap_or(i64::MAX));
    }

    /// The timer thread's lateness histogram.
    pub fn timer_lateness(&self) -> Histogram {
        self.inner.timer_lateness.clone()
    }

    /// Counts a verdict given during a drain.
    pub fn count_drain_verdict(&self) {
        self.inner.drain_verdicts.inc();
    }

    /// Verdicts given after a drain started.
    #[cfg(feature = "testkit")]
    pub fn drain_verdicts(&self) -> u64 {
        self.inner.drain_verdicts.get()
    }

    /// Counts streams cut at the drain timeout.
    pub fn count_drain_cancelled(&self, streams: u64) {
        self.inner.drain_cancelled.inc_by(streams);
    }

    /// Streams cut at the drain timeout.
    #[cfg(feature = "testkit")]
    pub fn drain_cancelled(&self) -> u64 {
        self.inner.drain_cancelled.get()
    }

    /// Counts a request naming no valid actor (B4).
    pub fn count_invalid_target(&self) {
        self.inner.invalid_targets.inc();
    }

    /// Counts a request refused a flight (B58).
    pub fn count_flight_rejected(&self) {
        self.inner.flights_rejected.inc();
    }

    /// `atenet_router_trace_spans_dropped_total`, registered by its first
    /// call: a router without `--otlp-traces-address` has no such series
    /// (B124).
    pub fn trace_spans_dropped(&self) -> IntCounter {
        let dropped = counter(
            "atenet_router_trace_spans_dropped_total",
            "Spans not exported: the exporter's queue was full, or their batch's export failed.",
        );
        // Called once per router, each with its own registry.
        if let Err(e) = self.inner.registry.register(Box::new(dropped.clone())) {
            log::error!("atenet_router_trace_spans_dropped_total not registered: {e}");
        }
        dropped
    }

    /// `atenet_router_flights_abandoned_total`, for the flight table (B78).
    pub fn flights_abandoned(&self) -> IntCounter {
        self.inner.flights_abandoned.clone()
    }

    /// The gauges of the bound on open ResumeActor calls (B97).
    pub fn call_gauges(&self) -> CallGauges {
        self.inner.calls.clone()
    }

    /// Counts a request its atespace's `share` refused (B79, B80).
    pub fn count_atespace_refused(&self, share: AtespaceShare) {
        self.inner.atespace_refused[share as usize].inc();
    }

    /// The gauge of the notAfter of the `role` certificate in use (B106).
    pub fn certificate_expiry(&self, role: CertificateRole) -> IntGauge {
        self.inner.certificate_expiry.with_label_values(&[role.name()])
    }

    /// Text exposition format, as served on `/metrics`.
    pub fn render(&self) -> String {
        let mut out = Vec::new();
        TextEncoder::new().encode(&self.inner.registry.gather(), &mut out).expect("encoding to memory");
        String::from_utf8(out).expect("text exposition is UTF-8")
    }
}

#[cfg(test)]
impl Metrics {
    /// Wait samples recorded with `outcome`.
    pub(crate) fn waits(&self, outcome: WaitOutcome) -> u64 {
        self.inner.lot.waits[outcome as usize].iter().map(Histogram::get_sample_count).sum()
    }

    /// Wait samples recorded with `outcome` for callers of `band`.
    pub(crate) fn band_waits(&self, outcome: WaitOutcome, band: Band) -> u64 {
        self.inner.lot.waits[outcome as usize][band as usize].get_sample_count()
    }

    /// Callers of `band` preempted (B118) and shed by a full lot.
    pub(crate) fn band_refusals(&self, band: Band) -> (u64, u64) {
        let lot = &self.inner.lot;
        (lot.preempted[band as usize].get(), lot.rejected[band as usize].get())
    }

    /// Callers counted with `decision`.
    pub(crate) fn decisions(&self, decision: LotDecision) -> u64 {
        self.inner.lot.decisions[decision as usize].get()
    }

    /// Slots held now, as the gauge says.
    pub(crate) fn parking_active(&self) -> i64 {
        self.inner.lot.active.get()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_lists_are_in_discriminant_order() {
        assert!(RouteOutcome::ALL.iter().enumerate().all(|(i, o)| *o as usize == i));
        assert!(ResumeLabel::ALL.iter().enumerate().all(|(i, r)| *r as usize == i));
        assert!(Code::ALL.iter().enumerate().all(|(i, c)| *c as usize == i && *c as i32 == i as i32));
        assert!(AtespaceShare::ALL.iter().enumerate().all(|(i, s)| *s as usize == i));
    }

    #[test]
    fn b91_parked_wait_buckets_add_every_outcome_up() {
        let metrics = Metrics::new();
        let lot = metrics.lot_instruments();
        lot.waits[WaitOutcome::Served as usize][Band::Standard as usize].observe(0.3);
        lot.waits[WaitOutcome::Canceled as usize][Band::Critical as usize].observe(0.3);
        lot.waits[WaitOutcome::BudgetExhausted as usize][Band::Sheddable as usize].observe(99.0);
        let (bounds, cumulative) = metrics.parked_wait_buckets();
        assert_eq!((bounds.len() + 1, cumulative.len()), (17, 17));
        let at = |bound: f64| cumulative[bounds.iter().position(|b| *b == bound).unwrap()];
        assert_eq!((at(0.25), at(0.5), at(60.0), cumulative[16]), (0, 2, 2, 3), "{cumulative:?}");
    }

    #[test]
    fn every_labelled_series_is_exported_from_the_start() {
        let text = Metrics::new().render();
        let series = |name: &str| text.lines().filter(|l| l.starts_with(name)).count();
        assert_eq!(
            series("atenet_router_route_duration_seconds_count"),
            RouteOutcome::ALL.len() * ResumeLabel::ALL.len()
        );
        assert_eq!(series("atenet_router_resume_attempts_total"), Code::ALL.len());
        assert_eq!(series("atenet_router_park_decisions_total"), LotDecision::ALL.len());
        assert_eq!(series("atenet_router_atespace_refused_total"), AtespaceShare::ALL.len());
        assert_eq!(
            series("atenet_router_parking_wait_duration_seconds_count"),
            WaitOutcome::ALL.len() * Band::ALL.len()
        );
        assert_eq!(series("atenet_router_parking_rejected_total"), Band::ALL.len());
        assert_eq!(series("atenet_router_parking_preempted_total"), Band::ALL.len());
    }
}
