//! The admin endpoints: what an operator scrapes and reads over HTTP.
//!
//! - `http`: the bounded HTTP listeners (`/metrics`, `/healthz`,
//!   `/readyz`, and the status page's);
//! - `status`: the `/statusz` page (its CSS in `status.css`);
//! - `history`, `chart`, `html`: the status page's last ten minutes
//!   (sampled on the timer thread) and their inline SVG charts, HTML text.
//!
//! May depend on everything below the assembly: `telemetry` (the metrics
//! and the recent requests it shows), `parking`, `actor`, `ateapi` (the
//! client's state on the page), `cli` (the effective flags) and
//! `lifecycle::listen` (listeners a successor can share).

pub mod chart;
pub mod history;
pub mod html;
pub mod http;
pub mod status;
