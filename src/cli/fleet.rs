//! `--routers` (B87): the fleet of routers the generated Envoy's
//! `atenet_router` cluster spans, each `HOST:PORT`.
//!
//! A host is an IP address (IPv6 in brackets) or a DNS name, which Envoy
//! resolves itself (a Kubernetes headless Service names every router pod).
//! The names end up inside the bootstrap's YAML, so only the characters of
//! a DNS name are accepted: a value can never inject configuration.
//!
//! Errors are the message alone (naming the flag): [`crate::cli::config`]
//! makes them a `ConfigError`, so this module does not depend on it.

use std::fmt;
use std::net::IpAddr;
use std::time::Duration;

use crate::cli::values::is_dns_name;

/// The most routers `--routers` may name: far beyond any fleet one Envoy
/// hashes over (a headless Service counts as one entry, however many pods
/// it resolves to), and a bound on the bootstrap a typo can produce.
pub const MAX_ROUTERS: usize = 64;

/// How often each Envoy checks each router's gRPC health (B84),
/// traffic or not (`no_traffic_interval` is the same: a cluster only
/// ext_proc uses counts as idle in Envoy 1.40).
pub const HEALTH_CHECK_INTERVAL: Duration = Duration::from_secs(1);
/// How long a health check may take before it counts as failed.
pub const HEALTH_CHECK_TIMEOUT: Duration = Duration::from_secs(1);

/// The shortest `--drain-delay` a fleet takes (B87): a router's health
/// turns NOT_SERVING at its drain's first moment, and one NOT_SERVING
/// answer takes it out of an Envoy's rotation; the next check comes within
/// an interval and answers within the timeout, so a router that stopped
/// accepting streams sooner than both (and a margin of an interval) would
/// refuse streams Envoy still sends it.
pub const MIN_FLEET_DRAIN_DELAY: Duration =
    Duration::from_secs(2 * HEALTH_CHECK_INTERVAL.as_secs() + HEALTH_CHECK_TIMEOUT.as_secs());

/// `envoy-config --routers` with the routers' `--drain-delay`: at least
/// [`MIN_FLEET_DRAIN_DELAY`].
pub fn check_fleet_drain_delay(drain_delay: Duration) -> Result<(), String> {
    if drain_delay < MIN_FLEET_DRAIN_DELAY {
        return Err(invalid(format!(
            "a fleet needs --drain-delay of at least {}s, got {}: every Envoy checks each router's health \
             every {}s (timeout {}s), and a draining router must still accept streams until all have seen it \
             leave",
            MIN_FLEET_DRAIN_DELAY.as_secs(),
            crate::cli::godur::format(drain_delay),
            HEALTH_CHECK_INTERVAL.as_secs(),
            HEALTH_CHECK_TIMEOUT.as_secs()
        )));
    }
    Ok(())
}

/// One router of the fleet, as `--routers` names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RouterHost {
    /// An IP address (without brackets) or a DNS name, lower-cased.
    pub host: String,
    pub port: u16,
}

impl RouterHost {
    /// Whether Envoy must resolve the host (a DNS name), rather than
    /// connect to it as written (an IP address).
    pub fn is_name(&self) -> bool {
        self.host.parse::<IpAddr>().is_err()
    }
}

impl fmt::Display for RouterHost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
        }
    }
}

fn invalid(message: impl Into<String>) -> String {
    format!("--routers: {}", message.into())
}

/// Parses `--routers`: empty (or only blanks) is no fleet, the one router
/// at `--extproc-address`; otherwise comma-separated `HOST:PORT` entries,
/// none empty, none twice, at most [`MAX_ROUTERS`].
pub fn parse_routers(text: &str) -> Result<Vec<RouterHost>, String> {
    if text.trim().is_empty() {
        return Ok(Vec::new());
    }
    let mut routers: Vec<RouterHost> = Vec::new();
    for (i, entry) in text.split(',').map(str::trim).enumerate() {
        if entry.is_empty() {
            return Err(invalid(format!(
                "entry {} is empty in {:?}: name each router as HOST:PORT, separated by single commas",
                i + 1,
                text.trim()
            )));
        }
        let router = parse_entry(entry)?;
        if let Some(same) = routers.iter().find(|r| **r == router) {
            return Err(invalid(format!(
                "{entry:?} names {same} a second time: each router once, or Envoy would weigh it double"
            )));
        }
        routers.push(router);
        if routers.len() > MAX_ROUTERS {
            return Err(invalid(format!(
                "at most {MAX_ROUTERS} routers (a headless Service's name counts once, however many pods it \
                 resolves to)"
            )));
        }
    }
    Ok(routers)
}

/// One `HOST:PORT` entry.
fn parse_entry(entry: &str) -> Result<RouterHost, String> {
    let (host, port) = entry
        .rsplit_once(':')
        .ok_or_else(|| invalid(format!("{entry:?} has no port: name each router as HOST:PORT")))?;
    let port = match port.parse::<u16>() {
        Ok(0) => {
            return Err(invalid(format!("{entry:?} has port 0: Envoy needs the port each router listens on")))
        }
        Ok(port) => port,
        Err(_) => {
            return Err(invalid(format!("{entry:?} has no valid port (1 to 65535) after its last ':'")))
        }
    };
    let host = if let Some(inner) = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        match inner.parse::<IpAddr>() {
            Ok(IpAddr::V6(ip)) => ip.to_string(),
            _ => return Err(invalid(format!("{entry:?}: only an IPv6 address goes in brackets"))),
        }
    } else if let Ok(ip) = host.parse::<IpAddr>() {
        if ip.is_ipv6() {
            return Err(invalid(format!("{entry:?}: write an IPv6 address in brackets, [{ip}]:PORT")));
        }
        ip.to_string()
    } else if is_dns_name(host) {
        host.to_ascii_lowercase()
    } else {
        return Err(invalid(format!(
            "{entry:?}: the host is neither an IP address nor a DNS name (letters, digits, '-' and '.', \
             labels of 1 to 63 characters)"
        )));
    };
    if host.parse::<IpAddr>().is_ok_and(|ip| ip.is_unspecified()) {
        return Err(invalid(format!("{entry:?}: an unspecified address names no router")));
    }
    Ok(RouterHost { host, port })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hosts(text: &str) -> Vec<String> {
        parse_routers(text).unwrap().iter().map(ToString::to_string).collect()
    }

    #[test]
    fn b87_names_and_addresses() {
        assert!(parse_routers("").unwrap().is_empty());
        assert!(parse_routers("  ").unwrap().is_empty());
        assert_eq!(hosts("10.0.0.1:50051"), ["10.0.0.1:50051"]);
        assert_eq!(
            hosts(" a.example:1 , [::1]:2,Router-0.NS.svc.cluster.local.:3 "),
            ["a.example:1", "[::1]:2", "router-0.ns.svc.cluster.local.:3"]
        );
        let r = parse_routers("atenet-router-fleet:50051,127.0.0.1:50052").unwrap();
        assert!(r[0].is_name() && !r[1].is_name());
        assert_eq!(r[1].host, "127.0.0.1");
    }

    #[test]
    fn b87_bad_values_are_refused_with_the_flag_named() {
        for (bad, says) in [
            ("a:1,,b:2", "entry 2 is empty"),
            ("a:1,", "entry 2 is empty"),
            (",a:1", "entry 1 is empty"),
            ("a:0", "port 0"),
            ("a", "has no port"),
            ("a:", "no valid port"),
            ("a:65536", "no valid port"),
            ("a:x", "no valid port"),
            ("::1:50051", "in brackets"),
            ("[10.0.0.1]:1", "only an IPv6 address"),
            ("0.0.0.0:1", "unspecified"),
            ("[::]:1", "unspecified"),
            ("a\"b:1", "neither"),
            ("a b:1", "neither"),
            ("-a:1", "neither"),
            ("a..b:1", "neither"),
            ("1.2.3.999:1", "neither"),
            ("a:1,A:1", "a second time"),
            ("[::1]:5,[0::1]:5", "a second time"),
        ] {
            let e = parse_routers(bad).unwrap_err();
            assert!(e.contains("--routers") && e.contains(says), "{bad}: {e}");
        }
        let many: Vec<String> = (0..=MAX_ROUTERS).map(|i| format!("10.0.0.{}:1", i + 1)).collect();
        assert!(parse_routers(&many[..MAX_ROUTERS].join(",")).is_ok());
        let e = parse_routers(&many.join(",")).unwrap_err();
        assert!(e.contains("at most 64"), "{e}");
    }
}
