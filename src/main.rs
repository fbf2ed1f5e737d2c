//! The `atenet-router` command.

use std::process::ExitCode;

use argh::FromArgs;
use atenet_router::config::{Config, ServeArgs};
use atenet_router::router::Router;
use atenet_router::{godur, info, log};
use signal_hook::consts::{SIGINT, SIGTERM};
use signal_hook::iterator::Signals;

#[derive(FromArgs)]
/// Envoy ext_proc router that resumes actors through ateapi and parks
/// requests through transient worker-pool saturation.
struct Cli {
    #[argh(subcommand)]
    command: Command,
}

#[derive(FromArgs)]
#[argh(subcommand)]
enum Command {
    Serve(ServeArgs),
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let argv: Vec<&str> = args.iter().map(String::as_str).collect();
    let cli = match Cli::from_args(&["atenet-router"], argv.get(1..).unwrap_or_default()) {
        Ok(cli) => cli,
        Err(exit) if exit.status.is_ok() => {
            print!("{}", exit.output);
            return ExitCode::SUCCESS;
        }
        Err(exit) => {
            eprintln!("invalid router configuration: {}", exit.output.trim());
            return ExitCode::from(2);
        }
    };
    match cli.command {
        Command::Serve(args) => serve(&args),
    }
}

fn serve(args: &ServeArgs) -> ExitCode {
    let config = match Config::from_args(args) {
        Ok(config) => config,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    log::set_level(config.log_level);
    // Register before opening sockets so an early SIGTERM is not lost.
    let mut signals = match Signals::new([SIGTERM, SIGINT]) {
        Ok(signals) => signals,
        Err(e) => {
            eprintln!("atenet-router: cannot install signal handlers: {e}");
            return ExitCode::FAILURE;
        }
    };
    let router = match Router::start(&config) {
        Ok(router) => router,
        Err(e) => {
            eprintln!("atenet-router: {e}");
            return ExitCode::FAILURE;
        }
    };
    info!(
        "atenet-router serving: ext_proc on {}, metrics on http://{}/metrics, ateapi at {}, parking {}",
        router.extproc_addr(),
        router.metrics_addr(),
        config.ateapi_address,
        if config.parking.enabled {
            format!("on (max {}, budget {})", config.parking.max, godur::format(config.parking.budget))
        } else {
            "off".to_string()
        }
    );
    let signal = signals.forever().next();
    info!("signal {signal:?} received: draining ext_proc for up to {}", godur::format(config.drain_timeout));
    let drained = router.stop(config.drain_timeout);
    info!("stopped ({})", if drained { "all streams finished" } else { "remaining streams cancelled" });
    ExitCode::SUCCESS
}
