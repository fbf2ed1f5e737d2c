//! What `envoy-config` writes into Envoy's bootstrap and `serve` never
//! reads (but for the idle timeout, which bounds the drain): Envoy's
//! listeners, its trusted ranges, heap bound and timeouts, its TLS to the
//! router and the fleet of routers.

use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use crate::cli::flags::ServeArgs;
use crate::cli::fleet::{parse_routers, RouterHost};
use crate::cli::size;
use crate::cli::values::{cidr_list, invalid, non_empty, non_negative, port, CidrRange, ConfigError};

use super::ExtProc;

/// The smallest `--envoy-max-heap`: an idle Envoy already uses about 10 MiB
/// of heap (measured on 1.40), so a smaller bound would refuse requests
/// from the start, or soon after.
pub const MIN_ENVOY_MAX_HEAP: u64 = 64 << 20;

/// The largest `--envoy-max-heap`: more than any machine this runs on has,
/// so a larger value can only be a typo (a missing unit reads as bytes,
/// which the minimum catches; an extra digit or unit, this).
const MAX_ENVOY_MAX_HEAP: u64 = 1 << 40;

/// The settings of the generated Envoy.
#[derive(Clone, Debug, PartialEq)]
pub struct EnvoyBootstrap {
    /// The address of Envoy's HTTP, health and metrics listeners.
    pub listen_ip: IpAddr,
    /// Envoy's HTTP listener port.
    pub port_http: u16,
    /// Envoy's health-check listener port.
    pub port_health: u16,
    /// Envoy's metrics listener port.
    pub port_stats: u16,
    /// Where Envoy takes a request for internal and keeps its x-envoy-*
    /// headers.
    pub trusted_ranges: Vec<CidrRange>,
    /// The heap bound of Envoy's overload manager, in bytes.
    pub max_heap: u64,
    /// How long Envoy keeps an idle client connection.
    pub idle_timeout: Duration,
    /// The route timeout Envoy applies to proxied requests; zero: none.
    pub route_timeout: Duration,
    /// Envoy's TLS to the router as given; see [`EnvoyBootstrap::router_tls`].
    pub router_tls: EnvoyRouterTlsFlags,
    /// `--routers`: the fleet the router cluster spans; empty for a
    /// sidecar's one router.
    pub routers: Vec<RouterHost>,
}

/// Envoy's TLS flags as given, checked only by `envoy-config`
/// ([`EnvoyBootstrap::router_tls`]): `serve` never reads Envoy's files.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EnvoyRouterTlsFlags {
    pub ca_file: Option<PathBuf>,
    pub cert_file: Option<PathBuf>,
    pub key_file: Option<PathBuf>,
    pub server_name: Option<String>,
    pub sds_dir: Option<PathBuf>,
}

/// Envoy's side of ext_proc TLS: the files Envoy reads, named in the SDS
/// files `envoy-config` writes into `sds_dir`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EnvoyRouterTls {
    pub ca_file: PathBuf,
    /// Envoy's client certificate and key, when the router asks for one.
    pub client_cert: Option<(PathBuf, PathBuf)>,
    pub server_name: Option<String>,
    pub sds_dir: PathBuf,
}

impl EnvoyBootstrap {
    /// The bootstrap's flags. Envoy's admin, at `admin_port` (the drain's
    /// `--envoy-admin-address`), shares Envoy's ports with its listeners, so
    /// no two of them may be the same (B70).
    pub(super) fn from_args(args: &ServeArgs, admin_port: u16) -> Result<EnvoyBootstrap, ConfigError> {
        let route_timeout = route_timeout(args)?;
        let listen_ip = args.envoy_listen_address.trim().parse().map_err(|_| {
            invalid(format!(
                "--envoy-listen-address must be an IP address, got {:?}",
                args.envoy_listen_address
            ))
        })?;
        let port_http = port("--port-http", args.port_http)?;
        let port_health = port("--port-health", args.port_health)?;
        let port_stats = port("--port-stats", args.port_stats)?;
        let ports = [
            ("--port-http", port_http),
            ("--port-health", port_health),
            ("--port-stats", port_stats),
            ("--envoy-admin-address", admin_port),
        ];
        for (i, (flag, p)) in ports.iter().enumerate() {
            if let Some((other, _)) = ports[i + 1..].iter().find(|(_, q)| q == p) {
                return Err(invalid(format!("{flag} and {other} give Envoy the same port {p}")));
            }
        }
        Ok(EnvoyBootstrap {
            listen_ip,
            port_http,
            port_health,
            port_stats,
            routers: parse_routers(&args.routers).map_err(ConfigError::new)?,
            idle_timeout: idle_timeout(args)?,
            trusted_ranges: cidr_list("--envoy-trusted-ranges", &args.envoy_trusted_ranges)?,
            max_heap: max_heap(args)?,
            route_timeout,
            router_tls: EnvoyRouterTlsFlags {
                ca_file: non_empty(&args.envoy_router_ca_file).map(PathBuf::from),
                cert_file: non_empty(&args.envoy_router_cert_file).map(PathBuf::from),
                key_file: non_empty(&args.envoy_router_key_file).map(PathBuf::from),
                server_name: non_empty(&args.envoy_router_server_name),
                sds_dir: non_empty(&args.envoy_sds_dir).map(PathBuf::from),
            },
        })
    }

    /// Envoy's side of ext_proc TLS (B86): with TLS on the router, the CA
    /// that verifies it and the SDS directory are needed, and a client
    /// certificate exactly when the router asks for one; without TLS, none
    /// of these flags means anything and each is refused.
    pub fn router_tls(&self, extproc: &ExtProc) -> Result<Option<EnvoyRouterTls>, ConfigError> {
        let flags = &self.router_tls;
        let Some(tls) = &extproc.tls else {
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
        let client_cert = match (&tls.client_ca_file, &flags.cert_file, &flags.key_file) {
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

/// `--envoy-idle-timeout` (B76): bounded both ways, since it bounds the drain.
/// Envoy reads 0 as never, which would hold a drain for good.
fn idle_timeout(args: &ServeArgs) -> Result<Duration, ConfigError> {
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

/// `--envoy-max-heap` (B90).
fn max_heap(args: &ServeArgs) -> Result<u64, ConfigError> {
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::cli::config::tests::{error, parse};

    #[test]
    fn b76_envoy_idle_timeout_takes_1s_to_1h_and_sets_the_drain_window() {
        let c = parse(&["--envoy-idle-timeout", "4s"]).unwrap();
        assert_eq!(
            (c.envoy.idle_timeout, c.envoy_drain_window()),
            (Duration::from_secs(4), Duration::from_secs(14))
        );
        assert_eq!(
            parse(&["--envoy-idle-timeout", "1h"]).unwrap().envoy.idle_timeout,
            Duration::from_secs(3600)
        );
        for bad in ["0", "999ms", "1h0m0.001s", "-1s", "soon", ""] {
            assert!(error(&["--envoy-idle-timeout", bad]).contains("--envoy-idle-timeout"), "{bad:?}");
        }
    }

    #[test]
    fn b90_envoy_max_heap_takes_64mi_to_1ti() {
        let heap = |args: &[&str]| parse(args).unwrap().envoy.max_heap;
        assert_eq!(heap(&[]), 1 << 30, "default 1Gi");
        assert_eq!(heap(&["--envoy-max-heap", "64Mi"]), 64 << 20);
        assert_eq!(heap(&["--envoy-max-heap=1Ti"]), 1 << 40);
        assert_eq!(heap(&["--envoy-max-heap", "3221225472"]), 3 << 30);
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
    fn b86_envoys_side_of_ext_proc_tls_is_checked_for_envoy_config() {
        let router_tls = |args: &[&str]| {
            let c = parse(args).unwrap();
            c.envoy.router_tls(&c.extproc).map_err(|e| e.to_string())
        };
        let mtls = router_tls(&[
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
        ]);
        assert!(mtls.unwrap_err().contains("--envoy-router-cert-file"));
        assert!(router_tls(&[]).unwrap().is_none());
        let stray = router_tls(&["--envoy-router-ca-file", "/eca"]);
        assert!(stray.unwrap_err().contains("--envoy-router-ca-file"));
        let no_ca =
            router_tls(&["--extproc-cert-file", "/c", "--extproc-key-file", "/k", "--envoy-sds-dir", "/s"]);
        assert!(no_ca.unwrap_err().contains("--envoy-router-ca-file"));
    }
}
