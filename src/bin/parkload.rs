//! `parkload`: an ext_proc load generator playing Envoy's part against a
//! running atenet-router. See `parkload --help` and `atenet_router::tools::load`.

use std::net::{SocketAddr, ToSocketAddrs};
use std::process::ExitCode;
use std::time::Duration;

use argh::FromArgs;
use atenet_router::cli::command::utf8_args;
use atenet_router::cli::godur;
use atenet_router::lifecycle::process;
use atenet_router::tools::load::http::HttpTarget;
use atenet_router::tools::load::{
    self, CallerDeadline, Distribution, LoadSpec, Stop, Target, MAX_HTTP_IN_FLIGHT,
};

/// Requests in flight at most (`--concurrency`, `--hold`): each costs this
/// process about 10 KiB, so a million is already 10 GiB; more is a typo.
const MAX_IN_FLIGHT: usize = 1_000_000;

#[derive(FromArgs)]
/// Load generator for atenet-router's ext_proc port: one stream per request,
/// like Envoy; or, with --http, for an HTTP endpoint such as Envoy's
/// listener: one GET per request with the actor in ate-target-actor, over
/// keep-alive HTTP/1.1 connections, one per request in flight (no HTTP/2,
/// no TLS). Prints progress to stderr and a summary (or --json) to stdout.
/// Exits 1 when more requests than --max-errors failed at the gRPC (HTTP)
/// level or timed out, or none completed; 2 on a bad flag.
struct Args {
    /// router ext_proc address, host:port (default: 127.0.0.1:50051)
    #[argh(option)]
    target: Option<String>,
    /// drive this HTTP endpoint instead (http://host:port/path), e.g. Envoy's listener; verdicts are the status and x-atenet-reason (default: none, ext_proc at --target)
    #[argh(option)]
    http: Option<String>,
    /// requests in flight at most (closed loop: exactly this many; open loop: a request due when all are taken waits for one, and goes late) (default: 16)
    #[argh(option, default = "16")]
    concurrency: usize,
    /// requests per second (open loop), each timed from its scheduled send; 0 runs a closed loop, each timed from its send (default: 0)
    #[argh(option, default = "0.0")]
    rate: f64,
    /// run this long (Go duration), unless --count is given (default: 10s)
    #[argh(option, default = "String::from(\"10s\")")]
    duration: String,
    /// stop after this many requests instead of a duration (default: none, --duration decides)
    #[argh(option)]
    count: Option<u64>,
    /// actors, comma-separated, with ranges: demo/actor-{0..63}; several atespaces (greedy/a-{0..99},polite/b-{0..9}) make a mix reported per atespace (default: demo/actor-{0..63})
    #[argh(option, default = "String::from(\"demo/actor-{0..63}\")")]
    actors: String,
    /// uniform, zipf, hot or round-robin (default: uniform)
    #[argh(option, default = "String::from(\"uniform\")")]
    distribution: String,
    /// zipf exponent (default: 1.1)
    #[argh(option, default = "1.1")]
    zipf_s: f64,
    /// share of requests for the first actor with --distribution hot (default: 0.9)
    #[argh(option, default = "0.9")]
    hot_fraction: f64,
    /// stream-hold mode: open N streams at once and hold them until each gets its verdict (default: none, a closed or open loop)
    #[argh(option)]
    hold: Option<u64>,
    /// send this grpc-timeout with every request (e.g. 300m) and report verdicts that came after it (default: none sent)
    #[argh(option)]
    grpc_timeout: Option<String>,
    /// cancel a request that has no verdict this long after its send (Go duration) and count it as client-timeout (default: 30s)
    #[argh(option, default = "String::from(\"30s\")")]
    request_timeout: String,
    /// exit 0 with up to this many requests failed at the gRPC level or timed out (default: 0)
    #[argh(option, default = "0")]
    max_errors: u64,
    /// print the summary as JSON (default: off)
    #[argh(switch)]
    json: bool,
    /// seconds between progress lines (0 silences them) (default: 1)
    #[argh(option, default = "1.0")]
    progress: f64,
}

fn target(args: &Args) -> Result<Target, String> {
    match (&args.target, &args.http) {
        (Some(_), Some(_)) => {
            Err("--target and --http exclude each other: one drives ext_proc, the other HTTP".into())
        }
        (_, Some(url)) => HttpTarget::parse(url).map(Target::Http).map_err(|e| format!("--http {e}")),
        (target, None) => {
            let target = target.as_deref().unwrap_or("127.0.0.1:50051");
            let addr: SocketAddr = target
                .to_socket_addrs()
                .map_err(|e| format!("--target {target:?}: {e}"))?
                .next()
                .ok_or_else(|| format!("--target {target:?} resolves to nothing"))?;
            Ok(Target::ExtProc(addr))
        }
    }
}

fn spec(args: &Args) -> Result<LoadSpec, String> {
    let target = target(args)?;
    // Over HTTP each request in flight is a thread and a connection.
    let max_in_flight = match target {
        Target::ExtProc(_) => MAX_IN_FLIGHT,
        Target::Http(_) => MAX_HTTP_IN_FLIGHT,
    };
    let actors = load::expand_actors(&args.actors).map_err(|e| format!("--actors: {e}"))?;
    // Over HTTP an actor is a header value: a control character would
    // end it (or the request head) early.
    if let (Target::Http(_), Some(bad)) = (&target, actors.iter().find(|a| a.chars().any(|c| c.is_control())))
    {
        return Err(format!("--actors: {bad:?} has a control character, which an HTTP header cannot carry"));
    }
    let distribution = match args.distribution.as_str() {
        "uniform" => Distribution::Uniform,
        "zipf" if args.zipf_s > 0.0 => Distribution::Zipf(args.zipf_s),
        "zipf" => return Err("--zipf-s must be positive".into()),
        "hot" if (0.0..=1.0).contains(&args.hot_fraction) => Distribution::Hot(args.hot_fraction),
        "hot" => return Err("--hot-fraction must be in [0, 1]".into()),
        "round-robin" => Distribution::RoundRobin,
        other => {
            return Err(format!("--distribution must be uniform, zipf, hot or round-robin, got {other:?}"))
        }
    };
    let duration = godur::parse(&args.duration).map_err(|e| format!("--duration: {e}"))?;
    let (concurrency, stop, rate) = match args.hold {
        Some(n) if n > max_in_flight as u64 => {
            return Err(format!("--hold must be at most {max_in_flight} streams, got {n}"))
        }
        Some(n) if n > 0 => (n as usize, Stop::Count(n), None),
        Some(_) => return Err("--hold must be positive".into()),
        None => {
            if args.concurrency == 0 {
                return Err("--concurrency must be positive".into());
            }
            if args.concurrency > max_in_flight {
                return Err(format!(
                    "--concurrency must be at most {max_in_flight} requests in flight, got {}",
                    args.concurrency
                ));
            }
            let stop = match args.count {
                Some(n) => Stop::Count(n),
                None => Stop::After(duration.positive().ok_or("--duration must be positive")?),
            };
            if !(args.rate.is_finite() && args.rate >= 0.0) {
                return Err(format!(
                    "--rate must be a number of requests per second, 0 or more, got {}",
                    args.rate
                ));
            }
            let rate = (args.rate > 0.0).then_some(args.rate);
            (args.concurrency, stop, rate)
        }
    };
    let progress = match Duration::try_from_secs_f64(args.progress) {
        Ok(every) if every.is_zero() => None,
        Ok(every) => Some(every),
        Err(_) => {
            return Err(format!("--progress must be a number of seconds, 0 or more, got {}", args.progress))
        }
    };
    let grpc_timeout = match &args.grpc_timeout {
        Some(value) => Some(CallerDeadline::parse(value).ok_or_else(|| {
            format!("--grpc-timeout {value:?}: want 1 to 8 digits and a unit H, M, S, m, u or n (e.g. 300m)")
        })?),
        None => None,
    };
    let request_timeout = godur::parse(&args.request_timeout)
        .map_err(|e| format!("--request-timeout: {e}"))?
        .positive()
        .ok_or("--request-timeout must be positive")?;
    Ok(LoadSpec {
        target,
        concurrency,
        rate,
        stop,
        actors,
        distribution,
        progress,
        grpc_timeout,
        request_timeout,
    })
}

/// The command line, or how to exit without running. A flag argh cannot
/// parse exits 2 like the checks in [`spec`], so that 1 always means
/// requests failed.
fn args() -> Result<Args, ExitCode> {
    let argv = utf8_args(std::env::args_os().skip(1)).map_err(|e| {
        eprintln!("parkload: {e}");
        ExitCode::from(2)
    })?;
    let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
    Args::from_args(&["parkload"], &argv).map_err(|exit| match exit.status {
        Ok(()) => process::print(&format!("{}\n", exit.output)),
        Err(()) => {
            eprintln!("parkload: {}\nRun parkload --help for more information.", exit.output.trim());
            ExitCode::from(2)
        }
    })
}

fn main() -> ExitCode {
    let args = match args() {
        Ok(args) => args,
        Err(exit) => return exit,
    };
    let spec = match spec(&args) {
        Ok(spec) => spec,
        Err(e) => {
            eprintln!("parkload: {e}");
            return ExitCode::from(2);
        }
    };
    if let Some(n) = args.hold {
        eprintln!("parkload: holding {n} streams against {}", spec.target);
    }
    let report = load::run(&spec);
    let text = if args.json { format!("{}\n", report.json(&spec)) } else { report.summary(&spec) };
    if process::print(&text) == ExitCode::FAILURE {
        return ExitCode::FAILURE;
    }
    let errors = report.errors();
    if errors > args.max_errors {
        eprintln!(
            "parkload: {errors} requests failed ({} errors or timeouts), more than --max-errors {}",
            match spec.target {
                Target::ExtProc(_) => "gRPC",
                Target::Http(_) => "HTTP",
            },
            args.max_errors
        );
        return ExitCode::FAILURE;
    }
    if report.completed == 0 {
        eprintln!("parkload: no request completed");
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}
