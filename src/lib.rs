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
//! The public API is what runs a router: parse a command line
//! ([`flags`]) into a [`config::Config`], start a [`router::Router`],
//! [`drain`] it, print its Envoy bootstrap ([`envoy`]), and the process
//! wiring around them ([`logging`], [`process`], [`systemd`], [`version`]).
//! Everything else is internal. The `testkit` feature makes the internals
//! public for the integration tests and benchmarks, and adds the simulated
//! control plane ([`sim`]) and the load generator ([`load`]) behind
//! `ateapi-sim` and `parkload`; it adds no behaviour to the router.
//!
//! Reading order of the internals: `target` (which actor), `flight` (one
//! resume per actor), `resolver` and `lot` (parking), `verdict` (what the
//! client gets), then `extproc` and `ateapi` for the gRPC edges.

pub mod config;
pub mod drain;
pub mod envoy;
pub mod flags;
pub mod godur;
pub mod handover;
pub mod logging;
pub mod process;
pub mod router;
pub mod systemd;
pub mod version;

/// Declares modules that are internal, and public with `testkit`.
macro_rules! internal {
    ($($module:ident),* $(,)?) => {
        $(
            #[cfg(feature = "testkit")]
            pub mod $module;
            #[cfg(not(feature = "testkit"))]
            mod $module;
        )*
    };
}

internal!(
    ateapi, backoff, clock, deadline, extproc, flight, http, listen, lot, metrics, pem, proto, resolver,
    resume, status, streams, target, timer, verdict
);

#[cfg(feature = "testkit")]
pub mod load;
#[cfg(feature = "testkit")]
pub mod sim;
