//! Telemetry: what every part records into.
//!
//! - [`logging`]: the log sink;
//! - `metrics`: the Prometheus registry, every series resolved once from
//!   the label enums;
//! - `recent`: the last requests and the verdicts given, which the
//!   status page shows;
//! - [`version`]: the build's identity.
//!
//! May depend on: `parking` and `actor` (the label sets `metrics` names),
//! and `envoy::verdict`'s route outcomes: the one arrow up the layers
//! (`tests/architecture.rs`), as the request path's labels are the Envoy
//! side's. `logging`, `recent` and `version` depend on nothing of the
//! crate.

pub mod logging;
pub mod version;

// Internal: public with `testkit` only.
#[cfg(feature = "testkit")]
pub mod metrics;
#[cfg(not(feature = "testkit"))]
pub(crate) mod metrics;
#[cfg(feature = "testkit")]
pub mod recent;
#[cfg(not(feature = "testkit"))]
pub(crate) mod recent;
