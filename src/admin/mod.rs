//! The admin endpoints: what an operator scrapes and reads over HTTP.
//!
//! - `http`: the bounded HTTP listeners (`/metrics`, `/healthz`,
//!   `/readyz`, and the status page's);
//! - `status`: the `/statusz` page (its CSS in `status.css`);
//! - `recent`, `history`, `chart`, `html`: what the status page shows of
//!   the last requests and the verdicts given, its last ten minutes
//!   (sampled on the timer thread) and their inline SVG charts, HTML text.
//!
//! May depend on: `telemetry`, `parking`, `actor`, `ateapi` (the client's
//! state on the page) and `cli` (the effective flags). The Envoy side
//! records into `recent`; nothing here reaches the Envoy side.

pub mod chart;
pub mod history;
pub mod html;
pub mod http;
pub mod recent;
pub mod status;
