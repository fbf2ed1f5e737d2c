//! What a parked request costs when it is the only one on its actor: the
//! router's RSS with N requests parked all on one actor against N parked
//! each on an actor of its own (BENCHMARKS.md, "Memory per distinct
//! actor"), against issue 29's target of 24 KiB per parked request when
//! every actor is distinct. Part of `park-capacity` at 20,000 with calls
//! held; `park-distinct` (run only when named) takes 20,000 in both states
//! a flight can be in, and 100,000 with calls held.

use std::time::{Duration, Instant};

use atenet_router::actor::resume::Code;
use atenet_router::tools::load::{self, Distribution, Envoy, Stop};
use atenet_router::tools::sim::{Answer, SimConfig};

use crate::harness::{actors, sim, spec, Proc};
use crate::report::{median, Bound, Report};

/// Issue 29's target: what a parked request costs, at most, when every
/// request is for an actor of its own (KiB).
const DISTINCT_TARGET_KIB: f64 = 24.0;

/// Rounds of each case; figures are their medians.
const ROUNDS: usize = 3;

/// The most ResumeActor calls one atespace has open by default (B97):
/// half of `--ateapi-max-calls`; every actor here is in one atespace.
const CALLS_OPEN: usize = 512;

/// Where every flight is while the reading is taken.
#[derive(Clone, Copy, PartialEq)]
pub enum Waiting {
    /// Retrying against a control plane that holds every call: the first
    /// attempt answered ResourceExhausted, the simulator holds the second
    /// unanswered, so the calls open are at their bound (B97) and the
    /// other flights' attempts wait for one.
    InCall,
    /// Between attempts: the first call answered ResourceExhausted and the
    /// next is two minutes away (`--parked-request-retry-interval 120s`).
    BetweenAttempts,
}

impl Waiting {
    fn label(self) -> &'static str {
        match self {
            Waiting::InCall => "calls held",
            Waiting::BetweenAttempts => "between attempts",
        }
    }

    fn key(self) -> &'static str {
        match self {
            Waiting::InCall => "in_call",
            Waiting::BetweenAttempts => "between_attempts",
        }
    }
}

/// One run's readings (KiB).
struct Reading {
    all_parked: bool,
    rss_idle: u64,
    rss_parked: u64,
    anon_idle: u64,
    anon_parked: u64,
}

impl Reading {
    fn per_parked(&self, n: usize) -> f64 {
        (self.rss_parked as f64 - self.rss_idle as f64) / n as f64
    }
}

/// `n` requests parked on `n_actors` actors (round robin), every flight
/// `waiting`; the router's VmRSS and RssAnon warmed up and idle, then with
/// all of them parked and every flight's calls made.
fn park_once(n: usize, n_actors: usize, waiting: Waiting) -> Reading {
    let sim = sim(SimConfig { workers: 0, actors: 0, ..SimConfig::default() });
    let names = actors("demo/distinct-", n_actors);
    let exhausted = Answer::error(Code::ResourceExhausted, "no free workers available");
    // The first attempt's answer parks the flight's callers (B23); with a
    // call in flight the second is held unanswered.
    let answers = match waiting {
        Waiting::InCall => vec![exhausted.clone(), exhausted.held()],
        Waiting::BetweenAttempts => vec![exhausted],
    };
    for actor in &names {
        sim.script(actor, answers.clone());
    }
    let max = n.to_string();
    // Retries wait until every first attempt has been answered: the
    // reading is of flights on their second attempt (held or due).
    let interval = match waiting {
        Waiting::InCall => "45s",
        Waiting::BetweenAttempts => "120s",
    };
    let flags = vec![
        "--parked-request-max",
        &max,
        "--parked-request-budget",
        "300s",
        "--drain-timeout",
        "340s",
        "--parked-request-retry-interval",
        interval,
    ];
    let router = Proc::router(sim.addr(), &flags);
    let envoy = Envoy::connect(router.extproc);
    sim.script("demo/warm", vec![Answer::ok("10.0.0.1", false)]);
    load::run_with(&envoy, &spec(router.extproc, 16, Stop::Count(2000), vec!["demo/warm".into()]));
    // gRPC core starts its second timer thread about 5 s after the first
    // calls, once in the life of the process: not the parked requests' cost.
    std::thread::sleep(Duration::from_secs(6));
    let (rss_idle, anon_idle) = (router.rss_kib(), router.rss_anon_kib());
    let warm_calls = sim.total_calls();
    let held = {
        let (envoy, target) = (envoy.clone(), router.extproc);
        std::thread::spawn(move || {
            let mut s = spec(target, n, Stop::Count(n as u64), names);
            s.distribution = Distribution::RoundRobin;
            load::run_with(&envoy, &s)
        })
    };
    let all_parked =
        router.wait_metric("atenet_router_parking_active", "", n as f64, Duration::from_secs(240));
    // Every flight has made its first call, and with calls held the
    // bound's worth of second ones.
    let calls = match waiting {
        Waiting::InCall => (n_actors + n_actors.min(CALLS_OPEN)) as u64,
        Waiting::BetweenAttempts => n_actors as u64,
    };
    let deadline = Instant::now() + Duration::from_secs(120);
    while sim.total_calls() < warm_calls + calls && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_secs(1));
    let (rss_parked, anon_parked) = (router.rss_kib(), router.rss_anon_kib());
    // Ending the router ends every parked stream; the client returns.
    drop(router);
    let _ = held.join();
    Reading { all_parked, rss_idle, rss_parked, anon_idle, anon_parked }
}

/// The one-actor and distinct-actor runs at each of `sizes`, in turn in each
/// round; reports each run, the medians and their difference: what a
/// distinct actor adds to a parked request. Figures under `scenario`.
pub fn distinct_actors(report: &mut Report, scenario: &str, cases: &[(usize, Vec<Waiting>)]) {
    report.line("\n### Memory per parked request: all on one actor, or each on its own\n");
    report.line("| parked | flights are | actors | KiB per parked request, each run (RSS idle → parked) | RssAnon per parked request, each run | **median** |");
    report.line("|---|---|---|---|---|---|");
    let mut targets = Vec::new();
    for &(n, ref states) in cases {
        for &waiting in states.iter() {
            let mut medians = [0.0; 2];
            for (slot, n_actors) in [1, n].into_iter().enumerate() {
                let runs: Vec<Reading> = (0..ROUNDS).map(|_| park_once(n, n_actors, waiting)).collect();
                let each: Vec<String> = runs
                    .iter()
                    .map(|r| {
                        format!(
                            "{:.2}{} ({} → {} KiB)",
                            r.per_parked(n),
                            if r.all_parked { "" } else { " NOT ALL PARKED" },
                            r.rss_idle,
                            r.rss_parked
                        )
                    })
                    .collect();
                let anon: Vec<String> = runs
                    .iter()
                    .map(|r| format!("{:.2}", (r.anon_parked as f64 - r.anon_idle as f64) / n as f64))
                    .collect();
                let m = median(runs.iter().map(|r| r.per_parked(n)).collect());
                medians[slot] = m;
                report.line(&format!(
                    "| {n} | {} | {} | {} | {} | **{m:.2}** |",
                    waiting.label(),
                    if n_actors == 1 { "1".to_string() } else { format!("{n_actors} (one each)") },
                    each.join(" / "),
                    anon.join(" / ")
                ));
            }
            let key = format!("{}.{n}", waiting.key());
            report.figure(scenario, &format!("{key}.one_actor.kib_per_parked"), medians[0]);
            report.figure(scenario, &format!("{key}.distinct.kib_per_parked"), medians[1]);
            report.figure(scenario, &format!("{key}.kib_per_distinct_actor"), medians[1] - medians[0]);
            report.line(&format!(
                "| {n} | {} | difference | what a distinct actor adds | | **{:.2}** |",
                waiting.label(),
                medians[1] - medians[0]
            ));
            targets.push((
                format!("{n} parked, one actor each, {}: KiB per parked request", waiting.label()),
                medians[1],
            ));
        }
    }
    report.line(
        "\n(VmRSS parked - VmRSS idle) / parked. Each run: a fresh router and simulator, 2,000 warm-up \
         requests, 6 s, idle VmRSS; the requests parked, every flight's first ResumeActor call made, 1 s, \
         VmRSS.",
    );
    report.line("\n| target | median | status |\n|---|---|---|");
    for (what, value) in targets {
        let status = report.target(&what, value, Bound::AtMost(DISTINCT_TARGET_KIB));
        report.line(&format!("| {what} (at most {DISTINCT_TARGET_KIB}) | {value:.2} | {status} |"));
    }
}

/// `make bench ONLY=park-distinct`: 20,000 parked, flights with calls held
/// and flights between attempts, and 100,000 with calls held.
pub fn park_distinct(report: &mut Report) {
    report.line("\n## Park distinct: memory per distinct actor\n");
    let both = vec![Waiting::InCall, Waiting::BetweenAttempts];
    distinct_actors(report, "park-distinct", &[(20_000, both), (100_000, vec![Waiting::InCall])]);
}
