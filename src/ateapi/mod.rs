//! The control-plane client: which actor a request names, the
//! `ResumeActor` call that resumes it, the channel and credentials it runs
//! over, and what its answers mean.
//!
//! - `target`: the actor a request addresses, from its headers and
//!   attributes (a pure function);
//! - `resume`: the vocabulary of a resume: its result, codes, and the
//!   mapping of a `ResumeActorResponse` onto them;
//! - `client`: the ateapi channel, one per completion queue, implementing
//!   parking's `Resumer`, with credentials read and checked by `tls`.
//!
//! May depend on: `proto`; `client` also on `parking::flight` (the seam it
//! implements), `ops::metrics`, `cli::config` (its transport), `tls`
//! (its credential files) and `trace::context` (the `traceparent` it sends).

pub mod client;
pub mod resume;
pub mod target;
