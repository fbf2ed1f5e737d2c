//! Tracing: the spans that show where a request's time went (B121-B126),
//! joined to Envoy's trace and exported over OTLP/gRPC.
//!
//! - `context`: W3C trace context: what Envoy's `traceparent` says, ids,
//!   and the header the router sends on;
//! - `span`: the spans the router builds from what it already knows, and
//!   the [`span::Tracer`] handle that queues them without waiting;
//! - `export`: the one exporter thread, its batches and its OTLP calls.
//!
//! Nothing here exists without `--otlp-traces-address`: no thread, no queue,
//! no span.
//!
//! May depend on: `proto` (the OTLP messages) and `unary` (how an answer
//! is read); the dropped-span counter is handed in.

pub mod context;
pub mod export;
pub mod span;
