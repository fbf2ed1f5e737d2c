//! Distinct-actor floods against the real binary (B58): a client sending
//! 100,000 actor ids costs bounded flights, memory and control-plane calls,
//! whether the control plane answers at once or never.
// The router's internals and the simulator: `--features testkit` (make test).
#![cfg(feature = "testkit")]

use crate::common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use atenet_router::proto::EXT_PROC_PROCESS;
use atenet_router::tools::load::request_for;
use atenet_router::tools::sim::{Answer, Sim};
use common::process::{router_args, spawn_router, terminate, RouterProcess};
use common::{http_get, verdict_within, Envoy, Metrics};
use futures::executor::block_on;
use futures::stream::{self, StreamExt};
use futures::SinkExt;
use grpcio::{CallOption, ChannelBuilder, Client, EnvBuilder, WriteFlags};
use parking_lot::Mutex;

const FLOOD: usize = 100_000;

/// The two floods each take both cores; run side by side, each would
/// measure the other.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn client(router: &RouterProcess) -> Arc<Client> {
    let env = Arc::new(EnvBuilder::new().cq_count(1).name_prefix("flood").build());
    let channel =
        ChannelBuilder::new(env).max_concurrent_stream(i32::MAX).connect(&router.extproc.to_string());
    Arc::new(Client::new(channel))
}

/// Sends a request for `actor` and resets the stream at once, as a client
/// that gives up immediately does.
async fn send_and_reset(client: &Client, actor: &str) {
    let Ok((mut tx, rx)) = client.duplex_streaming(&EXT_PROC_PROCESS, CallOption::default()) else { return };
    let _ = tx.send((request_for(actor, None), WriteFlags::default())).await;
    tx.cancel();
    drop(rx);
}

fn flights(router: &RouterProcess) -> f64 {
    Metrics(http_get(router.metrics, "/metrics").1).value("atenet_router_flights_active", &[])
}

fn rss_kib(router: &RouterProcess) -> u64 {
    std::fs::read_to_string(format!("/proc/{}/status", router.process.child.id()))
        .unwrap()
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        .unwrap()
}

/// Samples the flight gauge until stopped; returns the highest value seen.
fn watch_flights(router: &RouterProcess, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<f64> {
    let metrics = router.metrics;
    std::thread::spawn(move || {
        let mut max: f64 = 0.0;
        while !stop.load(Ordering::Acquire) {
            max =
                max.max(Metrics(http_get(metrics, "/metrics").1).value("atenet_router_flights_active", &[]));
            std::thread::sleep(Duration::from_millis(20));
        }
        max
    })
}

fn scripted_sim() -> Sim {
    let sim = common::empty_sim();
    sim.script("demo/canary", vec![Answer::ok("10.0.0.1", false)]);
    sim
}

fn quantile(sorted: &[Duration], q: f64) -> Duration {
    sorted[((sorted.len() as f64 * q).ceil() as usize).clamp(1, sorted.len()) - 1]
}

#[test]
fn b58_a_flood_of_unknown_actors_reset_at_once_keeps_flights_low_and_running_actors_routed() {
    let _alone = ONE_AT_A_TIME.lock();
    let sim = scripted_sim();
    // A reset storm leaves the router working through streams its clients
    // already reset: 16,170 at once were measured here, past the default
    // stream cap (B74) of 4,096, which would then refuse the canary. This
    // test is about flights, so the cap is out of its way.
    let router = spawn_router(&router_args(&sim.addr().to_string(), &["--extproc-max-streams", "1000000"]));
    let envoy = Envoy::connect(router.extproc);
    let canary = |n: usize| -> Vec<Duration> {
        (0..n)
            .map(|_| {
                let started = Instant::now();
                let reply = envoy.route_now("demo/canary");
                assert!(reply.has_request_headers(), "the running actor is routed: {reply:?}");
                started.elapsed()
            })
            .collect()
    };
    let mut before = canary(200);
    before.sort();

    let stop = Arc::new(AtomicBool::new(false));
    let watcher = watch_flights(&router, Arc::clone(&stop));
    let during = Arc::new(Mutex::new(Vec::new()));
    let canary_thread = {
        let (envoy, stop, during) = (envoy.clone(), Arc::clone(&stop), Arc::clone(&during));
        std::thread::spawn(move || {
            while !stop.load(Ordering::Acquire) {
                let started = Instant::now();
                let reply = envoy.route_now("demo/canary");
                assert!(
                    reply.has_request_headers(),
                    "the running actor is routed during the flood: {reply:?}"
                );
                during.lock().push(started.elapsed());
                std::thread::sleep(Duration::from_millis(5));
            }
        })
    };
    let flood = client(&router);
    let started = Instant::now();
    block_on(stream::iter(0..FLOOD).for_each_concurrent(64, |i| {
        let flood = Arc::clone(&flood);
        async move { send_and_reset(&flood, &format!("flood/actor-{i}")).await }
    }));
    let flood_time = started.elapsed();
    stop.store(true, Ordering::Release);
    canary_thread.join().unwrap();
    let max_flights = watcher.join().unwrap();

    let mut during = during.lock().clone();
    during.sort();
    common::process::eventually_within(common::PATIENCE, "every flight over", || flights(&router) == 0.0);
    let m = Metrics(http_get(router.metrics, "/metrics").1);
    let attempts = m.value("atenet_router_resume_attempts_total", &[]);
    println!(
        "{FLOOD} distinct actors sent and reset in {flood_time:?}: flights at most {max_flights} (cap 4096); \
         ResumeActor calls {} (router) / {} (sim); canary p50/p99 {:?}/{:?} before, {:?}/{:?} during ({} requests)",
        attempts,
        sim.total_calls(),
        quantile(&before, 0.5),
        quantile(&before, 0.99),
        quantile(&during, 0.5),
        quantile(&during, 0.99),
        during.len()
    );
    assert!(max_flights < 1024.0, "flights stay far below the 4096 cap: {max_flights}");
    assert!(!during.is_empty());
    assert_eq!(attempts as u64, sim.total_calls(), "every call the sim saw, the router counted");
    assert_eq!(m.value("atenet_router_flights_rejected_total", &[]), 0.0);
    assert_eq!(m.value("atenet_router_parking_active", &[]), 0.0);
    let mut router = router;
    assert_eq!(terminate(&mut router.process.child), 0);
}

#[test]
fn b58_a_flood_against_a_control_plane_that_never_answers_is_capped_and_recovers() {
    let _alone = ONE_AT_A_TIME.lock();
    const CAP: usize = 1000;
    let sim = scripted_sim();
    // One atespace may take every flight and every call here (B79 and B97
    // are not under test), and its callers wait out the whole test: their
    // own 504 (B81) comes after.
    let cap = CAP.to_string();
    let flags = [
        "--flight-max",
        &cap,
        "--flight-max-per-atespace",
        &cap,
        "--ateapi-max-calls",
        &cap,
        "--ateapi-max-calls-per-atespace",
        &cap,
        "--late-serve-limit",
        "10m",
    ];
    let router = spawn_router(&router_args(&sim.addr().to_string(), &flags));
    let envoy = Envoy::connect(router.extproc);
    assert!(envoy.route_now("demo/canary").has_request_headers());
    sim.set_unresponsive(true);

    let stop = Arc::new(AtomicBool::new(false));
    let watcher = watch_flights(&router, Arc::clone(&stop));
    let flood = client(&router);
    // The first CAP actors take every flight; their calls hang at the sim,
    // and their callers wait.
    let leaders = {
        let flood = Arc::clone(&flood);
        std::thread::spawn(move || {
            block_on(
                stream::iter(0..CAP)
                    .map(|i| {
                        let flood = Arc::clone(&flood);
                        async move {
                            verdict_within(&flood, &format!("hang/actor-{i}"), Duration::from_secs(300)).await
                        }
                    })
                    .buffer_unordered(CAP)
                    .collect::<Vec<String>>(),
            )
        })
    };
    common::process::eventually_within(common::PATIENCE, "the cap reached", || {
        flights(&router) == CAP as f64
    });
    let rss_full = rss_kib(&router);

    // Everything else is refused at once, without a call; a request for an
    // actor with a flight joins it and waits.
    let verdicts = Arc::new(Mutex::new(std::collections::BTreeMap::<String, u64>::new()));
    let refused = AtomicU64::new(0);
    let started = Instant::now();
    block_on(stream::iter(CAP..FLOOD).for_each_concurrent(256, |i| {
        let (flood, verdicts, refused) = (Arc::clone(&flood), Arc::clone(&verdicts), &refused);
        async move {
            let key = verdict_within(&flood, &format!("flood/actor-{i}"), Duration::from_secs(20)).await;
            if key == "503 atenet_flights_full" {
                refused.fetch_add(1, Ordering::Relaxed);
            }
            *verdicts.lock().entry(key).or_default() += 1;
        }
    }));
    let flood_time = started.elapsed();
    let joiner = block_on(verdict_within(&flood, "hang/actor-0", Duration::from_millis(500)));
    stop.store(true, Ordering::Release);
    let max_flights = watcher.join().unwrap();
    let rss_end = rss_kib(&router);
    println!(
        "control plane hung: {} requests refused in {flood_time:?}, verdicts {:?}; flights at most {max_flights} \
         (cap {CAP}); RSS {rss_full} KiB at the cap, {rss_end} KiB after the flood; sim calls {}",
        FLOOD - CAP,
        verdicts.lock(),
        sim.total_calls()
    );
    assert_eq!(refused.load(Ordering::Relaxed), (FLOOD - CAP) as u64, "{:?}", verdicts.lock());
    assert!(max_flights <= CAP as f64, "never above the cap: {max_flights}");
    assert_eq!(joiner, "no verdict", "a request for an actor with a flight joins it and waits: {joiner}");
    assert!(rss_end < rss_full + 32 * 1024, "memory bounded: {rss_full} KiB -> {rss_end} KiB");
    assert_eq!(sim.total_calls(), 1 + CAP as u64, "no call beyond the cap (the canary, then CAP)");
    assert_eq!(flights(&router), CAP as f64);
    let m = Metrics(http_get(router.metrics, "/metrics").1);
    assert_eq!(m.value("atenet_router_flights_rejected_total", &[]), (FLOOD - CAP) as f64);
    assert_eq!(
        m.value(
            "atenet_router_route_duration_seconds_count",
            &[("outcome", "no_capacity"), ("resume", "unknown")]
        ),
        (FLOOD - CAP) as f64
    );

    // The control plane answers again: the flights end, their callers get
    // their verdicts (these actors do not exist), routing resumes.
    assert_eq!(sim.set_unresponsive(false), CAP);
    let answered = leaders.join().unwrap();
    assert!(answered.iter().all(|v| v == "404 atenet_not_found"), "{:?}", &answered[..5]);
    common::process::eventually_within(common::PATIENCE, "the flights answered", || flights(&router) == 0.0);
    assert!(envoy.route_now("demo/canary").has_request_headers(), "routing resumes with no restart");
    let mut router = router;
    assert_eq!(terminate(&mut router.process.child), 0);
}
