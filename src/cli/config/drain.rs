//! The drain: how long it waits and for what, the Envoy it drains, the
//! file it leaves when done, and how many Envoys send this router streams.

use std::path::PathBuf;
use std::time::Duration;

use super::{derived_drain_timeout, Parking};
use crate::cli::flags::ServeArgs;
use crate::cli::godur;
use crate::cli::values::{host_port, invalid, non_empty, non_negative, ConfigError};

/// Envoy's admin port when `--envoy-admin-address` names none.
const DEFAULT_ENVOY_ADMIN_PORT: u16 = 9901;

/// The most Envoys `--envoys` may name: far beyond any fleet one router
/// serves, and few enough that the derived stream cap stays meaningful.
const MAX_ENVOYS: u32 = 1024;

/// The drain's settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Drain {
    /// How long the router stays up, unready, before it drains anything.
    pub delay: Duration,
    /// The longest the drain waits for ext_proc streams.
    pub timeout: Duration,
    /// Envoy's admin API, which a sidecar's drain drains; `None`: no Envoy.
    pub envoy_admin_address: Option<String>,
    /// The port of `envoy_admin_address`, or Envoy's default: where the
    /// bootstrap binds Envoy's admin.
    pub envoy_admin_port: u16,
    /// Written when the drain completes.
    pub complete_file: Option<PathBuf>,
    /// How many Envoys send this router streams: 1 is a sidecar's router,
    /// more a fleet router's.
    pub envoys: u32,
}

impl Drain {
    /// The drain flags; the drain must outlast the longest wait of a parked
    /// caller (B37), unless parking is off (B46).
    pub(super) fn from_args(args: &ServeArgs, parking: &Parking) -> Result<Drain, ConfigError> {
        let delay = non_negative("--drain-delay", &args.drain_delay)?;
        let explicit = non_negative("--drain-timeout", &args.drain_timeout)?;
        if parking.enabled && !explicit.is_zero() && explicit < parking.longest_wait() {
            return Err(invalid(format!(
                "--drain-timeout ({}) is below --parked-request-budget ({}) plus --late-serve-limit ({}): \
                 parked or late-served requests would be cut off",
                godur::format(explicit),
                godur::format(parking.budget),
                godur::format(parking.late_serve_limit)
            )));
        }
        let timeout = if explicit.is_zero() { derived_drain_timeout(parking) } else { explicit };
        let envoy_admin_address = non_empty(&args.envoy_admin_address);
        let envoy_admin_port = match &envoy_admin_address {
            Some(address) => host_port("--envoy-admin-address", address)?,
            None => DEFAULT_ENVOY_ADMIN_PORT,
        };
        Ok(Drain {
            delay,
            timeout,
            envoy_admin_address,
            envoy_admin_port,
            complete_file: non_empty(&args.drain_complete_file).map(PathBuf::from),
            envoys: envoys(args.envoys)?,
        })
    }

    /// Whether several Envoys share this router (B85): its drain then only
    /// leaves the fleet, and drains no Envoy.
    pub fn is_fleet_router(&self) -> bool {
        self.envoys > 1
    }
}

/// `--envoys`: 1 (a sidecar's router) to [`MAX_ENVOYS`].
fn envoys(flag: i64) -> Result<u32, ConfigError> {
    u32::try_from(flag).ok().filter(|n| (1..=MAX_ENVOYS).contains(n)).ok_or_else(|| {
        invalid(format!(
            "--envoys must be 1 (a sidecar's router) to {MAX_ENVOYS} (the Envoys of a fleet that send this \
             router streams), got {flag}"
        ))
    })
}
