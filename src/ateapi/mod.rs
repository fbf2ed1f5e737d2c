//! The control-plane client: the `ResumeActor` call that resumes an actor,
//! the channel and credentials it runs over, and the mapping of its
//! answers onto `actor::resume`.
//!
//! - `client`: the ateapi channel, one per completion queue, implementing
//!   parking's `Resumer`, with credentials read and checked by `tls`.
//!
//! May depend on: `proto`, `actor`, `parking::flight` (the seam it
//! implements), `telemetry::metrics`, `cli::config` (its transport),
//! `tls` (its credential files), `trace::context` (the `traceparent`
//! it sends) and `unary` (how it reads an answer).

pub mod client;
