//! Graceful drain on SIGTERM or SIGINT (B41, B43-B45, B85).
//!
//! The order matters. Readiness flips first, the router's and Envoy's
//! (`/healthcheck/fail`) together, so a load balancer polling either gets
//! the whole drain delay to notice, while ext_proc keeps serving. Then
//! Envoy closes its listeners (`/drain_listeners`: measured on Envoy 1.40,
//! `?graceful&skip_exit` leaves them accepting for good), and the router
//! waits (bounded) until Envoy's downstream connections are gone. Only then
//! does ext_proc stop accepting streams, and in-flight ones, parked
//! requests included, get up to the drain timeout, which is at least the
//! park budget, so a parked request still gets a normal verdict (B44). A
//! marker file tells Envoy's preStop hook that it may exit. A second
//! signal skips every remaining wait.
//!
//! A fleet router (`--envoys` above 1, B85) belongs to no Envoy: its drain
//! flips readiness and the gRPC health answer, so that every Envoy's
//! health check takes it out of rotation within the drain delay, and then
//! stops ext_proc as above, without a word to any Envoy's admin and without
//! waiting for Envoy's client connections.

use std::fs;
use std::io::{self, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use crossbeam_channel::Receiver;

use crate::cli::config::Config;

/// What a drain stops: the running router (`router::Router`), named by
/// what the drain asks of it, so that the lifecycle stays below the
/// assembly.
pub trait Drained {
    /// Flips `/readyz` and the gRPC health service.
    fn set_ready(&self, ready: bool);
    /// Stops ext_proc within `timeout`: whether every stream finished, and
    /// how many were cut.
    fn stop<T>(self, timeout: Duration, interrupt: &Receiver<T>) -> (bool, usize);
}

/// What the drain does, from the effective configuration.
#[derive(Clone, Debug)]
pub struct DrainPlan {
    pub delay: Duration,
    /// Envoy's admin address (`host:port`), when Envoy is to be drained.
    pub envoy_admin: Option<String>,
    /// Whether the router leaves a fleet: no Envoy is drained.
    pub fleet: bool,
    /// How long to wait for Envoy's downstream connections to close.
    pub envoy_window: Duration,
    /// How often to poll Envoy's stats.
    pub poll_every: Duration,
    /// How long in-flight ext_proc streams may take.
    pub timeout: Duration,
    pub marker: Option<PathBuf>,
}

/// What the final cancel, the listeners' stop and the marker can take past
/// the drain timeout.
const STOP_SLACK: Duration = Duration::from_secs(10);

impl DrainPlan {
    /// The longest the Envoy step can take: the window, plus the two POSTs
    /// and one last poll at their connect and answer timeouts.
    fn envoy_bound(&self) -> Duration {
        match self.envoy_admin {
            Some(_) => self.envoy_window + 3 * (ADMIN_CONNECT_TIMEOUT + ADMIN_TIMEOUT),
            None => Duration::ZERO,
        }
    }

    /// The longest the ext_proc step and what follows can take.
    fn stop_bound(&self) -> Duration {
        self.timeout + STOP_SLACK
    }

    /// The longest the whole drain can take.
    pub fn bound(&self) -> Duration {
        self.delay + self.envoy_bound() + self.stop_bound()
    }

    pub fn from_config(config: &Config) -> DrainPlan {
        let fleet = config.drain.is_fleet_router();
        DrainPlan {
            delay: config.drain.delay,
            // No Envoy belongs to a fleet router: draining one would take
            // its listeners from every other router's streams.
            envoy_admin: config.drain.envoy_admin_address.clone().filter(|_| !fleet),
            fleet,
            envoy_window: config.envoy_drain_window(),
            poll_every: Duration::from_millis(250),
            timeout: config.drain.timeout,
            marker: config.drain.complete_file.clone(),
        }
    }
}

/// How Envoy's part of the drain went.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EnvoyDrain {
    /// No admin address configured.
    Disabled,
    /// A fleet router drains no Envoy.
    Fleet,
    /// Every non-admin downstream connection closed.
    Drained,
    /// The admin API did not answer: Envoy is gone, nothing to wait for.
    Unreachable,
    /// The window passed with connections still open.
    WindowElapsed,
    /// A second signal cut the wait short.
    Skipped,
}

impl std::fmt::Display for EnvoyDrain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            EnvoyDrain::Disabled => "not drained (no --envoy-admin-address)",
            EnvoyDrain::Fleet => "not drained (a fleet router, --envoys above 1: it only leaves the fleet)",
            EnvoyDrain::Drained => "drained",
            EnvoyDrain::Unreachable => "unreachable (gone)",
            EnvoyDrain::WindowElapsed => "still had connections when the window passed",
            EnvoyDrain::Skipped => "not drained (a second signal skipped it)",
        })
    }
}

/// What happened, for the log and for tests.
#[derive(Clone, Debug)]
pub struct DrainReport {
    pub envoy: EnvoyDrain,
    /// Whether every ext_proc stream finished within the timeout.
    pub streams_finished: bool,
    /// Streams cut by the final cancel.
    pub cancelled: usize,
    /// Whether a second signal, not the drain timeout, ended the wait for
    /// streams (or skipped it).
    pub interrupted: bool,
    pub marker_written: bool,
}

/// Removes a drain-complete marker left by an earlier run (B45), so Envoy's
/// preStop hook does not see this run as already drained.
pub fn remove_stale_marker(path: &Path) -> io::Result<bool> {
    match fs::remove_file(path) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

/// Runs the drain. `interrupt` delivers further stop signals (SIGTERM or
/// SIGINT, B94); the first one received skips every remaining wait.
pub fn drain<T>(router: impl Drained, plan: &DrainPlan, interrupt: &Receiver<T>) -> DrainReport {
    drain_reporting(router, plan, interrupt, &|_| {})
}

/// As [`drain`], telling `progress` after each step how long the rest of the
/// drain can take at most (for systemd's stop timeout, B64; the bound of the
/// whole drain is [`DrainPlan::bound`]).
pub fn drain_reporting<T>(
    router: impl Drained,
    plan: &DrainPlan,
    interrupt: &Receiver<T>,
    progress: &dyn Fn(Duration),
) -> DrainReport {
    router.set_ready(false);
    // Envoy's health check fails from now on: its `/ready` answers 503 and,
    // measured on 1.40, every response closes its connection (HTTP/1.1
    // `connection: close`, HTTP/2 GOAWAY), while its listeners still accept.
    let envoy_gone =
        plan.envoy_admin.as_deref().is_some_and(|admin| post(admin, "/healthcheck/fail").is_err());
    let next = if plan.envoy_admin.is_some() { "draining Envoy" } else { "stopping ext_proc" };
    log::info!(
        "drain: not ready (health NOT_SERVING); waiting {} before {next}",
        crate::cli::godur::format(plan.delay)
    );
    let mut skipping = interrupt.recv_timeout(plan.delay).is_ok();
    progress(plan.envoy_bound() + plan.stop_bound());
    let envoy = match (&plan.envoy_admin, envoy_gone, skipping) {
        (None, _, _) if plan.fleet => EnvoyDrain::Fleet,
        (None, _, _) => EnvoyDrain::Disabled,
        (Some(_), true, _) => EnvoyDrain::Unreachable,
        (Some(_), false, true) => EnvoyDrain::Skipped,
        (Some(admin), false, false) => drain_envoy(admin, plan, interrupt),
    };
    skipping |= envoy == EnvoyDrain::Skipped;
    progress(plan.stop_bound());
    log::info!("drain: Envoy {envoy}; stopping ext_proc (up to {})", crate::cli::godur::format(plan.timeout));
    let timeout = if skipping { Duration::ZERO } else { plan.timeout };
    let started = std::time::Instant::now();
    let (streams_finished, cancelled) = router.stop(timeout, interrupt);
    // A wait that ended before its timeout without every stream finished
    // was ended by a signal; one skipped by a signal was too.
    let interrupted = skipping || (!streams_finished && started.elapsed() < timeout);
    let marker_written = match &plan.marker {
        Some(path) => match write_marker(path) {
            Ok(()) => true,
            Err(e) => {
                log::error!("drain: cannot write {}: {e}", path.display());
                false
            }
        },
        None => false,
    };
    DrainReport { envoy, streams_finished, cancelled, interrupted, marker_written }
}

/// Envoy's admin could not be connected to: Envoy is gone.
struct EnvoyGone;

/// POSTs `path`.
///
/// Only a refused or unroutable connection means Envoy is gone. An error
/// answer or a slow one comes from an Envoy that is still there, so the
/// drain goes on: skipping the wait would cut its connections (B43).
fn post(admin: &str, path: &str) -> Result<(), EnvoyGone> {
    match admin_request(admin, "POST", path) {
        Ok(_) => Ok(()),
        Err(AdminError::Unreachable(e)) => {
            log::warn!("drain: Envoy admin {admin} unreachable ({e}); treating Envoy as gone");
            Err(EnvoyGone)
        }
        Err(AdminError::Failed(e)) => {
            log::warn!("drain: Envoy admin {admin}: POST {path} failed ({e}); draining on");
            Ok(())
        }
    }
}

fn drain_envoy<T>(admin: &str, plan: &DrainPlan, interrupt: &Receiver<T>) -> EnvoyDrain {
    // Closes every listener at once: new connections are refused, while
    // connections already open are served and closed as they finish.
    if post(admin, "/drain_listeners").is_err() {
        return EnvoyDrain::Unreachable;
    }
    let deadline = Instant::now() + plan.envoy_window;
    let mut poll_failed = false;
    loop {
        match admin_request(admin, "GET", "/stats?filter=downstream_cx_active") {
            Ok(stats) if active_connections(&stats) == 0 => return EnvoyDrain::Drained,
            Ok(_) => {}
            Err(AdminError::Unreachable(e)) => {
                log::warn!("drain: Envoy admin {admin} stopped answering ({e}); treating Envoy as gone");
                return EnvoyDrain::Unreachable;
            }
            Err(AdminError::Failed(e)) => {
                if !std::mem::replace(&mut poll_failed, true) {
                    log::warn!(
                        "drain: Envoy admin {admin}: reading its connections failed ({e}); polling on"
                    );
                }
            }
        }
        let now = Instant::now();
        if now >= deadline {
            return EnvoyDrain::WindowElapsed;
        }
        if interrupt.recv_timeout(plan.poll_every.min(deadline - now)).is_ok() {
            return EnvoyDrain::Skipped;
        }
    }
}

/// Why a request to Envoy's admin API got no usable answer.
#[derive(Debug)]
enum AdminError {
    /// No connection could be made: nothing listens there any more.
    Unreachable(io::Error),
    /// Connected, but the answer was an error, malformed or too slow.
    Failed(io::Error),
}

/// Sums the `downstream_cx_active` gauges of every listener but those that
/// carry no client traffic: the admin's (whose connection is this very
/// poll) and the generated health-check and metrics listeners' (a kubelet
/// probe or a scrape must not hold the drain open).
pub fn active_connections(stats: &str) -> u64 {
    let ignored =
        ["admin", crate::envoy::bootstrap::HEALTH_STAT_PREFIX, crate::envoy::bootstrap::STATS_STAT_PREFIX];
    stats
        .lines()
        .filter_map(|line| line.split_once(':'))
        .filter(|(name, _)| {
            name.trim().ends_with("downstream_cx_active") && !ignored.iter().any(|i| name.contains(i))
        })
        .filter_map(|(_, value)| value.trim().parse::<u64>().ok())
        // A sum that wrapped could read as no connection at all.
        .fold(0, u64::saturating_add)
}

/// One HTTP/1.1 request to Envoy's admin API; the body on a 2xx answer.
/// `localhost` may resolve to IPv6 or IPv4: each address is tried in turn.
fn admin_request(admin: &str, method: &str, path: &str) -> Result<String, AdminError> {
    let addrs: Vec<_> = admin.to_socket_addrs().map_err(AdminError::Unreachable)?.collect();
    let mut last = io::Error::new(io::ErrorKind::NotFound, format!("{admin} resolves to nothing"));
    for addr in addrs {
        match TcpStream::connect_timeout(&addr, ADMIN_CONNECT_TIMEOUT) {
            Ok(stream) => return exchange(stream, admin, method, path).map_err(AdminError::Failed),
            Err(e) => last = e,
        }
    }
    Err(AdminError::Unreachable(last))
}

fn exchange(mut stream: TcpStream, admin: &str, method: &str, path: &str) -> io::Result<String> {
    // The whole exchange has one deadline (B43: 2 s): a read timeout alone would let
    // an answer that trickles in hold the drain for as long as it trickles.
    let deadline = Instant::now() + ADMIN_TIMEOUT;
    stream.set_write_timeout(Some(ADMIN_TIMEOUT))?;
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: {admin}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    )?;
    // Envoy's stats answer is small; a bound keeps a confused peer from
    // growing this without limit.
    let mut response = Vec::new();
    let mut chunk = [0; 8192];
    while (response.len() as u64) < MAX_ADMIN_ANSWER {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("{method} {path}: no whole answer within {ADMIN_TIMEOUT:?}"),
            ));
        }
        stream.set_read_timeout(Some(left))?;
        match stream.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => response.extend_from_slice(&chunk[..n]),
            // A read timed out (Linux says WouldBlock): the deadline, above.
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::Interrupted | io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) => {}
            Err(e) => return Err(e),
        }
    }
    response.truncate(MAX_ADMIN_ANSWER as usize);
    let text = String::from_utf8_lossy(&response);
    let status: u16 = text.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    if !(200..300).contains(&status) {
        return Err(io::Error::other(format!("{method} {path}: HTTP {status}")));
    }
    Ok(text.split_once("\r\n\r\n").map(|(_, body)| body.to_string()).unwrap_or_default())
}

/// How long connecting to the admin API may take.
const ADMIN_CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// How long one admin request may take to be written and answered.
const ADMIN_TIMEOUT: Duration = Duration::from_secs(2);
const MAX_ADMIN_ANSWER: u64 = 4 * 1024 * 1024;

/// Writes the marker: an RFC 3339 UTC time and a newline, parents created.
fn write_marker(path: &Path) -> io::Result<()> {
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        fs::create_dir_all(parent)?;
    }
    fs::write(path, format!("{}\n", crate::telemetry::logging::rfc3339(SystemTime::now())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_non_admin_active_connections() {
        let stats = "http.admin.downstream_cx_active: 1\n\
                     http.ingress.downstream_cx_active: 2\n\
                     listener.0.0.0.0_8080.downstream_cx_active: 3\n\
                     listener.admin.downstream_cx_active: 1\n\
                     http.atenet_health.downstream_cx_active: 4\n\
                     listener.atenet_stats.downstream_cx_active: 2\n\
                     http.ingress.downstream_cx_total: 40\n";
        assert_eq!(active_connections(stats), 5);
        assert_eq!(active_connections(""), 0);
        let wrapping = format!("a.downstream_cx_active: {}\nb.downstream_cx_active: 1\n", u64::MAX);
        assert_eq!(active_connections(&wrapping), u64::MAX, "a sum that wraps is no drained Envoy");
    }

    #[test]
    fn b43_an_admin_answer_that_trickles_in_fails_within_2_s() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let admin = listener.local_addr().unwrap().to_string();
        std::thread::spawn(move || {
            let (mut peer, _) = listener.accept().unwrap();
            let _ = peer.write_all(b"HTTP/1.1 200 OK\r\n\r\n");
            // A byte every 100 ms: each read succeeds, the answer never ends.
            while peer.write_all(b"x").is_ok() {
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        let (tx, rx) = crossbeam_channel::bounded(1);
        std::thread::spawn(move || {
            let _ = tx.send(admin_request(&admin, "GET", "/stats"));
        });
        // Without the deadline the request reads for as long as the peer
        // writes: forever here.
        let answer = rx.recv_timeout(Duration::from_secs(60)).expect("the request ends");
        assert!(
            matches!(answer, Err(AdminError::Failed(ref e)) if e.kind() == io::ErrorKind::TimedOut),
            "{answer:?}"
        );
    }

    #[test]
    fn b43_marker_has_rfc3339_time_and_parents() {
        let dir = std::env::temp_dir().join(format!("atenet-marker-{}", std::process::id()));
        let path = dir.join("nested/drain-complete");
        write_marker(&path).unwrap();
        let text = fs::read_to_string(&path).unwrap();
        assert!(text.ends_with("Z\n") && text.len() == "2026-11-30T00:27:18.123Z\n".len(), "{text:?}");
        assert!(remove_stale_marker(&path).unwrap(), "B45");
        assert!(!remove_stale_marker(&path).unwrap());
        fs::remove_dir_all(dir).unwrap();
    }
}
