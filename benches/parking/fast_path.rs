//! The fast path: requests for running actors, against the baseline, and
//! while the lot fills.

use std::time::Duration;

use atenet_router::actor::resume::Code;
use atenet_router::tools::load::{self, Envoy, LoadReport, Stop};
use atenet_router::tools::sim::Answer;

use crate::harness::{actors, json_number, merged, ms, running_pool, spec, Proc, Simulator};
use crate::report::{median, Bound, Report};

/// Alternating rounds per fast-path concurrency; targets use their median.
const ROUNDS: usize = 5;

/// `ROUNDS` (baseline, router) pairs of runs; who goes first alternates, so
/// drift over a round favours neither.
fn alternating<T>(mut baseline: impl FnMut() -> T, mut router: impl FnMut() -> T) -> Vec<[T; 2]> {
    (0..ROUNDS)
        .map(|round| {
            if round % 2 == 0 {
                let b = baseline();
                [b, router()]
            } else {
                let r = router();
                [baseline(), r]
            }
        })
        .collect()
}

/// The median over the rounds of router / baseline.
fn router_ratio<T>(rounds: &[[T; 2]], f: &dyn Fn(&T) -> f64) -> f64 {
    median(rounds.iter().map(|[b, r]| f(r) / f(b)).collect())
}

/// The median over the rounds of one side (0: baseline, 1: router).
fn side_median<T>(rounds: &[[T; 2]], side: usize, f: &dyn Fn(&T) -> f64) -> f64 {
    median(rounds.iter().map(|round| f(&round[side])).collect())
}

/// One 2 s run and the server's CPU seconds during it.
fn measured(envoy: &Envoy, process: &Proc, concurrency: usize, actors: &[String]) -> (LoadReport, f64) {
    let before = process.cpu_seconds();
    let run = load::run_with(
        envoy,
        &spec(process.extproc, concurrency, Stop::After(Duration::from_secs(2)), actors.to_vec()),
    );
    (run, process.cpu_seconds() - before)
}

pub fn fast_path(report: &mut Report) {
    report.line("\n## Fast path (all actors running)\n");
    report.line("| concurrency | baseline req/s | router req/s | throughput ratio | baseline p50 / p99 ms | router p50 / p99 ms | p99 ratio | CPU µs/request baseline / router | CPU ratio |");
    report.line("|---|---|---|---|---|---|---|---|---|");
    let sim = running_pool();
    let router = Proc::router(sim.addr(), &[]);
    let baseline = Proc::baseline(sim.addr());
    let (r_envoy, b_envoy) = (Envoy::connect(router.extproc), Envoy::connect(baseline.extproc));
    let all = actors("demo/actor-", 64);
    // Warm up: resume every actor, open connections.
    load::run_with(&r_envoy, &spec(router.extproc, 16, Stop::Count(2000), all.clone()));
    load::run_with(&b_envoy, &spec(baseline.extproc, 16, Stop::Count(2000), all.clone()));
    let mut judged = Vec::new();
    for concurrency in [1usize, 16, 64] {
        let rounds = alternating(
            || measured(&b_envoy, &baseline, concurrency, &all),
            || measured(&r_envoy, &router, concurrency, &all),
        );
        let cpu_us = |(run, cpu): &(LoadReport, f64)| cpu * 1e6 / run.completed.max(1) as f64;
        let ratio = |f: &dyn Fn(&(LoadReport, f64)) -> f64| router_ratio(&rounds, f);
        let throughput = ratio(&|(run, _)| run.throughput());
        let p99 = ratio(&|(run, _)| run.quantile_us(0.99).max(1) as f64);
        let cpu = ratio(&cpu_us);
        let side = |i: usize, f: &dyn Fn(&(LoadReport, f64)) -> f64| side_median(&rounds, i, f);
        let (b, r) = (
            merged(&rounds.iter().map(|[b, _]| b.0.clone()).collect::<Vec<_>>()),
            merged(&rounds.iter().map(|[_, r]| r.0.clone()).collect::<Vec<_>>()),
        );
        report.line(&format!(
            "| {concurrency} | {:.0} | {:.0} | **{throughput:.3}x** | {:.3} / {:.3} | {:.3} / {:.3} | **{p99:.3}x** | {:.1} / {:.1} | **{cpu:.3}x** |",
            side(0, &|(run, _)| run.throughput()),
            side(1, &|(run, _)| run.throughput()),
            ms(b.quantile_us(0.5)),
            ms(b.quantile_us(0.99)),
            ms(r.quantile_us(0.5)),
            ms(r.quantile_us(0.99)),
            side(0, &cpu_us),
            side(1, &cpu_us),
        ));
        for (name, value) in [
            ("baseline_rps", side(0, &|(run, _)| run.throughput())),
            ("router_rps", side(1, &|(run, _)| run.throughput())),
            ("baseline_p99_ms", side(0, &|(run, _)| ms(run.quantile_us(0.99)))),
            ("router_p99_ms", side(1, &|(run, _)| ms(run.quantile_us(0.99)))),
            ("baseline_cpu_us", side(0, &cpu_us)),
            ("router_cpu_us", side(1, &cpu_us)),
            ("throughput_ratio", throughput),
            ("p99_ratio", p99),
            ("cpu_ratio", cpu),
        ] {
            report.figure("fast-path", &format!("c{concurrency}.{name}"), value);
        }
        judged.push((concurrency, throughput, p99, cpu));
    }
    report.line(&format!(
        "\n{ROUNDS} alternating 2 s runs per concurrency; ratios are the median of the per-round ratios. CPU is\nthe server process's own user + system time per request, the least noisy of these figures.\n"
    ));
    report.line("| target | c | value | status |");
    report.line("|---|---|---|---|");
    for (c, throughput, p99, cpu) in judged {
        for (what, value, bound) in [
            ("fast path CPU per request vs baseline", cpu, Bound::AtMost(1.05)),
            ("fast path throughput vs baseline", throughput, Bound::AtLeast(0.95)),
            ("fast path p99 vs baseline", p99, Bound::AtMost(1.1)),
        ] {
            let status = report.target(&format!("{what}, c={c}"), value, bound);
            report.line(&format!("| {what} | {c} | {value:.3}x | {status} |"));
        }
    }
}

pub fn cost_growth(report: &mut Report) {
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
    let mut at_10k = f64::NAN;
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
        report.figure("cost-growth", &format!("parked_{label}.cpu_us"), *cpu);
        report.figure("cost-growth", &format!("parked_{label}.p99_ms"), ms(p99));
        if label == "10000" {
            at_10k = cpu / b_cpu;
        }
    }
    let status =
        report.target("fast path CPU per request with 10,000 parked vs 0 parked", at_10k, Bound::AtMost(1.1));
    report.line(&format!(
        "\nTarget: the fast path's CPU per request grows by no more than 10% with 10,000 parked ({at_10k:.2}x: {status}).\nRatios are to the mean of the 0-parked runs before and after; four 2 s runs per row, pooled.",
    ));
}

/// The load generator as a process of its own.
const PARKLOAD: &str = env!("CARGO_BIN_EXE_parkload");

/// What one `parkload --json` run reported, and the server's CPU during it.
struct External {
    requests: f64,
    throughput: f64,
    p99_ms: f64,
    cpu_seconds: f64,
}

impl External {
    fn cpu_us(&self) -> f64 {
        self.cpu_seconds * 1e6 / self.requests.max(1.0)
    }
}

/// One 2 s `parkload` run against `process`, from a process of its own.
fn measured_external(process: &Proc, concurrency: usize) -> External {
    let before = process.cpu_seconds();
    let output = std::process::Command::new(PARKLOAD)
        .args(["--target", &process.extproc.to_string(), "--concurrency", &concurrency.to_string()])
        .args(["--duration", "2s", "--actors", "demo/actor-{0..63}", "--progress", "0", "--json"])
        .output()
        .expect("running parkload");
    let cpu_seconds = process.cpu_seconds() - before;
    assert!(output.status.success(), "parkload failed: {}", String::from_utf8_lossy(&output.stderr));
    let json = String::from_utf8(output.stdout).expect("parkload's JSON is UTF-8");
    External {
        requests: json_number(&json, "{", "requests"),
        throughput: json_number(&json, "{", "throughput"),
        p99_ms: json_number(&json, "\"latency_ms\":", "p99"),
        cpu_seconds,
    }
}

/// The fast path again, with the load generator (`parkload`) and the
/// simulator (`ateapi-sim`) each in a process of their own, as Envoy and the
/// control plane are: a check on how much of the in-process figure comes
/// from where the load runs. Reported, not judged.
pub fn fast_path_external(report: &mut Report) {
    report.line("\n## Fast path, load generator and simulator in processes of their own\n");
    report.line("| concurrency | baseline req/s | router req/s | throughput ratio | p99 ratio | CPU µs/request baseline / router | CPU ratio |");
    report.line("|---|---|---|---|---|---|---|");
    let simulator = Simulator::start(&["--listen", "127.0.0.1:0"]);
    let router = Proc::router(simulator.addr, &[]);
    let baseline = Proc::baseline(simulator.addr);
    // Warm up: resume every actor, start every thread.
    for process in [&router, &baseline] {
        measured_external(process, 16);
    }
    for concurrency in [1usize, 16, 64] {
        let rounds = alternating(
            || measured_external(&baseline, concurrency),
            || measured_external(&router, concurrency),
        );
        let ratio = |f: &dyn Fn(&External) -> f64| router_ratio(&rounds, f);
        let side = |i: usize, f: &dyn Fn(&External) -> f64| side_median(&rounds, i, f);
        let (throughput, p99, cpu) =
            (ratio(&|e| e.throughput), ratio(&|e| e.p99_ms.max(0.001)), ratio(&External::cpu_us));
        report.line(&format!(
            "| {concurrency} | {:.0} | {:.0} | **{throughput:.3}x** | **{p99:.3}x** | {:.1} / {:.1} | **{cpu:.3}x** |",
            side(0, &|e| e.throughput),
            side(1, &|e| e.throughput),
            side(0, &External::cpu_us),
            side(1, &External::cpu_us),
        ));
        for (name, value) in [("throughput_ratio", throughput), ("p99_ratio", p99), ("cpu_ratio", cpu)] {
            report.figure("fast-path-external", &format!("c{concurrency}.{name}"), value);
        }
    }
    report.line(&format!(
        "\n{ROUNDS} alternating 2 s `parkload` runs per concurrency; ratios are the median of the per-round ratios.\n"
    ));
}
