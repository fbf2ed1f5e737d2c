//! The command line and the configuration derived from it.
//!
//! One direction only: [`flags`] parses what the operator typed into
//! [`flags::ServeArgs`] and knows nothing else; [`config`] validates those
//! values and derives every setting the router runs with, one type per
//! component; [`command`] joins the two into what `main` does; [`fleet`]
//! reads `--routers`. [`godur`] is the duration syntax every flag and log
//! line uses, [`size`] the byte sizes (`512Mi`), [`values`] the parsers of
//! single values (ports, addresses, CIDRs) that `config` applies.
//!
//! May depend on: `parking::backoff` and `parking::share` (the retry and
//! share policies it derives) and `telemetry::logging` (the log level and format
//! it parses); nothing that runs.

pub mod command;
pub mod config;
pub mod flags;
pub mod fleet;
pub mod godur;
pub mod size;
pub mod values;
