//! A saturated pool (B109-B111): the saturation groups against per-flight
//! retries (`--parked-request-dispatch per-flight`), in the same run,
//! alternating rounds.
//!
//! Each mode has its own simulator and router: a pool of 8 workers, 400
//! actors, 100 ms restores, an actor suspended 300 ms after its last
//! resume, so the pool takes about 20 new actors a second; an open loop
//! sends 22 requests a second for random actors, so the pool stays full.
//! Calls come from the simulator's count, waiting actor-seconds from the
//! router's parked wait (the requests are for distinct actors, nearly all).

use std::time::Duration;

use atenet_router::tools::load::{self, Envoy, LoadReport, Stop};
use atenet_router::tools::sim::{Sim, SimConfig};

use crate::harness::{sim, spec, Proc};
use crate::report::{median, Bound, Report};

const ROUNDS: usize = 3;
const ROUND: Duration = Duration::from_secs(20);
const RATE: f64 = 22.0;
const MODES: [&str; 2] = ["per-flight", "saturation-group"];

/// One round's figures.
struct Round {
    load: LoadReport,
    calls: f64,
    waiting_seconds: f64,
    /// Requests admitted to the lot: each one's flight needed a call
    /// beyond its first to be served.
    parked: f64,
}

impl Round {
    fn calls_per_waiting_second(&self) -> f64 {
        self.calls / self.waiting_seconds.max(1e-9)
    }

    /// The calls beyond each request's first attempt (the same in both
    /// modes), per waiting actor-second: what the waiting itself costs.
    fn retries_per_waiting_second(&self) -> f64 {
        (self.calls - self.load.completed as f64).max(0.0) / self.waiting_seconds.max(1e-9)
    }

    /// The fewest calls these requests could have cost, per waiting
    /// actor-second: a first attempt each (B110 never delays it), and one
    /// more for each parked request that was served. No dispatcher can go
    /// below it on this load.
    fn floor_per_waiting_second(&self) -> f64 {
        let exhausted = self.load.verdicts.get("503 atenet_budget_exhausted").copied().unwrap_or(0) as f64;
        let served_after_park = (self.parked - exhausted).max(0.0);
        (self.load.completed as f64 + served_after_park) / self.waiting_seconds.max(1e-9)
    }

    fn exhausted_share(&self) -> f64 {
        let n = self.load.verdicts.get("503 atenet_budget_exhausted").copied().unwrap_or(0);
        n as f64 / self.load.completed.max(1) as f64
    }

    fn served_wait_ms(&self, q: f64) -> f64 {
        f64::from(self.load.verdict_quantile_us("200 routed", q)) / 1000.0
    }
}

pub fn saturation(report: &mut Report) {
    report.line("\n## A saturated pool: saturation groups against per-flight retries\n");
    report.line(&format!(
        "8 workers, 400 actors, 100 ms restores, suspended 300 ms after a resume (about 20 new actors a \
         second); an open loop of {RATE} requests a second for random actors, {} s per round, {ROUNDS} \
         alternating rounds per mode, medians.\n",
        ROUND.as_secs()
    ));
    report.line("| --parked-request-dispatch | requests | routed | parked | budget exhausted | ResumeActor calls | waiting actor-seconds | calls per waiting actor-second | retries (calls beyond the first) per waiting actor-second | floor: fewest calls per waiting actor-second | served wait p50 | served wait p99 |");
    report.line("|---|---|---|---|---|---|---|---|---|---|---|---|");
    let sims: Vec<Sim> = MODES
        .iter()
        .map(|_| {
            sim(SimConfig {
                workers: 8,
                actors: 400,
                restore_latency: Duration::from_millis(100),
                idle_suspend: Duration::from_millis(300),
                ..SimConfig::default()
            })
        })
        .collect();
    let routers: Vec<Proc> = MODES
        .iter()
        .zip(&sims)
        .map(|(mode, sim)| Proc::router(sim.addr(), &["--parked-request-dispatch", mode]))
        .collect();
    let envoys: Vec<Envoy> = routers.iter().map(|r| Envoy::connect(r.extproc)).collect();
    let names: Vec<String> = (0..400).map(|i| format!("demo/actor-{i}")).collect();
    let mut rounds: Vec<Vec<Round>> = vec![Vec::new(), Vec::new()];
    for _ in 0..ROUNDS {
        for (i, router) in routers.iter().enumerate() {
            let waited = || router.metric("atenet_router_parking_wait_duration_seconds_sum", "");
            let parked = || router.metric("atenet_router_park_decisions_total", "decision=\"admitted\"");
            let (calls_before, waited_before, parked_before) = (sims[i].total_calls(), waited(), parked());
            let mut open = spec(router.extproc, 2000, Stop::After(ROUND), names.clone());
            open.rate = Some(RATE);
            let load = load::run_with(&envoys[i], &open);
            // Every request has its verdict: its flight's calls are counted.
            let calls = (sims[i].total_calls() - calls_before) as f64;
            rounds[i].push(Round {
                load,
                calls,
                waiting_seconds: waited() - waited_before,
                parked: parked() - parked_before,
            });
        }
    }
    let pick = |i: usize, f: &dyn Fn(&Round) -> f64| median(rounds[i].iter().map(f).collect());
    let mut figures = [[0.0; 6]; 2];
    for (i, mode) in MODES.iter().enumerate() {
        let n = |key: &'static str| move |r: &Round| r.load.verdicts.get(key).copied().unwrap_or(0) as f64;
        figures[i] = [
            pick(i, &Round::calls_per_waiting_second),
            pick(i, &Round::exhausted_share),
            pick(i, &|r| r.served_wait_ms(0.5)),
            pick(i, &|r| r.served_wait_ms(0.99)),
            pick(i, &Round::retries_per_waiting_second),
            pick(i, &Round::floor_per_waiting_second),
        ];
        report.line(&format!(
            "| {mode} | {:.0} | {:.0} | {:.0} | {:.1}% | {:.0} | {:.0} | **{:.3}** | {:.3} | {:.3} | {:.0} ms | {:.0} ms |",
            pick(i, &|r| r.load.completed as f64),
            pick(i, &n("200 routed")),
            pick(i, &|r| r.parked),
            figures[i][1] * 100.0,
            pick(i, &|r| r.calls),
            pick(i, &|r| r.waiting_seconds),
            figures[i][0],
            figures[i][4],
            figures[i][5],
            figures[i][2],
            figures[i][3],
        ));
    }
    let names = [
        "calls_per_waiting_second",
        "budget_exhausted_share",
        "served_wait_p50_ms",
        "served_wait_p99_ms",
        "retries_per_waiting_second",
        "floor_per_waiting_second",
    ];
    for (i, mode) in MODES.iter().enumerate() {
        for (name, value) in names.iter().zip(figures[i]) {
            report.figure("saturation", &format!("{name}_{}", mode.replace('-', "_")), value);
        }
    }
    let ratio = |k: usize| figures[1][k] / figures[0][k].max(1e-9);
    let targets = [
        ("saturation: calls per waiting actor-second, groups / per-flight", ratio(0), 0.2),
        ("saturation: budget_exhausted share, groups / per-flight", ratio(1), 0.5),
        ("saturation: served wait p99, groups / per-flight", ratio(3), 1.0),
        ("saturation: served wait p50, groups / per-flight", ratio(2), 1.2),
    ];
    for (i, mode) in MODES.iter().enumerate() {
        let mut verdicts = std::collections::BTreeMap::<&str, u64>::new();
        for round in &rounds[i] {
            for (key, n) in &round.load.verdicts {
                *verdicts.entry(key.as_str()).or_default() += *n;
            }
        }
        let list: Vec<String> = verdicts.iter().map(|(key, n)| format!("{n} `{key}`")).collect();
        report.line(&format!("\nVerdicts over the {ROUNDS} rounds, {mode}: {}.", list.join(", ")));
    }
    report.line(&format!(
        "\nRetries (calls beyond each request's first) per waiting actor-second, groups / per-flight: **{:.3}x**.",
        ratio(4)
    ));
    report.line(&format!(
        "The floor (a first call per request, one more per parked request served) over per-flight's calls: \
         **{:.3}x**, the best any dispatcher could show on this load; the groups' calls are **{:.2}x** \
         their floor.",
        figures[1][5] / figures[0][0].max(1e-9),
        figures[1][0] / figures[1][5].max(1e-9)
    ));
    report.line("\n| target | groups / per-flight | bound | |\n|---|---|---|---|");
    for (name, value, bound) in targets {
        let status = report.target(name, value, Bound::AtMost(bound));
        report.line(&format!("| {name} | **{value:.3}x** | <= {bound}x | {status} |"));
    }
}
