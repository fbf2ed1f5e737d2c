//! The flags as an operator types them: every flag with its default (B65),
//! and the `--flag=value` form. Only the syntax is checked here: what the
//! values mean and whether they are acceptable is [`crate::cli::config`]'s
//! business, which reads [`ServeArgs`].

use argh::FromArgs;

/// The router's flags, as typed by an operator. `serve` and `envoy-config`
/// take the same set, so the Envoy configuration is always derived from
/// exactly the values the router runs with.
#[derive(FromArgs, Clone, Debug, PartialEq)]
#[argh(description = "The router's flags; serve and envoy-config take the same set.")]
pub struct ServeArgs {
    /// ateapi control-plane address, a gRPC target: host:port, a bare host (port 443), or dns:, unix:, ipv4:, ipv6: (default: api.ate-system.svc:443)
    #[argh(option, default = "String::from(\"api.ate-system.svc:443\")")]
    pub ateapi_address: String,
    /// PEM file of CAs that verify ateapi's server certificate (default: none; serve requires it without --ateapi-insecure)
    #[argh(option, default = "String::new()")]
    pub ateapi_ca_file: String,
    /// PEM bundle (certificate chain + unencrypted PKCS#8, PKCS#1 or SEC1 key) for mTLS to ateapi (default: none)
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
    /// most ResumeActor calls open at once, 1..=1000000; more attempts wait their turn, unsent, within their budget (default: 1024)
    #[argh(option, default = "1024")]
    pub ateapi_max_calls: i64,
    /// most ResumeActor calls one atespace may have open at once, 1..=--ateapi-max-calls (default: 0 = half of --ateapi-max-calls)
    #[argh(option, default = "0")]
    pub ateapi_max_calls_per_atespace: i64,
    /// address the ext_proc gRPC server binds: an IP or host name (with --port-extproc), or unix:/absolute/path for a Unix socket beside Envoy (default: 127.0.0.1)
    #[argh(option, default = "String::from(\"127.0.0.1\")")]
    pub extproc_address: String,
    /// with --extproc-address unix:PATH: the socket's permission bits, octal; connecting needs write permission (default: 0660)
    #[argh(option, default = "String::new()")]
    pub extproc_socket_mode: String,
    /// with --extproc-address unix:PATH: the group (name or number) the socket is given, so that Envoy's user connects through it; the router must be a member (default: none: the router's own group)
    #[argh(option, default = "String::new()")]
    pub extproc_socket_group: String,
    /// PEM certificate chain ext_proc presents (TLS; with --extproc-key-file; re-read on change) (default: none)
    #[argh(option, default = "String::new()")]
    pub extproc_cert_file: String,
    /// PEM private key of --extproc-cert-file (unencrypted PKCS#8, PKCS#1 or SEC1; re-read on change) (default: none)
    #[argh(option, default = "String::new()")]
    pub extproc_key_file: String,
    /// PEM CAs a client certificate must chain to: with it, only clients with such a certificate reach ext_proc (default: none)
    #[argh(option, default = "String::new()")]
    pub extproc_client_ca_file: String,
    /// allow plaintext ext_proc off the loopback: anyone who reaches the port can route requests and read their headers (default: off)
    #[argh(switch)]
    pub extproc_insecure: bool,
    /// port of the ext_proc gRPC server; refused with a Unix socket (default: 50051)
    #[argh(option)]
    pub port_extproc: Option<i64>,
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
    /// lot slots one atespace may hold at once; 0: no cap, else 1..=lot size (default: 0)
    #[argh(option, default = "0")]
    pub parked_request_max_per_atespace: i64,
    /// sheddable requests parked at once (ate-priority: sheddable), 0..=lot size (default: half of --parked-request-max, rounded up)
    #[argh(option)]
    pub parked_request_max_sheddable: Option<i64>,
    /// honour callers' grpc-timeout and x-envoy-expected-rq-timeout-ms while parked; takes true or false (default: true)
    #[argh(option, default = "true")]
    pub caller_deadlines: bool,
    /// delay before a parked flight's first retry (Go duration) (default: 100ms)
    #[argh(option, default = "String::from(\"100ms\")")]
    pub parked_request_retry_interval: String,
    /// multiplier applied to the retry delay after each retry, in [1, 100] (default: 1.1)
    #[argh(option, default = "1.1")]
    pub parked_request_retry_factor: f64,
    /// random fraction in [0, 1) added to each retry delay (default: 0.1)
    #[argh(option, default = "0.1")]
    pub parked_request_retry_jitter: f64,
    /// how parked requests retry a full pool or an unavailable control plane: saturation-group (one flight of a pool at a time, in budget order) or per-flight (default: saturation-group)
    #[argh(option, default = "String::from(\"saturation-group\")")]
    pub parked_request_dispatch: String,
    /// how many routers share the control plane's worker pools (a fleet behind hashing Envoys): each saturation group probes a full pool this many times less often, so that together they ask it as one router would (1..=1024) (default: 1)
    #[argh(option, default = "1")]
    pub fleet_size: i64,
    /// circuit breaker of the ext_proc cluster in Envoy (default: 0 = max(2 x lot, 1024))
    #[argh(option, default = "0")]
    pub extproc_max_requests: i64,
    /// ext_proc streams open at once, from every Envoy together; more are refused (default: 0 = (envoys + 1) x the circuit breaker)
    #[argh(option, default = "0")]
    pub extproc_max_streams: i64,
    /// max actors resumed at once: flights and ResumeActor calls in progress (default: 0 = max(4 x lot, 4096))
    #[argh(option, default = "0")]
    pub flight_max: i64,
    /// flights one atespace may have in progress at once, 1..=--flight-max (default: 0 = half of --flight-max, and more while an eighth of it stays free)
    #[argh(option, default = "0")]
    pub flight_max_per_atespace: i64,
    /// requests one atespace may hold at once, on any attempt or parked, 1..=--extproc-max-requests; more are refused at once (default: 0 = half of --extproc-max-requests, and more while an eighth of it stays free)
    #[argh(option, default = "0")]
    pub extproc_max_requests_per_atespace: i64,
    /// gRPC completion-queue threads, shared by ext_proc streams and ateapi calls, 1..=256 (default: 0 = one per core available)
    #[argh(option, default = "0")]
    pub grpc_threads: i64,
    /// port the workers serve on (default: 443)
    #[argh(option, default = "443")]
    pub worker_port: i64,
    /// CIDRs (comma-separated) a worker's address must be in; any other is a routing failure (default: empty = any unicast address that is not link-local)
    #[argh(option, default = "String::new()")]
    pub worker_networks: String,
    /// how many Envoys send this router streams: 1 is a sidecar, whose Envoy the drain drains; more is a fleet router, whose drain only leaves the fleet (1..=1024) (default: 1)
    #[argh(option, default = "1")]
    pub envoys: i64,
    /// drain: wait this long after readiness flips (Go duration) (default: 13s)
    #[argh(option, default = "String::from(\"13s\")")]
    pub drain_delay: String,
    /// drain: max wait for in-flight ext_proc streams (default: 0 = budget + max(15s, late-serve limit))
    #[argh(option, default = "String::from(\"0\")")]
    pub drain_timeout: String,
    /// address of the Envoy admin API used during drain, host:port; empty: do not drain Envoy (default: localhost:9901)
    #[argh(option, default = "String::from(\"localhost:9901\")")]
    pub envoy_admin_address: String,
    /// file written when the drain completes; empty: none (default: /var/run/atenet/drain-complete)
    #[argh(option, default = "String::from(\"/var/run/atenet/drain-complete\")")]
    pub drain_complete_file: String,
    /// how long the generated Envoy keeps an idle client connection open; the drain waits up to this plus 10s for Envoy's client connections to close (Go duration, 1s to 1h) (default: 75s)
    #[argh(option, default = "String::from(\"75s\")")]
    pub envoy_idle_timeout: String,
    /// route timeout Envoy applies to proxied requests (Go duration; 0 disables it, else at least 1ms) (default: 5m)
    #[argh(option, default = "String::from(\"5m\")")]
    pub route_timeout: String,
    /// OTLP/gRPC collector for traces, HOST:PORT (plaintext): serve exports the spans of the requests Envoy samples there, envoy-config adds Envoy's OpenTelemetry tracer exporting there (default: none: no tracing)
    #[argh(option, default = "String::new()")]
    pub otlp_traces_address: String,
    /// with --otlp-traces-address: the percent of requests the generated Envoy samples, 0 to 100; the router traces exactly the requests Envoy samples (default: 1)
    #[argh(option, default = "1.0")]
    pub trace_sample_percent: f64,
    /// log level: error, warn, info, debug or trace (default: info)
    #[argh(option, default = "String::from(\"info\")")]
    pub log_level: String,
    /// log line format: text or json (one JSON object per line) (default: text)
    #[argh(option, default = "String::from(\"text\")")]
    pub log_format: String,
    /// how long past the budget Envoy waits for a late verdict (0 disables) (default: 30s)
    #[argh(option, default = "String::from(\"30s\")")]
    pub late_serve_limit: String,
    /// IP address the generated Envoy config's HTTP, health and metrics listeners bind (default: 0.0.0.0)
    #[argh(option, default = "String::from(\"0.0.0.0\")")]
    pub envoy_listen_address: String,
    /// source ranges (CIDRs, comma-separated; empty: none) from which the generated Envoy keeps a gateway's deadline header x-envoy-expected-rq-timeout-ms; every other x-envoy-* control header is removed from every client (default: loopback)
    #[argh(option, default = "String::from(DEFAULT_TRUSTED_RANGES)")]
    pub envoy_trusted_ranges: String,
    /// heap bound of the generated Envoy's overload manager: new requests are refused at 98% of it (64Mi to 1Ti; Ki, Mi, Gi, Ti or bytes) (default: 1Gi)
    #[argh(option, default = "String::from(\"1Gi\")")]
    pub envoy_max_heap: String,
    /// for envoy-config with ext_proc TLS: PEM CAs with which Envoy verifies the router's certificate (default: none)
    #[argh(option, default = "String::new()")]
    pub envoy_router_ca_file: String,
    /// for envoy-config: Envoy's client certificate chain for the router (required with --extproc-client-ca-file) (default: none)
    #[argh(option, default = "String::new()")]
    pub envoy_router_cert_file: String,
    /// for envoy-config: the private key of --envoy-router-cert-file (default: none)
    #[argh(option, default = "String::new()")]
    pub envoy_router_key_file: String,
    /// for envoy-config: the name Envoy sends as SNI and requires in the router certificate's DNS SANs (default: none: the chain alone is verified)
    #[argh(option, default = "String::new()")]
    pub envoy_router_server_name: String,
    /// for envoy-config with ext_proc TLS: the directory where envoy-config writes, and Envoy reads, the SDS files naming Envoy's certificate files (default: none)
    #[argh(option, default = "String::new()")]
    pub envoy_sds_dir: String,
    /// for envoy-config: a fleet of routers, HOST:PORT comma-separated (a DNS name, such as a headless Service, is resolved by Envoy), that the router cluster spans with consistent hashing on the actor, health checks and retries on another router (default: none: the one router at --extproc-address)
    #[argh(option, default = "String::new()")]
    pub routers: String,
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

/// Loopback only (B88): a peer on Envoy's own host (or in its pod) is the
/// one source an address vouches for. A private address is not: behind
/// docker-proxy, kube-proxy's SNAT or an internal L4 load balancer every
/// external client has one.
pub const DEFAULT_TRUSTED_RANGES: &str = "127.0.0.0/8,::1/128";

/// Why flags did not parse.
#[derive(Debug)]
pub enum FlagsError {
    /// `--help` was asked for; the text to print.
    Help(String),
    /// A flag is unknown or its value malformed: argh's message.
    Invalid(String),
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
            FlagsError::Invalid(exit.output.trim().to_string())
        }
    })
}
