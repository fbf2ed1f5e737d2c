//! Flags, validation and the values derived from them (B37-B40, B46).
//!
//! Every flag is validated and normalised here, once, before any socket
//! opens; the rest of the router reads only the effective [`Config`]. A bad
//! value is an error naming the flag, printed as
//! `invalid router configuration: ...`, never a panic.

use std::fmt;
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::time::Duration;

use argh::FromArgs;

use crate::backoff::BackoffPolicy;
use crate::godur;

/// The resume budget when parking is disabled: long enough to ride out
/// concurrent-resume conflicts (B18, B22).
pub const UNPARKED_BUDGET: Duration = Duration::from_secs(15);

/// The router's flags, as typed by an operator. `serve` and `envoy-config`
/// take the same set, so the Envoy configuration is always derived from
/// exactly the values the router runs with.
#[derive(FromArgs, Clone, Debug, PartialEq)]
/// Flags shared by `serve` and `envoy-config`.
pub struct ServeArgs {
    /// ateapi control-plane address, host:port (default: api.ate-system.svc:443)
    #[argh(option, default = "String::from(\"api.ate-system.svc:443\")")]
    pub ateapi_address: String,
    /// PEM file of CAs that verify ateapi's server certificate (default: none; required without --ateapi-insecure)
    #[argh(option, default = "String::new()")]
    pub ateapi_ca_file: String,
    /// PEM bundle (certificate chain + PKCS#8 key) for mTLS to ateapi (default: none)
    #[argh(option, default = "String::new()")]
    pub ateapi_client_cert: String,
    /// TLS server name to expect from ateapi (default: the address's host)
    #[argh(option, default = "String::new()")]
    pub ateapi_server_name: String,
    /// talk to ateapi in plaintext (development only; no TLS flag allowed) (default: off)
    #[argh(switch)]
    pub ateapi_insecure: bool,
    /// file holding a bearer token for ateapi (re-read on change; needs TLS) (default: none)
    #[argh(option, default = "String::new()")]
    pub ateapi_token_file: String,
    /// address the ext_proc gRPC server binds (default: 127.0.0.1)
    #[argh(option, default = "String::from(\"127.0.0.1\")")]
    pub extproc_address: String,
    /// port of the ext_proc gRPC server (default: 50051)
    #[argh(option, default = "50051")]
    pub port_extproc: i64,
    /// listen address of /metrics, /healthz and /readyz ([host]:port) (default: :9090)
    #[argh(option, default = "String::from(\":9090\")")]
    pub metrics_listen_addr: String,
    /// port of the /statusz page (<= 0 disables) (default: 4040)
    #[argh(option, default = "4040")]
    pub status_port: i64,
    /// address the /statusz page binds (it shows actor ids, paths and worker IPs) (default: 127.0.0.1)
    #[argh(option, default = "String::from(\"127.0.0.1\")")]
    pub status_address: String,
    /// how long a resume flight may keep retrying (Go duration) (default: 5s)
    #[argh(option, default = "String::from(\"5s\")")]
    pub parked_request_budget: String,
    /// lot size: max concurrent parked requests (<= 0 disables parking) (default: 1024)
    #[argh(option, default = "1024")]
    pub parked_request_max: i64,
    /// delay before a parked flight's first retry (Go duration) (default: 100ms)
    #[argh(option, default = "String::from(\"100ms\")")]
    pub parked_request_retry_interval: String,
    /// multiplier applied to the retry delay after each retry, in [1, 100] (default: 1.1)
    #[argh(option, default = "1.1")]
    pub parked_request_retry_factor: f64,
    /// random fraction in [0, 1) added to each retry delay (default: 0.1)
    #[argh(option, default = "0.1")]
    pub parked_request_retry_jitter: f64,
    /// circuit breaker of the ext_proc cluster in Envoy (default: 0 = max(2 x lot, 1024))
    #[argh(option, default = "0")]
    pub extproc_max_requests: i64,
    /// max actors resumed at once: flights and ResumeActor calls in progress (default: 0 = max(4 x lot, 4096))
    #[argh(option, default = "0")]
    pub flight_max: i64,
    /// port the workers serve on (default: 443)
    #[argh(option, default = "443")]
    pub worker_port: i64,
    /// drain: wait this long after readiness flips (Go duration) (default: 13s)
    #[argh(option, default = "String::from(\"13s\")")]
    pub drain_delay: String,
    /// drain: max wait for in-flight ext_proc streams (default: 0 = budget + max(15s, late-serve limit))
    #[argh(option, default = "String::from(\"0\")")]
    pub drain_timeout: String,
    /// address of the Envoy admin API used during drain; empty: do not drain Envoy (default: localhost:9901)
    #[argh(option, default = "String::from(\"localhost:9901\")")]
    pub envoy_admin_address: String,
    /// file written when the drain completes; empty: none (default: /var/run/atenet/drain-complete)
    #[argh(option, default = "String::from(\"/var/run/atenet/drain-complete\")")]
    pub drain_complete_file: String,
    /// route timeout Envoy applies to proxied requests (Go duration) (default: 5m)
    #[argh(option, default = "String::from(\"5m\")")]
    pub route_timeout: String,
    /// log level: error, warn, info, debug or trace (default: info)
    #[argh(option, default = "String::from(\"info\")")]
    pub log_level: String,
    /// log line format: text or json (one JSON object per line) (default: text)
    #[argh(option, default = "String::from(\"text\")")]
    pub log_format: String,
    /// how long past the budget Envoy waits for a late verdict (0 disables) (default: 30s)
    #[argh(option, default = "String::from(\"30s\")")]
    pub late_serve_limit: String,
    /// port of the HTTP listener in the generated Envoy config (default: 8080)
    #[argh(option, default = "8080")]
    pub port_http: i64,
    /// port of Envoy's health-check listener (GET /ready) in the generated config (default: 8081)
    #[argh(option, default = "8081")]
    pub port_health: i64,
    /// port of Envoy's metrics listener (GET /stats/prometheus) in the generated config (default: 9902)
    #[argh(option, default = "9902")]
    pub port_stats: i64,
}

/// A flag value the router refuses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError(pub String);

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid router configuration: {}", self.0)
    }
}

impl std::error::Error for ConfigError {}

fn invalid(message: impl Into<String>) -> ConfigError {
    ConfigError(message.into())
}

/// How the router reaches ateapi.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AteapiTransport {
    /// Plaintext (`--ateapi-insecure`).
    Insecure,
    /// TLS verified against `ca_file`, optionally with a client bundle.
    Tls { ca_file: PathBuf, client_cert: Option<PathBuf>, server_name: Option<String> },
}

/// Parking settings after normalisation (B38).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Parking {
    /// False when `--parked-request-max` <= 0 (B22).
    pub enabled: bool,
    /// Lot size; 0 when disabled.
    pub max: usize,
    /// The flight budget: the flag when enabled, 15 s when disabled (B18).
    pub budget: Duration,
    /// The flag value after normalisation, shown on the status page.
    pub configured_budget: Duration,
    pub backoff: BackoffPolicy,
}

/// The effective configuration every component reads.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    pub ateapi_address: String,
    pub ateapi_transport: AteapiTransport,
    /// A bearer token file, sent as `authorization: Bearer ...` (TLS only).
    pub ateapi_token_file: Option<PathBuf>,
    pub extproc_addr: SocketAddr,
    pub metrics_addr: SocketAddr,
    pub status_addr: Option<SocketAddr>,
    pub parking: Parking,
    /// Effective Envoy circuit breaker for the ext_proc cluster (B39).
    pub extproc_max_requests: u64,
    /// Effective cap on flights in progress (B58).
    pub flight_max: usize,
    pub worker_port: u16,
    pub drain_delay: Duration,
    /// Effective ext_proc drain timeout (B40).
    pub drain_timeout: Duration,
    pub envoy_admin_address: Option<String>,
    pub drain_complete_file: Option<PathBuf>,
    pub route_timeout: Duration,
    pub log_level: log::LevelFilter,
    pub log_format: crate::logging::Format,
    /// How long past the budget a late verdict may still arrive; zero when
    /// late serve is disabled.
    pub late_serve_limit: Duration,
    /// Envoy's HTTP listener port, for `envoy-config`.
    pub port_http: u16,
    /// Envoy's health-check listener port, for `envoy-config`.
    pub port_health: u16,
    /// Envoy's metrics listener port, for `envoy-config`.
    pub port_stats: u16,
}

/// The derived flight cap is never below this, so that a small lot (or none)
/// still leaves room for many actors resuming at once (B58).
pub const MIN_FLIGHT_MAX: usize = 4096;

/// Envoy's admin port when `--envoy-admin-address` names none.
pub const DEFAULT_ENVOY_ADMIN_PORT: u16 = 9901;

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
    /// Validates and normalises `args` (B37-B40, B46).
    pub fn from_args(args: &ServeArgs) -> Result<Config, ConfigError> {
        let parking_max = args.parked_request_max.max(0) as usize;
        let enabled = parking_max > 0;

        let budget_flag = duration("--parked-request-budget", &args.parked_request_budget)?;
        let configured_budget = budget_flag.positive().unwrap_or(Duration::from_secs(5));
        let interval = duration("--parked-request-retry-interval", &args.parked_request_retry_interval)?
            .positive()
            .unwrap_or(Duration::from_millis(100));
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

        if args.extproc_max_requests < 0 {
            return Err(invalid(format!(
                "--extproc-max-requests must not be negative, got {}",
                args.extproc_max_requests
            )));
        }
        let explicit_breaker = args.extproc_max_requests as u64;
        if enabled && explicit_breaker > 0 && explicit_breaker < parking_max as u64 {
            return Err(invalid(format!(
                "--extproc-max-requests ({explicit_breaker}) is below --parked-request-max ({parking_max}): \
                 Envoy would shed parked requests with its own 503s before they reach the lot"
            )));
        }
        let extproc_max_requests =
            if explicit_breaker > 0 { explicit_breaker } else { (2 * parking_max as u64).max(1024) };
        let flight_max = match args.flight_max {
            0 => parking_max.saturating_mul(4).max(MIN_FLIGHT_MAX),
            n if n > 0 => usize::try_from(n).unwrap_or(usize::MAX),
            n => return Err(invalid(format!("--flight-max must not be negative, got {n}"))),
        };

        let route_timeout = non_negative("--route-timeout", &args.route_timeout)?;
        let late_serve_limit = non_negative("--late-serve-limit", &args.late_serve_limit)?;
        if !late_serve_limit.is_zero() && late_serve_limit <= MESSAGE_TIMEOUT_MARGIN {
            return Err(invalid(format!(
                "--late-serve-limit ({}) must be 0 or above the {} Envoy already waits past the budget",
                godur::format(late_serve_limit),
                godur::format(MESSAGE_TIMEOUT_MARGIN)
            )));
        }
        // The longest a caller can wait for its verdict: the budget, then the
        // late-serve limit while an attempt runs on (B19, B49). Envoy takes
        // at most an hour for either of its ext_proc message timeouts.
        let longest_wait = budget + late_serve_limit;
        if budget + MESSAGE_TIMEOUT_MARGIN > MAX_ENVOY_MESSAGE_TIMEOUT
            || (!late_serve_limit.is_zero() && longest_wait > MAX_ENVOY_MESSAGE_TIMEOUT)
        {
            return Err(invalid(format!(
                "--parked-request-budget ({}) plus {} must stay within Envoy's {} ext_proc message timeout \
                 (with --late-serve-limit {})",
                godur::format(budget),
                godur::format(if late_serve_limit.is_zero() {
                    MESSAGE_TIMEOUT_MARGIN
                } else {
                    late_serve_limit
                }),
                godur::format(MAX_ENVOY_MESSAGE_TIMEOUT),
                godur::format(late_serve_limit)
            )));
        }

        let drain_delay = non_negative("--drain-delay", &args.drain_delay)?;
        let drain_timeout_flag = non_negative("--drain-timeout", &args.drain_timeout)?;
        if enabled && !drain_timeout_flag.is_zero() && drain_timeout_flag < longest_wait {
            return Err(invalid(format!(
                "--drain-timeout ({}) is below --parked-request-budget ({}) plus --late-serve-limit ({}): \
                 parked or late-served requests would be cut off",
                godur::format(drain_timeout_flag),
                godur::format(budget),
                godur::format(late_serve_limit)
            )));
        }
        let drain_timeout = if drain_timeout_flag.is_zero() {
            budget + DRAIN_SLACK.max(late_serve_limit)
        } else {
            drain_timeout_flag
        };
        let port_http = port("--port-http", args.port_http)?;
        let port_health = port("--port-health", args.port_health)?;
        let port_stats = port("--port-stats", args.port_stats)?;
        let envoy_admin_address = non_empty(&args.envoy_admin_address);
        let admin_port = envoy_admin_address
            .as_deref()
            .and_then(|a| a.rsplit_once(':'))
            .and_then(|(_, p)| p.parse::<u16>().ok())
            .unwrap_or(DEFAULT_ENVOY_ADMIN_PORT);
        let envoy_ports = [
            ("--port-http", port_http),
            ("--port-health", port_health),
            ("--port-stats", port_stats),
            ("--envoy-admin-address", admin_port),
        ];
        for (i, (flag, p)) in envoy_ports.iter().enumerate() {
            if let Some((other, _)) = envoy_ports[i + 1..].iter().find(|(_, q)| q == p) {
                return Err(invalid(format!("{flag} and {other} give Envoy the same port {p}")));
            }
        }

        let ateapi_transport = transport(args)?;
        let ateapi_token_file = non_empty(&args.ateapi_token_file).map(PathBuf::from);
        if ateapi_token_file.is_some() && ateapi_transport == AteapiTransport::Insecure {
            return Err(invalid(
                "--ateapi-token-file needs TLS: a bearer token is never sent in plaintext (drop --ateapi-insecure)",
            ));
        }
        if args.ateapi_address.trim().is_empty() {
            return Err(invalid("--ateapi-address must not be empty"));
        }
        let extproc_port = listen_port("--port-extproc", args.port_extproc)?;
        let extproc_addr = socket_addr("--extproc-address", &args.extproc_address, extproc_port)?;
        let metrics_addr = listen_addr("--metrics-listen-addr", &args.metrics_listen_addr)?;
        let status_addr = if args.status_port <= 0 {
            None
        } else {
            let p = port("--status-port", args.status_port)?;
            Some(socket_addr("--status-address", &args.status_address, p)?)
        };
        let worker_port = port("--worker-port", args.worker_port)?;
        let log_level = crate::logging::parse_level(&args.log_level).ok_or_else(|| {
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
            extproc_addr,
            metrics_addr,
            status_addr,
            parking: Parking {
                enabled,
                max: parking_max,
                budget,
                configured_budget,
                backoff: BackoffPolicy { interval, factor, jitter },
            },
            extproc_max_requests,
            flight_max,
            worker_port,
            drain_delay,
            drain_timeout,
            envoy_admin_address,
            drain_complete_file: non_empty(&args.drain_complete_file).map(PathBuf::from),
            route_timeout,
            log_level,
            log_format,
            late_serve_limit,
            port_http,
            port_health,
            port_stats,
        })
    }

    /// Envoy's ext_proc `message_timeout`: the budget plus a margin, so the
    /// router's 503 always beats Envoy's own timeout (envoy.md).
    pub fn message_timeout(&self) -> Duration {
        self.parking.budget + MESSAGE_TIMEOUT_MARGIN
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

    /// The effective values, as `(flag, value)` pairs, for the status page.
    /// Holds paths, never file contents.
    pub fn effective_flags(&self) -> Vec<(&'static str, String)> {
        let opt = |v: &Option<String>| v.clone().unwrap_or_default();
        let (ca, cert, name) = match &self.ateapi_transport {
            AteapiTransport::Insecure => (String::new(), String::new(), String::new()),
            AteapiTransport::Tls { ca_file, client_cert, server_name } => (
                ca_file.display().to_string(),
                client_cert.as_ref().map(|p| p.display().to_string()).unwrap_or_default(),
                opt(server_name),
            ),
        };
        vec![
            ("--ateapi-address", self.ateapi_address.clone()),
            ("--ateapi-insecure", (self.ateapi_transport == AteapiTransport::Insecure).to_string()),
            ("--ateapi-ca-file", ca),
            ("--ateapi-client-cert", cert),
            ("--ateapi-server-name", name),
            (
                "--ateapi-token-file",
                self.ateapi_token_file.as_ref().map(|p| p.display().to_string()).unwrap_or_default(),
            ),
            ("--extproc-address", self.extproc_addr.ip().to_string()),
            ("--port-extproc", self.extproc_addr.port().to_string()),
            ("--metrics-listen-addr", self.metrics_addr.to_string()),
            ("--status-port", self.status_addr.map_or("disabled".into(), |a| a.port().to_string())),
            ("--status-address", self.status_addr.map_or(String::new(), |a| a.ip().to_string())),
            ("--parked-request-budget", godur::format(self.parking.configured_budget)),
            ("--parked-request-max", self.parking.max.to_string()),
            ("--parked-request-retry-interval", godur::format(self.parking.backoff.interval)),
            ("--parked-request-retry-factor", self.parking.backoff.factor.to_string()),
            ("--parked-request-retry-jitter", self.parking.backoff.jitter.to_string()),
            ("--extproc-max-requests", self.extproc_max_requests.to_string()),
            ("--flight-max", self.flight_max.to_string()),
            ("--worker-port", self.worker_port.to_string()),
            ("--drain-delay", godur::format(self.drain_delay)),
            ("--drain-timeout", godur::format(self.drain_timeout)),
            ("--envoy-admin-address", opt(&self.envoy_admin_address)),
            (
                "--drain-complete-file",
                self.drain_complete_file.as_ref().map(|p| p.display().to_string()).unwrap_or_default(),
            ),
            ("--route-timeout", godur::format(self.route_timeout)),
            ("--late-serve-limit", godur::format(self.late_serve_limit)),
            ("--port-http", self.port_http.to_string()),
            ("--port-health", self.port_health.to_string()),
            ("--port-stats", self.port_stats.to_string()),
            ("--log-level", self.log_level.as_str().to_lowercase()),
            ("--log-format", self.log_format.to_string()),
        ]
    }
}

/// How long the drain waits for Envoy's downstream connections to close
/// (B43 step 3).
pub const ENVOY_DRAIN_WINDOW: Duration = Duration::from_secs(15);

fn non_empty(s: &str) -> Option<String> {
    let s = s.trim();
    (!s.is_empty()).then(|| s.to_string())
}

fn duration(flag: &str, value: &str) -> Result<godur::SignedDuration, ConfigError> {
    godur::parse(value.trim()).map_err(|e| invalid(format!("{flag}: {e}")))
}

fn non_negative(flag: &str, value: &str) -> Result<Duration, ConfigError> {
    let d = duration(flag, value)?;
    if d.negative {
        return Err(invalid(format!("{flag} must not be negative, got {value}")));
    }
    Ok(d.magnitude)
}

fn port(flag: &str, value: i64) -> Result<u16, ConfigError> {
    u16::try_from(value)
        .ok()
        .filter(|&p| p != 0)
        .ok_or_else(|| invalid(format!("{flag} must be a port in 1..=65535, got {value}")))
}

/// A port to listen on: 0 asks the kernel for a free one (used by tests and
/// `make run`-style sandboxes; the real port is logged at startup).
fn listen_port(flag: &str, value: i64) -> Result<u16, ConfigError> {
    u16::try_from(value).map_err(|_| invalid(format!("{flag} must be a port in 0..=65535, got {value}")))
}

fn socket_addr(flag: &str, host: &str, port: u16) -> Result<SocketAddr, ConfigError> {
    let host = host.trim().trim_start_matches('[').trim_end_matches(']');
    if host.is_empty() {
        return Err(invalid(format!("{flag} must not be empty")));
    }
    if let Ok(ip) = host.parse() {
        return Ok(SocketAddr::new(ip, port));
    }
    (host, port)
        .to_socket_addrs()
        .ok()
        .and_then(|mut addrs| addrs.next())
        .ok_or_else(|| invalid(format!("{flag}: cannot resolve {host:?}")))
}

/// `[host]:port` as Go's net.Listen takes it; an empty host means every
/// interface.
fn listen_addr(flag: &str, value: &str) -> Result<SocketAddr, ConfigError> {
    let value = value.trim();
    let (host, port_text) = value
        .rsplit_once(':')
        .ok_or_else(|| invalid(format!("{flag} must be [host]:port, got {value:?}")))?;
    let port_number = port_text
        .parse::<i64>()
        .map_err(|_| invalid(format!("{flag} must be [host]:port, got {value:?}")))?;
    let port = listen_port(flag, port_number)?;
    if host.is_empty() {
        return Ok(SocketAddr::from(([0, 0, 0, 0], port)));
    }
    socket_addr(flag, host, port)
}

fn transport(args: &ServeArgs) -> Result<AteapiTransport, ConfigError> {
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
        return Ok(AteapiTransport::Insecure);
    }
    let ca_file = non_empty(&args.ateapi_ca_file).ok_or_else(|| {
        invalid("--ateapi-ca-file is required to verify ateapi (or pass --ateapi-insecure for plaintext)")
    })?;
    Ok(AteapiTransport::Tls {
        ca_file: PathBuf::from(ca_file),
        client_cert: non_empty(&args.ateapi_client_cert).map(PathBuf::from),
        server_name: non_empty(&args.ateapi_server_name),
    })
}

/// Parses `serve`'s flags from an argument list (without the program name
/// and subcommand), for tests and tools that build a config from strings.
pub fn parse_serve_args(args: &[&str]) -> Result<Config, ConfigError> {
    match parse_flags("serve", args) {
        Ok(flags) => Config::from_args(&flags),
        Err(FlagsError::Help(_)) => Err(invalid("--help is not a configuration")),
        Err(FlagsError::Invalid(e)) => Err(e),
    }
}

/// Why flags did not parse.
#[derive(Debug)]
pub enum FlagsError {
    /// `--help` was asked for; the text to print.
    Help(String),
    /// A flag is unknown or its value malformed.
    Invalid(ConfigError),
}

/// Parses the flags of subcommand `command` (`serve` or `envoy-config`).
/// Both `--flag value` and `--flag=value` are accepted, as operators write
/// either (Kubernetes manifests favour the second).
pub fn parse_flags(command: &str, args: &[&str]) -> Result<ServeArgs, FlagsError> {
    let split: Vec<&str> = args
        .iter()
        .flat_map(|arg| match arg.split_once('=') {
            Some((flag, value)) if flag.starts_with("--") => vec![flag, value],
            _ => vec![*arg],
        })
        .collect();
    ServeArgs::from_args(&["atenet-router", command], &split).map_err(|exit| {
        if exit.status.is_ok() {
            FlagsError::Help(exit.output)
        } else {
            FlagsError::Invalid(invalid(exit.output.trim().to_string()))
        }
    })
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
        assert_eq!(c.extproc_addr, "127.0.0.1:50051".parse().unwrap());
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
        assert_eq!(c.envoy_admin_address.as_deref(), Some("localhost:9901"));
        assert_eq!(c.drain_complete_file, Some(PathBuf::from("/var/run/atenet/drain-complete")));
        assert_eq!(c.route_timeout, Duration::from_secs(300));
    }

    #[test]
    fn b37_rejections_name_the_flag() {
        let cases: &[(&[&str], &str)] = &[
            (&["--parked-request-retry-factor", "0.5"], "--parked-request-retry-factor"),
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
            AteapiTransport::Tls {
                ca_file: "/etc/ca.pem".into(),
                client_cert: Some("/etc/client.pem".into()),
                server_name: Some("api".into()),
            }
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
    fn status_port_disable() {
        assert_eq!(parse(&["--status-port", "0"]).unwrap().status_addr, None);
        assert_eq!(parse(&["--status-port", "-1"]).unwrap().status_addr, None);
    }
}
