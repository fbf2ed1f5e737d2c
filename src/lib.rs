//! atenet-router: Envoy's external processor for actor routing, with
//! request parking.
//!
//! Envoy asks the router, over ext_proc, where each request goes. The router
//! resumes the target actor through the ateapi control plane and answers
//! with the worker's address. When the worker pool is momentarily saturated
//! it parks the request, retrying the resume inside a bounded budget, instead
//! of failing it. `docs/behavior.md` is the contract; rules are cited
//! as B1, B2, ...; `docs/architecture.md` maps them onto the modules.
//!
//! The crate is a few folders, each one concept, in the order a request
//! meets them:
//!
//! - [`envoy`]: the Envoy side: the ext_proc service, its streams, the
//!   verdicts, and the bootstrap generator;
//! - `parking`: the flight table, the lot, the caller's wait, retries and
//!   time;
//! - `ateapi`: the control-plane client: the `ResumeActor` call, its
//!   credentials and what its answers mean;
//! - `actor`: which actor a request names, and what resuming it returns;
//! - [`telemetry`]: logs, metrics and the build's identity;
//! - `admin`: the HTTP endpoints and the status page;
//! - [`lifecycle`]: the process: signals, systemd, the start lock, the
//!   hand-over and the drain;
//! - [`cli`]: the command line and the configuration derived from it;
//! - `trace`: the spans of a request, its flight and its attempts, and
//!   their OTLP exporter (only with `--otlp-traces-address`);
//! - `unary`: how the router's gRPC clients read a unary answer, which a
//!   peer that breaks the protocol must not turn into a panic;
//! - `tls`: credential files, checked with OpenSSL, for the control
//!   plane's channel and the ext_proc listener;
//! - `tools` (with `testkit`): the simulator and the load generator, which
//!   ship beside the router and are no part of it.
//!
//! [`router`] assembles them. Each folder's module doc says what it may
//! depend on, and `tests/architecture.rs` keeps the modules free of cycles.
//!
//! The public API is what runs a router: parse a command line
//! ([`cli::command`]) into a [`cli::config::Config`], start a
//! [`router::Router`], drain it ([`lifecycle::drain`]), print its Envoy bootstrap
//! ([`envoy::bootstrap`]), and the process wiring around them
//! ([`telemetry::logging`], [`lifecycle::process`], [`lifecycle::systemd`], [`telemetry::version`],
//! [`lifecycle::handover`]). Everything else is internal. The `testkit` feature
//! makes the internals public for the integration tests and benchmarks,
//! and adds the tools behind `ateapi-sim` and `parkload`; it adds no
//! behaviour to the router.

pub mod cli;
pub mod envoy;
pub mod lifecycle;
pub mod router;
pub mod telemetry;

// Internal folders: public with `testkit` only. Their own modules are
// `pub`, which leaves them crate-visible while the folder is not. Declared
// one by one (no macro) so that rustfmt follows every file.
#[cfg(feature = "testkit")]
pub mod actor;
#[cfg(not(feature = "testkit"))]
pub(crate) mod actor;
#[cfg(feature = "testkit")]
pub mod admin;
#[cfg(not(feature = "testkit"))]
pub(crate) mod admin;
#[cfg(feature = "testkit")]
pub mod ateapi;
#[cfg(not(feature = "testkit"))]
pub(crate) mod ateapi;
#[cfg(feature = "testkit")]
pub mod parking;
#[cfg(not(feature = "testkit"))]
pub(crate) mod parking;
#[cfg(feature = "testkit")]
pub mod proto;
#[cfg(not(feature = "testkit"))]
pub(crate) mod proto;
#[cfg(feature = "testkit")]
pub mod tls;
#[cfg(not(feature = "testkit"))]
pub(crate) mod tls;

#[cfg(feature = "testkit")]
pub mod trace;
#[cfg(not(feature = "testkit"))]
pub(crate) mod trace;

#[cfg(feature = "testkit")]
pub mod tools;
#[cfg(feature = "testkit")]
pub mod unary;
#[cfg(not(feature = "testkit"))]
pub(crate) mod unary;
