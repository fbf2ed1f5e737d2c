//! A bounded chaos run (issue "Reliability"): the real router binary, the
//! simulated control plane with every fault on, clients that cancel
//! mid-park, and SIGTERM restarts of the router with requests in flight.
//! Invariants are checked after every phase and at the end; any breach
//! fails the run. `SOAK_SECONDS` sets the length (60 s in `make test`, 600 s
//! in `make soak`).

use std::collections::BTreeMap;
mod common;

use std::net::SocketAddr;
use std::process::Child;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use atenet_router::load::{request_for, verdict_key};
use atenet_router::proto::EXT_PROC_PROCESS;
use atenet_router::sim::{Sim, SimConfig};
use atenet_router::timer::{sleep_until, Scheduler, TimerThread};
use common::process::{router_args, signal, spawn_router, wait_exit, RouterProcess};
use common::{http_get, Metrics};
use futures::future::{select, Either};
use futures::{SinkExt, StreamExt};
use grpcio::{CallOption, ChannelBuilder, Client, EnvBuilder, WriteFlags};
use parking_lot::Mutex;

const BUDGET: Duration = Duration::from_secs(2);
const CONCURRENCY: usize = 160;
const PATIENCE: Duration = Duration::from_secs(60);

/// How one request ended, from its client's side.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Ending {
    Verdict(String),
    /// The client cancelled it (mid-park, on purpose).
    OwnCancel,
    /// The stream failed without a verdict: an invariant breach.
    Broken(String),
}

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
}

fn start_router(sim: SocketAddr) -> (RouterProcess, SocketAddr) {
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
            "120",
            "--parked-request-retry-interval",
            "50ms",
            "--late-serve-limit",
            "10s",
            "--drain-timeout",
            "20s",
            // As in production, the router keeps accepting streams for a
            // moment after SIGTERM, while its clients stop sending.
            "--drain-delay",
            "1s",
        ],
    );
    (spawn_router(&args), format!("127.0.0.1:{status_port}").parse().unwrap())
}

fn metric(router: &RouterProcess, name: &str, labels: &[(&str, &str)]) -> f64 {
    Metrics(http_get(router.metrics, "/metrics").1).value(name, labels)
}

fn rss_kib(child: &Child) -> u64 {
    std::fs::read_to_string(format!("/proc/{}/status", child.id()))
        .unwrap()
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        .unwrap()
}

fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + PATIENCE;
    while !check() {
        assert!(Instant::now() < deadline, "invariant breach: {what} did not hold within {PATIENCE:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// One Envoy-like request; a share of them cancel after a random delay.
async fn one_request(
    client: Arc<Client>,
    timer: Arc<dyn Scheduler>,
    actor: String,
    cancel_after: Option<Duration>,
) -> Ending {
    let (mut tx, mut rx) = match client.duplex_streaming(&EXT_PROC_PROCESS, CallOption::default()) {
        Ok(call) => call,
        Err(e) => return Ending::Broken(format!("open: {e}")),
    };
    if let Err(e) = tx.send((request_for(&actor), WriteFlags::default())).await {
        return Ending::Broken(format!("send: {e}"));
    }
    let verdict = async {
        loop {
            match rx.next().await {
                Some(Ok(reply)) if reply.response.is_none() => continue,
                Some(Ok(reply)) => return Ending::Verdict(verdict_key(&reply)),
                Some(Err(e)) => return Ending::Broken(format!("{e}")),
                None => return Ending::Broken("stream ended without a verdict".into()),
            }
        }
    };
    let ending = match cancel_after {
        None => verdict.await,
        Some(after) => {
            let sleep = sleep_until(timer, Instant::now() + after);
            match select(Box::pin(verdict), sleep).await {
                Either::Left((ending, _)) => ending,
                Either::Right(((), _)) => Ending::OwnCancel,
            }
        }
    };
    tx.cancel();
    ending
}

/// Runs load against `router` until `stop` is set; returns when every
/// request it started has ended.
fn drive(extproc: SocketAddr, ledger: &Arc<Ledger>, stop: &Arc<AtomicBool>, timer: &Arc<TimerThread>) {
    let env = Arc::new(EnvBuilder::new().cq_count(1).name_prefix("soak-client").build());
    let client = Arc::new(Client::new(ChannelBuilder::new(env).connect(&extproc.to_string())));
    let (done_tx, done_rx) = crossbeam_channel::unbounded::<()>();
    for _ in 0..CONCURRENCY {
        let (client, ledger, stop, timer, done) =
            (Arc::clone(&client), Arc::clone(ledger), Arc::clone(stop), timer.clone(), done_tx.clone());
        client.clone().spawn(async move {
            while !stop.load(Ordering::Acquire) {
                // Mostly 200 actors with a hot head; 5% unknown (NotFound).
                let actor = if fastrand::u8(..100) < 5 {
                    format!("demo/ghost-{}", fastrand::u8(..10))
                } else {
                    format!("demo/actor-{}", (fastrand::f64().powi(2) * 200.0) as usize)
                };
                let cancel = (fastrand::u8(..100) < 10).then(|| Duration::from_millis(fastrand::u64(..1500)));
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
    let _ = done_rx.recv();
    while done_rx.recv().is_ok() {}
}

#[test]
fn soak() {
    let seconds: u64 = std::env::var("SOAK_SECONDS").ok().and_then(|s| s.parse().ok()).unwrap_or(60);
    // Three phases end in a SIGTERM restart; the last, twice as long, ends
    // with traffic stopping and the router at rest.
    let phases = 4u64;
    let unit = Duration::from_secs(seconds / 5).max(Duration::from_secs(4));
    let sim = Sim::start(SimConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        workers: 48,
        actors: 200,
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
    let ledger = Arc::new(Ledger::default());
    let mut checks: Vec<String> = Vec::new();
    let mut restarts = 0;
    let mut rss = (0, 0);
    for n in 0..phases {
        let last = n + 1 == phases;
        let (router, status) = start_router(sim.addr());
        let stop = Arc::new(AtomicBool::new(false));
        let driver = {
            let (ledger, stop, timer, extproc) =
                (Arc::clone(&ledger), Arc::clone(&stop), Arc::clone(&timer), router.extproc);
            std::thread::spawn(move || drive(extproc, &ledger, &stop, &timer))
        };
        let phase = if last { 2 * unit } else { unit };
        // Warm-up reading for the RSS invariant (last phase), once the
        // allocator has seen the load's full mix.
        std::thread::sleep(phase / 2);
        let warm_rss = rss_kib(&router.process.child);
        std::thread::sleep(phase - phase / 2);
        if last {
            // Traffic stops: the router must return to rest.
            stop.store(true, Ordering::Release);
            driver.join().unwrap();
            eventually("parking_active back to 0", || {
                metric(&router, "atenet_router_parking_active", &[]) == 0.0
            });
            eventually("flight table empty", || {
                http_get(status, "/statusz?format=json").1.contains("\"flights\":0,")
            });
            let waits = metric(&router, "atenet_router_parking_wait_duration_seconds_count", &[]);
            let admitted = metric(&router, "atenet_router_park_decisions_total", &[("decision", "admitted")]);
            assert_eq!(
                waits, admitted,
                "invariant breach: wait samples {waits} != admitted parks {admitted}"
            );
            let decisions = metric(&router, "atenet_router_park_decisions_total", &[]);
            let routes = metric(&router, "atenet_router_route_duration_seconds_count", &[]);
            let invalid = metric(&router, "atenet_router_invalid_target_total", &[]);
            assert_eq!(
                decisions,
                routes - invalid,
                "invariant breach: fast + admitted + shed + left = {decisions}, requests that reached the lot = {}",
                routes - invalid
            );
            rss = (warm_rss, rss_kib(&router.process.child));
            checks.push(format!(
                "phase {n}: at rest after traffic stopped (parked 0, flights 0); wait samples = admitted = {waits}; \
                 decisions = {decisions} = requests - invalid"
            ));
        } else {
            // SIGTERM with requests in flight. Like Envoy once the router
            // fails its health check, clients stop starting requests (within
            // the drain delay); every in-flight one must get its verdict.
            let in_flight = ledger.in_flight();
            stop.store(true, Ordering::Release);
            signal(&router.process.child, "TERM");
            driver.join().unwrap();
            restarts += 1;
            checks.push(format!("phase {n}: SIGTERM with {in_flight} requests in flight; all ended"));
        }
        let mut router = router;
        if last {
            signal(&router.process.child, "TERM");
        }
        let code = wait_exit(&mut router.process.child, PATIENCE);
        assert_eq!(code, 0, "router exit status after drain");
        let log = router.process.log.lock().clone();
        assert!(!log.iter().any(|l| l.contains("panicked")), "invariant breach: panic in the log: {log:#?}");
        let broken: u64 = ledger
            .endings
            .lock()
            .iter()
            .filter(|(e, _)| matches!(e, Ending::Broken(_)))
            .map(|(_, n)| n)
            .sum();
        assert_eq!(broken, 0, "invariant breach: requests without a verdict: {:?}", ledger.endings.lock());
    }
    let (warm, end) = rss;
    let growth = end as f64 / warm as f64;
    assert!(growth <= 1.10, "invariant breach: RSS grew from {warm} KiB after warm-up to {end} KiB");
    let total = ledger.started.load(Ordering::Acquire);
    assert_eq!(total, ledger.finished.load(Ordering::Acquire), "every request ended exactly once");
    let faults = sim.faults();
    println!("\n== soak report ({seconds} s, {phases} phases, {restarts} SIGTERM restarts) ==");
    println!("requests: {total}");
    for (ending, n) in ledger.endings.lock().iter() {
        println!("  {n:>8}  {ending:?}");
    }
    println!("faults injected: {faults:?}");
    println!("invariants:");
    println!("  every request got exactly one verdict or was cancelled by its own client: ok");
    println!("  no panic in any router log; every router exited 0 after its drain: ok");
    for check in &checks {
        println!("  {check}: ok");
    }
    println!("  RSS after warm-up {warm} KiB, at the end {end} KiB ({:+.1}%): ok", (growth - 1.0) * 100.0);
}
