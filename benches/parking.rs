//! `make bench`: the router against a minimal baseline, both calling the same
//! simulated control plane, in one run (issue "Performance").
//!
//! Nothing here asserts a timing: every figure is printed, and router figures
//! are ratios to the baseline measured alternately in the same run. The
//! router and the baseline each run as their own process so that their
//! memory, threads and CPU can be read from /proc; the load generator and the
//! simulated ateapi run in this process.
//!
//! `cargo bench --profile release --bench parking [-- --only NAME]`; scenarios:
//! fast-path, park-capacity, amplification, timer, cost-growth, deadlines,
//! fair-shares.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use atenet_router::extproc::response_for;
use atenet_router::load::{self, Distribution, Envoy, LoadReport, LoadSpec, Stop};
use atenet_router::proto::ateapi::{ObjectRef, ResumeActorRequest};
use atenet_router::proto::external_processor::{processing_request, ProcessingRequest, ProcessingResponse};
use atenet_router::proto::{ATEAPI_RESUME_ACTOR, EXT_PROC_PROCESS};
use atenet_router::resume::Code;
use atenet_router::sim::{Answer, Sim, SimConfig};
use atenet_router::target::ActorId;
use atenet_router::verdict::Verdict;
use futures::{SinkExt, StreamExt};
use grpcio::{
    CallOption, ChannelBuilder, Client, DuplexSink, EnvBuilder, RequestStream, RpcContext, ServerBuilder,
    ServerCredentials, ServiceBuilder, WriteFlags,
};

const ROUTER: &str = env!("CARGO_BIN_EXE_atenet-router");
/// Alternating runs per fast-path concurrency.
const ROUNDS: usize = 4;

fn main() {
    if std::env::var("ATENET_BENCH_ROLE").as_deref() == Ok("baseline") {
        return baseline_server(&std::env::var("ATENET_BENCH_ATEAPI").expect("ateapi address"));
    }
    let args: Vec<String> = std::env::args().collect();
    let only = args.iter().position(|a| a == "--only").and_then(|i| args.get(i + 1)).cloned();
    let run = |name: &str| only.as_deref().is_none_or(|o| o == name);
    let mut report = Report::default();
    report.line(&format!(
        "machine: {} cores, {}; {}",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        cpu_model(),
        atenet_router::logging::rfc3339(std::time::SystemTime::now())
    ));
    if run("fast-path") {
        fast_path(&mut report);
    }
    if run("park-capacity") {
        park_capacity(&mut report);
    }
    if run("amplification") {
        amplification(&mut report);
    }
    if run("timer") {
        timer_precision(&mut report);
    }
    if run("cost-growth") {
        cost_growth(&mut report);
    }
    if run("deadlines") {
        deadlines(&mut report);
    }
    if run("fair-shares") {
        fair_shares(&mut report);
    }
    let path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("bench-results.md");
    std::fs::write(&path, &report.text).expect("writing results");
    println!("\nresults written to {}", path.display());
}

#[derive(Default)]
struct Report {
    text: String,
}

impl Report {
    fn line(&mut self, line: &str) {
        println!("{line}");
        self.text.push_str(line);
        self.text.push('\n');
    }
}

fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into())
}

// ---------------------------------------------------------------- processes

/// A server process (router or baseline) and its ext_proc address.
struct Proc {
    child: Child,
    extproc: SocketAddr,
    metrics: Option<SocketAddr>,
}

impl Proc {
    fn router(sim: SocketAddr, flags: &[&str]) -> Proc {
        let sim = sim.to_string();
        let mut args = vec![
            "serve",
            "--ateapi-insecure",
            "--ateapi-address",
            &sim,
            "--port-extproc",
            "0",
            "--metrics-listen-addr",
            "127.0.0.1:0",
            "--status-port",
            "0",
            "--drain-delay",
            "0s",
            "--envoy-admin-address",
            "",
            "--drain-complete-file",
            "",
            "--log-level",
            "warn",
        ];
        args.extend_from_slice(flags);
        // The startup line is at info; read it at info, then nothing else is logged at warn.
        let mut child = Command::new(ROUTER)
            .args(args.iter().filter(|a| **a != "--log-level" && **a != "warn"))
            .stderr(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .expect("start router");
        let line = first_line(&mut child, "serving");
        let field =
            |p: &str| line.split(p).nth(1).unwrap().split([' ', ',', '/']).next().unwrap().parse().unwrap();
        Proc { extproc: field("ext_proc on "), metrics: Some(field("metrics on http://")), child }
    }

    fn baseline(sim: SocketAddr) -> Proc {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .env("ATENET_BENCH_ROLE", "baseline")
            .env("ATENET_BENCH_ATEAPI", sim.to_string())
            .stderr(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .expect("start baseline");
        let line = first_line(&mut child, "baseline listening on");
        let addr = line.rsplit(' ').next().unwrap().parse().unwrap();
        Proc { child, extproc: addr, metrics: None }
    }

    fn status_field(&self, name: &str) -> u64 {
        let text = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        text.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    }

    fn rss_kib(&self) -> u64 {
        self.status_field("VmRSS:")
    }

    fn threads(&self) -> u64 {
        self.status_field("Threads:")
    }

    /// User + system CPU seconds so far.
    fn cpu_seconds(&self) -> f64 {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.child.id())).unwrap();
        let after = &stat[stat.rfind(')').unwrap() + 2..];
        let fields: Vec<&str> = after.split_whitespace().collect();
        let ticks: f64 = fields[11].parse::<f64>().unwrap() + fields[12].parse::<f64>().unwrap();
        ticks / clock_ticks()
    }

    fn metric(&self, name: &str, labels: &str) -> f64 {
        let text = http_get(self.metrics.expect("router metrics"), "/metrics");
        text.lines()
            .filter(|l| !l.starts_with('#'))
            .filter(|l| {
                let series = l.rsplit_once(' ').map_or("", |(s, _)| s);
                let metric = series.split('{').next().unwrap_or("");
                metric == name && series.contains(labels)
            })
            .filter_map(|l| l.rsplit_once(' ').and_then(|(_, v)| v.parse::<f64>().ok()))
            .sum()
    }

    fn wait_metric(&self, name: &str, labels: &str, want: f64, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if self.metric(name, labels) >= want {
                return true;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        false
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn first_line(child: &mut Child, marker: &str) -> String {
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let line = lines.by_ref().map_while(Result::ok).find(|l| l.contains(marker)).expect("process starts");
    std::thread::spawn(move || lines.for_each(drop));
    line
}

fn clock_ticks() -> f64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100.0)
}

fn http_get(addr: SocketAddr, path: &str) -> String {
    let mut stream = TcpStream::connect(addr).unwrap();
    write!(stream, "GET {path} HTTP/1.0\r\n\r\n").unwrap();
    let mut text = String::new();
    stream.read_to_string(&mut text).unwrap();
    text.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default()
}

fn sim(config: SimConfig) -> Sim {
    Sim::start(SimConfig { listen: "127.0.0.1:0".parse().unwrap(), ..config }).expect("sim starts")
}

// ----------------------------------------------------------------- baseline

/// The irreducible job: one ResumeActor per request_headers, a fixed verdict,
/// no flight table, lot or metrics.
fn baseline_server(ateapi: &str) {
    let env = Arc::new(
        EnvBuilder::new().cq_count(std::thread::available_parallelism().map_or(2, |n| n.get())).build(),
    );
    let client = Arc::new(Client::new(ChannelBuilder::new(Arc::clone(&env)).connect(ateapi)));
    // The same routing verdict the router sends (header mutation and
    // original_dst metadata), built once: the baseline pays for encoding a
    // verdict, not for deciding it.
    let fixed = response_for(&Verdict::Route {
        actor: ActorId::parse("demo/actor-0").unwrap(),
        worker: "10.64.0.1:443".into(),
        target_port: 80,
    });
    let service = ServiceBuilder::new()
        .add_duplex_streaming_handler(
            &EXT_PROC_PROCESS,
            move |ctx: RpcContext<'_>,
                  mut stream: RequestStream<ProcessingRequest>,
                  mut sink: DuplexSink<ProcessingResponse>| {
                let (client, fixed) = (Arc::clone(&client), fixed.clone());
                ctx.spawn(async move {
                    while let Some(Ok(request)) = stream.next().await {
                        if let Some(processing_request::Request::RequestHeaders(h)) = &request.request {
                            let actor = h
                                .headers
                                .headers
                                .iter()
                                .find(|v| v.key == "ate-target-actor")
                                .map(|v| String::from_utf8_lossy(&v.raw_value).into_owned())
                                .unwrap_or_default();
                            let (atespace, name) = actor.split_once('/').unwrap_or(("", ""));
                            let mut object = ObjectRef::new();
                            object.atespace = atespace.into();
                            object.name = name.into();
                            let mut call = ResumeActorRequest::new();
                            call.actor = Some(object).into();
                            if let Ok(receiver) =
                                client.unary_call_async(&ATEAPI_RESUME_ACTOR, &call, CallOption::default())
                            {
                                let _ = receiver.await;
                            }
                            if sink.send((fixed.clone(), WriteFlags::default())).await.is_err() {
                                return;
                            }
                        }
                    }
                });
            },
        )
        .build();
    let mut server = ServerBuilder::new(env).register_service(service).build().unwrap();
    let port = server.add_listening_port("127.0.0.1:0", ServerCredentials::insecure()).unwrap();
    server.start();
    eprintln!("baseline listening on 127.0.0.1:{port}");
    loop {
        std::thread::park();
    }
}

// ---------------------------------------------------------------- scenarios

fn spec(target: SocketAddr, concurrency: usize, stop: Stop, actors: Vec<String>) -> LoadSpec {
    LoadSpec {
        target,
        concurrency,
        rate: None,
        stop,
        actors,
        distribution: Distribution::Uniform,
        progress: None,
        grpc_timeout: None,
        request_timeout: Duration::from_secs(30),
    }
}

fn actors(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}{i}")).collect()
}

fn ms(us: u32) -> f64 {
    us as f64 / 1000.0
}

/// A pool where all 64 actors stay resident once resumed.
fn running_pool() -> Sim {
    sim(SimConfig {
        workers: 64,
        actors: 64,
        restore_latency: Duration::from_millis(1),
        idle_suspend: Duration::from_secs(3600),
        ..SimConfig::default()
    })
}

fn fast_path(report: &mut Report) {
    report.line("\n## Fast path (all actors running)\n");
    report.line("| concurrency | baseline req/s | router req/s | throughput ratio | baseline p50 / p99 ms | router p50 / p99 ms | p99 ratio | CPU µs/request baseline / router |");
    report.line("|---|---|---|---|---|---|---|---|");
    let sim = running_pool();
    let router = Proc::router(sim.addr(), &[]);
    let baseline = Proc::baseline(sim.addr());
    let (r_envoy, b_envoy) = (Envoy::connect(router.extproc), Envoy::connect(baseline.extproc));
    let all = actors("demo/actor-", 64);
    // Warm up: resume every actor, open connections.
    load::run_with(&r_envoy, &spec(router.extproc, 16, Stop::Count(2000), all.clone()));
    load::run_with(&b_envoy, &spec(baseline.extproc, 16, Stop::Count(2000), all.clone()));
    for concurrency in [1usize, 16, 64] {
        let mut runs: BTreeMap<&str, Vec<LoadReport>> = BTreeMap::new();
        let mut cpu: BTreeMap<&str, f64> = BTreeMap::new();
        for _round in 0..ROUNDS {
            for (name, envoy, process) in [("baseline", &b_envoy, &baseline), ("router", &r_envoy, &router)] {
                let before = process.cpu_seconds();
                let r = load::run_with(
                    envoy,
                    &spec(process.extproc, concurrency, Stop::After(Duration::from_secs(2)), all.clone()),
                );
                *cpu.entry(name).or_default() += process.cpu_seconds() - before;
                runs.entry(name).or_default().push(r);
            }
        }
        let pick = |name: &str| merged(&runs[name]);
        let (b, r) = (pick("baseline"), pick("router"));
        let per_request = |name: &str, report: &LoadReport| cpu[name] * 1e6 / report.completed.max(1) as f64;
        report.line(&format!(
            "| {concurrency} | {:.0} | {:.0} | **{:.2}x** | {:.3} / {:.3} | {:.3} / {:.3} | **{:.2}x** | {:.1} / {:.1} |",
            b.throughput(),
            r.throughput(),
            r.throughput() / b.throughput(),
            ms(b.quantile_us(0.5)),
            ms(b.quantile_us(0.99)),
            ms(r.quantile_us(0.5)),
            ms(r.quantile_us(0.99)),
            r.quantile_us(0.99) as f64 / b.quantile_us(0.99).max(1) as f64,
            per_request("baseline", &b),
            per_request("router", &r)
        ));
    }
    report.line(&format!(
        "\nTargets: throughput >= 0.9x, p99 <= 1.2x the baseline. {ROUNDS} alternating 2 s runs each; CPU is the\nserver process's own user + system time per request, the least noisy of these figures."
    ));
}

/// Pools several runs: throughput over the total time, latencies together.
fn merged(runs: &[LoadReport]) -> LoadReport {
    let mut all = LoadReport::default();
    for r in runs {
        all.merge(r);
    }
    all
}

fn park_capacity(report: &mut Report) {
    report.line("\n## Park capacity: 10,000 parked requests held 10 s\n");
    let sim = sim(SimConfig { workers: 0, actors: 0, ..SimConfig::default() });
    let hot = actors("demo/park-", 10);
    for actor in &hot {
        sim.script(actor, vec![Answer::error(Code::ResourceExhausted, "no free workers available")]);
    }
    let router = Proc::router(
        sim.addr(),
        &["--parked-request-max", "10000", "--parked-request-budget", "60s", "--drain-timeout", "80s"],
    );
    let envoy = Envoy::connect(router.extproc);
    // Warm the process up (allocator, connections) before the idle reading.
    sim.script("demo/warm", vec![Answer::ok("10.0.0.1", false)]);
    load::run_with(&envoy, &spec(router.extproc, 16, Stop::Count(2000), vec!["demo/warm".into()]));
    let (rss0, threads0) = (router.rss_kib(), router.threads());
    let held = {
        let (envoy, target, hot) = (envoy.clone(), router.extproc, hot.clone());
        std::thread::spawn(move || load::run_with(&envoy, &spec(target, 10_000, Stop::Count(10_000), hot)))
    };
    let parked_all =
        router.wait_metric("atenet_router_parking_active", "", 10_000.0, Duration::from_secs(120));
    let (rss1, threads1) = (router.rss_kib(), router.threads());
    let cpu0 = router.cpu_seconds();
    let t0 = Instant::now();
    std::thread::sleep(Duration::from_secs(10));
    let cpu = (router.cpu_seconds() - cpu0) / t0.elapsed().as_secs_f64();
    let parked_after = router.metric("atenet_router_parking_active", "");
    for actor in &hot {
        sim.script(actor, vec![Answer::ok("10.0.0.2", true)]);
    }
    let result = held.join().unwrap();
    let routed = result.verdicts.get("200 routed").copied().unwrap_or(0);
    let per_request = (rss1 as f64 - rss0 as f64) / 10_000.0;
    report.line("| measure | value | target |");
    report.line("|---|---|---|");
    report.line(&format!("| all 10,000 parked at once | {} | yes |", if parked_all { "yes" } else { "NO" }));
    report.line(&format!("| parked after holding 10 s | {parked_after:.0} | 10000 |"));
    report.line(&format!("| router RSS idle → 10,000 parked | {rss0} KiB → {rss1} KiB | |"));
    report.line(&format!("| RSS growth per parked request | **{per_request:.2} KiB** | <= 16 KiB |"));
    report.line(&format!("| router threads at 0 / 10,000 parked | **{threads0} / {threads1}** | equal |"));
    report.line(&format!("| router CPU while holding | **{:.2}% of a core** | < 5% |", cpu * 100.0));
    report.line(&format!("| verdicts | {routed} routed of {} | 10000 |", result.completed));
    report.line(&format!("| ResumeActor calls during the hold (10 flights) | {} | |", sim.total_calls()));
}

fn amplification(report: &mut Report) {
    report.line("\n## Resume amplification\n");
    report.line("| case | requests | actors | attempts per flight | ResumeActor calls | calls per attempt per actor |");
    report.line("|---|---|---|---|---|---|");
    for (case, n_actors) in
        [("1,000 requests, one suspended actor", 1usize), ("1,000 requests, 1,000 actors", 1000)]
    {
        let sim = sim(SimConfig { workers: 0, actors: 0, ..SimConfig::default() });
        let names = actors("demo/amp-", n_actors);
        for actor in &names {
            // Attempt 1 is held until every request has arrived, fails, then
            // attempt 2 succeeds: two attempts per flight.
            sim.script(
                actor,
                vec![
                    Answer::error(Code::ResourceExhausted, "no free workers available").held(),
                    Answer::ok("10.0.0.3", true),
                ],
            );
        }
        let router = Proc::router(sim.addr(), &["--parked-request-retry-interval", "20ms"]);
        let envoy = Envoy::connect(router.extproc);
        let requests: Vec<String> = (0..1000).map(|i| names[i % n_actors].clone()).collect();
        let runner = {
            let (envoy, target) = (envoy.clone(), router.extproc);
            std::thread::spawn(move || {
                let mut s = spec(target, 1000, Stop::Count(1000), requests);
                // Every actor gets exactly its share.
                s.distribution = Distribution::RoundRobin;
                load::run_with(&envoy, &s)
            })
        };
        router.wait_metric("atenet_router_extproc_streams_active", "", 1000.0, Duration::from_secs(60));
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut released = 0;
        while released < n_actors && Instant::now() < deadline {
            released += names.iter().map(|a| sim.release(a)).sum::<usize>();
            std::thread::sleep(Duration::from_millis(5));
        }
        let result = runner.join().unwrap();
        let calls = sim.total_calls();
        let touched = names.iter().filter(|a| sim.calls(a) > 0).count().max(1);
        report.line(&format!(
            "| {case} | {} ({} routed) | {touched} | 2 | {calls} | **{:.3}** |",
            result.completed,
            result.verdicts.get("200 routed").copied().unwrap_or(0),
            calls as f64 / (touched as f64 * 2.0)
        ));
    }
    report.line("\nTarget: 1 call per attempt per actor, however many requests share the actor.");
}

fn timer_precision(report: &mut Report) {
    report.line("\n## Timer precision: 10,000 flights retrying\n");
    let sim = sim(SimConfig { workers: 0, actors: 10_000, atespace: "demo".into(), ..SimConfig::default() });
    let budget = Duration::from_secs(8);
    let router = Proc::router(
        sim.addr(),
        &[
            "--parked-request-max",
            "20000",
            "--parked-request-budget",
            "8s",
            "--parked-request-retry-interval",
            "1s",
            "--parked-request-retry-factor",
            "1.0",
            "--drain-timeout",
            "30s",
        ],
    );
    let envoy = Envoy::connect(router.extproc);
    // Open loop: 10,000 distinct actors over 5 s, so every flight's budget
    // starts when its request arrives, and all 10,000 overlap at the end.
    let mut s = spec(router.extproc, 20_000, Stop::Count(10_000), actors("demo/actor-", 10_000));
    s.rate = Some(2000.0);
    s.distribution = Distribution::RoundRobin;
    let result = load::run_with(&envoy, &s);
    let lateness = lateness_quantiles(&router);
    let budget_us = budget.as_micros() as u32;
    let over = |p: f64| result.quantile_us(p).saturating_sub(budget_us);
    report.line("| measure | value | target |");
    report.line("|---|---|---|");
    report.line(&format!("| flights | {} requests, {:?} | |", result.completed, result.verdicts));
    report.line(&format!("| timer tasks fired | {:.0} | |", lateness.0));
    report.line(&format!(
        "| retry lateness p99 (timer thread, histogram bucket) | **<= {}** | <= 2 ms |",
        lateness.1
    ));
    report.line(&format!(
        "| verdict past the budget p50 / p99 (client) | {:.3} ms / **{:.3} ms** | p99 <= 10 ms |",
        ms(over(0.5)),
        ms(over(0.99))
    ));
    report.line(&format!("| ResumeActor calls | {} | |", sim.total_calls()));
}

/// (samples, the smallest bucket bound holding >= 99% of the samples).
fn lateness_quantiles(router: &Proc) -> (f64, String) {
    let text = http_get(router.metrics.unwrap(), "/metrics");
    let mut buckets: Vec<(f64, f64)> = text
        .lines()
        .filter(|l| l.starts_with("atenet_router_timer_lateness_seconds_bucket"))
        .filter_map(|l| {
            let le = l.split("le=\"").nth(1)?.split('"').next()?;
            let le = if le == "+Inf" { f64::INFINITY } else { le.parse().ok()? };
            Some((le, l.rsplit(' ').next()?.parse().ok()?))
        })
        .collect();
    buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    let total = buckets.last().map_or(0.0, |b| b.1);
    let bound = buckets.iter().find(|(_, count)| *count >= 0.99 * total).map_or("n/a".into(), |(le, _)| {
        if le.is_infinite() {
            "+Inf".into()
        } else {
            format!("{} ms", le * 1000.0)
        }
    });
    (total, bound)
}

fn cost_growth(report: &mut Report) {
    report.line("\n## Cost growth: fast path while requests are parked on other actors\n");
    report.line("| parked | fast-path req/s | p50 ms | p99 ms | router CPU µs/request | p50 vs 0 parked | p99 vs 0 parked | CPU vs 0 parked |");
    report.line("|---|---|---|---|---|---|---|---|");
    let sim = running_pool();
    let hot = actors("demo/park-", 10);
    for actor in &hot {
        sim.script(actor, vec![Answer::error(Code::ResourceExhausted, "no free workers available")]);
    }
    let router = Proc::router(
        sim.addr(),
        &["--parked-request-max", "20000", "--parked-request-budget", "120s", "--drain-timeout", "150s"],
    );
    let envoy = Envoy::connect(router.extproc);
    let running = actors("demo/actor-", 64);
    load::run_with(&envoy, &spec(router.extproc, 16, Stop::Count(3000), running.clone()));
    // (label, latencies and throughput, CPU µs per request)
    let mut rows: Vec<(String, LoadReport, f64)> = Vec::new();
    let measure = |label: String, rows: &mut Vec<(String, LoadReport, f64)>| {
        let before = router.cpu_seconds();
        let runs: Vec<LoadReport> = (0..4)
            .map(|_| {
                load::run_with(
                    &envoy,
                    &spec(router.extproc, 16, Stop::After(Duration::from_secs(2)), running.clone()),
                )
            })
            .collect();
        let r = merged(&runs);
        let cpu = (router.cpu_seconds() - before) * 1e6 / r.completed.max(1) as f64;
        rows.push((label, r, cpu));
    };
    let mut holders = Vec::new();
    let mut parked = 0usize;
    let parker = Envoy::connect(router.extproc);
    for target in [0usize, 100, 1000, 10_000] {
        let more = target - parked;
        if more > 0 {
            let (envoy, addr, hot) = (parker.clone(), router.extproc, hot.clone());
            holders.push(std::thread::spawn(move || {
                load::run_with(&envoy, &spec(addr, more, Stop::Count(more as u64), hot))
            }));
            router.wait_metric("atenet_router_parking_active", "", target as f64, Duration::from_secs(120));
            parked = target;
        }
        measure(target.to_string(), &mut rows);
    }
    for actor in &hot {
        sim.script(actor, vec![Answer::ok("10.0.0.4", true)]);
    }
    for h in holders {
        let _ = h.join();
    }
    // The 0-parked reference is measured before and after, to cancel drift.
    measure("0 (after release)".into(), &mut rows);
    let zeros = [&rows[0], &rows[rows.len() - 1]];
    let reference = merged(&[zeros[0].1.clone(), zeros[1].1.clone()]);
    let (b50, b99) = (reference.quantile_us(0.5).max(1) as f64, reference.quantile_us(0.99).max(1) as f64);
    let b_cpu = (zeros[0].2 + zeros[1].2) / 2.0;
    for (label, r, cpu) in &rows {
        let (p50, p99) = (r.quantile_us(0.5), r.quantile_us(0.99));
        report.line(&format!(
            "| {label} | {:.0} | {:.3} | {:.3} | {cpu:.1} | **{:.2}x** | **{:.2}x** | **{:.2}x** |",
            r.throughput(),
            ms(p50),
            ms(p99),
            p50 as f64 / b50,
            p99 as f64 / b99,
            cpu / b_cpu
        ));
    }
    report.line(
        "\nTarget: the fast path slows by no more than 10% as the lot fills. Ratios are to the mean of the\n0-parked runs before and after; four 2 s runs per row.",
    );
}

/// Rounds of each mode in the deadline and fair-share scenarios; figures are
/// the median round.
const MODE_ROUNDS: usize = 3;

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// Scripts each actor to need nine retries, then resume, over and over: a
/// park takes about 1.4 s at the default 100 ms x 1.1 backoff.
fn script_slow_parks(sim: &Sim, actors: &[String]) {
    let exhausted = Answer::error(Code::ResourceExhausted, "no free workers available");
    let cycle: Vec<Answer> =
        (0..10).map(|i| if i < 9 { exhausted.clone() } else { Answer::ok("10.0.0.4", true) }).collect();
    for actor in actors {
        sim.script(actor, cycle.iter().cycle().take(2000).cloned().collect());
    }
}

fn deadlines(report: &mut Report) {
    report.line("\n## Caller deadlines: clients that give up after 300 ms, parks that take 1.4 s\n");
    report.line("| --caller-deadlines | requests | routed | 504 caller deadline | 503 too short | verdicts after the deadline | seconds held past callers' deadlines | slot-seconds held |");
    report.line("|---|---|---|---|---|---|---|---|");
    let names = actors("demo/dl-", 200);
    let modes = ["false", "true"];
    let sims: Vec<Sim> =
        modes.iter().map(|_| sim(SimConfig { workers: 0, actors: 0, ..SimConfig::default() })).collect();
    let routers: Vec<Proc> = modes
        .iter()
        .zip(&sims)
        .map(|(mode, sim)| {
            Proc::router(sim.addr(), &["--parked-request-max", "1000", "--caller-deadlines", mode])
        })
        .collect();
    let envoys: Vec<Envoy> = routers.iter().map(|r| Envoy::connect(r.extproc)).collect();
    let mut rounds: Vec<Vec<(LoadReport, f64)>> = vec![Vec::new(), Vec::new()];
    for _ in 0..MODE_ROUNDS {
        for (i, router) in routers.iter().enumerate() {
            script_slow_parks(&sims[i], &names);
            let slot_seconds = || router.metric("atenet_router_parking_wait_duration_seconds_sum", "");
            let before = slot_seconds();
            let mut load = spec(router.extproc, 100, Stop::After(Duration::from_secs(5)), names.clone());
            load.grpc_timeout = load::CallerDeadline::parse("300m");
            let result = load::run_with(&envoys[i], &load);
            // Every request has its verdict, so every slot has been released.
            rounds[i].push((result, slot_seconds() - before));
        }
    }
    let mut held = [0.0; 2];
    for (i, mode) in modes.iter().enumerate() {
        let runs = &rounds[i];
        let pick = |f: &dyn Fn(&(LoadReport, f64)) -> f64| median(runs.iter().map(f).collect());
        let count = |key: &'static str| {
            move |(r, _): &(LoadReport, f64)| r.verdicts.get(key).copied().unwrap_or(0) as f64
        };
        held[i] = pick(&|(r, _)| r.overdue_seconds);
        report.line(&format!(
            "| {mode} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | **{:.1}** | {:.1} |",
            pick(&|(r, _)| r.completed as f64),
            pick(&count("200 routed")),
            pick(&count("504 atenet_caller_deadline")),
            pick(&count("503 atenet_deadline_too_short")),
            pick(&|(r, _)| r.overdue as f64),
            held[i],
            pick(&|(_, slots)| *slots),
        ));
    }
    report.line(&format!(
        "\nSeconds held past callers' deadlines (the client's own count of how late each verdict came): \
         **{:.3}x** with deadlines honoured. Target: near zero. 100 callers in a closed loop over 200 actors, \
         5 s per run, median of {MODE_ROUNDS} alternating runs.",
        held[1] / held[0].max(1e-9)
    ));
}

fn fair_shares(report: &mut Report) {
    report.line("\n## Fair shares: one greedy atespace against a polite one, lot of 100\n");
    report.line("| --parked-request-max-per-atespace | polite requests | polite routed | polite shed | polite shed rate | greedy requests | greedy shed by its cap | greedy budget exhausted |");
    report.line("|---|---|---|---|---|---|---|---|");
    let greedy = actors("greedy/a-", 1000);
    let polite = actors("polite/b-", 20);
    let caps = ["0", "50"];
    let mut shed_rates = [0.0; 2];
    for (i, cap) in caps.iter().enumerate() {
        let sim = sim(SimConfig { workers: 0, actors: 0, ..SimConfig::default() });
        let router = Proc::router(
            sim.addr(),
            &[
                "--parked-request-max",
                "100",
                "--parked-request-max-per-atespace",
                cap,
                "--parked-request-budget",
                "2s",
                "--flight-max",
                "4096",
            ],
        );
        let envoy = Envoy::connect(router.extproc);
        let mut runs = Vec::new();
        for _ in 0..MODE_ROUNDS {
            for actor in &greedy {
                sim.script(actor, vec![Answer::error(Code::ResourceExhausted, "no free workers available")]);
            }
            // Each polite request parks once, for one retry.
            let cycle = [
                Answer::error(Code::ResourceExhausted, "no free workers available"),
                Answer::ok("10.0.0.6", true),
            ];
            for actor in &polite {
                sim.script(actor, cycle.iter().cycle().take(4000).cloned().collect());
            }
            let greedy_load = {
                let (envoy, target, greedy) = (envoy.clone(), router.extproc, greedy.clone());
                std::thread::spawn(move || {
                    load::run_with(&envoy, &spec(target, 300, Stop::After(Duration::from_secs(6)), greedy))
                })
            };
            // Let the greedy atespace take what it can first.
            std::thread::sleep(Duration::from_millis(500));
            let polite_run = load::run_with(
                &envoy,
                &spec(router.extproc, 20, Stop::After(Duration::from_secs(5)), polite.clone()),
            );
            runs.push((polite_run, greedy_load.join().unwrap()));
        }
        let pick = |f: &dyn Fn(&(LoadReport, LoadReport)) -> f64| median(runs.iter().map(f).collect());
        let n = |r: &LoadReport, key: &str| r.verdicts.get(key).copied().unwrap_or(0) as f64;
        let polite_shed = |r: &LoadReport| n(r, "503 atenet_lot_full") + n(r, "503 atenet_atespace_full");
        shed_rates[i] = pick(&|(p, _)| polite_shed(p) / p.completed.max(1) as f64);
        report.line(&format!(
            "| {cap} | {:.0} | {:.0} | {:.0} | **{:.1}%** | {:.0} | {:.0} | {:.0} |",
            pick(&|(p, _)| p.completed as f64),
            pick(&|(p, _)| n(p, "200 routed")),
            pick(&|(p, _)| polite_shed(p)),
            shed_rates[i] * 100.0,
            pick(&|(_, g)| g.completed as f64),
            pick(&|(_, g)| n(g, "503 atenet_atespace_full")),
            pick(&|(_, g)| n(g, "503 atenet_budget_exhausted")),
        ));
    }
    report.line(&format!(
        "\nPolite shed rate with the cap: **{:.1}%** (without: {:.1}%). Target: 0 while the cap holds. \
         300 greedy callers (actors that never resume, 2 s budget) and 20 polite ones (one retry each), \
         median of {MODE_ROUNDS} runs.",
        shed_rates[1] * 100.0,
        shed_rates[0] * 100.0
    ));
}
