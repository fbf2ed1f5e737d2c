//! The bench's processes and helpers: the router and the baseline as
//! processes of their own (so their CPU, memory and threads can be read from
//! /proc), the simulated control plane in this process, load specs.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use atenet_router::actor::target::ActorId;
use atenet_router::envoy::extproc::{response_for, ClientProtocol};
use atenet_router::envoy::verdict::Verdict;
use atenet_router::proto::ateapi::{ObjectRef, ResumeActorRequest};
use atenet_router::proto::external_processor::{processing_request, ProcessingRequest, ProcessingResponse};
use atenet_router::proto::{ATEAPI_RESUME_ACTOR, EXT_PROC_PROCESS};
use atenet_router::tools::load::{Distribution, LoadReport, LoadSpec, Stop, Target};
use atenet_router::tools::sim::{Sim, SimConfig};
use futures::{SinkExt, StreamExt};
use grpcio::{
    CallOption, ChannelBuilder, Client, DuplexSink, EnvBuilder, RequestStream, RpcContext, ServerBuilder,
    ServerCredentials, ServiceBuilder, WriteFlags,
};

/// The router this build made; `ATENET_BENCH_ROUTER` names another binary
/// to measure instead (a candidate built elsewhere, against the same
/// baseline).
pub fn router_binary() -> String {
    std::env::var("ATENET_BENCH_ROUTER").unwrap_or_else(|_| env!("CARGO_BIN_EXE_atenet-router").to_string())
}

pub fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into())
}

/// A server process (router or baseline) and its ext_proc address.
pub struct Proc {
    pub child: Child,
    pub extproc: SocketAddr,
    pub metrics: Option<SocketAddr>,
}

impl Proc {
    pub fn router(sim: SocketAddr, flags: &[&str]) -> Proc {
        Proc::router_env(sim, flags, &[])
    }

    /// The router with extra environment variables (`park-memory`).
    pub fn router_env(sim: SocketAddr, flags: &[&str], env: &[(String, String)]) -> Proc {
        let sim = sim.to_string();
        let mut args = vec![
            "serve",
            "--ateapi-insecure",
            "--ateapi-address",
            &sim,
            "--port-extproc",
            "0",
            "--metrics-listen-addr",
            "127.0.0.1:0",
            "--status-port",
            "0",
            "--drain-delay",
            "0s",
            "--envoy-admin-address",
            "",
            "--drain-complete-file",
            "",
            "--log-level",
            "warn",
        ];
        args.extend_from_slice(flags);
        // The startup line is at info; read it at info, then nothing else is logged at warn.
        let mut child = Command::new(router_binary())
            .args(args.iter().filter(|a| **a != "--log-level" && **a != "warn"))
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stderr(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .expect("start router");
        let line = first_line(&mut child, "serving");
        let field =
            |p: &str| line.split(p).nth(1).unwrap().split([' ', ',', '/']).next().unwrap().parse().unwrap();
        Proc { extproc: field("ext_proc on "), metrics: Some(field("metrics on http://")), child }
    }

    pub fn baseline(sim: SocketAddr) -> Proc {
        Proc::baseline_at(sim, "127.0.0.1:0", BASELINE_WORKER)
    }

    /// The baseline listening on `listen`, its verdict routing to `worker`
    /// (`envoy-path`, where a real Envoy follows it).
    pub fn baseline_at(sim: SocketAddr, listen: &str, worker: &str) -> Proc {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .env("ATENET_BENCH_ROLE", "baseline")
            .env("ATENET_BENCH_ATEAPI", sim.to_string())
            .env("ATENET_BENCH_LISTEN", listen)
            .env("ATENET_BENCH_WORKER", worker)
            .stderr(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .expect("start baseline");
        let line = first_line(&mut child, "baseline listening on");
        let addr = line.rsplit(' ').next().unwrap().parse().unwrap();
        Proc { child, extproc: addr, metrics: None }
    }

    fn status_field(&self, name: &str) -> u64 {
        let text = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        text.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    }

    pub fn rss_kib(&self) -> u64 {
        self.status_field("VmRSS:")
    }

    /// The anonymous part of [`Proc::rss_kib`]: the heap and thread stacks,
    /// without the mapped binary and libraries.
    pub fn rss_anon_kib(&self) -> u64 {
        self.status_field("RssAnon:")
    }

    /// Each thread's name (`/proc/PID/task/*/comm`), with how many have it.
    pub fn thread_names(&self) -> std::collections::BTreeMap<String, u32> {
        let mut names = std::collections::BTreeMap::new();
        let tasks = std::fs::read_dir(format!("/proc/{}/task", self.child.id())).into_iter().flatten();
        for task in tasks.flatten() {
            let name = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
            *names.entry(name.trim().to_string()).or_insert(0) += 1;
        }
        names
    }

    pub fn threads(&self) -> u64 {
        self.status_field("Threads:")
    }

    /// User + system CPU seconds so far.
    pub fn cpu_seconds(&self) -> f64 {
        cpu_seconds_of_pid(self.child.id())
    }

    pub fn metric(&self, name: &str, labels: &str) -> f64 {
        let text = http_get(self.metrics.expect("router metrics"), "/metrics");
        text.lines()
            .filter(|l| !l.starts_with('#'))
            .filter(|l| {
                let series = l.rsplit_once(' ').map_or("", |(s, _)| s);
                let metric = series.split('{').next().unwrap_or("");
                metric == name && series.contains(labels)
            })
            .filter_map(|l| l.rsplit_once(' ').and_then(|(_, v)| v.parse::<f64>().ok()))
            .sum()
    }

    pub fn wait_metric(&self, name: &str, labels: &str, want: f64, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if self.metric(name, labels) >= want {
                return true;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        false
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn first_line(child: &mut Child, marker: &str) -> String {
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let line = lines.by_ref().map_while(Result::ok).find(|l| l.contains(marker)).expect("process starts");
    std::thread::spawn(move || lines.for_each(drop));
    line
}

/// User + system CPU seconds of this process (the load generator and the
/// simulator) so far.
pub fn own_cpu_seconds() -> f64 {
    cpu_seconds_of("/proc/self/stat")
}

/// Microseconds in which some runnable task waited for a CPU, since boot:
/// the kernel's pressure stall information (`/proc/pressure/cpu`, "some
/// total"). Its growth over a run, per second of the run, is the share of
/// the run the machine was saturated; `None` where the kernel has no PSI.
pub fn cpu_stall_micros() -> Option<f64> {
    let text = std::fs::read_to_string("/proc/pressure/cpu").ok()?;
    let some = text.lines().find(|l| l.starts_with("some "))?;
    some.split_whitespace().find_map(|f| f.strip_prefix("total="))?.parse().ok()
}

/// CPU seconds every core of the machine spent busy (not idle, not waiting
/// for I/O) since boot, from `/proc/stat`: with the CPU of a scenario's own
/// processes, what everything else on a shared machine took meanwhile.
pub fn machine_busy_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let fields: Vec<f64> = stat
        .lines()
        .next()
        .unwrap_or("")
        .split_whitespace()
        .skip(1)
        .map(|f| f.parse().unwrap_or(0.0))
        .collect();
    // user nice system idle iowait irq softirq steal
    let busy: f64 = [0, 1, 2, 5, 6, 7].iter().filter_map(|&i| fields.get(i)).sum();
    busy / clock_ticks()
}

/// User + system CPU seconds of this process's children that have ended
/// and been waited for (the `parkload` runs of a scenario).
pub fn ended_children_cpu_seconds() -> f64 {
    // SAFETY: getrusage only writes the struct it is given.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    if unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut usage) } != 0 {
        return f64::NAN;
    }
    let seconds = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    seconds(usage.ru_utime) + seconds(usage.ru_stime)
}

/// User + system CPU seconds of process `pid` (all its threads) so far.
pub fn cpu_seconds_of_pid(pid: u32) -> f64 {
    cpu_seconds_of(&format!("/proc/{pid}/stat"))
}

/// User + system CPU seconds from a `/proc/<pid>/stat` file.
fn cpu_seconds_of(path: &str) -> f64 {
    let stat = std::fs::read_to_string(path).unwrap();
    let after = &stat[stat.rfind(')').unwrap() + 2..];
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks: f64 = fields[11].parse::<f64>().unwrap() + fields[12].parse::<f64>().unwrap();
    ticks / clock_ticks()
}

/// Clock ticks per second, asked of `getconf` once rather than at every
/// CPU reading (a process spawn on the cores being measured).
fn clock_ticks() -> f64 {
    static TICKS: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    *TICKS.get_or_init(|| {
        Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(100.0)
    })
}

pub fn http_get(addr: SocketAddr, path: &str) -> String {
    let mut stream = TcpStream::connect(addr).unwrap();
    write!(stream, "GET {path} HTTP/1.0\r\n\r\n").unwrap();
    let mut text = String::new();
    stream.read_to_string(&mut text).unwrap();
    text.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default()
}

pub fn sim(config: SimConfig) -> Sim {
    Sim::start(SimConfig { listen: "127.0.0.1:0".parse().unwrap(), ..config }).expect("sim starts")
}

// ----------------------------------------------------------------- baseline

/// Where the baseline's fixed verdict routes unless told otherwise: an
/// address nothing follows, since the load generator plays Envoy.
const BASELINE_WORKER: &str = "10.64.0.1:443";

/// The irreducible job: one ResumeActor per request_headers, a fixed verdict,
/// no flight table, lot or metrics. One completion-queue thread per core,
/// as the router's default, or `ATENET_BENCH_GRPC_THREADS` of them to set
/// beside a router run with `--grpc-threads` (BENCHMARKS.md). It listens on
/// `ATENET_BENCH_LISTEN` (a free port by default) and routes to
/// `ATENET_BENCH_WORKER`.
pub fn baseline_server(ateapi: &str) {
    let listen = std::env::var("ATENET_BENCH_LISTEN").unwrap_or_else(|_| "127.0.0.1:0".into());
    let worker = std::env::var("ATENET_BENCH_WORKER").unwrap_or_else(|_| BASELINE_WORKER.into());
    let threads = match std::env::var("ATENET_BENCH_GRPC_THREADS") {
        Ok(n) => n.parse().expect("ATENET_BENCH_GRPC_THREADS: a thread count"),
        Err(_) => std::thread::available_parallelism().map_or(2, |n| n.get()),
    };
    let env = Arc::new(EnvBuilder::new().cq_count(threads).build());
    let client = Arc::new(Client::new(ChannelBuilder::new(Arc::clone(&env)).connect(ateapi)));
    // The same routing verdict the router sends for parkload's requests
    // (original_dst metadata; no header mutation, as each carries its actor
    // header once, B6), built once: the baseline pays for encoding a
    // verdict, not for deciding it.
    let fixed = response_for(
        &Verdict::Route {
            actor: ActorId::parse("demo/actor-0").unwrap(),
            worker,
            target_port: 80,
            set_actor_header: false,
        },
        ClientProtocol::Http,
    );
    let service = ServiceBuilder::new()
        .add_duplex_streaming_handler(
            &EXT_PROC_PROCESS,
            move |ctx: RpcContext<'_>,
                  mut stream: RequestStream<ProcessingRequest>,
                  mut sink: DuplexSink<ProcessingResponse>| {
                let (client, fixed) = (Arc::clone(&client), fixed.clone());
                ctx.spawn(async move {
                    while let Some(Ok(request)) = stream.next().await {
                        if let Some(processing_request::Request::RequestHeaders(h)) = &request.request {
                            let actor = h
                                .headers
                                .headers
                                .iter()
                                .find(|v| v.key == "ate-target-actor")
                                .map(|v| String::from_utf8_lossy(&v.raw_value).into_owned())
                                .unwrap_or_default();
                            let (atespace, name) = actor.split_once('/').unwrap_or(("", ""));
                            let mut object = ObjectRef::new();
                            object.atespace = atespace.into();
                            object.name = name.into();
                            let mut call = ResumeActorRequest::new();
                            call.actor = Some(object).into();
                            if let Ok(receiver) =
                                client.unary_call_async(&ATEAPI_RESUME_ACTOR, &call, CallOption::default())
                            {
                                let _ = receiver.await;
                            }
                            if sink.send((fixed.clone(), WriteFlags::default())).await.is_err() {
                                return;
                            }
                        }
                    }
                });
            },
        )
        .build();
    let mut server = ServerBuilder::new(env).register_service(service).build().unwrap();
    let port = server.add_listening_port(&listen, ServerCredentials::insecure()).unwrap();
    server.start();
    let host = listen.rsplit_once(':').map_or("127.0.0.1", |(host, _)| host);
    eprintln!("baseline listening on {host}:{port}");
    loop {
        std::thread::park();
    }
}

// ---------------------------------------------------------------- scenarios

pub fn spec(target: SocketAddr, concurrency: usize, stop: Stop, actors: Vec<String>) -> LoadSpec {
    LoadSpec {
        target: Target::ExtProc(target),
        concurrency,
        rate: None,
        stop,
        actors,
        distribution: Distribution::Uniform,
        progress: None,
        grpc_timeout: None,
        request_timeout: Duration::from_secs(120),
    }
}

pub fn actors(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}{i}")).collect()
}

pub fn ms(us: u32) -> f64 {
    us as f64 / 1000.0
}

/// A pool where all 64 actors stay resident once resumed.
pub fn running_pool() -> Sim {
    sim(SimConfig {
        workers: 64,
        actors: 64,
        restore_latency: Duration::from_millis(1),
        idle_suspend: Duration::from_secs(3600),
        ..SimConfig::default()
    })
}

/// Pools several runs: throughput over the total time, latencies together.
pub fn merged(runs: &[LoadReport]) -> LoadReport {
    let mut all = LoadReport::default();
    for run in runs {
        all.merge(run);
    }
    all
}

/// A number that follows `"key":` in `json`, looked for after `within`.
pub fn json_number(json: &str, within: &str, key: &str) -> f64 {
    let from = json.find(within).unwrap_or_else(|| panic!("{within} in parkload's JSON"));
    let field = format!("\"{key}\":");
    let at =
        json[from..].find(&field).unwrap_or_else(|| panic!("{key} in parkload's JSON")) + from + field.len();
    let end = json[at..].find([',', '}']).map_or(json.len(), |e| at + e);
    json[at..end].parse().unwrap_or_else(|_| panic!("{key} in parkload's JSON is a number"))
}

/// The simulated control plane as a process of its own.
const SIMULATOR: &str = env!("CARGO_BIN_EXE_ateapi-sim");

/// `ateapi-sim` with the running pool's shape (64 actors on 64 workers, a
/// 1 ms restore, no idle suspension), stopped when dropped (a panicking
/// scenario must not leave it behind).
pub struct Simulator {
    child: std::process::Child,
    pub addr: std::net::SocketAddr,
}

impl Simulator {
    /// Starts it with `args` added (`--listen` among them).
    pub fn start(args: &[&str]) -> Simulator {
        let pool = ["--workers", "64", "--actors", "64", "--idle-suspend", "1h", "--restore-latency", "1ms"];
        Simulator::start_shaped(&[&pool, args].concat())
    }

    /// Starts it with `args` alone: a pool of another shape (`fleet`).
    pub fn start_shaped(args: &[&str]) -> Simulator {
        let mut child = std::process::Command::new(SIMULATOR)
            .args(args)
            .stderr(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("start ateapi-sim");
        let line = first_line(&mut child, "listening on ");
        let addr =
            line.split("listening on ").nth(1).and_then(|s| s.split(' ').next()).and_then(|s| s.parse().ok());
        Simulator { child, addr: addr.expect("ateapi-sim's address") }
    }

    /// User + system CPU seconds so far.
    pub fn cpu_seconds(&self) -> f64 {
        cpu_seconds_of_pid(self.child.id())
    }
}

impl Drop for Simulator {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
