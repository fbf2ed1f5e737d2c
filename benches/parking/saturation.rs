//! A saturated pool (B109-B111): the saturation groups against per-flight
//! retries (`--parked-request-dispatch per-flight`), in the same run,
//! alternating rounds.
//!
//! Each mode has its own simulator and router: a pool of 8 workers, 400
//! actors, 100 ms restores, an actor suspended 300 ms after its last
//! resume, so the pool takes about 20 new actors a second; an open loop
//! sends 22 requests a second for random actors, so the pool stays full.
//! A second load, reported and not judged, has restores of 1 s (slower
//! than a group's longest delay, where B129 matters), about 6.2 new actors
//! a second, and 6.8 requests a second.
//! Calls come from the simulator's answer log, waiting actor-seconds from
//! the router's parked wait (the requests are for distinct actors, nearly
//! all).
//!
//! The target counts the calls of waiting flights: issue 36's 1.8 calls per
//! parked flight-second, and its 30 calls a second for 300 parked flights,
//! are what flights already refused cost. A first attempt is not one: no
//! flight waits until it is refused, B110 never delays it, and it is the
//! same in both modes. Counting it too, the groups' floor (a first call per
//! request and one more per parked request served) is itself about 0.2x of
//! per-flight's calls on this load, so that figure is reported, not judged.

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use atenet_router::tools::load::{self, Envoy, LoadReport, Stop};
use atenet_router::tools::sim::{Sim, SimConfig};

use crate::harness::{sim, spec, Proc};
use crate::report::{median, Bound, Report};

const ROUNDS: usize = 3;
const ROUND: Duration = Duration::from_secs(20);
const WORKERS: usize = 8;
const IDLE_SUSPEND: Duration = Duration::from_millis(300);
const MODES: [&str; 2] = ["per-flight", "saturation-group"];
/// The routers' park budget (`--parked-request-budget`): a refusal older
/// than this ended its flight.
const BUDGET: Duration = Duration::from_secs(5);

/// One round's figures.
struct Round {
    load: LoadReport,
    calls: f64,
    /// Calls of flights already refused (see [`AnswerLog`]).
    waiting_calls: f64,
    waiting_seconds: f64,
    /// Requests admitted to the lot: each one's flight needed a call
    /// beyond its first to be served.
    parked: f64,
    /// The share of the workers taken while flights waited that went to
    /// first attempts, around the queue; none when no flight waited.
    first_attempts_share: Option<f64>,
}

impl Round {
    fn calls_per_waiting_second(&self) -> f64 {
        self.calls / self.waiting_seconds.max(1e-9)
    }

    /// The calls of waiting flights per waiting actor-second: what the
    /// waiting itself costs (the target).
    fn waiting_calls_per_waiting_second(&self) -> f64 {
        self.waiting_calls / self.waiting_seconds.max(1e-9)
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

/// What a simulator logged in one round (see [`AnswerLog`]).
#[derive(Default)]
struct Answers {
    calls: u64,
    /// Calls of flights already refused.
    waiting_calls: u64,
    /// Resumes (a worker taken) while a flight was waiting: by a flight
    /// already waiting, and by a first attempt, which goes around the queue
    /// (B110), while another flight waited.
    resumes_by_first_attempts: u64,
    resumes_by_waiting: u64,
}

/// A simulator's answer log (`Sim::log_answers_to`), read as far as it is
/// written: which of its answers went to flights already waiting.
struct AnswerLog {
    path: std::path::PathBuf,
    /// Lines read so far, and each actor's latest answer: when, and
    /// whether it was a refusal.
    read: usize,
    latest: HashMap<String, (f64, bool)>,
}

impl AnswerLog {
    fn new(path: &Path) -> AnswerLog {
        AnswerLog { path: path.to_path_buf(), read: 0, latest: HashMap::new() }
    }

    /// Whether `actor` was waiting at `time`: its latest answer was a
    /// refusal less than a budget before (an older one ended its flight).
    fn waiting(&self, actor: &str, time: f64) -> bool {
        matches!(self.latest.get(actor), Some(&(at, true)) if time - at < BUDGET.as_secs_f64())
    }

    /// The answers logged since the last call. A flight whose first attempt
    /// follows an exhausted one's last refusal within the budget counts as
    /// waiting: the figure errs against the groups, which exhaust fewer.
    fn since_last(&mut self) -> Answers {
        let text = std::fs::read_to_string(&self.path).unwrap_or_default();
        let mut answers = Answers::default();
        for line in text.lines().skip(self.read) {
            self.read += 1;
            let Ok(answer) = serde_json::from_str::<serde_json::Value>(line) else { continue };
            let (Some(actor), Some(time), Some(code)) =
                (answer["actor"].as_str(), answer["time"].as_f64(), answer["code"].as_str())
            else {
                continue; // an idle actor suspended: no answer
            };
            answers.calls += 1;
            let waiting = self.waiting(actor, time);
            if waiting {
                answers.waiting_calls += 1;
            }
            if code == "OK" && answer["resumed"].as_bool() == Some(true) {
                if waiting {
                    answers.resumes_by_waiting += 1;
                // At most 400 actors: a scan per resume is cheap enough.
                } else if self.latest.keys().any(|other| self.waiting(other, time)) {
                    answers.resumes_by_first_attempts += 1;
                }
            }
            self.latest.insert(actor.to_string(), (time, code != "OK"));
        }
        answers
    }
}

/// A pool's restore time and the open loop's rate against it; the
/// figures of a judged load are held to issue 36's targets.
struct Load {
    restore: Duration,
    rate: f64,
    judged: bool,
}

/// Issue 36's load: 10 % over a pool that takes about 20 new actors a second.
const ISSUE_LOAD: Load = Load { restore: Duration::from_millis(100), rate: 22.0, judged: true };
/// Restores slower than a group's longest delay (B129), 10 % over.
const SLOW_RESTORES: Load = Load { restore: Duration::from_millis(1000), rate: 6.8, judged: false };

pub fn saturation(report: &mut Report) {
    report.line("\n## A saturated pool: saturation groups against per-flight retries\n");
    measure(report, &ISSUE_LOAD);
    report.line("\n### Restores slower than a group's longest delay (reported, not judged)\n");
    measure(report, &SLOW_RESTORES);
}

fn measure(report: &mut Report, pool: &Load) {
    let Load { restore, rate, judged } = *pool;
    let capacity = WORKERS as f64 / (restore + IDLE_SUSPEND).as_secs_f64();
    report.line(&format!(
        "{WORKERS} workers, 400 actors, {} ms restores, suspended {} ms after a resume (about {capacity:.1} new \
         actors a second); an open loop of {rate} requests a second for random actors, {} s per round, \
         {ROUNDS} alternating rounds per mode, medians.\n",
        restore.as_millis(),
        IDLE_SUSPEND.as_millis(),
        ROUND.as_secs()
    ));
    report.line("| --parked-request-dispatch | requests | routed | parked | budget exhausted | ResumeActor calls | of them by waiting flights | waiting actor-seconds | waiting flights' calls per waiting actor-second | all calls per waiting actor-second | floor of all calls per waiting actor-second | served wait p50 | served wait p99 |");
    report.line("|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    let sims: Vec<Sim> = MODES
        .iter()
        .map(|_| {
            sim(SimConfig {
                workers: WORKERS,
                actors: 400,
                restore_latency: restore,
                idle_suspend: IDLE_SUSPEND,
                ..SimConfig::default()
            })
        })
        .collect();
    let routers: Vec<Proc> = MODES
        .iter()
        .zip(&sims)
        .map(|(mode, sim)| {
            let budget = format!("{}s", BUDGET.as_secs());
            Proc::router(sim.addr(), &["--parked-request-dispatch", mode, "--parked-request-budget", &budget])
        })
        .collect();
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("saturation");
    std::fs::create_dir_all(&dir).expect("the bench's directory");
    let mut logs: Vec<AnswerLog> = MODES
        .iter()
        .zip(&sims)
        .map(|(mode, sim)| {
            let path = dir.join(format!("answers-{mode}-{}ms.jsonl", restore.as_millis()));
            sim.log_answers_to(std::fs::File::create(&path).expect("an answer log"));
            AnswerLog::new(&path)
        })
        .collect();
    let envoys: Vec<Envoy> = routers.iter().map(|r| Envoy::connect(r.extproc)).collect();
    let names: Vec<String> = (0..400).map(|i| format!("demo/actor-{i}")).collect();
    let mut rounds: Vec<Vec<Round>> = vec![Vec::new(), Vec::new()];
    for _ in 0..ROUNDS {
        for (i, router) in routers.iter().enumerate() {
            let waited = || router.metric("atenet_router_parking_wait_duration_seconds_sum", "");
            let parked = || router.metric("atenet_router_park_decisions_total", "decision=\"admitted\"");
            let (waited_before, parked_before) = (waited(), parked());
            logs[i].since_last();
            let mut open = spec(router.extproc, 2000, Stop::After(ROUND), names.clone());
            open.rate = Some(rate);
            let load = load::run_with(&envoys[i], &open);
            // Every request has its verdict: its flight's calls are logged.
            let answers = logs[i].since_last();
            rounds[i].push(Round {
                load,
                calls: answers.calls as f64,
                waiting_calls: answers.waiting_calls as f64,
                first_attempts_share: match answers.resumes_by_first_attempts + answers.resumes_by_waiting {
                    0 => None,
                    taken => Some(answers.resumes_by_first_attempts as f64 / taken as f64),
                },
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
            pick(i, &Round::waiting_calls_per_waiting_second),
            pick(i, &Round::exhausted_share),
            pick(i, &|r| r.served_wait_ms(0.5)),
            pick(i, &|r| r.served_wait_ms(0.99)),
            pick(i, &Round::calls_per_waiting_second),
            pick(i, &Round::floor_per_waiting_second),
        ];
        report.line(&format!(
            "| {mode} | {:.0} | {:.0} | {:.0} | {:.1}% | {:.0} | {:.0} | {:.0} | **{:.3}** | {:.3} | {:.3} | {:.0} ms | {:.0} ms |",
            pick(i, &|r| r.load.completed as f64),
            pick(i, &n("200 routed")),
            pick(i, &|r| r.parked),
            figures[i][1] * 100.0,
            pick(i, &|r| r.calls),
            pick(i, &|r| r.waiting_calls),
            pick(i, &|r| r.waiting_seconds),
            figures[i][0],
            figures[i][4],
            figures[i][5],
            figures[i][2],
            figures[i][3],
        ));
    }
    let names = [
        "waiting_calls_per_waiting_second",
        "budget_exhausted_share",
        "served_wait_p50_ms",
        "served_wait_p99_ms",
        "calls_per_waiting_second",
        "floor_per_waiting_second",
    ];
    let load = if judged { String::new() } else { format!("restores_{}ms_", restore.as_millis()) };
    for (i, mode) in MODES.iter().enumerate() {
        for (name, value) in names.iter().zip(figures[i]) {
            report.figure("saturation", &format!("{load}{name}_{}", mode.replace('-', "_")), value);
        }
    }
    let ratio = |k: usize| figures[1][k] / figures[0][k].max(1e-9);
    let targets = [
        ("saturation: waiting flights' calls per waiting actor-second, groups / per-flight", ratio(0), 0.2),
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
        "\nAll calls, first attempts included, per waiting actor-second, groups / per-flight: **{:.3}x**. \
         Their floor (a first call per request, one more per parked request served) over per-flight's \
         calls: **{:.3}x**, the best any dispatcher that never delays a first attempt could show on this \
         load; the groups' calls are **{:.2}x** their floor.",
        ratio(4),
        figures[1][5] / figures[0][4].max(1e-9),
        figures[1][4] / figures[1][5].max(1e-9)
    ));
    // The served tail leaves out the requests a mode let run out of budget:
    // per-flight loses more of its longest waiters, which the groups serve.
    let every_p99: Vec<f64> =
        (0..2).map(|i| pick(i, &|r| f64::from(r.load.quantile_us(0.99)) / 1000.0)).collect();
    report.line(&format!(
        "The p99 wait of every request, one that ran out of budget counted at its wait: per-flight \
         {:.0} ms, the groups {:.0} ms (**{:.3}x**).",
        every_p99[0],
        every_p99[1],
        every_p99[1] / every_p99[0].max(1e-9)
    ));
    // Why the served tail is what it is: a worker that frees goes to
    // whoever asks first, a first attempt (never queued, B110) or a waiting
    // flight's call. The fewer calls the waiting flights make, the more of
    // the freed workers go around the queue, and the longer its oldest wait.
    let mut around = Vec::new();
    for (i, mode) in MODES.iter().enumerate() {
        // Rounds in which no flight waited say nothing of it.
        let shares: Vec<f64> = rounds[i].iter().filter_map(|r| r.first_attempts_share).collect();
        if shares.is_empty() {
            around.push(format!("{mode}: no flight waited"));
            continue;
        }
        let share = median(shares);
        report.figure("saturation", &format!("{load}first_attempts_share_{}", mode.replace('-', "_")), share);
        around.push(format!("{mode} {:.0} %", share * 100.0));
    }
    report.line(&format!(
        "Of the workers taken while flights waited, first attempts (around the queue) took: {}.",
        around.join(", ")
    ));
    report.line("\n| target | groups / per-flight | bound | |\n|---|---|---|---|");
    for (name, value, bound) in targets {
        let status =
            if judged { report.target(name, value, Bound::AtMost(bound)) } else { "not judged".to_string() };
        report.line(&format!("| {name} | **{value:.3}x** | <= {bound}x | {status} |"));
    }
}
