//! Parked requests: how many the router holds and at what cost, how many
//! ResumeActor calls they make, how precisely retries and budgets fire, and
//! how fast parked requests are routed once capacity returns.

use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use atenet_router::actor::resume::Code;
use atenet_router::parking::timer::{sleep_until, Scheduler, TimerThread};
use atenet_router::tools::load::{self, Distribution, Envoy, Stop};
use atenet_router::tools::sim::{Answer, Sim, SimConfig};
use futures::executor::block_on;
use futures::future::join_all;

use crate::distinct;
use crate::harness::{actors, cpu_stall_micros, http_get, own_cpu_seconds, sim, spec, Proc};
use crate::report::{median, Bound, Report};

/// Runs of each parking scenario; targets use their median.
const RUNS: usize = 3;

fn exhausted() -> Answer {
    Answer::error(Code::ResourceExhausted, "no free workers available")
}

/// One run of [`park_capacity`].
struct Held {
    all_parked: bool,
    routed: u64,
    rss0_kib: u64,
    rss1_kib: u64,
    threads0: u64,
    threads1: u64,
    /// Names of the threads there were more of when parked, if any.
    extra_threads: Vec<String>,
    cpu_percent: f64,
    calls: u64,
}

const PARKED: usize = 100_000;

fn hold_once() -> Held {
    let sim = sim(SimConfig { workers: 0, actors: 0, ..SimConfig::default() });
    let hot = actors("demo/park-", 10);
    for actor in &hot {
        sim.script(actor, vec![exhausted()]);
    }
    let router = Proc::router(
        sim.addr(),
        &["--parked-request-max", "100000", "--parked-request-budget", "300s", "--drain-timeout", "340s"],
    );
    let envoy = Envoy::connect(router.extproc);
    // Warm the process up (allocator, connections) before the idle reading,
    // then let it settle: gRPC core starts its second timer thread the
    // first time one of its timers fires (about 5 s after the first calls),
    // once in the life of the process, parked requests or not.
    sim.script("demo/warm", vec![Answer::ok("10.0.0.1", false)]);
    load::run_with(&envoy, &spec(router.extproc, 16, Stop::Count(2000), vec!["demo/warm".into()]));
    std::thread::sleep(Duration::from_secs(10));
    let (rss0_kib, threads0) = (router.rss_kib(), router.threads());
    let names0 = router.thread_names();
    let held = {
        let (envoy, target, hot) = (envoy.clone(), router.extproc, hot.clone());
        std::thread::spawn(move || {
            load::run_with(&envoy, &spec(target, PARKED, Stop::Count(PARKED as u64), hot))
        })
    };
    let all_parked =
        router.wait_metric("atenet_router_parking_active", "", PARKED as f64, Duration::from_secs(240));
    let (rss1_kib, threads1) = (router.rss_kib(), router.threads());
    let names1 = router.thread_names();
    let extra_threads = names1
        .iter()
        .filter(|(name, n)| names0.get(*name).is_none_or(|was| *n > was))
        .map(|(name, n)| format!("{name} x{n}"))
        .collect();
    let cpu0 = router.cpu_seconds();
    let t0 = Instant::now();
    std::thread::sleep(Duration::from_secs(10));
    let cpu_percent = (router.cpu_seconds() - cpu0) / t0.elapsed().as_secs_f64() * 100.0;
    let calls = sim.total_calls();
    for actor in &hot {
        sim.script(actor, vec![Answer::ok("10.0.0.2", true)]);
    }
    let result = held.join().unwrap();
    let routed = result.verdicts.get("200 routed").copied().unwrap_or(0);
    Held { all_parked, routed, rss0_kib, rss1_kib, threads0, threads1, extra_threads, cpu_percent, calls }
}

pub fn park_capacity(report: &mut Report) {
    report.line("\n## Park capacity: 100,000 parked requests held 10 s\n");
    report.line("| run | all parked | routed | RSS idle → parked | KiB per parked request | threads idle / parked | CPU while holding | ResumeActor calls (10 flights) |");
    report.line("|---|---|---|---|---|---|---|---|");
    let runs: Vec<Held> = (0..RUNS).map(|_| hold_once()).collect();
    for (i, h) in runs.iter().enumerate() {
        report.line(&format!(
            "| {} | {} | {} | {} → {} KiB | {:.2} | {} / {}{} | {:.2}% of a core | {} |",
            i + 1,
            if h.all_parked { "yes" } else { "NO" },
            h.routed,
            h.rss0_kib,
            h.rss1_kib,
            per_parked(h),
            h.threads0,
            h.threads1,
            if h.extra_threads.is_empty() {
                String::new()
            } else {
                format!(" (more: {})", h.extra_threads.join(", "))
            },
            h.cpu_percent,
            h.calls
        ));
    }
    let pick = |f: &dyn Fn(&Held) -> f64| median(runs.iter().map(f).collect());
    let figures = [
        ("parked", pick(&|h| if h.all_parked { PARKED as f64 } else { 0.0 })),
        ("routed", pick(&|h| h.routed as f64)),
        ("kib_per_parked", pick(&per_parked)),
        ("extra_threads", pick(&|h| h.threads1 as f64 - h.threads0 as f64)),
        ("cpu_percent_holding", pick(&|h| h.cpu_percent)),
    ];
    for (name, value) in figures {
        report.figure("park-capacity", name, value);
    }
    report.line("\n| target | median | status |\n|---|---|---|");
    for ((_, value), (what, bound)) in figures.iter().zip([
        ("100,000 requests parked at once", Bound::Equal(PARKED as f64)),
        ("100,000 parked: every one routed", Bound::Equal(PARKED as f64)),
        ("memory per parked request (KiB)", Bound::AtMost(12.0)),
        ("threads at 100,000 parked minus idle", Bound::Equal(0.0)),
        ("CPU while holding 100,000 parked (% of a core)", Bound::AtMost(5.0)),
    ]) {
        let status = report.target(what, *value, bound);
        report.line(&format!("| {what} | {value:.2} | {status} |"));
    }
    // Beside the one-actor figure: what a parked request costs when its
    // actor has no other, the control plane holding every call it gets.
    distinct::distinct_actors(report, "park-capacity", &[(20_000, vec![distinct::Waiting::InCall])]);
}

fn per_parked(h: &Held) -> f64 {
    (h.rss1_kib as f64 - h.rss0_kib as f64) / PARKED as f64
}

pub fn amplification(report: &mut Report) {
    report.line("\n## Resume amplification\n");
    report.line("| case | requests | actors | attempts per flight | ResumeActor calls (per run) | calls per attempt per actor (median) |");
    report.line("|---|---|---|---|---|---|");
    for (case, n_actors, key) in [
        ("1,000 requests, one suspended actor", 1usize, "one_actor"),
        ("1,000 requests, 1,000 actors", 1000, "thousand_actors"),
    ] {
        let runs: Vec<(u64, f64)> = (0..RUNS).map(|_| amplify_once(n_actors)).collect();
        let per_attempt = median(runs.iter().map(|r| r.1).collect());
        let calls: Vec<String> = runs.iter().map(|r| r.0.to_string()).collect();
        report.line(&format!(
            "| {case} | 1000 | {n_actors} | 2 | {} | **{per_attempt:.3}** |",
            calls.join(", ")
        ));
        report.figure("amplification", &format!("{key}.calls_per_attempt_per_actor"), per_attempt);
        let status = report.target(
            &format!("ResumeActor calls per attempt per actor, {case}"),
            per_attempt,
            Bound::Equal(1.0),
        );
        report.line(&format!("\n{case}: {status}.\n"));
    }
}

/// (ResumeActor calls, calls per attempt per actor).
fn amplify_once(n_actors: usize) -> (u64, f64) {
    let sim = sim(SimConfig { workers: 0, actors: 0, ..SimConfig::default() });
    let names = actors("demo/amp-", n_actors);
    for actor in &names {
        // Attempt 1 is held until every request has arrived, fails, then
        // attempt 2 succeeds: two attempts per flight.
        sim.script(actor, vec![exhausted().held(), Answer::ok("10.0.0.3", true)]);
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
    assert_eq!(result.verdicts.get("200 routed").copied(), Some(1000), "every request routed");
    let calls = sim.total_calls();
    let touched = names.iter().filter(|a| sim.calls(a) > 0).count().max(1);
    (calls, calls as f64 / (touched as f64 * 2.0))
}

/// One run of [`timer_precision`].
struct Timed {
    requests: u64,
    exhausted: u64,
    fired: f64,
    /// The smallest lateness bucket bound holding 99% of the timer's tasks.
    lateness_p99_ms: f64,
    over_p50_ms: f64,
    over_p99_ms: f64,
    /// Requests the client sent more than 10 ms after their scheduled time.
    late: u64,
    calls: u64,
    /// CPU used during the run, in % of one core: the router's, and the
    /// bench process's (the client and the simulator).
    router_cpu_percent: f64,
    bench_cpu_percent: f64,
    /// The share of the run in which some task waited for a CPU (kernel
    /// pressure stall information), in %; NaN where the kernel has none.
    stall_percent: f64,
}

/// An open loop of `n` requests for distinct actors (`demo/actor-<i>`),
/// request `i` due `i / rate` seconds after the start: each request's
/// verdict, how late it was sent, and its service time (send to verdict).
fn scheduled_requests(
    envoy: &Envoy,
    n: usize,
    rate: f64,
    timeout: Duration,
) -> Vec<(String, Duration, Duration)> {
    let timer: Arc<dyn Scheduler> = TimerThread::start();
    let begin = Instant::now() + Duration::from_millis(100);
    let requests = (0..n).map(|i| {
        let (envoy, timer) = (envoy.clone(), Arc::clone(&timer));
        let due = begin + Duration::from_secs_f64(i as f64 / rate);
        async move {
            sleep_until(timer, due).await;
            let sent = Instant::now();
            let verdict = envoy.request(&format!("demo/actor-{i}"), None, timeout).await;
            (verdict, sent.saturating_duration_since(due), sent.elapsed())
        }
    });
    block_on(join_all(requests))
}

/// `flights` distinct actors arrive at `rate`/s and retry every `interval`
/// until `budget`; every flight ends budget-exhausted.
fn time_once(flights: usize, rate: f64, budget: Duration, interval: Duration) -> Timed {
    let sim = sim(SimConfig { workers: 0, actors: flights, atespace: "demo".into(), ..SimConfig::default() });
    let (budget_flag, interval_flag) =
        (format!("{}ms", budget.as_millis()), format!("{}ms", interval.as_millis()));
    let lot = (2 * flights).to_string();
    let router = Proc::router(
        sim.addr(),
        &[
            "--parked-request-max",
            &lot,
            "--parked-request-budget",
            &budget_flag,
            "--parked-request-retry-interval",
            &interval_flag,
            "--parked-request-retry-factor",
            "1.0",
            "--drain-timeout",
            "200s",
        ],
    );
    let envoy = Envoy::connect(router.extproc);
    let (router_cpu0, bench_cpu0, stall0, t0) =
        (router.cpu_seconds(), own_cpu_seconds(), cpu_stall_micros(), Instant::now());
    let sent = scheduled_requests(&envoy, flights, rate, budget * 4);
    let percent = |cpu: f64| cpu / t0.elapsed().as_secs_f64() * 100.0;
    let (router_cpu_percent, bench_cpu_percent) =
        (percent(router.cpu_seconds() - router_cpu0), percent(own_cpu_seconds() - bench_cpu0));
    let stall_percent = match (stall0, cpu_stall_micros()) {
        (Some(before), Some(after)) => percent((after - before) / 1e6),
        _ => f64::NAN,
    };
    let mut verdicts = std::collections::BTreeMap::new();
    for (verdict, _, _) in &sent {
        *verdicts.entry(verdict.as_str()).or_insert(0u64) += 1;
    }
    if verdicts.len() > 1 {
        eprintln!("timer, {flights} flights retrying every {interval:?}: verdicts {verdicts:?}");
    }
    let (fired, lateness_p99_ms) = lateness_p99(&router);
    let metrics = http_get(router.metrics.expect("the router's metrics"), "/metrics");
    // The router's own time from reading each request to its verdict, to
    // set beside the client's: where they differ, the client was late.
    let router_mean = |suffix: &str| {
        metrics
            .lines()
            .filter(|l| l.starts_with(&format!("atenet_router_route_duration_seconds_{suffix}")))
            .filter(|l| l.contains("outcome=\"no_capacity\""))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>()
    };
    let router_mean_past_ms =
        (router_mean("sum") / router_mean("count").max(1.0) - budget.as_secs_f64()) * 1e3;
    // From each request's actual send: the budget starts when the router
    // reads the request, so a client that fell behind its timetable does
    // not count against the router. Exact values, not a histogram's: at an
    // 8 s budget three significant digits would be 4 ms wide.
    let over: Vec<f64> =
        sent.iter().map(|(_, _, service)| (service.as_secs_f64() - budget.as_secs_f64()) * 1e3).collect();
    let client_mean_past_ms = over.iter().sum::<f64>() / over.len().max(1) as f64;
    eprintln!(
        "timer, {flights} flights retrying every {interval:?}: verdict past the budget, mean: router {router_mean_past_ms:.1} ms, client {client_mean_past_ms:.1} ms"
    );
    Timed {
        requests: sent.len() as u64,
        exhausted: verdicts.get("503 atenet_budget_exhausted").copied().unwrap_or(0),
        fired,
        lateness_p99_ms,
        over_p50_ms: quantile(over.clone(), 0.5),
        over_p99_ms: quantile(over, 0.99),
        late: sent.iter().filter(|(_, late, _)| *late > Duration::from_millis(10)).count() as u64,
        calls: sim.total_calls(),
        router_cpu_percent,
        bench_cpu_percent,
        stall_percent,
    }
}

pub fn timer_precision(report: &mut Report) {
    report.line("\n## Timer precision: flights retrying until their budget\n");
    report.line("| flights | arrivals | budget, retry every | run | budget exhausted | timer tasks | retry lateness p99 | verdict past budget p50 / p99 (client) | late sends | ResumeActor calls | CPU router / client + simulator | CPU stalled |");
    report.line("|---|---|---|---|---|---|---|---|---|---|---|---|");
    // (key in the results, flights, arrivals per second, budget, retry
    // interval, judged). Each second of the first case brings 10,000
    // retries and 2,000 new requests: the client, the simulator and the
    // router then saturate the two cores, and the reported case beside it,
    // at half the retries, shows how much of its lateness that costs. The
    // 100,000 case retries less often for the same reason: its calls (new
    // and retried) stay under 6,000 a second.
    let cases = [
        ("flights_10000", 10_000usize, 2000.0, Duration::from_secs(8), Duration::from_secs(1), true),
        ("flights_10000_retry_2s", 10_000, 2000.0, Duration::from_secs(8), Duration::from_secs(2), false),
        ("flights_100000", 100_000, 2500.0, Duration::from_secs(45), Duration::from_secs(30), true),
    ];
    let mut judged = Vec::new();
    for (key, flights, rate, budget, interval, is_judged) in cases {
        let runs: Vec<Timed> = (0..RUNS).map(|_| time_once(flights, rate, budget, interval)).collect();
        for (i, t) in runs.iter().enumerate() {
            report.line(&format!(
                "| {flights} | {rate:.0}/s | {budget:?}, {interval:?} | {} | {} of {} | {:.0} | <= {} ms | {:.3} / {:.3} ms | {} | {} | {:.0}% / {:.0}% | {:.0}% |",
                i + 1,
                t.exhausted,
                t.requests,
                t.fired,
                t.lateness_p99_ms,
                t.over_p50_ms,
                t.over_p99_ms,
                t.late,
                t.calls,
                t.router_cpu_percent,
                t.bench_cpu_percent,
                t.stall_percent
            ));
        }
        let lateness = median(runs.iter().map(|t| t.lateness_p99_ms).collect());
        let over = median(runs.iter().map(|t| t.over_p99_ms).collect());
        let all = median(runs.iter().map(|t| t.exhausted as f64).collect());
        report.figure("timer", &format!("{key}.retry_lateness_p99_ms"), lateness);
        report.figure("timer", &format!("{key}.verdict_past_budget_p99_ms"), over);
        report.figure("timer", &format!("{key}.budget_exhausted"), all);
        report.figure(
            "timer",
            &format!("{key}.cpu_stalled_percent"),
            median(runs.iter().map(|t| t.stall_percent).collect()),
        );
        if is_judged {
            judged.push((flights, lateness, over, all));
        }
    }
    report.line("\n| target | median | status |\n|---|---|---|");
    for (flights, lateness, over, all) in judged {
        for (what, value, bound) in [
            (format!("{flights} flights: every one budget-exhausted"), all, Bound::Equal(flights as f64)),
            (format!("{flights} flights: retry lateness p99 (ms)"), lateness, Bound::AtMost(2.0)),
            (
                format!("{flights} flights: budget-exhaustion verdict past the budget, p99 (ms)"),
                over,
                Bound::AtMost(10.0),
            ),
        ] {
            let status = report.target(&what, value, bound);
            report.line(&format!("| {what} | {value:.3} | {status} |"));
        }
    }
    report.line(
        "\nRetry lateness is the timer thread's own histogram (the bound of the smallest bucket holding 99% of\nits tasks). The verdict's lateness is the client's: from each request's actual send to its verdict, minus\nthe budget (late sends: requests the client sent more than 10 ms after their scheduled time). CPU stalled is\nthe share of the run in which some task waited for a core (the kernel's pressure stall information). The\nsecond case, retrying every 2 s, is reported, not judged.",
    );
}

/// (tasks fired, the smallest bucket bound in ms holding >= 99% of them).
fn lateness_p99(router: &Proc) -> (f64, f64) {
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
    let bound =
        buckets.iter().find(|(_, count)| *count >= 0.99 * total).map_or(f64::NAN, |(le, _)| le * 1000.0);
    (total, bound)
}

/// One run of [`recovery`].
struct Recovered {
    routed: usize,
    /// Verdict time minus the first successful resume, per request, in ms.
    after_success_ms: Vec<f64>,
    /// From capacity returning to the next attempt, in ms.
    backoff_wait_ms: f64,
    /// The longest that wait can be by the retry schedule, in ms.
    backoff_bound_ms: f64,
}

const RETRY_INTERVAL: f64 = 0.1;
const RETRY_FACTOR: f64 = 1.1;
const RETRY_JITTER: f64 = 0.1;

/// `n` requests for `actor`, each yielding its verdict and when it came.
fn parked_requests(envoy: &Envoy, actor: &str, n: usize) -> JoinHandle<Vec<(String, Instant)>> {
    let (envoy, actor) = (envoy.clone(), actor.to_string());
    std::thread::spawn(move || {
        block_on(join_all((0..n).map(|_| async {
            let verdict = envoy.request(&actor, None, Duration::from_secs(120)).await;
            (verdict, Instant::now())
        })))
    })
}

fn recover_once(n: usize) -> Recovered {
    let sim: Sim = sim(SimConfig { workers: 0, actors: 0, ..SimConfig::default() });
    let actor = "demo/recovering";
    sim.script(actor, vec![exhausted()]);
    let router = Proc::router(
        sim.addr(),
        &["--parked-request-max", "20000", "--parked-request-budget", "120s", "--drain-timeout", "160s"],
    );
    let envoy = Envoy::connect(router.extproc);
    let requests = parked_requests(&envoy, actor, n);
    router.wait_metric("atenet_router_parking_active", "", n as f64, Duration::from_secs(120));
    // Let the backoff grow past its first steps, as in a real saturation.
    std::thread::sleep(Duration::from_secs(2));
    let failed = sim.calls(actor);
    let back = Instant::now();
    sim.script(actor, vec![Answer::ok("10.0.0.5", true)]);
    let verdicts = requests.join().unwrap();
    let first = sim.first_answered(actor, Code::Ok).expect("a successful resume");
    let bound = RETRY_INTERVAL * RETRY_FACTOR.powi(failed as i32 - 1) * (1.0 + RETRY_JITTER);
    Recovered {
        routed: verdicts.iter().filter(|(v, _)| v == "200 routed").count(),
        after_success_ms: verdicts
            .iter()
            .map(|(_, at)| at.saturating_duration_since(first).as_secs_f64() * 1e3)
            .collect(),
        backoff_wait_ms: first.saturating_duration_since(back).as_secs_f64() * 1e3,
        backoff_bound_ms: bound * 1e3,
    }
}

fn quantile(mut values: Vec<f64>, q: f64) -> f64 {
    values.sort_by(f64::total_cmp);
    let rank = ((values.len() as f64 * q).ceil() as usize).clamp(1, values.len());
    values[rank - 1]
}

pub fn recovery(report: &mut Report) {
    report.line("\n## Recovery: parked requests routed once a worker frees\n");
    report.line("| parked on one actor | run | routed | verdict after the first successful resume p50 / p99 / max | capacity back → next attempt | bound by the retry schedule |");
    report.line("|---|---|---|---|---|---|");
    let mut judged = Vec::new();
    for n in [1usize, 100, 10_000] {
        let runs: Vec<Recovered> = (0..RUNS).map(|_| recover_once(n)).collect();
        for (i, r) in runs.iter().enumerate() {
            report.line(&format!(
                "| {n} | {} | {} | {:.3} / {:.3} / {:.3} ms | {:.1} ms | {:.1} ms |",
                i + 1,
                r.routed,
                quantile(r.after_success_ms.clone(), 0.5),
                quantile(r.after_success_ms.clone(), 0.99),
                quantile(r.after_success_ms.clone(), 1.0),
                r.backoff_wait_ms,
                r.backoff_bound_ms
            ));
        }
        let p50 = median(runs.iter().map(|r| quantile(r.after_success_ms.clone(), 0.5)).collect());
        let p99 = median(runs.iter().map(|r| quantile(r.after_success_ms.clone(), 0.99)).collect());
        let past_bound = median(runs.iter().map(|r| r.backoff_wait_ms - r.backoff_bound_ms).collect());
        let routed = median(runs.iter().map(|r| r.routed as f64).collect());
        report.figure("recovery", &format!("n_{n}.after_success_p50_ms"), p50);
        report.figure("recovery", &format!("n_{n}.after_success_p99_ms"), p99);
        report.figure("recovery", &format!("n_{n}.backoff_wait_past_bound_ms"), past_bound);
        judged.push((n, routed, past_bound));
    }
    report.line("\n| target | median | status |\n|---|---|---|");
    for (n, routed, past_bound) in judged {
        for (what, value, bound) in [
            (format!("recovery, {n} parked: every one routed"), routed, Bound::Equal(n as f64)),
            (
                format!("recovery, {n} parked: next attempt past the retry schedule's bound (ms; 2 ms of timer lateness allowed)"),
                past_bound,
                Bound::AtMost(2.0),
            ),
        ] {
            let status = report.target(&what, value, bound);
            report.line(&format!("| {what} | {value:.3} | {status} |"));
        }
    }
    report.line(&format!(
        "\nRetry schedule: {}ms x {RETRY_FACTOR} per retry, jitter {RETRY_JITTER} (the defaults). Capacity returns 2 s after every request\nhas parked; the bound is the delay the schedule allows after the attempts made so far.",
        RETRY_INTERVAL * 1000.0
    ));
}
