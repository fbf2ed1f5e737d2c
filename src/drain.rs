//! Graceful drain on SIGTERM or SIGINT (B41, B43-B45).
//!
//! The order matters. Readiness flips first so the load balancer stops
//! sending new connections while ext_proc keeps serving; the drain delay
//! gives it time to notice. Envoy is then told to fail its health check and
//! drain its listeners, and the router waits (bounded) until Envoy's
//! downstream connections are gone. Only then does ext_proc stop accepting
//! streams, and in-flight ones, parked requests included, get up to the
//! drain timeout, which is at least the park budget, so a parked request
//! still gets a normal verdict (B44). A marker file tells Envoy's preStop
//! hook that it may exit. A second signal skips every remaining wait.

use std::fs;
use std::io::{self, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use crossbeam_channel::Receiver;

use crate::config::{Config, ENVOY_DRAIN_WINDOW};
use crate::router::Router;

/// What the drain does, from the effective configuration.
#[derive(Clone, Debug)]
pub struct DrainPlan {
    pub delay: Duration,
    /// Envoy's admin address (`host:port`), when Envoy is to be drained.
    pub envoy_admin: Option<String>,
    /// How long to wait for Envoy's downstream connections to close.
    pub envoy_window: Duration,
    /// How often to poll Envoy's stats.
    pub poll_every: Duration,
    /// How long in-flight ext_proc streams may take (B40).
    pub timeout: Duration,
    pub marker: Option<PathBuf>,
}

impl DrainPlan {
    pub fn from_config(config: &Config) -> DrainPlan {
        DrainPlan {
            delay: config.drain_delay,
            envoy_admin: config.envoy_admin_address.clone(),
            envoy_window: ENVOY_DRAIN_WINDOW,
            poll_every: Duration::from_millis(250),
            timeout: config.drain_timeout,
            marker: config.drain_complete_file.clone(),
        }
    }
}

/// How Envoy's part of the drain went.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EnvoyDrain {
    /// No admin address configured.
    Disabled,
    /// Every non-admin downstream connection closed.
    Drained,
    /// The admin API did not answer: Envoy is gone, nothing to wait for.
    Unreachable,
    /// The window passed with connections still open.
    WindowElapsed,
    /// A second signal cut the wait short.
    Skipped,
}

/// What happened, for the log and for tests.
#[derive(Clone, Debug)]
pub struct DrainReport {
    pub envoy: EnvoyDrain,
    /// Whether every ext_proc stream finished within the timeout.
    pub streams_finished: bool,
    /// Streams cut by the final cancel.
    pub cancelled: usize,
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

/// Runs the drain. `interrupt` delivers further signals; the first one
/// received skips every remaining wait.
pub fn drain(router: Router, plan: &DrainPlan, interrupt: &Receiver<()>) -> DrainReport {
    router.set_ready(false);
    crate::info!("drain: not ready; waiting {} before draining Envoy", crate::godur::format(plan.delay));
    let mut skipping = interrupt.recv_timeout(plan.delay).is_ok();
    let envoy = match (&plan.envoy_admin, skipping) {
        (None, _) => EnvoyDrain::Disabled,
        (Some(_), true) => EnvoyDrain::Skipped,
        (Some(admin), false) => drain_envoy(admin, plan, interrupt),
    };
    skipping |= envoy == EnvoyDrain::Skipped;
    crate::info!("drain: Envoy {envoy:?}; stopping ext_proc (up to {})", crate::godur::format(plan.timeout));
    let timeout = if skipping { Duration::ZERO } else { plan.timeout };
    let (streams_finished, cancelled) = router.stop(timeout, interrupt);
    let marker_written = match &plan.marker {
        Some(path) => match write_marker(path) {
            Ok(()) => true,
            Err(e) => {
                crate::error!("drain: cannot write {}: {e}", path.display());
                false
            }
        },
        None => false,
    };
    DrainReport { envoy, streams_finished, cancelled, marker_written }
}

fn drain_envoy(admin: &str, plan: &DrainPlan, interrupt: &Receiver<()>) -> EnvoyDrain {
    for path in ["/healthcheck/fail", "/drain_listeners?graceful&skip_exit"] {
        if let Err(e) = http_request(admin, "POST", path) {
            crate::warn!("drain: Envoy admin {admin} unreachable ({e}); treating Envoy as gone");
            return EnvoyDrain::Unreachable;
        }
    }
    let deadline = Instant::now() + plan.envoy_window;
    loop {
        match http_request(admin, "GET", "/stats?filter=downstream_cx_active") {
            Ok(stats) if active_connections(&stats) == 0 => return EnvoyDrain::Drained,
            Ok(_) => {}
            Err(e) => {
                crate::warn!("drain: Envoy admin {admin} stopped answering ({e}); treating Envoy as gone");
                return EnvoyDrain::Unreachable;
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

/// Sums the `downstream_cx_active` gauges of every listener but the admin
/// one (whose connection is this very poll).
pub fn active_connections(stats: &str) -> u64 {
    stats
        .lines()
        .filter_map(|line| line.split_once(':'))
        .filter(|(name, _)| name.trim().ends_with("downstream_cx_active") && !name.contains("admin"))
        .filter_map(|(_, value)| value.trim().parse::<u64>().ok())
        .sum()
}

/// One HTTP/1.1 request to Envoy's admin API; the body on a 2xx answer.
/// `localhost` may resolve to IPv6 or IPv4: each address is tried in turn.
fn http_request(admin: &str, method: &str, path: &str) -> io::Result<String> {
    let addrs: Vec<_> = admin.to_socket_addrs()?.collect();
    let mut last = io::Error::new(io::ErrorKind::NotFound, format!("{admin} resolves to nothing"));
    for addr in addrs {
        let mut stream = match TcpStream::connect_timeout(&addr, Duration::from_secs(1)) {
            Ok(stream) => stream,
            Err(e) => {
                last = e;
                continue;
            }
        };
        stream.set_read_timeout(Some(Duration::from_secs(2)))?;
        stream.set_write_timeout(Some(Duration::from_secs(2)))?;
        write!(
            stream,
            "{method} {path} HTTP/1.1\r\nHost: {admin}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        )?;
        let mut response = Vec::new();
        stream.read_to_end(&mut response)?;
        let text = String::from_utf8_lossy(&response);
        let status: u16 = text.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
        if !(200..300).contains(&status) {
            return Err(io::Error::other(format!("{method} {path}: HTTP {status}")));
        }
        return Ok(text.split_once("\r\n\r\n").map(|(_, body)| body.to_string()).unwrap_or_default());
    }
    Err(last)
}

/// Writes the marker: an RFC 3339 UTC time and a newline, parents created.
fn write_marker(path: &Path) -> io::Result<()> {
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        fs::create_dir_all(parent)?;
    }
    fs::write(path, format!("{}\n", crate::log::rfc3339(SystemTime::now())))
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
                     http.ingress.downstream_cx_total: 40\n";
        assert_eq!(active_connections(stats), 5);
        assert_eq!(active_connections(""), 0);
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
