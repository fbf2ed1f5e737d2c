//! The `atenet-router` command: `serve` and `envoy-config`.

use std::process::ExitCode;

use atenet_router::config::{parse_flags, Config, FlagsError};
use atenet_router::drain::{self, DrainPlan};
use atenet_router::router::Router;
use atenet_router::systemd::Notifier;
use atenet_router::{envoy, godur, logging, process, version};
use log::{debug, error, info, warn};
use signal_hook::consts::{SIGINT, SIGTERM};
use signal_hook::iterator::Signals;

const HELP: &str = "Usage: atenet-router <command> [<flags>]

Envoy ext_proc router that resumes actors through ateapi and parks requests
through transient worker-pool saturation.

Commands:
  serve         Run the router: the ext_proc server Envoy calls for every request.
  envoy-config  Print the Envoy v3 bootstrap (YAML) matching the same flags.
  version       Print the version and the git revision it was built from.

Both commands take the same flags; see `atenet-router serve --help`.
";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let command = args.first().map(String::as_str).unwrap_or("");
    let rest: Vec<&str> = args.iter().skip(1).map(String::as_str).collect();
    match command {
        "serve" | "envoy-config" => {}
        "help" | "--help" | "-h" => {
            print!("{HELP}");
            return ExitCode::SUCCESS;
        }
        "version" | "--version" | "-V" => {
            println!("{}", version::describe("atenet-router"));
            return ExitCode::SUCCESS;
        }
        "" => {
            eprint!("{HELP}");
            return ExitCode::from(2);
        }
        other => {
            eprintln!(
                "invalid router configuration: unknown command {other:?} (expected serve, envoy-config or version)"
            );
            return ExitCode::from(2);
        }
    }
    let config = match parse_flags(command, &rest).map_err(|e| match e {
        FlagsError::Help(text) => Ok(text),
        FlagsError::Invalid(e) => Err(e),
    }) {
        Ok(flags) => Config::from_args(&flags),
        Err(Ok(help)) => {
            print!("{help}");
            return ExitCode::SUCCESS;
        }
        Err(Err(e)) => Err(e),
    };
    let config = match config {
        Ok(config) => config,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    if command == "envoy-config" {
        print!("{}", envoy::bootstrap(&config));
        return ExitCode::SUCCESS;
    }
    serve(&config)
}

fn serve(config: &Config) -> ExitCode {
    logging::init(config.log_level, config.log_format);
    process::install_panic_policy();
    let flags: Vec<String> =
        config.effective_flags().iter().map(|(flag, value)| format!("{flag}={value}")).collect();
    debug!("effective flags: {}", flags.join(" "));
    match process::raise_fd_limit() {
        Ok((old, new)) if old != new => debug!("open-file limit raised from {old} to {new}"),
        Ok(_) => {}
        Err(e) => warn!("cannot raise the open-file limit: {e}"),
    }
    // Registered before any socket opens so an early SIGTERM is not lost.
    let mut signals = match Signals::new([SIGTERM, SIGINT]) {
        Ok(signals) => signals,
        Err(e) => {
            error!("atenet-router: cannot install signal handlers: {e}");
            return ExitCode::FAILURE;
        }
    };
    if let Some(marker) = &config.drain_complete_file {
        match drain::remove_stale_marker(marker) {
            Ok(true) => info!("removed stale drain marker {}", marker.display()),
            Ok(false) => {}
            Err(e) => warn!("cannot remove stale drain marker {}: {e}", marker.display()),
        }
    }
    let router = match Router::start(config) {
        Ok(router) => router,
        Err(e) => {
            error!("atenet-router: {e}");
            return ExitCode::FAILURE;
        }
    };
    let status = router.status_addr().map_or("disabled".to_string(), |a| format!("http://{a}/statusz"));
    info!(
        "{} serving: ext_proc on {}, metrics on http://{}/metrics, status {status}, ateapi at {}, parking {}",
        version::describe("atenet-router"),
        router.extproc_addr(),
        router.metrics_addr(),
        config.ateapi_address,
        if config.parking.enabled {
            format!("on (max {}, budget {})", config.parking.max, godur::format(config.parking.budget))
        } else {
            "off".to_string()
        }
    );
    // Every listener is bound and serving: only now is the unit started.
    let systemd = Notifier::from_env();
    systemd.ready(&format!("serving ext_proc on {}", router.extproc_addr()));
    let (signal_tx, signal_rx) = crossbeam_channel::unbounded();
    let forward = move || {
        for signal in signals.forever() {
            if signal_tx.send(signal).is_err() {
                return;
            }
        }
    };
    if let Err(e) = std::thread::Builder::new().name("atenet-signals".into()).spawn(forward) {
        error!("atenet-router: cannot start the signal thread: {e}");
        return ExitCode::FAILURE;
    }
    let Ok(signal) = signal_rx.recv() else {
        return ExitCode::FAILURE;
    };
    let plan = DrainPlan::from_config(config);
    systemd.stopping(plan.bound());
    info!("signal {signal} received: draining (a second signal skips the waits)");
    let (interrupt_tx, interrupt_rx) = crossbeam_channel::bounded(1);
    // The drain goes on without it: a second signal then just does not skip.
    let _ = std::thread::Builder::new().name("atenet-signals-2".into()).spawn(move || {
        if signal_rx.recv().is_ok() {
            let _ = interrupt_tx.send(());
        }
    });
    let report = drain::drain_reporting(router, &plan, &interrupt_rx, &|left| systemd.extend(left));
    info!(
        "drain complete: Envoy {:?}, ext_proc {}, marker {}",
        report.envoy,
        if report.streams_finished {
            "finished".to_string()
        } else {
            format!("cut {} streams at the timeout", report.cancelled)
        },
        if report.marker_written { "written" } else { "not written" }
    );
    ExitCode::SUCCESS
}
