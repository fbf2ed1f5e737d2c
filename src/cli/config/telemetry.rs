//! What the router tells about itself: its log level and format, and
//! where its traces go (B121).

use std::net::{Ipv4Addr, Ipv6Addr};

use crate::cli::flags::ServeArgs;
use crate::cli::values::{invalid, is_dns_name, ConfigError};
use crate::telemetry::logging;

/// Logging and tracing.
#[derive(Clone, Debug, PartialEq)]
pub struct Telemetry {
    pub log_level: log::LevelFilter,
    pub log_format: logging::Format,
    /// `--otlp-traces-address`: `None` traces nothing.
    pub tracing: Option<Tracing>,
}

/// Where traces go, and how much Envoy samples. One type, as the sample
/// percent means something only with a collector to export to.
#[derive(Clone, Debug, PartialEq)]
pub struct Tracing {
    /// The OTLP/gRPC collector, `HOST:PORT`.
    pub address: String,
    pub host: String,
    pub port: u16,
    /// Envoy's random sampling, in percent, 0 to 100.
    pub sample_percent: f64,
}

impl Telemetry {
    pub(super) fn from_args(args: &ServeArgs) -> Result<Telemetry, ConfigError> {
        let log_level = logging::parse_level(&args.log_level).ok_or_else(|| {
            invalid(format!(
                "--log-level must be error, warn, info, debug or trace, got {:?}",
                args.log_level
            ))
        })?;
        let log_format = args
            .log_format
            .parse()
            .map_err(|_| invalid(format!("--log-format must be text or json, got {:?}", args.log_format)))?;
        Ok(Telemetry { log_level, log_format, tracing: tracing(args)? })
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
    let malformed = || {
        invalid(format!(
            "--otlp-traces-address must be HOST:PORT (a DNS name, an IPv4 address or [an IPv6 address]), \
             got {address:?}"
        ))
    };
    let (host, port) = address.rsplit_once(':').ok_or_else(malformed)?;
    let port: u16 = port.parse().ok().filter(|p| *p > 0).ok_or_else(malformed)?;
    let host = match host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        Some(inner) if inner.parse::<Ipv6Addr>().is_ok() => inner,
        Some(_) => return Err(malformed()),
        // An IPv6 address without brackets: `::1:4317` names no one port.
        None if host.parse::<Ipv4Addr>().is_ok() || is_dns_name(host) => host,
        None => return Err(malformed()),
    };
    Ok(Some(Tracing { address: address.to_string(), host: host.to_string(), port, sample_percent: percent }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use argh::FromArgs;

    fn traced(address: &str) -> Result<Option<Tracing>, ConfigError> {
        let args = ServeArgs::from_args(&["serve"], &["--otlp-traces-address", address]).unwrap();
        tracing(&args)
    }

    #[test]
    fn b125_a_collector_is_a_dns_name_an_ipv4_address_or_a_bracketed_ipv6_one() {
        for (address, host) in
            [("otel-collector:4317", "otel-collector"), ("10.0.0.1:4317", "10.0.0.1"), ("[::1]:4317", "::1")]
        {
            assert_eq!(traced(address).unwrap().unwrap().host, host, "{address}");
        }
        let long_label = format!("{}:1", "a".repeat(64));
        for bad in ["a\u{1}b:1", "h..:1", "a_b:1", "-x:1", "::1:4317", "[otel]:4317", "otel:0", &long_label] {
            assert!(traced(bad).is_err(), "{bad:?}");
        }
    }
}
