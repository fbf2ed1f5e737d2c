//! Validation and the values derived from the flags (B37).
//!
//! Every flag ([`crate::cli::flags`]) is validated and normalised here, once,
//! before any socket opens; the rest of the router reads only the effective
//! [`Config`]. A bad value is an error naming the flag, printed as
//! `invalid router configuration: ...`, never a panic.
//!
//! [`Config`] is one type per component, each validating its own flags in
//! its own file: [`Ateapi`] (the control plane), [`ExtProc`] (the ext_proc
//! listener), [`Parking`], [`Drain`], [`EnvoyBootstrap`] (what only
//! `envoy-config` reads), [`Admin`] (the HTTP endpoints), [`Workers`] and
//! [`Telemetry`]. What one component takes from another is derived here, in
//! [`Config::from_args_for`] and the `derived_*` functions.

mod admin;
mod ateapi;
mod drain;
mod envoy;
mod extproc;
mod parking;
mod telemetry;
mod workers;

use std::net::SocketAddr;
use std::time::Duration;

pub use self::admin::Admin;
pub use self::ateapi::{Ateapi, AteapiTransport};
pub use self::drain::Drain;
pub use self::envoy::{EnvoyBootstrap, EnvoyRouterTls, EnvoyRouterTlsFlags, MIN_ENVOY_MAX_HEAP};
pub use self::extproc::{ExtProc, ExtprocListen, ExtprocTls, UnixSocket};
pub use self::parking::Parking;
pub use self::telemetry::{Telemetry, Tracing};
pub use self::workers::Workers;
use crate::cli::flags::{parse_flags, FlagsError, ServeArgs};
use crate::cli::values::invalid;
pub use crate::cli::values::{CidrRange, ConfigError};
use crate::parking::share::SharePolicy;

/// What the flags are validated for (B96): `serve` reaches ateapi and
/// needs its transport; `envoy-config` prints a bootstrap, which names no
/// ateapi setting, and so needs none.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Purpose {
    Serve,
    Bootstrap,
}

/// The effective configuration every component reads.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    pub ateapi: Ateapi,
    pub extproc: ExtProc,
    pub parking: Parking,
    pub drain: Drain,
    pub envoy: EnvoyBootstrap,
    pub admin: Admin,
    pub workers: Workers,
    pub telemetry: Telemetry,
}

/// The derived flight cap is never below this, so that a small lot (or none)
/// still leaves room for many actors resuming at once.
const MIN_FLIGHT_MAX: usize = 4096;

/// What the derived drain timeout allows past the budget, at least: room
/// for the last attempt's answer and the verdict's way back.
const DRAIN_SLACK: Duration = Duration::from_secs(15);

/// What Envoy already grants past the budget: its ext_proc message timeout
/// is budget + 5 s, so the router's own verdict always arrives first.
pub const MESSAGE_TIMEOUT_MARGIN: Duration = Duration::from_secs(5);

/// What the drain's Envoy window adds to Envoy's idle timeout.
/// Measured on 1.40: at its idle timeout a connection starts the connection
/// manager's drain and is closed its drain timeout (5 s) and about 1 s
/// later.
const ENVOY_WINDOW_SLACK: Duration = Duration::from_secs(10);

impl Config {
    /// Validates and normalises `args`: everything the router runs with is
    /// decided here, once.
    pub fn from_args(args: &ServeArgs) -> Result<Config, ConfigError> {
        Config::from_args_for(args, Purpose::Serve)
    }

    /// As [`Config::from_args`], for `purpose`: a bootstrap needs no ateapi
    /// transport, but every ateapi flag given is checked as `serve` checks
    /// it.
    ///
    /// The components are built in an order where each reads only those
    /// before it, and what it reads is passed in plainly:
    /// - the drain must outlast a parked caller's longest wait, the budget
    ///   and the late-serve limit;
    /// - ext_proc's circuit breaker must hold the lot, and its stream cap
    ///   the breaker of every Envoy the drain counts;
    /// - Envoy's admin, whose address the drain calls, must not share a
    ///   port with the bootstrap's listeners;
    /// - the router's own listeners, ext_proc's and the admin endpoints',
    ///   must not share one either.
    pub fn from_args_for(args: &ServeArgs, purpose: Purpose) -> Result<Config, ConfigError> {
        let parking = Parking::from_args(args)?;
        let ateapi = Ateapi::from_args(args, purpose)?;
        let drain = Drain::from_args(args, &parking)?;
        let extproc = ExtProc::from_args(args, &parking, drain.envoys)?;
        let admin = Admin::from_args(args)?;
        distinct_listeners(&[
            ("--extproc-address/--port-extproc", extproc.listen.tcp()),
            ("--metrics-listen-addr", Some(admin.metrics_addr)),
            ("--status-address/--status-port", admin.status_addr),
        ])?;
        let envoy = EnvoyBootstrap::from_args(args, drain.envoy_admin_port)?;
        if purpose == Purpose::Bootstrap && envoy.routers.is_empty() {
            envoy_beside_the_router(&envoy, &drain, &extproc, &admin)?;
        }
        Ok(Config {
            ateapi,
            extproc,
            parking,
            drain,
            envoy,
            admin,
            workers: Workers::from_args(args)?,
            telemetry: Telemetry::from_args(args)?,
        })
    }

    /// How long the drain waits for Envoy's client connections to close
    /// (B43 step 3, B76): every idle one is closed by Envoy's idle timeout
    /// within it, and every busy one by its next response.
    pub fn envoy_drain_window(&self) -> Duration {
        self.envoy.idle_timeout + ENVOY_WINDOW_SLACK
    }

    /// Envoy's ext_proc `message_timeout`: the budget plus a margin, so the
    /// router's 503 always beats Envoy's own timeout (envoy.md).
    pub fn message_timeout(&self) -> Duration {
        self.parking.budget + MESSAGE_TIMEOUT_MARGIN
    }

    /// Envoy's `max_message_timeout`, the ceiling for the late-serve
    /// override; zero (disabled) without late serve.
    pub fn max_message_timeout(&self) -> Duration {
        if self.parking.late_serve_limit.is_zero() {
            Duration::ZERO
        } else {
            self.parking.longest_wait()
        }
    }

    /// How long one connection attempt to ateapi (TCP and TLS handshake) may
    /// take: half the budget, within 1 s and gRPC's own 20 s, so that an
    /// attempt refused a connection still gets a verdict at the budget and
    /// the next one finds a channel trying again (B82).
    pub fn ateapi_connect_timeout(&self) -> Duration {
        (self.parking.budget / 2).clamp(Duration::from_secs(1), Duration::from_secs(20))
    }
}

// The defaults one setting takes from another, in one place: each applies
// when its flag is 0.

/// Envoy's ext_proc circuit breaker (B39): twice the lot, and at least
/// 1024, so that a full lot still leaves Envoy room for as many requests
/// on their first attempt.
fn derived_breaker(lot: usize) -> u64 {
    (lot as u64).saturating_mul(2).max(1024)
}

/// The flight cap (B58): four times the lot, at least [`MIN_FLIGHT_MAX`].
fn derived_flight_max(lot: usize) -> usize {
    lot.saturating_mul(4).max(MIN_FLIGHT_MAX)
}

/// The cap on open ext_proc streams (B74, B85): (envoys + 1) x the breaker.
/// Each Envoy holds at most its breaker open towards the router cluster,
/// and may send all of it to this router (hashing can put a hot set of
/// actors on one host); one more breaker is room for an Envoy restarting
/// beside its old self (a hot restart, a rolling one) and for streams
/// Envoy has reset that the router has not yet seen end. A sidecar's
/// router (one Envoy) gets 2 x the breaker.
fn derived_stream_cap(breaker: u64, envoys: u32) -> usize {
    usize::try_from(breaker.saturating_mul(u64::from(envoys) + 1)).unwrap_or(usize::MAX)
}

/// The drain timeout (B40): the budget, then the late-serve limit or
/// [`DRAIN_SLACK`], whichever is longer.
fn derived_drain_timeout(parking: &Parking) -> Duration {
    parking.budget + DRAIN_SLACK.max(parking.late_serve_limit)
}

/// One atespace's share of `whole` (B79, B80): 0 is half of it (at least
/// one), so that no atespace can take all of it; an explicit value is 1 up to
/// the whole.
fn share(flag: &str, value: i64, whole_flag: &str, whole: u64) -> Result<usize, ConfigError> {
    let n = match value {
        0 => (whole / 2).max(1),
        n if n > 0 && n as u64 <= whole => n as u64,
        n => {
            return Err(invalid(format!(
                "{flag} must be 0 (half of {whole_flag}) or in 1..={whole} ({whole_flag}), got {n}"
            )))
        }
    };
    Ok(usize::try_from(n).unwrap_or(usize::MAX))
}

/// `--flight-max-per-atespace` and `--extproc-max-requests-per-atespace`:
/// an explicit value caps an atespace; 0 is the work-conserving default,
/// half of the whole and more while an eighth of it stays free.
fn atespace_share(flag: &str, value: i64, whole_flag: &str, whole: u64) -> Result<SharePolicy, ConfigError> {
    let share = share(flag, value, whole_flag, whole)?;
    let whole = usize::try_from(whole).unwrap_or(usize::MAX);
    Ok(if value == 0 { SharePolicy::work_conserving(whole) } else { SharePolicy::capped(share, whole) })
}

/// The router's own listeners must not share a port: the second bind would
/// fail after validation, as a runtime error (B70). Port 0 (any free port)
/// never clashes.
fn distinct_listeners(listeners: &[(&str, Option<SocketAddr>)]) -> Result<(), ConfigError> {
    let overlap = |a: &SocketAddr, b: &SocketAddr| {
        a.port() != 0
            && a.port() == b.port()
            && (a.ip() == b.ip() || a.ip().is_unspecified() || b.ip().is_unspecified())
    };
    for (i, (flag, addr)) in listeners.iter().enumerate() {
        let Some(addr) = addr else { continue };
        for (other, other_addr) in &listeners[i + 1..] {
            if let Some(other_addr) = other_addr.filter(|b| overlap(addr, b)) {
                return Err(invalid(format!(
                    "{flag} ({addr}) and {other} ({other_addr}) would listen on the same port"
                )));
            }
        }
    }
    Ok(())
}

/// A bootstrap for one router on the loopback that drains its Envoy is
/// the Envoy's beside it, in one network namespace (the sidecar): none of
/// Envoy's ports may be one of the router's listeners', or one of the two
/// fails to bind (B132). A router elsewhere (`--routers`, or ext_proc off
/// the loopback, as in Compose), or one that drains no Envoy
/// (`--envoy-admin-address=`), may share port numbers with it.
fn envoy_beside_the_router(
    envoy: &EnvoyBootstrap,
    drain: &Drain,
    extproc: &ExtProc,
    admin: &Admin,
) -> Result<(), ConfigError> {
    let Some(extproc_addr) = extproc.listen.tcp().filter(|a| a.ip().is_loopback()) else { return Ok(()) };
    let Some(admin_address) = &drain.envoy_admin_address else { return Ok(()) };
    // Where the bootstrap binds Envoy's admin: the address's IP, or the
    // loopback for a name (B70 checked its form).
    let admin_host = admin_address.rsplit_once(':').map_or("", |(host, _)| host);
    let admin_ip = admin_host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .parse()
        .unwrap_or(std::net::IpAddr::from([127, 0, 0, 1]));
    let at = |port| Some(SocketAddr::new(envoy.listen_ip, port));
    let envoy_listeners = [
        ("--port-http", at(envoy.port_http)),
        ("--port-health", at(envoy.port_health)),
        ("--port-stats", at(envoy.port_stats)),
        ("--envoy-admin-address", Some(SocketAddr::new(admin_ip, drain.envoy_admin_port))),
    ];
    let router_listeners = [
        ("--extproc-address/--port-extproc", Some(extproc_addr)),
        ("--metrics-listen-addr", Some(admin.metrics_addr)),
        ("--status-address/--status-port", admin.status_addr),
    ];
    for envoy_listener in envoy_listeners {
        for router_listener in router_listeners {
            distinct_listeners(&[envoy_listener, router_listener])?;
        }
    }
    Ok(())
}

/// Parses `serve`'s flags from an argument list (without the program name
/// and subcommand), for tests and tools that build a config from strings.
pub fn parse_serve_args(args: &[&str]) -> Result<Config, ConfigError> {
    match parse_flags("serve", args) {
        Ok(flags) => Config::from_args(&flags),
        Err(FlagsError::Help(_)) => Err(invalid("--help is not a configuration")),
        Err(FlagsError::Invalid(e)) => Err(invalid(e)),
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::parking::UNPARKED_BUDGET;
    use super::*;

    /// `serve`'s flags, with `--ateapi-insecure` and `extra`.
    pub(super) fn parse(extra: &[&str]) -> Result<Config, ConfigError> {
        let mut args = vec!["--ateapi-insecure"];
        args.extend_from_slice(extra);
        parse_serve_args(&args)
    }

    pub(super) fn error(extra: &[&str]) -> String {
        parse(extra).unwrap_err().to_string()
    }

    #[test]
    fn defaults() {
        let c = parse(&[]).unwrap();
        assert_eq!(c.ateapi.address, "api.ate-system.svc:443");
        assert_eq!(c.extproc.listen, ExtprocListen::Tcp("127.0.0.1:50051".parse().unwrap()));
        assert_eq!(c.admin.metrics_addr, "0.0.0.0:9090".parse().unwrap());
        assert_eq!(
            c.admin.status_addr,
            Some("127.0.0.1:4040".parse().unwrap()),
            "the status page stays local"
        );
        assert!(c.parking.enabled);
        assert_eq!(c.parking.max, 1024);
        assert_eq!(c.parking.budget, Duration::from_secs(5));
        assert_eq!(c.parking.backoff.interval, Duration::from_millis(100));
        assert_eq!(c.parking.backoff.factor, 1.1);
        assert_eq!(c.parking.backoff.jitter, 0.1);
        assert_eq!(c.extproc.max_requests, 2048, "B39: 2 x 1024");
        assert_eq!(c.workers.port, 443);
        assert_eq!(c.drain.delay, Duration::from_secs(13));
        assert_eq!(c.drain.timeout, Duration::from_secs(35), "B40: 5s + max(15s, 30s late serve)");
        assert_eq!(c.parking.flight_max, 4096, "B58: max(4 x 1024, 4096)");
        assert_eq!(c.parking.max_per_atespace, 0, "B69: no per-atespace cap");
        assert!(c.parking.caller_deadlines, "B68: on by default");
        assert_eq!(c.parking.max_sheddable, 512, "B117: half the lot");
        assert_eq!(c.parking.fleet_size, 1, "B127: a router alone");
        assert_eq!(parse(&["--fleet-size", "3"]).unwrap().parking.fleet_size, 3);
        let sheddable = |args: &[&str]| parse(args).unwrap().parking.max_sheddable;
        assert_eq!(sheddable(&["--parked-request-max", "5"]), 3, "rounded up");
        assert_eq!(sheddable(&["--parked-request-max-sheddable", "0"]), 0, "sheddable requests never park");
        assert_eq!(sheddable(&["--parked-request-max-sheddable", "1024"]), 1024);
        let c = parse(&["--parked-request-max-per-atespace", "1024", "--caller-deadlines=false"]).unwrap();
        assert_eq!((c.parking.max_per_atespace, c.parking.caller_deadlines), (1024, false));
        assert_eq!(c.drain.envoy_admin_address.as_deref(), Some("localhost:9901"));
        assert_eq!(c.drain.complete_file, Some(PathBuf::from("/var/run/atenet/drain-complete")));
        assert_eq!(c.envoy.route_timeout, Duration::from_secs(300));
        assert_eq!(c.envoy_drain_window(), Duration::from_secs(85), "B76: idle timeout 75s + 10s");
    }

    #[test]
    fn b37_rejections_name_the_flag() {
        let cases: &[(&[&str], &str)] = &[
            (&["--parked-request-retry-factor", "0.5"], "--parked-request-retry-factor"),
            (&["--parked-request-dispatch", "fifo"], "--parked-request-dispatch"),
            (&["--fleet-size", "0"], "--fleet-size"),
            (&["--fleet-size", "1025"], "--fleet-size"),
            (&["--fleet-size", "-3"], "--fleet-size"),
            (&["--worker-networks", "10.0.0.0"], "--worker-networks"),
            (&["--worker-networks", "10.0.0.0/33"], "--worker-networks"),
            (&["--worker-networks", "fd00::/129"], "--worker-networks"),
            (&["--flight-max-per-atespace", "-1"], "--flight-max-per-atespace"),
            (&["--flight-max", "10", "--flight-max-per-atespace", "11"], "--flight-max-per-atespace"),
            (&["--extproc-max-requests-per-atespace", "-1"], "--extproc-max-requests-per-atespace"),
            (
                &["--extproc-max-requests", "2048", "--extproc-max-requests-per-atespace", "2049"],
                "--extproc-max-requests-per-atespace",
            ),
            (&["--parked-request-retry-factor", "-1"], "--parked-request-retry-factor"),
            (&["--parked-request-retry-jitter", "1"], "--parked-request-retry-jitter"),
            (&["--parked-request-retry-jitter", "-0.1"], "--parked-request-retry-jitter"),
            (&["--extproc-max-requests", "-1"], "--extproc-max-requests"),
            (&["--extproc-max-requests", "100", "--parked-request-max", "200"], "--extproc-max-requests"),
            (&["--drain-delay", "-1s"], "--drain-delay"),
            (&["--drain-timeout", "-1s"], "--drain-timeout"),
            (&["--drain-timeout", "3s"], "--drain-timeout"),
            (&["--drain-timeout", "34s"], "--drain-timeout"),
            (&["--parked-request-retry-factor", "101"], "--parked-request-retry-factor"),
            (&["--parked-request-retry-factor", "1e300"], "--parked-request-retry-factor"),
            (&["--parked-request-retry-factor", "NaN"], "--parked-request-retry-factor"),
            (&["--parked-request-retry-factor", "inf"], "--parked-request-retry-factor"),
            (&["--flight-max", "-1"], "--flight-max"),
            (&["--parked-request-max-per-atespace", "-1"], "--parked-request-max-per-atespace"),
            (&["--parked-request-max-per-atespace", "1025"], "--parked-request-max-per-atespace"),
            (
                &["--parked-request-max", "0", "--parked-request-max-per-atespace", "1"],
                "--parked-request-max-per-atespace",
            ),
            (&["--parked-request-max-sheddable", "-1"], "--parked-request-max-sheddable"),
            (&["--parked-request-max-sheddable", "1025"], "--parked-request-max-sheddable"),
            (
                &["--parked-request-max", "0", "--parked-request-max-sheddable", "1"],
                "--parked-request-max-sheddable",
            ),
            (&["--caller-deadlines", "maybe"], "--caller-deadlines"),
            (&["--port-health", "8080"], "--port-health"),
            (&["--port-stats", "9901"], "--port-stats"),
            (&["--port-stats", "0"], "--port-stats"),
            (&["--drain-delay", "99999999999999999999h"], "--drain-delay"),
            (&["--parked-request-budget", "3596s"], "--parked-request-budget"),
            (&["--parked-request-budget", "3571s"], "--parked-request-budget"),
            (&["--parked-request-budget", "2562047h", "--late-serve-limit", "0"], "--parked-request-budget"),
            (&["--parked-request-budget", "soon"], "--parked-request-budget"),
            (&["--port-extproc", "70000"], "--port-extproc"),
            (&["--port-extproc", "x"], "--port-extproc"),
            (&["--worker-port", "0"], "--worker-port"),
            (&["--metrics-listen-addr", "9090"], "--metrics-listen-addr"),
            (&["--log-level", "loud"], "--log-level"),
            (&["--log-format", "xml"], "--log-format"),
            (&["--ateapi-ca-file", "/ca.pem"], "--ateapi-insecure"),
            (&["--ateapi-token-file", "/token"], "--ateapi-token-file"),
            (&["--no-such-flag"], "--no-such-flag"),
        ];
        for (args, flag) in cases {
            let message = error(args);
            assert!(message.starts_with("invalid router configuration: "), "{message}");
            assert!(message.contains(flag), "{args:?}: {message}");
        }
    }

    #[test]
    fn flag_equals_value_form() {
        let c =
            parse_serve_args(&["--ateapi-insecure", "--parked-request-max=7", "--log-level=debug"]).unwrap();
        assert_eq!(c.parking.max, 7);
        assert_eq!(c.telemetry.log_level, log::LevelFilter::Debug);
        let c = parse_serve_args(&["--ateapi-insecure", "--envoy-admin-address="]).unwrap();
        assert_eq!(c.drain.envoy_admin_address, None, "an empty value after = is a value");
    }

    #[test]
    fn b39_b40_derivations() {
        let c = parse(&["--parked-request-max", "4000"]).unwrap();
        assert_eq!(c.extproc.max_requests, 8000);
        let c = parse(&["--parked-request-max", "10", "--extproc-max-requests", "10"]).unwrap();
        assert_eq!(c.extproc.max_requests, 10);
        let c = parse(&["--parked-request-budget", "30s"]).unwrap();
        assert_eq!(c.drain.timeout, Duration::from_secs(60), "B40: 30s + max(15s, 30s)");
        let c = parse(&["--parked-request-budget", "30s", "--late-serve-limit", "0"]).unwrap();
        assert_eq!(c.drain.timeout, Duration::from_secs(45), "B40: 30s + 15s without late serve");
        let c = parse(&["--parked-request-budget", "30s", "--late-serve-limit", "10s"]).unwrap();
        assert_eq!(c.drain.timeout, Duration::from_secs(45), "B40: 30s + max(15s, 10s)");
        let c = parse(&["--parked-request-budget", "30s", "--drain-timeout", "60s"]).unwrap();
        assert_eq!(c.drain.timeout, Duration::from_secs(60));
        let c =
            parse(&["--late-serve-limit", "0", "--parked-request-budget", "30s", "--drain-timeout", "31s"])
                .unwrap();
        assert_eq!(c.drain.timeout, Duration::from_secs(31));
        let c = parse(&["--parked-request-max", "5000"]).unwrap();
        assert_eq!(c.parking.flight_max, 20_000, "B58: 4 x the lot");
        assert_eq!(parse(&["--parked-request-max", "0"]).unwrap().parking.flight_max, 4096);
        assert_eq!(parse(&["--flight-max", "7"]).unwrap().parking.flight_max, 7);
    }

    #[test]
    fn b46_parking_off_accepts_any_breaker_and_short_drain() {
        let c = parse(&["--parked-request-max", "0", "--extproc-max-requests", "1", "--drain-timeout", "1s"])
            .unwrap();
        assert!(!c.parking.enabled);
        assert_eq!(c.parking.budget, UNPARKED_BUDGET, "B18: 15 s when disabled");
        assert_eq!(c.extproc.max_requests, 1);
        assert_eq!(c.drain.timeout, Duration::from_secs(1));
        assert!(!parse(&["--parked-request-max", "-3"]).unwrap().parking.enabled);
    }

    #[test]
    fn b79_b80_shares_default_to_half_and_take_1_to_the_whole() {
        let c = parse(&[]).unwrap();
        assert_eq!(
            (c.parking.flight_max_per_atespace, c.extproc.max_requests_per_atespace),
            (SharePolicy::work_conserving(4096), SharePolicy::work_conserving(2048)),
            "half, and more while an eighth stays free"
        );
        let c = parse(&["--flight-max", "1", "--extproc-max-requests", "1", "--parked-request-max", "0"])
            .unwrap();
        assert_eq!(
            (c.parking.flight_max_per_atespace.share, c.extproc.max_requests_per_atespace.share),
            (1, 1),
            "at least one"
        );
        let c = parse(&["--flight-max-per-atespace", "4096", "--extproc-max-requests-per-atespace", "7"])
            .unwrap();
        assert_eq!(
            (c.parking.flight_max_per_atespace, c.extproc.max_requests_per_atespace),
            (SharePolicy::capped(4096, 4096), SharePolicy::capped(7, 2048)),
            "an explicit share is a cap"
        );
    }
}
