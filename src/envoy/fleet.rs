//! The router cluster of the generated bootstrap (docs/envoy.md): one
//! router beside its Envoy, or with `--routers` a fleet that every
//! Envoy hashes over, so that all requests for an actor, from every Envoy,
//! reach the same router and share its one flight.
//!
//! Kept apart from the bootstrap's listeners: these are the parts
//! that differ between the two layouts. The bootstrap uses this module,
//! never the other way round, so it hands over what both name (the
//! cluster's name).

use std::fmt::Write;
use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use crate::cli::config::{Config, ExtprocListen};
use crate::cli::fleet::{RouterHost, HEALTH_CHECK_INTERVAL, HEALTH_CHECK_TIMEOUT};

/// The filter-state key of an actor named by B2 (the attribute
/// `filter_state['dev.ate.target.actor']`).
const ACTOR_FILTER_STATE: &str = "dev.ate.target.actor";

/// The side-stream metadata key the filter-state actor is copied into:
/// the ext_proc stream has a filter state of its own, so a cluster hash
/// policy on filter state sees nothing (measured on 1.40).
pub const ACTOR_FS_METADATA: &str = "ate-target-actor-fs";

/// Connections one Envoy may hold to one router: one carries its whole
/// circuit breaker (the router allows 2 x the breaker per connection);
/// a hand-over or a GOAWAY has a second open while the first
/// drains; twice that for headroom. (Envoy 1.40's per-host breaker takes
/// only `max_connections`.)
const ROUTER_HOST_MAX_CONNECTIONS: u32 = 4;

/// How often Envoy re-resolves a router name (a headless Service): a new
/// router pod gets its share within this; a leaving one is out of the
/// rotation sooner, by its health.
const DNS_REFRESH: &str = "5s";

/// How often Envoy pings each of its connections to a router (B102), in
/// either layout. A router that hangs (its process stopped, its kernel
/// still holding the connection open) answers no ping, and Envoy closes the
/// connection [`ROUTER_KEEPALIVE_TIMEOUT`] later: the streams on it that the
/// router had not answered, parked ones above all, are then retried on
/// another router instead of waiting for their message timeout.
pub const ROUTER_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(1);
/// How long Envoy waits for a ping's answer before it closes the
/// connection: three intervals, so that a router that is only slow (a
/// loaded machine) is not taken for a hung one.
pub const ROUTER_KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(3);

/// The bounds the bootstrap puts on every connection (B89), which the
/// router cluster keeps in either layout: handed over by the bootstrap,
/// which owns them.
pub struct ConnectionLimits {
    pub buffer_bytes: u64,
    pub h2_stream_window: u32,
    pub h2_connection_window: u32,
}

impl ConnectionLimits {
    /// The cluster's buffer limit line and its HTTP/2 options, with the
    /// keepalive.
    fn render(&self) -> (String, String) {
        (
            format!("    per_connection_buffer_limit_bytes: {}\n", self.buffer_bytes),
            format!(
                "          http2_protocol_options:\n\
                 \x20           initial_stream_window_size: {}\n\
                 \x20           initial_connection_window_size: {}\n\
                 \x20           # A router that leaves a ping unanswered is hung: its connection is closed, its streams retried (B102).\n\
                 \x20           connection_keepalive: {{ interval: {}, timeout: {} }}\n",
                self.h2_stream_window,
                self.h2_connection_window,
                seconds(ROUTER_KEEPALIVE_INTERVAL),
                seconds(ROUTER_KEEPALIVE_TIMEOUT),
            ),
        )
    }
}

/// The oldest Envoy a fleet's bootstrap works on: a cluster-level
/// `hash_policy` in `HttpProtocolOptions` arrived in 1.37 (envoyproxy/envoy
/// PR #41928); everything else of it was measured on 1.40.
pub const FLEET_MIN_ENVOY_VERSION: &str = "1.37";

/// The oldest Envoy a fleet's bootstrap works on; `None` for a sidecar's,
/// which needs no more than the bootstrap's own minimum.
pub fn fleet_min_envoy_version(config: &Config) -> Option<&'static str> {
    (!config.envoy.routers.is_empty()).then_some(FLEET_MIN_ENVOY_VERSION)
}

fn seconds(d: Duration) -> String {
    format!("{}s", d.as_secs())
}

/// The ext_proc `grpc_service.initial_metadata` of a fleet: the
/// actor, from the header (its first value) or the filter state,
/// copied onto the side stream, which carries no client header of its
/// own, for the cluster's hash policy. Empty for a sidecar. (Envoy leaves
/// an entry out when its value is empty: such a stream lands on any
/// router, which answers it as B3 says.)
pub fn ext_proc_metadata(config: &Config) -> String {
    if config.envoy.routers.is_empty() {
        return String::new();
    }
    format!(
        "                # A fleet (B87): the side stream carries no client header, so the actor is\n\
         \x20               # copied onto it for the router cluster's hash policy.\n\
         \x20               initial_metadata:\n\
         \x20               - {{ key: ate-target-actor, value: \"%REQ(ate-target-actor)%\" }}\n\
         \x20               - {{ key: {ACTOR_FS_METADATA}, value: \"%FILTER_STATE({ACTOR_FILTER_STATE}:PLAIN)%\" }}\n"
    )
}

/// What a fleet adds to the ext_proc retry policy (B87): the retry goes to
/// another router. With MAGLEV the same hash would pick the same, dead,
/// router until its health or outlier detection removed it; the
/// `previous_hosts` predicate makes each retry choose again elsewhere.
/// Empty for a sidecar.
pub fn ext_proc_retry_hosts(config: &Config) -> String {
    if config.envoy.routers.is_empty() {
        return String::new();
    }
    "                  # A fleet (B87): each retry goes to a router not tried yet.\n\
     \x20                 retry_host_predicate:\n\
     \x20                 - name: envoy.retry_host_predicates.previous_hosts\n\
     \x20                   typed_config:\n\
     \x20                     \"@type\": type.googleapis.com/envoy.extensions.retry.host.previous_hosts.v3.PreviousHostsPredicate\n\
     \x20                 host_selection_retry_max_attempts: 5\n"
        .to_string()
}

/// The router cluster, named `name`: the one router at `--extproc-address`
/// (a sidecar), or the fleet of `--routers`. `transport_socket` is its TLS,
/// if any, already rendered.
pub fn router_cluster(
    config: &Config,
    name: &str,
    transport_socket: &str,
    limits: &ConnectionLimits,
) -> String {
    if config.envoy.routers.is_empty() {
        sidecar_cluster(config, name, transport_socket, limits)
    } else {
        fleet_cluster(config, name, &config.envoy.routers, transport_socket, limits)
    }
}

/// The circuit breaker of the router cluster, for all routers together:
/// every open ext_proc stream, a parked request's included, holds one
/// request; after a router restart every one of them may be retried at
/// once (Envoy's default allows 3 retries in flight).
fn breaker(config: &Config) -> String {
    format!(
        "    circuit_breakers:\n\
         \x20     thresholds:\n\
         \x20     - priority: DEFAULT\n\
         \x20       max_requests: {breaker}\n\
         \x20       max_retries: {breaker}\n",
        breaker = config.extproc.max_requests
    )
}

fn sidecar_cluster(config: &Config, name: &str, transport_socket: &str, limits: &ConnectionLimits) -> String {
    let (buffer_limit, http2_options) = limits.render();
    let address = match &config.extproc.listen {
        ExtprocListen::Tcp(addr) => {
            let ip = match addr.ip() {
                ip if ip.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
                ip => ip,
            };
            format!("socket_address: {{ address: \"{ip}\", port_value: {} }}", addr.port())
        }
        // The router's Unix socket (B98): Envoy connects to the path; a
        // pipe's `mode` applies only to a listener Envoy binds.
        ExtprocListen::Unix(socket) => format!("pipe: {{ path: \"{}\" }}", socket.path.display()),
    };
    format!(
        r#"  - name: {name}
    type: STATIC
    connect_timeout: 0.250s
{buffer_limit}    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config:
{http2_options}    # Every open ext_proc stream, a parked request's included, holds one
    # request; after a router restart every one of them may be retried at
    # once (Envoy's default allows 3 retries in flight).
{breaker}{transport_socket}    load_assignment:
      cluster_name: {name}
      endpoints:
      - lb_endpoints:
        - endpoint:
            address:
              {address}
"#,
        breaker = breaker(config),
    )
}

/// The fleet (B87): MAGLEV over the routers, hashing the actor; gRPC
/// health checks of each router (B84) every second, traffic or not, and
/// no panic mode (a router that is down is never chosen, even when most
/// are); outlier detection for a router that dies between two checks;
/// names resolved by Envoy (STRICT_DNS).
fn fleet_cluster(
    config: &Config,
    name: &str,
    routers: &[RouterHost],
    transport_socket: &str,
    limits: &ConnectionLimits,
) -> String {
    let (buffer_limit, http2_options) = limits.render();
    let mut y = String::new();
    let _ = write!(
        y,
        "  # A fleet of {count} router entr{plural} (B87): every Envoy hashes the actor over the\n\
         \x20 # healthy routers, so that one router holds each actor's flight.\n\
         \x20 - name: {name}\n",
        count = routers.len(),
        plural = if routers.len() == 1 { "y" } else { "ies" },
    );
    if routers.iter().any(RouterHost::is_name) {
        let _ = write!(
            y,
            "    # Names (a headless Service: one address per router pod) are resolved by Envoy.\n\
             \x20   cluster_type:\n\
             \x20     name: envoy.cluster.dns\n\
             \x20     typed_config:\n\
             \x20       \"@type\": type.googleapis.com/envoy.extensions.clusters.dns.v3.DnsCluster\n\
             \x20       dns_lookup_family: V4_PREFERRED\n\
             \x20       respect_dns_ttl: false\n\
             \x20       dns_refresh_rate: {DNS_REFRESH}\n\
             \x20       dns_failure_refresh_rate: {{ base_interval: 1s, max_interval: 10s }}\n"
        );
    } else {
        y.push_str("    type: STATIC\n");
    }
    let _ = write!(
        y,
        r#"    connect_timeout: 0.250s
{buffer_limit}    lb_policy: MAGLEV
    # A router that is down or draining is never chosen, however few are left.
    common_lb_config:
      healthy_panic_threshold: {{ value: 0 }}
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config:
{http2_options}        # The actor of the header, else of the filter state, both copied onto
        # the stream by the ext_proc filter's initial_metadata.
        hash_policy:
        - header: {{ header_name: ate-target-actor }}
          terminal: true
        - header: {{ header_name: {fs} }}
{breaker}      per_host_thresholds:
      - priority: DEFAULT
        max_connections: {per_host}
    # gRPC health (B84): NOT_SERVING from a drain's first moment ejects the
    # router at once; a cluster only ext_proc uses counts as idle, so the
    # no-traffic interval is the interval.
    health_checks:
    - timeout: {timeout}
      interval: {interval}
      no_traffic_interval: {interval}
      unhealthy_threshold: 2
      healthy_threshold: 1
      grpc_health_check: {{}}
    # A router that dies between two checks: refused connections and reset
    # streams (local origin) eject it at the third.
    outlier_detection:
      split_external_local_origin_errors: true
      consecutive_local_origin_failure: 3
      enforcing_consecutive_local_origin_failure: 100
      consecutive_gateway_failure: 5
      enforcing_consecutive_gateway_failure: 100
      enforcing_consecutive_5xx: 0
      interval: 1s
      base_ejection_time: 10s
      max_ejection_percent: 100
{transport_socket}    load_assignment:
      cluster_name: {name}
      endpoints:
      - lb_endpoints:
"#,
        fs = ACTOR_FS_METADATA,
        breaker = breaker(config),
        per_host = ROUTER_HOST_MAX_CONNECTIONS,
        timeout = seconds(HEALTH_CHECK_TIMEOUT),
        interval = seconds(HEALTH_CHECK_INTERVAL),
    );
    for router in routers {
        let _ = writeln!(
            y,
            "        - endpoint:\n\
             \x20           address:\n\
             \x20             socket_address: {{ address: \"{}\", port_value: {} }}",
            router.host, router.port
        );
    }
    y
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::config::parse_serve_args;

    const LIMITS: ConnectionLimits =
        ConnectionLimits { buffer_bytes: 32768, h2_stream_window: 65536, h2_connection_window: 1 << 20 };

    fn fleet(routers: &str) -> Config {
        parse_serve_args(&["--ateapi-insecure", "--routers", routers]).unwrap()
    }

    /// B102: a stream retried off a hung router starts a fresh budget on the
    /// next one while Envoy's message timeout runs on from the first send;
    /// Envoy's slowest detection (its jitter adds up to 15 %) must stay
    /// inside the margin the message timeout grants past the budget, or the
    /// retried request gets Envoy's 504 before that router's verdict.
    #[test]
    fn b102_a_hung_router_is_found_inside_the_message_timeout_margin() {
        let slowest = ROUTER_KEEPALIVE_INTERVAL.mul_f64(1.15) + ROUTER_KEEPALIVE_TIMEOUT;
        assert!(
            slowest + Duration::from_millis(500) < crate::cli::config::MESSAGE_TIMEOUT_MARGIN,
            "{slowest:?}"
        );
        assert!(crate::router::MIN_PING_INTERVAL * 2 <= ROUTER_KEEPALIVE_INTERVAL);
    }

    #[test]
    fn b87_a_sidecar_has_no_fleet_parts() {
        let c = parse_serve_args(&["--ateapi-insecure"]).unwrap();
        assert_eq!(ext_proc_metadata(&c), "");
        assert_eq!(ext_proc_retry_hosts(&c), "");
        let y = router_cluster(&c, "atenet_router", "", &LIMITS);
        assert!(
            y.contains("type: STATIC") && y.contains(r#"address: "127.0.0.1", port_value: 50051"#),
            "{y}"
        );
        assert!(!y.contains("MAGLEV") && !y.contains("health_checks"));
        assert!(y.contains("per_connection_buffer_limit_bytes: 32768\n"), "B89 in a sidecar's cluster: {y}");
        assert!(
            y.contains("initial_stream_window_size: 65536\n")
                && y.contains("initial_connection_window_size: 1048576\n")
        );
    }

    #[test]
    fn b87_a_fleet_of_addresses_is_static_and_hashes_the_actor() {
        let c = fleet("10.0.0.1:50051,[fd00::2]:50052");
        let y = router_cluster(&c, "atenet_router", "", &LIMITS);
        assert!(y.contains("type: STATIC") && !y.contains("envoy.cluster.dns"), "{y}");
        assert!(y.contains("lb_policy: MAGLEV") && y.contains("healthy_panic_threshold: { value: 0 }"));
        assert!(y.contains("per_connection_buffer_limit_bytes: 32768\n"), "B89 in a fleet's cluster: {y}");
        assert!(
            y.contains("initial_stream_window_size: 65536\n")
                && y.contains("initial_connection_window_size: 1048576\n")
        );
        assert!(y.contains("- header: { header_name: ate-target-actor }\n          terminal: true\n"));
        assert!(y.contains("- header: { header_name: ate-target-actor-fs }"));
        assert!(y.contains("interval: 1s\n      no_traffic_interval: 1s\n"), "{y}");
        assert!(y.contains("grpc_health_check: {}") && y.contains("max_connections: 4"));
        assert!(y.contains("max_requests: 2048"), "the breaker of the flags (B39: 2 x the lot)");
        assert!(y.contains(r#"address: "10.0.0.1", port_value: 50051"#));
        assert!(y.contains(r#"address: "fd00::2", port_value: 50052"#));
        assert!(ext_proc_metadata(&c).contains("%FILTER_STATE(dev.ate.target.actor:PLAIN)%"));
        assert!(ext_proc_retry_hosts(&c).contains("previous_hosts"));
    }

    #[test]
    fn b87_a_name_is_resolved_by_envoy() {
        let y = router_cluster(
            &fleet("atenet-router-fleet.atenet.svc.cluster.local:50051"),
            "atenet_router",
            "",
            &LIMITS,
        );
        assert!(y.contains("name: envoy.cluster.dns") && !y.contains("type: STATIC"), "{y}");
        assert!(y.contains(r#"address: "atenet-router-fleet.atenet.svc.cluster.local", port_value: 50051"#));
    }
}
