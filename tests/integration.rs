//! Every Rust integration test, in one binary: each `tests/*.rs` file is a
//! module of it, so gRPC's C core and OpenSSL are linked once, not once per
//! file (24 binaries of about 250 MB each before). `common` is the shared
//! harness; a module that needs the router's internals says so with its
//! own `#![cfg(feature = "testkit")]`. Run one file's tests with
//! `cargo test --release --features testkit,fault-injection --test integration -- <module>::`.

#[cfg(feature = "testkit")]
mod common;

mod architecture;
mod ateapi_answers;
mod auth;
mod cli;
mod contract;
mod crash;
mod deadlines;
mod drain;
mod extproc_tls;
mod flood;
mod fuzz;
mod handover;
mod health;
mod hostile;
mod http_limits;
mod logging;
mod otlp_answers;
mod parking;
mod parkload;
mod priority;
mod routing;
mod saturation;
mod soak;
mod status;
mod systemd;
mod tenants;
mod unix_socket;
