//! What the router tells about itself: its log level and format, and
//! where its traces go (B121).

use std::net::IpAddr;

use crate::cli::flags::ServeArgs;
use crate::cli::values::{invalid, ConfigError};
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
