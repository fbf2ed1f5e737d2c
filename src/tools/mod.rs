//! The two tools that ship beside the router and are no part of it, built
//! only with the `testkit` feature:
//!
//! - [`sim`]: a simulated ateapi control plane (`ateapi-sim`), with a
//!   saturating worker pool and scripted answers;
//! - [`load`]: a load generator (`parkload`) that plays Envoy over ext_proc,
//!   or a client over HTTP.
//!
//! May depend on: `proto`, the router's time and duration helpers
//! (`parking::timer`, `cli::godur`, `telemetry::logging`'s JSON strings) and the
//! shared vocabulary (`actor::resume::Code`, `parking::deadline`,
//! `trace::context` for a traced load). The
//! router never depends on them.

pub mod load;
pub mod sim;
