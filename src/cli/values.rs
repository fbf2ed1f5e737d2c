//! Value parsers for the flags: durations, ports, addresses, CIDR lists;
//! each error names its flag. What the values must satisfy together, and
//! what is derived from them, is the configuration's (`config`); these
//! know no rule of the router.

use std::fmt;
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::time::Duration;

use crate::cli::godur;

/// A flag value (or combination) the router refuses; the message names
/// the flag and says why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError {
    message: String,
}

impl ConfigError {
    pub fn new(message: impl Into<String>) -> ConfigError {
        ConfigError { message: message.into() }
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid router configuration: {}", self.message)
    }
}

impl std::error::Error for ConfigError {}

pub fn invalid(message: impl Into<String>) -> ConfigError {
    ConfigError::new(message)
}

/// An address range, `ip/prefix`, as Envoy's `CidrRange` takes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CidrRange {
    pub ip: IpAddr,
    pub prefix: u8,
}

impl CidrRange {
    /// Whether `ip` is in the range; an IPv4-mapped IPv6 address counts as
    /// its IPv4 address.
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.ip.to_canonical(), ip.to_canonical()) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                let mask = u32::MAX.checked_shl(32 - u32::from(self.prefix)).unwrap_or(0);
                u32::from(net) & mask == u32::from(ip) & mask
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                let mask = u128::MAX.checked_shl(128 - u32::from(self.prefix)).unwrap_or(0);
                u128::from(net) & mask == u128::from(ip) & mask
            }
            _ => false,
        }
    }
}

/// Comma-separated CIDRs, each `ip/prefix` with a prefix that fits the
/// address (32 for IPv4, 128 for IPv6), for `flag`.
pub fn cidr_list(flag: &str, text: &str) -> Result<Vec<CidrRange>, ConfigError> {
    text.split(',')
        .map(str::trim)
        .filter(|range| !range.is_empty())
        .map(|range| {
            let bad = || {
                invalid(format!(
                    "{flag} must be CIDRs such as 10.0.0.0/8 or fc00::/7, separated by commas, got {range:?}"
                ))
            };
            let (ip, prefix) = range.split_once('/').ok_or_else(bad)?;
            let ip: IpAddr = ip.parse().map_err(|_| bad())?;
            let prefix: u8 = prefix.parse().map_err(|_| bad())?;
            let max = if ip.is_ipv4() { 32 } else { 128 };
            if prefix > max {
                return Err(bad());
            }
            Ok(CidrRange { ip, prefix })
        })
        .collect()
}

pub fn non_empty(s: &str) -> Option<String> {
    let s = s.trim();
    (!s.is_empty()).then(|| s.to_string())
}

pub fn duration(flag: &str, value: &str) -> Result<godur::SignedDuration, ConfigError> {
    godur::parse(value.trim()).map_err(|e| invalid(format!("{flag}: {e}")))
}

pub fn non_negative(flag: &str, value: &str) -> Result<Duration, ConfigError> {
    let d = duration(flag, value)?;
    if d.negative {
        return Err(invalid(format!("{flag} must not be negative, got {value}")));
    }
    Ok(d.magnitude)
}

pub fn port(flag: &str, value: i64) -> Result<u16, ConfigError> {
    u16::try_from(value)
        .ok()
        .filter(|&p| p != 0)
        .ok_or_else(|| invalid(format!("{flag} must be a port in 1..=65535, got {value}")))
}

/// A port to listen on: 0 asks the kernel for a free one (used by tests and
/// `make run`-style sandboxes; the real port is logged at startup).
pub fn listen_port(flag: &str, value: i64) -> Result<u16, ConfigError> {
    u16::try_from(value).map_err(|_| invalid(format!("{flag} must be a port in 0..=65535, got {value}")))
}

pub fn socket_addr(flag: &str, host: &str, port: u16) -> Result<SocketAddr, ConfigError> {
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
pub fn listen_addr(flag: &str, value: &str) -> Result<SocketAddr, ConfigError> {
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
/// The port of `address`, given as `flag`, which must be `host:port`: a
/// port in 1..=65535 and a host name or IPv4 address (letters, digits,
/// `.`, `-`, `_`), or an IPv6 address in brackets. A value without a usable
/// port or host is refused rather than connected to, or rendered as,
/// something else (B70, B131).
pub fn host_port(flag: &str, address: &str) -> Result<u16, ConfigError> {
    let bad = |why: &str| invalid(format!("{flag} must be host:port ([ipv6]:port), got {address:?}: {why}"));
    let (host, port_text) = address.rsplit_once(':').ok_or_else(|| bad("no port"))?;
    let port = port_text
        .parse::<u16>()
        .ok()
        .filter(|&p| p != 0)
        .ok_or_else(|| bad("the port is not in 1..=65535"))?;
    let bracketed = host.strip_prefix('[').and_then(|h| h.strip_suffix(']'));
    let host_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_');
    match bracketed {
        Some(ip) if ip.parse::<std::net::Ipv6Addr>().is_err() => Err(bad("not an IPv6 address in brackets")),
        Some(_) => Ok(port),
        None if host.is_empty() => Err(bad("no host")),
        None if !host.chars().all(host_char) => Err(bad("not a host name or address")),
        None => Ok(port),
    }
}

/// The gRPC target `target`, given as `flag`: `host:port`, a bare host
/// (gRPC's port 443) or `[ipv6]:port` as [`host_port`] checks them (an
/// IPv6 zone allowed), or a URI with a scheme gRPC 1.56 resolves,
/// `scheme:[//authority]path[?query]`: `dns:` (any authority, the DNS
/// server; a path of such a host), `unix:` and `unix-abstract:` (no
/// authority; a path or name), `ipv4:` and `ipv6:` (no authority; a list of
/// `a.b.c.d:port` or `[ipv6]:port`, empty entries skipped as gRPC skips
/// them). Spaces and control characters are refused in any form (B131).
pub fn grpc_target(flag: &str, target: &str) -> Result<(), ConfigError> {
    if target.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(invalid(format!("{flag} must not contain spaces or control characters, got {target:?}")));
    }
    let refuse = |why: &str| Err(invalid(format!("{flag} {target:?} {why}")));
    let Some((scheme, rest)) = ["dns", "unix", "unix-abstract", "ipv4", "ipv6"]
        .iter()
        .find_map(|scheme| Some((*scheme, target.strip_prefix(scheme)?.strip_prefix(':')?)))
    else {
        return grpc_host(flag, target);
    };
    // gRPC's URI: the query and fragment play no part in these schemes.
    let rest = rest.split(['?', '#']).next().unwrap_or_default();
    let (authority, path) = match rest.strip_prefix("//") {
        Some(after) => after.split_once('/').map_or((Some(after), ""), |(a, path)| (Some(a), path)),
        None => (None, rest.strip_prefix('/').unwrap_or(rest)),
    };
    if scheme != "dns" && authority.is_some_and(|a| !a.is_empty()) {
        return refuse(&format!("names an authority, which {scheme}: targets do not take"));
    }
    match scheme {
        "dns" if path.is_empty() => refuse("names no host"),
        "dns" => grpc_host(flag, path),
        "unix" | "unix-abstract" if path.trim_start_matches('/').is_empty() => refuse("names no socket"),
        "unix" | "unix-abstract" => Ok(()),
        _ => {
            let addresses: Vec<&str> = path.split(',').filter(|a| !a.is_empty()).collect();
            if addresses.is_empty() {
                return refuse("names no address");
            }
            for address in addresses {
                let unzoned = without_zone(address);
                host_port(flag, &unzoned)?;
                let host = unzoned.rsplit_once(':').map_or("", |(host, _)| host);
                let ip = match host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
                    Some(v6) => scheme == "ipv6" && v6.parse::<std::net::Ipv6Addr>().is_ok(),
                    None => scheme == "ipv4" && host.parse::<std::net::Ipv4Addr>().is_ok(),
                };
                if !ip {
                    return refuse(&format!("lists {address:?}, which is no {scheme} address:port"));
                }
            }
            Ok(())
        }
    }
}

/// `target` without the `%zone` of a bracketed IPv6 address: a zone names an
/// interface, not part of the address.
fn without_zone(target: &str) -> String {
    match (target.find('%'), target.find(']')) {
        (Some(zone), Some(end)) if zone < end => format!("{}{}", &target[..zone], &target[end..]),
        _ => target.to_string(),
    }
}

/// A host with an optional port (gRPC's 443 without one), for
/// [`grpc_target`].
fn grpc_host(flag: &str, target: &str) -> Result<(), ConfigError> {
    let unzoned = without_zone(target);
    let bare = !unzoned.contains(':') || (unzoned.starts_with('[') && unzoned.ends_with(']'));
    host_port(flag, &if bare { format!("{unzoned}:443") } else { unzoned }).map(|_| ())
}

/// A DNS name as Envoy resolves it: dot-separated labels of letters,
/// digits and inner hyphens, 253 characters at most; one trailing dot
/// (a fully qualified name) is allowed.
pub fn is_dns_name(host: &str) -> bool {
    let name = host.strip_suffix('.').unwrap_or(host);
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            (1..=63).contains(&label.len())
                && label.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
        && name.rsplit('.').next().is_some_and(|tld| !tld.bytes().all(|b| b.is_ascii_digit()))
}
