//! The actor a request names, and what resuming it can return: the
//! vocabulary the Envoy side, parking and the ateapi client share.
//!
//! - `target`: the actor a request addresses, from Envoy's headers and
//!   attributes (a pure function);
//! - `resume`: the vocabulary of a resume: its result and codes.
//!
//! May depend on: `proto` (the header map it reads).

pub mod resume;
pub mod target;
