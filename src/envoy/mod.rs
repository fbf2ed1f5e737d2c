//! The Envoy side: the ext_proc gRPC service Envoy calls for every request,
//! its streams, the verdicts it answers with, and the Envoy bootstrap that
//! matches the router's flags.
//!
//! - `extproc`: the service and one task per stream, from the first message
//!   to the verdict that ends it;
//! - `streams`: the bound on open streams;
//! - `ending`: who ends a stream once its verdict is out (B77, B104);
//! - `health`: gRPC's health service on the same port, which Envoy's
//!   health checks call;
//! - `verdict`: what a caller's outcome becomes on the wire;
//! - [`bootstrap`]: the Envoy configuration, generated from the same flags;
//! - `fleet`: its router cluster, one sidecar's router or a fleet (B87).
//!
//! May depend on: `parking` (a stream's wait), `ateapi` (which actor, what
//! a resume returned), `ops` (metrics, logs, the status page's recent
//! requests), `cli` (the bootstrap reads the configuration), `trace` (a
//! sampled stream's route span), `proto`.

pub mod bootstrap;

// Internal: public with `testkit` only (declared one by one so that
// rustfmt follows every file).
#[cfg(feature = "testkit")]
pub mod ending;
#[cfg(not(feature = "testkit"))]
pub(crate) mod ending;
#[cfg(feature = "testkit")]
pub mod extproc;
#[cfg(not(feature = "testkit"))]
pub(crate) mod extproc;
#[cfg(feature = "testkit")]
pub mod fleet;
#[cfg(not(feature = "testkit"))]
pub(crate) mod fleet;
#[cfg(feature = "testkit")]
pub mod health;
#[cfg(not(feature = "testkit"))]
pub(crate) mod health;
#[cfg(feature = "testkit")]
pub mod streams;
#[cfg(not(feature = "testkit"))]
pub(crate) mod streams;
#[cfg(feature = "testkit")]
pub mod verdict;
#[cfg(not(feature = "testkit"))]
pub(crate) mod verdict;
