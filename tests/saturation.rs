//! A saturated worker pool through the real router, the simulator's pool
//! as truth (B109-B112, B129, B130): freed workers go to the oldest
//! flights, the pool is asked once at a time, not once per waiting flight,
//! a slow restore does not hold the queue, and the control plane's group
//! comes back with the control plane.

#![cfg(feature = "testkit")]

use crate::common;

use std::time::{Duration, Instant};

use atenet_router::actor::resume::Code;
use atenet_router::tools::sim::{Answer, Sim, SimConfig};
use common::*;
use futures::executor::block_on;
use futures::future::join_all;

/// A pool of `actors` suspended actors and no free worker: every resume is
/// `RESOURCE_EXHAUSTED` until the test adds workers.
fn saturated_sim(actors: usize) -> Sim {
    saturated_sim_restoring_in(actors, Duration::from_millis(10))
}

/// [`saturated_sim`] whose resumes each take exactly `restore`.
fn saturated_sim_restoring_in(actors: usize, restore: Duration) -> Sim {
    Sim::start(SimConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        actors,
        workers: 0,
        restore_latency: restore,
        restore_jitter: 0.0,
        idle_suspend: Duration::from_secs(3600),
        ..SimConfig::default()
    })
    .expect("sim starts")
}

fn actor(i: usize) -> String {
    format!("demo/actor-{i}")
}

/// Whether `actor`'s flight has been answered `RESOURCE_EXHAUSTED` (parked).
fn parked(stack: &Stack, actor: &str) -> bool {
    stack
        .router()
        .resolver()
        .flights()
        .snapshot()
        .iter()
        .any(|f| f.actor.as_str() == actor && f.last_code == Some(Code::ResourceExhausted))
}

fn served(stack: &Stack) -> u64 {
    stack.sim.answered(Code::Ok, |_| true)
}

fn serve_order(flags: &[&str]) -> Vec<usize> {
    const FLIGHTS: usize = 20;
    let mut args = vec!["--parked-request-budget", "60s"];
    args.extend_from_slice(flags);
    let stack = Stack::start_on(saturated_sim(FLIGHTS), &args, "0");
    // Twenty requests for distinct actors, each arriving 150 ms after the
    // one before has parked.
    let mut requests = Vec::new();
    for i in 0..FLIGHTS {
        let envoy = stack.envoy.clone();
        let target = actor(i);
        requests.push(std::thread::spawn(move || block_on(envoy.route(&target))));
        stack.eventually(&format!("{} parked", actor(i)), |s| parked(s, &actor(i)));
        std::thread::sleep(Duration::from_millis(150));
    }
    // One worker freed every 400 ms, each taken before the next frees.
    for n in 1..=FLIGHTS as u64 {
        let freed = Instant::now();
        stack.sim.add_worker();
        stack.eventually(&format!("worker {n} taken"), |s| served(s) >= n);
        std::thread::sleep(Duration::from_millis(400).saturating_sub(freed.elapsed()));
    }
    for request in requests {
        assert!(!routed(&request.join().unwrap()).1.is_empty(), "every request is served");
    }
    let mut order: Vec<(Instant, usize)> =
        (0..FLIGHTS).map(|i| (stack.sim.first_answered(&actor(i), Code::Ok).expect("served"), i)).collect();
    order.sort();
    order.into_iter().map(|(_, i)| i).collect()
}

#[test]
fn b111_freed_workers_go_to_the_oldest_flights() {
    let order = serve_order(&[]);
    let oldest_first = order[..5].iter().filter(|&&i| i < 5).count();
    assert!(oldest_first >= 4, "the first five workers went to arrivals {:?}", &order[..5]);
}

#[test]
fn b110_a_saturated_pool_is_asked_once_at_a_time() {
    const FLIGHTS: usize = 300;
    let stack = Stack::start_on(saturated_sim(FLIGHTS), &["--parked-request-budget", "60s"], "0");
    let envoy = stack.envoy.clone();
    let requests = std::thread::spawn(move || {
        block_on(join_all((0..FLIGHTS).map(|i| {
            let envoy = envoy.clone();
            async move { envoy.route(&actor(i)).await }
        })))
    });
    stack.eventually("every flight parked", |s| {
        let flights = s.router().resolver().flights().snapshot();
        flights.len() == FLIGHTS && flights.iter().all(|f| f.last_code == Some(Code::ResourceExhausted))
    });
    // The calls over three seconds of saturation: one group's probe at a
    // time, where 300 flights on their own backoff make some 540 a second.
    let (start, calls_before) = (Instant::now(), stack.sim.total_calls());
    std::thread::sleep(Duration::from_secs(3));
    let rate = (stack.sim.total_calls() - calls_before) as f64 / start.elapsed().as_secs_f64();
    assert!(rate <= 30.0, "{rate:.1} ResumeActor calls a second on a saturated pool");
    let m = stack.metrics();
    assert_eq!(m.value("atenet_router_saturation_groups", &[]), 1.0, "one pool, one group");
    let waiting = m.value("atenet_router_saturation_group_flights", &[]);
    // All but the probe's flight wait in it, and a few more while refusals
    // slow enough to be presumed resumes (B129) are under way: each doubles
    // the patience for the next, so a busy machine makes at most a few.
    assert!(waiting >= (FLIGHTS - 6) as f64, "all but the attempts open wait in it: {waiting}");
    // Freed workers are still taken within a few retry intervals (the
    // group's delay stops at four).
    let freed = Instant::now();
    for _ in 0..3 {
        stack.sim.add_worker();
    }
    stack.eventually("three freed workers taken", |s| served(s) >= 3);
    let taken = freed.elapsed();
    assert!(taken < Duration::from_secs(2), "three freed workers taken after {taken:?}");
    for _ in 3..FLIGHTS {
        stack.sim.add_worker();
    }
    let replies = requests.join().unwrap();
    assert!(replies.iter().all(|r| !routed(r).1.is_empty()), "every request is served");
}

#[test]
fn b129_a_slow_restore_does_not_hold_its_group() {
    const FLIGHTS: usize = 6;
    const FREED: u64 = 2;
    // Restores of 3 s and a 1 s retry interval: B110 alone waits 4 s for a
    // probe, so it would send the next flight only on this one's success,
    // one restore at a time. The pool refuses in a millisecond or two, so
    // B129's patience is at its floor (250 ms); it stays under the 3 s of
    // a restore unless a refusal took 750 ms.
    let sim = saturated_sim_restoring_in(FLIGHTS, Duration::from_secs(3));
    let args = ["--parked-request-budget", "60s", "--parked-request-retry-interval", "1s"];
    let stack = Stack::start_on(sim, &args, "0");
    let envoy = stack.envoy.clone();
    let requests = std::thread::spawn(move || {
        block_on(join_all((0..FLIGHTS).map(|i| {
            let envoy = envoy.clone();
            async move { envoy.route(&actor(i)).await }
        })))
    });
    stack.eventually("every flight parked", |s| (0..FLIGHTS).all(|i| parked(s, &actor(i))));
    for _ in 0..FREED {
        stack.sim.add_worker();
    }
    // The truth is the simulator's: resumes it has taken a worker for and
    // not answered yet. Both freed workers are restoring at once, before the
    // first restore ends (some 250 ms after the first probe, against 3 s).
    stack.eventually("every freed worker restoring", |s| s.sim.unanswered() >= FREED);
    assert_eq!(served(&stack), 0, "all {FREED} restores began before the first ended");
    for _ in FREED as usize..FLIGHTS {
        stack.sim.add_worker();
    }
    let replies = requests.join().unwrap();
    assert!(replies.iter().all(|r| !routed(r).1.is_empty()), "every request is served");
}

#[test]
fn b130_the_control_planes_group_comes_back_with_the_control_plane() {
    // A pool with a free worker, and an actor the control plane answers
    // UNAVAILABLE twice: its flight waits in the control plane's group,
    // whose delay (1 s, then times 4, no jitter) is at its cap, 4 s.
    let sim = Sim::start(SimConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        actors: 1,
        workers: 1,
        restore_latency: Duration::from_millis(10),
        ..SimConfig::default()
    })
    .expect("sim starts");
    let down = Answer::error(Code::Unavailable, "control plane restarting");
    sim.script("other/a", vec![down.clone(), down, Answer::ok("10.0.0.7", true)]);
    let args = [
        "--parked-request-budget",
        "60s",
        "--parked-request-retry-interval",
        "1s",
        "--parked-request-retry-factor",
        "4",
        "--parked-request-retry-jitter",
        "0",
    ];
    let stack = Stack::start_on(sim, &args, "0");
    let envoy = stack.envoy.clone();
    let waiting = std::thread::spawn(move || block_on(envoy.route("other/a")));
    // Its second UNAVAILABLE, 1 s in: the next probe is due 4 s later.
    assert!(stack.sim.wait_for_calls("other/a", 2, PATIENCE), "two calls for other/a");
    let second_call = Instant::now();
    // Another request's answer shows the control plane up: the group's
    // next flight goes one interval later, not four.
    assert!(!routed(&block_on(stack.envoy.route(&actor(0)))).1.is_empty(), "{} served", actor(0));
    let up = stack.sim.first_answered(&actor(0), Code::Ok).expect("answered");
    assert!(!routed(&waiting.join().unwrap()).1.is_empty(), "other/a served");
    let served = stack.sim.first_answered("other/a", Code::Ok).expect("answered");
    // Without B130 it is served 4 s after its second call at the earliest.
    let after = served.saturating_duration_since(second_call);
    let since_up = served.saturating_duration_since(up);
    assert!(
        after < Duration::from_secs(3),
        "other/a served {after:?} after its second call ({since_up:?} after ateapi answered)"
    );
}
