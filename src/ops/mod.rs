//! Operations: what an operator runs, scrapes and signals.
//!
//! - `http`, `status`, `metrics`: the bounded HTTP listeners, the
//!   `/statusz` page, and the Prometheus registry;
//! - `recent`, `history`, `chart`, `html`: what the status page shows of
//!   the last requests and the verdicts given, its last ten minutes
//!   (sampled on the timer thread) and their inline SVG charts, HTML text;
//! - [`logging`], [`process`], [`version`]: the log sink, the process
//!   wiring (panic policy, open files), the build's identity;
//! - [`systemd`], [`drain`], [`handover`], `listen`, [`signals`]: the
//!   notify protocol, the drain sequence, the SIGHUP hand-over, listeners a
//!   successor can share, and what each signal means when;
//! - `socket_path`: ext_proc's Unix socket path, checked, and taken over
//!   by a rename;
//! - `start_lock`: the lock under which a starting router checks its
//!   ports and its socket's path and binds them.
//!
//! May depend on everything below the assembly: `metrics` names the label
//! sets of `parking`, `ateapi` and `envoy`; `status` reads their state;
//! `drain` drives a running `router::Router`. `logging`, `process`,
//! `version`, `systemd`, `signals`, `listen`, `socket_path` and `start_lock` depend on
//! nothing of the crate.

pub mod drain;
pub mod handover;
pub mod logging;
pub mod process;
pub mod signals;
pub mod systemd;
pub mod version;

// Internal: public with `testkit` only (declared one by one so that
// rustfmt follows every file).
#[cfg(feature = "testkit")]
pub mod chart;
#[cfg(not(feature = "testkit"))]
pub(crate) mod chart;
#[cfg(feature = "testkit")]
pub mod history;
#[cfg(not(feature = "testkit"))]
pub(crate) mod history;
#[cfg(feature = "testkit")]
pub mod html;
#[cfg(not(feature = "testkit"))]
pub(crate) mod html;
#[cfg(feature = "testkit")]
pub mod http;
#[cfg(not(feature = "testkit"))]
pub(crate) mod http;
#[cfg(feature = "testkit")]
pub mod listen;
#[cfg(not(feature = "testkit"))]
pub(crate) mod listen;
#[cfg(feature = "testkit")]
pub mod metrics;
#[cfg(not(feature = "testkit"))]
pub(crate) mod metrics;
#[cfg(feature = "testkit")]
pub mod recent;
#[cfg(not(feature = "testkit"))]
pub(crate) mod recent;
#[cfg(feature = "testkit")]
pub mod socket_path;
#[cfg(not(feature = "testkit"))]
pub(crate) mod socket_path;
#[cfg(feature = "testkit")]
pub mod start_lock;
#[cfg(not(feature = "testkit"))]
pub(crate) mod start_lock;
#[cfg(feature = "testkit")]
pub mod status;
#[cfg(not(feature = "testkit"))]
pub(crate) mod status;
