//! `fleet`: what a fleet of routers costs the control plane (issue 27).
//!
//! One router makes one ResumeActor call per attempt per actor, however
//! many requests wait for it (B14). A fleet keeps that only if every Envoy
//! sends an actor to the same router (B87). The figure: ResumeActor calls
//! per *waiting actor-second*, with three routers against one, same load,
//! the ratio at most 1.1. Calls are what the simulator answered (its
//! `--answer-log`), never the routers' own counters; waiting actor-seconds
//! come from the client: for each actor, how long at least one of its
//! requests was waiting for an answer, summed over the actors. That
//! measure does not move with throughput: a parked actor costs one call per
//! retry whether one request waits for it or ten.
//!
//! Since the saturation groups (B109), a full pool costs a call per group
//! probe, not per parked actor, and a fleet without affinity waits longer
//! as much as it calls more: calls per waiting actor-second hardly sees a
//! broken hash any more. So a second figure, ResumeActor calls per
//! request, three routers over one, the same bound: an island still
//! resumes an actor another router is resuming (the Aborted) and makes a
//! first attempt per router. The fleet's routers run with `--fleet-size`
//! their number (B127), as the fleet manifests do.
//!
//! Three stacks run side by side, each measured in turn, the order rotating
//! each round: two Envoy 1.40s from `envoy-config --routers` over **one
//! router**, the same over **three routers**, and a **control**: three
//! routers with the hash policy taken out of each bootstrap, so that each
//! Envoy picks a router at random per stream, which is what the figure
//! must be able to see. Each stack has its own `ateapi-sim`, saturated as
//! in `tests/system/test_envoy_fleet.py` (6 workers, 24 actors, a 100 ms
//! restore, suspended 300 ms after each resume), every worker the one
//! direct-response Envoy. The load runs in this process: 24 closed-loop
//! clients, each request for one of the 24 actors at random through one of
//! the two Envoys at random, over keep-alive connections.
//!
//! Ports: `ATENET_BENCH_PORT_BASE` (20400) + 30 for the worker, + 32 to
//! + 55 for the Envoys; the routers and simulators take free ports.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use atenet_router::tools::load::http::{self, HttpTarget};

use crate::envoy_path::{admin_get, envoy_binary, worker_config, EnvoyProc, Ports};
use crate::harness::{first_line, router_binary, Proc, Simulator};
use crate::report::{median, Bound, Report};

/// Rounds: each measures every stack once.
const ROUNDS: usize = 5;
/// One run's length.
const RUN: Duration = Duration::from_secs(8);
const CLIENTS: usize = 24;
const ACTORS: usize = 24;
const ENVOYS: usize = 2;
/// The bound on both figures, three routers over one.
const RATIO_BOUND: f64 = 1.1;
/// Longer than the park budget: the router answers every request first.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// The three stacks, in the order of the table.
#[derive(Clone, Copy, PartialEq)]
enum Layout {
    One,
    Three,
    Unhashed,
}

const LAYOUTS: [Layout; 3] = [Layout::One, Layout::Three, Layout::Unhashed];

impl Layout {
    fn name(self) -> &'static str {
        match self {
            Layout::One => "1 router",
            Layout::Three => "3 routers",
            Layout::Unhashed => "3 routers, hash policy removed (control)",
        }
    }

    fn key(self) -> &'static str {
        match self {
            Layout::One => "one",
            Layout::Three => "three",
            Layout::Unhashed => "unhashed",
        }
    }

    fn routers(self) -> usize {
        match self {
            Layout::One => 1,
            Layout::Three | Layout::Unhashed => 3,
        }
    }

    fn index(self) -> usize {
        LAYOUTS.iter().position(|l| *l == self).unwrap_or(0)
    }
}

/// The routers' flags, shared by `serve` and `envoy-config`: those of the
/// fleet test (a 20 s budget, a retry every 50 ms), as fleet routers of a
/// fleet of `routers` (B127).
fn router_flags(sim: &str, worker: u16, routers: usize) -> Vec<String> {
    [
        "--ateapi-insecure",
        "--ateapi-address",
        sim,
        "--extproc-address",
        "127.0.0.1",
        "--worker-port",
        &worker.to_string(),
        "--envoys",
        &ENVOYS.to_string(),
        "--fleet-size",
        &routers.to_string(),
        "--drain-delay",
        "3s",
        "--drain-complete-file",
        "",
        "--parked-request-budget",
        "20s",
        "--parked-request-retry-interval",
        "50ms",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// `text` without its router cluster's hash policy: each Envoy then picks
/// a router at random for every stream. Panics, saying what it looked for,
/// when the generated config no longer has that shape.
fn without_hashing(text: &str) -> String {
    let start = text.find("        hash_policy:\n").expect("fleet: no hash_policy in the generated config");
    let end = start
        + text[start..]
            .find("    circuit_breakers:\n")
            .expect("fleet: no circuit_breakers after the hash_policy in the generated config");
    format!("{}{}", &text[..start], &text[end..])
}

/// One stack: its simulator (and the answer log it writes), its routers and
/// its Envoys.
struct Stack {
    _sim: Simulator,
    answer_log: std::path::PathBuf,
    _routers: Vec<Proc>,
    _envoys: Vec<EnvoyProc>,
    targets: Vec<HttpTarget>,
}

impl Stack {
    fn start(layout: Layout, dir: &Path, ports: &Ports, worker: u16) -> Stack {
        let answer_log = dir.join(format!("answers-{}.jsonl", layout.key()));
        let _ = std::fs::remove_file(&answer_log);
        let log = answer_log.display().to_string();
        let sim = Simulator::start_shaped(&[
            "--listen",
            "127.0.0.1:0",
            "--workers",
            "6",
            "--actors",
            &ACTORS.to_string(),
            "--restore-latency",
            "100ms",
            "--idle-suspend",
            "300ms",
            "--worker-ip",
            "127.0.0.1",
            "--answer-log",
            &log,
        ]);
        let flags = router_flags(&sim.addr.to_string(), worker, layout.routers());
        let routers: Vec<Proc> = (0..layout.routers()).map(|_| start_router(&flags)).collect();
        let fleet = routers.iter().map(|r| r.extproc.to_string()).collect::<Vec<_>>().join(",");
        let envoy = envoy_binary();
        let mut envoys = Vec::new();
        let mut targets = Vec::new();
        for j in 0..ENVOYS {
            let first = ports.base + 32 + 8 * layout.index() as u16 + 4 * j as u16;
            let [listen, admin, health, stats] = [first, first + 1, first + 2, first + 3];
            let output = Command::new(router_binary())
                .arg("envoy-config")
                .args(&flags)
                .args(["--routers", &fleet, "--envoy-listen-address", "127.0.0.1"])
                .args(["--port-http", &listen.to_string(), "--port-health", &health.to_string()])
                .args(["--port-stats", &stats.to_string()])
                .args(["--envoy-admin-address", &format!("127.0.0.1:{admin}")])
                .output()
                .expect("running atenet-router envoy-config");
            assert!(
                output.status.success(),
                "fleet: atenet-router envoy-config --routers {fleet} failed: {}",
                String::from_utf8_lossy(&output.stderr)
            );
            let mut text = String::from_utf8(output.stdout).expect("the Envoy config is UTF-8");
            if layout == Layout::Unhashed {
                text = without_hashing(&text);
            }
            let name = format!("envoy-{}-{j}", layout.key());
            let yaml = dir.join(format!("{name}.yaml"));
            std::fs::write(&yaml, text).expect("writing an Envoy config");
            let proc = EnvoyProc::start(
                &envoy,
                &yaml,
                &dir.join(format!("{name}.log")),
                &format!("http://127.0.0.1:{admin}/ready"),
            );
            wait_healthy(admin, layout.routers());
            envoys.push(proc);
            targets.push(HttpTarget::parse(&format!("http://127.0.0.1:{listen}/")).expect("an Envoy URL"));
        }
        Stack { _sim: sim, answer_log, _routers: routers, _envoys: envoys, targets }
    }

    /// The simulator's answers so far (lines of its log with a code; an
    /// idle suspension has none), and how many of them were Aborted: a
    /// second router resuming an actor one is already resuming.
    fn answers(&self) -> (u64, u64) {
        let text = std::fs::read_to_string(&self.answer_log).unwrap_or_default();
        let calls = text.lines().filter(|l| l.contains("\"code\":")).count() as u64;
        let aborted = text.lines().filter(|l| l.contains("\"code\":\"Aborted\"")).count() as u64;
        (calls, aborted)
    }
}

/// A fleet router on a free port, awaited until it serves.
fn start_router(flags: &[String]) -> Proc {
    let mut child = Command::new(router_binary())
        .arg("serve")
        .args(flags)
        .args(["--port-extproc", "0", "--metrics-listen-addr", "127.0.0.1:0"])
        .args(["--status-port", "0", "--envoy-admin-address", ""])
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .expect("start router");
    let line = first_line(&mut child, " serving: ");
    let field = |p: &str| {
        line.split(p)
            .nth(1)
            .and_then(|rest| rest.split([' ', ',', '/']).next())
            .and_then(|addr| addr.parse().ok())
            .unwrap_or_else(|| panic!("fleet: no {p:?} address in the router's line {line:?}"))
    };
    Proc { extproc: field("ext_proc on "), metrics: Some(field("metrics on http://")), child }
}

/// Until the Envoy at admin port `admin` sees `routers` healthy routers
/// (its `/clusters`), a bounded poll.
fn wait_healthy(admin: u16, routers: usize) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let text = admin_get(admin, "/clusters");
        let healthy = text
            .lines()
            .filter(|l| l.starts_with("atenet_router::") && l.ends_with("::health_flags::healthy"))
            .count();
        if healthy == routers {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "fleet: the Envoy with admin port {admin} saw {healthy} of {routers} routers healthy within 60 s"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// One request as the client saw it.
struct Exchange {
    actor: usize,
    sent: Instant,
    answered: Instant,
    /// `200`, `<status> <x-atenet-reason>`, `http-error …`, or `timeout`.
    verdict: String,
}

/// What one run measured.
#[derive(Clone, Copy)]
struct Sample {
    calls: f64,
    aborted: f64,
    requests: f64,
    /// Seconds summed over the actors in which at least one request for the
    /// actor was waiting.
    waiting: f64,
    served: f64,
    budget_exhausted: f64,
    /// Neither the worker's 200 nor a router's own answer: Envoy's errors,
    /// broken connections, timeouts.
    failed: f64,
}

/// A figure judged three routers over one: its key in the results, its
/// name in the report, and how a run gives it.
struct Figure {
    key: &'static str,
    name: &'static str,
    of: fn(&Sample) -> f64,
}

impl Sample {
    fn per_waiting_second(&self) -> f64 {
        self.calls / self.waiting.max(f64::MIN_POSITIVE)
    }

    fn per_request(&self) -> f64 {
        self.calls / self.requests.max(1.0)
    }
}

/// The closed loop: `CLIENTS` threads until `RUN` has passed, each request
/// for a random actor through a random Envoy of `stack`.
fn load(stack: &Stack, seed: u64) -> Vec<Exchange> {
    let end = Instant::now() + RUN;
    std::thread::scope(|scope| {
        let clients: Vec<_> = (0..CLIENTS)
            .map(|i| {
                let targets = &stack.targets;
                scope.spawn(move || {
                    let mut rng = fastrand::Rng::with_seed(seed * 1000 + i as u64);
                    let mut connections: Vec<Option<http::Connection>> =
                        (0..targets.len()).map(|_| None).collect();
                    let mut seen = Vec::new();
                    while Instant::now() < end {
                        let actor = rng.usize(0..ACTORS);
                        let envoy = rng.usize(0..targets.len());
                        let sent = Instant::now();
                        let verdict = http::request(
                            &mut connections[envoy],
                            &targets[envoy],
                            &format!("demo/actor-{actor}"),
                            None,
                            sent + REQUEST_TIMEOUT,
                        );
                        seen.push(Exchange {
                            actor,
                            sent,
                            answered: Instant::now(),
                            verdict: verdict.unwrap_or_else(|| String::from("timeout")),
                        });
                    }
                    seen
                })
            })
            .collect();
        clients.into_iter().flat_map(|c| c.join().expect("a client thread")).collect()
    })
}

/// Seconds summed over the actors in which at least one of the actor's
/// requests was waiting: the union of each actor's [sent, answered].
fn waiting_actor_seconds(exchanges: &[Exchange]) -> f64 {
    let mut total = 0.0;
    for actor in 0..ACTORS {
        let mut spans: Vec<(Instant, Instant)> =
            exchanges.iter().filter(|e| e.actor == actor).map(|e| (e.sent, e.answered)).collect();
        spans.sort_by_key(|s| s.0);
        let mut current: Option<(Instant, Instant)> = None;
        for (from, to) in spans {
            current = match current {
                Some((a, b)) if from <= b => Some((a, b.max(to))),
                Some((a, b)) => {
                    total += (b - a).as_secs_f64();
                    Some((from, to))
                }
                None => Some((from, to)),
            };
        }
        if let Some((a, b)) = current {
            total += (b - a).as_secs_f64();
        }
    }
    total
}

fn measure(stack: &Stack, seed: u64) -> Sample {
    let (calls0, aborted0) = stack.answers();
    let exchanges = load(stack, seed);
    let (calls1, aborted1) = stack.answers();
    let count = |f: &dyn Fn(&str) -> bool| exchanges.iter().filter(|e| f(&e.verdict)).count() as f64;
    Sample {
        calls: (calls1 - calls0) as f64,
        aborted: (aborted1 - aborted0) as f64,
        requests: exchanges.len() as f64,
        waiting: waiting_actor_seconds(&exchanges),
        served: count(&|v| v == "200"),
        budget_exhausted: count(&|v| v.ends_with(" atenet_budget_exhausted")),
        failed: count(&|v| v != "200" && !v.contains(" atenet_")),
    }
}

pub fn fleet(report: &mut Report) {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("fleet");
    std::fs::create_dir_all(&dir).expect("creating the fleet directory");
    let ports = Ports::from_env();
    let worker_port = ports.base + 30;
    let worker_yaml = dir.join("worker.yaml");
    std::fs::write(&worker_yaml, worker_config(worker_port)).expect("writing the worker's config");
    let _worker = EnvoyProc::start(
        &envoy_binary(),
        &worker_yaml,
        &dir.join("worker.log"),
        &format!("http://127.0.0.1:{worker_port}/"),
    );
    let stacks: Vec<Stack> = LAYOUTS.iter().map(|l| Stack::start(*l, &dir, &ports, worker_port)).collect();
    // Warm up: every connection opened, every actor resumed once.
    for (i, stack) in stacks.iter().enumerate() {
        let _ = load(stack, 900 + i as u64);
    }
    // rounds[r][layout index]; the order rotates so that drift favours none.
    let rounds: Vec<[Sample; 3]> = (0..ROUNDS)
        .map(|round| {
            let mut samples = [None; 3];
            for k in 0..3 {
                let layout = LAYOUTS[(round + k) % 3];
                samples[layout.index()] = Some(measure(&stacks[layout.index()], round as u64));
            }
            samples.map(|s| s.expect("every layout ran"))
        })
        .collect();
    report.line("\n## Fleet: ResumeActor calls per waiting actor-second, 3 routers against 1\n");
    report.line(&format!(
        "Two Envoy 1.40s from `envoy-config --routers` per stack, ateapi-sim saturated (6 workers, {ACTORS} actors, 100 ms restore, suspended 300 ms after a resume), {CLIENTS} closed-loop clients, each request for a random actor through a random Envoy; calls from the simulator's answer log, waiting actor-seconds from the client. Configs and logs: {}.\n",
        dir.display()
    ));
    report.line("| layout | round | requests | served | budget-exhausted | failed | ResumeActor calls | Aborted | waiting actor-s | calls / waiting actor-s | calls / request |");
    report.line("|---|---|---|---|---|---|---|---|---|---|---|");
    for layout in LAYOUTS {
        for (r, round) in rounds.iter().enumerate() {
            let s = &round[layout.index()];
            report.line(&format!(
                "| {} | {} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {:.1} | {:.3} | {:.2} |",
                layout.name(),
                r + 1,
                s.requests,
                s.served,
                s.budget_exhausted,
                s.failed,
                s.calls,
                s.aborted,
                s.waiting,
                s.per_waiting_second(),
                s.per_request(),
            ));
        }
        let side =
            |f: &dyn Fn(&Sample) -> f64| median(rounds.iter().map(|r| f(&r[layout.index()])).collect());
        let key = layout.key();
        for (name, value) in [
            ("calls_per_waiting_actor_second", side(&|s| s.per_waiting_second())),
            ("calls_per_request", side(&|s| s.per_request())),
            ("calls", side(&|s| s.calls)),
            ("aborted", side(&|s| s.aborted)),
            ("requests", side(&|s| s.requests)),
            ("waiting_actor_seconds", side(&|s| s.waiting)),
            ("budget_exhausted", side(&|s| s.budget_exhausted)),
            ("failed", side(&|s| s.failed)),
        ] {
            report.figure("fleet", &format!("{key}.{name}"), value);
        }
    }
    // Paired within each round, then the median.
    let ratios = |layout: Layout, figure: fn(&Sample) -> f64| -> Vec<f64> {
        rounds.iter().map(|r| figure(&r[layout.index()]) / figure(&r[0])).collect()
    };
    let listed = |ratios: &[f64]| ratios.iter().map(|r| format!("{r:.3}")).collect::<Vec<_>>().join(", ");
    let figures: [Figure; 2] = [
        Figure {
            key: "calls_per_waiting_actor_second",
            name: "ResumeActor calls per waiting actor-second",
            of: Sample::per_waiting_second,
        },
        Figure { key: "calls_per_request", name: "ResumeActor calls per request", of: Sample::per_request },
    ];
    let failed: f64 = rounds.iter().flat_map(|r| r[..2].iter().map(|s| s.failed)).sum();
    report.line(&format!(
        "\n{ROUNDS} rounds, each running the three stacks once ({} s each), the order rotating; ratios are the medians of the per-round ratios to the 1-router stack.\n",
        RUN.as_secs()
    ));
    report.line("| target | per round | median | status |");
    report.line("|---|---|---|---|");
    for Figure { key, name, of } in figures {
        let (three, unhashed) = (ratios(Layout::Three, of), ratios(Layout::Unhashed, of));
        let (three_median, unhashed_median) = (median(three.clone()), median(unhashed.clone()));
        report.figure("fleet", &format!("ratio.{key}.three_over_one"), three_median);
        report.figure("fleet", &format!("ratio.{key}.unhashed_over_one"), unhashed_median);
        let status = report.target(
            &format!("fleet: {name}, 3 routers / 1 router"),
            three_median,
            Bound::AtMost(RATIO_BOUND),
        );
        report.line(&format!(
            "| {name}, 3 routers / 1 router | {} | {three_median:.3}x | {status} |",
            listed(&three)
        ));
        report.line(&format!(
            "| (control, not a target) the same, hash policy removed / 1 router | {} | {unhashed_median:.3}x | {} |",
            listed(&unhashed),
            if unhashed_median > RATIO_BOUND {
                "above the bound, as it should be"
            } else {
                "**within the bound: this figure does not see a broken hash**"
            }
        ));
    }
    let status =
        report.target("fleet: requests failed, 1 and 3 routers, every round", failed, Bound::Equal(0.0));
    report.line(&format!("| requests failed (neither the worker's 200 nor a router's answer), 1 and 3 routers | — | {failed:.0} | {status} |"));
}
