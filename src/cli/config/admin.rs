//! The router's HTTP endpoints: `/metrics` with the health checks, and the
//! status page.

use std::net::SocketAddr;

use crate::cli::flags::ServeArgs;
use crate::cli::values::{invalid, listen_addr, socket_addr, ConfigError};

/// Where the admin endpoints listen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Admin {
    /// `/metrics`, `/healthz` and `/readyz`.
    pub metrics_addr: SocketAddr,
    /// `/statusz`; `None`: disabled.
    pub status_addr: Option<SocketAddr>,
}

impl Admin {
    pub(super) fn from_args(args: &ServeArgs) -> Result<Admin, ConfigError> {
        let metrics_addr = listen_addr("--metrics-listen-addr", &args.metrics_listen_addr)?;
        let status_addr = match args.status_port {
            p if p <= 0 => None,
            p => {
                let port = u16::try_from(p).map_err(|_| {
                    invalid(format!(
                        "--status-port must be a port in 1..=65535, or 0 for no status page, got {p}"
                    ))
                })?;
                Some(socket_addr("--status-address", &args.status_address, port)?)
            }
        };
        Ok(Admin { metrics_addr, status_addr })
    }
}

#[cfg(test)]
mod tests {
    use crate::cli::config::tests::parse;

    #[test]
    fn status_port_disable() {
        assert_eq!(parse(&["--status-port", "0"]).unwrap().admin.status_addr, None);
        assert_eq!(parse(&["--status-port", "-1"]).unwrap().admin.status_addr, None);
        let err = parse(&["--status-port", "70000"]).err().unwrap().to_string();
        assert!(err.contains("1..=65535, or 0 for no status page, got 70000"), "{err}");
    }
}
