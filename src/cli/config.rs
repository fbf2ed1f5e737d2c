//! Validation and the values derived from the flags (B37-B40, B46, B58).
//!
//! Every flag ([`crate::cli::flags`]) is validated and normalised here, once,
//! before any socket opens; the rest of the router reads only the effective
//! [`Config`]. A bad value is an error naming the flag, printed as
//! `invalid router configuration: ...`, never a panic.

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use crate::cli::flags::ServeArgs;
use crate::cli::godur;
use crate::cli::size;
use crate::cli::values::{
    cidr_list, duration, group_id, invalid, listen_addr, listen_port, non_empty, non_negative, port,
    socket_addr,
};
pub use crate::cli::values::{CidrRange, ConfigError};
use crate::parking::backoff::{BackoffPolicy, Dispatch};
use crate::parking::share::SharePolicy;

/// The resume budget when parking is disabled: long enough to ride out
/// concurrent-resume conflicts (B18, B22).
pub const UNPARKED_BUDGET: Duration = Duration::from_secs(15);

/// How the router reaches ateapi.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AteapiTransport {
    /// Plaintext (`--ateapi-insecure`).
    Insecure,
    /// TLS verified against `ca_file`, optionally with a client bundle.
    Tls { ca_file: PathBuf, client_cert: Option<PathBuf>, server_name: Option<String> },
}

/// The ext_proc listener's TLS files (B86).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExtprocTls {
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
    /// With it, only clients with a certificate these CAs signed get in.
    pub client_ca_file: Option<PathBuf>,
}

/// Where the ext_proc server listens (B98).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ExtprocListen {
    /// A TCP address: `--extproc-address` and `--port-extproc`.
    Tcp(SocketAddr),
    /// A Unix socket beside Envoy: `--extproc-address unix:PATH`.
    Unix(UnixSocket),
}

impl ExtprocListen {
    /// The TCP address, when ext_proc listens on one.
    pub fn tcp(&self) -> Option<SocketAddr> {
        match self {
            ExtprocListen::Tcp(addr) => Some(*addr),
            ExtprocListen::Unix(_) => None,
        }
    }
}

impl fmt::Display for ExtprocListen {
    /// As the flag takes it, and as the startup line names it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ExtprocListen::Tcp(addr) => write!(f, "{addr}"),
            ExtprocListen::Unix(socket) => write!(f, "unix:{}", socket.path.display()),
        }
    }
}

/// A Unix socket for ext_proc (B98, B99): its public path, and the mode
/// and group it has from the moment that path names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnixSocket {
    /// Absolute; short enough for `sun_path` with a private suffix.
    pub path: PathBuf,
    /// Permission bits, at most 0o777.
    pub mode: u32,
    /// The group the socket is given; `None`: the router's own.
    pub group: Option<u32>,
}

/// The socket's mode when `--extproc-socket-mode` is not given: Envoy's
/// user reaches it through the group.
pub const DEFAULT_SOCKET_MODE: u32 = 0o660;

/// The longest path a `sockaddr_un` holds (108 bytes with the NUL).
const SUN_PATH_MAX: usize = 107;

/// What a router appends to the public path for the name it binds before
/// renaming the socket onto it (B100): a dot and a pid (Linux caps pids
/// at 4,194,304; a u32 has at most 10 digits).
pub const PRIVATE_SUFFIX_MAX: usize = 11;

/// Envoy's side of ext_proc TLS, for `envoy-config` (B86): the files Envoy
/// reads, named in the SDS files `envoy-config` writes into `sds_dir`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EnvoyRouterTls {
    pub ca_file: PathBuf,
    /// Envoy's client certificate and key, when the router asks for one.
    pub client_cert: Option<(PathBuf, PathBuf)>,
    pub server_name: Option<String>,
    pub sds_dir: PathBuf,
}

/// Parking settings after normalisation (B38).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Parking {
    /// False when `--parked-request-max` <= 0 (B22).
    pub enabled: bool,
    /// Lot size; 0 when disabled.
    pub max: usize,
    /// Slots one atespace may hold at once; 0: no cap (B69).
    pub max_per_atespace: usize,
    /// Slots sheddable callers may hold at once (B117).
    pub max_sheddable: usize,
    /// The flight budget: the flag when enabled, 15 s when disabled (B18).
    pub budget: Duration,
    /// The flag value after normalisation, shown on the status page.
    pub configured_budget: Duration,
    pub backoff: BackoffPolicy,
    /// Whether saturated flights wait in groups or retry alone (B114).
    pub dispatch: Dispatch,
}

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
    pub ateapi_address: String,
    /// How ateapi is reached: always set for [`Purpose::Serve`]; `None` only
    /// for a bootstrap given neither `--ateapi-ca-file` nor
    /// `--ateapi-insecure` (B96), which no router can start with.
    pub ateapi_transport: Option<AteapiTransport>,
    /// A bearer token file, sent as `authorization: Bearer ...` (TLS only).
    pub ateapi_token_file: Option<PathBuf>,
    /// ResumeActor calls open at once at most (B97).
    pub ateapi_max_calls: usize,
    /// ... and for one atespace.
    pub ateapi_max_calls_per_atespace: usize,
    /// Where ext_proc listens: TCP, or a Unix socket (B98).
    pub extproc: ExtprocListen,
    /// TLS on the ext_proc listener; `None` is plaintext, which only
    /// loopback, a Unix socket (B98) or `--extproc-insecure` allows (B86).
    pub extproc_tls: Option<ExtprocTls>,
    /// `--extproc-insecure`: plaintext off the loopback, knowingly.
    pub extproc_insecure: bool,
    /// Envoy's TLS to the router, for `envoy-config`; read by
    /// [`envoy_router_tls`] there, ignored by `serve`.
    pub envoy_router_tls: EnvoyRouterTlsFlags,
    /// `--routers`, for `envoy-config` (B87): the fleet the router cluster
    /// spans; empty for a sidecar's one router.
    pub routers: Vec<crate::cli::fleet::RouterHost>,
    pub metrics_addr: SocketAddr,
    pub status_addr: Option<SocketAddr>,
    pub parking: Parking,
    /// Whether a parked caller's own deadline is honoured (B68).
    pub caller_deadlines: bool,
    /// Effective Envoy circuit breaker for the ext_proc cluster (B39).
    pub extproc_max_requests: u64,
    /// Effective cap on open ext_proc streams (B74, B85).
    pub extproc_max_streams: usize,
    /// How many Envoys send this router streams (B85): 1 is a sidecar's
    /// router, more a fleet router's.
    pub envoys: u32,
    /// Effective cap on flights in progress (B58).
    pub flight_max: usize,
    /// Flights one atespace may have in progress (B79).
    pub flight_max_per_atespace: SharePolicy,
    /// Requests one atespace may hold at once, on any attempt (B80).
    pub extproc_max_requests_per_atespace: SharePolicy,
    /// Effective count of gRPC completion-queue threads (B72).
    pub grpc_threads: usize,
    pub worker_port: u16,
    pub drain_delay: Duration,
    /// Effective ext_proc drain timeout (B40).
    pub drain_timeout: Duration,
    pub envoy_admin_address: Option<String>,
    pub drain_complete_file: Option<PathBuf>,
    /// How long Envoy keeps an idle client connection (B76).
    pub envoy_idle_timeout: Duration,
    pub route_timeout: Duration,
    pub log_level: log::LevelFilter,
    pub log_format: crate::telemetry::logging::Format,
    /// How long past the budget a late verdict may still arrive; zero when
    /// late serve is disabled.
    pub late_serve_limit: Duration,
    /// The address of Envoy's HTTP, health and metrics listeners, for
    /// `envoy-config`.
    pub envoy_listen_ip: IpAddr,
    /// Where Envoy takes a request for internal and keeps its x-envoy-*
    /// headers, for `envoy-config` (B67).
    pub envoy_trusted_ranges: Vec<CidrRange>,
    /// The networks a worker's address must be in; empty: any (B83).
    pub worker_networks: Vec<CidrRange>,
    /// The heap bound of Envoy's overload manager, in bytes, for
    /// `envoy-config` (B90).
    pub envoy_max_heap: u64,
    /// Envoy's HTTP listener port, for `envoy-config`.
    pub port_http: u16,
    /// Envoy's health-check listener port, for `envoy-config`.
    pub port_health: u16,
    /// Envoy's metrics listener port, for `envoy-config`.
    pub port_stats: u16,
    /// `--otlp-traces-address`: `None` traces nothing (B121).
    pub tracing: Option<Tracing>,
}

/// Where traces go, and how much Envoy samples (B121, B123).
#[derive(Clone, Debug, PartialEq)]
pub struct Tracing {
    /// The OTLP/gRPC collector, `HOST:PORT`.
    pub address: String,
    pub host: String,
    pub port: u16,
    /// Envoy's random sampling, in percent, 0 to 100.
    pub sample_percent: f64,
}

/// The largest lot: the derived circuit breaker, twice the lot (B39), must
/// fit Envoy's `max_requests`, a UInt32 (B70).
pub const MAX_LOT: i64 = (u32::MAX / 2) as i64;

/// The derived flight cap is never below this, so that a small lot (or none)
/// still leaves room for many actors resuming at once (B58).
pub const MIN_FLIGHT_MAX: usize = 4096;

/// Envoy's admin port when `--envoy-admin-address` names none.
pub const DEFAULT_ENVOY_ADMIN_PORT: u16 = 9901;

/// The shortest retry interval: at a factor of 1 and no jitter a flight
/// then makes at most 1,000 ResumeActor calls a second (B37).
pub const MIN_RETRY_INTERVAL: Duration = Duration::from_millis(1);

/// The largest retry factor: beyond it the second retry already lands
/// hours after the first, so a larger value can only be a typo.
pub const MAX_RETRY_FACTOR: f64 = 100.0;

/// What the derived drain timeout allows past the budget, at least: room
/// for the last attempt's answer and the verdict's way back (B40).
pub const DRAIN_SLACK: Duration = Duration::from_secs(15);

/// The longest `message_timeout` and `max_message_timeout` Envoy accepts
/// (their validation rule is `lte: 3600s`).
pub const MAX_ENVOY_MESSAGE_TIMEOUT: Duration = Duration::from_secs(3600);

/// What Envoy already grants past the budget: its ext_proc message timeout
/// is budget + 5 s, so the router's own verdict always arrives first.
pub const MESSAGE_TIMEOUT_MARGIN: Duration = Duration::from_secs(5);

impl Config {
    /// Validates and normalises `args` (B37-B40, B46): everything the router
    /// runs with is decided here, once.
    pub fn from_args(args: &ServeArgs) -> Result<Config, ConfigError> {
        Config::from_args_for(args, Purpose::Serve)
    }

    /// As [`Config::from_args`], for `purpose`: a bootstrap needs no ateapi
    /// transport, but every ateapi flag given is checked as `serve` checks
    /// it (B96).
    pub fn from_args_for(args: &ServeArgs, purpose: Purpose) -> Result<Config, ConfigError> {
        let parking = parking(args)?;
        let (extproc_max_requests, flight_max) = capacities(args, &parking)?;
        let route_timeout = route_timeout(args)?;
        let ateapi_max_calls = ateapi_max_calls(args.ateapi_max_calls)?;
        let late_serve_limit = late_serve_limit(args, parking.budget)?;
        let (drain_delay, drain_timeout) = drain(args, &parking, late_serve_limit)?;
        let envoy = envoy_ports(args)?;
        let (ateapi_transport, ateapi_token_file) = ateapi(args, purpose)?;
        let envoys = envoys(args.envoys)?;
        let extproc = extproc_listen(args)?;
        let extproc_tls = match &extproc {
            ExtprocListen::Tcp(addr) => extproc_tls(args, *addr)?,
            ExtprocListen::Unix(_) => None,
        };
        let metrics_addr = listen_addr("--metrics-listen-addr", &args.metrics_listen_addr)?;
        let status_addr = match args.status_port {
            p if p <= 0 => None,
            p => Some(socket_addr("--status-address", &args.status_address, port("--status-port", p)?)?),
        };
        distinct_listeners(&[
            ("--extproc-address/--port-extproc", extproc.tcp()),
            ("--metrics-listen-addr", Some(metrics_addr)),
            ("--status-address/--status-port", status_addr),
        ])?;
        let log_level = crate::telemetry::logging::parse_level(&args.log_level).ok_or_else(|| {
            invalid(format!(
                "--log-level must be error, warn, info, debug or trace, got {:?}",
                args.log_level
            ))
        })?;
        let log_format = args
            .log_format
            .parse()
            .map_err(|_| invalid(format!("--log-format must be text or json, got {:?}", args.log_format)))?;
        Ok(Config {
            ateapi_address: args.ateapi_address.trim().to_string(),
            ateapi_transport,
            ateapi_token_file,
            extproc,
            extproc_tls,
            extproc_insecure: args.extproc_insecure,
            envoy_router_tls: EnvoyRouterTlsFlags {
                ca_file: non_empty(&args.envoy_router_ca_file).map(PathBuf::from),
                cert_file: non_empty(&args.envoy_router_cert_file).map(PathBuf::from),
                key_file: non_empty(&args.envoy_router_key_file).map(PathBuf::from),
                server_name: non_empty(&args.envoy_router_server_name),
                sds_dir: non_empty(&args.envoy_sds_dir).map(PathBuf::from),
            },
            routers: crate::cli::fleet::parse_routers(&args.routers).map_err(ConfigError::new)?,
            ateapi_max_calls,
            ateapi_max_calls_per_atespace: share(
                "--ateapi-max-calls-per-atespace",
                args.ateapi_max_calls_per_atespace,
                "--ateapi-max-calls",
                ateapi_max_calls as u64,
            )?,
            metrics_addr,
            status_addr,
            parking,
            caller_deadlines: args.caller_deadlines,
            extproc_max_requests,
            extproc_max_streams: stream_cap(args.extproc_max_streams, extproc_max_requests, envoys)?,
            envoys,
            flight_max,
            flight_max_per_atespace: atespace_share(
                "--flight-max-per-atespace",
                args.flight_max_per_atespace,
                "--flight-max",
                flight_max as u64,
            )?,
            extproc_max_requests_per_atespace: atespace_share(
                "--extproc-max-requests-per-atespace",
                args.extproc_max_requests_per_atespace,
                "--extproc-max-requests",
                extproc_max_requests,
            )?,
            grpc_threads: grpc_threads(args.grpc_threads)?,
            worker_port: port("--worker-port", args.worker_port)?,
            drain_delay,
            drain_timeout,
            envoy_admin_address: envoy.admin_address,
            drain_complete_file: non_empty(&args.drain_complete_file).map(PathBuf::from),
            envoy_idle_timeout: envoy_idle_timeout(args)?,
            route_timeout,
            log_level,
            log_format,
            late_serve_limit,
            envoy_listen_ip: envoy.listen_ip,
            envoy_trusted_ranges: trusted_ranges(&args.envoy_trusted_ranges)?,
            worker_networks: cidr_list("--worker-networks", &args.worker_networks)?,
            envoy_max_heap: envoy_max_heap(args)?,
            port_http: envoy.http,
            port_health: envoy.health,
            port_stats: envoy.stats,
            tracing: tracing(args)?,
        })
    }

    /// Whether several Envoys share this router (B85): its drain then only
    /// leaves the fleet, and drains no Envoy.
    pub fn is_fleet_router(&self) -> bool {
        self.envoys > 1
    }

    /// How long the drain waits for Envoy's client connections to close
    /// (B43 step 3, B76): every idle one is closed by Envoy's idle timeout
    /// within it, and every busy one by its next response.
    pub fn envoy_drain_window(&self) -> Duration {
        self.envoy_idle_timeout + ENVOY_WINDOW_SLACK
    }

    /// Envoy's ext_proc `message_timeout`: the budget plus a margin, so the
    /// router's 503 always beats Envoy's own timeout (envoy.md).
    pub fn message_timeout(&self) -> Duration {
        self.parking.budget + MESSAGE_TIMEOUT_MARGIN
    }

    /// How long one connection attempt to ateapi (TCP and TLS handshake) may
    /// take: half the budget, within 1 s and gRPC's own 20 s, so that an
    /// attempt refused a connection still gets a verdict at the budget and
    /// the next one finds a channel trying again (B82).
    pub fn ateapi_connect_timeout(&self) -> Duration {
        (self.parking.budget / 2).clamp(Duration::from_secs(1), Duration::from_secs(20))
    }

    /// Envoy's `max_message_timeout`, the ceiling for the late-serve
    /// override; zero (disabled) without late serve.
    pub fn max_message_timeout(&self) -> Duration {
        if self.late_serve_limit.is_zero() {
            Duration::ZERO
        } else {
            self.parking.budget + self.late_serve_limit
        }
    }
}

/// `--otlp-traces-address` and `--trace-sample-percent`, checked whether
/// or not tracing is on, as every flag is.
fn tracing(args: &ServeArgs) -> Result<Option<Tracing>, ConfigError> {
    let percent = args.trace_sample_percent;
    if !(0.0..=100.0).contains(&percent) {
        return Err(invalid(format!("--trace-sample-percent must be between 0 and 100, got {percent}")));
    }
    let address = args.otlp_traces_address.trim();
    if address.is_empty() {
        return Ok(None);
    }
    let malformed = || invalid(format!("--otlp-traces-address must be HOST:PORT, got {address:?}"));
    let (host, port) = address.rsplit_once(':').ok_or_else(malformed)?;
    let host = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host);
    let port: u16 = port.parse().ok().filter(|p| *p > 0).ok_or_else(malformed)?;
    if host.is_empty() || host.contains(['/', ' ']) || (host.contains(':') && host.parse::<IpAddr>().is_err())
    {
        return Err(malformed());
    }
    Ok(Some(Tracing { address: address.to_string(), host: host.to_string(), port, sample_percent: percent }))
}

/// Envoy's route timeout: 0 disables it; anything else must survive the
/// bootstrap's millisecond rendering, or `1ns` would become `0.000s`, which
/// Envoy reads as no timeout at all (B70).
fn route_timeout(args: &ServeArgs) -> Result<Duration, ConfigError> {
    let timeout = non_negative("--route-timeout", &args.route_timeout)?;
    if !timeout.is_zero() && timeout < Duration::from_millis(1) {
        return Err(invalid(format!(
            "--route-timeout ({}) is below Envoy's 1ms resolution and would mean no timeout; \
             use 0 to disable the timeout, or at least 1ms",
            args.route_timeout.trim()
        )));
    }
    Ok(timeout)
}

/// What the drain's Envoy window adds to Envoy's idle timeout (B76).
/// Measured on 1.40: at its idle timeout a connection starts the connection
/// manager's drain and is closed its drain timeout (5 s) and about 1 s
/// later.
const ENVOY_WINDOW_SLACK: Duration = Duration::from_secs(10);

/// `--envoy-idle-timeout` (B76): bounded both ways, since it bounds the
/// drain. Envoy reads 0 as never, which would hold a drain for good.
fn envoy_idle_timeout(args: &ServeArgs) -> Result<Duration, ConfigError> {
    let timeout = non_negative("--envoy-idle-timeout", &args.envoy_idle_timeout)?;
    if timeout < Duration::from_secs(1) || timeout > Duration::from_secs(3600) {
        return Err(invalid(format!(
            "--envoy-idle-timeout must be between 1s and 1h, got {:?}: it bounds how long a drain \
             waits for Envoy's idle client connections",
            args.envoy_idle_timeout.trim()
        )));
    }
    Ok(timeout)
}

/// The smallest `--envoy-max-heap`: an idle Envoy already uses about 10 MiB
/// of heap (measured on 1.40), so a smaller bound would refuse requests
/// from the start, or soon after.
pub const MIN_ENVOY_MAX_HEAP: u64 = 64 << 20;

/// The largest `--envoy-max-heap`: more than any machine this runs on has,
/// so a larger value can only be a typo (a missing unit reads as bytes,
/// which the minimum catches; an extra digit or unit, this).
pub const MAX_ENVOY_MAX_HEAP: u64 = 1 << 40;

/// `--envoy-max-heap` (B90).
fn envoy_max_heap(args: &ServeArgs) -> Result<u64, ConfigError> {
    let bad = |why: String| {
        invalid(format!(
            "--envoy-max-heap must be a size from {} to {}, such as 512Mi or 2Gi (Ki, Mi, Gi, Ti are powers of \
             1024; a bare number is bytes): {why}",
            size::format(MIN_ENVOY_MAX_HEAP),
            size::format(MAX_ENVOY_MAX_HEAP)
        ))
    };
    let bytes = size::parse(&args.envoy_max_heap).map_err(|e| bad(e.to_string()))?;
    if !(MIN_ENVOY_MAX_HEAP..=MAX_ENVOY_MAX_HEAP).contains(&bytes) {
        return Err(bad(format!("got {:?}", args.envoy_max_heap.trim())));
    }
    Ok(bytes)
}

/// The lot, the budget and the retry schedule (B17, B18, B22, B37, B38).
fn parking(args: &ServeArgs) -> Result<Parking, ConfigError> {
    if args.parked_request_max > MAX_LOT {
        return Err(invalid(format!(
            "--parked-request-max must be at most {MAX_LOT}, got {}: the derived ext_proc circuit breaker \
             (2 x the lot) must fit Envoy's 32-bit max_requests",
            args.parked_request_max
        )));
    }
    let max = usize::try_from(args.parked_request_max.max(0)).unwrap_or(usize::MAX);
    let enabled = max > 0;
    let configured_budget = duration("--parked-request-budget", &args.parked_request_budget)?
        .positive()
        .unwrap_or(Duration::from_secs(5));
    let interval = duration("--parked-request-retry-interval", &args.parked_request_retry_interval)?
        .positive()
        .unwrap_or(Duration::from_millis(100));
    if interval < MIN_RETRY_INTERVAL {
        return Err(invalid(format!(
            "--parked-request-retry-interval must be 0 (the default 100ms) or at least {}, got {}: \
             a shorter one turns every parked flight into a busy loop of ResumeActor calls",
            godur::format(MIN_RETRY_INTERVAL),
            godur::format(interval)
        )));
    }
    let factor = match args.parked_request_retry_factor {
        0.0 => 1.1,
        f if (1.0..=MAX_RETRY_FACTOR).contains(&f) => f,
        f => {
            return Err(invalid(format!(
                "--parked-request-retry-factor must be in [1, {MAX_RETRY_FACTOR}], got {f}"
            )))
        }
    };
    let jitter = args.parked_request_retry_jitter;
    if !(jitter.is_finite() && (0.0..1.0).contains(&jitter)) {
        return Err(invalid(format!("--parked-request-retry-jitter must be in [0, 1), got {jitter}")));
    }
    let budget = if enabled { configured_budget } else { UNPARKED_BUDGET };
    let max_per_atespace = match args.parked_request_max_per_atespace {
        0 => 0,
        n if n > 0 && (n as u64) <= max as u64 => n as usize,
        n if !enabled => {
            return Err(invalid(format!(
                "--parked-request-max-per-atespace must be 0 while parking is off \
                 (--parked-request-max <= 0): a cap needs a lot, got {n}"
            )))
        }
        n => {
            return Err(invalid(format!(
                "--parked-request-max-per-atespace must be 0 (no cap) or in 1..={max} (the lot size), got {n}"
            )))
        }
    };
    let dispatch = Dispatch::parse(&args.parked_request_dispatch).ok_or_else(|| {
        invalid(format!(
            "--parked-request-dispatch must be saturation-group or per-flight, got {:?}",
            args.parked_request_dispatch
        ))
    })?;
    // B117: half the lot unless told otherwise; never more than the lot.
    let max_sheddable = match args.parked_request_max_sheddable {
        None => max.div_ceil(2),
        Some(n) if n >= 0 && (n as u64) <= max as u64 => n as usize,
        Some(n) => {
            return Err(invalid(format!(
                "--parked-request-max-sheddable must be in 0..={max} (--parked-request-max), got {n}"
            )))
        }
    };
    Ok(Parking {
        enabled,
        max,
        max_per_atespace,
        max_sheddable,
        budget,
        configured_budget,
        backoff: BackoffPolicy { interval, factor, jitter },
        dispatch,
    })
}

/// Envoy's ext_proc circuit breaker (B39) and the flight cap (B58).
fn capacities(args: &ServeArgs, parking: &Parking) -> Result<(u64, usize), ConfigError> {
    let lot = parking.max;
    let breaker = u64::try_from(args.extproc_max_requests).map_err(|_| {
        invalid(format!("--extproc-max-requests must not be negative, got {}", args.extproc_max_requests))
    })?;
    if breaker > u64::from(u32::MAX) {
        return Err(invalid(format!(
            "--extproc-max-requests must be at most {} (Envoy's max_requests is a 32-bit count), got {breaker}",
            u32::MAX
        )));
    }
    if parking.enabled && breaker > 0 && breaker < lot as u64 {
        return Err(invalid(format!(
            "--extproc-max-requests ({breaker}) is below --parked-request-max ({lot}): \
             Envoy would shed parked requests with its own 503s before they reach the lot"
        )));
    }
    let breaker = if breaker > 0 { breaker } else { (lot as u64).saturating_mul(2).max(1024) };
    let flight_max = match args.flight_max {
        0 => lot.saturating_mul(4).max(MIN_FLIGHT_MAX),
        n if n > 0 => usize::try_from(n).unwrap_or(usize::MAX),
        n => return Err(invalid(format!("--flight-max must not be negative, got {n}"))),
    };
    Ok((breaker, flight_max))
}

/// The most ResumeActor calls that may be open at once (B97): each costs
/// about 19 KiB in gRPC core, so a million is already 19 GiB.
fn ateapi_max_calls(value: i64) -> Result<usize, ConfigError> {
    match value {
        1..=1_000_000 => Ok(value as usize),
        n => Err(invalid(format!("--ateapi-max-calls must be in 1..=1000000, got {n}"))),
    }
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

/// `--flight-max-per-atespace` and `--extproc-max-requests-per-atespace`
/// (B79, B80): an explicit value caps an atespace; 0 is the work-conserving
/// default, half of the whole and more while an eighth of it stays free.
fn atespace_share(flag: &str, value: i64, whole_flag: &str, whole: u64) -> Result<SharePolicy, ConfigError> {
    let share = share(flag, value, whole_flag, whole)?;
    let whole = usize::try_from(whole).unwrap_or(usize::MAX);
    Ok(if value == 0 { SharePolicy::work_conserving(whole) } else { SharePolicy::capped(share, whole) })
}

/// The most Envoys `--envoys` may name: far beyond any fleet one router
/// serves, and few enough that the derived stream cap stays meaningful.
pub const MAX_ENVOYS: u32 = 1024;

/// `--envoys` (B85): 1 (a sidecar's router) to [`MAX_ENVOYS`].
fn envoys(flag: i64) -> Result<u32, ConfigError> {
    u32::try_from(flag).ok().filter(|n| (1..=MAX_ENVOYS).contains(n)).ok_or_else(|| {
        invalid(format!(
            "--envoys must be 1 (a sidecar's router) to {MAX_ENVOYS} (the Envoys of a fleet that send this \
             router streams), got {flag}"
        ))
    })
}

/// `--extproc-max-streams` (B74, B85): 0 is (envoys + 1) x the breaker.
/// Each Envoy holds at most its breaker open towards the router cluster,
/// and may send all of it to this router (hashing can put a hot set of
/// actors on one host); one more breaker is room for an Envoy restarting
/// beside its old self (a hot restart, a rolling one) and for streams
/// Envoy has reset that the router has not yet seen end. A sidecar's
/// router (one Envoy) gets 2 x the breaker. Below the breaker, Envoy could
/// hold streams the router refuses.
fn stream_cap(flag: i64, breaker: u64, envoys: u32) -> Result<usize, ConfigError> {
    match u64::try_from(flag) {
        Ok(0) => Ok(usize::try_from(breaker.saturating_mul(u64::from(envoys) + 1)).unwrap_or(usize::MAX)),
        Ok(n) if n >= breaker => Ok(usize::try_from(n).unwrap_or(usize::MAX)),
        _ => Err(invalid(format!(
            "--extproc-max-streams must be 0 ((--envoys + 1) x the circuit breaker) or at least the ext_proc \
             circuit breaker ({breaker}, --extproc-max-requests): Envoy may hold that many streams open, got {flag}"
        ))),
    }
}

/// The most completion-queue threads `--grpc-threads` may ask for: far more
/// than any core count this service sees, and few enough that a typo cannot
/// start thousands of threads.
pub const MAX_GRPC_THREADS: usize = 256;

/// `--grpc-threads` (B72): 0 is one per core this process may run on.
fn grpc_threads(flag: i64) -> Result<usize, ConfigError> {
    match usize::try_from(flag) {
        Ok(0) => Ok(std::thread::available_parallelism().map_or(2, |n| n.get()).min(MAX_GRPC_THREADS)),
        Ok(n) if n <= MAX_GRPC_THREADS => Ok(n),
        _ => Err(invalid(format!(
            "--grpc-threads must be 0 (one per core) or 1..={MAX_GRPC_THREADS}, got {flag}"
        ))),
    }
}

/// The late-serve limit (B49), within what Envoy's message timeouts allow
/// (B37).
fn late_serve_limit(args: &ServeArgs, budget: Duration) -> Result<Duration, ConfigError> {
    let limit = non_negative("--late-serve-limit", &args.late_serve_limit)?;
    if !limit.is_zero() && limit <= MESSAGE_TIMEOUT_MARGIN {
        return Err(invalid(format!(
            "--late-serve-limit ({}) must be 0 or above the {} Envoy already waits past the budget",
            godur::format(limit),
            godur::format(MESSAGE_TIMEOUT_MARGIN)
        )));
    }
    // Envoy takes at most an hour for either of its ext_proc message timeouts.
    let past_budget =
        if limit.is_zero() { MESSAGE_TIMEOUT_MARGIN } else { limit.max(MESSAGE_TIMEOUT_MARGIN) };
    if budget + past_budget > MAX_ENVOY_MESSAGE_TIMEOUT {
        return Err(invalid(format!(
            "--parked-request-budget ({}) plus {} must stay within Envoy's {} ext_proc message timeout \
             (with --late-serve-limit {})",
            godur::format(budget),
            godur::format(past_budget),
            godur::format(MAX_ENVOY_MESSAGE_TIMEOUT),
            godur::format(limit)
        )));
    }
    Ok(limit)
}

/// The drain delay and the effective drain timeout (B37, B40, B46).
fn drain(
    args: &ServeArgs,
    parking: &Parking,
    late_serve_limit: Duration,
) -> Result<(Duration, Duration), ConfigError> {
    let delay = non_negative("--drain-delay", &args.drain_delay)?;
    let explicit = non_negative("--drain-timeout", &args.drain_timeout)?;
    // The longest a caller can wait for its verdict: the budget, then the
    // late-serve limit while an attempt runs on (B19, B49).
    let longest_wait = parking.budget + late_serve_limit;
    if parking.enabled && !explicit.is_zero() && explicit < longest_wait {
        return Err(invalid(format!(
            "--drain-timeout ({}) is below --parked-request-budget ({}) plus --late-serve-limit ({}): \
             parked or late-served requests would be cut off",
            godur::format(explicit),
            godur::format(parking.budget),
            godur::format(late_serve_limit)
        )));
    }
    let timeout =
        if explicit.is_zero() { parking.budget + DRAIN_SLACK.max(late_serve_limit) } else { explicit };
    Ok((delay, timeout))
}

/// `--envoy-trusted-ranges`: comma-separated CIDRs; empty trusts nothing.
fn trusted_ranges(text: &str) -> Result<Vec<CidrRange>, ConfigError> {
    cidr_list("--envoy-trusted-ranges", text)
}

/// Envoy's ports in the generated bootstrap (B67) and its admin address.
struct EnvoyPorts {
    listen_ip: IpAddr,
    http: u16,
    health: u16,
    stats: u16,
    admin_address: Option<String>,
}

fn envoy_ports(args: &ServeArgs) -> Result<EnvoyPorts, ConfigError> {
    let listen_ip = args.envoy_listen_address.trim().parse().map_err(|_| {
        invalid(format!("--envoy-listen-address must be an IP address, got {:?}", args.envoy_listen_address))
    })?;
    let http = port("--port-http", args.port_http)?;
    let health = port("--port-health", args.port_health)?;
    let stats = port("--port-stats", args.port_stats)?;
    let admin_address = non_empty(&args.envoy_admin_address);
    let admin = match &admin_address {
        Some(address) => admin_port(address)?,
        None => DEFAULT_ENVOY_ADMIN_PORT,
    };
    let ports = [
        ("--port-http", http),
        ("--port-health", health),
        ("--port-stats", stats),
        ("--envoy-admin-address", admin),
    ];
    for (i, (flag, p)) in ports.iter().enumerate() {
        if let Some((other, _)) = ports[i + 1..].iter().find(|(_, q)| q == p) {
            return Err(invalid(format!("{flag} and {other} give Envoy the same port {p}")));
        }
    }
    Ok(EnvoyPorts { listen_ip, http, health, stats, admin_address })
}

/// The port of `--envoy-admin-address`, which must be `host:port` (an
/// IPv6 host in brackets): the drain connects to it and the bootstrap binds
/// Envoy's admin there, so a value without a usable port is refused rather
/// than drained to, or rendered as, something else (B70).
fn admin_port(address: &str) -> Result<u16, ConfigError> {
    let bad = |why: &str| {
        invalid(format!("--envoy-admin-address must be host:port ([ipv6]:port), got {address:?}: {why}"))
    };
    let (host, port_text) = address.rsplit_once(':').ok_or_else(|| bad("no port"))?;
    let port = port_text
        .parse::<u16>()
        .ok()
        .filter(|&p| p != 0)
        .ok_or_else(|| bad("the port is not in 1..=65535"))?;
    let bracketed = host.strip_prefix('[').and_then(|h| h.strip_suffix(']'));
    match bracketed {
        Some(ip) if ip.parse::<std::net::Ipv6Addr>().is_err() => Err(bad("not an IPv6 address in brackets")),
        Some(_) => Ok(port),
        None if host.is_empty() => Err(bad("no host")),
        None if host.contains([':', '[', ']', '/', ' ']) => Err(bad("not a host name or address")),
        None => Ok(port),
    }
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

/// How ateapi is reached and authenticated (B53); for a bootstrap, no
/// transport at all is fine (B96).
fn ateapi(
    args: &ServeArgs,
    purpose: Purpose,
) -> Result<(Option<AteapiTransport>, Option<PathBuf>), ConfigError> {
    if args.ateapi_address.trim().is_empty() {
        return Err(invalid("--ateapi-address must not be empty"));
    }
    let transport = transport(args)?;
    if transport.is_none() && purpose == Purpose::Serve {
        return Err(invalid(
            "--ateapi-ca-file is required to verify ateapi (or pass --ateapi-insecure for plaintext)",
        ));
    }
    let token_file = non_empty(&args.ateapi_token_file).map(PathBuf::from);
    if token_file.is_some() && transport == Some(AteapiTransport::Insecure) {
        return Err(invalid(
            "--ateapi-token-file needs TLS: a bearer token is never sent in plaintext (drop --ateapi-insecure)",
        ));
    }
    Ok((transport, token_file))
}

/// Envoy's TLS flags as given, checked only by `envoy-config`
/// ([`envoy_router_tls`]): `serve` never reads Envoy's files.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EnvoyRouterTlsFlags {
    pub ca_file: Option<PathBuf>,
    pub cert_file: Option<PathBuf>,
    pub key_file: Option<PathBuf>,
    pub server_name: Option<String>,
    pub sds_dir: Option<PathBuf>,
}

/// Where ext_proc listens (B98): `--extproc-address unix:PATH` is a Unix
/// socket, anything else a host with `--port-extproc`. The socket's own
/// flags mean nothing on TCP, and what only TCP needs means nothing on a
/// socket: each is refused where it does not apply rather than ignored.
fn extproc_listen(args: &ServeArgs) -> Result<ExtprocListen, ConfigError> {
    let address = args.extproc_address.trim();
    let (mode, group) = (non_empty(&args.extproc_socket_mode), non_empty(&args.extproc_socket_group));
    let Some(path) = address.strip_prefix("unix:") else {
        for (flag, given) in [("--extproc-socket-mode", &mode), ("--extproc-socket-group", &group)] {
            if given.is_some() {
                return Err(invalid(format!("{flag} needs a Unix socket: --extproc-address unix:PATH")));
            }
        }
        let port = listen_port("--port-extproc", args.port_extproc.unwrap_or(50051))?;
        return socket_addr("--extproc-address", address, port).map(ExtprocListen::Tcp);
    };
    let socket_only = |flag: &str, why: &str| invalid(format!("--extproc-address {address}: {flag} {why}"));
    if args.port_extproc.is_some() {
        return Err(socket_only("--port-extproc", "names a TCP port; a Unix socket has none"));
    }
    if args.extproc_insecure {
        return Err(socket_only(
            "--extproc-insecure",
            "is for plaintext off the loopback; a Unix socket is local, its mode says who connects",
        ));
    }
    let tls_flag = [
        ("--extproc-cert-file", &args.extproc_cert_file),
        ("--extproc-key-file", &args.extproc_key_file),
        ("--extproc-client-ca-file", &args.extproc_client_ca_file),
    ]
    .into_iter()
    .find(|(_, v)| !v.trim().is_empty());
    if let Some((flag, _)) = tls_flag {
        return Err(socket_only(
            flag,
            "is refused: TLS on a Unix socket protects nothing its mode does not (only this host's \
             processes can reach it), and costs what the socket saves",
        ));
    }
    if path.chars().any(|c| c.is_control() || c == '"' || c == '\\') {
        return Err(invalid(format!(
            "--extproc-address {address:?}: the socket's path must not hold control characters, '\"' or '\\' \
             (the bootstrap quotes it)"
        )));
    }
    let path = PathBuf::from(path);
    if !path.is_absolute() {
        return Err(invalid(format!(
            "--extproc-address {address}: the socket's path must be absolute (Envoy resolves it from its own \
             working directory)"
        )));
    }
    if path.as_os_str().len() + PRIVATE_SUFFIX_MAX > SUN_PATH_MAX || path.file_name().is_none() {
        return Err(invalid(format!(
            "--extproc-address {address}: a socket's path holds at most {} bytes (the router binds it with \
             a suffix of up to {PRIVATE_SUFFIX_MAX} first)",
            SUN_PATH_MAX - PRIVATE_SUFFIX_MAX
        )));
    }
    let mode = match mode {
        None => DEFAULT_SOCKET_MODE,
        Some(text) => u32::from_str_radix(&text, 8)
            .ok()
            .filter(|&m| m <= 0o777 && !text.starts_with(['+', '-']))
            .ok_or_else(|| {
                invalid(format!(
                    "--extproc-socket-mode must be octal permission bits, 0 to 0777, got {text:?}"
                ))
            })?,
    };
    let group = group.map(|g| group_id(&g)).transpose()?;
    Ok(ExtprocListen::Unix(UnixSocket { path, mode, group }))
}

/// The ext_proc listener's transport (B86): TLS from a certificate and its
/// key (and, optionally, a client CA), or plaintext, which off the loopback
/// needs `--extproc-insecure`: anyone who reaches the port could route
/// requests and read their headers.
fn extproc_tls(args: &ServeArgs, addr: SocketAddr) -> Result<Option<ExtprocTls>, ConfigError> {
    let (cert, key, ca) = (
        non_empty(&args.extproc_cert_file),
        non_empty(&args.extproc_key_file),
        non_empty(&args.extproc_client_ca_file),
    );
    if args.extproc_insecure {
        let given: Vec<&str> =
            [("--extproc-cert-file", &cert), ("--extproc-key-file", &key), ("--extproc-client-ca-file", &ca)]
                .into_iter()
                .filter(|(_, v)| v.is_some())
                .map(|(flag, _)| flag)
                .collect();
        if !given.is_empty() {
            return Err(invalid(format!("--extproc-insecure cannot be combined with {}", given.join(", "))));
        }
    }
    let tls =
        match (cert, key) {
            (Some(cert), Some(key)) => Some(ExtprocTls {
                cert_file: PathBuf::from(cert),
                key_file: PathBuf::from(key),
                client_ca_file: ca.map(PathBuf::from),
            }),
            (None, None) if ca.is_some() => return Err(invalid(
                "--extproc-client-ca-file needs TLS on ext_proc: --extproc-cert-file and --extproc-key-file",
            )),
            (None, None) => None,
            (Some(_), None) => {
                return Err(invalid("--extproc-cert-file needs --extproc-key-file (its private key)"))
            }
            (None, Some(_)) => {
                return Err(invalid("--extproc-key-file needs --extproc-cert-file (its certificate)"))
            }
        };
    if tls.is_none() && !addr.ip().is_loopback() && !args.extproc_insecure {
        return Err(invalid(format!(
            "--extproc-address {} is not loopback: ext_proc there needs TLS (--extproc-cert-file and \
             --extproc-key-file, and --extproc-client-ca-file so that only Envoys get in), or \
             --extproc-insecure to accept that anyone who reaches the port can route requests and read \
             their headers",
            addr.ip()
        )));
    }
    Ok(tls)
}

/// Envoy's side of ext_proc TLS, for `envoy-config` (B86): with TLS on
/// the router, the CA that verifies it and the SDS directory are needed,
/// and a client certificate exactly when the router asks for one; without
/// TLS, none of these flags means anything and each is refused.
pub fn envoy_router_tls(config: &Config) -> Result<Option<EnvoyRouterTls>, ConfigError> {
    let flags = &config.envoy_router_tls;
    let Some(tls) = &config.extproc_tls else {
        let given: Vec<&str> = [
            ("--envoy-router-ca-file", flags.ca_file.is_some()),
            ("--envoy-router-cert-file", flags.cert_file.is_some()),
            ("--envoy-router-key-file", flags.key_file.is_some()),
            ("--envoy-router-server-name", flags.server_name.is_some()),
            ("--envoy-sds-dir", flags.sds_dir.is_some()),
        ]
        .into_iter()
        .filter(|(_, given)| *given)
        .map(|(flag, _)| flag)
        .collect();
        if !given.is_empty() {
            return Err(invalid(format!(
                "{} configure Envoy's TLS to the router, which uses none (no --extproc-cert-file)",
                given.join(", ")
            )));
        }
        return Ok(None);
    };
    let ca_file = flags.ca_file.clone().ok_or_else(|| {
        invalid("envoy-config needs --envoy-router-ca-file: the CAs with which Envoy verifies the router's certificate")
    })?;
    let sds_dir = flags.sds_dir.clone().ok_or_else(|| {
        invalid("envoy-config needs --envoy-sds-dir: where it writes the SDS files through which Envoy reads its certificates")
    })?;
    let client_cert =
        match (&tls.client_ca_file, &flags.cert_file, &flags.key_file) {
            (Some(_), Some(cert), Some(key)) => Some((cert.clone(), key.clone())),
            (Some(_), _, _) => return Err(invalid(
                "the router requires a client certificate (--extproc-client-ca-file): give Envoy one with \
                 --envoy-router-cert-file and --envoy-router-key-file",
            )),
            (None, None, None) => None,
            (None, _, _) => {
                return Err(invalid(
                    "--envoy-router-cert-file and --envoy-router-key-file need --extproc-client-ca-file: \
                 the router asks for no client certificate",
                ))
            }
        };
    Ok(Some(EnvoyRouterTls { ca_file, client_cert, server_name: flags.server_name.clone(), sds_dir }))
}

/// The transport the ateapi flags name: `None` when they name none (no CA,
/// not insecure).
fn transport(args: &ServeArgs) -> Result<Option<AteapiTransport>, ConfigError> {
    let tls_flags: Vec<&str> = [
        ("--ateapi-ca-file", &args.ateapi_ca_file),
        ("--ateapi-client-cert", &args.ateapi_client_cert),
        ("--ateapi-server-name", &args.ateapi_server_name),
    ]
    .into_iter()
    .filter(|(_, v)| !v.trim().is_empty())
    .map(|(flag, _)| flag)
    .collect();
    if args.ateapi_insecure {
        if !tls_flags.is_empty() {
            return Err(invalid(format!(
                "--ateapi-insecure cannot be combined with {}",
                tls_flags.join(", ")
            )));
        }
        return Ok(Some(AteapiTransport::Insecure));
    }
    let Some(ca_file) = non_empty(&args.ateapi_ca_file) else {
        // A client certificate or a server name without a CA to verify
        // the server with is a mistake whatever the command.
        if let Some(flag) = tls_flags.first() {
            return Err(invalid(format!("{flag} needs --ateapi-ca-file, the CA that verifies ateapi")));
        }
        return Ok(None);
    };
    Ok(Some(AteapiTransport::Tls {
        ca_file: PathBuf::from(ca_file),
        client_cert: non_empty(&args.ateapi_client_cert).map(PathBuf::from),
        server_name: non_empty(&args.ateapi_server_name),
    }))
}

/// Parses `serve`'s flags from an argument list (without the program name
/// and subcommand), for tests and tools that build a config from strings.
pub fn parse_serve_args(args: &[&str]) -> Result<Config, ConfigError> {
    match crate::cli::flags::parse_flags("serve", args) {
        Ok(flags) => Config::from_args(&flags),
        Err(crate::cli::flags::FlagsError::Help(_)) => Err(invalid("--help is not a configuration")),
        Err(crate::cli::flags::FlagsError::Invalid(e)) => Err(invalid(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(extra: &[&str]) -> Result<Config, ConfigError> {
        let mut args = vec!["--ateapi-insecure"];
        args.extend_from_slice(extra);
        parse_serve_args(&args)
    }

    fn error(extra: &[&str]) -> String {
        parse(extra).unwrap_err().to_string()
    }

    #[test]
    fn defaults() {
        let c = parse(&[]).unwrap();
        assert_eq!(c.ateapi_address, "api.ate-system.svc:443");
        assert_eq!(c.extproc, ExtprocListen::Tcp("127.0.0.1:50051".parse().unwrap()));
        assert_eq!(c.metrics_addr, "0.0.0.0:9090".parse().unwrap());
        assert_eq!(c.status_addr, Some("127.0.0.1:4040".parse().unwrap()), "the status page stays local");
        assert!(c.parking.enabled);
        assert_eq!(c.parking.max, 1024);
        assert_eq!(c.parking.budget, Duration::from_secs(5));
        assert_eq!(c.parking.backoff.interval, Duration::from_millis(100));
        assert_eq!(c.parking.backoff.factor, 1.1);
        assert_eq!(c.parking.backoff.jitter, 0.1);
        assert_eq!(c.extproc_max_requests, 2048, "B39: 2 x 1024");
        assert_eq!(c.worker_port, 443);
        assert_eq!(c.drain_delay, Duration::from_secs(13));
        assert_eq!(c.drain_timeout, Duration::from_secs(35), "B40: 5s + max(15s, 30s late serve)");
        assert_eq!(c.flight_max, 4096, "B58: max(4 x 1024, 4096)");
        assert_eq!(c.parking.max_per_atespace, 0, "B69: no per-atespace cap");
        assert!(c.caller_deadlines, "B68: on by default");
        assert_eq!(c.parking.max_sheddable, 512, "B117: half the lot");
        let sheddable = |args: &[&str]| parse(args).unwrap().parking.max_sheddable;
        assert_eq!(sheddable(&["--parked-request-max", "5"]), 3, "rounded up");
        assert_eq!(sheddable(&["--parked-request-max-sheddable", "0"]), 0, "sheddable requests never park");
        assert_eq!(sheddable(&["--parked-request-max-sheddable", "1024"]), 1024);
        let c = parse(&["--parked-request-max-per-atespace", "1024", "--caller-deadlines=false"]).unwrap();
        assert_eq!((c.parking.max_per_atespace, c.caller_deadlines), (1024, false));
        assert_eq!(c.envoy_admin_address.as_deref(), Some("localhost:9901"));
        assert_eq!(c.drain_complete_file, Some(PathBuf::from("/var/run/atenet/drain-complete")));
        assert_eq!(c.route_timeout, Duration::from_secs(300));
        assert_eq!(c.envoy_drain_window(), Duration::from_secs(85), "B76: idle timeout 75s + 10s");
    }

    #[test]
    fn b76_envoy_idle_timeout_takes_1s_to_1h_and_sets_the_drain_window() {
        let c = parse(&["--envoy-idle-timeout", "4s"]).unwrap();
        assert_eq!(
            (c.envoy_idle_timeout, c.envoy_drain_window()),
            (Duration::from_secs(4), Duration::from_secs(14))
        );
        assert_eq!(
            parse(&["--envoy-idle-timeout", "1h"]).unwrap().envoy_idle_timeout,
            Duration::from_secs(3600)
        );
        for bad in ["0", "999ms", "1h0m0.001s", "-1s", "soon", ""] {
            assert!(error(&["--envoy-idle-timeout", bad]).contains("--envoy-idle-timeout"), "{bad:?}");
        }
    }

    #[test]
    fn b90_envoy_max_heap_takes_64mi_to_1ti() {
        assert_eq!(parse(&[]).unwrap().envoy_max_heap, 1 << 30, "default 1Gi");
        assert_eq!(parse(&["--envoy-max-heap", "64Mi"]).unwrap().envoy_max_heap, 64 << 20);
        assert_eq!(parse(&["--envoy-max-heap=1Ti"]).unwrap().envoy_max_heap, 1 << 40);
        assert_eq!(parse(&["--envoy-max-heap", "3221225472"]).unwrap().envoy_max_heap, 3 << 30);
        for bad in [
            "63Mi",
            "1024",
            "1025Gi",
            "2Ti",
            "0",
            "",
            "1.5Gi",
            "1G",
            "lots",
            "-1Gi",
            "99999999999999999999Ti",
        ] {
            let e = error(&["--envoy-max-heap", bad]);
            assert!(e.contains("--envoy-max-heap must be a size from 64Mi to 1Ti"), "{bad:?}: {e}");
        }
    }

    #[test]
    fn b72_grpc_threads_default_to_the_cores_and_take_1_to_256() {
        let cores = std::thread::available_parallelism().unwrap().get().min(MAX_GRPC_THREADS);
        assert_eq!(parse(&[]).unwrap().grpc_threads, cores);
        assert_eq!(parse(&["--grpc-threads", "0"]).unwrap().grpc_threads, cores);
        assert_eq!(parse(&["--grpc-threads", "1"]).unwrap().grpc_threads, 1);
        assert_eq!(parse(&["--grpc-threads", "256"]).unwrap().grpc_threads, 256);
        for bad in ["-1", "257", "9223372036854775807"] {
            let e = parse(&["--grpc-threads", bad]).unwrap_err().to_string();
            assert!(e.contains("--grpc-threads") && e.contains(bad), "{bad}: {e}");
        }
    }

    #[test]
    fn b97_calls_open_at_once_and_an_atespaces_share_of_them() {
        let c = parse(&[]).unwrap();
        assert_eq!((c.ateapi_max_calls, c.ateapi_max_calls_per_atespace), (1024, 512));
        let c = parse(&["--ateapi-max-calls", "1"]).unwrap();
        assert_eq!((c.ateapi_max_calls, c.ateapi_max_calls_per_atespace), (1, 1), "at least one");
        let c =
            parse(&["--ateapi-max-calls", "1000000", "--ateapi-max-calls-per-atespace", "1000000"]).unwrap();
        assert_eq!((c.ateapi_max_calls, c.ateapi_max_calls_per_atespace), (1_000_000, 1_000_000));
        for bad in [
            &["--ateapi-max-calls", "0"][..],
            &["--ateapi-max-calls", "-1"],
            &["--ateapi-max-calls", "1000001"],
            &["--ateapi-max-calls-per-atespace", "-1"],
            &["--ateapi-max-calls", "8", "--ateapi-max-calls-per-atespace", "9"],
        ] {
            let e = parse(bad).unwrap_err().to_string();
            assert!(e.contains(bad[bad.len() - 2]), "{bad:?}: {e}");
        }
    }

    #[test]
    fn b37_rejections_name_the_flag() {
        let cases: &[(&[&str], &str)] = &[
            (&["--parked-request-retry-factor", "0.5"], "--parked-request-retry-factor"),
            (&["--parked-request-dispatch", "fifo"], "--parked-request-dispatch"),
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
        assert_eq!(c.log_level, log::LevelFilter::Debug);
        let c = parse_serve_args(&["--ateapi-insecure", "--envoy-admin-address="]).unwrap();
        assert_eq!(c.envoy_admin_address, None, "an empty value after = is a value");
    }

    #[test]
    fn tls_required_without_insecure() {
        let message = parse_serve_args(&[]).unwrap_err().to_string();
        assert!(message.contains("--ateapi-ca-file"), "{message}");
        let c = parse_serve_args(&[
            "--ateapi-ca-file",
            "/etc/ca.pem",
            "--ateapi-client-cert",
            "/etc/client.pem",
            "--ateapi-server-name",
            "api",
        ])
        .unwrap();
        assert_eq!(
            c.ateapi_transport,
            Some(AteapiTransport::Tls {
                ca_file: "/etc/ca.pem".into(),
                client_cert: Some("/etc/client.pem".into()),
                server_name: Some("api".into()),
            })
        );
    }

    #[test]
    fn b38_normalisation() {
        let c = parse(&[
            "--parked-request-budget",
            "0",
            "--parked-request-retry-interval",
            "-5ms",
            "--parked-request-retry-factor",
            "0",
        ])
        .unwrap();
        assert_eq!(c.parking.budget, Duration::from_secs(5));
        assert_eq!(c.parking.backoff.interval, Duration::from_millis(100));
        assert_eq!(c.parking.backoff.factor, 1.1);
    }

    #[test]
    fn b74_stream_cap() {
        assert_eq!(parse(&["--parked-request-max", "4000"]).unwrap().extproc_max_streams, 16_000, "2 x 8000");
        assert_eq!(parse(&["--parked-request-max", "0"]).unwrap().extproc_max_streams, 2048, "2 x 1024");
        let c = parse(&[
            "--parked-request-max",
            "10",
            "--extproc-max-requests",
            "10",
            "--extproc-max-streams",
            "10",
        ]);
        assert_eq!(c.unwrap().extproc_max_streams, 10, "the breaker itself is enough");
        let fleet = parse(&["--envoys", "3"]).unwrap();
        assert_eq!((fleet.envoys, fleet.extproc_max_streams), (3, 8192), "B85: (3 + 1) x 2048");
        assert!(fleet.is_fleet_router() && !parse(&[]).unwrap().is_fleet_router());
        assert_eq!(parse(&["--envoys", "1024"]).unwrap().extproc_max_streams, 1025 * 2048);
        for bad in ["0", "-1", "1025", "x"] {
            assert!(error(&["--envoys", bad]).contains("--envoys"), "{bad}");
        }
        for bad in ["9", "-1"] {
            let e = parse(&[
                "--parked-request-max",
                "10",
                "--extproc-max-requests",
                "10",
                "--extproc-max-streams",
                bad,
            ])
            .unwrap_err()
            .to_string();
            assert!(
                e.contains("--extproc-max-streams must be 0") && e.contains("(10, --extproc-max-requests)"),
                "{e}"
            );
        }
    }

    #[test]
    fn b39_b40_derivations() {
        let c = parse(&["--parked-request-max", "4000"]).unwrap();
        assert_eq!(c.extproc_max_requests, 8000);
        let c = parse(&["--parked-request-max", "10", "--extproc-max-requests", "10"]).unwrap();
        assert_eq!(c.extproc_max_requests, 10);
        let c = parse(&["--parked-request-budget", "30s"]).unwrap();
        assert_eq!(c.drain_timeout, Duration::from_secs(60), "B40: 30s + max(15s, 30s)");
        let c = parse(&["--parked-request-budget", "30s", "--late-serve-limit", "0"]).unwrap();
        assert_eq!(c.drain_timeout, Duration::from_secs(45), "B40: 30s + 15s without late serve");
        let c = parse(&["--parked-request-budget", "30s", "--late-serve-limit", "10s"]).unwrap();
        assert_eq!(c.drain_timeout, Duration::from_secs(45), "B40: 30s + max(15s, 10s)");
        let c = parse(&["--parked-request-budget", "30s", "--drain-timeout", "60s"]).unwrap();
        assert_eq!(c.drain_timeout, Duration::from_secs(60));
        let c =
            parse(&["--late-serve-limit", "0", "--parked-request-budget", "30s", "--drain-timeout", "31s"])
                .unwrap();
        assert_eq!(c.drain_timeout, Duration::from_secs(31));
        let c = parse(&["--parked-request-max", "5000"]).unwrap();
        assert_eq!(c.flight_max, 20_000, "B58: 4 x the lot");
        assert_eq!(parse(&["--parked-request-max", "0"]).unwrap().flight_max, 4096);
        assert_eq!(parse(&["--flight-max", "7"]).unwrap().flight_max, 7);
    }

    #[test]
    fn b46_parking_off_accepts_any_breaker_and_short_drain() {
        let c = parse(&["--parked-request-max", "0", "--extproc-max-requests", "1", "--drain-timeout", "1s"])
            .unwrap();
        assert!(!c.parking.enabled);
        assert_eq!(c.parking.budget, UNPARKED_BUDGET, "B18: 15 s when disabled");
        assert_eq!(c.extproc_max_requests, 1);
        assert_eq!(c.drain_timeout, Duration::from_secs(1));
        assert!(!parse(&["--parked-request-max", "-3"]).unwrap().parking.enabled);
    }

    #[test]
    fn b86_ext_proc_off_the_loopback_needs_tls_or_the_explicit_flag() {
        let e = error(&["--extproc-address", "0.0.0.0"]);
        assert!(
            e.contains("--extproc-address 0.0.0.0 is not loopback") && e.contains("--extproc-insecure"),
            "{e}"
        );
        let insecure = parse(&["--extproc-address", "0.0.0.0", "--extproc-insecure"]).unwrap();
        assert!(insecure.extproc_tls.is_none() && insecure.extproc_insecure);
        let tls =
            parse(&["--extproc-address", "::", "--extproc-cert-file", "/c", "--extproc-key-file", "/k"])
                .unwrap();
        assert_eq!(
            tls.extproc_tls,
            Some(ExtprocTls { cert_file: "/c".into(), key_file: "/k".into(), client_ca_file: None })
        );
        assert!(parse(&["--extproc-cert-file", "/c", "--extproc-key-file", "/k"])
            .unwrap()
            .extproc_tls
            .is_some());
        for (args, flag) in [
            (&["--extproc-cert-file", "/c"][..], "--extproc-key-file"),
            (&["--extproc-key-file", "/k"][..], "--extproc-cert-file"),
            (&["--extproc-client-ca-file", "/ca"][..], "--extproc-client-ca-file"),
            (
                &["--extproc-insecure", "--extproc-cert-file", "/c", "--extproc-key-file", "/k"][..],
                "--extproc-insecure",
            ),
        ] {
            assert!(error(args).contains(flag), "{args:?}");
        }
        // Envoy's side, for envoy-config only.
        let mtls = parse(&[
            "--extproc-cert-file",
            "/c",
            "--extproc-key-file",
            "/k",
            "--extproc-client-ca-file",
            "/ca",
            "--envoy-router-ca-file",
            "/eca",
            "--envoy-sds-dir",
            "/sds",
        ])
        .unwrap();
        assert!(envoy_router_tls(&mtls).unwrap_err().to_string().contains("--envoy-router-cert-file"));
        assert!(envoy_router_tls(&parse(&[]).unwrap()).unwrap().is_none());
        let stray = parse(&["--envoy-router-ca-file", "/eca"]).unwrap();
        assert!(envoy_router_tls(&stray).unwrap_err().to_string().contains("--envoy-router-ca-file"));
        let no_ca =
            parse(&["--extproc-cert-file", "/c", "--extproc-key-file", "/k", "--envoy-sds-dir", "/s"])
                .unwrap();
        assert!(envoy_router_tls(&no_ca).unwrap_err().to_string().contains("--envoy-router-ca-file"));
    }

    #[test]
    fn status_port_disable() {
        assert_eq!(parse(&["--status-port", "0"]).unwrap().status_addr, None);
        assert_eq!(parse(&["--status-port", "-1"]).unwrap().status_addr, None);
    }

    #[test]
    fn b79_b80_shares_default_to_half_and_take_1_to_the_whole() {
        let c = parse(&[]).unwrap();
        assert_eq!(
            (c.flight_max_per_atespace, c.extproc_max_requests_per_atespace),
            (SharePolicy::work_conserving(4096), SharePolicy::work_conserving(2048)),
            "half, and more while an eighth stays free"
        );
        let c = parse(&["--flight-max", "1", "--extproc-max-requests", "1", "--parked-request-max", "0"])
            .unwrap();
        assert_eq!(
            (c.flight_max_per_atespace.share, c.extproc_max_requests_per_atespace.share),
            (1, 1),
            "at least one"
        );
        let c = parse(&["--flight-max-per-atespace", "4096", "--extproc-max-requests-per-atespace", "7"])
            .unwrap();
        assert_eq!(
            (c.flight_max_per_atespace, c.extproc_max_requests_per_atespace),
            (SharePolicy::capped(4096, 4096), SharePolicy::capped(7, 2048)),
            "an explicit share is a cap"
        );
    }

    #[test]
    fn b83_cidr_ranges_contain_what_they_should() {
        let ranges = cidr_list("--worker-networks", "10.0.0.0/8,fd00::/8,192.168.1.7/32,0.0.0.0/0").unwrap();
        let contains = |i: usize, ip: &str| ranges[i].contains(ip.parse().unwrap());
        assert!(contains(0, "10.255.0.1") && !contains(0, "11.0.0.1") && contains(0, "::ffff:10.0.0.1"));
        assert!(contains(1, "fd12::1") && !contains(1, "fe80::1") && !contains(1, "10.0.0.1"));
        assert!(contains(2, "192.168.1.7") && !contains(2, "192.168.1.8"));
        assert!(contains(3, "8.8.8.8") && !contains(3, "::1"), "a /0 is every address of its family");
        assert!(cidr_list("--worker-networks", "").unwrap().is_empty());
    }

    #[test]
    fn b98_a_unix_socket_and_the_flags_that_mean_nothing_there() {
        let c = parse(&["--extproc-address", "unix:/run/atenet/extproc.sock"]).unwrap();
        let socket = UnixSocket { path: "/run/atenet/extproc.sock".into(), mode: 0o660, group: None };
        assert_eq!(c.extproc, ExtprocListen::Unix(socket));
        assert_eq!(c.extproc.to_string(), "unix:/run/atenet/extproc.sock");
        assert!(c.extproc_tls.is_none(), "plaintext, local (B86)");
        let c =
            parse(&["--extproc-address=unix:/s", "--extproc-socket-mode=0600", "--extproc-socket-group=0"]);
        let ExtprocListen::Unix(socket) = c.unwrap().extproc else { panic!("a socket") };
        assert_eq!((socket.mode, socket.group), (0o600, Some(0)));
        let refused = [
            (&["--extproc-address", "unix:/s", "--port-extproc", "50051"][..], "--port-extproc"),
            (&["--extproc-address", "unix:/s", "--extproc-insecure"], "--extproc-insecure"),
            (&["--extproc-address", "unix:/s", "--extproc-cert-file", "c", "--extproc-key-file", "k"], "TLS"),
            (&["--extproc-address", "unix:/s", "--extproc-client-ca-file", "ca"], "--extproc-client-ca-file"),
            (&["--extproc-address", "unix:relative.sock"], "absolute"),
            (&["--extproc-address", "unix:"], "absolute"),
            (&["--extproc-address", "unix:/a\"b"], "must not hold"),
            (&["--extproc-address", "unix:/s", "--extproc-socket-mode", "1777"], "--extproc-socket-mode"),
            (&["--extproc-address", "unix:/s", "--extproc-socket-mode", "rw"], "--extproc-socket-mode"),
            (&["--extproc-address", "unix:/s", "--extproc-socket-mode", "+660"], "--extproc-socket-mode"),
            (&["--extproc-address", "unix:/s", "--extproc-socket-group", "no-such-group-here"], "no group"),
            (&["--extproc-socket-mode", "0660"], "needs a Unix socket"),
            (&["--extproc-socket-group", "0"], "needs a Unix socket"),
        ];
        for (flags, says) in refused {
            let e = error(flags);
            assert!(e.contains(says), "{flags:?}: {e}");
        }
        let longest = format!("unix:/{}", "a".repeat(SUN_PATH_MAX - PRIVATE_SUFFIX_MAX - 1));
        parse(&["--extproc-address", &longest]).expect("fits sun_path with its suffix");
        let e = error(&["--extproc-address", &format!("{longest}a")]);
        assert!(e.contains("at most 96 bytes"), "{e}");
        let tcp = parse(&["--port-extproc", "50052"]).unwrap();
        assert_eq!(tcp.extproc.tcp(), Some("127.0.0.1:50052".parse().unwrap()));
    }
}
