//! The engine of `parkload`: an ext_proc load generator that plays Envoy's
//! part — one stream per request, a `request_headers` message with
//! `ate-target-actor`, the verdict read back, the stream reset.
//!
//! Requests are futures on the client's own completion-queue thread, so a
//! run with 10,000 requests in flight costs no more threads than a run with
//! one.
//!
//! An open-loop run (a rate) keeps a timetable: request `i` is due `i / rate`
//! seconds after the run begins, and its latency counts from then, not from
//! when it was sent. When `concurrency` requests are in flight the next one
//! waits for a free slot and goes late, and the wait is part of its latency:
//! a slow server cannot hide its queue by slowing the client down
//! (coordinated omission). A closed loop has no timetable and times each
//! request from its send.
//!
//! Latencies go into HDR histograms (microseconds, 3 significant digits, up
//! to an hour): constant memory however long the run, and runs merge.
//!
//! The same engine drives an HTTP endpoint instead ([`Target::Http`],
//! `parkload --http`), such as Envoy's listener in front of the router: a
//! GET per request with the actor in `ate-target-actor`, over keep-alive
//! HTTP/1.1 connections ([`http`]). There each request in flight is a
//! thread with its own connection (std's blocking sockets, no async
//! runtime), so an HTTP run holds at most [`MAX_HTTP_IN_FLIGHT`].

pub mod http;

use std::collections::BTreeMap;
use std::fmt::Write;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use futures::future::{select, Either};
use futures::{SinkExt, StreamExt};
use grpcio::{
    CallOption, ChannelBuilder, Client, ClientDuplexReceiver, ClientDuplexSender, EnvBuilder, WriteFlags,
};
use hdrhistogram::Histogram;
use parking_lot::{Condvar, Mutex};

use crate::parking::timer::{sleep_until, Scheduler, TimerThread};
use crate::proto::base::{HeaderMap, HeaderValue};
use crate::proto::external_processor::{HttpHeaders, ProcessingRequest, ProcessingResponse};
use crate::proto::EXT_PROC_PROCESS;
use crate::telemetry::logging::json_string;

/// An open-loop request sent later than this after its scheduled time is
/// late: every slot was taken when it was due, or the generator itself fell
/// behind.
pub const LATE: Duration = Duration::from_millis(1);

/// The verdict key of a request that got no verdict within its timeout.
pub const CLIENT_TIMEOUT: &str = "client-timeout";

/// How the verdict keys of requests that failed at the gRPC level begin.
pub const GRPC_ERROR: &str = "grpc-error";

/// The longest latency a histogram tells apart, in microseconds: an hour.
/// Longer ones are recorded as an hour.
const MAX_LATENCY_US: u64 = 3_600_000_000;

/// The most requests an HTTP run keeps in flight: each is a thread with a
/// connection of its own.
pub const MAX_HTTP_IN_FLIGHT: usize = 10_000;

/// The stack of an HTTP run's request threads: they parse a response head
/// and discard bodies, in buffers on the heap.
const HTTP_THREAD_STACK: usize = 128 * 1024;
/// How long a closed loop's request thread waits after a connection that
/// could not be made: the first pause, doubled while they keep failing, up
/// to the last.
const CONNECT_PAUSE_MIN: Duration = Duration::from_millis(10);
const CONNECT_PAUSE_MAX: Duration = Duration::from_secs(1);

/// The fastest rate a timetable keeps: one request a nanosecond, the
/// clock's resolution. Faster rates are run at this one.
const MAX_RATE: f64 = 1e9;

/// How actors are picked for each request.
#[derive(Clone, Debug, PartialEq)]
pub enum Distribution {
    /// Every actor equally likely.
    Uniform,
    /// Actor `i` (0-based) with weight `1 / (i + 1)^s`.
    Zipf(f64),
    /// The first actor gets `fraction` of requests; the rest share the remainder.
    Hot(f64),
    /// Each request takes the next actor in order, wrapping around.
    RoundRobin,
}

/// When a run ends.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Stop {
    /// Stop sending after this long, then wait for the requests in flight.
    After(Duration),
    /// Send this many requests, then wait for them.
    Count(u64),
}

/// What a run sends its requests to.
#[derive(Clone, Debug, PartialEq)]
pub enum Target {
    /// The router's ext_proc port: parkload plays Envoy.
    ExtProc(SocketAddr),
    /// An HTTP endpoint, Envoy's listener say: parkload plays the clients.
    Http(http::HttpTarget),
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Target::ExtProc(addr) => write!(f, "{addr}"),
            Target::Http(target) => f.write_str(&target.url),
        }
    }
}

/// One run's parameters.
#[derive(Clone, Debug)]
pub struct LoadSpec {
    pub target: Target,
    /// Requests in flight at most. A closed loop keeps exactly this many;
    /// an open loop's next request waits for one of them to end.
    pub concurrency: usize,
    /// Requests per second (open loop); `None`, or a rate that is not
    /// positive, is a closed loop.
    pub rate: Option<f64>,
    pub stop: Stop,
    pub actors: Vec<String>,
    pub distribution: Distribution,
    /// Print a progress line to stderr this often.
    pub progress: Option<Duration>,
    /// A `grpc-timeout` header to send with every request; over HTTP
    /// an HTTP header of that name, which Envoy passes on to the router.
    pub grpc_timeout: Option<CallerDeadline>,
    /// How long a request waits for its verdict before it is cancelled and
    /// counted as [`CLIENT_TIMEOUT`], so that no request can hang a run.
    pub request_timeout: Duration,
}

/// A deadline the load's callers announce in `grpc-timeout`: the header's
/// value as sent, and what it means.
#[derive(Clone, Debug, PartialEq)]
pub struct CallerDeadline {
    pub header: String,
    pub timeout: Duration,
}

impl CallerDeadline {
    /// Parses gRPC's `TimeoutValue TimeoutUnit` (e.g. `300m`); `None` if the
    /// router would ignore it as malformed.
    pub fn parse(value: &str) -> Option<CallerDeadline> {
        crate::parking::deadline::grpc_timeout(value.as_bytes())
            .map(|timeout| CallerDeadline { header: value.to_string(), timeout })
    }
}

impl std::fmt::Display for Distribution {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Distribution::Uniform => f.write_str("uniform"),
            Distribution::Zipf(s) => write!(f, "zipf s={s}"),
            Distribution::Hot(fraction) => write!(f, "hot {fraction}"),
            Distribution::RoundRobin => f.write_str("round-robin"),
        }
    }
}

impl LoadSpec {
    /// The open loop's rate; `None` for a closed loop.
    fn open_loop_rate(&self) -> Option<f64> {
        self.rate.filter(|rate| *rate > 0.0)
    }

    /// One line saying what the run does, to head the human summary.
    fn describe(&self) -> String {
        let mut out = format!("target {}: ", self.target);
        match self.open_loop_rate() {
            Some(rate) => {
                let _ = write!(out, "open loop at {rate}/s, at most {} in flight", self.concurrency);
            }
            None => {
                let _ = write!(out, "closed loop, {} in flight", self.concurrency);
            }
        }
        match self.stop {
            Stop::After(d) => {
                let _ = write!(out, ", for {}", crate::cli::godur::format(d));
            }
            Stop::Count(n) => {
                let _ = write!(out, ", {n} requests");
            }
        }
        let _ = write!(
            out,
            "; {} actor{}, {}; request timeout {}",
            self.actors.len(),
            if self.actors.len() == 1 { "" } else { "s" },
            self.distribution,
            crate::cli::godur::format(self.request_timeout)
        );
        if let Some(deadline) = &self.grpc_timeout {
            let _ = write!(out, "; grpc-timeout {}", deadline.header);
        }
        out
    }

    /// The parameters as a JSON object, so that a saved summary says what
    /// produced it.
    fn json(&self) -> String {
        let (duration, count) = match self.stop {
            Stop::After(d) => (json_number(d.as_secs_f64()), "null".to_string()),
            Stop::Count(n) => ("null".to_string(), n.to_string()),
        };
        format!(
            "{{\"target\":{},\"concurrency\":{},\"rate\":{},\"duration_seconds\":{duration},\"count\":{count},\"actors\":{},\"distribution\":{},\"grpc_timeout\":{},\"request_timeout_seconds\":{}}}",
            json_string(&self.target.to_string()),
            self.concurrency,
            self.open_loop_rate().map_or_else(|| "null".to_string(), json_number),
            self.actors.len(),
            json_string(&self.distribution.to_string()),
            self.grpc_timeout.as_ref().map_or_else(|| "null".to_string(), |d| json_string(&d.header)),
            json_number(self.request_timeout.as_secs_f64()),
        )
    }
}

/// A JSON number, or `null` for what JSON cannot say (NaN, infinities).
fn json_number(x: f64) -> String {
    if x.is_finite() {
        x.to_string()
    } else {
        "null".to_string()
    }
}

/// What a run measured.
#[derive(Clone, Debug)]
pub struct LoadReport {
    pub elapsed: Duration,
    /// Requests that got a verdict, failed or timed out.
    pub completed: u64,
    /// Open loop: requests sent more than [`LATE`] after their scheduled time.
    pub late: u64,
    /// Open loop for a duration: requests scheduled within it but not yet
    /// sent when it was up (every slot was still taken).
    pub unsent: u64,
    /// Counts by `200 routed`, `<status> <x-atenet-reason>`, `grpc-error
    /// <code>`, or [`CLIENT_TIMEOUT`]; over HTTP by `<status>
    /// <x-atenet-reason>`, `<status>` for a response without one (the
    /// worker's), `http-error <what>`, or [`CLIENT_TIMEOUT`].
    pub verdicts: BTreeMap<String, u64>,
    /// The same counts for each atespace (the actor id's part before `/`).
    pub by_atespace: BTreeMap<String, BTreeMap<String, u64>>,
    /// With a caller deadline: verdicts that came after it.
    pub overdue: u64,
    /// With a caller deadline: the time those verdicts came after it, summed:
    /// what the router held for callers that had already given up.
    pub overdue_seconds: f64,
    /// Requests completed in each second of the run; the last entry may
    /// cover part of a second.
    pub per_second: Vec<u64>,
    /// Every latency, in microseconds.
    latency: Histogram<u64>,
    /// Every service time (from the actual send to the end), in
    /// microseconds: equal to `latency` in a closed loop; in an open loop
    /// what the server took, without the client's own lateness.
    service: Histogram<u64>,
    /// The same, one histogram for each key in `verdicts`.
    latency_by_verdict: BTreeMap<String, Histogram<u64>>,
}

impl Default for LoadReport {
    fn default() -> LoadReport {
        LoadReport {
            elapsed: Duration::ZERO,
            completed: 0,
            late: 0,
            unsent: 0,
            verdicts: BTreeMap::new(),
            by_atespace: BTreeMap::new(),
            overdue: 0,
            overdue_seconds: 0.0,
            per_second: Vec::new(),
            latency: histogram(),
            service: histogram(),
            latency_by_verdict: BTreeMap::new(),
        }
    }
}

/// One finished request, as a report records it.
struct Outcome<'a> {
    actor: &'a str,
    key: String,
    /// When it finished, counted from the run's start: its second in
    /// `per_second`.
    at: Duration,
    /// From its scheduled time (open loop) or its send (closed loop) to its
    /// end.
    latency: Duration,
    /// From its send to its end.
    service: Duration,
    /// How long after the caller's deadline its verdict came, if it did.
    overdue: Option<Duration>,
}

impl LoadReport {
    /// Completed requests per second.
    pub fn throughput(&self) -> f64 {
        self.completed as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    /// The `q` quantile (0..=1) of latency, in microseconds (0 with none).
    pub fn quantile_us(&self, q: f64) -> u32 {
        quantile_us(&self.latency, q)
    }

    /// The `q` quantile of the latency of requests with `verdict` (a key of
    /// `verdicts`), in microseconds (0 with none).
    pub fn verdict_quantile_us(&self, verdict: &str, q: f64) -> u32 {
        self.latency_by_verdict.get(verdict).map_or(0, |latency| quantile_us(latency, q))
    }

    /// The longest latency, in microseconds (0 with none).
    pub fn max_us(&self) -> u32 {
        max_us(&self.latency)
    }

    /// The `q` quantile of service time (from each request's actual send),
    /// in microseconds: what the server took, without the client's lateness.
    pub fn service_quantile_us(&self, q: f64) -> u32 {
        quantile_us(&self.service, q)
    }

    /// Requests that failed at the gRPC (or HTTP) level or timed out: what a
    /// run against a healthy router should have none of.
    pub fn errors(&self) -> u64 {
        self.verdicts.iter().filter(|(key, _)| is_error(key)).map(|(_, n)| n).sum()
    }

    /// Adds `other`'s requests to these, as if the runs went one after the
    /// other: elapsed times add up and `per_second` continues with
    /// `other`'s seconds.
    pub fn merge(&mut self, other: &LoadReport) {
        self.elapsed += other.elapsed;
        self.completed += other.completed;
        self.late += other.late;
        self.unsent += other.unsent;
        add_counts(&mut self.verdicts, &other.verdicts);
        for (atespace, counts) in &other.by_atespace {
            add_counts(self.by_atespace.entry(atespace.clone()).or_default(), counts);
        }
        self.overdue += other.overdue;
        self.overdue_seconds += other.overdue_seconds;
        self.per_second.extend_from_slice(&other.per_second);
        add_histogram(&mut self.latency, &other.latency);
        add_histogram(&mut self.service, &other.service);
        for (verdict, latency) in &other.latency_by_verdict {
            add_histogram(self.latency_by_verdict.entry(verdict.clone()).or_insert_with(histogram), latency);
        }
    }

    fn record(&mut self, outcome: Outcome<'_>) {
        let us = u64::try_from(outcome.latency.as_micros()).unwrap_or(u64::MAX);
        self.latency.saturating_record(us);
        self.service.saturating_record(u64::try_from(outcome.service.as_micros()).unwrap_or(u64::MAX));
        match self.latency_by_verdict.get_mut(&outcome.key) {
            Some(latency) => latency.saturating_record(us),
            None => {
                let mut latency = histogram();
                latency.saturating_record(us);
                self.latency_by_verdict.insert(outcome.key.clone(), latency);
            }
        }
        let atespace = outcome.actor.split_once('/').map_or("", |(a, _)| a);
        match self.by_atespace.get_mut(atespace) {
            Some(counts) => bump(counts, &outcome.key),
            None => {
                self.by_atespace.insert(atespace.to_string(), BTreeMap::from([(outcome.key.clone(), 1)]));
            }
        }
        bump(&mut self.verdicts, &outcome.key);
        if let Some(past) = outcome.overdue {
            self.overdue += 1;
            self.overdue_seconds += past.as_secs_f64();
        }
        let second = outcome.at.as_secs() as usize;
        if self.per_second.len() <= second {
            self.per_second.resize(second + 1, 0);
        }
        self.per_second[second] += 1;
        self.completed += 1;
    }

    /// Closes the report of a run that took `elapsed`: its seconds without a
    /// completion, at the end, still get their zero in `per_second`.
    fn finish(&mut self, elapsed: Duration) {
        self.elapsed = elapsed;
        let seconds = elapsed.as_secs() + u64::from(elapsed.subsec_nanos() > 0);
        if (self.per_second.len() as u64) < seconds {
            self.per_second.resize(seconds as usize, 0);
        }
    }

    /// The human summary of a run of `spec`.
    pub fn summary(&self, spec: &LoadSpec) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "{}", spec.describe());
        let _ = writeln!(
            out,
            "requests: {} in {:.2}s = {:.1} req/s",
            self.completed,
            self.elapsed.as_secs_f64(),
            self.throughput()
        );
        if spec.open_loop_rate().is_some() {
            let _ = writeln!(
                out,
                "late: {} sent more than {} ms after their scheduled time (latency counts from that time)",
                self.late,
                LATE.as_millis()
            );
            let _ = writeln!(out, "unsent: {} scheduled but not sent when the time was up", self.unsent);
            let _ = writeln!(
                out,
                "service ms (from each actual send): p50 {:.3}  p99 {:.3}  max {:.3}",
                ms(self.service_quantile_us(0.5)),
                ms(self.service_quantile_us(0.99)),
                ms(max_us(&self.service))
            );
        }
        let level = match spec.target {
            Target::ExtProc(_) => "gRPC",
            Target::Http(_) => "HTTP",
        };
        let _ = writeln!(out, "errors: {} ({level} errors and client timeouts)", self.errors());
        let _ = writeln!(
            out,
            "latency ms: p50 {:.3}  p90 {:.3}  p99 {:.3}  p99.9 {:.3}  max {:.3}",
            ms(self.quantile_us(0.5)),
            ms(self.quantile_us(0.9)),
            ms(self.quantile_us(0.99)),
            ms(self.quantile_us(0.999)),
            ms(self.max_us())
        );
        let _ = writeln!(out, "verdicts:");
        for (verdict, n) in &self.verdicts {
            let (p50, p99) = self
                .latency_by_verdict
                .get(verdict)
                .map_or((0, 0), |latency| (quantile_us(latency, 0.5), quantile_us(latency, 0.99)));
            let _ = writeln!(out, "  {n:>9}  p50 {:>10.3} ms  p99 {:>10.3} ms  {verdict}", ms(p50), ms(p99));
        }
        if self.by_atespace.len() > 1 {
            for (atespace, verdicts) in &self.by_atespace {
                let _ = writeln!(out, "verdicts for atespace {atespace}:");
                for (verdict, n) in verdicts {
                    let _ = writeln!(out, "  {n:>9}  {verdict}");
                }
            }
        }
        if self.overdue > 0 {
            let _ = writeln!(
                out,
                "after the caller's deadline: {} verdicts, {:.3} s past it in total",
                self.overdue, self.overdue_seconds
            );
        }
        out
    }

    /// The machine summary of a run of `spec`.
    pub fn json(&self, spec: &LoadSpec) -> String {
        let counts = |map: &BTreeMap<String, u64>| {
            map.iter().map(|(k, v)| format!("{}:{v}", json_string(k))).collect::<Vec<_>>().join(",")
        };
        let by_atespace: Vec<String> =
            self.by_atespace.iter().map(|(a, m)| format!("{}:{{{}}}", json_string(a), counts(m))).collect();
        let by_verdict: Vec<String> = self
            .latency_by_verdict
            .iter()
            .map(|(verdict, latency)| {
                format!(
                    "{}:{{\"count\":{},{}}}",
                    json_string(verdict),
                    latency.len(),
                    latency_ms_json(latency, &[("p50", 0.5), ("p90", 0.9), ("p99", 0.99)])
                )
            })
            .collect();
        let per_second: Vec<String> = self.per_second.iter().map(u64::to_string).collect();
        format!(
            "{{\"requests\":{},\"elapsed_seconds\":{:.6},\"throughput\":{:.3},\"late\":{},\"unsent\":{},\"errors\":{},\"latency_ms\":{{{}}},\"service_ms\":{{{}}},\"latency_ms_by_verdict\":{{{}}},\"verdicts\":{{{}}},\"by_atespace\":{{{}}},\"overdue\":{},\"overdue_seconds\":{:.6},\"per_second\":[{}],\"params\":{}}}",
            self.completed,
            self.elapsed.as_secs_f64(),
            self.throughput(),
            self.late,
            self.unsent,
            self.errors(),
            latency_ms_json(&self.latency, &[("p50", 0.5), ("p90", 0.9), ("p99", 0.99), ("p999", 0.999)]),
            latency_ms_json(&self.service, &[("p50", 0.5), ("p90", 0.9), ("p99", 0.99), ("p999", 0.999)]),
            by_verdict.join(","),
            counts(&self.verdicts),
            by_atespace.join(","),
            self.overdue,
            self.overdue_seconds,
            per_second.join(","),
            spec.json()
        )
    }
}

/// Whether a verdict key is a failure of the request itself rather than a
/// verdict of the router.
fn is_error(key: &str) -> bool {
    key.starts_with(GRPC_ERROR) || key.starts_with(http::HTTP_ERROR) || key == CLIENT_TIMEOUT
}

/// An empty latency histogram; every one has the same bounds, so any two add.
fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, MAX_LATENCY_US, 3).expect("constant histogram bounds are valid")
}

fn add_histogram(into: &mut Histogram<u64>, from: &Histogram<u64>) {
    into.add(from).expect("latency histograms share their bounds");
}

fn quantile_us(latency: &Histogram<u64>, q: f64) -> u32 {
    u32::try_from(latency.value_at_quantile(q)).unwrap_or(u32::MAX)
}

fn max_us(latency: &Histogram<u64>) -> u32 {
    u32::try_from(latency.max()).unwrap_or(u32::MAX)
}

fn ms(us: u32) -> f64 {
    f64::from(us) / 1000.0
}

/// `"name":ms,...` for each named quantile, then `"max":ms`.
fn latency_ms_json(latency: &Histogram<u64>, quantiles: &[(&str, f64)]) -> String {
    let mut out = String::new();
    for (name, q) in quantiles {
        let _ = write!(out, "\"{name}\":{:.3},", ms(quantile_us(latency, *q)));
    }
    let _ = write!(out, "\"max\":{:.3}", ms(max_us(latency)));
    out
}

fn bump(counts: &mut BTreeMap<String, u64>, key: &str) {
    match counts.get_mut(key) {
        Some(n) => *n += 1,
        None => {
            counts.insert(key.to_string(), 1);
        }
    }
}

fn add_counts(into: &mut BTreeMap<String, u64>, from: &BTreeMap<String, u64>) {
    for (key, n) in from {
        *into.entry(key.clone()).or_default() += n;
    }
}

/// Picks actors per a [`Distribution`].
#[derive(Clone, Debug)]
pub struct ActorPicker {
    actors: Arc<Vec<String>>,
    /// Cumulative weights, last = 1.0; empty for uniform and round robin.
    cdf: Arc<Vec<f64>>,
    /// The next index, for round robin.
    next: Option<Arc<AtomicU64>>,
}

impl ActorPicker {
    pub fn new(actors: Vec<String>, distribution: &Distribution) -> ActorPicker {
        assert!(!actors.is_empty(), "at least one actor");
        let n = actors.len();
        let weights: Vec<f64> = match distribution {
            Distribution::Uniform | Distribution::RoundRobin => Vec::new(),
            Distribution::Zipf(s) => (0..n).map(|i| 1.0 / ((i + 1) as f64).powf(*s)).collect(),
            Distribution::Hot(fraction) if n == 1 => vec![fraction.max(1.0)],
            Distribution::Hot(fraction) => {
                let rest = (1.0 - fraction) / (n - 1) as f64;
                (0..n).map(|i| if i == 0 { *fraction } else { rest }).collect()
            }
        };
        let total: f64 = weights.iter().sum();
        let mut running = 0.0;
        let cdf = weights
            .iter()
            .map(|w| {
                running += w / total;
                running
            })
            .collect();
        let next = (*distribution == Distribution::RoundRobin).then(|| Arc::new(AtomicU64::new(0)));
        ActorPicker { actors: Arc::new(actors), cdf: Arc::new(cdf), next }
    }

    pub fn pick(&self) -> &str {
        if let Some(next) = &self.next {
            let i = next.fetch_add(1, Ordering::Relaxed) as usize % self.actors.len();
            return &self.actors[i];
        }
        if self.cdf.is_empty() {
            return &self.actors[fastrand::usize(..self.actors.len())];
        }
        let u = fastrand::f64();
        let i = self.cdf.partition_point(|&c| c < u).min(self.actors.len() - 1);
        &self.actors[i]
    }
}

/// Why an `--actors` list does not expand.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ActorsError {
    /// A `{a..b}` that is not two numbers, `a <= b`.
    BadRange(String),
    /// More actors than [`MAX_ACTORS`].
    TooMany,
    /// Nothing in the list.
    Empty,
}

impl std::fmt::Display for ActorsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ActorsError::BadRange(part) => write!(f, "bad range in {part:?} (use e.g. {{0..63}})"),
            ActorsError::TooMany => write!(f, "more than {MAX_ACTORS} actors"),
            ActorsError::Empty => f.write_str("no actors"),
        }
    }
}

impl std::error::Error for ActorsError {}

/// The most actors one list may expand to.
pub const MAX_ACTORS: u64 = 10_000_000;

/// Expands `prefix{a..b}` (e.g. `demo/actor-{0..63}`) and comma lists.
pub fn expand_actors(spec: &str) -> Result<Vec<String>, ActorsError> {
    let mut out = Vec::new();
    for part in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        match (part.find('{'), part.find('}')) {
            (Some(open), Some(close)) if close > open => {
                let bad = || ActorsError::BadRange(part.to_string());
                let (lo, hi) = part[open + 1..close].split_once("..").ok_or_else(bad)?;
                let lo: u64 = lo.parse().map_err(|_| bad())?;
                let hi: u64 = hi.parse().map_err(|_| bad())?;
                if lo > hi {
                    return Err(bad());
                }
                if hi - lo >= MAX_ACTORS.saturating_sub(out.len() as u64) {
                    return Err(ActorsError::TooMany);
                }
                for i in lo..=hi {
                    out.push(format!("{}{i}{}", &part[..open], &part[close + 1..]));
                }
            }
            _ => out.push(part.to_string()),
        }
    }
    if out.is_empty() {
        return Err(ActorsError::Empty);
    }
    Ok(out)
}

/// A request_headers message carrying `headers` as raw values, with
/// end_of_stream set, as Envoy sends a GET.
pub fn headers_request(headers: &[(&str, &str)]) -> ProcessingRequest {
    let mut map = HeaderMap::new();
    for (key, value) in headers {
        let mut h = HeaderValue::new();
        h.key = key.to_string();
        h.raw_value = value.as_bytes().to_vec();
        map.headers.push(h);
    }
    let mut http = HttpHeaders::new();
    http.headers = Some(map).into();
    http.end_of_stream = true;
    let mut request = ProcessingRequest::new();
    request.set_request_headers(http);
    request
}

/// The request Envoy sends for `actor`, with a `grpc-timeout` if given.
pub fn request_for(actor: &str, grpc_timeout: Option<&str>) -> ProcessingRequest {
    let mut headers =
        vec![(":method", "GET"), (":path", "/"), (":authority", "load.test"), ("ate-target-actor", actor)];
    if let Some(value) = grpc_timeout {
        headers.push(("grpc-timeout", value));
    }
    headers_request(&headers)
}

/// The verdict's key in [`LoadReport::verdicts`].
pub fn verdict_key(reply: &ProcessingResponse) -> String {
    if reply.has_request_headers() {
        return "200 routed".to_string();
    }
    if reply.has_immediate_response() {
        let ir = reply.immediate_response();
        let reason = ir
            .headers
            .set_headers
            .iter()
            .find(|h| h.header.key == "x-atenet-reason")
            .map(|h| String::from_utf8_lossy(&h.header.raw_value).into_owned())
            .unwrap_or_default();
        return format!("{} {reason}", ir.status.code.value());
    }
    "other".to_string()
}

/// An ext_proc client with its own completion queue, and a timer for its
/// requests' timeouts.
#[derive(Clone)]
pub struct Envoy {
    client: Arc<Client>,
    timer: Arc<TimerThread>,
    /// Every stream carries a new sampled `traceparent`, as Envoy's do when
    /// it traces every request (B121).
    traced: bool,
}

impl Envoy {
    pub fn connect(target: SocketAddr) -> Envoy {
        Envoy::connect_with(target, false)
    }

    /// Like [`Envoy::connect`], on a TCP connection of its own: gRPC
    /// otherwise shares one connection among the channels of a process that
    /// have the same target and arguments.
    pub fn connect_own(target: SocketAddr) -> Envoy {
        Envoy::connect_with(target, true)
    }

    fn connect_with(target: SocketAddr, own: bool) -> Envoy {
        let env = Arc::new(EnvBuilder::new().cq_count(1).name_prefix("parkload").build());
        let mut builder = ChannelBuilder::new(env)
            .max_concurrent_stream(i32::MAX)
            .initial_reconnect_backoff(Duration::from_millis(50));
        if own {
            builder = builder.raw_cfg_int(c"grpc.use_local_subchannel_pool".into(), 1);
        }
        let channel = builder.connect(&target.to_string());
        Envoy {
            client: Arc::new(Client::new(channel)),
            timer: TimerThread::start_observed(None),
            traced: false,
        }
    }

    /// The same client, sending a new sampled `traceparent` on every stream.
    pub fn traced(self) -> Envoy {
        Envoy { traced: true, ..self }
    }

    /// One request: the verdict key, `grpc-error <code>`, or
    /// [`CLIENT_TIMEOUT`] when no verdict came within `timeout` of the send.
    /// The stream is cancelled either way, as Envoy resets it.
    ///
    /// The timeout is the client's own timer, not a gRPC deadline: the
    /// router must not see a deadline Envoy never sends.
    pub async fn request(&self, actor: &str, grpc_timeout: Option<&str>, timeout: Duration) -> String {
        let mut options = CallOption::default();
        if self.traced {
            let parent = crate::trace::context::SpanContext {
                trace_id: fastrand::u128(1..).to_be_bytes(),
                span_id: crate::trace::context::new_span_id(),
            };
            let mut headers = grpcio::MetadataBuilder::with_capacity(1);
            if headers.add_str(crate::trace::context::TRACEPARENT, &parent.traceparent()).is_ok() {
                options = options.headers(headers.build());
            }
        }
        let (mut tx, mut rx) = match self.client.duplex_streaming(&EXT_PROC_PROCESS, options) {
            Ok(call) => call,
            Err(e) => return format!("{GRPC_ERROR} {e}"),
        };
        let deadline = Instant::now().checked_add(timeout);
        let exchange = exchange(&mut tx, &mut rx, request_for(actor, grpc_timeout));
        let key = match deadline {
            Some(deadline) => before(exchange, Arc::clone(&self.timer) as Arc<dyn Scheduler>, deadline)
                .await
                .unwrap_or_else(|| CLIENT_TIMEOUT.to_string()),
            None => exchange.await,
        };
        tx.cancel();
        key
    }

    /// Runs `future` on the client's completion queue.
    pub fn spawn(&self, future: impl Future<Output = ()> + Send + 'static) {
        self.client.spawn(future);
    }
}

/// Sends `request` on an open stream and reads up to its verdict.
async fn exchange(
    tx: &mut ClientDuplexSender<ProcessingRequest>,
    rx: &mut ClientDuplexReceiver<ProcessingResponse>,
    request: ProcessingRequest,
) -> String {
    if let Err(e) = tx.send((request, WriteFlags::default())).await {
        return error_key(&e);
    }
    loop {
        match rx.next().await {
            Some(Ok(reply)) if reply.response.is_none() => continue,
            Some(Ok(reply)) => return verdict_key(&reply),
            Some(Err(e)) => return error_key(&e),
            None => return format!("{GRPC_ERROR} stream ended"),
        }
    }
}

/// `future`'s output, or `None` if `deadline` on `scheduler` comes first
/// (the future is then dropped unfinished).
async fn before<T>(
    future: impl Future<Output = T>,
    scheduler: Arc<dyn Scheduler>,
    deadline: Instant,
) -> Option<T> {
    match select(pin!(future), sleep_until(scheduler, deadline)).await {
        Either::Left((output, _)) => Some(output),
        Either::Right(_) => None,
    }
}

/// A failure's verdict key: its status code alone when it has one, so that
/// failures that differ only in their message (a timestamp, an address)
/// count together.
fn error_key(e: &grpcio::Error) -> String {
    match e {
        grpcio::Error::RpcFailure(status) | grpcio::Error::RpcFinished(Some(status)) => {
            format!("{GRPC_ERROR} {:?}", status.code())
        }
        other => format!("{GRPC_ERROR} {other}"),
    }
}

/// What a run's requests go over.
enum Transport {
    ExtProc(Envoy),
    Http(http::HttpTarget),
}

/// What a run's generator, its requests and its progress line share.
struct Run {
    transport: Transport,
    picker: ActorPicker,
    grpc_timeout: Option<CallerDeadline>,
    request_timeout: Duration,
    begin: Instant,
    report: Mutex<LoadReport>,
    in_flight: AtomicU64,
}

impl Run {
    /// Sends one ext_proc request and records it. Its latency counts from
    /// `due`, its scheduled time, or without a timetable (`None`) from its
    /// send.
    async fn request(&self, envoy: &Envoy, due: Option<Instant>) {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        let actor = self.picker.pick();
        let header = self.grpc_timeout.as_ref().map(|d| d.header.as_str());
        let sent = Instant::now();
        let key = envoy.request(actor, header, self.request_timeout).await;
        self.record(actor, key, sent, due);
    }

    /// As [`Run::request`], one GET on `conn`, this thread's connection;
    /// false when no connection could be made.
    fn request_http(
        &self,
        target: &http::HttpTarget,
        conn: &mut Option<http::Connection>,
        due: Option<Instant>,
    ) -> bool {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        let actor = self.picker.pick();
        let header = self.grpc_timeout.as_ref().map(|d| d.header.as_str());
        let sent = Instant::now();
        // A deadline past the clock's range is no deadline: a year will do.
        let deadline = sent
            .checked_add(self.request_timeout)
            .unwrap_or_else(|| sent + Duration::from_secs(365 * 24 * 3600));
        let key = http::request(conn, target, actor, header, deadline)
            .unwrap_or_else(|| CLIENT_TIMEOUT.to_string());
        let connected = !key.starts_with(http::CONNECT_FAILED);
        self.record(actor, key, sent, due);
        connected
    }

    /// Records a request sent at `sent` that just ended with `key`.
    fn record(&self, actor: &str, key: String, sent: Instant, due: Option<Instant>) {
        let done = Instant::now();
        // A request that timed out got no verdict, late or not.
        let overdue = self
            .grpc_timeout
            .as_ref()
            .filter(|_| key != CLIENT_TIMEOUT)
            .and_then(|d| done.saturating_duration_since(sent).checked_sub(d.timeout))
            .filter(|past| !past.is_zero());
        self.report.lock().record(Outcome {
            actor,
            key,
            at: done.saturating_duration_since(self.begin),
            latency: done.saturating_duration_since(due.unwrap_or(sent)),
            service: done.saturating_duration_since(sent),
            overdue,
        });
        self.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Runs a load as `spec` says and reports. Blocks the calling thread.
pub fn run(spec: &LoadSpec) -> LoadReport {
    match &spec.target {
        Target::ExtProc(addr) => run_with(&Envoy::connect(*addr), spec),
        Target::Http(target) => run_over(Transport::Http(target.clone()), spec),
    }
}

/// As [`run`] for an ext_proc target, over an existing client (so
/// benchmarks keep connections warm).
pub fn run_with(envoy: &Envoy, spec: &LoadSpec) -> LoadReport {
    run_over(Transport::ExtProc(envoy.clone()), spec)
}

fn run_over(transport: Transport, spec: &LoadSpec) -> LoadReport {
    let run = Arc::new(Run {
        transport,
        picker: ActorPicker::new(spec.actors.clone(), &spec.distribution),
        grpc_timeout: spec.grpc_timeout.clone(),
        request_timeout: spec.request_timeout,
        begin: Instant::now(),
        report: Mutex::new(LoadReport::default()),
        in_flight: AtomicU64::new(0),
    });
    // Every request holds a clone of `done`: `all_done` disconnects when the
    // last one ends.
    let (done, all_done) = crossbeam_channel::unbounded::<()>();
    let (quit, quitting) = crossbeam_channel::bounded::<()>(0);
    let elapsed = std::thread::scope(|scope| {
        if let Some(every) = spec.progress {
            let (run, quitting) = (&run, &quitting);
            scope.spawn(move || progress(run, every, quitting));
        }
        let unsent = match spec.open_loop_rate() {
            None => {
                closed_loop(&run, spec, done);
                0
            }
            Some(rate) => open_loop(&run, spec, rate, done),
        };
        let _ = all_done.recv();
        let elapsed = run.begin.elapsed();
        run.report.lock().unsent = unsent;
        drop(quit);
        elapsed
    });
    let mut report = std::mem::take(&mut *run.report.lock());
    report.finish(elapsed);
    report
}

/// Starts `n` request threads for an HTTP run, each running `body` with a
/// connection of its own and a clone of `done`. A thread the system refuses
/// is said on stderr, and the run goes on with those that started.
fn http_threads(
    n: usize,
    done: &Sender<()>,
    body: impl Fn(&mut Option<http::Connection>) + Send + Sync + 'static,
) {
    let body = Arc::new(body);
    for i in 0..n {
        let (body, done) = (Arc::clone(&body), done.clone());
        let started = std::thread::Builder::new()
            .name(String::from("parkload-http"))
            .stack_size(HTTP_THREAD_STACK)
            .spawn(move || {
                let mut conn = None;
                body(&mut conn);
                drop(done);
            });
        if let Err(e) = started {
            eprintln!("parkload: started {i} of {n} request threads ({e}); going on with those");
            return;
        }
    }
}

/// Keeps `concurrency` requests in flight: each sends its next as its last
/// ends, until the count is reached or the time is up.
fn closed_loop(run: &Arc<Run>, spec: &LoadSpec, done: Sender<()>) {
    let limit = match spec.stop {
        Stop::Count(n) => n,
        Stop::After(_) => u64::MAX,
    };
    let stop = Arc::new(AtomicBool::new(false));
    let started = Arc::new(AtomicU64::new(0));
    let more = {
        let (stop, started) = (Arc::clone(&stop), Arc::clone(&started));
        move || !stop.load(Ordering::Acquire) && started.fetch_add(1, Ordering::AcqRel) < limit
    };
    match &run.transport {
        Transport::ExtProc(envoy) => {
            for _ in 0..spec.concurrency.max(1) {
                let (task, more, done, own) = (Arc::clone(run), more.clone(), done.clone(), envoy.clone());
                envoy.spawn(async move {
                    while more() {
                        task.request(&own, None).await;
                    }
                    drop(done);
                });
            }
        }
        Transport::Http(target) => {
            let (task, target) = (Arc::clone(run), target.clone());
            let end = match spec.stop {
                Stop::After(d) => run.begin.checked_add(d),
                Stop::Count(_) => None,
            };
            http_threads(spec.concurrency.max(1), &done, move |conn| {
                // A server that refuses connections refuses at once: without
                // a pause each thread would spin, a core's worth of refusals.
                // The pause never runs past the end of the run.
                let mut pause = Duration::ZERO;
                while more() {
                    if task.request_http(&target, conn, None) {
                        pause = Duration::ZERO;
                    } else {
                        pause = (pause * 2).clamp(CONNECT_PAUSE_MIN, CONNECT_PAUSE_MAX);
                        let left = end.map_or(pause, |end| end.saturating_duration_since(Instant::now()));
                        std::thread::sleep(pause.min(left));
                    }
                }
            });
        }
    }
    drop(done);
    if let Stop::After(d) = spec.stop {
        std::thread::sleep(d.saturating_sub(run.begin.elapsed()));
        stop.store(true, Ordering::Release);
    }
}

/// Sends on the timetable, `concurrency` in flight at most; returns how
/// many scheduled requests the run's time was up before.
fn open_loop(run: &Arc<Run>, spec: &LoadSpec, rate: f64, done: Sender<()>) -> u64 {
    let schedule = Schedule::new(run.begin, rate);
    let (ticks, end) = match spec.stop {
        Stop::Count(n) => (n, None),
        Stop::After(d) => (schedule.ticks_within(d), run.begin.checked_add(d)),
    };
    let slots = Arc::new(Slots::new(spec.concurrency.max(1)));
    match &run.transport {
        Transport::ExtProc(envoy) => pace(&schedule, ticks, end, &slots, |tick| {
            if tick.late {
                run.report.lock().late += 1;
            }
            let (task, slots, done, own) = (Arc::clone(run), Arc::clone(&slots), done.clone(), envoy.clone());
            envoy.spawn(async move {
                task.request(&own, Some(tick.due)).await;
                slots.give();
                drop(done);
            });
        }),
        Transport::Http(target) => {
            // As many threads as slots: a tick that has its slot always
            // finds a thread free to send it.
            let (send, due) = crossbeam_channel::unbounded::<Tick>();
            let (task, target, freed) = (Arc::clone(run), target.clone(), Arc::clone(&slots));
            http_threads(spec.concurrency.max(1), &done, move |conn| {
                for tick in due.iter() {
                    task.request_http(&target, conn, Some(tick.due));
                    freed.give();
                }
            });
            drop(done);
            pace(&schedule, ticks, end, &slots, |tick| {
                if tick.late {
                    run.report.lock().late += 1;
                }
                let _ = send.send(tick);
            })
        }
    }
}

/// The open loop's timetable: request `i` is due `i / rate` seconds after
/// `begin`.
struct Schedule {
    begin: Instant,
    rate: f64,
}

impl Schedule {
    fn new(begin: Instant, rate: f64) -> Schedule {
        Schedule { begin, rate: rate.min(MAX_RATE) }
    }

    fn offset(&self, i: u64) -> Duration {
        Duration::try_from_secs_f64(i as f64 / self.rate).unwrap_or(Duration::MAX)
    }

    /// When request `i` is due; `None` if the clock cannot say (a rate so
    /// low that it is never due).
    fn due(&self, i: u64) -> Option<Instant> {
        self.begin.checked_add(self.offset(i))
    }

    /// How many requests are due within `d` of the start.
    fn ticks_within(&self, d: Duration) -> u64 {
        // Exact arithmetic would give the product; rounding may put it one
        // off either way, so the timetable itself has the last word.
        let mut n = (d.as_secs_f64() * self.rate).ceil() as u64;
        while n > 0 && self.offset(n - 1) >= d {
            n -= 1;
        }
        while n < u64::MAX && self.offset(n) < d {
            n += 1;
        }
        n
    }
}

/// A request the open loop sends.
#[derive(Clone, Copy, Debug)]
struct Tick {
    /// When it was scheduled.
    due: Instant,
    /// Whether it was sent more than [`LATE`] after that.
    late: bool,
}

/// The open loop's clock: hands tick `i` of `ticks` to `send` at
/// `schedule.due(i)`, or once a slot is free if none is then. A tick is never
/// skipped: a server that holds requests makes the next ones late, and their
/// latency shows it. When `end` comes, the ticks not yet sent stay unsent;
/// returns how many.
fn pace(
    schedule: &Schedule,
    ticks: u64,
    end: Option<Instant>,
    slots: &Slots,
    mut send: impl FnMut(Tick),
) -> u64 {
    for i in 0..ticks {
        let Some(due) = schedule.due(i) else {
            return ticks - i;
        };
        std::thread::sleep(due.saturating_duration_since(Instant::now()));
        if !slots.take(end) {
            return ticks - i;
        }
        let late = Instant::now().saturating_duration_since(due) > LATE;
        send(Tick { due, late });
    }
    0
}

/// The open loop's requests in flight, as slots: taken to send, given back
/// when a request ends.
struct Slots {
    free: Mutex<usize>,
    freed: Condvar,
}

impl Slots {
    fn new(n: usize) -> Slots {
        Slots { free: Mutex::new(n), freed: Condvar::new() }
    }

    /// Takes a slot, waiting for one if none is free; `false`, and no slot,
    /// once `until` has come.
    fn take(&self, until: Option<Instant>) -> bool {
        let mut free = self.free.lock();
        loop {
            if until.is_some_and(|until| Instant::now() >= until) {
                return false;
            }
            if *free > 0 {
                *free -= 1;
                return true;
            }
            match until {
                Some(until) => {
                    self.freed.wait_until(&mut free, until);
                }
                None => self.freed.wait(&mut free),
            }
        }
    }

    fn give(&self) {
        *self.free.lock() += 1;
        self.freed.notify_one();
    }
}

/// Prints a progress line to stderr every `every` until `quit` closes: the
/// completion rate over the last interval, requests in flight, late sends.
fn progress(run: &Run, every: Duration, quit: &Receiver<()>) {
    let (mut then, mut before) = (Instant::now(), 0);
    while let Err(RecvTimeoutError::Timeout) = quit.recv_timeout(every) {
        let (completed, late) = {
            let report = run.report.lock();
            (report.completed, report.late)
        };
        let now = Instant::now();
        let rate = (completed - before) as f64 / now.duration_since(then).as_secs_f64().max(1e-9);
        eprintln!(
            "[{:>6.1}s] completed {completed}  rate {rate:.0}/s  in flight {}  late {late}",
            now.duration_since(run.begin).as_secs_f64(),
            run.in_flight.load(Ordering::Acquire)
        );
        (then, before) = (now, completed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expands_actor_ranges_and_lists() {
        assert_eq!(
            expand_actors("demo/actor-{0..2}").unwrap(),
            vec!["demo/actor-0", "demo/actor-1", "demo/actor-2"]
        );
        assert_eq!(expand_actors("a/b, c/d").unwrap(), vec!["a/b", "c/d"]);
        assert!(expand_actors("demo/{x..2}").is_err());
        assert_eq!(expand_actors("demo/{3..2}"), Err(ActorsError::BadRange("demo/{3..2}".into())));
        assert_eq!(expand_actors("demo/{0..18446744073709551615}"), Err(ActorsError::TooMany));
        assert!(expand_actors("").is_err());
    }

    #[test]
    fn distributions() {
        let actors: Vec<String> = (0..10).map(|i| format!("demo/a{i}")).collect();
        let hot = ActorPicker::new(actors.clone(), &Distribution::Hot(0.9));
        let n = (0..10_000).filter(|_| hot.pick() == "demo/a0").count();
        assert!((8500..9500).contains(&n), "{n}");
        let zipf = ActorPicker::new(actors.clone(), &Distribution::Zipf(1.2));
        let first = (0..10_000).filter(|_| zipf.pick() == "demo/a0").count();
        let last = (0..10_000).filter(|_| zipf.pick() == "demo/a9").count();
        assert!(first > 5 * last, "{first} vs {last}");
        let uniform = ActorPicker::new(actors.clone(), &Distribution::Uniform);
        assert!((0..1000).all(|_| uniform.pick().starts_with("demo/a")));
        let rr = ActorPicker::new(actors, &Distribution::RoundRobin);
        let order: Vec<&str> = (0..12).map(|_| rr.pick()).collect();
        assert_eq!(&order[..3], ["demo/a0", "demo/a1", "demo/a2"]);
        assert_eq!(order[10], "demo/a0");
    }

    /// A report of finished requests: (actor, verdict key, ms since the
    /// start when it finished, latency in ms).
    fn report_of(outcomes: &[(&str, &str, u64, u64)]) -> LoadReport {
        let mut report = LoadReport::default();
        for &(actor, key, at, latency) in outcomes {
            report.record(Outcome {
                actor,
                key: key.to_string(),
                at: Duration::from_millis(at),
                latency: Duration::from_millis(latency),
                service: Duration::from_millis(latency),
                overdue: None,
            });
        }
        report
    }

    fn spec() -> LoadSpec {
        LoadSpec {
            target: Target::ExtProc("127.0.0.1:1".parse().unwrap()),
            concurrency: 2,
            rate: None,
            stop: Stop::Count(3),
            actors: vec!["demo/a".into()],
            distribution: Distribution::Zipf(1.1),
            progress: None,
            grpc_timeout: CallerDeadline::parse("300m"),
            request_timeout: Duration::from_millis(1500),
        }
    }

    #[test]
    fn quantiles() {
        let mut report = LoadReport::default();
        for us in 1..=100 {
            report.record(Outcome {
                actor: "demo/a",
                key: "200 routed".into(),
                at: Duration::ZERO,
                latency: Duration::from_micros(us),
                // As if each was sent late by a tenth of its latency.
                service: Duration::from_micros(us * 9 / 10),
                overdue: None,
            });
        }
        report.finish(Duration::from_secs(2));
        assert_eq!(report.quantile_us(0.5), 50);
        assert_eq!(report.service_quantile_us(0.5), 45);
        assert_eq!(report.quantile_us(0.99), 99);
        assert_eq!(report.quantile_us(1.0), 100);
        assert_eq!(report.max_us(), 100);
        assert_eq!(report.throughput(), 50.0);
        assert_eq!(LoadReport::default().quantile_us(0.5), 0);
        assert_eq!(LoadReport::default().max_us(), 0);
    }

    #[test]
    fn per_second_counts_completions_in_each_second_of_the_run() {
        let mut report = report_of(&[
            ("demo/a", "200 routed", 200, 1),
            ("demo/a", "200 routed", 999, 1),
            ("demo/a", "200 routed", 2500, 1),
        ]);
        report.finish(Duration::from_millis(4200));
        assert_eq!(report.per_second, vec![2, 0, 1, 0, 0], "a quiet last second still counts");
        let mut whole = report_of(&[("demo/a", "200 routed", 1000, 1)]);
        whole.finish(Duration::from_secs(2));
        assert_eq!(whole.per_second, vec![0, 1]);
    }

    #[test]
    fn merge_adds_counts_histograms_and_seconds() {
        let mut a = report_of(&[
            ("greedy/a", "200 routed", 100, 10),
            ("greedy/a", "grpc-error Unavailable", 1500, 3),
        ]);
        a.finish(Duration::from_secs(2));
        a.late = 1;
        let mut b = report_of(&[("polite/b", "200 routed", 300, 30), ("polite/b", CLIENT_TIMEOUT, 500, 500)]);
        b.finish(Duration::from_secs(1));
        b.unsent = 2;
        let mut all = LoadReport::default();
        all.merge(&a);
        all.merge(&b);
        assert_eq!(all.completed, 4);
        assert_eq!(all.elapsed, Duration::from_secs(3));
        assert_eq!((all.late, all.unsent, all.errors()), (1, 2, 2));
        assert_eq!(all.per_second, vec![1, 1, 2], "b's seconds follow a's");
        assert_eq!(all.verdicts["200 routed"], 2);
        assert_eq!(all.by_atespace["greedy"]["grpc-error Unavailable"], 1);
        assert_eq!(all.by_atespace["polite"][CLIENT_TIMEOUT], 1);
        assert_eq!(all.latency_by_verdict["200 routed"].len(), 2);
        // Three significant digits: within 0.1% of the recorded values.
        assert!((500_000..=500_500).contains(&all.max_us()), "{}", all.max_us());
        assert!((10_000..=10_010).contains(&all.quantile_us(0.5)), "{}", all.quantile_us(0.5));
        assert_eq!(all.throughput(), 4.0 / 3.0);
    }

    #[test]
    fn json_says_what_ran_and_each_verdicts_latency() {
        let mut report =
            report_of(&[("demo/a", "200 routed", 100, 2), ("demo/a", CLIENT_TIMEOUT, 1600, 1500)]);
        report.finish(Duration::from_millis(1600));
        let json = report.json(&spec());
        assert!(json.starts_with("{\"requests\":2,"), "{json}");
        assert!(json.contains("\"errors\":1,"), "{json}");
        assert!(json.contains("\"per_second\":[1,1]"), "{json}");
        assert!(
            json.contains("\"latency_ms_by_verdict\":{\"200 routed\":{\"count\":1,\"p50\":2.000,"),
            "{json}"
        );
        assert!(json.contains("\"client-timeout\":{\"count\":1,\"p50\":1500."), "{json}");
        assert!(
            json.ends_with(
                "\"params\":{\"target\":\"127.0.0.1:1\",\"concurrency\":2,\"rate\":null,\"duration_seconds\":null,\"count\":3,\"actors\":1,\"distribution\":\"zipf s=1.1\",\"grpc_timeout\":\"300m\",\"request_timeout_seconds\":1.5}}"
            ),
            "{json}"
        );
    }

    #[test]
    fn schedule_counts_the_ticks_due_within_a_duration() {
        let now = Instant::now();
        let twenty = Schedule::new(now, 20.0);
        assert_eq!(twenty.ticks_within(Duration::from_secs(1)), 20, "the tick at 1 s is past the end");
        assert_eq!(twenty.ticks_within(Duration::from_millis(950)), 19);
        assert_eq!(twenty.ticks_within(Duration::from_millis(951)), 20);
        assert_eq!(twenty.ticks_within(Duration::ZERO), 0);
        assert_eq!(twenty.due(19), Some(now + Duration::from_millis(950)));
        assert_eq!(Schedule::new(now, 2.5).ticks_within(Duration::from_secs(1)), 3);
        let never = Schedule::new(now, 1e-300);
        assert_eq!(never.ticks_within(Duration::from_secs(10)), 1);
        assert_eq!(never.due(1), None);
        assert_eq!(Schedule::new(now, f64::INFINITY).ticks_within(Duration::from_millis(1)), 1_000_000);
    }

    /// One slot, each request holding it 5 ms, ticks due every 1 ms: tick
    /// `i` cannot go before `5i` ms, `4i` ms after it was due. Every tick is
    /// sent all the same, and all but the first are late by construction.
    #[test]
    fn pace_waits_for_a_free_slot_and_counts_late_sends() {
        let schedule = Schedule::new(Instant::now(), 1000.0);
        let slots = Arc::new(Slots::new(1));
        let mut sent = Vec::new();
        let unsent = pace(&schedule, 10, None, &slots, |tick| {
            sent.push(tick);
            let slots = Arc::clone(&slots);
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(5));
                slots.give();
            });
        });
        assert_eq!(unsent, 0);
        assert_eq!(sent.len(), 10, "no tick skipped");
        for (i, tick) in sent.iter().enumerate() {
            assert_eq!(Some(tick.due), schedule.due(i as u64));
        }
        assert!(sent[1..].iter().all(|tick| tick.late), "{sent:?}");
    }

    /// 100 ticks due within a second and a slot that is never given back:
    /// at most the first is sent, and every other one is counted unsent.
    #[test]
    fn pace_counts_the_ticks_left_when_the_time_is_up() {
        let begin = Instant::now();
        let schedule = Schedule::new(begin, 100.0);
        let end = begin + Duration::from_secs(1);
        let ticks = schedule.ticks_within(Duration::from_secs(1));
        assert_eq!(ticks, 100);
        let mut sent = 0;
        let unsent = pace(&schedule, ticks, Some(end), &Slots::new(1), |_| sent += 1);
        assert!(sent <= 1);
        assert_eq!(sent + unsent, ticks);
        assert!(Instant::now() >= end, "waited for a slot until the end");
    }
}
