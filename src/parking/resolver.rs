//! One caller's way from an actor id to a [`ResumeOutcome`]: join the
//! actor's flight, wait, park, and be served or shed (B21, B23-B28).
//!
//! The wait has two phases. Phase 1 lasts until the flight is done or hits
//! its first retryable failure (the park transition). Only then does the
//! caller take a lot slot, so a request resolved on the first attempt never
//! competes for one and a full lot never slows traffic to running actors.
//! Phase 2 holds the slot until the flight is done.
//!
//! Every caller, on any attempt, holds a unit of its atespace's share of the
//! requests the router holds, from before it joins a flight until it
//! has its answer: a tenant whose first attempts are slow cannot take every
//! stream Envoy lets through, and its excess is refused at once.
//!
//! A caller is a future, not a thread: a parked request costs a waker in its
//! flight and a slot counter, whatever the number of parked requests. What
//! must happen exactly once for a caller (its lot decision, its slot's
//! release, its wait sample) is owned by one [`Account`], whose transitions
//! consume what they finish and whose drop settles whatever the caller left
//! undone.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use std::time::Instant;

use crate::actor::resume::{ResumeError, Resumed};
use crate::actor::target::ActorId;
use crate::parking::band::Band;
use crate::parking::clock::Clock;
use crate::parking::flight::{
    Caller, Flight, FlightEvent, FlightOutcome, FlightRefusal, FlightTable, FlightWait, Role, Until,
};
use crate::parking::lot::{LotDecision, ParkingLot, Refusal, Release, Slot, WaitOutcome};
use crate::parking::share::{AtespaceShares, ShareHold, SharePolicy};
use crate::parking::timer::{sleep_until, Scheduler, Sleep};
use crate::trace::span::{FlightPlace, RouteTrace};

/// B21's per-caller `resume` label.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResumeLabel {
    /// This caller led a flight that resumed the actor.
    Triggered,
    /// This caller joined a flight that resumed the actor.
    Joined,
    /// The actor was already running.
    None,
    /// The flight failed (or the caller never got a result).
    Unknown,
}

impl ResumeLabel {
    /// Every value, in the order of their discriminants.
    pub const ALL: [ResumeLabel; 4] =
        [ResumeLabel::Triggered, ResumeLabel::Joined, ResumeLabel::None, ResumeLabel::Unknown];

    /// The label value.
    pub fn name(self) -> &'static str {
        match self {
            ResumeLabel::Triggered => "triggered",
            ResumeLabel::Joined => "joined",
            ResumeLabel::None => "none",
            ResumeLabel::Unknown => "unknown",
        }
    }
}

/// Why a caller gets no route.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ResolveError {
    /// A terminal resume error.
    Failed(ResumeError),
    /// The flight's budget ended on a retryable error.
    BudgetExhausted(ResumeError),
    /// The lot was full at this caller's park transition.
    LotFull,
    /// The actor had no flight and `--flight-max` flights were in progress.
    FlightsFull,
    /// The actor had no flight and its atespace had its share of flights in
    /// progress.
    AtespaceFlightsFull,
    /// The caller's atespace held its share of the requests the router
    /// holds.
    AtespaceRequestsFull,
    /// The caller's atespace held its share of the lot.
    AtespaceFull,
    /// At the park transition, the time to serve a park exceeded what was
    /// left of the caller's deadline; wraps the flight's retryable
    /// error.
    DeadlineTooShort(ResumeError),
    /// The caller's own deadline passed while it was parked.
    CallerDeadline,
    /// A caller of a higher band took this caller's slot.
    Preempted,
}

impl std::fmt::Display for ResolveError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ResolveError::Failed(e) => write!(f, "{e}"),
            ResolveError::BudgetExhausted(e) => write!(f, "budget exhausted, last: {e}"),
            ResolveError::LotFull => f.write_str("parking lot full"),
            ResolveError::FlightsFull => f.write_str("flights full"),
            ResolveError::AtespaceFlightsFull => f.write_str("atespace at its share of flights"),
            ResolveError::AtespaceRequestsFull => f.write_str("atespace at its share of held requests"),
            ResolveError::AtespaceFull => f.write_str("atespace at its share of the lot"),
            ResolveError::DeadlineTooShort(e) => write!(f, "deadline shorter than a park, last: {e}"),
            ResolveError::CallerDeadline => f.write_str("the caller's deadline passed while parked"),
            ResolveError::Preempted => f.write_str("a higher band took the slot"),
        }
    }
}

/// What one caller learns.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResumeOutcome {
    pub result: Result<Resumed, ResolveError>,
    pub resume: ResumeLabel,
    /// Whether this caller held a lot slot.
    pub parked: bool,
}

/// Why a caller stopped waiting before its flight was done.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Abandon {
    /// The client went away (`canceled`).
    Canceled,
    /// The ext_proc stream's own gRPC deadline passed (`timeout`).
    Timeout,
}

/// Resolves actors for callers, sharing one flight table and one lot.
#[derive(Clone)]
pub struct Resolver {
    flights: FlightTable,
    /// Each atespace's share of the requests held.
    held: Arc<AtespaceShares>,
    /// `None` when parking is disabled: no lot, no parking metrics.
    lot: Option<Arc<ParkingLot>>,
    clock: Arc<dyn Clock>,
    /// Runs parked callers' own deadlines.
    scheduler: Arc<dyn Scheduler>,
}

impl Resolver {
    /// A resolver over `flights` and `lot` in which each atespace holds
    /// callers under `held_share`.
    pub fn new(
        flights: FlightTable,
        lot: Option<Arc<ParkingLot>>,
        held_share: SharePolicy,
        clock: Arc<dyn Clock>,
        scheduler: Arc<dyn Scheduler>,
    ) -> Resolver {
        Resolver { flights, held: AtespaceShares::new(held_share), lot, clock, scheduler }
    }

    /// The flight table.
    pub fn flights(&self) -> &FlightTable {
        &self.flights
    }

    /// The lot, when parking is enabled.
    pub fn lot(&self) -> Option<&Arc<ParkingLot>> {
        self.lot.as_ref()
    }

    /// Counts a caller whose stream ended before it asked for its actor:
    /// gone before any lot decision.
    pub fn note_left_early(&self) {
        if let Some(lot) = &self.lot {
            lot.note_decision(LotDecision::Left);
        }
    }

    /// Starts resolving `actor` for one caller of `band` whose own
    /// deadline, if it has one, is `deadline`. Dropping the returned
    /// future abandons the wait as [`Abandon::Canceled`].
    #[cfg(any(test, feature = "testkit"))]
    pub fn resolve(&self, actor: &ActorId, deadline: Option<Instant>, band: Band) -> Resolve {
        self.resolve_traced(actor, deadline, band, None)
    }

    /// As [`Resolver::resolve`], for a caller whose route span is `route`:
    /// a flight it leads is traced under it.
    pub fn resolve_traced(
        &self,
        actor: &ActorId,
        deadline: Option<Instant>,
        band: Band,
        route: Option<&RouteTrace>,
    ) -> Resolve {
        // The share first: a caller refused it starts no flight (B80).
        let held = self.held.try_take(actor);
        let joined = match &held {
            Some(_) => self.flights.join_traced(actor, band, route).map_err(|refusal| match refusal {
                FlightRefusal::TableFull => ResolveError::FlightsFull,
                FlightRefusal::AtespaceFull => ResolveError::AtespaceFlightsFull,
            }),
            None => Err(ResolveError::AtespaceRequestsFull),
        };
        let (stage, flight, role, state) = match joined {
            Ok((flight, role)) => (
                Stage::First { wait: flight.wait(Until::ParkedOrDone) },
                Some(flight),
                role,
                AccountState::Undecided,
            ),
            // Refused before any lot decision was due: counted as refused,
            // never as a caller that left (B55).
            Err(error) => (Stage::Refused(error), None, Role::Leader, AccountState::Settled),
        };
        let account = Account { lot: self.lot.clone(), state, exit: Abandon::Canceled };
        Resolve { stage, flight, held, role, account, deadline, band, resolver: self.clone() }
    }

    /// What `atespace`'s callers hold now.
    #[cfg(any(test, feature = "testkit"))]
    pub fn held(&self, atespace: &str) -> usize {
        self.held.held(atespace)
    }
}

/// A caller's pending resolution: a small state machine polled by its
/// stream's task.
pub struct Resolve {
    stage: Stage,
    /// The caller's hold on its flight, until it has its answer;
    /// `None` when refused one.
    flight: Option<Caller>,
    /// The caller's unit of its atespace's share, until it has its
    /// answer.
    held: Option<ShareHold>,
    role: Role,
    account: Account,
    /// The caller's own deadline.
    deadline: Option<Instant>,
    /// The caller's band.
    band: Band,
    resolver: Resolver,
}

/// Where a caller is in its wait.
enum Stage {
    /// Refused a share or a flight: the answer is ready.
    Refused(ResolveError),
    /// Phase 1: waiting for the park transition or the end.
    First { wait: FlightWait },
    /// Phase 2: holding a slot (or, with parking disabled, none) until the
    /// end, or until the caller's own deadline.
    Parked { wait: FlightWait, deadline: Option<Sleep> },
    /// The outcome was returned.
    Finished,
}

impl Resolve {
    /// Completes when this caller's flight goes into overtime (its budget
    /// passed with an attempt still running) or ends; `None` without a
    /// flight.
    pub fn overtime(&self) -> Option<FlightWait> {
        self.flight.as_ref().map(|f| f.wait(Until::OvertimeOrDone))
    }

    /// This caller's place on its flight, for its route span; `None`
    /// when it was refused one, or once it has its answer.
    pub fn flight_place(&self) -> Option<FlightPlace> {
        let flight = self.flight.as_ref()?;
        Some(FlightPlace { leader: self.role == Role::Leader, resume: flight.resume_span() })
    }

    /// Whether this caller holds a lot slot: past its park transition.
    pub fn parked(&self) -> bool {
        matches!(self.stage, Stage::Parked { .. })
    }

    /// Stops waiting, recording `reason` for a held slot.
    pub fn abandon(mut self, reason: Abandon) {
        self.account.exit = reason;
    }

    /// The caller has its answer: it stops holding its flight and its share.
    fn served(&mut self, outcome: &FlightOutcome, parked: bool) -> ResumeOutcome {
        self.finish();
        outcome_for(outcome, self.role, parked)
    }

    fn finish(&mut self) {
        self.stage = Stage::Finished;
        self.flight = None;
        self.held = None;
    }
}

impl Future for Resolve {
    type Output = ResumeOutcome;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<ResumeOutcome> {
        let this = &mut *self;
        loop {
            let event = match &mut this.stage {
                Stage::Finished => panic!("a Resolve polled after it completed"),
                Stage::Refused(error) => {
                    let error = error.clone();
                    return Poll::Ready(this.refuse(error));
                }
                Stage::First { wait } => match Pin::new(wait).poll(cx) {
                    Poll::Pending => return Poll::Pending,
                    Poll::Ready(event) => event,
                },
                Stage::Parked { wait, deadline } => match Pin::new(wait).poll(cx) {
                    Poll::Ready(event) => event,
                    Poll::Pending => {
                        // The flight goes on; a higher band took this
                        // caller's slot, or its patience ended.
                        if this.account.preempted(cx) {
                            return Poll::Ready(this.refuse_parked(ResolveError::Preempted));
                        }
                        if deadline.as_mut().is_some_and(|d| Pin::new(d).poll(cx).is_ready()) {
                            let error = match this.account.close(WaitOutcome::Deadline) {
                                Closed::Preempted => ResolveError::Preempted,
                                Closed::Freed | Closed::NoSlot => ResolveError::CallerDeadline,
                            };
                            return Poll::Ready(this.refuse_parked(error));
                        }
                        return Poll::Pending;
                    }
                },
            };
            let flight = Arc::clone(this.flight.as_deref().expect("a caller with a flight"));
            match (event, &this.stage) {
                (FlightEvent::Done(outcome), Stage::First { .. }) => {
                    this.account.fast();
                    return Poll::Ready(this.served(&outcome, false));
                }
                (FlightEvent::Done(outcome), _) => {
                    // A caller whose slot was taken has its answer already:
                    // exactly one, whatever the flight did since.
                    return Poll::Ready(match this.account.close(wait_outcome(&outcome)) {
                        Closed::Preempted => this.refuse_parked(ResolveError::Preempted),
                        closed => this.served(&outcome, closed == Closed::Freed),
                    });
                }
                (_, Stage::First { .. }) => {
                    // The park transition. B24: the flight may have finished
                    // between it and now; then serve without touching the lot.
                    if let Some(outcome) = flight.outcome() {
                        this.account.fast();
                        return Poll::Ready(this.served(&outcome, false));
                    }
                    if let Some(error) = this.too_short(&flight) {
                        this.account.settle();
                        return Poll::Ready(this.refuse(ResolveError::DeadlineTooShort(error)));
                    }
                    match this.account.admit(&flight, this.band) {
                        Ok(()) => {}
                        Err(Refusal::LotFull) => return Poll::Ready(this.refuse(ResolveError::LotFull)),
                        Err(Refusal::AtespaceFull) => {
                            return Poll::Ready(this.refuse(ResolveError::AtespaceFull))
                        }
                    }
                    let deadline = this
                        .deadline
                        .filter(|_| this.resolver.lot.is_some())
                        .map(|at| sleep_until(Arc::clone(&this.resolver.scheduler), at));
                    this.stage = Stage::Parked { wait: flight.wait(Until::Done), deadline };
                }
                // A wait until done ends only when done.
                (_, _) => unreachable!("phase 2 woke before its flight ended"),
            }
        }
    }
}

impl Resolve {
    fn refuse(&mut self, error: ResolveError) -> ResumeOutcome {
        self.finish();
        ResumeOutcome { result: Err(error), resume: ResumeLabel::Unknown, parked: false }
    }

    /// Refused after it held a slot; it leaves its flight as any departing
    /// caller does.
    fn refuse_parked(&mut self, error: ResolveError) -> ResumeOutcome {
        ResumeOutcome { parked: true, ..self.refuse(error) }
    }

    /// Early rejection (B68): with parking on and an estimate of the time to
    /// serve a park, a caller whose remaining time is shorter is refused
    /// before it takes a slot. The flight's retryable error says why.
    fn too_short(&self, flight: &Flight) -> Option<ResumeError> {
        let (lot, deadline) = (self.resolver.lot.as_ref()?, self.deadline?);
        // The park transition follows a retryable failure, so there is one.
        let error = flight.last_retryable()?;
        let remaining = deadline.saturating_duration_since(self.resolver.clock.now());
        lot.rejects_early(remaining).then_some(error)
    }
}

/// One caller's accounting (B25-B27, B32, B33, B55).
struct Account {
    /// `None` with parking disabled: nothing to account.
    lot: Option<Arc<ParkingLot>>,
    state: AccountState,
    /// Why the caller left, should it leave before its flight ends.
    exit: Abandon,
}

enum AccountState {
    /// No lot decision yet.
    Undecided,
    /// Served without a slot, or shed: nothing left to settle.
    Settled,
    /// Holding a slot on `flight`.
    Parked { slot: Slot, flight: Arc<Flight> },
}

impl Account {
    /// Decided elsewhere (early rejection, counted by the lot): nothing left
    /// to settle.
    fn settle(&mut self) {
        self.state = AccountState::Settled;
    }

    /// Served without a slot: counted `fast`.
    fn fast(&mut self) {
        if let (Some(lot), AccountState::Undecided) = (&self.lot, &self.state) {
            lot.note_decision(LotDecision::Fast);
        }
        self.state = AccountState::Settled;
    }

    /// The lot decision at the park transition: a slot, or shed.
    /// Without a lot the caller simply waits on (B22).
    fn admit(&mut self, flight: &Arc<Flight>, band: Band) -> Result<(), Refusal> {
        let Some(lot) = &self.lot else { return Ok(()) };
        match lot.try_admit(flight.actor().atespace(), band) {
            Ok(slot) => {
                flight.note_parked_caller(true);
                self.state = AccountState::Parked { slot, flight: Arc::clone(flight) };
                Ok(())
            }
            Err(refusal) => {
                self.state = AccountState::Settled;
                Err(refusal)
            }
        }
    }

    /// The caller's wait ended while it held a slot: release it with
    /// `outcome`, unless a higher band took it first.
    fn close(&mut self, outcome: WaitOutcome) -> Closed {
        match std::mem::replace(&mut self.state, AccountState::Settled) {
            AccountState::Parked { slot, flight } => {
                flight.note_parked_caller(false);
                match slot.release(outcome) {
                    Release::Freed => Closed::Freed,
                    Release::Preempted => Closed::Preempted,
                }
            }
            _ => Closed::NoSlot,
        }
    }

    /// Whether a higher band took the caller's slot, settled by the
    /// lot then; if not, the task is woken when one does.
    fn preempted(&mut self, cx: &Context<'_>) -> bool {
        let AccountState::Parked { slot, .. } = &self.state else { return false };
        if !slot.preempted(cx.waker()) {
            return false;
        }
        self.close(WaitOutcome::Preempted) == Closed::Preempted
    }
}

/// What closing an account found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Closed {
    /// No slot was held.
    NoSlot,
    /// The slot was freed now.
    Freed,
    /// A higher band had taken the slot.
    Preempted,
}

impl Drop for Account {
    /// The caller went away. Before a decision it is counted `left`; with a
    /// slot, the slot is released now (B27), and B33's first match wins: a
    /// flight that already succeeded or exhausted its budget is the outcome,
    /// not the caller's departure.
    fn drop(&mut self) {
        match std::mem::replace(&mut self.state, AccountState::Settled) {
            AccountState::Undecided => {
                if let Some(lot) = &self.lot {
                    lot.note_decision(LotDecision::Left);
                }
            }
            AccountState::Parked { slot, flight } => {
                let outcome = match flight.outcome().as_deref() {
                    Some(FlightOutcome::Resumed(_)) => WaitOutcome::Served,
                    Some(FlightOutcome::BudgetExhausted(_)) => WaitOutcome::BudgetExhausted,
                    _ if self.exit == Abandon::Timeout => WaitOutcome::Timeout,
                    _ => WaitOutcome::Canceled,
                };
                flight.note_parked_caller(false);
                slot.release(outcome);
            }
            AccountState::Settled => {}
        }
    }
}

fn outcome_for(outcome: &FlightOutcome, role: Role, parked: bool) -> ResumeOutcome {
    let (result, resume) = match outcome {
        FlightOutcome::Resumed(r) => {
            let label = match (r.resumed, role) {
                (false, _) => ResumeLabel::None,
                (true, Role::Leader) => ResumeLabel::Triggered,
                (true, Role::Joiner) => ResumeLabel::Joined,
            };
            (Ok(r.clone()), label)
        }
        FlightOutcome::BudgetExhausted(e) => {
            (Err(ResolveError::BudgetExhausted(e.clone())), ResumeLabel::Unknown)
        }
        FlightOutcome::Failed(e) => (Err(ResolveError::Failed(e.clone())), ResumeLabel::Unknown),
    };
    ResumeOutcome { result, resume, parked }
}

fn wait_outcome(outcome: &FlightOutcome) -> WaitOutcome {
    match outcome {
        FlightOutcome::Resumed(_) => WaitOutcome::Served,
        FlightOutcome::BudgetExhausted(_) => WaitOutcome::BudgetExhausted,
        FlightOutcome::Failed(_) => WaitOutcome::Error,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::actor::resume::Code;
    use crate::parking::flight::tests::{actor, err, harness, ok, Harness};
    use crate::telemetry::metrics::Metrics;
    use futures::task::noop_waker;
    use parking_lot::Mutex;
    use std::time::Duration;

    struct Setup {
        h: Harness,
        metrics: Metrics,
        resolver: Resolver,
    }

    fn setup(lot_max: usize) -> Setup {
        let h = harness(1000, 100, lot_max > 0);
        let metrics = Metrics::new();
        let lot = (lot_max > 0).then(|| {
            ParkingLot::new(lot_max, 0, lot_max, Arc::new(h.clock.clone()), metrics.lot_instruments())
        });
        let resolver = Resolver::new(
            h.table.clone(),
            lot,
            SharePolicy::capped(1000, 1000),
            Arc::new(h.clock.clone()),
            Arc::new(h.scheduler.clone()),
        );
        Setup { h, metrics, resolver }
    }

    fn poll(r: &mut Resolve) -> Poll<ResumeOutcome> {
        let waker = noop_waker();
        Pin::new(r).poll(&mut Context::from_waker(&waker))
    }

    fn ready(r: &mut Resolve) -> ResumeOutcome {
        match poll(r) {
            Poll::Ready(o) => o,
            Poll::Pending => panic!("caller still waiting"),
        }
    }

    fn active(s: &Setup) -> usize {
        s.resolver.lot().map_or(0, |l| l.active())
    }

    #[test]
    fn b24_first_attempt_success_never_takes_a_slot_even_when_lot_full() {
        let s = setup(1);
        let (hot, running) = (actor("hot"), actor("running"));
        let mut parked = s.resolver.resolve(&hot, None, Band::Standard);
        assert!(poll(&mut parked).is_pending());
        s.h.resumer.answer(&hot, err(Code::ResourceExhausted, "no free workers available"));
        assert!(poll(&mut parked).is_pending());
        assert_eq!(active(&s), 1, "lot now full");
        let mut fast = s.resolver.resolve(&running, None, Band::Standard);
        assert!(poll(&mut fast).is_pending());
        s.h.resumer.answer(&running, ok(false));
        let outcome = ready(&mut fast);
        assert!(outcome.result.is_ok());
        assert_eq!(outcome.resume, ResumeLabel::None, "B21: already running");
        assert!(!outcome.parked);
        assert_eq!(s.metrics.parking_rejected(), 0);
        s.h.scheduler.advance(Duration::from_millis(100));
        s.h.resumer.answer(&hot, ok(true));
        let outcome = ready(&mut parked);
        assert_eq!(outcome.resume, ResumeLabel::Triggered);
        assert!(outcome.parked);
        assert_eq!(active(&s), 0);
        assert_eq!(s.metrics.waits(WaitOutcome::Served), 1);
    }

    #[test]
    fn b25_b26_each_joiner_needs_a_slot_and_full_lot_sheds_while_flight_goes_on() {
        let s = setup(2);
        let a = actor("a");
        let mut callers: Vec<Resolve> =
            (0..3).map(|_| s.resolver.resolve(&a, None, Band::Standard)).collect();
        assert_eq!(s.h.resumer.calls(&a), 1);
        callers.iter_mut().for_each(|c| assert!(poll(c).is_pending()));
        s.h.resumer.answer(&a, err(Code::ResourceExhausted, "no free workers available"));
        let results: Vec<Poll<ResumeOutcome>> = callers.iter_mut().map(poll).collect();
        assert!(results[0].is_pending() && results[1].is_pending());
        match &results[2] {
            Poll::Ready(o) => assert_eq!(o.result, Err(ResolveError::LotFull)),
            Poll::Pending => panic!("third caller should be shed"),
        }
        assert_eq!(s.metrics.parking_rejected(), 1);
        assert_eq!(active(&s), 2);
        let decided = |d| s.metrics.decisions(d);
        assert_eq!((decided(LotDecision::Admitted), decided(LotDecision::Shed)), (2, 1));
        s.h.scheduler.advance(Duration::from_millis(100));
        assert_eq!(s.h.resumer.calls(&a), 2, "one RPC per attempt for N callers");
        s.h.resumer.answer(&a, ok(true));
        let labels: Vec<ResumeLabel> = callers[..2].iter_mut().map(|c| ready(c).resume).collect();
        assert_eq!(labels, vec![ResumeLabel::Triggered, ResumeLabel::Joined]);
        assert_eq!(active(&s), 0);
        assert_eq!(s.metrics.waits(WaitOutcome::Served), 2);
        assert!(s.h.table.is_empty(), "B30");
    }

    #[test]
    fn b27_b28_cancel_while_parked_frees_slot_at_once_flight_unaffected() {
        let s = setup(4);
        let a = actor("a");
        let mut leaving = s.resolver.resolve(&a, None, Band::Standard);
        let mut staying = s.resolver.resolve(&a, None, Band::Standard);
        assert!(poll(&mut leaving).is_pending() && poll(&mut staying).is_pending());
        s.h.resumer.answer(&a, err(Code::Unavailable, "restarting"));
        assert!(poll(&mut leaving).is_pending() && poll(&mut staying).is_pending());
        assert_eq!(active(&s), 2);
        drop(leaving);
        assert_eq!(active(&s), 1, "B27: freed at once");
        assert_eq!(s.metrics.waits(WaitOutcome::Canceled), 1);
        assert_eq!(s.h.table.len(), 1, "B28: flight goes on");
        s.h.scheduler.advance(Duration::from_millis(100));
        s.h.resumer.answer(&a, ok(true));
        assert!(ready(&mut staying).result.is_ok());
        assert_eq!(active(&s), 0);
    }

    #[test]
    fn b33_abandon_with_timeout_records_timeout() {
        let s = setup(4);
        let a = actor("a");
        let mut caller = s.resolver.resolve(&a, None, Band::Standard);
        assert!(poll(&mut caller).is_pending());
        s.h.resumer.answer(&a, err(Code::Aborted, "busy"));
        assert!(poll(&mut caller).is_pending());
        caller.abandon(Abandon::Timeout);
        assert_eq!(s.metrics.waits(WaitOutcome::Timeout), 1);
        assert_eq!(s.metrics.waits(WaitOutcome::Canceled), 0);
        // Its only caller gone between attempts, the flight ends (B78).
        assert!(s.h.table.is_empty());
        s.h.scheduler.advance(Duration::from_millis(100));
        assert_eq!(s.h.resumer.calls(&a), 1, "no retry for nobody");
    }

    #[test]
    fn b33_first_match_wins_against_a_cancel_after_the_flight_succeeded() {
        let s = setup(4);
        let a = actor("a");
        let mut caller = s.resolver.resolve(&a, None, Band::Standard);
        assert!(poll(&mut caller).is_pending());
        s.h.resumer.answer(&a, err(Code::ResourceExhausted, "full"));
        assert!(poll(&mut caller).is_pending());
        s.h.scheduler.advance(Duration::from_millis(100));
        // The flight succeeds, and the client goes away before its task
        // runs again to read the result.
        s.h.resumer.answer(&a, ok(true));
        drop(caller);
        assert_eq!(s.metrics.waits(WaitOutcome::Served), 1, "served wins");
        assert_eq!(s.metrics.waits(WaitOutcome::Canceled), 0);
        assert_eq!(active(&s), 0);
    }

    /// A waker that polls its caller the moment it is woken, on the waking
    /// thread: the interleaving in which a task on another completion-queue
    /// thread runs between the flight's wake-up and whatever the flight does
    /// next, made deterministic.
    struct PollOnWake {
        caller: Mutex<Option<Resolve>>,
        result: Mutex<Option<ResumeOutcome>>,
    }

    impl futures::task::ArcWake for PollOnWake {
        fn wake_by_ref(this: &Arc<Self>) {
            let waker = futures::task::waker(Arc::clone(this));
            let mut caller = this.caller.lock();
            if let Some(resolve) = caller.as_mut() {
                if let Poll::Ready(outcome) = Pin::new(resolve).poll(&mut Context::from_waker(&waker)) {
                    *this.result.lock() = Some(outcome);
                    caller.take();
                }
            }
        }
    }

    #[test]
    fn b24_caller_woken_by_a_late_retryable_error_is_not_shed_by_a_full_lot() {
        let s = setup(1);
        let (a, other) = (actor("a"), actor("other"));
        // Fill the lot.
        let mut holder = s.resolver.resolve(&other, None, Band::Standard);
        assert!(poll(&mut holder).is_pending());
        s.h.resumer.answer(&other, err(Code::ResourceExhausted, "full"));
        assert!(poll(&mut holder).is_pending());
        assert_eq!(active(&s), 1);
        let probe = Arc::new(PollOnWake {
            caller: Mutex::new(Some(s.resolver.resolve(&a, None, Band::Standard))),
            result: Mutex::new(None),
        });
        futures::task::ArcWake::wake_by_ref(&probe);
        assert!(probe.result.lock().is_none(), "waiting on the first attempt");
        s.h.clock.advance(Duration::from_secs(2));
        s.h.resumer.answer(&a, err(Code::ResourceExhausted, "still full"));
        let outcome = probe.result.lock().take().expect("the caller has its verdict");
        assert!(
            matches!(outcome.result, Err(ResolveError::BudgetExhausted(_))),
            "the flight ended: budget exhausted, not shed: {outcome:?}"
        );
        assert_eq!(s.metrics.parking_rejected(), 0, "B26's counter is for real sheds only");
        assert_eq!(s.metrics.decisions(LotDecision::Shed), 0);
        // The holder's flight reaches its own deadline at its next timer.
        s.h.scheduler.advance(Duration::from_millis(100));
        assert!(matches!(ready(&mut holder).result, Err(ResolveError::BudgetExhausted(_))));
        assert_eq!(active(&s), 0);
    }

    /// A setup whose lot gives each atespace at most `per_atespace` slots.
    fn setup_shared(lot_max: usize, per_atespace: usize) -> Setup {
        let h = harness(1000, 100, true);
        let metrics = Metrics::new();
        let lot = ParkingLot::new(
            lot_max,
            per_atespace,
            lot_max,
            Arc::new(h.clock.clone()),
            metrics.lot_instruments(),
        );
        let resolver = Resolver::new(
            h.table.clone(),
            Some(lot),
            SharePolicy::capped(1000, 1000),
            Arc::new(h.clock.clone()),
            Arc::new(h.scheduler.clone()),
        );
        Setup { h, metrics, resolver }
    }

    #[test]
    fn b68_a_parked_caller_gets_its_deadline_and_the_flight_goes_on() {
        let s = setup(4);
        let a = actor("a");
        let deadline = s.h.clock.now() + Duration::from_millis(300);
        let mut patient = s.resolver.resolve(&a, None, Band::Standard);
        let mut hurried = s.resolver.resolve(&a, Some(deadline), Band::Standard);
        assert!(poll(&mut patient).is_pending() && poll(&mut hurried).is_pending());
        s.h.resumer.answer(&a, err(Code::ResourceExhausted, "full"));
        assert!(poll(&mut patient).is_pending() && poll(&mut hurried).is_pending());
        assert_eq!(active(&s), 2);
        s.h.scheduler.advance(Duration::from_millis(299));
        s.h.resumer.answer(&a, err(Code::ResourceExhausted, "full"));
        assert!(poll(&mut hurried).is_pending(), "not before its deadline");
        s.h.scheduler.advance(Duration::from_millis(1));
        let outcome = ready(&mut hurried);
        assert_eq!(outcome.result, Err(ResolveError::CallerDeadline));
        assert!(outcome.parked, "it held a slot");
        assert_eq!(active(&s), 1, "its slot freed at once");
        assert_eq!(s.metrics.waits(WaitOutcome::Deadline), 1, "recorded once, as deadline");
        drop(hurried);
        assert_eq!(s.metrics.waits(WaitOutcome::Canceled), 0, "and not again when dropped");
        assert_eq!(s.h.table.len(), 1, "the flight goes on for the others");
        s.h.scheduler.advance(Duration::from_millis(500));
        s.h.resumer.answer(&a, ok(true));
        assert!(ready(&mut patient).result.is_ok());
        assert_eq!(active(&s), 0);
    }

    #[test]
    fn b68_no_estimate_no_early_rejection_then_rejection_once_there_is_one() {
        let s = setup(4);
        let a = actor("a");
        // No served park yet: a caller whose time is already up still parks.
        let mut first = s.resolver.resolve(&a, Some(s.h.clock.now()), Band::Standard);
        assert!(poll(&mut first).is_pending());
        s.h.resumer.answer(&a, err(Code::ResourceExhausted, "no free workers available"));
        assert!(poll(&mut first).is_pending(), "admitted: nothing says a park takes long");
        assert_eq!(active(&s), 1);
        // A served park of 400 ms makes the estimate; this caller joins the
        // parked flight, so the flight goes on when the first one leaves.
        let mut served = s.resolver.resolve(&a, None, Band::Standard);
        assert!(poll(&mut served).is_pending());
        s.h.scheduler.advance(Duration::ZERO);
        assert_eq!(ready(&mut first).result, Err(ResolveError::CallerDeadline));
        s.h.scheduler.advance(Duration::from_millis(400));
        s.h.resumer.answer(&a, ok(true));
        assert!(ready(&mut served).result.is_ok());
        assert_eq!(s.resolver.lot().unwrap().estimate(), Some(Duration::from_millis(400)));
        // 300 ms left < 400 ms: refused at the park transition, no slot.
        let b = actor("b");
        let mut short =
            s.resolver.resolve(&b, Some(s.h.clock.now() + Duration::from_millis(300)), Band::Standard);
        let mut long =
            s.resolver.resolve(&b, Some(s.h.clock.now() + Duration::from_millis(500)), Band::Standard);
        assert!(poll(&mut short).is_pending() && poll(&mut long).is_pending());
        s.h.resumer.answer(&b, err(Code::ResourceExhausted, "no free workers available"));
        assert_eq!(
            ready(&mut short).result,
            Err(ResolveError::DeadlineTooShort(ResumeError::new(
                Code::ResourceExhausted,
                "no free workers available"
            )))
        );
        assert!(poll(&mut long).is_pending(), "enough time left: parks");
        assert_eq!(active(&s), 1, "the early rejection took no slot");
        assert_eq!(s.metrics.decisions(LotDecision::EarlyRejected), 1);
        s.h.scheduler.advance(Duration::from_millis(100));
        s.h.resumer.answer(&b, ok(true));
        assert!(ready(&mut long).result.is_ok());
    }

    #[test]
    fn b68_the_first_attempt_ignores_the_deadline() {
        let s = setup(4);
        let a = actor("a");
        let mut late = s.resolver.resolve(&a, Some(s.h.clock.now()), Band::Standard);
        s.h.clock.advance(Duration::from_secs(5));
        s.h.resumer.answer(&a, ok(false));
        let outcome = ready(&mut late);
        assert!(outcome.result.is_ok(), "answered on the first attempt: never affected");
        assert_eq!(s.metrics.decisions(LotDecision::Fast), 1);
    }

    #[test]
    fn b69_an_atespace_at_its_share_is_shed_while_another_parks() {
        let s = setup_shared(4, 2);
        let hot = ActorId::parse("greedy/hot").unwrap();
        let cold = ActorId::parse("greedy/cold").unwrap();
        let polite = ActorId::parse("polite/b").unwrap();
        // Two callers of one hot actor and one of another: three slots wanted by one atespace.
        let mut callers: Vec<Resolve> =
            [&hot, &hot, &cold].iter().map(|a| s.resolver.resolve(a, None, Band::Standard)).collect();
        let mut other = s.resolver.resolve(&polite, None, Band::Standard);
        callers.iter_mut().chain([&mut other]).for_each(|c| assert!(poll(c).is_pending()));
        for a in [&hot, &cold, &polite] {
            s.h.resumer.answer(a, err(Code::ResourceExhausted, "full"));
        }
        let results: Vec<Poll<ResumeOutcome>> = callers.iter_mut().map(poll).collect();
        assert!(results[0].is_pending() && results[1].is_pending());
        assert!(matches!(&results[2], Poll::Ready(o) if o.result == Err(ResolveError::AtespaceFull)));
        assert!(poll(&mut other).is_pending(), "the other atespace still parks");
        assert_eq!(active(&s), 3);
        assert_eq!(s.metrics.decisions(LotDecision::AtespaceFull), 1);
        // The shed caller was its flight's only one: that flight ends, and
        // makes no more ResumeActor calls (B78).
        assert_eq!(s.h.table.len(), 2);
        s.h.scheduler.advance(Duration::from_millis(100));
        assert_eq!(s.h.resumer.calls(&cold), 1);
        for a in [&hot, &polite] {
            s.h.resumer.answer(a, ok(true));
        }
        assert!(ready(&mut callers[0]).result.is_ok() && ready(&mut callers[1]).result.is_ok());
        assert!(ready(&mut other).result.is_ok());
        assert_eq!(active(&s), 0);
        assert!(s.h.table.is_empty());
    }

    #[test]
    fn b58_refused_flight_is_an_immediate_flights_full_outcome() {
        let s = setup(4);
        let callers: Vec<Resolve> =
            (0..3).map(|i| s.resolver.resolve(&actor(&format!("a{i}")), None, Band::Standard)).collect();
        let mut refused = s.resolver.resolve(&actor("fourth"), None, Band::Standard);
        let outcome = ready(&mut refused);
        assert_eq!(outcome.result, Err(ResolveError::FlightsFull));
        assert!(refused.overtime().is_none());
        let mut joiner = s.resolver.resolve(&actor("a0"), None, Band::Standard);
        assert!(poll(&mut joiner).is_pending(), "joining an existing flight is never refused");
        for i in 0..3 {
            s.h.resumer.answer(&actor(&format!("a{i}")), ok(false));
        }
        assert!(ready(&mut joiner).result.is_ok());
        drop(callers);
        assert!(s.h.table.is_empty());
        drop(refused);
        // B55: a refused flight is no lot decision; the three first callers,
        // dropped undecided, are the only ones that left.
        assert_eq!(s.metrics.decisions(LotDecision::Left), 3);
        assert_eq!(s.metrics.decisions(LotDecision::Fast), 1, "the joiner");
    }

    #[test]
    fn b32_no_sample_for_callers_gone_before_park_transition() {
        let s = setup(4);
        let a = actor("a");
        let mut caller = s.resolver.resolve(&a, None, Band::Standard);
        assert!(poll(&mut caller).is_pending());
        drop(caller);
        assert_eq!(s.metrics.decisions(LotDecision::Left), 1, "gone before the decision");
        let mut fast = s.resolver.resolve(&a, None, Band::Standard);
        s.h.resumer.answer(&a, ok(true));
        assert!(ready(&mut fast).result.is_ok());
        assert_eq!(s.metrics.decisions(LotDecision::Fast), 1);
        let total: u64 = WaitOutcome::ALL.iter().map(|o| s.metrics.waits(*o)).sum();
        assert_eq!(total, 0);
    }

    #[test]
    fn b33_budget_exhausted_and_error_outcomes() {
        let s = setup(4);
        let (a, b) = (actor("a"), actor("b"));
        let mut ca = s.resolver.resolve(&a, None, Band::Standard);
        let mut cb = s.resolver.resolve(&b, None, Band::Standard);
        assert!(poll(&mut ca).is_pending() && poll(&mut cb).is_pending());
        s.h.resumer.answer(&a, err(Code::ResourceExhausted, "no free workers available"));
        s.h.resumer.answer(&b, err(Code::ResourceExhausted, "no free workers available"));
        assert!(poll(&mut ca).is_pending() && poll(&mut cb).is_pending());
        s.h.scheduler.advance(Duration::from_millis(100));
        s.h.resumer.answer(&b, err(Code::PermissionDenied, "nope"));
        s.h.scheduler.advance(Duration::from_secs(2));
        s.h.resumer.answer(&a, err(Code::ResourceExhausted, "no free workers available"));
        let oa = ready(&mut ca);
        assert_eq!(
            oa.result,
            Err(ResolveError::BudgetExhausted(ResumeError::new(
                Code::ResourceExhausted,
                "no free workers available"
            )))
        );
        assert_eq!(oa.resume, ResumeLabel::Unknown, "B21: failed flight is unknown");
        assert!(matches!(ready(&mut cb).result, Err(ResolveError::Failed(_))));
        assert_eq!(s.metrics.waits(WaitOutcome::BudgetExhausted), 1);
        assert_eq!(s.metrics.waits(WaitOutcome::Error), 1);
    }

    #[test]
    fn b22_parking_disabled_no_lot_no_metrics() {
        let s = setup(0);
        let a = actor("a");
        let mut caller = s.resolver.resolve(&a, None, Band::Standard);
        assert!(poll(&mut caller).is_pending());
        s.h.resumer.answer(&a, err(Code::Aborted, "conflict"));
        assert!(poll(&mut caller).is_pending());
        s.h.scheduler.advance(Duration::from_millis(100));
        s.h.resumer.answer(&a, ok(true));
        let outcome = ready(&mut caller);
        assert!(outcome.result.is_ok() && !outcome.parked);
        assert_eq!(s.metrics.parking_active(), 0);
        assert_eq!(s.metrics.waits(WaitOutcome::Served), 0);
    }

    #[test]
    fn b80_an_atespace_holds_at_most_its_share_of_requests_on_any_attempt() {
        let h = harness(1000, 100, true);
        let metrics = Metrics::new();
        let lot = ParkingLot::new(8, 0, 8, Arc::new(h.clock.clone()), metrics.lot_instruments());
        let resolver = Resolver::new(
            h.table.clone(),
            Some(lot),
            SharePolicy::capped(2, 4),
            Arc::new(h.clock.clone()),
            Arc::new(h.scheduler.clone()),
        );
        let parse = |r: &str| ActorId::parse(r).unwrap();
        // One waits on a slow first attempt, one is parked: both count.
        let mut slow = resolver.resolve(&parse("greedy/slow"), None, Band::Standard);
        let mut parked = resolver.resolve(&parse("greedy/parked"), None, Band::Standard);
        assert!(poll(&mut slow).is_pending() && poll(&mut parked).is_pending());
        h.resumer.answer(&parse("greedy/parked"), err(Code::ResourceExhausted, "full"));
        assert!(poll(&mut parked).is_pending());
        assert_eq!(resolver.held("greedy"), 2);
        let mut refused = resolver.resolve(&parse("greedy/third"), None, Band::Standard);
        assert_eq!(ready(&mut refused).result, Err(ResolveError::AtespaceRequestsFull), "refused at once");
        assert_eq!(h.resumer.calls(&parse("greedy/third")), 0, "and no flight for it");
        let mut joiner = resolver.resolve(&parse("greedy/slow"), None, Band::Standard);
        assert_eq!(ready(&mut joiner).result, Err(ResolveError::AtespaceRequestsFull), "joining counts too");
        let mut other = resolver.resolve(&parse("polite/x"), None, Band::Standard);
        assert!(poll(&mut other).is_pending(), "another atespace is untouched");
        h.resumer.answer(&parse("greedy/slow"), ok(true));
        assert!(ready(&mut slow).result.is_ok());
        assert_eq!(resolver.held("greedy"), 1, "an answer gives the share back");
        let mut next = resolver.resolve(&parse("greedy/third"), None, Band::Standard);
        assert!(poll(&mut next).is_pending());
        drop(next);
        assert_eq!(resolver.held("greedy"), 1, "so does a caller that goes away");
        h.resumer.answer(&parse("polite/x"), ok(true));
        h.scheduler.advance(Duration::from_millis(100));
        h.resumer.answer(&parse("greedy/parked"), ok(true));
        assert!(ready(&mut parked).result.is_ok() && ready(&mut other).result.is_ok());
        assert_eq!(resolver.held("greedy") + resolver.held("polite"), 0);
    }

    #[test]
    fn b78_callers_shed_at_the_park_transition_leave_their_flight_behind() {
        // A full lot sheds every caller of a saturated actor: its flight
        // then makes no more ResumeActor calls.
        let s = setup(1);
        let (a, b) = (actor("a"), actor("b"));
        let mut holder = s.resolver.resolve(&a, None, Band::Standard);
        assert!(poll(&mut holder).is_pending());
        s.h.resumer.answer(&a, err(Code::ResourceExhausted, "full"));
        assert!(poll(&mut holder).is_pending(), "holds the only slot");
        let mut shed: Vec<Resolve> = (0..3).map(|_| s.resolver.resolve(&b, None, Band::Standard)).collect();
        shed.iter_mut().for_each(|c| assert!(poll(c).is_pending()));
        s.h.resumer.answer(&b, err(Code::ResourceExhausted, "full"));
        for c in &mut shed {
            assert_eq!(ready(c).result, Err(ResolveError::LotFull));
        }
        assert_eq!(s.h.table.len(), 1, "b's flight ended with its last caller");
        s.h.scheduler.advance(Duration::from_millis(500));
        assert_eq!(s.h.resumer.calls(&b), 1, "and called ateapi no more");
        s.h.resumer.answer(&a, ok(true));
        assert!(ready(&mut holder).result.is_ok());
    }

    /// A setup with a lot of `lot_max` of which sheddable callers may hold
    /// `sheddable`.
    fn setup_banded(lot_max: usize, sheddable: usize) -> Setup {
        let h = harness(1000, 100, true);
        let metrics = Metrics::new();
        let lot =
            ParkingLot::new(lot_max, 0, sheddable, Arc::new(h.clock.clone()), metrics.lot_instruments());
        let resolver = Resolver::new(
            h.table.clone(),
            Some(lot),
            SharePolicy::capped(1000, 1000),
            Arc::new(h.clock.clone()),
            Arc::new(h.scheduler.clone()),
        );
        Setup { h, metrics, resolver }
    }

    /// Parks one caller of `band` for `actor`, alone on its flight.
    fn park(s: &Setup, name: &str, band: Band) -> Resolve {
        let a = actor(name);
        let mut caller = s.resolver.resolve(&a, None, band);
        assert!(poll(&mut caller).is_pending());
        s.h.resumer.answer(&a, err(Code::ResourceExhausted, "full"));
        caller
    }

    #[test]
    fn b118_a_preempted_caller_is_answered_at_once_and_leaves_its_flight() {
        let s = setup_banded(2, 2);
        let mut sheddable = park(&s, "batch", Band::Sheddable);
        assert!(poll(&mut sheddable).is_pending());
        let mut standard = park(&s, "web", Band::Standard);
        assert!(poll(&mut standard).is_pending());
        s.h.clock.advance(Duration::from_millis(300));
        let mut critical = park(&s, "checkout", Band::Critical);
        assert!(poll(&mut critical).is_pending(), "parked in the sheddable caller's slot");
        let outcome = ready(&mut sheddable);
        assert_eq!(outcome.result, Err(ResolveError::Preempted));
        assert!(outcome.parked);
        assert_eq!(s.metrics.band_waits(WaitOutcome::Preempted, Band::Sheddable), 1);
        assert_eq!(s.metrics.band_refusals(Band::Sheddable), (1, 0));
        assert_eq!(active(&s), 2);
        // Its flight had no other caller: it ends, and calls ateapi no more
        // (B78).
        s.h.scheduler.advance(Duration::from_millis(500));
        assert_eq!(s.h.resumer.calls(&actor("batch")), 1);
        let mut second = park(&s, "other", Band::Critical);
        assert!(poll(&mut second).is_pending(), "takes the standard caller's slot");
        assert_eq!(ready(&mut standard).result, Err(ResolveError::Preempted));
        // A critical caller joining the parked flight needs a slot too.
        let mut shed = s.resolver.resolve(&actor("other"), None, Band::Critical);
        assert_eq!(ready(&mut shed).result, Err(ResolveError::LotFull), "nothing lower parked");
        assert_eq!(s.metrics.band_refusals(Band::Critical), (0, 1));
        s.h.resumer.answer(&actor("checkout"), ok(true));
        let served = ready(&mut critical);
        assert!(served.result.is_ok() && served.parked);
        assert_eq!(s.metrics.band_waits(WaitOutcome::Served, Band::Critical), 1);
        drop(second);
        assert_eq!(active(&s), 0);
        let total: u64 = WaitOutcome::ALL.iter().map(|o| s.metrics.waits(*o)).sum();
        assert_eq!(total, 4, "one sample per slot taken");
    }

    #[test]
    fn b118_preemption_racing_the_preempted_callers_resume_gives_one_verdict_and_one_release() {
        for preempt_first in [true, false] {
            let s = setup_banded(1, 1);
            let a = actor("a");
            let mut victim = park(&s, "a", Band::Sheddable);
            assert!(poll(&mut victim).is_pending());
            s.h.scheduler.advance(Duration::from_millis(100));
            let b = actor("b");
            let mut critical = s.resolver.resolve(&b, None, Band::Critical);
            assert!(poll(&mut critical).is_pending());
            // Both happen before the victim's task runs again: the resume it
            // waited for completes, and a critical caller takes its slot.
            if preempt_first {
                s.h.resumer.answer(&b, err(Code::ResourceExhausted, "full"));
                assert!(poll(&mut critical).is_pending());
                s.h.resumer.answer(&a, ok(true));
            } else {
                s.h.resumer.answer(&a, ok(true));
                s.h.resumer.answer(&b, err(Code::ResourceExhausted, "full"));
                assert!(poll(&mut critical).is_pending());
            }
            let outcome = ready(&mut victim);
            assert_eq!(outcome.result, Err(ResolveError::Preempted), "preempted first: {preempt_first}");
            drop(victim);
            assert_eq!(s.metrics.band_waits(WaitOutcome::Preempted, Band::Sheddable), 1);
            assert_eq!(s.metrics.band_waits(WaitOutcome::Served, Band::Sheddable), 0, "released once");
            assert_eq!(active(&s), 1, "the critical caller holds the one slot");
            s.h.scheduler.advance(Duration::from_millis(100));
            s.h.resumer.answer(&b, ok(true));
            assert!(ready(&mut critical).result.is_ok());
            assert_eq!(active(&s), 0);
        }
        // The victim read its result first: served, and the critical caller
        // finds nothing lower to take.
        let s = setup_banded(1, 1);
        let (a, b) = (actor("a"), actor("b"));
        let mut served = park(&s, "a", Band::Sheddable);
        assert!(poll(&mut served).is_pending());
        let mut critical = s.resolver.resolve(&b, None, Band::Critical);
        assert!(poll(&mut critical).is_pending());
        s.h.scheduler.advance(Duration::from_millis(100));
        s.h.resumer.answer(&a, ok(true));
        assert!(ready(&mut served).result.is_ok());
        s.h.resumer.answer(&b, err(Code::ResourceExhausted, "full"));
        assert!(poll(&mut critical).is_pending(), "parked in the freed slot");
        assert_eq!(s.metrics.band_waits(WaitOutcome::Preempted, Band::Sheddable), 0);
        assert_eq!(s.metrics.band_waits(WaitOutcome::Served, Band::Sheddable), 1);
    }

    #[test]
    fn b118_preemption_racing_a_resume_on_other_threads_settles_each_caller_once() {
        for _ in 0..200 {
            let s = setup_banded(1, 1);
            let a = actor("a");
            let probe = Arc::new(PollOnWake {
                caller: Mutex::new(Some(s.resolver.resolve(&a, None, Band::Sheddable))),
                result: Mutex::new(None),
            });
            futures::task::ArcWake::wake_by_ref(&probe);
            s.h.resumer.answer(&a, err(Code::ResourceExhausted, "full"));
            assert_eq!(active(&s), 1);
            s.h.scheduler.advance(Duration::from_millis(100));
            let b = actor("b");
            let mut critical = s.resolver.resolve(&b, None, Band::Critical);
            assert!(poll(&mut critical).is_pending());
            let barrier = Arc::new(std::sync::Barrier::new(2));
            let resumer = Arc::clone(&s.h.resumer);
            let (a2, go) = (a.clone(), Arc::clone(&barrier));
            let resume = std::thread::spawn(move || {
                go.wait();
                resumer.answer(&a2, ok(true));
            });
            barrier.wait();
            s.h.resumer.answer(&b, err(Code::ResourceExhausted, "full"));
            let parked = poll(&mut critical).is_pending();
            resume.join().unwrap();
            let outcome = probe.result.lock().take().expect("the victim has exactly one verdict");
            let waits = |o| s.metrics.band_waits(o, Band::Sheddable);
            assert_eq!(waits(WaitOutcome::Served) + waits(WaitOutcome::Preempted), 1, "released once");
            match outcome.result {
                Ok(_) => assert_eq!(waits(WaitOutcome::Served), 1),
                Err(ResolveError::Preempted) => {
                    assert!(parked, "it took the slot");
                    assert_eq!(waits(WaitOutcome::Preempted), 1);
                }
                other => panic!("{other:?}"),
            }
            assert!(active(&s) <= 1);
            drop(critical);
            assert_eq!(active(&s), 0);
        }
    }

    #[test]
    fn b115_a_flight_acts_with_the_highest_band_of_its_callers() {
        let s = setup_banded(4, 4);
        let a = actor("a");
        let sheddable = s.resolver.resolve(&a, None, Band::Sheddable);
        let flight = Arc::clone(sheddable.flight.as_deref().unwrap());
        assert_eq!(flight.band(), Band::Sheddable);
        let critical = s.resolver.resolve(&a, None, Band::Critical);
        let standard = s.resolver.resolve(&a, None, Band::Standard);
        assert_eq!(flight.band(), Band::Critical);
        drop(critical);
        assert_eq!(flight.band(), Band::Standard, "the highest of those still there");
        drop((standard, sheddable));
    }
}
