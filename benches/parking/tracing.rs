//! `make bench ONLY=tracing`: the fast path with every request traced
//! (B121, B124), a router exporting to a collector that accepts
//! connections and never answers, and one whose collector is down,
//! against a router without tracing. Reported, not judged: the issue's
//! claim is "no latency beyond noise", and the table shows the ratio with
//! the noise between alternating rounds.

use std::net::TcpListener;
use std::time::Duration;

use atenet_router::tools::load::{self, Envoy, LoadReport, Stop};

use crate::harness::{actors, running_pool, spec, Proc};
use crate::report::{median, Report};

const ROUNDS: usize = 5;
const CONCURRENCY: usize = 16;

fn measured(envoy: &Envoy, process: &Proc, all: &[String]) -> LoadReport {
    load::run_with(
        envoy,
        &spec(process.extproc, CONCURRENCY, Stop::After(Duration::from_secs(2)), all.to_vec()),
    )
}

pub fn tracing(report: &mut Report) {
    report.line("\n## Tracing on the fast path (every request sampled)\n");
    report.line(
        "| collector | req/s | p50 / p99 ms | p99 ratio to off (min-max over rounds) | spans dropped |",
    );
    report.line("|---|---|---|---|---|");
    let sim = running_pool();
    // Accepts (the kernel's backlog) and never reads or answers.
    let silent = TcpListener::bind("127.0.0.1:0").expect("a loopback port");
    let down = {
        let probe = TcpListener::bind("127.0.0.1:0").expect("a loopback port");
        probe.local_addr().expect("its address")
    };
    let (silent_addr, down_addr) = (silent.local_addr().expect("its address").to_string(), down.to_string());
    let routers = [
        ("off", Proc::router(sim.addr(), &[])),
        ("never answers", Proc::router(sim.addr(), &["--otlp-traces-address", &silent_addr])),
        ("down", Proc::router(sim.addr(), &["--otlp-traces-address", &down_addr])),
    ];
    let all = actors("demo/actor-", 64);
    let envoys: Vec<Envoy> = routers.iter().map(|(_, r)| Envoy::connect(r.extproc).traced()).collect();
    for (envoy, (_, router)) in envoys.iter().zip(&routers) {
        load::run_with(envoy, &spec(router.extproc, CONCURRENCY, Stop::Count(2000), all.clone()));
    }
    // Rounds rotate who goes first, so drift favours no router.
    let mut runs: Vec<Vec<LoadReport>> = vec![Vec::new(); routers.len()];
    for round in 0..ROUNDS {
        for k in 0..routers.len() {
            let i = (round + k) % routers.len();
            runs[i].push(measured(&envoys[i], &routers[i].1, &all));
        }
    }
    let p99 = |run: &LoadReport| run.quantile_us(0.99).max(1) as f64;
    for (i, (name, router)) in routers.iter().enumerate() {
        let ratios: Vec<f64> = (0..ROUNDS).map(|r| p99(&runs[i][r]) / p99(&runs[0][r])).collect();
        let (lo, hi) = ratios.iter().fold((f64::MAX, 0f64), |(lo, hi), r| (lo.min(*r), hi.max(*r)));
        let ratio = median(ratios.clone());
        let throughput = median(runs[i].iter().map(LoadReport::throughput).collect());
        let p50 = median(runs[i].iter().map(|r| r.quantile_us(0.5) as f64 / 1000.0).collect());
        let p99_ms = median(runs[i].iter().map(|r| p99(r) / 1000.0).collect());
        // No series without tracing: an empty sum, which is -0.
        let dropped = router.metric("atenet_router_trace_spans_dropped_total", "").abs();
        report.line(&format!(
            "| {name} | {throughput:.0} | {p50:.3} / {p99_ms:.3} | **{ratio:.3}x** ({lo:.3}-{hi:.3}) | {dropped:.0} |"
        ));
        report.figure("tracing", &format!("{name} p99 ratio"), ratio);
    }
    drop(silent);
}
