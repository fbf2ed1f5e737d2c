//! Parking: one resume per actor however many requests wait for it, and
//! a bounded wait for the requests while that resume retries.
//!
//! - `flight`: the flight table, and each flight's attempts, retries and
//!   outcome;
//! - `resolver`: a caller's two-phase wait on a flight, and its account;
//! - `lot`: the slots parked callers hold, and each atespace's share;
//! - `share`: each atespace's share of the flights and of the requests the
//!   router holds;
//! - `groups`: the saturation groups, whose flights are sent one at a
//!   time in order (B109-B112);
//! - `calls`: the bound on the ResumeActor calls open at once;
//! - `band`: a request's priority band;
//! - `backoff`, `timer`, `clock`, `deadline`: retry delays, the one timer
//!   thread, time as a seam, and a caller's own deadline.
//!
//! Nothing here touches a network: the control plane is the `Resumer`
//! seam, time the `Clock` and `Scheduler` seams, so the unit tests script
//! all three.
//!
//! May depend on: `ateapi`'s vocabulary only (`target`, `resume`),
//! `trace`'s spans (a traced flight's and its attempts'), and `proto`
//! (headers, for a caller's deadline).

pub mod backoff;
pub mod band;
pub mod calls;
pub mod clock;
pub mod deadline;
pub mod flight;
pub mod groups;
pub mod lot;
pub mod resolver;
pub mod share;
pub mod timer;
