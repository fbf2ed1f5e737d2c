//! A bound on the `ResumeActor` calls open at once (B97).
//!
//! Each open call costs about 19 KiB in gRPC core, whatever the router
//! holds for it, and the heap a burst of calls leaves behind stays with the
//! process (BENCHMARKS.md, "Memory per distinct actor"). Without a bound,
//! every flight can have a call open, so a crowd of parked requests for
//! distinct actors costs three times what the same crowd costs on one
//! actor, and a control plane that stops answering collects one call per
//! flight. [`CallGate`] wraps the [`Resumer`]: at most `limit` calls are
//! open; an attempt beyond it waits, unsent, for one to end.
//!
//! A waiting attempt has reached nobody, so it is no committed attempt
//! (B15): one whose flight's budget ends first fails as Unavailable without
//! being sent (the verdict then comes at the budget, as B82's attempt
//! without a connection), and one whose flight has no caller left when its
//! turn comes is not sent (B78). Waiting attempts go highest band first
//! (B120; the band their flight had when they began to wait), and within a
//! band one atespace at a time, oldest first within each; no atespace
//! holds more than its share of the
//! calls (half by default; a cap, where B79's share of the flights is
//! work-conserving: a waiting attempt costs no refusal), so that a tenant
//! with many actors waiting, or whose resumes hang, neither delays another's
//! attempts by more than one call per turn nor holds every call.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;

use parking_lot::{Mutex, MutexGuard};
use prometheus::IntGauge;

use crate::actor::resume::{Code, ResumeError};
use crate::actor::target::ActorId;
use crate::parking::band::Band;
use crate::parking::flight::{AttemptDone, Resumer};
use crate::parking::timer::{Scheduler, TimerId};

/// Gauges of the gate, for `/metrics`.
#[derive(Clone)]
pub struct CallGauges {
    /// `atenet_router_resume_calls_open`.
    pub open: IntGauge,
    /// `atenet_router_resume_attempts_waiting`.
    pub waiting: IntGauge,
}

/// A [`Resumer`] that keeps at most `limit` attempts of the one it wraps
/// running at once.
pub struct CallGate {
    shared: Arc<Shared>,
}

struct Shared {
    inner: Arc<dyn Resumer>,
    scheduler: Arc<dyn Scheduler>,
    limit: usize,
    /// The calls one atespace may hold open.
    share: usize,
    gauges: CallGauges,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// Calls holding a [`CallPermit`], in all and by atespace.
    open: usize,
    open_by_atespace: HashMap<Arc<str>, usize>,
    /// Waiting attempts, by [`Band`] (B120).
    bands: [Turns; 3],
    waiting: usize,
    next_seq: u64,
    /// Whether a thread is sending waiting attempts; it sends until the
    /// calls are at the limit or none waits, so no other need.
    dispatching: bool,
}

/// The attempts of one band waiting for a call, in atespace turns.
#[derive(Default)]
struct Turns {
    /// Waiting attempts by atespace, by arrival. An atespace has an entry
    /// exactly while it is in `turns`: an entry left empty by an expiry
    /// stays until its turn comes, so that an expiry costs O(log n), not a
    /// scan of every waiting atespace.
    queues: HashMap<Arc<str>, BTreeMap<u64, Waiting>>,
    /// The atespaces with an entry in `queues`, whose turn is next first.
    turns: VecDeque<Arc<str>>,
    /// Entries left empty by expiries; swept in one pass when they are
    /// most of `turns`, so that their memory stays bounded while the calls
    /// stay at the limit (amortised O(1) per expiry, as the timer's heap).
    emptied: usize,
}

struct Waiting {
    actor: ActorId,
    done: AttemptDone,
    /// The flight's budget: past it the attempt is not sent.
    expiry: Option<TimerId>,
}

/// One open call's place under the limit, given back when the attempt
/// reports (or is dropped unreported).
pub struct CallPermit {
    gate: Arc<Shared>,
    atespace: Arc<str>,
}

impl Drop for CallPermit {
    fn drop(&mut self) {
        let mut state = self.gate.state.lock();
        state.close(&self.atespace);
        self.gate.dispatch(state);
    }
}

impl CallGate {
    /// Wraps `inner` so that at most `limit` (at least 1) of its attempts
    /// run at once, `share` of them (at least 1) for one atespace;
    /// `scheduler` ends waits at their flights' budgets.
    pub fn new(
        inner: Arc<dyn Resumer>,
        limit: usize,
        share: usize,
        scheduler: Arc<dyn Scheduler>,
        gauges: CallGauges,
    ) -> CallGate {
        let (limit, share) = (limit.max(1), share.clamp(1, limit.max(1)));
        let shared = Shared { inner, scheduler, limit, share, gauges, state: Mutex::new(State::default()) };
        CallGate { shared: Arc::new(shared) }
    }
}

impl Resumer for CallGate {
    fn start(&self, actor: &ActorId, done: AttemptDone) {
        let shared = &self.shared;
        let atespace: Arc<str> = Arc::from(actor.atespace());
        let mut state = shared.state.lock();
        if !state.dispatching && state.waiting == 0 && state.can_open(&atespace, shared) {
            state.open(&atespace);
            shared.gauges.open.set(state.open as i64);
            drop(state);
            return shared.send(actor, done, atespace);
        }
        let seq = state.next_seq;
        state.next_seq += 1;
        let deadline = done.budget_deadline();
        let band = done.band();
        let turns = &mut state.bands[band as usize];
        if !turns.queues.contains_key(&atespace) {
            turns.turns.push_back(Arc::clone(&atespace));
        }
        let queue = turns.queues.entry(Arc::clone(&atespace)).or_default();
        queue.insert(seq, Waiting { actor: actor.clone(), done, expiry: None });
        state.waiting += 1;
        shared.gauges.waiting.set(state.waiting as i64);
        drop(state);
        // Scheduled with the gate unlocked: the timer may run the task at
        // once (it is due), and the task takes the gate's lock.
        let gate = Arc::clone(shared);
        let key = Arc::clone(&atespace);
        let timer = shared.scheduler.schedule(deadline, Box::new(move || gate.expire(band, &key, seq)));
        let mut state = shared.state.lock();
        match state.bands[band as usize].queues.get_mut(&atespace).and_then(|q| q.get_mut(&seq)) {
            Some(waiting) => waiting.expiry = Some(timer),
            // Sent or expired already: the task has nothing left to do.
            None => shared.scheduler.cancel(timer),
        }
        shared.dispatch(state);
    }
}

impl Shared {
    fn send(self: &Arc<Self>, actor: &ActorId, done: AttemptDone, atespace: Arc<str>) {
        self.inner.start(actor, done.holding(CallPermit { gate: Arc::clone(self), atespace }));
    }

    /// Sends waiting attempts while calls are under the limit, unless
    /// another thread already does. The lock is released around each send,
    /// since an attempt may report (and give its permit back) inside it.
    fn dispatch<'a>(self: &'a Arc<Self>, mut state: MutexGuard<'a, State>) {
        if state.dispatching {
            return self.gauges.open.set(state.open as i64);
        }
        state.dispatching = true;
        while state.open < self.limit {
            let Some((atespace, waiting)) = state.next(self) else { break };
            self.gauges.waiting.set(state.waiting as i64);
            let wanted = waiting.done.has_callers();
            if wanted {
                state.open(&atespace);
            }
            self.gauges.open.set(state.open as i64);
            drop(state);
            if let Some(timer) = waiting.expiry {
                self.scheduler.cancel(timer);
            }
            if wanted {
                self.send(&waiting.actor, waiting.done, atespace);
            } else {
                // Nobody would read the answer: the flight ends (B78).
                let message = "not sent: no request waits for it any more";
                waiting.done.complete(Err(ResumeError::new(Code::Unavailable, message)));
            }
            state = self.state.lock();
        }
        state.dispatching = false;
        self.gauges.open.set(state.open as i64);
    }

    /// The flight's budget ended while its attempt waited: it fails unsent,
    /// and the flight ends with its verdict (B19, B82).
    fn expire(&self, band: Band, atespace: &Arc<str>, seq: u64) {
        let waiting = {
            let mut state = self.state.lock();
            let Some(waiting) = state.bands[band as usize].remove(atespace, seq) else { return };
            state.waiting -= 1;
            self.gauges.waiting.set(state.waiting as i64);
            waiting
        };
        let message = "not sent within the budget: the router's ResumeActor calls were all in use";
        waiting.done.complete(Err(ResumeError::new(Code::Unavailable, message)));
    }
}

impl State {
    fn can_open(&self, atespace: &Arc<str>, gate: &Shared) -> bool {
        self.open < gate.limit && self.open_by_atespace.get(atespace).copied().unwrap_or(0) < gate.share
    }

    fn open(&mut self, atespace: &Arc<str>) {
        self.open += 1;
        *self.open_by_atespace.entry(Arc::clone(atespace)).or_default() += 1;
    }

    fn close(&mut self, atespace: &Arc<str>) {
        self.open -= 1;
        if let Some(n) = self.open_by_atespace.get_mut(atespace) {
            *n -= 1;
            if *n == 0 {
                self.open_by_atespace.remove(atespace);
            }
        }
    }

    /// The next attempt to send: of the highest band with one that may go
    /// (B120), the next in its atespace turns.
    fn next(&mut self, gate: &Shared) -> Option<(Arc<str>, Waiting)> {
        if self.open >= gate.limit {
            return None;
        }
        let by_atespace = &self.open_by_atespace;
        let under_share = |atespace: &Arc<str>| by_atespace.get(atespace).copied().unwrap_or(0) < gate.share;
        let found = self.bands.iter_mut().rev().find_map(|turns| turns.next(under_share))?;
        self.waiting -= 1;
        Some(found)
    }
}

impl Turns {
    /// The oldest waiting attempt of the next atespace in turn that is
    /// under its share; atespaces at their share keep their turn, and one
    /// whose attempts all expired leaves the turns here.
    fn next(&mut self, under_share: impl Fn(&Arc<str>) -> bool) -> Option<(Arc<str>, Waiting)> {
        for _ in 0..self.turns.len() {
            let atespace = self.turns.pop_front()?;
            let queue = self.queues.get_mut(&atespace).expect("an atespace in turn has an entry");
            if queue.is_empty() {
                self.queues.remove(&atespace);
                self.emptied -= 1;
                continue;
            }
            if !under_share(&atespace) {
                self.turns.push_back(atespace);
                continue;
            }
            let queue = self.queues.get_mut(&atespace).expect("an atespace in turn has an entry");
            let (_, waiting) = queue.pop_first().expect("checked not empty");
            if queue.is_empty() {
                self.queues.remove(&atespace);
            } else {
                self.turns.push_back(Arc::clone(&atespace));
            }
            return Some((atespace, waiting));
        }
        None
    }

    fn remove(&mut self, atespace: &Arc<str>, seq: u64) -> Option<Waiting> {
        let queue = self.queues.get_mut(atespace)?;
        let waiting = queue.remove(&seq)?;
        if queue.is_empty() {
            self.emptied += 1;
            if self.emptied > 1024 && self.emptied > self.turns.len() / 2 {
                let queues = &mut self.queues;
                queues.retain(|_, queue| !queue.is_empty());
                self.turns.retain(|atespace| queues.contains_key(atespace));
                self.emptied = 0;
            }
        }
        Some(waiting)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use prometheus::IntCounter;

    use super::*;
    use crate::actor::resume::AttemptResult;
    use crate::parking::backoff::BackoffPolicy;
    use crate::parking::clock::ManualClock;
    use crate::parking::flight::tests::{done, err, ok, poll, ScriptedResumer};
    use crate::parking::flight::{FlightOutcome, FlightPolicy, FlightTable, Until};
    use crate::parking::share::SharePolicy;
    use crate::parking::timer::ManualScheduler;

    struct Gated {
        clock: ManualClock,
        scheduler: ManualScheduler,
        resumer: Arc<ScriptedResumer>,
        table: FlightTable,
        gauges: CallGauges,
        abandoned: IntCounter,
        gate: Arc<Shared>,
    }

    /// A flight table whose attempts go through a gate of `limit` calls to
    /// `inner` (the scripted control plane unless given).
    fn gated(limit: usize, budget_ms: u64, inner: Option<Arc<dyn Resumer>>) -> Gated {
        gated_with_share(limit, limit, budget_ms, inner)
    }

    fn gated_with_share(
        limit: usize,
        share: usize,
        budget_ms: u64,
        inner: Option<Arc<dyn Resumer>>,
    ) -> Gated {
        let clock = ManualClock::new();
        let scheduler = ManualScheduler::new(clock.clone());
        let resumer = Arc::new(ScriptedResumer::default());
        let gauges = CallGauges {
            open: IntGauge::new("open", "open").unwrap(),
            waiting: IntGauge::new("waiting", "waiting").unwrap(),
        };
        let inner = inner.unwrap_or_else(|| Arc::clone(&resumer) as Arc<dyn Resumer>);
        let gate = CallGate::new(inner, limit, share, Arc::new(scheduler.clone()), gauges.clone());
        let shared = Arc::clone(&gate.shared);
        let abandoned = IntCounter::new("abandoned", "abandoned").unwrap();
        let policy = FlightPolicy {
            budget: Duration::from_millis(budget_ms),
            backoff: BackoffPolicy { interval: Duration::from_millis(100), factor: 2.0, jitter: 0.0 },
            parking_enabled: true,
            max_flights: 100_000,
            atespace_share: SharePolicy::capped(100_000, 100_000),
            dispatch: crate::parking::backoff::Dispatch::SaturationGroup,
            fleet_size: 1,
        };
        let table = FlightTable::new(
            policy,
            Arc::new(clock.clone()),
            Arc::new(scheduler.clone()),
            Arc::new(gate),
            abandoned.clone(),
        );
        Gated { clock, scheduler, resumer, table, gauges, abandoned, gate: shared }
    }

    fn actor(reference: &str) -> ActorId {
        ActorId::parse(reference).unwrap()
    }

    fn open_and_waiting(g: &Gated) -> (i64, i64) {
        (g.gauges.open.get(), g.gauges.waiting.get())
    }

    #[test]
    fn b97_at_most_the_limit_open_and_the_rest_sent_one_atespace_at_a_time() {
        let g = gated(2, 10_000, None);
        let greedy: Vec<ActorId> = (0..8).map(|i| actor(&format!("greedy/a{i}"))).collect();
        let polite = actor("polite/b");
        let mut callers: Vec<_> = greedy.iter().map(|a| g.table.join(a, Band::Standard).unwrap().0).collect();
        callers.push(g.table.join(&polite, Band::Standard).unwrap().0);
        assert_eq!(g.resumer.running(), 2, "two calls open, the rest wait");
        assert_eq!((g.resumer.calls(&greedy[0]), g.resumer.calls(&greedy[1])), (1, 1));
        assert_eq!(open_and_waiting(&g), (2, 7));
        // One call ends: the greedy atespace's oldest waiting attempt goes,
        // then the polite one's turn comes before the greedy one's next.
        g.resumer.answer(&greedy[0], ok(true));
        assert_eq!(g.resumer.calls(&greedy[2]), 1);
        g.resumer.answer(&greedy[1], ok(true));
        assert_eq!(g.resumer.calls(&polite), 1, "its turn, ahead of 5 older greedy attempts");
        assert_eq!(g.resumer.calls(&greedy[3]), 0);
        assert_eq!(open_and_waiting(&g), (2, 5));
        while g.resumer.running() > 0 {
            let next = g.resumer.pending_actors()[0].clone();
            g.resumer.answer(&next, ok(true));
        }
        assert!(greedy.iter().all(|a| g.resumer.calls(a) == 1), "every attempt sent once");
        assert_eq!(open_and_waiting(&g), (0, 0));
        assert!(g.table.is_empty());
        drop(callers);
    }

    #[test]
    fn b97_an_atespace_whose_calls_hang_holds_only_its_share() {
        let g = gated_with_share(4, 2, 10_000, None);
        let hanging: Vec<ActorId> = (0..6).map(|i| actor(&format!("slow/a{i}"))).collect();
        let _slow: Vec<_> = hanging.iter().map(|a| g.table.join(a, Band::Standard).unwrap().0).collect();
        assert_eq!(g.resumer.running(), 2, "its share, though 4 calls are allowed");
        assert_eq!(open_and_waiting(&g), (2, 4));
        // Another atespace's attempts go out at once, up to its own share.
        let others: Vec<ActorId> = (0..3).map(|i| actor(&format!("fast/b{i}"))).collect();
        let _fast: Vec<_> = others.iter().map(|a| g.table.join(a, Band::Standard).unwrap().0).collect();
        assert_eq!((g.resumer.calls(&others[0]), g.resumer.calls(&others[1])), (1, 1));
        assert_eq!(g.resumer.calls(&others[2]), 0);
        g.resumer.answer(&others[0], ok(true));
        assert_eq!(g.resumer.calls(&others[2]), 1, "the freed call goes to the atespace under its share");
        assert!(hanging[2..].iter().all(|a| g.resumer.calls(a) == 0), "the hanging atespace stays at 2");
        assert_eq!(open_and_waiting(&g), (4, 4));
        g.resumer.answer(&hanging[0], ok(true));
        assert_eq!(g.resumer.calls(&hanging[2]), 1, "its own next attempt takes its freed call");
        for a in [&others[1], &others[2]] {
            g.resumer.answer(a, ok(true));
        }
        assert_eq!(open_and_waiting(&g), (2, 3), "at its share, with calls free: the rest wait");
        while g.resumer.running() > 0 {
            let next = g.resumer.pending_actors()[0].clone();
            g.resumer.answer(&next, ok(true));
        }
        assert!(hanging.iter().all(|a| g.resumer.calls(a) == 1));
        assert_eq!(open_and_waiting(&g), (0, 0));
    }

    #[test]
    fn b97_an_attempt_still_waiting_at_the_budget_is_not_sent_and_the_flight_ends_there() {
        let g = gated(1, 1_000, None);
        let (held, waiting) = (actor("demo/held"), actor("demo/waiting"));
        let _held = g.table.join(&held, Band::Standard).unwrap().0;
        g.clock.advance(Duration::from_millis(400));
        let (flight, _) = g.table.join(&waiting, Band::Standard).unwrap();
        let mut wait = flight.wait(Until::Done);
        assert!(poll(&mut wait).is_pending());
        g.scheduler.advance(Duration::from_millis(999));
        assert!(poll(&mut wait).is_pending(), "waits within its budget");
        g.scheduler.advance(Duration::from_millis(1));
        match done(&mut wait) {
            FlightOutcome::BudgetExhausted(e) => {
                assert_eq!(e.code, Code::Unavailable);
                assert!(e.message.starts_with("not sent within the budget"), "{}", e.message);
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(g.resumer.calls(&waiting), 0, "never sent");
        assert_eq!(open_and_waiting(&g), (1, 0));
        // The held call ends later: nothing is left to send.
        g.resumer.answer(&held, ok(true));
        assert_eq!(open_and_waiting(&g), (0, 0));
        assert_eq!(g.scheduler.pending(), 0, "no timer left behind");
    }

    #[test]
    fn b97_an_attempt_nobody_waits_for_any_more_is_not_sent() {
        let g = gated(1, 10_000, None);
        let (held, left) = (actor("demo/held"), actor("demo/left"));
        let _held = g.table.join(&held, Band::Standard).unwrap().0;
        let caller = g.table.join(&left, Band::Standard).unwrap().0;
        drop(caller);
        g.resumer.answer(&held, err(Code::NotFound, "gone"));
        assert_eq!(g.resumer.calls(&left), 0, "B78: not sent once its callers left");
        assert_eq!(g.abandoned.get(), 1, "its flight ended, abandoned");
        assert!(g.table.is_empty());
        assert_eq!(open_and_waiting(&g), (0, 0));
        assert_eq!(g.scheduler.pending(), 0, "its budget's timer cancelled");
    }

    /// Holds its first attempt and fails every later one inside `start`,
    /// as a client whose channel is gone does.
    #[derive(Default)]
    struct FailsAtOnce {
        first: parking_lot::Mutex<Option<AttemptDone>>,
        started: std::sync::atomic::AtomicUsize,
    }

    impl Resumer for FailsAtOnce {
        fn start(&self, _: &ActorId, done: AttemptDone) {
            if self.started.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 0 {
                *self.first.lock() = Some(done);
            } else {
                done.complete(Err(ResumeError::new(Code::NotFound, "gone")));
            }
        }
    }

    #[test]
    fn b97_attempts_that_report_inside_start_are_sent_in_a_loop_not_a_recursion() {
        let inner = Arc::new(FailsAtOnce::default());
        let g = gated(1, 10_000, Some(Arc::clone(&inner) as Arc<dyn Resumer>));
        let n = 50_000;
        let callers: Vec<_> =
            (0..n).map(|i| g.table.join(&actor(&format!("demo/a{i}")), Band::Standard).unwrap().0).collect();
        assert_eq!(open_and_waiting(&g), (1, n as i64 - 1));
        // Each send reports at once and frees the one call for the next:
        // with a send per release on the stack this would overflow it.
        let first = inner.first.lock().take().unwrap();
        let result: AttemptResult = Err(ResumeError::new(Code::NotFound, "gone"));
        std::thread::Builder::new()
            .stack_size(256 * 1024)
            .spawn(move || first.complete(result))
            .unwrap()
            .join()
            .expect("no stack overflow");
        assert_eq!(inner.started.load(std::sync::atomic::Ordering::SeqCst), n);
        assert_eq!(open_and_waiting(&g), (0, 0));
        assert!(g.table.is_empty());
        drop(callers);
    }

    #[test]
    fn b97_expiries_across_many_atespaces_keep_the_turns_and_their_memory_bounded() {
        let g = gated(1, 1_000, None);
        let held = actor("held/a");
        let _held = g.table.join(&held, Band::Standard).unwrap().0;
        // 5,000 atespaces wait behind the one open call, and all expire.
        let n = 5_000;
        let expiring: Vec<_> =
            (0..n).map(|i| g.table.join(&actor(&format!("t{i}/a")), Band::Standard).unwrap().0).collect();
        assert_eq!(open_and_waiting(&g), (1, n as i64));
        g.scheduler.advance(Duration::from_millis(1_000));
        assert_eq!(open_and_waiting(&g), (1, 0));
        {
            let state = g.gate.state.lock();
            let state = &state.bands[Band::Standard as usize];
            assert!(state.turns.len() <= 1024 + 1, "emptied entries swept: {} left", state.turns.len());
            assert_eq!(state.turns.len(), state.queues.len(), "an entry exactly while in turn");
        }
        drop(expiring);
        // An atespace whose attempt expired and that waits again has one
        // turn, not two: two atespaces alternate one call each.
        let (again, other) = (actor("t4999/b"), actor("other/a"));
        let _again = g.table.join(&again, Band::Standard).unwrap().0;
        let _again2 = g.table.join(&actor("t4999/c"), Band::Standard).unwrap().0;
        let _other = g.table.join(&other, Band::Standard).unwrap().0;
        g.resumer.answer(&held, ok(true));
        assert_eq!(g.resumer.calls(&again), 1);
        g.resumer.answer(&again, ok(true));
        assert_eq!(g.resumer.calls(&other), 1, "the other atespace's turn comes next");
        g.resumer.answer(&other, ok(true));
        g.resumer.answer(&actor("t4999/c"), ok(true));
        assert_eq!(open_and_waiting(&g), (0, 0));
        assert!(
            g.gate.state.lock().bands.iter().all(|b| b.queues.is_empty()),
            "every entry gone once nothing waits"
        );
    }

    #[test]
    fn b120_waiting_attempts_go_highest_band_first_then_in_atespace_turns() {
        let g = gated(1, 10_000, None);
        let held = actor("demo/held");
        let _held = g.table.join(&held, Band::Sheddable).unwrap().0;
        let queued = [
            ("x/standard", Band::Standard),
            ("y/sheddable", Band::Sheddable),
            ("x/critical", Band::Critical),
            ("y/standard", Band::Standard),
            ("x/standard2", Band::Standard),
        ];
        let _callers: Vec<_> =
            queued.iter().map(|(a, band)| g.table.join(&actor(a), *band).unwrap().0).collect();
        assert_eq!(open_and_waiting(&g), (1, 5));
        let mut order = Vec::new();
        g.resumer.answer(&held, ok(true));
        while g.resumer.running() > 0 {
            let next = g.resumer.pending_actors()[0].clone();
            order.push(next.to_string());
            g.resumer.answer(&next, ok(true));
        }
        assert_eq!(
            order,
            ["x/critical", "x/standard", "y/standard", "x/standard2", "y/sheddable"],
            "the critical one first; standard in atespace turns; sheddable last"
        );
    }
}
