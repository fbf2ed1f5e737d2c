//! atenet-router: Envoy's external processor for actor routing, with
//! request parking.
//!
//! Envoy asks the router, over ext_proc, where each request goes. The router
//! resumes the target actor through the ateapi control plane and answers
//! with the worker's address. When the worker pool is momentarily saturated
//! it parks the request, retrying the resume inside a bounded budget, instead
//! of failing it. `docs/behavior.md` is the contract; rules are cited
//! as B1, B2, ...
//!
//! Reading order: [`target`] (which actor), [`flight`] (one resume per
//! actor), [`resolver`] and [`lot`] (parking), [`verdict`] (what the client
//! gets), then [`extproc`] and [`ateapi`] for the gRPC edges.

pub mod ateapi;
pub mod backoff;
pub mod clock;
pub mod config;
pub mod drain;
pub mod envoy;
pub mod extproc;
pub mod flight;
pub mod godur;
pub mod http;
pub mod load;
pub mod logging;
pub mod lot;
pub mod metrics;
pub mod pem;
pub mod process;
pub mod proto;
pub mod resolver;
pub mod resume;
pub mod router;
pub mod sim;
pub mod status;
pub mod systemd;
pub mod target;
pub mod timer;
pub mod verdict;
pub mod version;
