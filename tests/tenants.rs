//! Tenants against each other, through the real binary (B78-B80, B97): a tenant
//! that floods the router with requests for its own actors, while the pool
//! is saturated or its first answers are slow, cannot make the router
//! refuse another tenant's running actors. The truth is what the clients
//! were answered and what the simulated control plane was asked.
// The router's internals and the simulator: `--features testkit` (make test).
#![cfg(feature = "testkit")]

use crate::common;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use atenet_router::actor::resume::Code;
use atenet_router::tools::sim::Answer;
use common::process::{eventually_within, router_args, spawn_router, RouterProcess};
use common::{empty_sim, http_get, verdict_within, Metrics, PATIENCE};
use futures::channel::mpsc;
use futures::StreamExt;
use grpcio::{ChannelBuilder, Client, EnvBuilder};

fn client(router: &RouterProcess) -> Arc<Client> {
    let env = Arc::new(EnvBuilder::new().cq_count(1).name_prefix("tenant").build());
    let channel =
        ChannelBuilder::new(env).max_concurrent_stream(i32::MAX).connect(&router.extproc.to_string());
    Arc::new(Client::new(channel))
}

/// A request's verdict key (common's, with the tests' patience).
async fn verdict(client: &Client, actor: &str) -> String {
    verdict_within(client, actor, PATIENCE).await
}

/// Sends a request for each actor, `per_second` of them a second, each on
/// its own stream held until its verdict; the verdicts arrive on the
/// returned channel as `(actor, key)`.
fn open_loop(
    client: &Arc<Client>,
    actors: Vec<String>,
    per_second: u32,
) -> mpsc::UnboundedReceiver<(String, String)> {
    let (tx, rx) = mpsc::unbounded();
    let client = Arc::clone(client);
    std::thread::spawn(move || {
        let started = Instant::now();
        for (i, actor) in actors.into_iter().enumerate() {
            let due = started + Duration::from_secs_f64(i as f64 / f64::from(per_second));
            std::thread::sleep(due.saturating_duration_since(Instant::now()));
            let (client2, tx) = (Arc::clone(&client), tx.clone());
            client.spawn(async move {
                let key = verdict(&client2, &actor).await;
                let _ = tx.unbounded_send((actor, key));
            });
        }
    });
    rx
}

/// Sends a request for each actor from `concurrency` senders, each sending
/// its next when the last has its verdict: never more than `concurrency`
/// in flight, however slow the router. The verdicts arrive as
/// [`open_loop`]'s.
fn closed_loop(
    client: &Arc<Client>,
    actors: Vec<String>,
    concurrency: usize,
) -> mpsc::UnboundedReceiver<(String, String)> {
    let (tx, rx) = mpsc::unbounded();
    for sender in 0..concurrency {
        let mine: Vec<String> = actors.iter().skip(sender).step_by(concurrency).cloned().collect();
        let (client2, tx) = (Arc::clone(client), tx.clone());
        client.spawn(async move {
            for actor in mine {
                let key = verdict(&client2, &actor).await;
                let _ = tx.unbounded_send((actor, key));
            }
        });
    }
    rx
}

fn metrics(router: &RouterProcess) -> Metrics {
    Metrics(http_get(router.metrics, "/metrics").1)
}

/// The attack: lot 64, 256 flights, 8 lot slots an atespace, and a
/// tenant sending 200 requests a second for actors of its own that no
/// worker is free for. Before B78-B79 the flight table filled with flights
/// nobody waited for, which kept calling ateapi until their budgets ended,
/// and another tenant's requests for running actors got
/// `503 atenet_flights_full`.
#[test]
fn b78_b79_a_greedy_tenant_leaves_no_flights_behind_and_others_are_routed() {
    let sim = empty_sim();
    const GREEDY: usize = 1200;
    let greedy: Vec<String> = (0..GREEDY).map(|i| format!("greedy/g{i}")).collect();
    sim.script_all(
        greedy
            .iter()
            .map(|a| (a.clone(), Answer::error(Code::ResourceExhausted, "no free workers available")))
            .collect(),
    );
    let polite: Vec<String> = (0..20).map(|i| format!("polite/p{i}")).collect();
    sim.script_all(polite.iter().map(|a| (a.clone(), Answer::ok("10.0.0.1", false))).collect());
    let router = spawn_router(&router_args(
        &sim.addr().to_string(),
        &["--parked-request-max", "64", "--flight-max", "256", "--parked-request-max-per-atespace", "8"],
    ));
    let client = client(&router);

    let mut greedy_verdicts = open_loop(&client, greedy.clone(), 200);
    // Meanwhile, the other tenant asks for its running actors, one at a time.
    let sending = Duration::from_secs_f64(GREEDY as f64 / 200.0);
    let mut polite_verdicts: HashMap<String, usize> = HashMap::new();
    let until = Instant::now() + sending;
    let mut i = 0;
    while Instant::now() < until {
        let key = futures::executor::block_on(verdict(&client, &polite[i % polite.len()]));
        *polite_verdicts.entry(key).or_default() += 1;
        i += 1;
    }
    let mut by_actor = HashMap::new();
    futures::executor::block_on(async {
        while by_actor.len() < GREEDY {
            let (actor, key) = greedy_verdicts.next().await.expect("every greedy request gets a verdict");
            by_actor.insert(actor, key);
        }
    });

    assert!(i >= 50, "the other tenant sent {i} requests");
    assert_eq!(
        polite_verdicts.get("200 routed"),
        Some(&i),
        "every running actor routed: {polite_verdicts:?}"
    );

    let mut greedy_keys: HashMap<&str, usize> = HashMap::new();
    for key in by_actor.values() {
        *greedy_keys.entry(key.as_str()).or_default() += 1;
    }
    // A caller refused at its park transition is its actor's only caller:
    // its flight ends there, so the control plane was asked once, and never
    // again (before B78, every one was asked about every 100 ms until its
    // 5 s budget ended).
    let refused_at_park = ["503 atenet_lot_full", "503 atenet_atespace_full"];
    let mut shed = 0;
    for (actor, key) in &by_actor {
        if refused_at_park.contains(&key.as_str()) {
            shed += 1;
            assert_eq!(sim.calls(actor), 1, "{actor} ({key}) was asked again after its only caller left");
        }
    }
    assert!(shed > GREEDY / 2, "most greedy requests were shed at the park transition: {greedy_keys:?}");
    // Nothing is left calling once every greedy request has its answer.
    eventually_within(PATIENCE, "every flight ended", || {
        metrics(&router).value("atenet_router_flights_active", &[]) == 0.0
    });
    let calls = sim.total_calls();
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(sim.total_calls(), calls, "no ResumeActor call after the last caller left");
    assert_eq!(
        metrics(&router).value("atenet_router_flights_abandoned_total", &[]),
        shed as f64,
        "each shed caller's flight was abandoned"
    );
}

/// One tenant floods with requests whose first answers take long (the
/// simulator holds every call), then a second tenant arrives while the
/// flood goes on. The flood alone takes all but an eighth of the whole
/// (`flags` make it 64): 56 held, before the work-conserving default 32
/// (half, the other half unused). The 14 beyond, and every request it sends
/// after, are refused at once with the router's own reason, before any
/// ResumeActor call; the second tenant's requests for its running actors
/// find the eighth the flood cannot take, and every one is routed.
fn a_flood_alone_takes_all_but_an_eighth_and_another_tenant_is_served(flags: &[&str], share: &str) {
    let sim = empty_sim();
    let greedy: Vec<String> = (0..70).map(|i| format!("greedy/slow{i}")).collect();
    let more: Vec<String> = (0..100).map(|i| format!("greedy/more{i}")).collect();
    sim.script_all(
        greedy.iter().chain(&more).map(|a| (a.clone(), Answer::ok("10.0.0.2", true).held())).collect(),
    );
    let polite: Vec<String> = (0..200).map(|i| format!("polite/running{i}")).collect();
    sim.script_all(polite.iter().map(|a| (a.clone(), Answer::ok("10.0.0.1", false))).collect());
    let router = spawn_router(&router_args(&sim.addr().to_string(), flags));
    let client = client(&router);
    let mut verdicts = open_loop(&client, greedy.clone(), 1000);
    // The 14 beyond 56 are answered while the 56 are still held.
    let mut refused = Vec::new();
    futures::executor::block_on(async {
        while refused.len() < 14 {
            let (actor, key) = verdicts.next().await.expect("a verdict");
            assert_eq!(
                key, "503 atenet_atespace_full",
                "{actor}: only the excess is answered before the release"
            );
            refused.push(actor);
        }
    });
    eventually_within(PATIENCE, "56 slow first attempts", || sim.total_calls() >= 56);
    assert_eq!(sim.total_calls(), 56, "7/8 of the whole for the tenant alone");
    for actor in &refused {
        assert_eq!(sim.calls(actor), 0, "{actor} was refused before any flight");
    }
    // The flood goes on, 200 requests a second, while the other tenant
    // arrives with 8 requests at a time: the eighth left.
    let mut flood = open_loop(&client, more.clone(), 200);
    let mut served = closed_loop(&client, polite.clone(), 8);
    let (mut flood_keys, mut polite_keys) = (HashMap::new(), HashMap::new());
    futures::executor::block_on(async {
        for _ in 0..polite.len() {
            let (_, key) = served.next().await.expect("a verdict");
            *polite_keys.entry(key).or_insert(0) += 1;
        }
        for _ in 0..more.len() {
            let (_, key) = flood.next().await.expect("a verdict");
            *flood_keys.entry(key).or_insert(0) += 1;
        }
    });
    assert_eq!(polite_keys, HashMap::from([("200 routed".to_string(), 200)]), "every running actor routed");
    assert!(polite.iter().all(|a| sim.calls(a) == 1), "each of them asked the control plane once");
    assert_eq!(
        flood_keys,
        HashMap::from([("503 atenet_atespace_full".to_string(), 100)]),
        "the eighth stays free"
    );
    assert!(more.iter().all(|a| sim.calls(a) == 0), "no call for a refused request");
    assert_eq!(metrics(&router).value("atenet_router_atespace_refused_total", &[("share", share)]), 114.0);
    for actor in &greedy {
        sim.release(actor);
    }
    let mut routed = 0;
    futures::executor::block_on(async {
        while routed < 56 {
            let (_, key) = verdicts.next().await.expect("a verdict");
            assert_eq!(key, "200 routed");
            routed += 1;
        }
    });
    let greedy_calls: u64 = greedy.iter().map(|a| sim.calls(a)).sum();
    assert_eq!(greedy_calls, 56, "one attempt for each caller within the share, none for the rest");
}

/// The second finding: first answers that take long. Before B80 one
/// tenant's requests held every stream Envoy's breaker lets through while
/// the lot stayed empty; then its share, half, held it to 32 of a 64
/// breaker even with nobody else there. Now it holds 56, and the 8 left
/// serve the other tenant.
#[test]
fn b80_callers_on_slow_first_attempts_leave_an_eighth_of_the_breaker_to_the_others() {
    a_flood_alone_takes_all_but_an_eighth_and_another_tenant_is_served(
        &["--parked-request-max", "32", "--extproc-max-requests", "64"],
        "requests",
    );
}

/// The same through the flight table (B79): 64 flights, one per actor.
#[test]
fn b79_flights_of_slow_first_attempts_leave_an_eighth_of_the_table_to_the_others() {
    a_flood_alone_takes_all_but_an_eighth_and_another_tenant_is_served(&["--flight-max", "64"], "flights");
}

/// A tenant whose resumes hang (B97): with at most 8 ResumeActor calls open
/// and so 4 for one atespace, 40 requests for its actors, whose calls the
/// control plane holds, open 4 calls and the other 36 attempts wait unsent;
/// another tenant's suspended actors are resumed meanwhile. Without the
/// bound the simulator held 40 calls; without the share, all 8.
#[test]
fn b97_a_tenant_whose_resumes_hang_holds_its_share_of_the_calls_and_others_resume() {
    let sim = empty_sim();
    let greedy: Vec<String> = (0..40).map(|i| format!("greedy/hang{i}")).collect();
    sim.script_all(greedy.iter().map(|a| (a.clone(), Answer::ok("10.0.0.2", true).held())).collect());
    let polite: Vec<String> = (0..10).map(|i| format!("polite/asleep{i}")).collect();
    sim.script_all(polite.iter().map(|a| (a.clone(), Answer::ok("10.0.0.1", true))).collect());
    let router = spawn_router(&router_args(
        &sim.addr().to_string(),
        &["--ateapi-max-calls", "8", "--parked-request-budget", "60s"],
    ));
    let client = client(&router);
    let mut verdicts = open_loop(&client, greedy.clone(), 1000);
    eventually_within(PATIENCE, "the greedy tenant's share of calls", || sim.total_calls() >= 4);
    eventually_within(PATIENCE, "36 attempts waiting", || {
        metrics(&router).value("atenet_router_resume_attempts_waiting", &[]) == 36.0
    });
    for actor in &polite {
        let key = futures::executor::block_on(verdict(&client, actor));
        assert_eq!(key, "200 routed", "{actor}: another tenant resumes while the greedy one hangs");
        assert_eq!(sim.calls(actor), 1);
    }
    let greedy_calls: u64 = greedy.iter().map(|a| sim.calls(a)).sum();
    assert_eq!(greedy_calls, 4, "the hanging tenant holds its share, 4 of 8 calls");
    assert_eq!(sim.unanswered(), 4);
    // The control plane answers again: every waiting attempt is sent in
    // turn, once, and every request is routed.
    let mut routed = 0;
    let mut most_held = 0;
    futures::executor::block_on(async {
        while routed < greedy.len() {
            most_held = most_held.max(sim.unanswered());
            for actor in &greedy {
                sim.release(actor);
            }
            if let Ok((actor, key)) = verdicts.try_recv() {
                assert_eq!(key, "200 routed", "{actor}");
                routed += 1;
            } else {
                std::thread::sleep(Duration::from_millis(5));
            }
        }
    });
    assert!(most_held <= 4, "at most the share held at once: {most_held}");
    assert!(greedy.iter().all(|a| sim.calls(a) == 1), "each waiting attempt sent once");
}
