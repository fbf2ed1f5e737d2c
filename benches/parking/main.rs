//! `make bench`: the router against a minimal baseline, both calling the same
//! simulated control plane, in one run.
//!
//! Nothing here asserts a timing: every figure is printed, and router figures
//! are ratios to the baseline measured alternately in the same run. Each
//! target is judged on the median of at least three runs. The router and the
//! baseline each run as their own process so that their memory, threads and
//! CPU can be read from /proc; the load generator and the simulated ateapi
//! run in this process.
//!
//! `cargo bench --profile release --features testkit --bench parking [-- --only NAME]`;
//! scenarios: fast-path, park-capacity, amplification, timer, recovery,
//! cost-growth, deadlines, fair-shares, saturation (a saturated pool's
//! queue against per-flight retries), envoy-path (through a real Envoy,
//! every component a process of its own), fleet (ResumeActor calls per
//! waiting actor-second, 3 routers against 1, through real Envoys); and,
//! only when named,
//! fast-path-external (the fast path with the load generator and the
//! simulator in processes of their own), park-distinct (memory per
//! distinct actor), tracing (the fast path traced, to a collector that
//! never answers or is down, against no tracing) and park-memory, with the
//! `memory-probe` feature (`make bench-memory`). The table goes to
//! `$CARGO_TARGET_DIR/tmp/bench-results.md`, the targets and raw figures to
//! `bench-results.json` beside it (and a copy named by the run's time), which
//! `make bench-compare A B` compares.

mod distinct;
mod envoy_path;
mod fast_path;
mod fleet;
mod harness;
mod memory;
mod parking;
mod policy;
mod report;
mod saturation;
mod tracing;

use report::Report;

/// A scenario's name (for `--only`) and what runs it.
type Scenario = (&'static str, fn(&mut Report));

/// Every scenario, in the order a full run takes them.
const SCENARIOS: [Scenario; 11] = [
    ("fast-path", fast_path::fast_path),
    ("park-capacity", parking::park_capacity),
    ("amplification", parking::amplification),
    ("timer", parking::timer_precision),
    ("recovery", parking::recovery),
    ("cost-growth", fast_path::cost_growth),
    ("deadlines", policy::deadlines),
    ("fair-shares", policy::fair_shares),
    ("saturation", saturation::saturation),
    ("envoy-path", envoy_path::envoy_path),
    ("fleet", fleet::fleet),
];

/// Scenarios a full run leaves out, run only when named with `--only`.
const ON_REQUEST: [Scenario; 4] = [
    ("park-memory", memory::park_memory),
    ("fast-path-external", fast_path::fast_path_external),
    ("park-distinct", distinct::park_distinct),
    ("tracing", tracing::tracing),
];

fn main() {
    if std::env::var("ATENET_BENCH_ROLE").as_deref() == Ok("baseline") {
        return harness::baseline_server(&std::env::var("ATENET_BENCH_ATEAPI").expect("ateapi address"));
    }
    let args: Vec<String> = std::env::args().collect();
    let only = args.iter().position(|a| a == "--only").and_then(|i| args.get(i + 1)).cloned();
    if let Some(name) = &only {
        if !SCENARIOS.iter().chain(&ON_REQUEST).any(|(n, _)| n == name) {
            let names: Vec<&str> = SCENARIOS.iter().chain(&ON_REQUEST).map(|(n, _)| *n).collect();
            eprintln!("bench: no scenario {name:?}; scenarios: {}", names.join(", "));
            std::process::exit(2);
        }
    }
    let machine = format!(
        "{} cores, {}",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        harness::cpu_model()
    );
    let now = std::time::SystemTime::now();
    let date = atenet_router::telemetry::logging::rfc3339(now);
    let mut report = Report::default();
    report.line(&format!("machine: {machine}; {date}"));
    for (name, scenario) in SCENARIOS {
        if only.as_deref().is_none_or(|o| o == name) {
            scenario(&mut report);
        }
    }
    for (name, scenario) in ON_REQUEST {
        if only.as_deref() == Some(name) {
            scenario(&mut report);
        }
    }
    report.summary();
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"));
    let json = report.json(&machine, &date);
    let stamp = now.duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let written = [
        ("bench-results.md", report.markdown().to_string()),
        ("bench-results.json", json.clone()),
        (&*format!("bench-results-{stamp}.json"), json),
    ]
    .iter()
    .map(|(name, text)| {
        let path = dir.join(name);
        std::fs::write(&path, text).expect("writing results");
        path.display().to_string()
    })
    .collect::<Vec<_>>();
    println!("\nresults written to {}", written.join(", "));
}
