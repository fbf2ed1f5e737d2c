//! A bounded chaos run whose source of truth is its clients: the real router
//! binary, the simulated control plane with every fault on, SIGTERM restarts
//! with requests in flight, and clients that cancel mid-park. `SOAK_SECONDS`
//! sets the length (60 s in `make test`, 600 s in `make soak`).
//!
//! Two routers share one simulated worker pool, as two replicas would:
//! - the **accounting** router's clients never cancel, so every request they
//!   send ends in a verdict, and each verdict is checked against what the
//!   scenario allows for its actor; their counts of routed, shed and
//!   not-found verdicts must equal the router's counters, and at rest the
//!   router's ResumeActor attempts by code must equal the answers the
//!   simulator sent for those actors;
//! - the **chaos** router's clients also cancel mid-park, on actors of their
//!   own; a cancel can cross a verdict on the wire, so only the invariants
//!   that hold anyway are checked there (a verdict the scenario allows or the
//!   client's own cancel, never a broken stream; rest after traffic; one
//!   wait sample per admitted park).
//!
//! Each router's drain talks to a stand-in for its Envoy's admin API. As
//! behind a real Envoy, traffic keeps flowing through the drain delay and
//! stops only when the router tells Envoy to fail its health check; the
//! stand-in reports its clients' open requests as Envoy's downstream
//! connections, so the router waits for them. Every request has a client
//! deadline: a hang fails the run and names the actor.
// The router's internals and the simulator: `--features testkit` (make test).
#![cfg(feature = "testkit")]

use crate::common;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use atenet_router::actor::resume::Code;
use atenet_router::parking::timer::{sleep_until, Scheduler, TimerThread};
use atenet_router::proto::EXT_PROC_PROCESS;
use atenet_router::tools::load::{request_for, verdict_key};
use atenet_router::tools::sim::{Sim, SimConfig};
use common::process::{router_args, signal, spawn_router, wait_exit, RouterProcess};
use common::{http_get, Metrics};
use futures::future::{select, Either};
use futures::{SinkExt, StreamExt};
use grpcio::{CallOption, ChannelBuilder, Client, EnvBuilder, WriteFlags};
use parking_lot::Mutex;

const BUDGET: Duration = Duration::from_secs(2);
const CONCURRENCY: usize = 120;
const PATIENCE: Duration = Duration::from_secs(60);
/// No verdict can take longer: the budget, the late-serve limit, slack.
const CLIENT_DEADLINE: Duration = Duration::from_secs(30);
/// The accounting router's actors are demo/actor-0..199; the chaos
/// router's demo/actor-200..249. Unknown actors are unique ghosts.
const ACCOUNTING_ACTORS: usize = 200;
const CHAOS_ACTORS: usize = 50;

/// The codes the simulated pool answers with.
const SIM_CODES: [Code; 5] =
    [Code::Ok, Code::ResourceExhausted, Code::Unavailable, Code::Aborted, Code::NotFound];

/// Whether the accounting router's clients use `actor`.
fn accounting_actor(actor: &str) -> bool {
    actor.starts_with("demo/ghost-a")
        || actor
            .strip_prefix("demo/actor-")
            .and_then(|k| k.parse::<usize>().ok())
            .is_some_and(|k| k < ACCOUNTING_ACTORS)
}

/// How one request ended, from its client's side.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Ending {
    Verdict(String),
    /// The client cancelled it (mid-park, on purpose).
    OwnCancel,
    /// No verdict, a verdict the scenario forbids, or a broken stream: an
    /// invariant breach.
    Broken(String),
}

/// What one router's clients saw.
#[derive(Default)]
struct Ledger {
    endings: Mutex<BTreeMap<Ending, u64>>,
    started: AtomicU64,
    finished: AtomicU64,
}

impl Ledger {
    fn record(&self, ending: Ending) {
        *self.endings.lock().entry(ending).or_default() += 1;
        self.finished.fetch_add(1, Ordering::AcqRel);
    }

    fn in_flight(&self) -> u64 {
        self.started.load(Ordering::Acquire) - self.finished.load(Ordering::Acquire)
    }

    fn verdicts(&self, key: &str) -> u64 {
        self.endings.lock().get(&Ending::Verdict(key.to_string())).copied().unwrap_or(0)
    }

    fn broken(&self) -> Vec<(Ending, u64)> {
        self.endings
            .lock()
            .iter()
            .filter(|(e, _)| matches!(e, Ending::Broken(_)))
            .map(|(e, n)| (e.clone(), *n))
            .collect()
    }

    fn total_verdicts(&self) -> u64 {
        self.endings.lock().iter().filter(|(e, _)| matches!(e, Ending::Verdict(_))).map(|(_, n)| n).sum()
    }
}

/// The verdicts the scenario allows for an actor: an unknown one is only
/// ever not found; one that exists is routed or turned away for capacity.
fn allowed(actor: &str, verdict: &str) -> bool {
    if actor.starts_with("demo/ghost-") {
        verdict == "404 atenet_not_found"
    } else {
        matches!(verdict, "200 routed" | "503 atenet_lot_full" | "503 atenet_budget_exhausted")
    }
}

/// A stand-in for one Envoy's admin API (B43). `/healthcheck/fail` stops
/// the clients, as Envoy failing its health check stops new connections;
/// `/stats` reports the clients' open requests, and reports one more until
/// the router has no flight left, then takes the phase's scrape before it
/// says 0: the router cannot exit while it waits for that answer.
struct FakeEnvoy {
    addr: String,
    scrape: Arc<Mutex<Option<String>>>,
    _server: Arc<tiny_http::Server>,
}

impl FakeEnvoy {
    fn start(
        ledger: Arc<Ledger>,
        stop: Arc<AtomicBool>,
        router: Arc<Mutex<Option<(SocketAddr, SocketAddr)>>>,
    ) -> FakeEnvoy {
        let server = Arc::new(tiny_http::Server::http("127.0.0.1:0").unwrap());
        let addr = server.server_addr().to_ip().unwrap().to_string();
        let scrape = Arc::new(Mutex::new(None));
        let (srv, taken) = (Arc::clone(&server), Arc::clone(&scrape));
        std::thread::spawn(move || {
            while let Ok(request) = srv.recv() {
                let body = if request.url().starts_with("/healthcheck/fail") {
                    stop.store(true, Ordering::Release);
                    "OK\n".to_string()
                } else if request.url().starts_with("/stats") {
                    let mut open = ledger.in_flight();
                    if open == 0 {
                        let (metrics, status) = router.lock().expect("router addresses known");
                        let flights_left =
                            !http_get(status, "/statusz?format=json").1.contains("\"flights\":0,");
                        if flights_left {
                            open = 1;
                        } else {
                            *taken.lock() = Some(http_get(metrics, "/metrics").1);
                        }
                    }
                    format!("http.admin.downstream_cx_active: 1\nhttp.ingress.downstream_cx_active: {open}\n")
                } else {
                    "OK\n".to_string()
                };
                let _ = request.respond(tiny_http::Response::from_string(body));
            }
        });
        FakeEnvoy { addr, scrape, _server: server }
    }
}

fn start_router(sim: SocketAddr, envoy_admin: &str) -> (RouterProcess, SocketAddr) {
    let status_port =
        std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port().to_string();
    let sim = sim.to_string();
    let args = router_args(
        &sim,
        &[
            "--status-port",
            &status_port,
            "--parked-request-budget",
            "2s",
            "--parked-request-max",
            "60",
            "--parked-request-retry-interval",
            "50ms",
            "--late-serve-limit",
            "10s",
            "--drain-timeout",
            "20s",
            // As in production, the router keeps accepting streams for a
            // moment after SIGTERM, and its clients keep sending.
            "--drain-delay",
            "1s",
            "--envoy-admin-address",
            envoy_admin,
        ],
    );
    (spawn_router(&args), format!("127.0.0.1:{status_port}").parse().unwrap())
}

/// `http_get` from a router that must be up; if it cannot be reached, the
/// failure says whether the process still runs and what it logged last.
fn router_get(router: &RouterProcess, addr: SocketAddr, path: &str) -> String {
    if std::net::TcpStream::connect(addr).is_err() {
        router_gone(router, &format!("refuses {addr}{path}"));
    }
    http_get(addr, path).1
}

/// Fails the soak for a router that stopped serving, with its state and
/// its last log lines: a router that exits mid-phase is a crash to explain.
fn router_gone(router: &RouterProcess, what: &str) -> ! {
    let pid = router.process.child.id();
    let state = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| Some(stat.rsplit_once(") ")?.1.chars().next()?.to_string()))
        .map_or("gone".to_string(), |s| {
            if s == "Z" {
                "exited, not yet reaped".into()
            } else {
                format!("state {s}")
            }
        });
    let log = router.process.log.lock();
    let tail = &log[log.len().saturating_sub(40)..];
    panic!("router {pid} ({state}) {what}; its last log lines:\n{}", tail.join("\n"));
}

/// The router's resident memory; a router that is no longer running fails
/// the soak with its log.
fn rss_kib(router: &RouterProcess) -> u64 {
    let status =
        std::fs::read_to_string(format!("/proc/{}/status", router.process.child.id())).unwrap_or_default();
    match status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
    {
        Some(kib) => kib,
        None => router_gone(router, "has no resident memory to read"),
    }
}

fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + PATIENCE;
    while !check() {
        assert!(Instant::now() < deadline, "invariant breach: {what} did not hold within {PATIENCE:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// One Envoy-like request with a deadline; a chaos client may cancel it.
async fn one_request(
    client: Arc<Client>,
    timer: Arc<dyn Scheduler>,
    actor: String,
    cancel_after: Option<Duration>,
) -> Ending {
    let (mut tx, mut rx) = match client.duplex_streaming(&EXT_PROC_PROCESS, CallOption::default()) {
        Ok(call) => call,
        Err(e) => return Ending::Broken(format!("{actor}: open: {e}")),
    };
    if let Err(e) = tx.send((request_for(&actor, None), WriteFlags::default())).await {
        return Ending::Broken(format!("{actor}: send: {e}"));
    }
    let verdict = async {
        loop {
            match rx.next().await {
                Some(Ok(reply)) if reply.response.is_none() => continue,
                Some(Ok(reply)) => {
                    let key = verdict_key(&reply);
                    return if allowed(&actor, &key) {
                        Ending::Verdict(key)
                    } else {
                        Ending::Broken(format!("{actor}: verdict {key} is not one the scenario allows"))
                    };
                }
                Some(Err(e)) => return Ending::Broken(format!("{actor}: {e}")),
                None => return Ending::Broken(format!("{actor}: stream ended without a verdict")),
            }
        }
    };
    let give_up = cancel_after.unwrap_or(CLIENT_DEADLINE);
    let sleep = sleep_until(timer, Instant::now() + give_up);
    let ending = match select(Box::pin(verdict), sleep).await {
        Either::Left((ending, _)) => ending,
        Either::Right(((), _)) if cancel_after.is_some() => Ending::OwnCancel,
        Either::Right(((), _)) => Ending::Broken(format!("{actor}: no verdict within {CLIENT_DEADLINE:?}")),
    };
    tx.cancel();
    ending
}

/// Drives one router until `stop`; returns when every request it started
/// has ended.
fn drive(
    extproc: SocketAddr,
    ledger: &Arc<Ledger>,
    stop: &Arc<AtomicBool>,
    timer: &Arc<TimerThread>,
    chaos: bool,
    ghosts: &Arc<AtomicU64>,
) {
    let env = Arc::new(EnvBuilder::new().cq_count(1).name_prefix("soak-client").build());
    let client = Arc::new(Client::new(ChannelBuilder::new(env).connect(&extproc.to_string())));
    let (done_tx, done_rx) = crossbeam_channel::unbounded::<()>();
    for _ in 0..CONCURRENCY {
        let (client, ledger, stop, timer, done, ghosts) = (
            Arc::clone(&client),
            Arc::clone(ledger),
            Arc::clone(stop),
            timer.clone(),
            done_tx.clone(),
            Arc::clone(ghosts),
        );
        client.clone().spawn(async move {
            while !stop.load(Ordering::Acquire) {
                // A hot head of existing actors; 5% unknown ones, each unique
                // so that each is one NotFound answer at the sim.
                let actor = if fastrand::u8(..100) < 5 {
                    let which = if chaos { 'c' } else { 'a' };
                    format!("demo/ghost-{which}{}", ghosts.fetch_add(1, Ordering::AcqRel))
                } else if chaos {
                    format!(
                        "demo/actor-{}",
                        ACCOUNTING_ACTORS + (fastrand::f64().powi(2) * CHAOS_ACTORS as f64) as usize
                    )
                } else {
                    format!("demo/actor-{}", (fastrand::f64().powi(2) * ACCOUNTING_ACTORS as f64) as usize)
                };
                let cancel =
                    (chaos && fastrand::u8(..100) < 20).then(|| Duration::from_millis(fastrand::u64(..1500)));
                ledger.started.fetch_add(1, Ordering::AcqRel);
                let scheduler: Arc<dyn Scheduler> = timer.clone();
                let ending = one_request(Arc::clone(&client), Arc::clone(&scheduler), actor, cancel).await;
                ledger.record(ending);
                // A little think time, so shed requests do not spin.
                sleep_until(scheduler, Instant::now() + Duration::from_millis(fastrand::u64(..20))).await;
            }
            drop(done);
        });
    }
    drop(done_tx);
    while done_rx.recv().is_ok() {}
}

/// One router with its clients and its Envoy stand-in.
struct Replica {
    name: &'static str,
    chaos: bool,
    ledger: Arc<Ledger>,
    addresses: Arc<Mutex<Option<(SocketAddr, SocketAddr)>>>,
    stop: Arc<AtomicBool>,
    envoy: FakeEnvoy,
}

impl Replica {
    fn new(name: &'static str, chaos: bool) -> Replica {
        let (ledger, stop, addresses) =
            (Arc::new(Ledger::default()), Arc::new(AtomicBool::new(false)), Arc::new(Mutex::new(None)));
        let envoy = FakeEnvoy::start(Arc::clone(&ledger), Arc::clone(&stop), Arc::clone(&addresses));
        Replica { name, chaos, ledger, addresses, stop, envoy }
    }
}

/// Counts one phase must agree on.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Counts {
    routed: u64,
    not_found: u64,
    shed: u64,
    capacity_503: u64,
    total: u64,
}

impl Counts {
    fn of_clients(ledger: &Ledger) -> Counts {
        Counts {
            routed: ledger.verdicts("200 routed"),
            not_found: ledger.verdicts("404 atenet_not_found"),
            shed: ledger.verdicts("503 atenet_lot_full"),
            capacity_503: ledger.verdicts("503 atenet_lot_full")
                + ledger.verdicts("503 atenet_budget_exhausted"),
            total: ledger.total_verdicts(),
        }
    }

    fn of_router(metrics: &Metrics) -> Counts {
        let route = |outcome: &str| {
            metrics.value("atenet_router_route_duration_seconds_count", &[("outcome", outcome)]) as u64
        };
        Counts {
            routed: route("ok"),
            not_found: route("not_found"),
            shed: metrics.value("atenet_router_parking_rejected_total", &[]) as u64,
            capacity_503: route("no_capacity")
                + route("unavailable")
                + route("lock_conflict")
                + route("failed_precondition"),
            total: metrics.value("atenet_router_route_duration_seconds_count", &[]) as u64,
        }
    }

    fn minus(self, before: Counts) -> Counts {
        Counts {
            routed: self.routed - before.routed,
            not_found: self.not_found - before.not_found,
            shed: self.shed - before.shed,
            capacity_503: self.capacity_503 - before.capacity_503,
            total: self.total - before.total,
        }
    }
}

#[test]
fn soak() {
    let seconds: u64 = std::env::var("SOAK_SECONDS").ok().and_then(|s| s.parse().ok()).unwrap_or(60);
    // Three phases end in a SIGTERM restart; the last, twice as long, ends
    // with traffic stopping and the routers at rest.
    let phases = 4u64;
    let unit = Duration::from_secs(seconds / 5).max(Duration::from_secs(4));
    let sim = Sim::start(SimConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        workers: 48,
        actors: ACCOUNTING_ACTORS + CHAOS_ACTORS,
        restore_latency: Duration::from_millis(150),
        restore_jitter: 0.5,
        idle_suspend: Duration::from_secs(2),
        unavailable_rate: 0.03,
        aborted_rate: 0.03,
        outage_every: Duration::from_secs(13),
        outage_for: Duration::from_millis(1500),
        slow_restore_rate: 0.2,
        slow_restore: BUDGET + Duration::from_secs(1),
        ..SimConfig::default()
    })
    .unwrap();
    let timer = TimerThread::start();
    let ghosts = Arc::new(AtomicU64::new(0));
    let replicas = [Replica::new("accounting", false), Replica::new("chaos", true)];
    let mut checks: Vec<String> = Vec::new();
    let mut rss = Vec::new();
    let mut sim_before = Vec::new();
    for n in 0..phases {
        let last = n + 1 == phases;
        if last {
            // No router runs now; once the sim has answered every call of
            // the ones before, count from zero.
            eventually("the sim answered every call", || sim.unanswered() == 0);
            sim_before = SIM_CODES.iter().map(|&code| (code, sim.answered(code, accounting_actor))).collect();
        }
        let mut routers = Vec::new();
        let mut drivers = Vec::new();
        let mut before = Vec::new();
        for replica in &replicas {
            let (router, status) = start_router(sim.addr(), &replica.envoy.addr);
            *replica.addresses.lock() = Some((router.metrics, status));
            *replica.envoy.scrape.lock() = None;
            replica.stop.store(false, Ordering::Release);
            before.push(Counts::of_clients(&replica.ledger));
            let (ledger, stop, timer, extproc, chaos, ghosts) = (
                Arc::clone(&replica.ledger),
                Arc::clone(&replica.stop),
                Arc::clone(&timer),
                router.extproc,
                replica.chaos,
                Arc::clone(&ghosts),
            );
            drivers.push(std::thread::spawn(move || drive(extproc, &ledger, &stop, &timer, chaos, &ghosts)));
            routers.push((router, status));
        }
        let phase = if last { 2 * unit } else { unit };
        // Warm-up reading for the RSS invariant (last phase), once the
        // allocator has seen the load's full mix.
        std::thread::sleep(phase / 2);
        let warm: Vec<u64> = routers.iter().map(|(r, _)| rss_kib(r)).collect();
        std::thread::sleep(phase - phase / 2);
        let in_flight: Vec<u64> = replicas.iter().map(|r| r.ledger.in_flight()).collect();
        if last {
            // Traffic stops: the routers must come to rest.
            for replica in &replicas {
                replica.stop.store(true, Ordering::Release);
            }
            for driver in drivers.drain(..) {
                driver.join().unwrap();
            }
            for (i, (router, status)) in routers.iter().enumerate() {
                eventually("parking_active back to 0", || {
                    Metrics(router_get(router, router.metrics, "/metrics"))
                        .value("atenet_router_parking_active", &[])
                        == 0.0
                });
                eventually("flight table empty", || {
                    router_get(router, *status, "/statusz?format=json").contains("\"flights\":0,")
                });
                *replicas[i].envoy.scrape.lock() = Some(router_get(router, router.metrics, "/metrics"));
                rss.push((replicas[i].name, warm[i], rss_kib(router)));
            }
        }
        // SIGTERM with requests in flight (or at rest, in the last phase).
        // Traffic flows on through the drain delay, until each router tells
        // its Envoy to fail its health check.
        for (router, _) in &routers {
            signal(&router.process.child, "TERM");
        }
        for driver in drivers {
            driver.join().unwrap();
        }
        for (i, (mut router, _)) in routers.into_iter().enumerate() {
            let replica = &replicas[i];
            let code = wait_exit(&mut router.process.child, PATIENCE);
            assert_eq!(code, 0, "{}: router exit status after drain", replica.name);
            let log = router.process.log.lock().clone();
            assert!(!log.iter().any(|l| l.contains("panic")), "invariant breach: panic in the log: {log:#?}");
            let broken = replica.ledger.broken();
            assert!(broken.is_empty(), "invariant breach, {}: {broken:#?}", replica.name);
            let scrape = replica.envoy.scrape.lock().clone().unwrap_or_else(|| {
                panic!("{}: the drain never found its Envoy idle (no scrape): {log:#?}", replica.name)
            });
            let metrics = Metrics(scrape);
            let waits = metrics.value("atenet_router_parking_wait_duration_seconds_count", &[]);
            let admitted = metrics.value("atenet_router_park_decisions_total", &[("decision", "admitted")]);
            assert_eq!(
                waits, admitted,
                "invariant breach, {}: wait samples {waits} != admitted parks {admitted}",
                replica.name
            );
            let router_counts = Counts::of_router(&metrics);
            let client_counts = Counts::of_clients(&replica.ledger).minus(before[i]);
            if !replica.chaos {
                assert_eq!(
                    client_counts, router_counts,
                    "invariant breach, phase {n}: the clients' verdicts (left) differ from the router's counters (right)"
                );
            }
            checks.push(format!(
                "phase {n}, {}: {} in flight at SIGTERM; clients saw {client_counts:?}{}",
                replica.name,
                in_flight[i],
                if replica.chaos { String::new() } else { " = the router's counters".into() }
            ));
            if last && !replica.chaos {
                // At rest: every answer the simulator sent for this router's
                // actors, the router counted, code by code.
                for (code, before) in &sim_before {
                    let sent = sim.answered(*code, accounting_actor) - before;
                    let counted =
                        metrics.value("atenet_router_resume_attempts_total", &[("code", code.name())]) as u64;
                    assert_eq!(
                        counted, sent,
                        "invariant breach: {code} answers: router counted {counted}, the sim sent {sent}"
                    );
                }
                checks.push("at rest: the router's ResumeActor attempts by code = the sim's answers".into());
            }
        }
    }
    let faults = sim.faults();
    println!(
        "\n== soak report ({seconds} s, {phases} phases, {} SIGTERM restarts per router) ==",
        phases - 1
    );
    for replica in &replicas {
        let total = replica.ledger.started.load(Ordering::Acquire);
        assert_eq!(
            total,
            replica.ledger.finished.load(Ordering::Acquire),
            "every request ended exactly once"
        );
        println!("{} router, requests: {total}", replica.name);
        for (ending, n) in replica.ledger.endings.lock().iter() {
            println!("  {n:>8}  {ending:?}");
        }
    }
    println!("faults injected: {faults:?}");
    println!("invariants:");
    println!("  every request got a verdict its actor allows, or was cancelled by its own client: ok");
    println!("  no panic in any router log; every router exited 0 after its drain: ok");
    for check in &checks {
        println!("  {check}: ok");
    }
    for (name, warm, end) in rss {
        let growth = end as f64 / warm as f64;
        assert!(
            growth <= 1.10,
            "invariant breach, {name}: RSS grew from {warm} KiB after warm-up to {end} KiB"
        );
        println!(
            "  {name}: RSS after warm-up {warm} KiB, at the end {end} KiB ({:+.1}%): ok",
            (growth - 1.0) * 100.0
        );
    }
}
