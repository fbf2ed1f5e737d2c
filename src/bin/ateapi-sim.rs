//! `ateapi-sim`: a simulated ateapi control plane for development, demos and
//! tests. See `atenet_router::tools::sim` for the model.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use argh::FromArgs;
use atenet_router::cli::command::utf8_args;
use atenet_router::cli::godur;
use atenet_router::lifecycle::process;
use atenet_router::tools::sim::{Ipv4Net, Sim, SimConfig, SimTls, WorkerIps};
use signal_hook::consts::{SIGINT, SIGTERM, SIGUSR1};
use signal_hook::iterator::Signals;

#[derive(FromArgs)]
/// Simulated ateapi control plane: serves /ateapi.Control/ResumeActor over a
/// worker-pool model, with fault injection.
struct Args {
    /// listen address, ip:port (default: 127.0.0.1:50061)
    #[argh(option, default = "String::from(\"127.0.0.1:50061\")")]
    listen: String,
    /// number of workers in the pool (default: 4)
    #[argh(option, default = "4")]
    workers: usize,
    /// number of actors, named <atespace>/actor-0 ... (default: 64)
    #[argh(option, default = "64")]
    actors: usize,
    /// atespace of the simulated actors (default: demo)
    #[argh(option, default = "String::from(\"demo\")")]
    atespace: String,
    /// time a restore takes (Go duration) (default: 300ms)
    #[argh(option, default = "String::from(\"300ms\")")]
    restore_latency: String,
    /// restore latency varies by up to this fraction either way, in [0, 1) (default: 0.2)
    #[argh(option, default = "0.2")]
    restore_jitter: f64,
    /// a running actor is suspended this long after its last resume (Go duration) (default: 30s)
    #[argh(option, default = "String::from(\"30s\")")]
    idle_suspend: String,
    /// fraction of calls answered Unavailable (default: 0)
    #[argh(option, default = "0.0")]
    unavailable_rate: f64,
    /// fraction of calls answered Aborted (default: 0)
    #[argh(option, default = "0.0")]
    aborted_rate: f64,
    /// period of simulated rolling restarts (0 disables) (default: 0)
    #[argh(option, default = "String::from(\"0\")")]
    outage_every: String,
    /// how long each simulated restart answers Unavailable (default: 2s)
    #[argh(option, default = "String::from(\"2s\")")]
    outage_duration: String,
    /// file of scripted answers per actor (see atenet_router::tools::sim::parse_script) (default: none)
    #[argh(option)]
    script: Option<String>,
    /// fraction of restores that take --slow-restore-latency instead (default: 0)
    #[argh(option, default = "0.0")]
    slow_restore_rate: f64,
    /// how long a slow restore takes (default: 10s)
    #[argh(option, default = "String::from(\"10s\")")]
    slow_restore_latency: String,
    /// PEM certificate chain: serve TLS (default: none, plaintext)
    #[argh(option)]
    tls_cert: Option<String>,
    /// PEM private key for --tls-cert (default: none)
    #[argh(option)]
    tls_key: Option<String>,
    /// PEM CA: require client certificates it signed, mTLS (default: none)
    #[argh(option)]
    tls_client_ca: Option<String>,
    /// IP address of every worker, a reachable echo worker say (default: a
    /// distinct unreachable address per worker in 10.64.0.0/10)
    #[argh(option)]
    worker_ip: Option<String>,
    /// IPv4 network of the workers (a.b.c.d/8..30): worker i gets its
    /// (i+1)-th host address, 127.0.1.0/24 giving 127.0.1.1, 127.0.1.2, ...
    /// (default: none, see --worker-ip)
    #[argh(option)]
    worker_network: Option<String>,
    /// append every answer and every idle suspension to this file, one JSON
    /// object per line, for tests that check clients against the sim
    /// (default: none)
    #[argh(option)]
    answer_log: Option<String>,
}

fn duration(flag: &str, text: &str) -> Result<Duration, String> {
    let d = godur::parse(text).map_err(|e| format!("{flag}: {e}"))?;
    if d.negative {
        return Err(format!("{flag} must not be negative"));
    }
    Ok(d.magnitude)
}

fn rate(flag: &str, value: f64) -> Result<f64, String> {
    if (0.0..=1.0).contains(&value) {
        Ok(value)
    } else {
        Err(format!("{flag} must be in [0, 1], got {value}"))
    }
}

/// Workers and actors at most: the pool is built at startup, about 100
/// bytes each, so a larger count is a typo that would exhaust memory.
const MAX_POOL: usize = 1_000_000;

fn config(args: &Args) -> Result<SimConfig, String> {
    let listen: SocketAddr =
        args.listen.parse().map_err(|_| format!("--listen must be ip:port, got {:?}", args.listen))?;
    for (flag, n) in [("--workers", args.workers), ("--actors", args.actors)] {
        if n > MAX_POOL {
            return Err(format!("{flag} must be at most {MAX_POOL}, got {n}"));
        }
    }
    if !(0.0..1.0).contains(&args.restore_jitter) {
        return Err(format!("--restore-jitter must be in [0, 1), got {}", args.restore_jitter));
    }
    Ok(SimConfig {
        listen,
        workers: args.workers,
        actors: args.actors,
        atespace: args.atespace.clone(),
        restore_latency: duration("--restore-latency", &args.restore_latency)?,
        restore_jitter: args.restore_jitter,
        idle_suspend: duration("--idle-suspend", &args.idle_suspend)?,
        unavailable_rate: rate("--unavailable-rate", args.unavailable_rate)?,
        aborted_rate: rate("--aborted-rate", args.aborted_rate)?,
        outage_every: duration("--outage-every", &args.outage_every)?,
        outage_for: duration("--outage-duration", &args.outage_duration)?,
        slow_restore_rate: rate("--slow-restore-rate", args.slow_restore_rate)?,
        slow_restore: duration("--slow-restore-latency", &args.slow_restore_latency)?,
        tls: tls(args)?,
        worker_ips: worker_ips(args)?,
    })
}

fn worker_ips(args: &Args) -> Result<WorkerIps, String> {
    match (&args.worker_ip, &args.worker_network) {
        (Some(_), Some(_)) => Err("--worker-ip and --worker-network exclude each other".into()),
        (Some(ip), None) => ip
            .parse()
            .map(WorkerIps::Shared)
            .map_err(|_| format!("--worker-ip must be an IP address, got {ip:?}")),
        (None, Some(net)) => {
            let net = Ipv4Net::parse(net).map_err(|e| format!("--worker-network: {e}"))?;
            if args.workers > net.hosts() {
                return Err(format!(
                    "--worker-network holds {} workers, not --workers {}",
                    net.hosts(),
                    args.workers
                ));
            }
            Ok(WorkerIps::Network(net))
        }
        (None, None) => Ok(WorkerIps::UNREACHABLE),
    }
}

fn tls(args: &Args) -> Result<Option<SimTls>, String> {
    let read = |flag: &str, path: &str| std::fs::read(path).map_err(|e| format!("{flag} {path}: {e}"));
    match (&args.tls_cert, &args.tls_key) {
        (None, None) if args.tls_client_ca.is_none() => Ok(None),
        (Some(cert), Some(key)) => Ok(Some(SimTls {
            cert_chain: read("--tls-cert", cert)?,
            key: read("--tls-key", key)?,
            client_ca: args.tls_client_ca.as_deref().map(|ca| read("--tls-client-ca", ca)).transpose()?,
        })),
        _ => Err("--tls-cert and --tls-key go together (and --tls-client-ca needs them)".into()),
    }
}

/// Opened for appending: each line is one write, whole even if another
/// writer shares the file.
fn open_log(path: &str) -> Result<std::fs::File, String> {
    std::fs::OpenOptions::new().create(true).append(true).open(path).map_err(|e| format!("{path}: {e}"))
}

fn read_script(path: &str) -> Result<Vec<(String, atenet_router::tools::sim::Answer)>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))?;
    atenet_router::tools::sim::parse_script(&text).map_err(|e| e.to_string())
}

/// The flags, or how to exit: 0 after `--help`, 2 on a bad flag, like every
/// other configuration error here (argh's `from_env` exits 1, and panics on
/// `--help | head`).
fn args() -> Result<Args, ExitCode> {
    let argv = utf8_args(std::env::args_os().skip(1)).map_err(|e| {
        eprintln!("invalid sim configuration: {e}");
        ExitCode::from(2)
    })?;
    let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
    Args::from_args(&["ateapi-sim"], &argv).map_err(|exit| match exit.status {
        Ok(()) => process::print(&format!("{}\n", exit.output)),
        Err(()) => {
            eprintln!(
                "invalid sim configuration: {}\nRun ateapi-sim --help for more information.",
                exit.output.trim()
            );
            ExitCode::from(2)
        }
    })
}

fn main() -> ExitCode {
    let args = match args() {
        Ok(args) => args,
        Err(exit) => return exit,
    };
    let config = match config(&args) {
        Ok(config) => config,
        Err(e) => {
            eprintln!("invalid sim configuration: {e}");
            return ExitCode::from(2);
        }
    };
    let script = match args.script.as_deref().map(read_script).transpose() {
        Ok(script) => script.unwrap_or_default(),
        Err(e) => {
            eprintln!("invalid sim configuration: --script: {e}");
            return ExitCode::from(2);
        }
    };
    let answer_log = match args.answer_log.as_deref().map(open_log).transpose() {
        Ok(log) => log,
        Err(e) => {
            eprintln!("invalid sim configuration: --answer-log: {e}");
            return ExitCode::from(2);
        }
    };
    let mut signals = Signals::new([SIGTERM, SIGINT, SIGUSR1]).expect("installing signal handlers");
    let sim = match Sim::start(config.clone()) {
        Ok(sim) => sim,
        Err(e) => {
            eprintln!("ateapi-sim: {e}");
            return ExitCode::FAILURE;
        }
    };
    sim.script_all(script);
    if let Some(log) = answer_log {
        sim.log_answers_to(log);
    }
    let actors = match config.actors {
        0 => "no actors".to_string(),
        n => format!("{n} actors {}/actor-0..{}", config.atespace, n - 1),
    };
    eprintln!(
        "ateapi-sim listening on {} ({} workers, {actors}, restore {})",
        sim.addr(),
        config.workers,
        godur::format(config.restore_latency)
    );
    // SIGUSR1 lets the script's held answers go; the others stop the sim.
    for signal in signals.forever() {
        if signal != SIGUSR1 {
            break;
        }
        let released = sim.release_all();
        eprintln!("ateapi-sim: released {released} held answers");
    }
    sim.stop();
    ExitCode::SUCCESS
}
