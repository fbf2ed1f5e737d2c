//! Graceful drain (B41, B43-B45, B85): in-process against a fake Envoy
//! admin, and with real signals to the real binary.
// The router's internals and the simulator: `--features testkit` (make test).
#![cfg(feature = "testkit")]

use crate::common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use atenet_router::actor::resume::Code;
use atenet_router::lifecycle::drain::{drain, DrainPlan, EnvoyDrain};
use atenet_router::tools::sim::{Answer, Sim};
use common::admin::FakeAdmin;
use common::process::{eventually_within, router_args, signal, spawn_router, wait_exit};
use common::*;
use futures::executor::block_on;
use parking_lot::Mutex;

fn plan(admin: Option<String>, timeout: Duration, marker: Option<std::path::PathBuf>) -> DrainPlan {
    DrainPlan {
        delay: Duration::ZERO,
        envoy_admin: admin,
        fleet: false,
        envoy_window: Duration::from_secs(15),
        poll_every: Duration::from_millis(20),
        timeout,
        marker,
    }
}

fn temp_marker(name: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("atenet-drain-{}-{name}/run/drain-complete", std::process::id()))
}

#[test]
fn b43_envoy_admin_sees_two_posts_in_order_then_polls_until_zero() {
    let mut stack = Stack::start(&[]);
    let admin = FakeAdmin::start(vec![2, 1, 0]);
    let marker = temp_marker("admin");
    let router = stack.router.take().unwrap();
    let metrics = router.metrics_addr();
    assert_eq!(http_get(metrics, "/readyz").0, 200);
    let report = drain(
        router,
        &plan(Some(admin.addr.clone()), Duration::from_secs(5), Some(marker.clone())),
        &crossbeam_channel::never::<()>(),
    );
    assert_eq!(report.envoy, EnvoyDrain::Drained);
    assert!(report.streams_finished);
    let log = admin.log.lock().clone();
    assert_eq!(log[0], "POST /healthcheck/fail");
    assert_eq!(log[1], "POST /drain_listeners");
    let polls = log[2..].iter().filter(|l| *l == "GET /stats?filter=downstream_cx_active").count();
    assert!(polls >= 3, "polled until 0: {log:?}");
    let text = std::fs::read_to_string(&marker).unwrap();
    assert!(text.starts_with("20") && text.ends_with("Z\n"), "RFC 3339 UTC and a newline: {text:?}");
    std::fs::remove_dir_all(marker.parent().unwrap().parent().unwrap()).unwrap();
}

/// B43: Envoy's health check fails at the signal, so a load balancer
/// polling Envoy's `/ready` gets the whole drain delay; its listeners close
/// only after it.
#[test]
fn b43_envoy_health_fails_at_the_signal_and_listeners_close_after_the_delay() {
    let mut stack = Stack::start(&[]);
    let admin = FakeAdmin::start(vec![0]);
    let router = stack.router.take().unwrap();
    let mut plan = plan(Some(admin.addr.clone()), Duration::from_secs(5), None);
    plan.delay = Duration::from_secs(3600);
    let (interrupt, interrupted) = crossbeam_channel::bounded(1);
    let draining = std::thread::spawn(move || drain(router, &plan, &interrupted));
    eventually_within(PATIENCE, "Envoy's health failed during the delay", || !admin.log.lock().is_empty());
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(
        admin.log.lock().clone(),
        ["POST /healthcheck/fail"],
        "the listeners stay open through the delay"
    );
    interrupt.send(()).unwrap();
    assert_eq!(draining.join().unwrap().envoy, EnvoyDrain::Skipped, "a second signal skips the rest");
}

#[test]
fn b43_envoy_window_elapses_with_connections_still_active() {
    let mut stack = Stack::start(&[]);
    let admin = FakeAdmin::start(vec![3]);
    let router = stack.router.take().unwrap();
    let mut plan = plan(Some(admin.addr.clone()), Duration::from_secs(5), None);
    plan.envoy_window = Duration::from_millis(300);
    let started = Instant::now();
    let report = drain(router, &plan, &crossbeam_channel::never::<()>());
    assert_eq!(report.envoy, EnvoyDrain::WindowElapsed);
    assert!(started.elapsed() >= Duration::from_millis(300), "waited the whole window");
    assert!(report.streams_finished, "then ext_proc drained as usual");
    let polls = admin.log.lock().iter().filter(|l| l.starts_with("GET /stats")).count();
    assert!(polls >= 3, "kept polling every poll interval: {polls}");
}

#[test]
fn b43_error_answers_from_the_admin_are_logged_and_the_drain_goes_on() {
    let mut stack = Stack::start(&[]);
    let polls = Arc::new(Mutex::new(0));
    let seen = Arc::clone(&polls);
    let admin = FakeAdmin::answering(
        vec![2, 0],
        Box::new(move |line| match line {
            "POST /healthcheck/fail" => (500, Duration::ZERO),
            "POST /drain_listeners" => (503, Duration::ZERO),
            _ => {
                // The first two stats reads fail too.
                let mut n = seen.lock();
                *n += 1;
                (if *n <= 2 { 500 } else { 200 }, Duration::ZERO)
            }
        }),
    );
    let router = stack.router.take().unwrap();
    let report = drain(
        router,
        &plan(Some(admin.addr.clone()), Duration::from_secs(5), None),
        &crossbeam_channel::never::<()>(),
    );
    assert_eq!(report.envoy, EnvoyDrain::Drained, "an Envoy that answers errors is not gone");
    let log = admin.log.lock().clone();
    assert_eq!(&log[..2], ["POST /healthcheck/fail", "POST /drain_listeners"]);
    assert_eq!(
        log[2..].iter().filter(|l| l.starts_with("GET /stats")).count(),
        4,
        "polled past the errors: {log:?}"
    );
}

#[test]
fn b43_a_slow_admin_answer_is_not_envoy_gone() {
    let mut stack = Stack::start(&[]);
    let admin = FakeAdmin::answering(
        vec![0],
        Box::new(|line| {
            (200, if line == "POST /healthcheck/fail" { Duration::from_secs(3) } else { Duration::ZERO })
        }),
    );
    let router = stack.router.take().unwrap();
    let report = drain(
        router,
        &plan(Some(admin.addr.clone()), Duration::from_secs(5), None),
        &crossbeam_channel::never::<()>(),
    );
    assert_eq!(report.envoy, EnvoyDrain::Drained);
    let log = admin.log.lock().clone();
    assert!(log.contains(&"POST /drain_listeners".to_string()), "{log:?}");
}

#[test]
fn b43_unreachable_admin_counts_as_drained() {
    let mut stack = Stack::start(&[]);
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let router = stack.router.take().unwrap();
    let started = Instant::now();
    let report = drain(
        router,
        &plan(Some(closed.to_string()), Duration::from_secs(5), None),
        &crossbeam_channel::never::<()>(),
    );
    assert_eq!(report.envoy, EnvoyDrain::Unreachable);
    assert!(started.elapsed() < Duration::from_secs(10), "no 15 s wait for a gone Envoy");
}

#[test]
fn b43_drain_timeout_cuts_streams_still_open() {
    // Parking off allows a drain timeout below the (15 s) resume budget.
    let mut stack = Stack::start(&["--parked-request-max", "0", "--drain-timeout", "300ms"]);
    stack.sim.script("demo/stuck", vec![Answer::error(Code::Aborted, "busy").held()]);
    let envoy = stack.envoy.clone();
    let client = std::thread::spawn(move || {
        let mut stream = envoy.open();
        block_on(stream.send(headers_request(&[("ate-target-actor", "demo/stuck")])));
        block_on(futures::StreamExt::next(&mut stream.rx)).map(|r| r.is_ok())
    });
    stack.wait_for_waiters("demo/stuck", 1);
    let router = stack.router.take().unwrap();
    let metrics = router.metrics().clone();
    let report =
        drain(router, &plan(None, Duration::from_millis(300), None), &crossbeam_channel::never::<()>());
    assert!(!report.streams_finished);
    assert!(!report.interrupted, "the timeout, not a signal, ended the wait");
    assert_eq!(report.cancelled, 1);
    assert_eq!(metrics.drain_cancelled(), 1);
    assert_ne!(client.join().unwrap(), Some(true), "the cut stream got no verdict");
    stack.sim.release("demo/stuck");
}

#[test]
fn b44_parked_requests_get_verdicts_during_drain() {
    // A budget no machine hiccup can use up: the flight ends only when the
    // test lets the control plane answer.
    let mut stack =
        Stack::start(&["--parked-request-retry-interval", "10ms", "--parked-request-budget", "60s"]);
    stack.sim.script("demo/hot", vec![Answer::error(Code::ResourceExhausted, "no free workers available")]);
    let envoy = stack.envoy.clone();
    let requests = std::thread::spawn(move || {
        block_on(futures::future::join_all((0..5).map(|_| envoy.route("demo/hot"))))
    });
    stack.eventually("five parked", |s| s.metrics().value("atenet_router_parking_active", &[]) == 5.0);
    let router = stack.router.take().unwrap();
    let metrics = router.metrics().clone();
    let metrics_addr = router.metrics_addr();
    let sim_release = {
        let sim = &stack.sim;
        std::thread::scope(|scope| {
            let drained = scope.spawn(|| {
                drain(router, &plan(None, Duration::from_secs(90), None), &crossbeam_channel::never::<()>())
            });
            // Serve the parked requests once the drain has begun, and while
            // it waits for them.
            eventually_within(PATIENCE, "draining", || http_get(metrics_addr, "/readyz").0 == 503);
            sim.script("demo/hot", vec![Answer::ok("10.0.0.1", true)]);
            drained.join().unwrap()
        })
    };
    assert!(sim_release.streams_finished, "B44: every parked request finished");
    let replies = requests.join().unwrap();
    assert!(replies.iter().all(|r| !routed(r).1.is_empty()));
    assert_eq!(metrics.drain_verdicts(), 5, "verdicts given during drain are counted");
}

fn scripted_sim() -> Sim {
    empty_sim()
}

#[test]
fn b43_b44_b45_sigterm_to_the_binary_with_requests_parked() {
    let sim = scripted_sim();
    let marker = temp_marker("sigterm");
    std::fs::create_dir_all(marker.parent().unwrap()).unwrap();
    std::fs::write(&marker, "stale\n").unwrap();
    let marker_arg = marker.to_str().unwrap().to_string();
    let mut router = spawn_router(&router_args(
        &sim.addr().to_string(),
        &[
            "--drain-complete-file",
            &marker_arg,
            "--parked-request-retry-interval",
            "10ms",
            // No machine hiccup uses this up before the test answers.
            "--parked-request-budget",
            "60s",
        ],
    ));
    assert!(!marker.exists(), "B45: stale marker removed at startup");
    sim.script("demo/hot", vec![Answer::error(Code::ResourceExhausted, "no free workers available")]);
    let envoy = Envoy::connect(router.extproc);
    let requests = std::thread::spawn(move || {
        block_on(futures::future::join_all((0..5).map(|_| envoy.route("demo/hot"))))
    });
    let gauge = |m| Metrics(http_get(m, "/metrics").1).value("atenet_router_parking_active", &[]);
    eventually_within(PATIENCE, "five parked", || gauge(router.metrics) == 5.0);
    signal(&router.process.child, "TERM");
    eventually_within(PATIENCE, "not ready", || http_get(router.metrics, "/readyz").0 == 503);
    assert_eq!(http_get(router.metrics, "/healthz").0, 200);
    sim.script("demo/hot", vec![Answer::ok("10.0.0.1", true)]);
    let replies = requests.join().unwrap();
    assert!(replies.iter().all(|r| !routed(r).1.is_empty()), "B44: every parked request got its verdict");
    assert_eq!(wait_exit(&mut router.process.child, PATIENCE), 0);
    let text = std::fs::read_to_string(&marker).unwrap();
    assert!(text.ends_with("Z\n") && text.starts_with("20"), "{text:?}");
    std::fs::remove_dir_all(marker.parent().unwrap().parent().unwrap()).unwrap();
}

#[test]
fn b43_second_signal_skips_the_waits() {
    let sim = scripted_sim();
    let mut router = spawn_router(&router_args(&sim.addr().to_string(), &["--drain-delay", "1h"]));
    signal(&router.process.child, "TERM");
    eventually_within(PATIENCE, "not ready", || http_get(router.metrics, "/readyz").0 == 503);
    signal(&router.process.child, "INT");
    assert_eq!(wait_exit(&mut router.process.child, PATIENCE), 0);
    // The log says what ended the wait: the signal, not a timeout.
    eventually_within(PATIENCE, "the last line", || {
        router.process.log.lock().iter().any(|l| l.contains("drain complete"))
    });
    let log = router.process.log.lock().join("\n");
    assert!(log.contains("ext_proc cut short by a second signal"), "{log}");
    assert!(!log.contains("at the drain timeout"), "{log}");
    // No admin address: the log says Envoy was not drained, in words.
    assert!(log.contains("drain: Envoy not drained (no --envoy-admin-address)"), "{log}");
    assert!(!log.contains("Disabled"), "{log}");
}

/// A second signal while flights wait in a saturation group (B43, B110):
/// the drain ends at once, the group's timers hold nothing up, and every
/// client's stream ends (its verdict, or cancelled), none left hanging.
#[test]
fn b43_second_signal_with_flights_waiting_in_a_group() {
    let sim = scripted_sim();
    let names: Vec<String> = (0..8).map(|i| format!("demo/grouped-{i}")).collect();
    for name in &names {
        sim.script(name, vec![Answer::error(Code::ResourceExhausted, "no free workers available")]);
    }
    let mut router = spawn_router(&router_args(
        &sim.addr().to_string(),
        &["--drain-delay", "1h", "--parked-request-budget", "60s", "--parked-request-retry-interval", "10ms"],
    ));
    let envoy = Envoy::connect(router.extproc);
    let clients: Vec<_> = names
        .iter()
        .map(|name| {
            let (envoy, name) = (envoy.clone(), name.clone());
            std::thread::spawn(move || envoy.try_exchange(headers_request(&[("ate-target-actor", &name)])))
        })
        .collect();
    let waiting = |m| Metrics(http_get(m, "/metrics").1).value("atenet_router_saturation_group_flights", &[]);
    eventually_within(PATIENCE, "seven flights waiting behind the probe", || waiting(router.metrics) >= 7.0);
    signal(&router.process.child, "TERM");
    eventually_within(PATIENCE, "not ready", || http_get(router.metrics, "/readyz").0 == 503);
    signal(&router.process.child, "INT");
    assert_eq!(wait_exit(&mut router.process.child, PATIENCE), 0);
    let deadline = Instant::now() + PATIENCE;
    for client in clients {
        while !client.is_finished() {
            assert!(Instant::now() < deadline, "a client's stream outlived the router by {PATIENCE:?}");
            std::thread::sleep(Duration::from_millis(20));
        }
        let _verdict_or_cancelled = client.join().expect("a client thread");
    }
    let log = router.process.log.lock().join("\n");
    assert!(log.contains("ext_proc cut short by a second signal"), "{log}");
}

/// B74: the drain does not wait for streams that never sent a message:
/// with only those open it closes them and exits, rather than waiting its
/// timeout (an hour here) or their own 5 s.
#[test]
fn b74_the_drain_does_not_wait_for_silent_streams() {
    let sim = scripted_sim();
    let mut router = spawn_router(&router_args(&sim.addr().to_string(), &["--drain-timeout", "1h"]));
    let envoy = Envoy::connect(router.extproc);
    let _silent: Vec<Stream> = (0..3).map(|_| envoy.open()).collect();
    let gauge = |m| Metrics(http_get(m, "/metrics").1).value("atenet_router_extproc_streams_active", &[]);
    eventually_within(PATIENCE, "three streams open", || gauge(router.metrics) == 3.0);
    signal(&router.process.child, "TERM");
    assert_eq!(wait_exit(&mut router.process.child, PATIENCE), 0);
    eventually_within(PATIENCE, "the last line", || {
        router.process.log.lock().iter().any(|l| l.contains("drain complete"))
    });
    let log = router.process.log.lock().join("\n");
    assert!(log.contains("drain: closing 3 ext_proc streams that never sent a message"), "{log}");
    assert!(!log.contains("cancelling"), "{log}");
    assert!(log.contains("ext_proc finished, marker"), "no second signal came: {log}");
}

/// B101: a connection without streams whose peer never answers gRPC's
/// GOAWAY (a hung peer; here a socket that said hello and went mute) does
/// not hold the drain: once no stream holds a request the router closes
/// it and exits, where gRPC core alone waits 20 s for the GOAWAY's ping.
/// What the mute client saw is the truth.
#[test]
fn b101_a_mute_connection_does_not_hold_the_drain() {
    let sim = scripted_sim();
    sim.script("demo/a", vec![Answer::ok("10.0.0.1", false)]);
    let mut router = spawn_router(&router_args(&sim.addr().to_string(), &["--drain-timeout", "1h"]));
    let mut mute = mute_http2_connection(router.extproc);
    assert_eq!(routed(&Envoy::connect(router.extproc).route_now("demo/a")).1, "10.0.0.1:443");
    let signalled = Instant::now();
    signal(&router.process.child, "TERM");
    assert!(closed_by_peer(&mut mute), "the router closed the mute connection");
    let closed_after = signalled.elapsed();
    assert_eq!(wait_exit(&mut router.process.child, PATIENCE), 0);
    assert!(closed_after < GRPC_GOAWAY_PING_TIMEOUT / 2, "closed {closed_after:?} after the signal");
    eventually_within(PATIENCE, "the last line", || {
        router.process.log.lock().iter().any(|l| l.contains("drain complete"))
    });
    let log = router.process.log.lock().join("\n");
    assert!(log.contains("closing 1 connections whose peer has not answered gRPC's GOAWAY"), "{log}");
    assert!(log.contains("ext_proc finished, marker"), "{log}");
}

/// `Check("")` on the router's ext_proc port, over `client`'s connection.
fn health(client: &grpcio::Client) -> Option<i32> {
    use atenet_router::proto::health::HealthCheckRequest;
    let options = grpcio::CallOption::default().timeout(PATIENCE);
    let answer = client.unary_call(&atenet_router::proto::HEALTH_CHECK, &HealthCheckRequest::new(), options);
    answer.ok().map(|a| a.status.value())
}

/// B85: a fleet router leaves the fleet. At the signal its health says
/// NOT_SERVING while ext_proc still takes streams for the drain delay;
/// then it stops taking them, finishes the parked requests it holds, and
/// exits 0, without a single request to the Envoy admin it was given.
#[test]
fn b85_a_fleet_router_leaves_the_fleet_and_drains_no_envoy() {
    let sim = scripted_sim();
    let admin = FakeAdmin::start(vec![0]);
    let mut router = spawn_router(&router_args(
        &sim.addr().to_string(),
        &[
            "--envoys",
            "3",
            "--envoy-admin-address",
            &admin.addr,
            "--drain-delay",
            "4s",
            "--parked-request-retry-interval",
            "10ms",
            "--parked-request-budget",
            "60s",
        ],
    ));
    sim.script("demo/hot", vec![Answer::error(Code::ResourceExhausted, "no free workers available")]);
    sim.script("demo/new", vec![Answer::ok("10.0.0.2", true)]);
    let envoy = Envoy::connect(router.extproc);
    let env = Arc::new(grpcio::EnvBuilder::new().cq_count(1).build());
    let checker = grpcio::Client::new(grpcio::ChannelBuilder::new(env).connect(&router.extproc.to_string()));
    const SERVING: i32 = 1;
    const NOT_SERVING: i32 = 2;
    assert_eq!(health(&checker), Some(SERVING));
    let parked = envoy.clone();
    let requests = std::thread::spawn(move || {
        block_on(futures::future::join_all((0..5).map(|_| parked.route("demo/hot"))))
    });
    let gauge = |m| Metrics(http_get(m, "/metrics").1).value("atenet_router_parking_active", &[]);
    eventually_within(PATIENCE, "five parked", || gauge(router.metrics) == 5.0);
    signal(&router.process.child, "TERM");
    eventually_within(PATIENCE, "health NOT_SERVING", || health(&checker) == Some(NOT_SERVING));
    assert_eq!(routed(&envoy.route_now("demo/new")).1, "10.0.0.2:443", "streams are taken through the delay");
    // Then ext_proc stops taking streams: the port no longer accepts.
    eventually_within(PATIENCE, "ext_proc stopped accepting", || {
        std::net::TcpStream::connect(router.extproc).is_err()
    });
    assert_eq!(router.process.child.try_wait().unwrap(), None, "still finishing the parked requests");
    sim.script("demo/hot", vec![Answer::ok("10.0.0.1", true)]);
    let replies = requests.join().unwrap();
    assert!(replies.iter().all(|r| routed(r).1 == "10.0.0.1:443"), "every parked request got its verdict");
    assert_eq!(wait_exit(&mut router.process.child, PATIENCE), 0);
    assert!(admin.log.lock().is_empty(), "no Envoy was drained: {:?}", admin.log.lock());
    eventually_within(PATIENCE, "the last line", || {
        router.process.log.lock().iter().any(|l| l.contains("drain complete"))
    });
    let log = router.process.log.lock().join("\n");
    assert!(log.contains("Envoy not drained (a fleet router"), "{log}");
}

/// B94: a SIGHUP during a SIGTERM drain is logged and ignored. It neither
/// skips the drain's waits (a second SIGTERM or SIGINT does) nor starts a
/// handover: Envoy is still drained, and every parked request gets its
/// verdict.
#[test]
fn b94_a_sighup_during_a_drain_neither_skips_it_nor_hands_over() {
    let sim = scripted_sim();
    let admin = FakeAdmin::start(vec![0]);
    let mut router = spawn_router(&router_args(
        &sim.addr().to_string(),
        &[
            "--envoy-admin-address",
            &admin.addr,
            "--drain-delay",
            "1s",
            "--parked-request-retry-interval",
            "10ms",
            "--parked-request-budget",
            "60s",
        ],
    ));
    sim.script("demo/held", vec![Answer::error(Code::ResourceExhausted, "no free workers available")]);
    let envoy = Envoy::connect(router.extproc);
    let requests = std::thread::spawn(move || {
        block_on(futures::future::join_all((0..5).map(|_| async {
            let mut stream = envoy.open();
            stream.send(headers_request(&[("ate-target-actor", "demo/held")])).await;
            use futures::StreamExt;
            // None: the stream ended without a verdict (cut).
            stream.rx.next().await.and_then(Result::ok)
        })))
    });
    let gauge = |m| Metrics(http_get(m, "/metrics").1).value("atenet_router_parking_active", &[]);
    eventually_within(PATIENCE, "five parked", || gauge(router.metrics) == 5.0);
    let logged = |router: &common::process::RouterProcess, what: &str| {
        router.process.log.lock().iter().any(|l| l.contains(what))
    };
    signal(&router.process.child, "TERM");
    eventually_within(PATIENCE, "the drain delay began", || {
        logged(&router, "drain: not ready (health NOT_SERVING); waiting")
    });
    signal(&router.process.child, "HUP");
    eventually_within(PATIENCE, "ext_proc stopping", || logged(&router, "stopping ext_proc"));
    sim.script("demo/held", vec![Answer::ok("10.0.0.1", true)]);
    let replies = requests.join().unwrap();
    let served = replies.iter().flatten().filter(|r| r.has_request_headers()).count();
    assert_eq!(served, 5, "every parked request got its verdict: {replies:?}");
    assert_eq!(wait_exit(&mut router.process.child, PATIENCE), 0);
    eventually_within(PATIENCE, "the last line", || logged(&router, "drain complete"));
    let log = router.process.log.lock().join("\n");
    assert!(log.contains("drain complete: Envoy drained, ext_proc finished"), "{log}");
    assert!(log.contains("SIGHUP ignored: this router is draining"), "{log}");
    assert!(!log.contains("handover"), "no handover from a draining router: {log}");
    let admin_log = admin.log.lock().clone();
    assert!(admin_log.contains(&"POST /drain_listeners".to_string()), "{admin_log:?}");
}
