//! Memory per parked request under gRPC core's and the allocator's memory
//! options: the measurements behind BENCHMARKS.md's "Memory per parked
//! request". Run only when named, with a router built with the
//! `memory-probe` feature (`make bench-memory`), which reads extra gRPC
//! channel arguments for the ext_proc server from `ATENET_TEST_GRPC_ARGS`.

use std::time::Duration;

use atenet_router::actor::resume::Code;
use atenet_router::tools::load::{self, Envoy, Stop};
use atenet_router::tools::sim::{Answer, SimConfig};

use crate::harness::{actors, sim, spec, Proc};
use crate::report::{median, Report};

/// `label:NAME=VALUE;...`, each NAME=VALUE an environment variable of the
/// router process; `control` changes nothing. `GRPC_EXPERIMENTS` and
/// `MALLOC_*` are read by gRPC core and glibc themselves; `ATENET_BENCH_COLD`
/// by this bench. Left out because it aborts the router on its first request
/// (gRPC 1.56 with grpcio 0.13): `GRPC_EXPERIMENTS=promise_based_server_call`.
const VARIANTS: &[&str] = &[
    "control:",
    "minimal_stack:ATENET_TEST_GRPC_ARGS=grpc.minimal_stack=1",
    "minimal_stack+deadline:ATENET_TEST_GRPC_ARGS=grpc.minimal_stack=1,grpc.enable_deadline_checking=1",
    "no_deadline_filter:ATENET_TEST_GRPC_ARGS=grpc.enable_deadline_checking=0",
    "no_compression:ATENET_TEST_GRPC_ARGS=grpc.per_message_compression=0,grpc.per_message_decompression=0",
    "lookahead_1k:ATENET_TEST_GRPC_ARGS=grpc.http2.lookahead_bytes=1024",
    "write_buffer_1k:ATENET_TEST_GRPC_ARGS=grpc.http2.write_buffer_size=1024",
    "no_bdp_probe:ATENET_TEST_GRPC_ARGS=grpc.http2.bdp_probe=0",
    "hpack_decoder_0:ATENET_TEST_GRPC_ARGS=grpc.http2.hpack_table_size.decoder=0",
    "exp_free_large_allocator:GRPC_EXPERIMENTS=free_large_allocator",
    "malloc_arena_max_2:MALLOC_ARENA_MAX=2",
    "cold_connection:ATENET_BENCH_COLD=1",
    "cold_connection+minimal_stack:ATENET_BENCH_COLD=1;ATENET_TEST_GRPC_ARGS=grpc.minimal_stack=1",
];

const ROUNDS: usize = 3;
const PARKED: usize = 10_000;

/// Router RSS per parked request for each variant, each round running
/// every variant once, in turn, against a fresh router and simulator.
pub fn park_memory(report: &mut Report) {
    if cfg!(not(feature = "memory-probe")) {
        eprintln!(
            "bench: park-memory needs the router built with the memory-probe feature: make bench-memory"
        );
        std::process::exit(2);
    }
    let variants: Vec<(&str, Vec<(String, String)>)> = VARIANTS
        .iter()
        .map(|variant| {
            let (label, env) = variant.split_once(':').expect("label:env");
            let env = env
                .split(';')
                .filter(|kv| !kv.is_empty())
                .map(|kv| {
                    let (k, v) = kv.split_once('=').expect("NAME=VALUE");
                    (k.to_string(), v.to_string())
                })
                .collect();
            (label, env)
        })
        .collect();
    report.line(&format!("\n## Park memory: RSS per parked request, {PARKED} parked, {ROUNDS} rounds\n"));
    let mut per_request: Vec<Vec<f64>> = vec![Vec::new(); variants.len()];
    for _ in 0..ROUNDS {
        for (i, (label, env)) in variants.iter().enumerate() {
            let (idle, parked) = park_rss(env);
            let kib = (parked as f64 - idle as f64) / PARKED as f64;
            eprintln!(
                "park-memory {label}: {idle} KiB idle, {parked} KiB parked: {kib:.2} KiB per parked request"
            );
            per_request[i].push(kib);
        }
    }
    report.line(
        "| variant | router environment | KiB per parked request, each run | **median** | vs control |",
    );
    report.line("|---|---|---|---|---|");
    let control = median(per_request[0].clone());
    for (i, (label, env)) in variants.iter().enumerate() {
        let m = median(per_request[i].clone());
        let env: Vec<String> = env.iter().map(|(k, v)| format!("`{k}={v}`")).collect();
        let runs: Vec<String> = per_request[i].iter().map(|k| format!("{k:.2}")).collect();
        report.line(&format!(
            "| {label} | {} | {} | **{m:.2}** | {:+.2} |",
            if env.is_empty() { "(none)".to_string() } else { env.join(" ") },
            runs.join(" / "),
            m - control
        ));
        report.figure("park-memory", &format!("{label}.kib_per_parked"), m);
    }
    report.line(&format!(
        "\n(VmRSS parked - VmRSS idle) / {PARKED}. Each run: a fresh router and simulator, 2,000 warm-up \
         requests, idle VmRSS, {PARKED} requests parked on 10 actors that answer ResourceExhausted, all \
         parked plus 1 s, VmRSS; then capacity returns and every one must be routed."
    ));
}

/// One run: the router's VmRSS (KiB) warmed up and idle, then with
/// [`PARKED`] requests parked.
fn park_rss(env: &[(String, String)]) -> (u64, u64) {
    let sim = sim(SimConfig { workers: 0, actors: 0, ..SimConfig::default() });
    let hot = actors("demo/park-", 10);
    for actor in &hot {
        sim.script(actor, vec![Answer::error(Code::ResourceExhausted, "no free workers available")]);
    }
    let max = PARKED.to_string();
    let router = Proc::router_env(
        sim.addr(),
        &["--parked-request-max", &max, "--parked-request-budget", "60s", "--drain-timeout", "90s"],
        env,
    );
    let envoy = Envoy::connect(router.extproc);
    sim.script("demo/warm", vec![Answer::ok("10.0.0.1", false)]);
    load::run_with(&envoy, &spec(router.extproc, 16, Stop::Count(2000), vec!["demo/warm".into()]));
    std::thread::sleep(Duration::from_millis(500));
    let idle = router.rss_kib();
    // ATENET_BENCH_COLD=1 parks on a second connection, one that has carried
    // no complete call: gRPC sizes each call's arena from the calls its
    // connection has seen end, so these arenas start at gRPC's minimum.
    let cold = env.iter().any(|(k, v)| k == "ATENET_BENCH_COLD" && v == "1");
    let parker = if cold { Envoy::connect_own(router.extproc) } else { envoy.clone() };
    let held = {
        let (target, hot) = (router.extproc, hot.clone());
        std::thread::spawn(move || {
            load::run_with(&parker, &spec(target, PARKED, Stop::Count(PARKED as u64), hot))
        })
    };
    let all = router.wait_metric("atenet_router_parking_active", "", PARKED as f64, Duration::from_secs(120));
    assert!(all, "not every request parked");
    std::thread::sleep(Duration::from_secs(1));
    let parked = router.rss_kib();
    for actor in &hot {
        sim.script(actor, vec![Answer::ok("10.0.0.2", true)]);
    }
    let result = held.join().expect("the parking client");
    let routed = result.verdicts.get("200 routed").copied().unwrap_or(0);
    assert_eq!(routed, PARKED as u64, "{:?}", result.verdicts);
    (idle, parked)
}
