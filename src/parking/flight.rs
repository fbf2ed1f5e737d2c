//! The flight table: one in-progress resume per actor (B14-B20, B58).
//!
//! A [`Flight`] is created by the first request for an actor that has none
//! (its leader) and joined by every later one until it finishes. It runs
//! attempts through a [`Resumer`], retries retryable codes on the
//! [`Scheduler`] with [`Backoff`] delays inside its budget, and ends with one
//! [`FlightOutcome`] shared by all its callers.
//!
//! A flight's life is one [`Phase`] at a time, changed only under its lock,
//! by the events that move it on: an attempt's result ([`AttemptDone`]), its
//! retry timer, its deadline. Attempts are never cancelled (B15): a
//! cancelled restore would strand the worker the control plane already
//! claimed for it. So the budget stops new attempts, but a running one is
//! always awaited (B19).
//!
//! A flight retries only for callers. Each caller holds a [`Caller`] from
//! its join until it has its answer or goes away; when the last one leaves,
//! the flight starts no new attempt (B78): one running is still awaited
//! (B15), and its result still serves anyone who joins meanwhile, but a
//! flight whose callers were all shed, or whose clients all left, stops
//! calling the control plane and gives its place in the table back. No
//! atespace holds more than its share of the table (B79).
//!
//! The table is sharded by actor id so that unrelated actors never contend on
//! one mutex; a shard lock is held only to look up, insert or remove, and to
//! change a flight's callers or end it, which therefore happen atomically
//! with respect to joins. Locks are always taken shard first, then flight.

use std::collections::hash_map::DefaultHasher;
use std::collections::HashMap;
use std::future::Future;
use std::hash::{Hash, Hasher};
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use parking_lot::{Mutex, MutexGuard};
use prometheus::IntCounter;

use crate::ateapi::resume::{AttemptResult, Code, ResumeError, Resumed};
use crate::ateapi::target::ActorId;
use crate::parking::backoff::{Backoff, BackoffPolicy};
use crate::parking::clock::Clock;
use crate::parking::share::{AtespaceShares, ShareHold, SharePolicy};
use crate::parking::timer::{Scheduler, TimerId};
use crate::trace::context::SpanContext;
use crate::trace::span::{AttemptTrace, FlightTrace, RouteTrace};

/// Starts `ResumeActor` attempts without waiting for them: the seam between
/// the flights and the control plane, so that the parking logic runs in
/// unit tests against a scripted one.
///
/// Implementations must not block: the caller may be a completion-queue or
/// timer thread. Each attempt reports through its [`AttemptDone`] exactly
/// once (the type is consumed), on whatever thread completes it, and never
/// while the caller of `start` still holds a lock it needs (reporting from
/// inside `start` is allowed).
pub trait Resumer: Send + Sync + 'static {
    fn start(&self, actor: &ActorId, done: AttemptDone);
}

/// Where one attempt's result goes: the flight that started it.
pub struct AttemptDone {
    table: Arc<Inner>,
    flight: Arc<Flight>,
    /// Dropped once the flight has the result: the attempt's place among the
    /// calls open at once (B97, `calls::CallPermit`).
    _guard: Option<Box<dyn Send>>,
    /// The attempt's span, when its flight is traced (B121).
    trace: Option<AttemptTrace>,
}

impl AttemptDone {
    /// When the flight's budget ends: an attempt that has not reached the
    /// control plane by then (no connection, no free call) need not be
    /// awaited (B82, B97).
    pub fn budget_deadline(&self) -> Instant {
        self.flight.deadline
    }

    /// Whether any request still waits on the flight (B78): an attempt not
    /// sent yet need not be sent when none does.
    pub fn has_callers(&self) -> bool {
        self.flight.state.lock().callers > 0
    }

    /// The same attempt, holding `guard` until it has reported.
    pub fn holding(self, guard: impl Send + 'static) -> AttemptDone {
        AttemptDone { _guard: Some(Box::new(guard)), ..self }
    }

    /// The `traceparent` the call carries, naming the attempt's span, when
    /// its flight is traced (B122).
    pub fn traceparent(&self) -> Option<String> {
        self.trace.as_ref().map(|attempt| attempt.span.traceparent())
    }

    /// Reports the attempt's result to its flight.
    pub fn complete(self, result: AttemptResult) {
        if let (Some(flight), Some(attempt)) = (&self.flight.trace, &self.trace) {
            let code = result.as_ref().map_or_else(|e| e.code, |_| Code::Ok);
            flight.attempt_answered(attempt, self.flight.actor.as_str(), code as i64);
        }
        Inner::on_attempt(&self.table, &self.flight, result);
    }
}

/// How flights behave; derived once from the configuration.
#[derive(Clone, Copy, Debug)]
pub struct FlightPolicy {
    /// How long a flight may keep starting attempts (B18).
    pub budget: Duration,
    pub backoff: BackoffPolicy,
    /// Whether the capacity and availability codes are retried (B16).
    pub parking_enabled: bool,
    /// Flights (and so ResumeActor calls) in progress at most (B58).
    pub max_flights: usize,
    /// Flights one atespace may have in progress at once (B79).
    pub atespace_share: SharePolicy,
}

/// Why no flight could be made for an actor that had none.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FlightRefusal {
    /// [`FlightPolicy::max_flights`] are in progress (B58).
    TableFull,
    /// The actor's atespace has its share of them in progress (B79).
    AtespaceFull,
}

/// How a flight ended (B20).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FlightOutcome {
    /// An attempt succeeded.
    Resumed(Resumed),
    /// The budget ended while the actor was still blocked on a retryable
    /// condition; wraps the last retryable error.
    BudgetExhausted(ResumeError),
    /// A terminal error; always wins over earlier retryable ones.
    Failed(ResumeError),
}

/// Whether a caller created the flight or joined it (B21).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Leader,
    Joiner,
}

/// What a waiting caller learns (B23).
#[derive(Clone, Debug)]
pub enum FlightEvent {
    /// The flight had its first retryable failure: the park transition.
    Parked,
    /// The budget passed with an attempt still running: the caller will be
    /// served late, if at all (B19).
    Overtime,
    /// The flight finished.
    Done(Arc<FlightOutcome>),
}

/// What a [`FlightWait`] waits for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Until {
    /// The park transition or the end (B23 phase 1).
    ParkedOrDone,
    /// The end (phase 2).
    Done,
    /// Overtime or the end.
    OvertimeOrDone,
}

/// Where a flight is in its life. Every transition happens under the
/// flight's lock:
///
/// ```text
/// First ──retryable──▶ Retrying{running: false} ──timer──▶ Retrying{running: true} ─┐
///   │                        ▲                                                     │
///   │                        └──────────────────retryable──────────────────────────┘
///   ├──deadline (attempt running)──▶ Overtime ──any result──▶ Done
///   └──success / terminal / retryable at the deadline──▶ Done  (from any phase)
///
/// First / Retrying{running: true} ──retryable, no caller──▶ Abandoned
/// Retrying{running: false} ──last caller left──▶ Abandoned
/// ```
#[derive(Debug)]
enum Phase {
    /// The first attempt runs; callers wait for it (B23 phase 1).
    First,
    /// Past the park transition: an attempt runs or the retry timer is set.
    /// `last` is the latest retryable error, which budget exhaustion wraps
    /// (B12).
    Retrying { attempt_running: bool, last: ResumeError },
    /// The budget passed with an attempt still running; it is awaited
    /// (B19). `last` is the retryable error before it, if any.
    Overtime { last: Option<ResumeError> },
    /// Finished: the outcome every caller reads.
    Done(Arc<FlightOutcome>),
    /// A retry was due with no caller left (B78): ended without an
    /// outcome, since nobody is there to read one.
    Abandoned,
}

impl Phase {
    /// Whether the flight has ended, with an outcome or abandoned.
    fn ended(&self) -> bool {
        matches!(self, Phase::Done(_) | Phase::Abandoned)
    }

    /// Whether the flight is past its park transition (B23).
    fn parked(&self) -> bool {
        matches!(self, Phase::Retrying { .. } | Phase::Overtime { last: Some(_) })
    }

    /// What a waiter for `until` learns now, if anything.
    fn event(&self, until: Until) -> Option<FlightEvent> {
        match (self, until) {
            (Phase::Done(outcome), _) => Some(FlightEvent::Done(Arc::clone(outcome))),
            (phase, Until::ParkedOrDone) if phase.parked() => Some(FlightEvent::Parked),
            (Phase::Overtime { .. }, Until::OvertimeOrDone) => Some(FlightEvent::Overtime),
            _ => None,
        }
    }
}

/// One in-progress resume of one actor.
pub struct Flight {
    actor: ActorId,
    started: Instant,
    deadline: Instant,
    state: Mutex<FlightState>,
    /// The flight's span in its leader's trace, when that is traced (B121).
    trace: Option<FlightTrace>,
}

struct FlightState {
    phase: Phase,
    /// Callers holding a [`Caller`] on this flight (B78).
    callers: usize,
    /// This flight's place in its atespace's share (B79), given back when
    /// it leaves the table.
    share: Option<ShareHold>,
    attempts: u32,
    last_code: Option<Code>,
    backoff: Backoff,
    waiters: Waiters,
    /// Callers holding a lot slot on this flight (for the status page).
    parked_callers: usize,
    /// When the running attempt started; `None` between attempts (B92).
    attempt_started: Option<Instant>,
    /// The deadline check that tells callers about overtime, cancelled when
    /// the flight ends early: most flights end in a millisecond, and their
    /// checks should not keep the timer busy for a whole budget.
    deadline_timer: Option<TimerId>,
}

/// Wakers of the callers waiting on a flight, by registration key.
#[derive(Default)]
struct Waiters {
    wakers: HashMap<u64, Waker>,
    next_key: u64,
}

impl Waiters {
    fn take_all(&mut self) -> Vec<Waker> {
        self.wakers.drain().map(|(_, w)| w).collect()
    }
}

impl Flight {
    /// The actor this flight resumes.
    pub fn actor(&self) -> &ActorId {
        &self.actor
    }

    /// The latest retryable error, once past the park transition.
    pub fn last_retryable(&self) -> Option<ResumeError> {
        match &self.state.lock().phase {
            Phase::Retrying { last, .. } | Phase::Overtime { last: Some(last) } => Some(last.clone()),
            _ => None,
        }
    }

    /// The flight's resume span, when it is traced (B121).
    pub fn resume_span(&self) -> Option<SpanContext> {
        self.trace.as_ref().map(|t| t.resume)
    }

    /// The finished outcome, if any (B24's re-check).
    pub fn outcome(&self) -> Option<Arc<FlightOutcome>> {
        match &self.state.lock().phase {
            Phase::Done(outcome) => Some(Arc::clone(outcome)),
            _ => None,
        }
    }

    /// A future for the next event of interest.
    pub fn wait(self: &Arc<Self>, until: Until) -> FlightWait {
        FlightWait { flight: Arc::clone(self), until, key: None }
    }

    /// Records that a caller took (`true`) or released (`false`) a lot slot.
    pub fn note_parked_caller(&self, parked: bool) {
        let mut state = self.state.lock();
        if parked {
            state.parked_callers += 1;
        } else {
            state.parked_callers = state.parked_callers.saturating_sub(1);
        }
    }

    /// A point-in-time view for the status page.
    pub fn snapshot(&self, now: Instant) -> FlightSnapshot {
        let state = self.state.lock();
        FlightSnapshot {
            actor: self.actor.clone(),
            age: now.saturating_duration_since(self.started),
            budget_left: self.deadline.saturating_duration_since(now),
            attempt_age: state.attempt_started.map(|at| now.saturating_duration_since(at)),
            attempts: state.attempts,
            parked_callers: state.parked_callers,
            #[cfg(feature = "testkit")]
            callers: state.callers,
            last_code: state.last_code,
        }
    }
}

/// A view of one flight.
#[derive(Clone, Debug)]
pub struct FlightSnapshot {
    pub actor: ActorId,
    pub age: Duration,
    pub budget_left: Duration,
    /// How long the running attempt has run; `None` between attempts (B92).
    pub attempt_age: Option<Duration>,
    pub attempts: u32,
    pub parked_callers: usize,
    /// Callers currently waiting on this flight, parked or not.
    #[cfg(feature = "testkit")]
    pub callers: usize,
    pub last_code: Option<Code>,
}

/// A future for a flight event; dropping it unregisters the waiter.
pub struct FlightWait {
    flight: Arc<Flight>,
    until: Until,
    key: Option<u64>,
}

impl Future for FlightWait {
    type Output = FlightEvent;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<FlightEvent> {
        let this = &mut *self;
        let mut state = this.flight.state.lock();
        if let Some(event) = state.phase.event(this.until) {
            if let Some(key) = this.key.take() {
                state.waiters.wakers.remove(&key);
            }
            return Poll::Ready(event);
        }
        let key = *this.key.get_or_insert_with(|| {
            state.waiters.next_key += 1;
            state.waiters.next_key
        });
        state.waiters.wakers.insert(key, cx.waker().clone());
        Poll::Pending
    }
}

impl Drop for FlightWait {
    fn drop(&mut self) {
        if let Some(key) = self.key.take() {
            self.flight.state.lock().waiters.wakers.remove(&key);
        }
    }
}

/// The table of flights, keyed by canonical actor id.
#[derive(Clone)]
pub struct FlightTable {
    inner: Arc<Inner>,
}

/// One slice of the table.
type Shard = Mutex<HashMap<ActorId, Arc<Flight>>>;

struct Inner {
    shards: Box<[Shard]>,
    /// Flights in the table; never above `policy.max_flights` (B58).
    active: AtomicUsize,
    clock: Arc<dyn Clock>,
    scheduler: Arc<dyn Scheduler>,
    resumer: Arc<dyn Resumer>,
    policy: FlightPolicy,
    /// Each atespace's flights in the table (B79).
    shares: Arc<AtespaceShares>,
    /// `atenet_router_flights_abandoned_total` (B78).
    abandoned: IntCounter,
}

const SHARDS: usize = 64;

impl FlightTable {
    /// A table under `policy`; `abandoned` counts the flights that ended
    /// for want of callers (B78).
    pub fn new(
        policy: FlightPolicy,
        clock: Arc<dyn Clock>,
        scheduler: Arc<dyn Scheduler>,
        resumer: Arc<dyn Resumer>,
        abandoned: IntCounter,
    ) -> FlightTable {
        let shards = (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect();
        let active = AtomicUsize::new(0);
        let shares = AtespaceShares::new(policy.atespace_share);
        let inner = Inner { shards, active, clock, scheduler, resumer, policy, shares, abandoned };
        FlightTable { inner: Arc::new(inner) }
    }

    /// Joins the actor's flight, or creates it and starts its first attempt
    /// at once (B14, B15). The [`Caller`] keeps the flight retrying until it
    /// is dropped (B78). Creating one fails when the actor's atespace has its
    /// share of flights in progress (B79) or `max_flights` are (B58), the
    /// share checked first; joining never does.
    #[cfg(any(test, feature = "testkit"))]
    pub fn join(&self, actor: &ActorId) -> Result<(Caller, Role), FlightRefusal> {
        self.join_traced(actor, None)
    }

    /// As [`FlightTable::join`], for a caller whose route span is `route`:
    /// a flight it creates is traced under that span (B121).
    pub fn join_traced(
        &self,
        actor: &ActorId,
        route: Option<&RouteTrace>,
    ) -> Result<(Caller, Role), FlightRefusal> {
        let created = {
            let mut shard = self.inner.shard(actor).lock();
            if let Some(flight) = shard.get(actor) {
                flight.state.lock().callers += 1;
                return Ok((Caller::new(&self.inner, flight), Role::Joiner));
            }
            let share = self.inner.shares.try_take(actor).ok_or(FlightRefusal::AtespaceFull)?;
            // Exact under any concurrency, as the lot is (B29): the count
            // only rises here, and only below the cap.
            let max = self.inner.policy.max_flights;
            if self
                .inner
                .active
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < max).then_some(n + 1))
                .is_err()
            {
                return Err(FlightRefusal::TableFull);
            }
            let now = self.inner.clock.now();
            let flight = Arc::new(Flight {
                actor: actor.clone(),
                started: now,
                deadline: now + self.inner.policy.budget,
                state: Mutex::new(FlightState {
                    phase: Phase::First,
                    callers: 1,
                    share: Some(share),
                    attempts: 0,
                    last_code: None,
                    backoff: Backoff::new(self.inner.policy.backoff),
                    waiters: Waiters::default(),
                    parked_callers: 0,
                    attempt_started: None,
                    deadline_timer: None,
                }),
                trace: route.map(FlightTrace::led_by),
            });
            shard.insert(actor.clone(), Arc::clone(&flight));
            flight
        };
        // Callers learn when the budget passes with an attempt still running
        // (B19): late serve asks Envoy for more time (B49), and every caller
        // gets its own answer before Envoy's ceiling (B81).
        let (inner, flight) = (Arc::clone(&self.inner), Arc::clone(&created));
        let timer =
            self.inner.scheduler.schedule(created.deadline, Box::new(move || inner.on_deadline(&flight)));
        created.state.lock().deadline_timer = Some(timer);
        Inner::start_attempt(&self.inner, &created);
        Ok((Caller::new(&self.inner, &created), Role::Leader))
    }

    /// How many flights are in progress.
    pub fn len(&self) -> usize {
        self.inner.active.load(Ordering::Acquire)
    }

    /// True when no flight is in progress (B30).
    #[cfg(any(test, feature = "testkit"))]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Views of every flight, oldest first.
    pub fn snapshot(&self) -> Vec<FlightSnapshot> {
        let now = self.inner.clock.now();
        let flights: Vec<Arc<Flight>> =
            self.inner.shards.iter().flat_map(|s| s.lock().values().cloned().collect::<Vec<_>>()).collect();
        let mut views: Vec<FlightSnapshot> = flights.iter().map(|f| f.snapshot(now)).collect();
        views.sort_by_key(|v| std::cmp::Reverse(v.age));
        views
    }

    /// How long the longest-running attempt has run, if one runs (B92):
    /// `atenet_router_oldest_attempt_seconds`, read at scrape time.
    pub fn oldest_attempt(&self) -> Option<Duration> {
        let now = self.inner.clock.now();
        let flights: Vec<Arc<Flight>> =
            self.inner.shards.iter().flat_map(|s| s.lock().values().cloned().collect::<Vec<_>>()).collect();
        let started = flights.iter().filter_map(|f| f.state.lock().attempt_started).min()?;
        Some(now.saturating_duration_since(started))
    }
}

impl Inner {
    fn shard(&self, actor: &ActorId) -> &Shard {
        let mut hasher = DefaultHasher::new();
        actor.hash(&mut hasher);
        &self.shards[(hasher.finish() as usize) % self.shards.len()]
    }

    fn start_attempt(inner: &Arc<Inner>, flight: &Arc<Flight>) {
        let number = {
            let mut state = flight.state.lock();
            state.attempts += 1;
            state.attempt_started = Some(inner.clock.now());
            state.attempts
        };
        let trace = flight.trace.as_ref().map(|t| t.attempt(number));
        let done = AttemptDone { table: Arc::clone(inner), flight: Arc::clone(flight), _guard: None, trace };
        inner.resumer.start(&flight.actor, done);
    }

    fn on_attempt(inner: &Arc<Inner>, flight: &Arc<Flight>, result: AttemptResult) {
        let error = match result {
            Ok(resumed) => return inner.finish(flight, Code::Ok, FlightOutcome::Resumed(resumed)),
            Err(error) => error,
        };
        if !error.code.is_retryable(inner.policy.parking_enabled) {
            return inner.finish(flight, error.code, FlightOutcome::Failed(error));
        }
        let now = inner.clock.now();
        if now >= flight.deadline {
            // No retry can start (B19): the flight ends here, and no caller
            // sees a park transition first, so none can take a slot (or be
            // shed) for a flight that has already ended (B24).
            return inner.finish(flight, error.code, FlightOutcome::BudgetExhausted(error));
        }
        let (wake, next) = {
            // Whether anyone still waits, and the retry that follows, are
            // decided under the shard's lock, so that a caller joining now
            // either counts or finds no flight (B78).
            let shard = inner.shard(&flight.actor).lock();
            let mut state = flight.state.lock();
            if state.callers == 0 {
                state.last_code = Some(error.code);
                return inner.abandon(shard, flight, state);
            }
            drop(shard);
            state.last_code = Some(error.code);
            state.attempt_started = None;
            let first_park = !state.phase.parked();
            state.phase = Phase::Retrying { attempt_running: false, last: error };
            let wake = if first_park { state.waiters.take_all() } else { Vec::new() };
            (wake, now + state.backoff.next_random_delay())
        };
        // Waiters re-register when they are polled again, if they still wait.
        wake.into_iter().for_each(Waker::wake);
        // A retry due at or after the deadline would never start (B19), so
        // wake at the deadline instead and end there.
        let (at, retry) = if next < flight.deadline { (next, true) } else { (flight.deadline, false) };
        let (inner2, flight2) = (Arc::clone(inner), Arc::clone(flight));
        inner.scheduler.schedule(at, Box::new(move || Inner::on_timer(&inner2, &flight2, retry)));
    }

    /// At the budget deadline: an attempt still running will be awaited, so
    /// callers learn they are in overtime (and can ask Envoy to wait).
    fn on_deadline(&self, flight: &Arc<Flight>) {
        let wake = {
            let mut state = flight.state.lock();
            state.deadline_timer = None;
            let last = match &state.phase {
                Phase::First => None,
                Phase::Retrying { attempt_running: true, last } => Some(last.clone()),
                _ => return,
            };
            state.phase = Phase::Overtime { last };
            state.waiters.take_all()
        };
        wake.into_iter().for_each(Waker::wake);
    }

    /// The retry timer: start the next attempt, or end the flight at its
    /// deadline with the last retryable error (B19).
    fn on_timer(inner: &Arc<Inner>, flight: &Arc<Flight>, retry: bool) {
        let last = {
            let mut state = flight.state.lock();
            let Phase::Retrying { attempt_running: false, last } = &mut state.phase else { return };
            if retry && inner.clock.now() < flight.deadline {
                let last = last.clone();
                state.phase = Phase::Retrying { attempt_running: true, last };
                drop(state);
                return Inner::start_attempt(inner, flight);
            }
            last.clone()
        };
        inner.finish(flight, last.code, FlightOutcome::BudgetExhausted(last));
    }

    /// Ends a flight: remove it from the table first, then publish the
    /// outcome and wake its callers (B14's order), so a request arriving
    /// after this point starts a fresh flight instead of reading a result.
    fn finish(&self, flight: &Arc<Flight>, code: Code, outcome: FlightOutcome) {
        let shard = self.shard(&flight.actor).lock();
        let mut state = flight.state.lock();
        if state.phase.ended() {
            return;
        }
        state.last_code = Some(code);
        state.attempt_started = None;
        state.phase = Phase::Done(Arc::new(outcome));
        self.leave_table(shard, flight, state);
    }

    /// Ends a flight nobody waits for (B78); the locks are the caller's.
    fn abandon(
        &self,
        shard: MutexGuard<'_, HashMap<ActorId, Arc<Flight>>>,
        flight: &Arc<Flight>,
        mut state: MutexGuard<'_, FlightState>,
    ) {
        state.phase = Phase::Abandoned;
        self.abandoned.inc();
        self.leave_table(shard, flight, state);
    }

    /// Takes an ended flight out of the table and gives its share back, then,
    /// with every lock released, cancels its deadline check and wakes its
    /// callers.
    fn leave_table(
        &self,
        mut shard: MutexGuard<'_, HashMap<ActorId, Arc<Flight>>>,
        flight: &Arc<Flight>,
        mut state: MutexGuard<'_, FlightState>,
    ) {
        if shard.get(&flight.actor).is_some_and(|f| Arc::ptr_eq(f, flight)) {
            shard.remove(&flight.actor);
            self.active.fetch_sub(1, Ordering::AcqRel);
        }
        let (wake, timer, share) =
            (state.waiters.take_all(), state.deadline_timer.take(), state.share.take());
        let ended = flight.trace.as_ref().map(|_| (trace_outcome(&state.phase), state.attempts));
        drop(state);
        drop(shard);
        drop(share);
        if let (Some(trace), Some((outcome, attempts))) = (&flight.trace, ended) {
            trace.ended(flight.actor.as_str(), outcome, attempts);
        }
        if let Some(timer) = timer {
            self.scheduler.cancel(timer);
        }
        wake.into_iter().for_each(Waker::wake);
    }

    /// A caller left: with no caller left and no attempt running, the flight
    /// ends now rather than at its next retry (B78).
    fn leave(&self, flight: &Arc<Flight>) {
        let shard = self.shard(&flight.actor).lock();
        let mut state = flight.state.lock();
        state.callers -= 1;
        if state.callers == 0 && matches!(state.phase, Phase::Retrying { attempt_running: false, .. }) {
            self.abandon(shard, flight, state);
        }
    }
}

/// How an ended flight's span says it ended (B121).
fn trace_outcome(phase: &Phase) -> &'static str {
    match phase {
        Phase::Done(outcome) => match **outcome {
            FlightOutcome::Resumed(_) => "resumed",
            FlightOutcome::BudgetExhausted(_) => "budget_exhausted",
            FlightOutcome::Failed(_) => "failed",
        },
        _ => "abandoned",
    }
}

/// One caller's hold on a flight (B78): while any is held, the flight keeps
/// retrying; dropping the last one stops it. Dereferences to the flight.
pub struct Caller {
    table: Arc<Inner>,
    flight: Arc<Flight>,
}

impl Caller {
    fn new(table: &Arc<Inner>, flight: &Arc<Flight>) -> Caller {
        Caller { table: Arc::clone(table), flight: Arc::clone(flight) }
    }
}

impl std::ops::Deref for Caller {
    type Target = Arc<Flight>;

    fn deref(&self) -> &Arc<Flight> {
        &self.flight
    }
}

impl Drop for Caller {
    fn drop(&mut self) {
        self.table.leave(&self.flight);
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::parking::clock::ManualClock;
    use crate::parking::timer::ManualScheduler;
    use futures::task::noop_waker;

    /// A control plane that records attempts and lets the test answer them.
    #[derive(Default)]
    pub(crate) struct ScriptedResumer {
        pending: Mutex<Vec<(ActorId, AttemptDone)>>,
        pub(crate) calls: Mutex<HashMap<ActorId, u32>>,
    }

    impl ScriptedResumer {
        pub(crate) fn calls(&self, actor: &ActorId) -> u32 {
            self.calls.lock().get(actor).copied().unwrap_or(0)
        }

        pub(crate) fn running(&self) -> usize {
            self.pending.lock().len()
        }

        /// The actors of the running attempts, oldest first.
        pub(crate) fn pending_actors(&self) -> Vec<ActorId> {
            self.pending.lock().iter().map(|(a, _)| a.clone()).collect()
        }

        /// Answers the oldest running attempt for `actor`.
        pub(crate) fn answer(&self, actor: &ActorId, result: AttemptResult) {
            let done = {
                let mut pending = self.pending.lock();
                let index = pending.iter().position(|(a, _)| a == actor).expect("no attempt running");
                pending.remove(index).1
            };
            done.complete(result);
        }
    }

    impl Resumer for ScriptedResumer {
        fn start(&self, actor: &ActorId, done: AttemptDone) {
            *self.calls.lock().entry(actor.clone()).or_default() += 1;
            self.pending.lock().push((actor.clone(), done));
        }
    }

    pub(crate) struct Harness {
        pub(crate) clock: ManualClock,
        pub(crate) scheduler: ManualScheduler,
        pub(crate) resumer: Arc<ScriptedResumer>,
        pub(crate) table: FlightTable,
        pub(crate) abandoned: IntCounter,
    }

    pub(crate) fn harness(budget_ms: u64, interval_ms: u64, parking_enabled: bool) -> Harness {
        harness_with_share(budget_ms, interval_ms, parking_enabled, SharePolicy::capped(100, 3))
    }

    /// A harness of `share.whole` flights shared out by `share` (B79).
    pub(crate) fn harness_with_share(
        budget_ms: u64,
        interval_ms: u64,
        parking_enabled: bool,
        share: SharePolicy,
    ) -> Harness {
        let clock = ManualClock::new();
        let scheduler = ManualScheduler::new(clock.clone());
        let resumer = Arc::new(ScriptedResumer::default());
        let abandoned = IntCounter::new("abandoned", "flights abandoned").unwrap();
        let policy = FlightPolicy {
            budget: Duration::from_millis(budget_ms),
            backoff: BackoffPolicy { interval: Duration::from_millis(interval_ms), factor: 2.0, jitter: 0.0 },
            parking_enabled,
            max_flights: share.whole,
            atespace_share: share,
        };
        let table = FlightTable::new(
            policy,
            Arc::new(clock.clone()),
            Arc::new(scheduler.clone()),
            Arc::clone(&resumer) as Arc<dyn Resumer>,
            abandoned.clone(),
        );
        Harness { clock, scheduler, resumer, table, abandoned }
    }

    pub(crate) fn actor(name: &str) -> ActorId {
        ActorId::parse(&format!("demo/{name}")).unwrap()
    }

    pub(crate) fn ok(resumed: bool) -> AttemptResult {
        Ok(Resumed::from_pod_ips(resumed, &["10.0.0.7".into()]))
    }

    pub(crate) fn err(code: Code, message: &str) -> AttemptResult {
        Err(ResumeError::new(code, message))
    }

    pub(crate) fn poll(wait: &mut FlightWait) -> Poll<FlightEvent> {
        let waker = noop_waker();
        Pin::new(wait).poll(&mut Context::from_waker(&waker))
    }

    /// Records how many flights the table holds each time it is woken.
    struct TableProbe {
        table: FlightTable,
        seen: Arc<Mutex<Vec<usize>>>,
    }

    impl futures::task::ArcWake for TableProbe {
        fn wake_by_ref(probe: &Arc<Self>) {
            let flights = probe.table.inner.shards.iter().map(|s| s.lock().len()).sum();
            probe.seen.lock().push(flights);
        }
    }

    pub(crate) fn done(wait: &mut FlightWait) -> FlightOutcome {
        match poll(wait) {
            Poll::Ready(FlightEvent::Done(outcome)) => (*outcome).clone(),
            other => panic!("expected done, got {other:?}"),
        }
    }

    #[test]
    fn b14_leader_then_joiners_share_one_attempt_and_table_empties_before_wake() {
        let h = harness(1000, 100, true);
        let a = actor("a");
        let (leader, role) = h.table.join(&a).unwrap();
        assert_eq!(role, Role::Leader);
        let (joiner, role) = h.table.join(&a).unwrap();
        assert_eq!(role, Role::Joiner);
        assert!(Arc::ptr_eq(&leader, &joiner));
        assert_eq!(h.resumer.calls(&a), 1, "B15: first attempt starts at once, once");
        let mut wait = joiner.wait(Until::Done);
        // A waker that looks at the table at the moment it is woken: the
        // flight must be gone by then, so a request woken by it (or arriving
        // with it) starts a fresh flight instead of joining a finished one.
        let seen = Arc::new(Mutex::new(Vec::new()));
        let waker =
            futures::task::waker(Arc::new(TableProbe { table: h.table.clone(), seen: Arc::clone(&seen) }));
        assert!(Pin::new(&mut wait).poll(&mut Context::from_waker(&waker)).is_pending());
        h.resumer.answer(&a, ok(true));
        assert_eq!(*seen.lock(), vec![0], "B14: woken once, with the flight already removed");
        assert!(h.table.is_empty(), "B14: finished flight removed");
        assert_eq!(h.scheduler.pending(), 0, "the late-serve check is cancelled with the flight");
        assert!(matches!(done(&mut wait), FlightOutcome::Resumed(r) if r.resumed));
        let (_, role) = h.table.join(&a).unwrap();
        assert_eq!(role, Role::Leader, "B14: no caching; a new flight starts");
        assert_eq!(h.resumer.calls(&a), 2);
    }

    #[test]
    fn b58_flights_beyond_the_cap_are_refused_while_joiners_still_join() {
        let h = harness(1000, 100, true);
        let actors: Vec<ActorId> = (0..3).map(|i| actor(&format!("a{i}"))).collect();
        for a in &actors {
            assert_eq!(h.table.join(a).unwrap().1, Role::Leader);
        }
        assert_eq!(h.table.len(), 3);
        assert!(matches!(h.table.join(&actor("fourth")), Err(FlightRefusal::TableFull)));
        assert_eq!(h.resumer.calls(&actor("fourth")), 0, "no ResumeActor call beyond the cap");
        assert_eq!(h.table.join(&actors[0]).unwrap().1, Role::Joiner, "an existing flight is still joined");
        h.resumer.answer(&actors[1], err(Code::NotFound, "gone"));
        assert_eq!(h.table.len(), 2);
        assert_eq!(h.table.join(&actor("fourth")).unwrap().1, Role::Leader, "room again once one ends");
        for a in [&actors[0], &actors[2], &actor("fourth")] {
            h.resumer.answer(a, ok(false));
        }
        assert!(h.table.is_empty());
    }

    #[test]
    fn b58_cap_is_exact_under_concurrency() {
        let h = harness(1000, 100, true);
        let table = h.table.clone();
        let barrier = Arc::new(std::sync::Barrier::new(8));
        let created: usize = (0..8)
            .map(|t| {
                let (table, barrier) = (table.clone(), Arc::clone(&barrier));
                std::thread::spawn(move || {
                    barrier.wait();
                    (0..50).filter(|i| table.join(&actor(&format!("t{t}-{i}"))).is_ok()).count()
                })
            })
            .collect::<Vec<_>>()
            .into_iter()
            .map(|handle| handle.join().unwrap())
            .sum();
        assert_eq!(created, 3, "exactly max_flights of 400 distinct actors");
        assert_eq!(h.table.len(), 3);
        while h.resumer.running() > 0 {
            let a = h.resumer.pending.lock()[0].0.clone();
            h.resumer.answer(&a, ok(false));
        }
        assert!(h.table.is_empty());
    }

    #[test]
    fn b24_a_late_retryable_error_ends_the_flight_without_a_park_transition() {
        let h = harness(250, 100, true);
        let a = actor("a");
        let (flight, _) = h.table.join(&a).unwrap();
        let mut wait = flight.wait(Until::ParkedOrDone);
        assert!(poll(&mut wait).is_pending());
        h.scheduler.advance(Duration::from_millis(300));
        // The first attempt fails after the deadline: the waiter must see the
        // end, never a park that would send it to the lot.
        h.resumer.answer(&a, err(Code::ResourceExhausted, "full"));
        assert!(!flight.state.lock().phase.parked(), "no park transition for an ended flight");
        assert!(matches!(done(&mut wait), FlightOutcome::BudgetExhausted(_)));
    }

    #[test]
    fn b16_b17_retries_on_schedule_then_succeeds() {
        let h = harness(5000, 100, true);
        let a = actor("a");
        let (flight, _) = h.table.join(&a).unwrap();
        let mut wait = flight.wait(Until::ParkedOrDone);
        h.resumer.answer(&a, err(Code::ResourceExhausted, "no free workers available"));
        assert!(matches!(poll(&mut wait), Poll::Ready(FlightEvent::Parked)), "B23 park transition");
        h.scheduler.advance(Duration::from_millis(99));
        assert_eq!(h.resumer.calls(&a), 1);
        h.scheduler.advance(Duration::from_millis(1));
        assert_eq!(h.resumer.calls(&a), 2, "d1 = interval");
        h.resumer.answer(&a, err(Code::Unavailable, "restarting"));
        h.scheduler.advance(Duration::from_millis(199));
        assert_eq!(h.resumer.calls(&a), 2);
        h.scheduler.advance(Duration::from_millis(1));
        assert_eq!(h.resumer.calls(&a), 3, "d2 = interval * factor");
        h.resumer.answer(&a, err(Code::FailedPrecondition, "suspending"));
        h.scheduler.advance(Duration::from_millis(400));
        assert_eq!(h.resumer.calls(&a), 4);
        h.resumer.answer(&a, ok(true));
        let mut wait = flight.wait(Until::Done);
        assert!(matches!(done(&mut wait), FlightOutcome::Resumed(_)));
        assert!(h.table.is_empty());
    }

    #[test]
    fn b19_budget_ends_retries_with_no_attempt_at_deadline() {
        let h = harness(250, 100, true);
        let a = actor("a");
        let (flight, _) = h.table.join(&a).unwrap();
        h.resumer.answer(&a, err(Code::ResourceExhausted, "no free workers available"));
        h.scheduler.advance(Duration::from_millis(100));
        h.resumer.answer(&a, err(Code::ResourceExhausted, "still none"));
        // Next retry would be at 100 + 200 = 300 ms, past the 250 ms deadline.
        h.scheduler.advance(Duration::from_millis(149));
        assert!(flight.outcome().is_none());
        h.scheduler.advance(Duration::from_millis(1));
        assert_eq!(h.resumer.calls(&a), 2, "B19: no attempt at or after the deadline");
        assert_eq!(
            *flight.outcome().unwrap(),
            FlightOutcome::BudgetExhausted(ResumeError::new(Code::ResourceExhausted, "still none")),
            "B12/B20: wraps the last retryable error"
        );
        assert!(h.table.is_empty());
        assert_eq!(h.scheduler.pending(), 0);
    }

    #[test]
    fn b19_attempt_running_at_deadline_is_awaited_late_success_served() {
        let h = harness(250, 100, true);
        let a = actor("a");
        let (flight, _) = h.table.join(&a).unwrap();
        h.resumer.answer(&a, err(Code::ResourceExhausted, "full"));
        h.scheduler.advance(Duration::from_millis(100));
        assert_eq!(h.resumer.running(), 1);
        h.scheduler.advance(Duration::from_secs(10));
        assert!(flight.outcome().is_none(), "B15: a running attempt is never abandoned");
        h.resumer.answer(&a, ok(true));
        assert!(matches!(*flight.outcome().unwrap(), FlightOutcome::Resumed(_)));
    }

    #[test]
    fn b19_late_retryable_error_is_budget_exhausted() {
        let h = harness(250, 100, true);
        let a = actor("a");
        let (flight, _) = h.table.join(&a).unwrap();
        h.resumer.answer(&a, err(Code::Aborted, "busy"));
        h.scheduler.advance(Duration::from_millis(100));
        h.scheduler.advance(Duration::from_secs(1));
        h.resumer.answer(&a, err(Code::Unavailable, "gone"));
        assert_eq!(
            *flight.outcome().unwrap(),
            FlightOutcome::BudgetExhausted(ResumeError::new(Code::Unavailable, "gone"))
        );
        assert_eq!(h.resumer.calls(&a), 2);
    }

    #[test]
    fn overtime_is_signalled_once_the_budget_passes_with_an_attempt_running() {
        let h = harness(250, 100, true);
        let a = actor("a");
        let (flight, _) = h.table.join(&a).unwrap();
        let mut overtime = flight.wait(Until::OvertimeOrDone);
        assert!(poll(&mut overtime).is_pending());
        h.resumer.answer(&a, err(Code::ResourceExhausted, "full"));
        h.scheduler.advance(Duration::from_millis(100));
        assert!(poll(&mut overtime).is_pending(), "not before the deadline");
        h.scheduler.advance(Duration::from_millis(150));
        assert!(matches!(poll(&mut overtime), Poll::Ready(FlightEvent::Overtime)));
        h.resumer.answer(&a, ok(true));
        assert!(matches!(*flight.outcome().unwrap(), FlightOutcome::Resumed(_)));
    }

    #[test]
    fn no_overtime_when_nothing_runs_at_the_deadline() {
        let h = harness(250, 100, true);
        let a = actor("a");
        let (flight, _) = h.table.join(&a).unwrap();
        let mut overtime = flight.wait(Until::OvertimeOrDone);
        h.resumer.answer(&a, err(Code::ResourceExhausted, "full"));
        h.scheduler.advance(Duration::from_millis(100));
        h.resumer.answer(&a, err(Code::ResourceExhausted, "full"));
        h.scheduler.advance(Duration::from_millis(150));
        assert!(matches!(poll(&mut overtime), Poll::Ready(FlightEvent::Done(_))));
        assert_eq!(h.scheduler.pending(), 0);
    }

    #[test]
    fn b20_late_terminal_error_wins() {
        let h = harness(250, 100, true);
        let a = actor("a");
        let (flight, _) = h.table.join(&a).unwrap();
        h.resumer.answer(&a, err(Code::ResourceExhausted, "full"));
        h.scheduler.advance(Duration::from_millis(100));
        h.scheduler.advance(Duration::from_secs(1));
        h.resumer.answer(&a, err(Code::NotFound, "actor deleted"));
        assert_eq!(
            *flight.outcome().unwrap(),
            FlightOutcome::Failed(ResumeError::new(Code::NotFound, "actor deleted"))
        );
    }

    #[test]
    fn b22_parking_disabled_only_aborted_retries() {
        let h = harness(15_000, 100, false);
        let (a, b) = (actor("a"), actor("b"));
        let (fa, _) = h.table.join(&a).unwrap();
        h.resumer.answer(&a, err(Code::ResourceExhausted, "full"));
        assert_eq!(
            *fa.outcome().unwrap(),
            FlightOutcome::Failed(ResumeError::new(Code::ResourceExhausted, "full"))
        );
        assert_eq!(h.resumer.calls(&a), 1, "B22: exactly one attempt");
        let (fb, _) = h.table.join(&b).unwrap();
        h.resumer.answer(&b, err(Code::Aborted, "conflict"));
        h.scheduler.advance(Duration::from_millis(100));
        assert_eq!(h.resumer.calls(&b), 2, "B22: Aborted still retried");
        h.resumer.answer(&b, ok(false));
        assert!(matches!(*fb.outcome().unwrap(), FlightOutcome::Resumed(ref r) if !r.resumed));
    }

    #[test]
    fn b18_budget_starts_with_leader_and_joiners_share_it() {
        let h = harness(300, 100, true);
        let a = actor("a");
        let (flight, _) = h.table.join(&a).unwrap();
        h.resumer.answer(&a, err(Code::ResourceExhausted, "full"));
        h.scheduler.advance(Duration::from_millis(100));
        h.resumer.answer(&a, err(Code::ResourceExhausted, "full"));
        h.scheduler.advance(Duration::from_millis(150));
        let (joined, role) = h.table.join(&a).unwrap();
        assert_eq!(role, Role::Joiner);
        let mut wait = joined.wait(Until::ParkedOrDone);
        assert!(matches!(poll(&mut wait), Poll::Ready(FlightEvent::Parked)), "B23: joins past park");
        h.scheduler.advance(Duration::from_millis(50));
        assert!(matches!(*flight.outcome().unwrap(), FlightOutcome::BudgetExhausted(_)));
        let snapshot_free = h.table.snapshot();
        assert!(snapshot_free.is_empty());
    }

    #[test]
    fn b92_snapshots_show_the_running_attempts_age_and_none_between_attempts() {
        let h = harness(5000, 100, true);
        let (a, b) = (actor("a"), actor("b"));
        let ms = Duration::from_millis;
        let view = |x: &ActorId| h.table.snapshot().into_iter().find(|f| &f.actor == x).unwrap();
        assert_eq!(h.table.oldest_attempt(), None, "no flight, no attempt");
        // Callers held, so that the flights retry (B78).
        let _caller_a = h.table.join(&a).unwrap();
        h.scheduler.advance(ms(30));
        let _caller_b = h.table.join(&b).unwrap();
        h.scheduler.advance(ms(20));
        assert_eq!(view(&a).attempt_age, Some(ms(50)));
        assert_eq!(view(&b).attempt_age, Some(ms(20)));
        assert_eq!(h.table.oldest_attempt(), Some(ms(50)));
        h.resumer.answer(&a, err(Code::ResourceExhausted, "full"));
        assert_eq!(view(&a).attempt_age, None, "between attempts: the retry timer is set");
        assert_eq!(view(&a).age, ms(50), "the flight itself goes on ageing");
        assert_eq!(h.table.oldest_attempt(), Some(ms(20)), "b's attempt is now the oldest");
        h.scheduler.advance(ms(100));
        assert_eq!(view(&a).attempt_age, Some(ms(0)), "the retry's own age, from its start");
        h.scheduler.advance(ms(10));
        assert_eq!((view(&a).attempt_age, view(&a).attempts), (Some(ms(10)), 2));
        assert_eq!(h.table.oldest_attempt(), Some(ms(130)));
        h.resumer.answer(&b, ok(true));
        assert_eq!(h.table.oldest_attempt(), Some(ms(10)));
        h.resumer.answer(&a, ok(true));
        assert_eq!(h.table.oldest_attempt(), None);
        assert!(h.table.is_empty());
    }

    #[test]
    fn dropped_waiter_unregisters() {
        let h = harness(300, 100, true);
        let a = actor("a");
        let (flight, _) = h.table.join(&a).unwrap();
        let mut wait = flight.wait(Until::Done);
        assert!(poll(&mut wait).is_pending());
        assert_eq!(flight.state.lock().waiters.wakers.len(), 1);
        drop(wait);
        assert_eq!(flight.state.lock().waiters.wakers.len(), 0);
        h.resumer.answer(&a, ok(true));
    }

    fn abandoned(flight: &Flight) -> bool {
        matches!(flight.state.lock().phase, Phase::Abandoned)
    }

    #[test]
    fn b78_a_flight_left_by_every_caller_awaits_its_attempt_and_starts_no_other() {
        let h = harness(1000, 100, true);
        let a = actor("a");
        let (leader, _) = h.table.join(&a).unwrap();
        let flight = Arc::clone(&leader);
        drop(leader);
        assert_eq!(h.table.len(), 1, "the running attempt is awaited (B15)");
        h.resumer.answer(&a, err(Code::ResourceExhausted, "full"));
        assert!(h.table.is_empty() && abandoned(&flight), "a retryable answer for nobody ends it");
        h.scheduler.advance(Duration::from_millis(1000));
        assert_eq!(h.resumer.calls(&a), 1, "no new attempt");
        assert_eq!(h.abandoned.get(), 1);
        let (_next, role) = h.table.join(&a).unwrap();
        assert_eq!(role, Role::Leader, "the next request starts afresh");
        assert_eq!(h.resumer.calls(&a), 2);
    }

    #[test]
    fn b78_the_running_attempt_still_serves_whoever_joins_it() {
        let h = harness(1000, 100, true);
        let a = actor("a");
        drop(h.table.join(&a).unwrap());
        let (joiner, role) = h.table.join(&a).unwrap();
        assert_eq!(role, Role::Joiner, "the flight whose caller left is still there to join");
        let mut wait = joiner.wait(Until::Done);
        h.resumer.answer(&a, ok(true));
        assert!(matches!(done(&mut wait), FlightOutcome::Resumed(r) if r.resumed));
        assert_eq!((h.resumer.calls(&a), h.abandoned.get()), (1, 0));
    }

    #[test]
    fn b78_the_last_caller_leaving_between_attempts_ends_the_flight_at_once() {
        let h = harness(1000, 100, true);
        let a = actor("a");
        let (first, _) = h.table.join(&a).unwrap();
        let (second, _) = h.table.join(&a).unwrap();
        h.resumer.answer(&a, err(Code::ResourceExhausted, "full"));
        let flight = Arc::clone(&first);
        drop(first);
        assert_eq!(h.table.len(), 1, "one caller is still there");
        h.scheduler.advance(Duration::from_millis(100));
        assert_eq!(h.resumer.calls(&a), 2, "so it retries");
        h.resumer.answer(&a, err(Code::ResourceExhausted, "full"));
        drop(second);
        assert!(
            h.table.is_empty() && abandoned(&flight),
            "ended when the last caller left, not at the retry"
        );
        assert_eq!(h.scheduler.pending(), 1, "only the retry timer, which does nothing now");
        h.scheduler.advance(Duration::from_millis(1000));
        assert_eq!(h.resumer.calls(&a), 2);
        assert_eq!(h.scheduler.pending(), 0, "the deadline check was cancelled with the flight");
    }

    #[test]
    fn b78_a_caller_joining_while_the_last_one_leaves_is_never_left_on_an_abandoned_flight() {
        let h = harness(60_000, 1, true);
        let a = actor("a");
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let joiners: Vec<_> = (0..2)
            .map(|_| {
                let (table, a, stop) = (h.table.clone(), a.clone(), Arc::clone(&stop));
                std::thread::spawn(move || {
                    let mut held = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        let (caller, _) = table.join(&a).unwrap();
                        std::thread::yield_now();
                        assert!(!abandoned(&caller), "a caller holds an abandoned flight");
                        drop(caller);
                        std::thread::yield_now();
                        held += 1;
                    }
                    held
                })
            })
            .collect();
        // Answer every attempt with a retryable error and run the retries,
        // racing the joiners' leaving and joining.
        let until = std::time::Instant::now() + Duration::from_secs(2);
        while std::time::Instant::now() < until {
            if h.resumer.running() > 0 {
                h.resumer.answer(&a, err(Code::ResourceExhausted, "full"));
            }
            h.scheduler.advance(Duration::from_millis(1));
        }
        stop.store(true, Ordering::Relaxed);
        let held: u64 = joiners.into_iter().map(|j| j.join().unwrap()).sum();
        assert!(held > 100, "the joiners ran: {held}");
        while h.resumer.running() > 0 {
            h.resumer.answer(&a, err(Code::ResourceExhausted, "full"));
        }
        h.scheduler.advance(Duration::from_millis(1));
        assert!(h.table.is_empty(), "nobody left: every flight ended");
    }

    #[test]
    fn b79_an_atespace_has_at_most_its_share_of_flights_and_joins_beyond_it() {
        let h = harness_with_share(1000, 100, true, SharePolicy::capped(2, 3));
        let greedy: Vec<ActorId> = (0..2).map(|i| ActorId::parse(&format!("greedy/a{i}")).unwrap()).collect();
        let callers: Vec<Caller> = greedy.iter().map(|a| h.table.join(a).unwrap().0).collect();
        let third = ActorId::parse("greedy/a2").unwrap();
        assert!(matches!(h.table.join(&third), Err(FlightRefusal::AtespaceFull)));
        assert_eq!(h.resumer.calls(&third), 0, "no ResumeActor call beyond the share");
        assert_eq!(h.table.join(&greedy[0]).unwrap().1, Role::Joiner, "an existing flight is still joined");
        let other = ActorId::parse("other/x").unwrap();
        assert_eq!(h.table.join(&other).unwrap().1, Role::Leader, "another atespace is untouched");
        h.resumer.answer(&greedy[1], ok(false));
        assert_eq!(h.table.join(&third).unwrap().1, Role::Leader, "the share is given back as a flight ends");
        drop(callers);
    }

    #[test]
    fn b79_the_share_is_checked_before_the_table_and_neither_leaks() {
        // Table 3, share 2: two atespaces fill the table between them.
        let h = harness_with_share(1000, 100, true, SharePolicy::capped(2, 3));
        let parse = |r: &str| ActorId::parse(r).unwrap();
        let held: Vec<Caller> =
            ["x/a", "x/b", "y/a"].iter().map(|r| h.table.join(&parse(r)).unwrap().0).collect();
        assert!(
            matches!(h.table.join(&parse("x/c")), Err(FlightRefusal::AtespaceFull)),
            "both: the share says so"
        );
        assert!(matches!(h.table.join(&parse("y/b")), Err(FlightRefusal::TableFull)));
        assert!(matches!(h.table.join(&parse("z/a")), Err(FlightRefusal::TableFull)));
        for r in ["x/a", "x/b", "y/a"] {
            h.resumer.answer(&parse(r), ok(false));
        }
        drop(held);
        let again: Vec<Caller> =
            ["y/b", "y/c", "z/a"].iter().map(|r| h.table.join(&parse(r)).unwrap().0).collect();
        assert_eq!(h.table.len(), 3, "every refusal gave its share back");
        drop(again);
    }

    #[test]
    fn b79_by_default_an_atespace_alone_has_all_but_an_eighth_of_the_table() {
        // Table 8: half is 4, an eighth 1.
        let h = harness_with_share(1000, 100, true, SharePolicy::work_conserving(8));
        let parse = |r: &str| ActorId::parse(r).unwrap();
        let greedy: Vec<Caller> =
            (0..7).map(|i| h.table.join(&parse(&format!("x/a{i}"))).unwrap().0).collect();
        assert!(matches!(h.table.join(&parse("x/more")), Err(FlightRefusal::AtespaceFull)), "the last one");
        let other = h.table.join(&parse("y/a")).unwrap().0;
        assert!(matches!(h.table.join(&parse("y/b")), Err(FlightRefusal::TableFull)), "the table is full");
        // A flight of the flood ends: its place goes to the other tenant,
        // never back to the flood while only the eighth is free.
        h.resumer.answer(&parse("x/a0"), ok(false));
        assert!(matches!(h.table.join(&parse("x/more")), Err(FlightRefusal::AtespaceFull)));
        assert_eq!(h.table.join(&parse("y/b")).unwrap().1, Role::Leader);
        assert_eq!(h.table.len(), 8);
        drop((greedy, other));
    }
}
