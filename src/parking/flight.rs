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
//! retry timer, its deadline. Attempts are never cancelled: a
//! cancelled restore would strand the worker the control plane already
//! claimed for it. So the budget stops new attempts, but a running one is
//! always awaited.
//!
//! A flight retries only for callers. Each caller holds a [`Caller`] from
//! its join until it has its answer or goes away; when the last one leaves,
//! the flight starts no new attempt: one running is still awaited,
//! and its result still serves anyone who joins meanwhile, but a
//! flight whose callers were all shed, or whose clients all left, stops
//! calling the control plane and gives its place in the table back. No
//! atespace holds more than its share of the table.
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
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use parking_lot::{Mutex, MutexGuard};
use prometheus::IntCounter;

use crate::actor::resume::{AttemptResult, Code, ResumeError, Resumed};
use crate::actor::target::ActorId;
use crate::parking::backoff::{Backoff, BackoffPolicy, Dispatch};
use crate::parking::band::Band;
use crate::parking::clock::Clock;
use crate::parking::groups::{DispatchOrder, Group, GroupKey, GroupSnapshot, PoolMemory, POOL_MEMORY_BOUND};
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
    /// calls open at once (`calls::CallPermit`).
    _guard: Option<Box<dyn Send>>,
    /// The attempt's span, when its flight is traced.
    trace: Option<AttemptTrace>,
}

impl AttemptDone {
    /// When the flight's budget ends: an attempt that has not reached the
    /// control plane by then (no connection, no free call) need not be
    /// awaited.
    pub fn budget_deadline(&self) -> Instant {
        self.flight.deadline
    }

    /// The flight's band now: the highest of its callers'.
    pub fn band(&self) -> Band {
        self.flight.band()
    }

    /// Whether any request still waits on the flight: an attempt not
    /// sent yet need not be sent when none does.
    pub fn has_callers(&self) -> bool {
        self.flight.state.lock().callers > 0
    }

    /// The same attempt, holding `guard` until it has reported.
    pub fn holding(self, guard: impl Send + 'static) -> AttemptDone {
        AttemptDone { _guard: Some(Box::new(guard)), ..self }
    }

    /// The `traceparent` the call carries, naming the attempt's span, when
    /// its flight is traced.
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
    /// How long a flight may keep starting attempts.
    pub budget: Duration,
    pub backoff: BackoffPolicy,
    /// Whether the capacity and availability codes are retried.
    pub parking_enabled: bool,
    /// Flights (and so ResumeActor calls) in progress at most.
    pub max_flights: usize,
    /// Flights one atespace may have in progress at once.
    pub atespace_share: SharePolicy,
    /// Whether saturated flights wait in groups or retry alone.
    pub dispatch: Dispatch,
    /// Routers whose groups share the control plane's pools (B127).
    pub fleet_size: u32,
}

/// Why no flight could be made for an actor that had none.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FlightRefusal {
    /// [`FlightPolicy::max_flights`] are in progress.
    TableFull,
    /// The actor's atespace has its share of them in progress.
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

/// Whether a caller created the flight or joined it.
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
    /// served late, if at all.
    Overtime,
    /// The flight finished.
    Done(Arc<FlightOutcome>),
}

/// What a [`FlightWait`] waits for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Until {
    /// The park transition or the end (phase 1).
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
    /// The first attempt runs; callers wait for it (phase 1).
    First,
    /// Past the park transition: an attempt runs or the retry timer is set.
    /// `last` is the latest retryable error, which budget exhaustion wraps.
    Retrying { attempt_running: bool, last: ResumeError },
    /// The budget passed with an attempt still running; it is awaited.
    /// `last` is the retryable error before it, if any.
    Overtime { last: Option<ResumeError> },
    /// Finished: the outcome every caller reads.
    Done(Arc<FlightOutcome>),
    /// A retry was due with no caller left: ended without an
    /// outcome, since nobody is there to read one.
    Abandoned,
}

impl Phase {
    /// Whether the flight has ended, with an outcome or abandoned.
    fn ended(&self) -> bool {
        matches!(self, Phase::Done(_) | Phase::Abandoned)
    }

    /// Whether the flight is past its park transition.
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
    /// The flight's creation number, its group order's tie-break.
    arrival: u64,
    started: Instant,
    deadline: Instant,
    state: Mutex<FlightState>,
    /// The flight's span in its leader's trace, when that is traced.
    trace: Option<FlightTrace>,
}

struct FlightState {
    phase: Phase,
    /// Callers holding a [`Caller`] on this flight.
    callers: usize,
    /// Those callers by [`Band`].
    bands: [usize; 3],
    /// This flight's place in its atespace's share, given back when
    /// it leaves the table.
    share: Option<ShareHold>,
    attempts: u32,
    last_code: Option<Code>,
    backoff: Backoff,
    waiters: Waiters,
    /// Callers holding a lot slot on this flight (for the status page).
    parked_callers: usize,
    /// When the running attempt started; `None` between attempts.
    attempt_started: Option<Instant>,
    /// The deadline check that tells callers about overtime, cancelled when
    /// the flight ends early: most flights end in a millisecond, and their
    /// checks should not keep the timer busy for a whole budget.
    deadline_timer: Option<TimerId>,
    /// The saturation group the flight waits in, and its place there;
    /// `None` while it runs or retries alone.
    grouped: Option<(GroupKey, DispatchOrder)>,
    /// The group whose probe the running attempt is.
    probe_of: Option<(GroupKey, u64)>,
}

impl FlightState {
    /// The highest band among the callers; `Sheddable` with none.
    fn band(&self) -> Band {
        Band::ALL.into_iter().rev().find(|b| self.bands[*b as usize] > 0).unwrap_or(Band::Sheddable)
    }

    /// Counts a caller of `band` in (`+1`) or out (`-1`); a flight waiting
    /// in a group whose band this changes takes its new place there (B120).
    fn count_caller(&mut self, inner: &Inner, actor: &ActorId, band: Band, joined: bool) {
        let before = self.band();
        if joined {
            self.callers += 1;
            self.bands[band as usize] += 1;
        } else {
            self.callers -= 1;
            self.bands[band as usize] -= 1;
        }
        let after = self.band();
        if let (true, Some((key, order))) = (after != before && self.callers > 0, &mut self.grouped) {
            let to = DispatchOrder { band: after, ..*order };
            if let Some(group) = inner.groups.lock().get_mut(key) {
                group.reorder(actor.atespace(), order, to);
            }
            *order = to;
        }
    }
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

    /// The band the flight acts with: the highest of the callers
    /// waiting on it now; `Sheddable` when none does.
    pub fn band(&self) -> Band {
        self.state.lock().band()
    }

    /// The flight's resume span, when it is traced.
    pub fn resume_span(&self) -> Option<SpanContext> {
        self.trace.as_ref().map(|t| t.resume)
    }

    /// The finished outcome, if any.
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
    /// How long the running attempt has run; `None` between attempts.
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
    /// Flights in the table; never above `policy.max_flights`.
    active: AtomicUsize,
    clock: Arc<dyn Clock>,
    scheduler: Arc<dyn Scheduler>,
    resumer: Arc<dyn Resumer>,
    policy: FlightPolicy,
    /// Each atespace's flights in the table.
    shares: Arc<AtespaceShares>,
    /// `atenet_router_flights_abandoned_total`.
    abandoned: IntCounter,
    /// The saturation groups. Taken after a flight's lock, never
    /// before one: a group's next flight is taken out under this lock and
    /// started after it is released.
    groups: Mutex<HashMap<GroupKey, Group<Arc<Flight>>>>,
    /// False only while no group has existed since the groups lock last
    /// saw none: set under it when a group is made, cleared under it when
    /// found empty. Spares every answer the lock when nothing is grouped.
    any_group: AtomicBool,
    /// The pool each recently resumed actor runs on.
    pools: Mutex<PoolMemory>,
    arrivals: AtomicU64,
}

const SHARDS: usize = 64;

impl FlightTable {
    /// A table under `policy`; `abandoned` counts the flights that ended
    /// for want of callers.
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
        let inner = Inner {
            shards,
            active,
            clock,
            scheduler,
            resumer,
            policy,
            shares,
            abandoned,
            groups: Mutex::new(HashMap::new()),
            any_group: AtomicBool::new(false),
            pools: Mutex::new(PoolMemory::new(POOL_MEMORY_BOUND)),
            arrivals: AtomicU64::new(0),
        };
        FlightTable { inner: Arc::new(inner) }
    }

    /// Joins the actor's flight, or creates it and starts its first attempt
    /// at once (B14, B15). The [`Caller`] keeps the flight retrying until it
    /// is dropped. Creating one fails when the actor's atespace has its
    /// share of flights in progress (B79) or `max_flights` are (B58), the
    /// share checked first; joining never does.
    #[cfg(any(test, feature = "testkit"))]
    pub fn join(&self, actor: &ActorId, band: Band) -> Result<(Caller, Role), FlightRefusal> {
        self.join_traced(actor, band, None)
    }

    /// As [`FlightTable::join`], for a caller whose route span is `route`:
    /// a flight it creates is traced under that span (B121).
    pub fn join_traced(
        &self,
        actor: &ActorId,
        band: Band,
        route: Option<&RouteTrace>,
    ) -> Result<(Caller, Role), FlightRefusal> {
        let created = {
            let mut shard = self.inner.shard(actor).lock();
            if let Some(flight) = shard.get(actor) {
                flight.state.lock().count_caller(&self.inner, actor, band, true);
                return Ok((Caller::new(&self.inner, flight, band), Role::Joiner));
            }
            let share = self.inner.shares.try_take(actor).ok_or(FlightRefusal::AtespaceFull)?;
            // Exact under any concurrency, as the lot is: the count
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
                arrival: self.inner.arrivals.fetch_add(1, Ordering::Relaxed),
                started: now,
                deadline: now + self.inner.policy.budget,
                state: Mutex::new(FlightState {
                    phase: Phase::First,
                    callers: 1,
                    bands: {
                        let mut bands = [0; 3];
                        bands[band as usize] = 1;
                        bands
                    },
                    share: Some(share),
                    attempts: 0,
                    last_code: None,
                    backoff: Backoff::new(self.inner.policy.backoff),
                    waiters: Waiters::default(),
                    parked_callers: 0,
                    attempt_started: None,
                    deadline_timer: None,
                    grouped: None,
                    probe_of: None,
                }),
                trace: route.map(FlightTrace::led_by),
            });
            shard.insert(actor.clone(), Arc::clone(&flight));
            flight
        };
        // Callers learn when the budget passes with an attempt still running:
        // late serve asks Envoy for more time, and every caller
        // gets its own answer before Envoy's ceiling (B81).
        let (inner, flight) = (Arc::clone(&self.inner), Arc::clone(&created));
        let timer =
            self.inner.scheduler.schedule(created.deadline, Box::new(move || inner.on_deadline(&flight)));
        created.state.lock().deadline_timer = Some(timer);
        Inner::start_attempt(&self.inner, &created);
        Ok((Caller::new(&self.inner, &created, band), Role::Leader))
    }

    /// How many flights are in progress.
    pub fn len(&self) -> usize {
        self.inner.active.load(Ordering::Acquire)
    }

    /// True when no flight is in progress.
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

    /// The saturation groups with flights waiting, and the flights waiting
    /// in them (B112): the gauges, read at scrape time.
    pub fn saturation(&self) -> (usize, usize) {
        let groups = self.inner.groups.lock();
        groups.values().filter(|g| g.waiting() > 0).fold((0, 0), |(n, w), g| (n + 1, w + g.waiting()))
    }

    /// Views of the saturation groups, the most waiting first.
    pub fn groups(&self) -> Vec<GroupSnapshot> {
        let now = self.inner.clock.now();
        let groups = self.inner.groups.lock();
        let mut views: Vec<GroupSnapshot> = groups
            .iter()
            .map(|(key, group)| GroupSnapshot {
                key: key.to_string(),
                waiting: group.waiting(),
                oldest_wait: group
                    .oldest_since()
                    .map_or(Duration::ZERO, |at| now.saturating_duration_since(at)),
                last_answer: group.last_answer,
                probe_open: group.probe_open(),
            })
            .collect();
        views.sort_by(|a, b| b.waiting.cmp(&a.waiting).then_with(|| a.key.cmp(&b.key)));
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
        let (probe_of, took) = {
            let mut state = flight.state.lock();
            let took = state.attempt_started.map(|at| inner.clock.now().saturating_duration_since(at));
            (state.probe_of.take(), took)
        };
        if inner.policy.dispatch == Dispatch::SaturationGroup {
            inner.bring_groups_in(&result, &flight.actor, probe_of.as_ref());
        }
        let error = match result {
            Ok(resumed) => {
                if inner.policy.dispatch == Dispatch::SaturationGroup {
                    inner.pools.lock().remember(&flight.actor, &resumed.worker_pool);
                }
                inner.finish(flight, Code::Ok, FlightOutcome::Resumed(resumed));
                // An open probe's success: a worker freed, and more may
                // follow, so the group's next flight goes at once (B110).
                return inner.probe_answered(probe_of, Code::Ok, took);
            }
            Err(error) => error,
        };
        let code = error.code;
        if !code.is_retryable(inner.policy.parking_enabled) {
            inner.finish(flight, code, FlightOutcome::Failed(error));
            return inner.probe_answered(probe_of, code, took);
        }
        let now = inner.clock.now();
        if now >= flight.deadline {
            // No retry can start: the flight ends here, and no caller
            // sees a park transition first, so none can take a slot (or be
            // shed) for a flight that has already ended.
            inner.finish(flight, code, FlightOutcome::BudgetExhausted(error));
            return inner.probe_answered(probe_of, code, took);
        }
        let group = match inner.policy.dispatch {
            Dispatch::SaturationGroup => GroupKey::for_answer(code, &flight.actor, &inner.pools.lock()),
            Dispatch::PerFlight => None,
        };
        let (wake, next) = {
            // Whether anyone still waits, and the retry that follows, are
            // decided under the shard's lock, so that a caller joining now
            // either counts or finds no flight (B78).
            let shard = inner.shard(&flight.actor).lock();
            let mut state = flight.state.lock();
            if state.callers == 0 {
                state.last_code = Some(code);
                inner.abandon(shard, flight, state);
                return inner.probe_answered(probe_of, code, took);
            }
            drop(shard);
            state.last_code = Some(code);
            state.attempt_started = None;
            let first_park = !state.phase.parked();
            state.phase = Phase::Retrying { attempt_running: false, last: error };
            let wake = if first_park { state.waiters.take_all() } else { Vec::new() };
            let next = match &group {
                // Waits in its group, entered under the flight's lock so
                // that its end (which takes it out) cannot come first; its
                // deadline check ends it at its budget.
                Some(key) => {
                    inner.enter_group(flight, &mut state, key, now);
                    None
                }
                None => Some(now + state.backoff.next_random_delay()),
            };
            (wake, next)
        };
        // Waiters re-register when they are polled again, if they still wait.
        wake.into_iter().for_each(Waker::wake);
        match (probe_of, group) {
            (Some((probed, id)), Some(key)) if probed == key => {
                return inner.group_answered(Some(key), code, Some(id), took);
            }
            (probe_of, group) => {
                // A probe's answer about its actor, not the group's pool,
                // only closes the probe.
                inner.probe_answered(probe_of, code, took);
                if let Some(key) = group {
                    return inner.group_answered(Some(key), code, None, took);
                }
            }
        }
        let Some(next) = next else { return };
        // A retry due at or after the deadline would never start, so
        // wake at the deadline instead and end there.
        let (at, retry) = if next < flight.deadline { (next, true) } else { (flight.deadline, false) };
        let (inner2, flight2) = (Arc::clone(inner), Arc::clone(flight));
        inner.scheduler.schedule(at, Box::new(move || Inner::on_timer(&inner2, &flight2, retry)));
    }

    /// Puts a flight into group `key` (B109); the flight's lock is
    /// the caller's.
    fn enter_group(&self, flight: &Arc<Flight>, state: &mut FlightState, key: &GroupKey, now: Instant) {
        let order =
            DispatchOrder { band: state.band(), budget_end: flight.deadline, arrival: flight.arrival };
        let atespace: Arc<str> = Arc::from(flight.actor.atespace());
        let mut groups = self.groups.lock();
        self.any_group.store(true, Ordering::Relaxed);
        let group = groups
            .entry(key.clone())
            .or_insert_with(|| Group::new(self.policy.backoff, self.policy.fleet_size, Code::Ok, now));
        group.insert(&atespace, order, Arc::clone(flight), now);
        state.grouped = Some((key.clone(), order));
    }

    /// Takes an ended flight out of its group, if it waits in one.
    fn leave_group(&self, grouped: Option<(GroupKey, DispatchOrder)>, actor: &ActorId) {
        let Some((key, order)) = grouped else { return };
        let mut groups = self.groups.lock();
        if let Some(group) = groups.get_mut(&key) {
            group.remove(actor.atespace(), &order);
            if group.idle() {
                if let Some((timer, _)) = groups.remove(&key).and_then(|g| g.timer) {
                    self.scheduler.cancel(timer);
                }
            }
        }
    }

    /// The answer of probe `probe` (if the attempt was one), which `took`
    /// so long, whatever group its flight goes to next.
    fn probe_answered(self: &Arc<Self>, probe: Option<(GroupKey, u64)>, code: Code, took: Option<Duration>) {
        if let Some((key, id)) = probe {
            self.group_answered(Some(key), code, Some(id), took);
        }
    }

    /// Group `key` heard `code`, from its probe `probe` or from another
    /// attempt (a first one, or an earlier probe's late answer), an answer
    /// about its pool that `took` so long: decides when it sends its next
    /// flight (B110). While its answers are retryable, one delay after the
    /// answer, growing while it stays saturated; after its open probe's
    /// success at once (a presumed probe's late success is B128's, B129).
    fn group_answered(
        self: &Arc<Self>,
        key: Option<GroupKey>,
        code: Code,
        probe: Option<u64>,
        took: Option<Duration>,
    ) {
        let Some(key) = key else { return };
        let now = self.clock.now();
        let release_now = {
            let mut groups = self.groups.lock();
            let Some(group) = groups.get_mut(&key) else { return };
            let mut answered_open_probe = false;
            if let Some(id) = probe {
                let (was_open, patience_timer) = group.close_probe(id);
                answered_open_probe = was_open;
                if let Some(timer) = patience_timer {
                    self.scheduler.cancel(timer);
                }
            }
            group.last_answer = code;
            group.last_answer_at = now;
            group.heard();
            if let (Code::ResourceExhausted, Some(took)) = (code, took) {
                group.refused_in(took);
            }
            if group.idle() {
                if let Some((timer, _)) = groups.remove(&key).and_then(|g| g.timer) {
                    self.scheduler.cancel(timer);
                }
                return;
            }
            match code {
                Code::Ok if answered_open_probe && group.worker_freed() => {
                    if let Some((timer, _)) = group.timer.take() {
                        self.scheduler.cancel(timer);
                    }
                    true
                }
                // The probe will answer, or the next is due already: another
                // attempt's answer moves no timer, so that arrivals cannot
                // postpone the group forever.
                _ if group.probe_open() || group.timer.is_some() => false,
                _ => {
                    let at = now + group.next_delay();
                    group.timer = Some((self.schedule_release(&key, at), at));
                    false
                }
            }
        };
        if release_now {
            self.release(&key);
        }
    }

    /// An attempt for `actor` was answered `result`, before its probe's
    /// (`probe`, if it was one) answer is handled: what some groups wait
    /// for may have come back, and their next flight goes one delay from
    /// now, not later. Any answer of the control plane does so for the
    /// control plane's group, its own probe's included (B130). A resume
    /// took a worker that freed, and another may follow: so for the group of
    /// the pool it names and for the group of the actor's atespace (its
    /// actors' pools unknown), each unless the attempt is its open probe,
    /// whose success is B110's (B128; a probe presumed a resume is open no
    /// more, B129).
    fn bring_groups_in(
        self: &Arc<Self>,
        result: &AttemptResult,
        actor: &ActorId,
        probe: Option<&(GroupKey, u64)>,
    ) {
        // Each group, with the probe whose answer this is if it is that
        // group's: skipped while still open.
        let mut keys: Vec<(GroupKey, Option<u64>)> = Vec::with_capacity(3);
        let code = result.as_ref().map_or_else(|error| error.code, |_| Code::Ok);
        if GroupKey::answered_by_control_plane(code) {
            keys.push((GroupKey::ControlPlane, None));
        }
        if let Some(resumed) = result.as_ref().ok().filter(|r| r.resumed) {
            let own = |key: &GroupKey| probe.filter(|(probed, _)| probed == key).map(|(_, id)| *id);
            let atespace = GroupKey::Atespace(Arc::from(actor.atespace()));
            keys.push((atespace.clone(), own(&atespace)));
            if !resumed.worker_pool.is_empty() {
                let pool = GroupKey::Pool(Arc::from(resumed.worker_pool.as_str()));
                let pool_probe = own(&pool);
                keys.push((pool, pool_probe));
            }
        }
        // A group made after this check is made after this answer.
        if keys.is_empty() || !self.any_group.load(Ordering::Relaxed) {
            return;
        }
        let mut groups = self.groups.lock();
        if groups.is_empty() {
            self.any_group.store(false, Ordering::Relaxed);
            return;
        }
        // Read under the lock: a timer due by then may already be firing.
        let now = self.clock.now();
        for (key, own_probe) in keys {
            let Some(group) = groups.get_mut(&key) else { continue };
            if own_probe.is_some_and(|id| group.is_open_probe(id)) {
                continue;
            }
            let Some(delay) = group.came_back(now) else { continue };
            if let Some((timer, _)) = group.timer.take() {
                self.scheduler.cancel(timer);
            }
            let at = now + delay;
            group.timer = Some((self.schedule_release(&key, at), at));
        }
    }

    /// Schedules group `key`'s next flight at `at`; the group's lock is
    /// the caller's.
    fn schedule_release(self: &Arc<Self>, key: &GroupKey, at: Instant) -> TimerId {
        let (inner, key) = (Arc::clone(self), key.clone());
        self.scheduler.schedule(at, Box::new(move || inner.release(&key)))
    }

    /// Probe `id` of pool or atespace group `key` has had no answer past the
    /// group's patience: an answer that slow is no refusal (a full pool
    /// refuses at once) but a resume under way, so the group sends its next
    /// flight without waiting for it (B110, B129).
    fn probe_overdue(self: &Arc<Self>, key: &GroupKey, id: u64) {
        {
            let mut groups = self.groups.lock();
            let Some(group) = groups.get_mut(key) else { return };
            if !group.presume_resume(id) {
                return;
            }
            if group.idle() {
                if let Some((timer, _)) = groups.remove(key).and_then(|g| g.timer) {
                    self.scheduler.cancel(timer);
                }
                return;
            }
        }
        self.release(key);
    }

    /// Sends group `key`'s next flight, unless its probe is open:
    /// the first by [`DispatchOrder`], atespaces in turns (B111). A flight
    /// that can no longer run (its budget passed) is skipped.
    fn release(self: &Arc<Self>, key: &GroupKey) {
        loop {
            let (next, id) = {
                let mut groups = self.groups.lock();
                let Some(group) = groups.get_mut(key) else { return };
                // The timer firing now, or one another thread set while the
                // lock was free before this call (a bring-in, B128, B130): its
                // flight goes now, so the timer goes too. Cancelling the one
                // firing does nothing.
                if let Some((timer, _)) = group.timer.take() {
                    self.scheduler.cancel(timer);
                }
                if group.probe_open() {
                    return;
                }
                match group.pop_next() {
                    Some(flight) => {
                        let (id, patience) = group.open_probe();
                        // A control plane that does not answer is no
                        // resume under way: its group waits.
                        if *key != GroupKey::ControlPlane {
                            let (inner, overdue) = (Arc::clone(self), key.clone());
                            let at = self.clock.now() + patience;
                            let task = Box::new(move || inner.probe_overdue(&overdue, id));
                            group.patience_timer = Some(self.scheduler.schedule(at, task));
                        }
                        (flight, id)
                    }
                    None => {
                        groups.remove(key);
                        return;
                    }
                }
            };
            {
                let mut state = next.state.lock();
                state.grouped = None;
                // Not waiting any more (it ended, or its callers left), or
                // waiting: sent now, or, its budget over before its turn
                // came and its deadline check still to run, ended as that
                // check would have ended it.
                if let (true, Phase::Retrying { attempt_running: false, last }) =
                    (state.callers > 0, &state.phase)
                {
                    let last = last.clone();
                    if self.clock.now() >= next.deadline {
                        drop(state);
                        self.finish(&next, last.code, FlightOutcome::BudgetExhausted(last));
                    } else {
                        state.phase = Phase::Retrying { attempt_running: true, last };
                        state.probe_of = Some((key.clone(), id));
                        drop(state);
                        return Inner::start_attempt(self, &next);
                    }
                }
            }
            if let Some(group) = self.groups.lock().get_mut(key) {
                if let (true, Some(timer)) = group.close_probe(id) {
                    self.scheduler.cancel(timer);
                }
            }
        }
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
                // Still waiting in its group at its budget's end: ends now,
                // without another call (B113).
                Phase::Retrying { attempt_running: false, last } if state.grouped.is_some() => {
                    let last = last.clone();
                    drop(state);
                    return self.finish(flight, last.code, FlightOutcome::BudgetExhausted(last));
                }
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

    /// Ends a flight nobody waits for; the locks are the caller's.
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
        let grouped = state.grouped.take();
        let ended = flight.trace.as_ref().map(|_| (trace_outcome(&state.phase), state.attempts));
        drop(state);
        drop(shard);
        drop(share);
        if let (Some(trace), Some((outcome, attempts))) = (&flight.trace, ended) {
            trace.ended(flight.actor.as_str(), outcome, attempts);
        }
        self.leave_group(grouped, &flight.actor);
        if let Some(timer) = timer {
            self.scheduler.cancel(timer);
        }
        wake.into_iter().for_each(Waker::wake);
    }

    /// A caller left: with no caller left and no attempt running, the flight
    /// ends now rather than at its next retry.
    fn leave(&self, flight: &Arc<Flight>, band: Band) {
        let shard = self.shard(&flight.actor).lock();
        let mut state = flight.state.lock();
        state.count_caller(self, &flight.actor, band, false);
        if state.callers == 0 && matches!(state.phase, Phase::Retrying { attempt_running: false, .. }) {
            self.abandon(shard, flight, state);
        }
    }
}

/// How an ended flight's span says it ended.
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
    band: Band,
}

impl Caller {
    fn new(table: &Arc<Inner>, flight: &Arc<Flight>, band: Band) -> Caller {
        Caller { table: Arc::clone(table), flight: Arc::clone(flight), band }
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
        self.table.leave(&self.flight, self.band);
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

    /// A harness of `share.whole` flights shared out by `share` (B79),
    /// each retrying on its own (B17).
    pub(crate) fn harness_with_share(
        budget_ms: u64,
        interval_ms: u64,
        parking_enabled: bool,
        share: SharePolicy,
    ) -> Harness {
        harness_dispatching(budget_ms, interval_ms, parking_enabled, share, Dispatch::PerFlight)
    }

    /// A harness whose saturated flights wait in groups (B109).
    pub(crate) fn grouped_harness(budget_ms: u64, interval_ms: u64) -> Harness {
        harness_dispatching(
            budget_ms,
            interval_ms,
            true,
            SharePolicy::capped(100, 100),
            Dispatch::SaturationGroup,
        )
    }

    /// A grouped harness of a router in a fleet of `fleet_size` (B127).
    fn fleet_harness(budget_ms: u64, interval_ms: u64, fleet_size: u32) -> Harness {
        harness_paced(
            budget_ms,
            interval_ms,
            true,
            SharePolicy::capped(100, 100),
            Dispatch::SaturationGroup,
            fleet_size,
        )
    }

    fn harness_dispatching(
        budget_ms: u64,
        interval_ms: u64,
        parking_enabled: bool,
        share: SharePolicy,
        dispatch: Dispatch,
    ) -> Harness {
        harness_paced(budget_ms, interval_ms, parking_enabled, share, dispatch, 1)
    }

    fn harness_paced(
        budget_ms: u64,
        interval_ms: u64,
        parking_enabled: bool,
        share: SharePolicy,
        dispatch: Dispatch,
        fleet_size: u32,
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
            dispatch,
            fleet_size,
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
        let (leader, role) = h.table.join(&a, Band::Standard).unwrap();
        assert_eq!(role, Role::Leader);
        let (joiner, role) = h.table.join(&a, Band::Standard).unwrap();
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
        let (_, role) = h.table.join(&a, Band::Standard).unwrap();
        assert_eq!(role, Role::Leader, "B14: no caching; a new flight starts");
        assert_eq!(h.resumer.calls(&a), 2);
    }

    #[test]
    fn b58_flights_beyond_the_cap_are_refused_while_joiners_still_join() {
        let h = harness(1000, 100, true);
        let actors: Vec<ActorId> = (0..3).map(|i| actor(&format!("a{i}"))).collect();
        for a in &actors {
            assert_eq!(h.table.join(a, Band::Standard).unwrap().1, Role::Leader);
        }
        assert_eq!(h.table.len(), 3);
        assert!(matches!(h.table.join(&actor("fourth"), Band::Standard), Err(FlightRefusal::TableFull)));
        assert_eq!(h.resumer.calls(&actor("fourth")), 0, "no ResumeActor call beyond the cap");
        assert_eq!(
            h.table.join(&actors[0], Band::Standard).unwrap().1,
            Role::Joiner,
            "an existing flight is still joined"
        );
        h.resumer.answer(&actors[1], err(Code::NotFound, "gone"));
        assert_eq!(h.table.len(), 2);
        assert_eq!(
            h.table.join(&actor("fourth"), Band::Standard).unwrap().1,
            Role::Leader,
            "room again once one ends"
        );
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
                    (0..50)
                        .filter(|i| table.join(&actor(&format!("t{t}-{i}")), Band::Standard).is_ok())
                        .count()
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
        let (flight, _) = h.table.join(&a, Band::Standard).unwrap();
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
        let (flight, _) = h.table.join(&a, Band::Standard).unwrap();
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
        let (flight, _) = h.table.join(&a, Band::Standard).unwrap();
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
        let (flight, _) = h.table.join(&a, Band::Standard).unwrap();
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
        let (flight, _) = h.table.join(&a, Band::Standard).unwrap();
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
        let (flight, _) = h.table.join(&a, Band::Standard).unwrap();
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
        let (flight, _) = h.table.join(&a, Band::Standard).unwrap();
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
        let (flight, _) = h.table.join(&a, Band::Standard).unwrap();
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
        let (fa, _) = h.table.join(&a, Band::Standard).unwrap();
        h.resumer.answer(&a, err(Code::ResourceExhausted, "full"));
        assert_eq!(
            *fa.outcome().unwrap(),
            FlightOutcome::Failed(ResumeError::new(Code::ResourceExhausted, "full"))
        );
        assert_eq!(h.resumer.calls(&a), 1, "B22: exactly one attempt");
        let (fb, _) = h.table.join(&b, Band::Standard).unwrap();
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
        let (flight, _) = h.table.join(&a, Band::Standard).unwrap();
        h.resumer.answer(&a, err(Code::ResourceExhausted, "full"));
        h.scheduler.advance(Duration::from_millis(100));
        h.resumer.answer(&a, err(Code::ResourceExhausted, "full"));
        h.scheduler.advance(Duration::from_millis(150));
        let (joined, role) = h.table.join(&a, Band::Standard).unwrap();
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
        let _caller_a = h.table.join(&a, Band::Standard).unwrap();
        h.scheduler.advance(ms(30));
        let _caller_b = h.table.join(&b, Band::Standard).unwrap();
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
        let (flight, _) = h.table.join(&a, Band::Standard).unwrap();
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
        let (leader, _) = h.table.join(&a, Band::Standard).unwrap();
        let flight = Arc::clone(&leader);
        drop(leader);
        assert_eq!(h.table.len(), 1, "the running attempt is awaited (B15)");
        h.resumer.answer(&a, err(Code::ResourceExhausted, "full"));
        assert!(h.table.is_empty() && abandoned(&flight), "a retryable answer for nobody ends it");
        h.scheduler.advance(Duration::from_millis(1000));
        assert_eq!(h.resumer.calls(&a), 1, "no new attempt");
        assert_eq!(h.abandoned.get(), 1);
        let (_next, role) = h.table.join(&a, Band::Standard).unwrap();
        assert_eq!(role, Role::Leader, "the next request starts afresh");
        assert_eq!(h.resumer.calls(&a), 2);
    }

    #[test]
    fn b78_the_running_attempt_still_serves_whoever_joins_it() {
        let h = harness(1000, 100, true);
        let a = actor("a");
        drop(h.table.join(&a, Band::Standard).unwrap());
        let (joiner, role) = h.table.join(&a, Band::Standard).unwrap();
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
        let (first, _) = h.table.join(&a, Band::Standard).unwrap();
        let (second, _) = h.table.join(&a, Band::Standard).unwrap();
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
                        let (caller, _) = table.join(&a, Band::Standard).unwrap();
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
        let callers: Vec<Caller> =
            greedy.iter().map(|a| h.table.join(a, Band::Standard).unwrap().0).collect();
        let third = ActorId::parse("greedy/a2").unwrap();
        assert!(matches!(h.table.join(&third, Band::Standard), Err(FlightRefusal::AtespaceFull)));
        assert_eq!(h.resumer.calls(&third), 0, "no ResumeActor call beyond the share");
        assert_eq!(
            h.table.join(&greedy[0], Band::Standard).unwrap().1,
            Role::Joiner,
            "an existing flight is still joined"
        );
        let other = ActorId::parse("other/x").unwrap();
        assert_eq!(
            h.table.join(&other, Band::Standard).unwrap().1,
            Role::Leader,
            "another atespace is untouched"
        );
        h.resumer.answer(&greedy[1], ok(false));
        assert_eq!(
            h.table.join(&third, Band::Standard).unwrap().1,
            Role::Leader,
            "the share is given back as a flight ends"
        );
        drop(callers);
    }

    #[test]
    fn b79_the_share_is_checked_before_the_table_and_neither_leaks() {
        // Table 3, share 2: two atespaces fill the table between them.
        let h = harness_with_share(1000, 100, true, SharePolicy::capped(2, 3));
        let parse = |r: &str| ActorId::parse(r).unwrap();
        let held: Vec<Caller> = ["x/a", "x/b", "y/a"]
            .iter()
            .map(|r| h.table.join(&parse(r), Band::Standard).unwrap().0)
            .collect();
        assert!(
            matches!(h.table.join(&parse("x/c"), Band::Standard), Err(FlightRefusal::AtespaceFull)),
            "both: the share says so"
        );
        assert!(matches!(h.table.join(&parse("y/b"), Band::Standard), Err(FlightRefusal::TableFull)));
        assert!(matches!(h.table.join(&parse("z/a"), Band::Standard), Err(FlightRefusal::TableFull)));
        for r in ["x/a", "x/b", "y/a"] {
            h.resumer.answer(&parse(r), ok(false));
        }
        drop(held);
        let again: Vec<Caller> = ["y/b", "y/c", "z/a"]
            .iter()
            .map(|r| h.table.join(&parse(r), Band::Standard).unwrap().0)
            .collect();
        assert_eq!(h.table.len(), 3, "every refusal gave its share back");
        drop(again);
    }

    #[test]
    fn b79_by_default_an_atespace_alone_has_all_but_an_eighth_of_the_table() {
        // Table 8: half is 4, an eighth 1.
        let h = harness_with_share(1000, 100, true, SharePolicy::work_conserving(8));
        let parse = |r: &str| ActorId::parse(r).unwrap();
        let greedy: Vec<Caller> =
            (0..7).map(|i| h.table.join(&parse(&format!("x/a{i}")), Band::Standard).unwrap().0).collect();
        assert!(
            matches!(h.table.join(&parse("x/more"), Band::Standard), Err(FlightRefusal::AtespaceFull)),
            "the last one"
        );
        let other = h.table.join(&parse("y/a"), Band::Standard).unwrap().0;
        assert!(
            matches!(h.table.join(&parse("y/b"), Band::Standard), Err(FlightRefusal::TableFull)),
            "the table is full"
        );
        // A flight of the flood ends: its place goes to the other tenant,
        // never back to the flood while only the eighth is free.
        h.resumer.answer(&parse("x/a0"), ok(false));
        assert!(matches!(h.table.join(&parse("x/more"), Band::Standard), Err(FlightRefusal::AtespaceFull)));
        assert_eq!(h.table.join(&parse("y/b"), Band::Standard).unwrap().1, Role::Leader);
        assert_eq!(h.table.len(), 8);
        drop((greedy, other));
    }

    /// Flights for `names` (`atespace/actor`), joined `gap_ms` apart, each
    /// first resumed on pool `pool` and then answered full, so that all of
    /// them wait in the pool's group; their callers are returned.
    fn saturated(h: &Harness, names: &[&str], pool: &str, gap_ms: u64) -> Vec<Caller> {
        let parse = |r: &str| ActorId::parse(r).unwrap();
        for name in names {
            let _first = h.table.join(&parse(name), Band::Standard).unwrap();
            h.resumer
                .answer(&parse(name), Ok(Resumed::from_pod_ips(true, &["10.0.0.7".into()]).on_pool(pool)));
        }
        names
            .iter()
            .map(|name| {
                let (caller, _) = h.table.join(&parse(name), Band::Standard).unwrap();
                h.resumer.answer(&parse(name), err(Code::ResourceExhausted, "no free workers"));
                h.scheduler.advance(Duration::from_millis(gap_ms));
                caller
            })
            .collect()
    }

    /// As [`saturated`] with no gap, the pool taking `refusal_ms` to
    /// refuse each first attempt: its group's patience for a probe is four
    /// times that (B129). The clock then stands at the refusals.
    fn saturated_refusing_in(h: &Harness, names: &[&str], pool: &str, refusal_ms: u64) -> Vec<Caller> {
        for name in names {
            first_attempt_answered(h, name.trim_start_matches("demo/"), freed(pool));
        }
        let callers: Vec<Caller> = names
            .iter()
            .map(|name| h.table.join(&ActorId::parse(name).unwrap(), Band::Standard).unwrap().0)
            .collect();
        h.scheduler.advance(Duration::from_millis(refusal_ms));
        for name in names {
            h.resumer.answer(&ActorId::parse(name).unwrap(), full());
        }
        callers
    }

    /// a's probe, just sent, holds the group for `patience_ms`: then b goes.
    fn a_holds_the_group_for(h: &Harness, patience_ms: u64) {
        assert_eq!(pending(h), ["demo/a"]);
        h.scheduler.advance(Duration::from_millis(patience_ms - 1));
        assert_eq!(pending(h), ["demo/a"], "within the patience");
        h.scheduler.advance(Duration::from_millis(1));
        assert_eq!(pending(h), ["demo/a", "demo/b"]);
    }

    /// a, b and c wait on pool p, refused at once (a patience of 25 ms):
    /// a's probe is presumed a resume, b goes, and b's refusal, 50 ms ago,
    /// says the pool is full again, so nothing more goes.
    fn a_presumed_then_b_refused(h: &Harness) -> Vec<Caller> {
        let callers = saturated(h, &["demo/a", "demo/b", "demo/c"], "p", 0);
        h.scheduler.advance(Duration::from_millis(100));
        a_holds_the_group_for(h, 25);
        h.resumer.answer(&actor("b"), full());
        h.scheduler.advance(Duration::from_millis(50));
        assert_eq!(pending(h), ["demo/a"]);
        callers
    }

    fn full() -> AttemptResult {
        err(Code::ResourceExhausted, "no free workers")
    }

    fn freed(pool: &str) -> AttemptResult {
        Ok(Resumed::from_pod_ips(true, &["10.0.0.7".into()]).on_pool(pool))
    }

    /// A first attempt of actor `name`, answered `result` at once: an
    /// attempt that is no group's probe.
    fn first_attempt_answered(h: &Harness, name: &str, result: AttemptResult) {
        let actor = actor(name);
        drop(h.table.join(&actor, Band::Standard).unwrap());
        h.resumer.answer(&actor, result);
    }

    fn pending(h: &Harness) -> Vec<String> {
        h.resumer.pending_actors().iter().map(|a| a.to_string()).collect()
    }

    /// Nothing is sent for `ms - 1` ms, then `actor` alone is (`why` says
    /// why not sooner).
    fn sent_after(h: &Harness, ms: u64, actor: &str, why: &str) {
        h.scheduler.advance(Duration::from_millis(ms - 1));
        assert!(pending(h).is_empty(), "{actor} sent before {ms} ms: {why}");
        h.scheduler.advance(Duration::from_millis(1));
        assert_eq!(pending(h), [actor], "{actor} due at {ms} ms");
    }

    #[test]
    fn b111_a_group_sends_the_flight_whose_budget_ends_first() {
        let h = grouped_harness(10_000, 100);
        let names = ["demo/a0", "demo/a1", "demo/a2", "demo/a3"];
        let _callers = saturated(&h, &names, "p", 10);
        assert_eq!(h.resumer.running(), 0, "all four wait in the group");
        assert_eq!(h.table.groups()[0].waiting, 4);
        // One interval after the first refusal, 40 ms ago.
        h.scheduler.advance(Duration::from_millis(60));
        assert_eq!(pending(&h), ["demo/a0"], "the oldest first");
        h.resumer.answer(&ActorId::parse("demo/a0").unwrap(), full());
        h.scheduler.advance(Duration::from_millis(200));
        assert_eq!(pending(&h), ["demo/a0"], "its budget still ends first");
        h.resumer.answer(&ActorId::parse("demo/a0").unwrap(), freed("p"));
        assert_eq!(pending(&h), ["demo/a1"]);
        h.resumer.answer(&ActorId::parse("demo/a1").unwrap(), freed("p"));
        assert_eq!(pending(&h), ["demo/a2"]);
    }

    #[test]
    fn b120_a_group_sends_the_highest_band_first_and_re_ranks_on_join_and_leave() {
        let h = grouped_harness(10_000, 100);
        let _callers = saturated(&h, &["demo/a", "demo/b", "demo/c"], "p", 10);
        let (critical, _) = h.table.join(&actor("c"), Band::Critical).unwrap();
        let (sheddable, _) = h.table.join(&actor("a"), Band::Sheddable).unwrap();
        drop(sheddable);
        h.scheduler.advance(Duration::from_millis(70));
        assert_eq!(pending(&h), ["demo/c"], "a critical joiner lifts the youngest flight");
        h.resumer.answer(&actor("c"), full());
        drop(critical);
        h.scheduler.advance(Duration::from_millis(200));
        assert_eq!(pending(&h), ["demo/a"], "its band back to standard: the budget decides");
        h.resumer.answer(&actor("a"), freed("p"));
        assert_eq!(pending(&h), ["demo/b"]);
        h.resumer.answer(&actor("b"), freed("p"));
        assert_eq!(pending(&h), ["demo/c"]);
    }

    #[test]
    fn b113_a_flight_whose_turn_comes_after_its_budget_ends_exhausted() {
        let h = grouped_harness(1_000, 100);
        let callers = saturated(&h, &["demo/a", "demo/b"], "p", 0);
        h.scheduler.advance(Duration::from_millis(100));
        assert_eq!(pending(&h), ["demo/a"]);
        // The timer thread runs late: b's budget is over and its deadline
        // check has not run when a's probe frees a worker.
        h.clock.advance(Duration::from_secs(1));
        h.resumer.answer(&actor("a"), freed("p"));
        assert!(h.resumer.pending_actors().is_empty(), "no call past the budget");
        assert!(matches!(callers[1].outcome().as_deref(), Some(FlightOutcome::BudgetExhausted(_))));
        h.scheduler.advance(Duration::from_secs(1));
        assert!(h.table.is_empty() && h.table.groups().is_empty());
    }

    #[test]
    fn b111_atespaces_take_turns_in_a_group() {
        let h = grouped_harness(10_000, 100);
        let names = ["x/a", "x/b", "x/c", "y/a", "y/b"];
        let _callers = saturated(&h, &names, "p", 10);
        assert_eq!(h.table.groups().len(), 1, "one pool, one group");
        h.scheduler.advance(Duration::from_millis(100));
        let mut order = Vec::new();
        while let Some(next) = h.resumer.pending_actors().first().cloned() {
            order.push(next.to_string());
            h.resumer.answer(&next, freed("p"));
        }
        assert_eq!(order, ["x/a", "y/a", "x/b", "y/b", "x/c"]);
    }

    #[test]
    fn b110_a_group_has_one_attempt_open_while_its_answers_are_retryable() {
        let h = grouped_harness(60_000, 100);
        let _callers = saturated(&h, &["demo/a", "demo/b", "demo/c"], "p", 0);
        let d = actor("d");
        drop(h.table.join(&d, Band::Standard).unwrap());
        h.resumer.answer(&d, freed("p"));
        h.scheduler.advance(Duration::from_millis(100));
        assert_eq!(pending(&h), ["demo/a"]);
        // d's next flight: its first attempt goes out at once, and its answer
        // joins the group without sending another flight while a's is open.
        let _d = h.table.join(&d, Band::Standard).unwrap();
        h.resumer.answer(&d, full());
        h.scheduler.advance(Duration::from_millis(20));
        assert_eq!(pending(&h), ["demo/a"], "one attempt open (within its patience, B129)");
        h.resumer.answer(&actor("a"), full());
        let mut calls = 0;
        for _ in 0..50 {
            h.scheduler.advance(Duration::from_millis(100));
            assert!(h.resumer.running() <= 1, "at most one attempt open");
            if let Some(probe) = h.resumer.pending_actors().first().cloned() {
                calls += 1;
                h.resumer.answer(&probe, full());
            }
        }
        // The delay after a's answer is 200 ms, then 400 ms (the cap, B110)
        // for good: 13 probes in the next 5 s.
        assert_eq!(calls, 13);
        let group = &h.table.groups()[0];
        assert_eq!((group.waiting, group.last_answer), (4, Code::ResourceExhausted));
    }

    #[test]
    fn b110_a_success_sends_the_groups_next_flight_at_once() {
        let h = grouped_harness(60_000, 100);
        let _callers = saturated(&h, &["demo/a", "demo/b"], "p", 0);
        h.scheduler.advance(Duration::from_millis(100));
        assert_eq!(pending(&h), ["demo/a"]);
        h.resumer.answer(&ActorId::parse("demo/a").unwrap(), freed("p"));
        assert_eq!(pending(&h), ["demo/b"], "without waiting for a timer");
        assert_eq!(h.table.groups()[0].waiting, 0);
        h.resumer.answer(&ActorId::parse("demo/b").unwrap(), freed("p"));
        assert!(h.table.groups().is_empty() && h.table.is_empty());
        assert_eq!(h.scheduler.pending(), 0, "no timer left behind");
    }

    #[test]
    fn b128_a_resume_outside_the_probe_brings_the_groups_next_flight_in() {
        let h = grouped_harness(60_000, 100);
        let _callers = saturated(&h, &["demo/a", "demo/b"], "p", 0);
        // Refused until the group's delay is at its cap: 200 ms, then 400 ms.
        h.scheduler.advance(Duration::from_millis(100));
        h.resumer.answer(&actor("a"), full());
        h.scheduler.advance(Duration::from_millis(200));
        h.resumer.answer(&actor("a"), full());
        h.scheduler.advance(Duration::from_millis(100));
        // An actor already running takes no worker: nothing moves.
        let running = Ok(Resumed::from_pod_ips(false, &["10.0.0.7".into()]).on_pool("p"));
        first_attempt_answered(&h, "running", running);
        h.scheduler.advance(Duration::from_millis(100));
        assert!(pending(&h).is_empty(), "still on the capped delay");
        // A first attempt's resume on the pool took a worker that freed:
        // the group's next flight goes one interval later, not 200 ms later.
        first_attempt_answered(&h, "fresh", freed("p"));
        sent_after(&h, 100, "demo/a", "one interval, not at once");
        // The delays started again: its refusal waits the second, 200 ms.
        h.resumer.answer(&actor("a"), full());
        sent_after(&h, 200, "demo/a", "the second delay");
        // A resume on another pool is no worker of this one.
        h.resumer.answer(&actor("a"), full());
        first_attempt_answered(&h, "elsewhere", freed("q"));
        sent_after(&h, 400, "demo/a", "the pool's own delay, 400 ms");
    }

    #[test]
    fn b128_a_resume_while_the_probe_is_open_restarts_the_delay_for_its_answer() {
        let h = grouped_harness(60_000, 100);
        let _callers = saturated(&h, &["demo/a"], "p", 0);
        h.scheduler.advance(Duration::from_millis(100));
        assert_eq!(pending(&h), ["demo/a"], "the probe; nothing else waits");
        first_attempt_answered(&h, "fresh", freed("p"));
        // The refusal's delay is one interval, not the second (200 ms).
        h.resumer.answer(&actor("a"), full());
        sent_after(&h, 100, "demo/a", "one interval after its refusal");
    }

    #[test]
    fn b129_a_probe_slower_than_its_pools_refusals_is_presumed_a_resume() {
        let h = grouped_harness(60_000, 100);
        let _callers = a_presumed_then_b_refused(&h);
        // a's late success of an actor already running took no worker:
        // nothing moves.
        h.resumer.answer(&actor("a"), Ok(Resumed::from_pod_ips(false, &["10.0.0.7".into()]).on_pool("p")));
        h.scheduler.advance(Duration::from_millis(100));
        assert!(pending(&h).is_empty(), "b still due 200 ms after its refusal");
        h.scheduler.advance(Duration::from_millis(50));
        assert_eq!(pending(&h), ["demo/b"]);
    }

    #[test]
    fn b129_a_presumed_resumes_late_success_brings_the_next_flight_in() {
        let h = grouped_harness(60_000, 100);
        let _callers = a_presumed_then_b_refused(&h);
        // a's late success is no news (b went when a was presumed): the
        // delay starts again, and b, due 200 ms after its refusal, goes one
        // interval after it instead.
        h.resumer.answer(&actor("a"), freed("p"));
        sent_after(&h, 100, "demo/b", "not at once");
    }

    #[test]
    fn b129_an_answer_from_the_pool_ends_the_doubling() {
        let h = grouped_harness(60_000, 100);
        let _callers = saturated(&h, &["demo/a", "demo/b", "demo/c", "demo/d"], "p", 0);
        h.scheduler.advance(Duration::from_millis(125));
        assert_eq!(pending(&h), ["demo/a", "demo/b"], "a presumed after 25 ms");
        // Unheard, b's patience is doubled...
        h.scheduler.advance(Duration::from_millis(49));
        assert_eq!(pending(&h), ["demo/a", "demo/b"]);
        h.scheduler.advance(Duration::from_millis(1));
        assert_eq!(pending(&h), ["demo/a", "demo/b", "demo/c"]);
        // ...but a quick refusal says the pool answers: c's successor waits
        // the pool's own patience again, 25 ms.
        h.resumer.answer(&actor("c"), full());
        h.scheduler.advance(Duration::from_millis(200));
        assert_eq!(pending(&h), ["demo/a", "demo/b", "demo/c"], "c again, one delay on");
        h.scheduler.advance(Duration::from_millis(25));
        assert_eq!(pending(&h), ["demo/a", "demo/b", "demo/c", "demo/d"]);
    }

    #[test]
    fn b129_a_pool_whose_ateapi_stops_answering_is_asked_ever_less_often() {
        let h = grouped_harness(60_000, 100);
        let names: Vec<String> = (0..9).map(|i| format!("demo/w{i}")).collect();
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        let _callers = saturated(&h, &names, "p", 0);
        // No probe answers: each one presumed a resume doubles the patience
        // for the next, up to the longest delay.
        let mut sent_at = Vec::new();
        for ms in 1..=1300 {
            h.scheduler.advance(Duration::from_millis(1));
            if h.resumer.running() > sent_at.len() {
                sent_at.push(ms);
            }
        }
        assert_eq!(sent_at, [100, 125, 175, 275, 475, 875, 1275]);
        // Their refusals come at last, slow: the patience is the longest
        // delay, and the next probe, a delay (the second) on, holds the
        // group for it.
        for name in &names[..7] {
            h.resumer.answer(&ActorId::parse(name).unwrap(), full());
        }
        h.scheduler.advance(Duration::from_millis(199));
        assert_eq!(h.resumer.running(), 0);
        h.scheduler.advance(Duration::from_millis(1));
        assert_eq!(h.resumer.running(), 1, "the next probe");
        h.scheduler.advance(Duration::from_millis(399));
        assert_eq!(h.resumer.running(), 1, "held for 400 ms");
        h.scheduler.advance(Duration::from_millis(1));
        assert_eq!(h.resumer.running(), 2);
    }

    #[test]
    fn b110_a_late_answer_of_a_forgotten_groups_probe_leaves_a_new_groups_probe_open() {
        let h = grouped_harness(60_000, 100);
        let _a = saturated(&h, &["demo/a"], "p", 0);
        h.scheduler.advance(Duration::from_millis(100));
        // a's probe presumed a resume (B129): the group, nothing waiting,
        // is forgotten.
        h.scheduler.advance(Duration::from_millis(25));
        assert!(h.table.groups().is_empty());
        // A new group of the same pool, and its probe, held 400 ms by a
        // pool that refuses in 100 ms (B129).
        let _c = saturated_refusing_in(&h, &["demo/c"], "p", 100);
        h.scheduler.advance(Duration::from_millis(100));
        assert_eq!(pending(&h), ["demo/a", "demo/c"]);
        // a's late refusal is no answer of c's probe: a waits behind it.
        h.resumer.answer(&actor("a"), full());
        h.scheduler.advance(Duration::from_millis(300));
        assert_eq!(pending(&h), ["demo/c"], "one probe open");
    }

    #[test]
    fn b110_a_first_attempt_never_waits_for_a_group() {
        let h = grouped_harness(60_000, 100);
        let _callers = saturated(&h, &["demo/a", "demo/b"], "p", 0);
        h.scheduler.advance(Duration::from_millis(100));
        assert_eq!(h.resumer.running(), 1, "the group's probe");
        let _fresh = h.table.join(&actor("fresh"), Band::Standard).unwrap();
        let _pool_member = h.table.join(&actor("c"), Band::Standard).unwrap();
        assert_eq!(pending(&h), ["demo/a", "demo/fresh", "demo/c"], "both sent at once");
        h.resumer.answer(&actor("c"), full());
        assert_eq!(h.resumer.running(), 2, "a first attempt's answer sends nothing more");
    }

    #[test]
    fn b109_failed_precondition_and_aborted_retry_alone() {
        let h = grouped_harness(60_000, 100);
        let _callers = saturated(&h, &["demo/a", "demo/b"], "p", 0);
        h.scheduler.advance(Duration::from_millis(100));
        h.resumer.answer(&actor("a"), full());
        let (_c, _) = h.table.join(&actor("c"), Band::Standard).unwrap();
        let (_d, _) = h.table.join(&actor("d"), Band::Standard).unwrap();
        h.resumer.answer(&actor("c"), err(Code::FailedPrecondition, "suspending"));
        h.resumer.answer(&actor("d"), err(Code::Aborted, "conflict"));
        assert_eq!(
            h.table.groups().iter().map(|g| g.waiting).sum::<usize>(),
            2,
            "only a and b wait in a group"
        );
        h.scheduler.advance(Duration::from_millis(100));
        assert_eq!(pending(&h), ["demo/c", "demo/d"], "each on its own schedule (B17)");
    }

    #[test]
    fn b109_unavailable_flights_share_the_control_planes_group() {
        let h = grouped_harness(60_000, 100);
        let callers: Vec<Caller> = ["x/a", "y/b"]
            .iter()
            .map(|r| {
                let a = ActorId::parse(r).unwrap();
                let caller = h.table.join(&a, Band::Standard).unwrap().0;
                h.resumer.answer(&a, err(Code::Unavailable, "down"));
                caller
            })
            .collect();
        let groups = h.table.groups();
        assert_eq!((groups.len(), groups[0].key.as_str(), groups[0].waiting), (1, "control-plane", 2));
        h.scheduler.advance(Duration::from_millis(100));
        assert_eq!(pending(&h), ["x/a"]);
        drop(callers);
    }

    /// One caller each on flights whose first answer was Unavailable: they
    /// wait in the control plane's group, whose probe holds it however long
    /// it runs.
    fn unavailable(h: &Harness, names: &[&str]) -> Vec<Caller> {
        names
            .iter()
            .map(|name| {
                let a = ActorId::parse(name).unwrap();
                let caller = h.table.join(&a, Band::Standard).unwrap().0;
                h.resumer.answer(&a, err(Code::Unavailable, "down"));
                caller
            })
            .collect()
    }

    #[test]
    fn b113_a_flight_waiting_in_its_group_ends_at_its_budget_without_a_call() {
        let h = grouped_harness(1_000, 100);
        let callers = unavailable(&h, &["demo/a", "demo/b", "demo/c"]);
        h.scheduler.advance(Duration::from_millis(100));
        assert_eq!(pending(&h), ["demo/a"], "a's attempt hangs");
        let calls = |name: &str| h.resumer.calls(&actor(name));
        let before = (calls("b"), calls("c"));
        h.scheduler.advance(Duration::from_millis(900));
        for caller in &callers[1..] {
            assert!(matches!(
                *caller.outcome().expect("ended at the budget"),
                FlightOutcome::BudgetExhausted(_)
            ));
        }
        assert_eq!((calls("b"), calls("c")), before, "no call at the budget");
        assert!(caller_in_overtime(&callers[0]), "the running probe is awaited (B19)");
        assert_eq!(h.table.groups()[0].waiting, 0);
        h.resumer.answer(&actor("a"), freed("p"));
        assert!(h.table.groups().is_empty() && h.table.is_empty());
    }

    #[test]
    fn b110_a_probe_unanswered_for_the_delay_no_longer_holds_its_pools_group() {
        let h = grouped_harness(60_000, 100);
        // A pool that takes 100 ms to refuse: the patience is at its most.
        let _callers = saturated_refusing_in(&h, &["demo/a", "demo/b", "demo/c"], "p", 100);
        h.scheduler.advance(Duration::from_millis(100));
        // a's resume is under way (no refusal takes that long): four
        // intervals (the longest delay) later the group sends b.
        a_holds_the_group_for(&h, 400);
        // b's refusal closes b's probe and puts b back first in line; a's
        // late success is a worker freed: the delay starts again, and b
        // goes one interval later (B129: b went when a was presumed).
        h.resumer.answer(&actor("b"), full());
        assert_eq!(pending(&h), ["demo/a"]);
        h.resumer.answer(&actor("a"), freed("p"));
        sent_after(&h, 100, "demo/b", "not at once");
        assert_eq!(h.table.groups()[0].waiting, 1, "c still waits");
    }

    #[test]
    fn b127_a_fleet_routers_group_probes_at_the_fleets_pace() {
        let h = fleet_harness(60_000, 100, 3);
        // Refusals slow enough (300 ms) for the patience to be at its most.
        let _callers = saturated_refusing_in(&h, &["demo/a", "demo/b", "demo/c"], "p", 300);
        // One router's group would send a at 100 ms; a third of a fleet of
        // three waits three intervals.
        sent_after(&h, 300, "demo/a", "paced by the fleet");
        // Its patience for an open probe is paced too: 4 x 300 ms.
        h.scheduler.advance(Duration::from_millis(1_199));
        assert_eq!(pending(&h), ["demo/a"], "held for the fleet's longest delay");
        h.scheduler.advance(Duration::from_millis(1));
        assert_eq!(pending(&h), ["demo/a", "demo/b"]);
        h.resumer.answer(&actor("a"), full());
        h.resumer.answer(&actor("b"), full());
        let mut probes = 0;
        for _ in 0..50 {
            h.scheduler.advance(Duration::from_millis(100));
            if let Some(probe) = h.resumer.pending_actors().first().cloned() {
                probes += 1;
                h.resumer.answer(&probe, full());
            }
        }
        // 600 ms after the answers, then 1,200 ms (the cap, 4 x 300 ms) for
        // good: 4 probes in 5 s where one router's group makes 13 (B110).
        assert_eq!(probes, 4);
        // A freed worker restarts the delays from the fleet's interval; the
        // next flight goes then, not at once: the fleet's other groups are
        // probing the pool too.
        h.scheduler.advance(Duration::from_millis(1_200));
        let probe = pending(&h);
        assert_eq!(probe.len(), 1);
        h.resumer.answer(&ActorId::parse(&probe[0]).unwrap(), freed("p"));
        assert!(pending(&h).is_empty(), "no follow-up at once in a fleet");
        h.scheduler.advance(Duration::from_millis(299));
        assert!(pending(&h).is_empty());
        h.scheduler.advance(Duration::from_millis(1));
        assert_eq!(pending(&h).len(), 1, "a fleet's interval later");
    }

    #[test]
    fn b127_a_fleet_paces_neither_first_attempts_nor_a_flights_own_retries() {
        let h = fleet_harness(60_000, 100, 3);
        let _callers = saturated(&h, &["demo/a"], "p", 0);
        let (_c, _) = h.table.join(&actor("c"), Band::Standard).unwrap();
        assert_eq!(pending(&h), ["demo/c"], "a first attempt goes out at once");
        h.resumer.answer(&actor("c"), err(Code::FailedPrecondition, "suspending"));
        h.scheduler.advance(Duration::from_millis(100));
        assert_eq!(pending(&h), ["demo/c"], "its own schedule, one interval (B17)");
    }

    #[test]
    fn b110_the_control_planes_group_waits_for_its_probe_however_long() {
        let h = grouped_harness(60_000, 100);
        let _callers = unavailable(&h, &["x/a", "y/b"]);
        h.scheduler.advance(Duration::from_secs(10));
        assert_eq!(pending(&h), ["x/a"], "one attempt open");
        h.resumer.answer(&ActorId::parse("x/a").unwrap(), err(Code::Unavailable, "down"));
        h.scheduler.advance(Duration::from_millis(200));
        assert_eq!(pending(&h), ["y/b"], "then the other atespace's turn");
    }

    /// The control plane's group after two Unavailable probes, at 100 and
    /// 300 ms: its delay at the cap, its next flight (`x/a`) due at 700 ms.
    fn control_plane_down_for_a_while(h: &Harness) -> Vec<Caller> {
        let callers = unavailable(h, &["x/a", "y/b"]);
        for (probe, after_ms) in [("x/a", 100), ("y/b", 200)] {
            h.scheduler.advance(Duration::from_millis(after_ms));
            assert_eq!(pending(h), [probe]);
            h.resumer.answer(&ActorId::parse(probe).unwrap(), err(Code::Unavailable, "down"));
        }
        callers
    }

    #[test]
    fn b130_the_control_plane_answering_brings_its_groups_next_flight_in() {
        let h = grouped_harness(60_000, 100);
        let _callers = control_plane_down_for_a_while(&h);
        // Answers that say nothing of the control plane move nothing.
        h.scheduler.advance(Duration::from_millis(100));
        first_attempt_answered(&h, "still-down", err(Code::Unavailable, "down"));
        first_attempt_answered(&h, "timed-out", err(Code::DeadlineExceeded, "deadline"));
        h.scheduler.advance(Duration::from_millis(50));
        assert!(pending(&h).is_empty(), "still on the capped delay");
        // A first attempt answered by the control plane, even a refusal:
        // it is up, and the group's next flight goes one interval later,
        // at 550 ms, not at 700 ms.
        first_attempt_answered(&h, "fresh", full());
        sent_after(&h, 100, "x/a", "one interval, not at once");
        // The delays started again: its Unavailable waits the second, 200 ms.
        h.resumer.answer(&ActorId::parse("x/a").unwrap(), err(Code::Unavailable, "down"));
        sent_after(&h, 200, "y/b", "the second delay");
    }

    /// [`control_plane_down_for_a_while`], on to x/a's next probe at 700 ms.
    fn control_plane_probed_again(h: &Harness) -> Vec<Caller> {
        let callers = control_plane_down_for_a_while(h);
        h.scheduler.advance(Duration::from_millis(400));
        assert_eq!(pending(h), ["x/a"]);
        callers
    }

    #[test]
    fn b130_its_own_probe_answered_by_the_control_plane_restarts_the_delay() {
        let h = grouped_harness(60_000, 100);
        let _callers = control_plane_probed_again(&h);
        // The control plane answers the probe about its actor: the flight
        // ends, and the group's next goes one interval on, not 400 ms on.
        h.resumer.answer(&ActorId::parse("x/a").unwrap(), err(Code::NotFound, "no such actor"));
        sent_after(&h, 100, "y/b", "one interval, not the capped 400 ms");
    }

    #[test]
    fn b130_an_answer_while_the_probe_is_open_restarts_the_delay_for_its_answer() {
        let h = grouped_harness(60_000, 100);
        let _callers = control_plane_probed_again(&h);
        // Answered while x/a's probe is open: nothing more is sent, and the
        // probe's Unavailable waits one interval, not the capped 400 ms.
        first_attempt_answered(&h, "fresh", full());
        assert_eq!(pending(&h), ["x/a"], "still one attempt open");
        h.resumer.answer(&ActorId::parse("x/a").unwrap(), err(Code::Unavailable, "down"));
        sent_after(&h, 100, "y/b", "one interval after the probe's answer");
    }

    #[test]
    fn b130_in_a_fleet_the_control_planes_group_comes_back_in_n_intervals() {
        let h = fleet_harness(60_000, 100, 3);
        let _callers = unavailable(&h, &["x/a", "y/b"]);
        // Three intervals, then six: the next is due 600 ms after y/b's answer.
        for (probe, after_ms) in [("x/a", 300), ("y/b", 600)] {
            sent_after(&h, after_ms, probe, "paced by the fleet");
            h.resumer.answer(&ActorId::parse(probe).unwrap(), err(Code::Unavailable, "down"));
        }
        h.scheduler.advance(Duration::from_millis(100));
        first_attempt_answered(&h, "fresh", full());
        sent_after(&h, 300, "x/a", "three intervals, not at once nor 500 ms on");
    }

    fn caller_in_overtime(caller: &Caller) -> bool {
        matches!(caller.state.lock().phase, Phase::Overtime { .. })
    }

    #[test]
    fn b78_a_flight_left_by_its_callers_leaves_its_group() {
        let h = grouped_harness(60_000, 100);
        let mut callers = saturated(&h, &["demo/a", "demo/b"], "p", 0);
        let flight = Arc::clone(&callers[0]);
        callers.remove(0);
        assert!(abandoned(&flight));
        assert_eq!(h.table.groups()[0].waiting, 1);
        h.scheduler.advance(Duration::from_millis(100));
        assert_eq!(pending(&h), ["demo/b"], "the abandoned flight is not sent");
    }
}
