//! The `atenet-router` command: `serve`, `envoy-config` and `version`.

use std::process::ExitCode;

use atenet_router::cli::command::{parse_command, utf8_args, Command, HELP};
use atenet_router::cli::config::{Config, ConfigError};
use atenet_router::cli::godur;
use atenet_router::envoy::bootstrap;
use atenet_router::lifecycle::drain::{self, DrainPlan};
use atenet_router::lifecycle::handover::{self, NotServing, Successor};
use atenet_router::lifecycle::process;
use atenet_router::lifecycle::signals::Signals;
use atenet_router::lifecycle::systemd::Notifier;
use atenet_router::router::Router;
use atenet_router::telemetry::{logging, version};
use log::{debug, error, info, warn};

/// Exit status for a configuration the router refuses: systemd does not
/// restart on it (B64).
const INVALID_CONFIGURATION: u8 = 2;

fn main() -> ExitCode {
    let args = match utf8_args(std::env::args_os().skip(1)) {
        Ok(args) => args,
        Err(e) => {
            eprintln!("{}", ConfigError::new(e));
            return ExitCode::from(INVALID_CONFIGURATION);
        }
    };
    match parse_command(&args) {
        Ok(Command::Serve(config)) => serve(&config),
        Ok(Command::EnvoyConfig(config)) => match bootstrap::write_sds_files(&config) {
            Ok(written) => {
                for path in written {
                    eprintln!("envoy-config: wrote {}", path.display());
                }
                process::print(&bootstrap::bootstrap(&config))
            }
            Err(e) => {
                eprintln!("envoy-config: cannot write the SDS files: {e}");
                ExitCode::FAILURE
            }
        },
        Ok(Command::Help(text)) => process::print(&text),
        Ok(Command::Version) => process::print(&format!("{}\n", version::describe("atenet-router"))),
        Ok(Command::Usage) => {
            eprint!("{HELP}");
            ExitCode::from(INVALID_CONFIGURATION)
        }
        Err(e) => {
            eprintln!("{e}");
            ExitCode::from(INVALID_CONFIGURATION)
        }
    }
}

/// How long a successor may take to bind its listeners (B75).
const SUCCESSOR_PATIENCE: std::time::Duration = std::time::Duration::from_secs(30);

/// Starts the successor and waits until it serves: its pid, or why not. A
/// SIGTERM or SIGINT on `stops` ends the wait at once (B94).
fn hand_over(
    exe: Result<&std::path::Path, &std::io::Error>,
    args: &[std::ffi::OsString],
    config: &Config,
    stops: &crossbeam_channel::Receiver<i32>,
) -> Result<u32, NotServing> {
    if config.extproc.listen.tcp().is_some_and(|addr| addr.port() == 0) {
        return Err(NotServing::Failed(
            "--port-extproc 0: a successor would listen on another port than Envoy's".into(),
        ));
    }
    let exe = exe.map_err(|e| NotServing::Failed(format!("cannot name this binary: {e}")))?;
    info!("handover: starting {} as this router's successor", exe.display());
    let successor = Successor::start(exe, args)
        .map_err(|e| NotServing::Failed(format!("cannot start {}: {e}", exe.display())))?;
    successor.wait_ready(SUCCESSOR_PATIENCE, stops)
}

fn serve(config: &Config) -> ExitCode {
    logging::init(config.telemetry.log_level, config.telemetry.log_format);
    process::install_panic_policy();
    match process::raise_fd_limit() {
        Ok((old, new)) if old != new => debug!("open-file limit raised from {old} to {new}"),
        Ok(_) => {}
        Err(e) => warn!("cannot raise the open-file limit: {e}"),
    }
    // Registered before any socket opens so an early SIGTERM is not lost.
    let signals = match Signals::install() {
        Ok(signals) => signals,
        Err(e) => {
            error!("atenet-router: cannot install signal handlers: {e}");
            return ExitCode::FAILURE;
        }
    };
    if let Some(marker) = &config.drain.complete_file {
        match drain::remove_stale_marker(marker) {
            Ok(true) => info!("removed stale drain marker {}", marker.display()),
            Ok(false) => {}
            Err(e) => warn!("cannot remove stale drain marker {}: {e}", marker.display()),
        }
    }
    // The binary a handover starts: the path this one was started from,
    // read now, as /proc/self/exe names a replaced file "(deleted)".
    let exe = std::env::current_exe();
    let args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    let started =
        if handover::is_successor() { Router::start_successor(config) } else { Router::start(config) };
    let router = match started {
        Ok(router) => router,
        // A bad value found only now (a credential file) reads as one the
        // flags' check found (B37): the same prefix, the same status.
        Err(e) if e.is_configuration() => {
            error!("invalid router configuration: {e}");
            return ExitCode::from(INVALID_CONFIGURATION);
        }
        Err(e) => {
            error!("atenet-router: {e}");
            return ExitCode::FAILURE;
        }
    };
    let status = router.status_addr().map_or("disabled".to_string(), |a| format!("http://{a}/statusz"));
    info!(
        "{} serving: ext_proc on {}, metrics on http://{}/metrics, status {status}, ateapi at {}, parking {}",
        version::describe("atenet-router"),
        router.extproc(),
        router.metrics_addr(),
        config.ateapi.address,
        if config.parking.enabled {
            format!("on (max {}, budget {})", config.parking.max, godur::format(config.parking.budget))
        } else {
            "off".to_string()
        }
    );
    // Every listener is bound and serving: only now is the unit started.
    let systemd = Notifier::from_env();
    systemd.ready(&format!("serving ext_proc on {}", router.extproc()));
    handover::announce_ready();
    let signal = loop {
        crossbeam_channel::select! {
            recv(signals.stops) -> signal => match signal {
                Ok(signal) => break signal,
                Err(_) => return ExitCode::FAILURE,
            },
            recv(signals.handovers) -> handover => {
                if handover.is_err() {
                    return ExitCode::FAILURE;
                }
                router.lift_steering();
                router.keep_socket_name();
                match hand_over(exe.as_deref(), &args, config, &signals.stops) {
                    Ok(pid) => {
                        signals.handed_over();
                        info!("handover: successor {pid} serves; finishing the streams this router holds");
                        let (finished, cut) = router.hand_over(config.drain.timeout, &signals.stops);
                        info!(
                            "handover complete: {}",
                            if finished { "every stream finished".to_string() } else { format!("{cut} streams cut") }
                        );
                        return ExitCode::SUCCESS;
                    }
                    Err(NotServing::Failed(why)) => {
                        router.reclaim_socket_name();
                        warn!("handover refused: {why}; this router serves on");
                        signals.serving();
                    }
                    Err(NotServing::Stopped(signal)) => {
                        router.reclaim_socket_name();
                        warn!(
                            "handover refused: signal {signal} received while the successor started; \
                             its process group killed"
                        );
                        break signal;
                    }
                }
            }
        }
    };
    let plan = DrainPlan::from_config(config);
    systemd.stopping(plan.bound());
    info!("signal {signal} received: draining (a second SIGTERM or SIGINT skips the waits)");
    let report = drain::drain_reporting(router, &plan, &signals.stops, &|left| systemd.extend(left));
    info!(
        "drain complete: Envoy {}, ext_proc {}, marker {}",
        report.envoy,
        if report.interrupted {
            format!("cut short by a second signal ({} streams cut)", report.cancelled)
        } else if report.streams_finished {
            "finished".to_string()
        } else {
            format!("cut {} streams at the drain timeout", report.cancelled)
        },
        if report.marker_written { "written" } else { "not written" }
    );
    ExitCode::SUCCESS
}
