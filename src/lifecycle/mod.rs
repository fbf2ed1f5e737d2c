//! The process's lifecycle: how a router starts beside others, hands over
//! to a successor and drains.
//!
//! - [`process`], [`systemd`], [`signals`]: the process wiring (panic
//!   policy, open files), the notify protocol, and what each signal means
//!   when;
//! - `start_lock`: the lock under which a starting router checks its
//!   ports and its socket's path and binds them;
//! - `listen`, `socket_path`: listeners a successor can share, and
//!   ext_proc's Unix socket path, checked and taken over by a rename;
//! - [`handover`], `listeners`: the SIGHUP hand-over: starting the
//!   successor and waiting for its word; the running router's listeners
//!   steered, emptied and handed to it;
//! - [`drain`]: the drain sequence.
//!
//! May depend on: `cli` (the configuration), `telemetry` and
//! `envoy::bootstrap` (the stat prefixes a drain reads). The assembled
//! router is reached only through the seam defined here
//! (`drain::Drained`), never by name; the admin listeners hand themselves
//! over (`admin::http`), on the sockets `listen` shares.

pub mod drain;
pub mod handover;
pub mod process;
pub mod signals;
pub mod systemd;

// Internal: public with `testkit` only (declared one by one so that
// rustfmt follows every file).
#[cfg(feature = "testkit")]
pub mod listen;
#[cfg(not(feature = "testkit"))]
pub(crate) mod listen;
#[cfg(feature = "testkit")]
pub mod listeners;
#[cfg(not(feature = "testkit"))]
pub(crate) mod listeners;
#[cfg(feature = "testkit")]
pub mod socket_path;
#[cfg(not(feature = "testkit"))]
pub(crate) mod socket_path;
#[cfg(feature = "testkit")]
pub mod start_lock;
#[cfg(not(feature = "testkit"))]
pub(crate) mod start_lock;
