//! The engine of `parkload`: an ext_proc load generator that plays Envoy's
//! part — one stream per request, a `request_headers` message with
//! `ate-target-actor`, the verdict read back, the stream reset.
//!
//! Requests are futures on the client's own completion-queue thread, so a
//! run with 10,000 requests in flight costs no more threads than a run with
//! one. Latencies are kept exactly (microseconds, one `u32` per request) and
//! sorted once at the end; at a few hundred thousand requests that is cheaper
//! and more honest than a bucketed histogram.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::{SinkExt, StreamExt};
use grpcio::{CallOption, ChannelBuilder, Client, EnvBuilder, WriteFlags};
use parking_lot::Mutex;

use crate::logging::json_string;
use crate::proto::base::{HeaderMap, HeaderValue};
use crate::proto::external_processor::{HttpHeaders, ProcessingRequest, ProcessingResponse};
use crate::proto::EXT_PROC_PROCESS;

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
    After(Duration),
    Count(u64),
}

/// One run's parameters.
#[derive(Clone, Debug)]
pub struct LoadSpec {
    pub target: SocketAddr,
    /// Requests in flight at most.
    pub concurrency: usize,
    /// Requests per second (open loop); `None` is a closed loop.
    pub rate: Option<f64>,
    pub stop: Stop,
    pub actors: Vec<String>,
    pub distribution: Distribution,
    /// Print a progress line to stderr this often.
    pub progress: Option<Duration>,
    /// A `grpc-timeout` header to send with every request (B68).
    pub grpc_timeout: Option<CallerDeadline>,
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
        crate::deadline::grpc_timeout(value.as_bytes())
            .map(|timeout| CallerDeadline { header: value.to_string(), timeout })
    }
}

/// What a run measured.
#[derive(Clone, Debug, Default)]
pub struct LoadReport {
    pub elapsed: Duration,
    /// Requests that got a verdict or failed.
    pub completed: u64,
    /// Open-loop ticks skipped because `concurrency` requests were in flight.
    pub skipped: u64,
    /// Verdict latencies in microseconds, sorted.
    pub latencies_us: Vec<u32>,
    /// Counts by `200 routed`, `<status> <x-atenet-reason>`, or `grpc-error <code>`.
    pub verdicts: BTreeMap<String, u64>,
    /// The same counts for each atespace (the actor id's part before `/`).
    pub by_atespace: BTreeMap<String, BTreeMap<String, u64>>,
    /// With a caller deadline: verdicts that came after it.
    pub overdue: u64,
    /// With a caller deadline: the time those verdicts came after it, summed:
    /// what the router held for callers that had already given up.
    pub overdue_seconds: f64,
}

impl LoadReport {
    /// Completed requests per second.
    pub fn throughput(&self) -> f64 {
        self.completed as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    /// The `q` quantile (0..=1) of latency, in microseconds.
    pub fn quantile_us(&self, q: f64) -> u32 {
        if self.latencies_us.is_empty() {
            return 0;
        }
        let rank = ((self.latencies_us.len() as f64 * q).ceil() as usize).clamp(1, self.latencies_us.len());
        self.latencies_us[rank - 1]
    }

    /// The human summary.
    pub fn summary(&self) -> String {
        let ms = |us: u32| us as f64 / 1000.0;
        let mut out = String::new();
        let _ = writeln!(
            out,
            "requests: {} in {:.2}s = {:.1} req/s{}",
            self.completed,
            self.elapsed.as_secs_f64(),
            self.throughput(),
            if self.skipped > 0 {
                format!(" ({} ticks skipped at the concurrency cap)", self.skipped)
            } else {
                String::new()
            }
        );
        let _ = writeln!(
            out,
            "latency ms: p50 {:.3}  p90 {:.3}  p99 {:.3}  p99.9 {:.3}  max {:.3}",
            ms(self.quantile_us(0.5)),
            ms(self.quantile_us(0.9)),
            ms(self.quantile_us(0.99)),
            ms(self.quantile_us(0.999)),
            ms(self.latencies_us.last().copied().unwrap_or(0))
        );
        let _ = writeln!(out, "verdicts:");
        for (verdict, n) in &self.verdicts {
            let _ = writeln!(out, "  {n:>9}  {verdict}");
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

    /// The machine summary.
    pub fn json(&self) -> String {
        let counts = |map: &BTreeMap<String, u64>| {
            map.iter().map(|(k, v)| format!("{}:{v}", json_string(k))).collect::<Vec<_>>().join(",")
        };
        let by_atespace: Vec<String> =
            self.by_atespace.iter().map(|(a, m)| format!("{}:{{{}}}", json_string(a), counts(m))).collect();
        format!(
            "{{\"requests\":{},\"elapsed_seconds\":{:.6},\"throughput\":{:.3},\"skipped\":{},\"latency_ms\":{{\"p50\":{:.3},\"p90\":{:.3},\"p99\":{:.3},\"p999\":{:.3},\"max\":{:.3}}},\"verdicts\":{{{}}},\"by_atespace\":{{{}}},\"overdue\":{},\"overdue_seconds\":{:.6}}}",
            self.completed,
            self.elapsed.as_secs_f64(),
            self.throughput(),
            self.skipped,
            self.quantile_us(0.5) as f64 / 1000.0,
            self.quantile_us(0.9) as f64 / 1000.0,
            self.quantile_us(0.99) as f64 / 1000.0,
            self.quantile_us(0.999) as f64 / 1000.0,
            self.latencies_us.last().copied().unwrap_or(0) as f64 / 1000.0,
            counts(&self.verdicts),
            by_atespace.join(","),
            self.overdue,
            self.overdue_seconds
        )
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

/// An ext_proc client with its own completion queue.
#[derive(Clone)]
pub struct Envoy {
    client: Arc<Client>,
}

impl Envoy {
    pub fn connect(target: SocketAddr) -> Envoy {
        let env = Arc::new(EnvBuilder::new().cq_count(1).name_prefix("parkload").build());
        let channel = ChannelBuilder::new(env)
            .max_concurrent_stream(i32::MAX)
            .initial_reconnect_backoff(Duration::from_millis(50))
            .connect(&target.to_string());
        Envoy { client: Arc::new(Client::new(channel)) }
    }

    /// One request: the verdict key, or `grpc-error <code>`.
    pub async fn request(&self, actor: &str, grpc_timeout: Option<&str>) -> String {
        let (mut tx, mut rx) = match self.client.duplex_streaming(&EXT_PROC_PROCESS, CallOption::default()) {
            Ok(call) => call,
            Err(e) => return format!("grpc-error {e}"),
        };
        if let Err(e) = tx.send((request_for(actor, grpc_timeout), WriteFlags::default())).await {
            return error_key(&e);
        }
        let key = loop {
            match rx.next().await {
                Some(Ok(reply)) if reply.response.is_none() => continue,
                Some(Ok(reply)) => break verdict_key(&reply),
                Some(Err(e)) => break error_key(&e),
                None => break "grpc-error stream ended".to_string(),
            }
        };
        tx.cancel();
        key
    }

    /// Runs `future` on the client's completion queue.
    pub fn spawn(&self, future: impl std::future::Future<Output = ()> + Send + 'static) {
        self.client.spawn(future);
    }
}

fn error_key(e: &grpcio::Error) -> String {
    match e {
        grpcio::Error::RpcFailure(status) => format!("grpc-error {:?}", status.code()),
        other => format!("grpc-error {other}"),
    }
}

#[derive(Default)]
struct Shared {
    latencies: Mutex<Vec<u32>>,
    verdicts: Mutex<Verdicts>,
    /// The callers' timeout, if they announce one.
    timeout: Option<Duration>,
    completed: AtomicU64,
    in_flight: AtomicU64,
    started: AtomicU64,
    stop: AtomicBool,
}

#[derive(Default)]
struct Verdicts {
    all: BTreeMap<String, u64>,
    by_atespace: BTreeMap<String, BTreeMap<String, u64>>,
    overdue: u64,
    overdue_seconds: f64,
}

impl Shared {
    fn record(&self, started: Instant, actor: &str, key: String) {
        let took = started.elapsed();
        let us = took.as_micros().min(u32::MAX as u128) as u32;
        self.latencies.lock().push(us);
        {
            let mut verdicts = self.verdicts.lock();
            let atespace = actor.split_once('/').map_or("", |(a, _)| a);
            if let Some(counts) = verdicts.by_atespace.get_mut(atespace) {
                *counts.entry(key.clone()).or_default() += 1;
            } else {
                verdicts.by_atespace.insert(atespace.to_string(), BTreeMap::from([(key.clone(), 1)]));
            }
            *verdicts.all.entry(key).or_default() += 1;
            if let Some(past) = self.timeout.and_then(|t| took.checked_sub(t)).filter(|p| !p.is_zero()) {
                verdicts.overdue += 1;
                verdicts.overdue_seconds += past.as_secs_f64();
            }
        }
        self.completed.fetch_add(1, Ordering::AcqRel);
    }
}

/// Runs a load as `spec` says and reports. Blocks the calling thread.
pub fn run(spec: &LoadSpec) -> LoadReport {
    run_with(&Envoy::connect(spec.target), spec)
}

/// As [`run`], over an existing client (so benchmarks keep connections warm).
pub fn run_with(envoy: &Envoy, spec: &LoadSpec) -> LoadReport {
    let picker = ActorPicker::new(spec.actors.clone(), &spec.distribution);
    let shared =
        Arc::new(Shared { timeout: spec.grpc_timeout.as_ref().map(|d| d.timeout), ..Shared::default() });
    let grpc_timeout: Option<Arc<str>> = spec.grpc_timeout.as_ref().map(|d| Arc::from(d.header.as_str()));
    let (done_tx, done_rx) = crossbeam_channel::unbounded::<()>();
    let begin = Instant::now();
    let limit = match spec.stop {
        Stop::Count(n) => n,
        Stop::After(_) => u64::MAX,
    };
    let end = match spec.stop {
        Stop::After(d) => Some(begin + d),
        Stop::Count(_) => None,
    };
    let mut skipped = 0;
    match spec.rate {
        None => {
            for _ in 0..spec.concurrency.max(1) {
                let (envoy2, picker, shared, done, grpc_timeout) = (
                    envoy.clone(),
                    picker.clone(),
                    Arc::clone(&shared),
                    done_tx.clone(),
                    grpc_timeout.clone(),
                );
                envoy.spawn(async move {
                    while !shared.stop.load(Ordering::Acquire)
                        && shared.started.fetch_add(1, Ordering::AcqRel) < limit
                    {
                        let start = Instant::now();
                        let actor = picker.pick();
                        let key = envoy2.request(actor, grpc_timeout.as_deref()).await;
                        shared.record(start, actor, key);
                    }
                    drop(done);
                });
            }
        }
        Some(rate) => {
            let interval = Duration::from_secs_f64(1.0 / rate.max(1e-6));
            let mut next = begin;
            loop {
                if shared.started.load(Ordering::Acquire) >= limit || end.is_some_and(|e| Instant::now() >= e)
                {
                    break;
                }
                let now = Instant::now();
                if next > now {
                    std::thread::sleep(next - now);
                }
                next += interval;
                if shared.in_flight.load(Ordering::Acquire) >= spec.concurrency as u64 {
                    skipped += 1;
                    continue;
                }
                shared.started.fetch_add(1, Ordering::AcqRel);
                shared.in_flight.fetch_add(1, Ordering::AcqRel);
                let (envoy2, actor, shared, done, grpc_timeout) = (
                    envoy.clone(),
                    picker.pick().to_string(),
                    Arc::clone(&shared),
                    done_tx.clone(),
                    grpc_timeout.clone(),
                );
                envoy.spawn(async move {
                    let start = Instant::now();
                    let key = envoy2.request(&actor, grpc_timeout.as_deref()).await;
                    shared.record(start, &actor, key);
                    shared.in_flight.fetch_sub(1, Ordering::AcqRel);
                    drop(done);
                });
            }
        }
    }
    drop(done_tx);
    let mut last_progress = Instant::now();
    loop {
        let tick = spec.progress.unwrap_or(Duration::from_millis(100)).min(Duration::from_millis(100));
        if let Err(crossbeam_channel::RecvTimeoutError::Disconnected) = done_rx.recv_timeout(tick) {
            break;
        }
        if end.is_some_and(|e| Instant::now() >= e) {
            shared.stop.store(true, Ordering::Release);
        }
        if let Some(every) = spec.progress {
            if last_progress.elapsed() >= every {
                last_progress = Instant::now();
                let done = shared.completed.load(Ordering::Acquire);
                eprintln!(
                    "[{:>6.1}s] completed {done}  rate {:.0}/s  in flight {}",
                    begin.elapsed().as_secs_f64(),
                    done as f64 / begin.elapsed().as_secs_f64(),
                    shared.started.load(Ordering::Acquire).min(limit).saturating_sub(done)
                );
            }
        }
    }
    let elapsed = begin.elapsed();
    let mut latencies = std::mem::take(&mut *shared.latencies.lock());
    latencies.sort_unstable();
    let verdicts = std::mem::take(&mut *shared.verdicts.lock());
    LoadReport {
        elapsed,
        completed: shared.completed.load(Ordering::Acquire),
        skipped,
        latencies_us: latencies,
        verdicts: verdicts.all,
        by_atespace: verdicts.by_atespace,
        overdue: verdicts.overdue,
        overdue_seconds: verdicts.overdue_seconds,
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

    #[test]
    fn quantiles() {
        let report = LoadReport {
            latencies_us: (1..=100).collect(),
            completed: 100,
            elapsed: Duration::from_secs(2),
            ..Default::default()
        };
        assert_eq!(report.quantile_us(0.5), 50);
        assert_eq!(report.quantile_us(0.99), 99);
        assert_eq!(report.quantile_us(1.0), 100);
        assert_eq!(report.throughput(), 50.0);
    }
}
