//! Deadline-aware parking and fair shares (B68, B69): what each buys, with
//! and without, in the same run.

use std::time::Duration;

use atenet_router::actor::resume::Code;
use atenet_router::tools::load::{self, CallerDeadline, Envoy, LoadReport, Stop};
use atenet_router::tools::sim::{Answer, Sim, SimConfig};

use crate::harness::{actors, sim, spec, Proc};
use crate::report::{median, Bound, Report};

/// Rounds of each mode; figures are the median round.
const MODE_ROUNDS: usize = 3;

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

pub fn deadlines(report: &mut Report) {
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
            load.grpc_timeout = CallerDeadline::parse("300m");
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
    let ratio = held[1] / held[0].max(1e-9);
    report.figure("deadlines", "held_past_deadline_seconds_off", held[0]);
    report.figure("deadlines", "held_past_deadline_seconds_on", held[1]);
    let status =
        report.target("seconds held past callers' deadlines, honoured / ignored", ratio, Bound::AtMost(0.05));
    report.line(&format!(
        "\nSeconds held past callers' deadlines (the client's own count of how late each verdict came): \
         **{ratio:.3}x** with deadlines honoured ({status}; target <= 0.05x, near zero). 100 callers in a closed loop over 200 actors, \
         5 s per run, median of {MODE_ROUNDS} alternating runs."
    ));
}

pub fn fair_shares(report: &mut Report) {
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
    report.figure("fair-shares", "polite_shed_rate_uncapped", shed_rates[0]);
    report.figure("fair-shares", "polite_shed_rate_capped", shed_rates[1]);
    let status = report.target(
        "polite atespace's shed rate with the cap (%)",
        shed_rates[1] * 100.0,
        Bound::Equal(0.0),
    );
    report.line(&format!(
        "\nPolite shed rate with the cap: **{:.1}%** (without: {:.1}%; {status}). Target: 0 while the cap holds. \
         300 greedy callers (actors that never resume, 2 s budget) and 20 polite ones (one retry each), \
         median of {MODE_ROUNDS} runs.",
        shed_rates[1] * 100.0,
        shed_rates[0] * 100.0
    ));
}
