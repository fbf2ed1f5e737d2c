//! Saturation groups: the flights that wait for one worker pool, or for
//! the control plane, and are sent one at a time (B109-B112).
//!
//! A `RESOURCE_EXHAUSTED` answer says a worker pool is full, not that one
//! actor is: every flight waiting on that pool would hear the same answer,
//! so one of them asks at a time (the group's probe) and the others wait
//! in order. `UNAVAILABLE` says the control plane is down: one group of
//! its own. This module holds the groups' bookkeeping only; the flight
//! table (`flight`) decides when a group sends its next flight.
//!
//! Within a group the next flight is the one whose [`DispatchOrder`] comes
//! first (the budget that ends first), taking turns between atespaces as
//! the call bound does (B97), so that a tenant with many waiting actors
//! delays another's by at most one flight per turn.

use std::cmp::Ordering;
use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering as AtomicOrdering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::actor::resume::Code;
use crate::actor::target::ActorId;
use crate::parking::backoff::{Backoff, BackoffPolicy};
use crate::parking::band::Band;
use crate::parking::timer::TimerId;

/// What a group waits for (B109).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum GroupKey {
    /// A worker pool, as named by the actor's last `WorkerAssignment`.
    Pool(Arc<str>),
    /// An atespace whose actor has no remembered pool.
    Atespace(Arc<str>),
    /// The control plane, for `UNAVAILABLE` answers.
    ControlPlane,
}

impl GroupKey {
    /// The group for a retryable answer, or `None` for a code that stays
    /// with its flight (`FAILED_PRECONDITION`, `ABORTED`: about one actor).
    pub fn for_answer(code: Code, actor: &ActorId, pools: &PoolMemory) -> Option<GroupKey> {
        match code {
            Code::ResourceExhausted => Some(match pools.pool(actor) {
                Some(pool) => GroupKey::Pool(pool),
                None => GroupKey::Atespace(Arc::from(actor.atespace())),
            }),
            Code::Unavailable => Some(GroupKey::ControlPlane),
            _ => None,
        }
    }

    /// Whether `code` is an answer only the control plane gives, about an
    /// actor or its pool, so it is up (B130). `UNAVAILABLE`, a deadline or
    /// a failure on the way says nothing of it.
    pub fn answered_by_control_plane(code: Code) -> bool {
        matches!(
            code,
            Code::Ok | Code::ResourceExhausted | Code::FailedPrecondition | Code::Aborted | Code::NotFound
        )
    }
}

impl fmt::Display for GroupKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GroupKey::Pool(pool) => write!(f, "pool:{pool}"),
            GroupKey::Atespace(atespace) => write!(f, "atespace:{atespace}"),
            GroupKey::ControlPlane => f.write_str("control-plane"),
        }
    }
}

/// A flight's place in its group: the higher band first (B120), then the
/// budget that ends first (so, with equal budgets, the oldest), then the
/// flight created first (B111). No two flights compare equal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DispatchOrder {
    /// The band the flight acts with now; a change re-ranks it.
    pub band: Band,
    /// When the flight's budget ends.
    pub budget_end: Instant,
    /// The flight's creation number.
    pub arrival: u64,
}

impl Ord for DispatchOrder {
    fn cmp(&self, other: &Self) -> Ordering {
        other
            .band
            .cmp(&self.band)
            .then(self.budget_end.cmp(&other.budget_end))
            .then(self.arrival.cmp(&other.arrival))
    }
}

impl PartialOrd for DispatchOrder {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// The worker pool each actor last ran on, for the actors seen most
/// recently: at most `bound` of them, the oldest entry forgotten first, so
/// that a stream of distinct actors costs a bounded amount of memory. A
/// forgotten actor waits in its atespace's group instead (B109).
pub struct PoolMemory {
    pools: HashMap<ActorId, Arc<str>>,
    order: VecDeque<ActorId>,
    /// Pool names seen, so that many actors share one allocation per pool.
    names: HashSet<Arc<str>>,
    bound: usize,
}

/// How many actors' pools are remembered by default: some 100 bytes each.
pub const POOL_MEMORY_BOUND: usize = 16_384;

impl PoolMemory {
    pub fn new(bound: usize) -> PoolMemory {
        PoolMemory {
            pools: HashMap::new(),
            order: VecDeque::new(),
            names: HashSet::new(),
            bound: bound.max(1),
        }
    }

    /// The pool `actor` last ran on, if remembered.
    pub fn pool(&self, actor: &ActorId) -> Option<Arc<str>> {
        self.pools.get(actor).cloned()
    }

    /// Remembers that `actor` runs on `pool`; an empty name is no pool.
    pub fn remember(&mut self, actor: &ActorId, pool: &str) {
        if pool.is_empty() || self.pools.get(actor).is_some_and(|known| **known == *pool) {
            return;
        }
        let name = match self.names.get(pool) {
            Some(name) => Arc::clone(name),
            None => {
                // Names no remembered actor uses are dropped now and then, so
                // that they stay bounded by the actors too.
                if self.names.len() >= self.bound {
                    let used: HashSet<&Arc<str>> = self.pools.values().collect();
                    self.names.retain(|n| used.contains(n));
                }
                let name: Arc<str> = Arc::from(pool);
                self.names.insert(Arc::clone(&name));
                name
            }
        };
        if self.pools.insert(actor.clone(), name).is_none() {
            self.order.push_back(actor.clone());
            if self.order.len() > self.bound {
                if let Some(oldest) = self.order.pop_front() {
                    self.pools.remove(&oldest);
                }
            }
        }
    }

    #[cfg(test)]
    fn remembered(&self) -> usize {
        self.pools.len()
    }
}

/// One saturation group; `T` is what waits in it (a flight).
pub struct Group<T> {
    /// Waiting entries by atespace, in dispatch order. An atespace has an
    /// entry exactly while it is in `turns`.
    queues: HashMap<Arc<str>, BTreeMap<DispatchOrder, Entry<T>>>,
    /// The atespaces with waiting entries, whose turn is next first.
    turns: VecDeque<Arc<str>>,
    waiting: usize,
    /// The group's open attempt (its probe) while the group waits for its
    /// answer (B110), by number, so that a late answer of an earlier probe
    /// is told apart.
    probe: Option<u64>,
    /// When the group stops waiting for its open probe.
    pub patience_timer: Option<TimerId>,
    /// The longest an open probe holds the group: the longest delay.
    patience_cap: Duration,
    /// The least: a quarter of an interval, however quick the refusals.
    patience_floor: Duration,
    /// How long the pool takes to refuse: the slowest recent refusal,
    /// decaying towards quicker ones (B129); none heard yet, `None`.
    refusal_time: Option<Duration>,
    /// Probes presumed resumes under way since the group last heard from
    /// its pool (B129): each doubles the patience, so that a control plane
    /// that stopped answering is asked ever less often.
    presumed_unheard: u32,
    /// When the group sends its next flight, if it is due to: the timer
    /// and the moment it fires.
    pub timer: Option<(TimerId, Instant)>,
    /// The delay between the group's answers and its next attempt.
    backoff: Backoff,
    /// Whether the group's router is alone on its pools (B127).
    alone: bool,
    /// The group's latest answer and when it came.
    pub last_answer: Code,
    pub last_answer_at: Instant,
}

struct Entry<T> {
    item: T,
    since: Instant,
}

/// Probes opened in this process: a probe's number. Unique across groups,
/// so that a late answer of a probe whose group was forgotten (its probe
/// overdue, its flights gone) cannot close the probe of a new group of the
/// same key.
static PROBES_OPENED: AtomicU64 = AtomicU64::new(0);

/// The longest a saturated group's delay grows to, in retry intervals
/// (B110): a freed worker is taken within this many intervals.
pub const DELAY_CAP_INTERVALS: u32 = 4;

/// How many of its pool's refusals an open probe may take before the group
/// presumes it a resume under way (B129).
pub const PATIENCE_REFUSALS: u32 = 4;

impl<T> Group<T> {
    /// A group of a router in a fleet of `fleet_size` routers (1: alone),
    /// whose delays and patience are `fleet_size` times one router's (B127).
    pub fn new(policy: BackoffPolicy, fleet_size: u32, answer: Code, now: Instant) -> Group<T> {
        let policy = BackoffPolicy { interval: policy.interval.saturating_mul(fleet_size.max(1)), ..policy };
        Group {
            queues: HashMap::new(),
            turns: VecDeque::new(),
            waiting: 0,
            probe: None,
            patience_timer: None,
            patience_cap: policy.interval * DELAY_CAP_INTERVALS,
            patience_floor: policy.interval / 4,
            refusal_time: None,
            presumed_unheard: 0,
            timer: None,
            backoff: Backoff::new(policy),
            alone: fleet_size <= 1,
            last_answer: answer,
            last_answer_at: now,
        }
    }

    /// Flights waiting in the group.
    pub fn waiting(&self) -> usize {
        self.waiting
    }

    /// Whether the group can be forgotten: nothing waits, nothing is open.
    pub fn idle(&self) -> bool {
        self.waiting == 0 && self.probe.is_none()
    }

    /// Whether the group waits for its probe's answer.
    pub fn probe_open(&self) -> bool {
        self.probe.is_some()
    }

    /// Whether probe `id` is the one the group waits for.
    pub fn is_open_probe(&self, id: u64) -> bool {
        self.probe == Some(id)
    }

    /// Opens a probe: its number, and how long the group waits for it.
    pub fn open_probe(&mut self) -> (u64, Duration) {
        let id = PROBES_OPENED.fetch_add(1, AtomicOrdering::Relaxed) + 1;
        self.probe = Some(id);
        (id, self.patience())
    }

    /// How long the group waits for a probe before it presumes a resume
    /// under way (B129): a full pool refuses at once, so an answer
    /// [`PATIENCE_REFUSALS`] times slower than its slowest recent refusal
    /// is no refusal. At least a quarter of an interval, doubled for each
    /// resume presumed since the group last heard from its pool, and at
    /// most the longest delay (B110), which is also the patience before any
    /// refusal was timed.
    pub fn patience(&self) -> Duration {
        let Some(refusal) = self.refusal_time else { return self.patience_cap };
        let base = refusal.saturating_mul(PATIENCE_REFUSALS).max(self.patience_floor);
        base.saturating_mul(1 << self.presumed_unheard.min(16)).min(self.patience_cap)
    }

    /// The group heard from its pool: an answer of any of its attempts,
    /// or a resume there outside its probe ([`Group::came_back`]). (The
    /// control plane's group, with no patience, is told too, to no effect.)
    pub fn heard(&mut self) {
        self.presumed_unheard = 0;
    }

    /// A refusal of the group's pool took `took`, from its attempt's start
    /// to its answer (B129): a slower one than any recent sets the pace at once, a
    /// quicker one moves it an eighth of the way down.
    pub fn refused_in(&mut self, took: Duration) {
        self.refusal_time = Some(match self.refusal_time {
            Some(slowest) if slowest > took => slowest - (slowest - took) / 8,
            _ => took,
        });
    }

    /// Stops waiting for probe `id`, with the timer that would have, if it
    /// is the open one; false for an earlier probe's late answer.
    pub fn close_probe(&mut self, id: u64) -> (bool, Option<TimerId>) {
        if !self.is_open_probe(id) {
            return (false, None);
        }
        self.probe = None;
        (true, self.patience_timer.take())
    }

    /// Probe `id` outlasted the group's patience: presumed a resume under
    /// way, it no longer holds the group (B110, B129). False if it is not
    /// the open probe.
    pub fn presume_resume(&mut self, id: u64) -> bool {
        if !self.is_open_probe(id) {
            // Its answer came first; the patience timer is the next probe's.
            return false;
        }
        self.probe = None;
        self.patience_timer = None;
        self.presumed_unheard = self.presumed_unheard.saturating_add(1);
        true
    }

    /// The delay before the next attempt while the group stays saturated:
    /// the flights' own schedule (B17), capped at [`DELAY_CAP_INTERVALS`].
    pub fn next_delay(&mut self) -> Duration {
        self.backoff.next_random_delay_capped(DELAY_CAP_INTERVALS)
    }

    /// A worker freed: the delays start again from one interval. Whether
    /// the next flight goes at once: alone, the router is the only one to
    /// find the workers that may follow (B110); in a fleet, every router's
    /// group is probing too, and a follow-up of each router's each success
    /// would ask a full pool once more per router (B127).
    pub fn worker_freed(&mut self) -> bool {
        self.backoff.reset();
        self.alone
    }

    /// What the group waits for has come back: a resume in its pool, by an
    /// attempt other than its open probe, took a worker that freed (B128),
    /// or the control plane answered any attempt, the control plane's
    /// group's own probe included (B130). The delays start again
    /// from one interval. The delay the group's next flight would wait from
    /// `now` if it is due later than that, or `None`: nothing waits, the
    /// probe's answer decides, or the next flight is due as soon.
    pub fn came_back(&mut self, now: Instant) -> Option<Duration> {
        if self.idle() {
            return None;
        }
        self.heard();
        self.backoff.reset();
        if self.probe_open() {
            return None;
        }
        let delay = self.next_delay();
        match self.timer {
            Some((_, due)) if due <= now + delay => {
                // Not taken: the next refusal's delay is one interval again.
                self.backoff.reset();
                None
            }
            _ => Some(delay),
        }
    }

    pub fn insert(&mut self, atespace: &Arc<str>, order: DispatchOrder, item: T, now: Instant) {
        let queue = match self.queues.get_mut(atespace) {
            Some(queue) => queue,
            None => {
                self.turns.push_back(Arc::clone(atespace));
                self.queues.entry(Arc::clone(atespace)).or_default()
            }
        };
        if queue.insert(order, Entry { item, since: now }).is_none() {
            self.waiting += 1;
        }
    }

    /// Takes an entry out of the group (its flight ended); false if it was
    /// not there.
    pub fn remove(&mut self, atespace: &str, order: &DispatchOrder) -> bool {
        let Some(queue) = self.queues.get_mut(atespace) else { return false };
        if queue.remove(order).is_none() {
            return false;
        }
        self.waiting -= 1;
        if queue.is_empty() {
            self.queues.remove(atespace);
            self.turns.retain(|a| &**a != atespace);
        }
        true
    }

    /// Moves an entry to a new place in its atespace's queue (its flight's
    /// band changed, B120), keeping how long it has waited; false if it was
    /// not there.
    pub fn reorder(&mut self, atespace: &str, from: &DispatchOrder, to: DispatchOrder) -> bool {
        let Some(queue) = self.queues.get_mut(atespace) else { return false };
        let Some(entry) = queue.remove(from) else { return false };
        queue.insert(to, entry);
        true
    }

    /// The next entry to send: the first of the atespace whose turn it is,
    /// which then goes to the back of the turns (B111).
    pub fn pop_next(&mut self) -> Option<T> {
        let atespace = self.turns.pop_front()?;
        let queue = self.queues.get_mut(&atespace)?;
        let (_, entry) = queue.pop_first()?;
        self.waiting -= 1;
        if queue.is_empty() {
            self.queues.remove(&atespace);
        } else {
            self.turns.push_back(atespace);
        }
        Some(entry.item)
    }

    /// When the longest-waiting entry joined the group.
    pub fn oldest_since(&self) -> Option<Instant> {
        self.queues.values().flat_map(|q| q.values().map(|e| e.since)).min()
    }
}

/// One group, for the status page (B112).
#[derive(Clone, Debug)]
pub struct GroupSnapshot {
    pub key: String,
    pub waiting: usize,
    /// How long the longest-waiting flight has waited in the group.
    pub oldest_wait: Duration,
    pub last_answer: Code,
    pub probe_open: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn order(ms: u64, arrival: u64, base: Instant) -> DispatchOrder {
        DispatchOrder { band: Band::Standard, budget_end: base + Duration::from_millis(ms), arrival }
    }

    #[test]
    fn b120_the_higher_band_goes_first_whatever_its_budget() {
        let base = Instant::now();
        let critical = DispatchOrder { band: Band::Critical, ..order(900, 9, base) };
        let sheddable = DispatchOrder { band: Band::Sheddable, ..order(1, 0, base) };
        assert!(critical < order(100, 1, base) && order(100, 1, base) < sheddable);
    }

    #[test]
    fn b120_a_reordered_entry_keeps_its_wait_and_its_atespace_turn() {
        let base = Instant::now();
        let policy = BackoffPolicy { interval: Duration::from_millis(100), factor: 2.0, jitter: 0.0 };
        let mut group: Group<&str> = Group::new(policy, 1, Code::ResourceExhausted, base);
        let x: Arc<str> = Arc::from("x");
        group.insert(&x, order(1, 0, base), "first", base);
        group.insert(&x, order(2, 1, base), "second", base + Duration::from_secs(1));
        let promoted = DispatchOrder { band: Band::Critical, ..order(2, 1, base) };
        assert!(group.reorder("x", &order(2, 1, base), promoted));
        assert!(!group.reorder("x", &order(2, 1, base), promoted), "moved once");
        assert_eq!(group.oldest_since(), Some(base));
        let sent: Vec<_> = std::iter::from_fn(|| group.pop_next()).collect();
        assert_eq!(sent, ["second", "first"]);
    }

    #[test]
    fn b111_the_budget_that_ends_first_goes_first_then_the_older_flight() {
        let base = Instant::now();
        assert!(order(100, 9, base) < order(200, 1, base));
        assert!(order(100, 1, base) < order(100, 2, base));
    }

    #[test]
    fn b111_atespaces_take_turns_in_order_within_each() {
        let base = Instant::now();
        let policy = BackoffPolicy { interval: Duration::from_millis(100), factor: 2.0, jitter: 0.0 };
        let mut group: Group<&str> = Group::new(policy, 1, Code::ResourceExhausted, base);
        let (x, y): (Arc<str>, Arc<str>) = (Arc::from("x"), Arc::from("y"));
        group.insert(&x, order(3, 0, base), "x3", base);
        group.insert(&x, order(1, 1, base), "x1", base);
        group.insert(&x, order(2, 2, base), "x2", base);
        group.insert(&y, order(9, 3, base), "y9", base);
        assert!(group.remove("x", &order(2, 2, base)));
        let sent: Vec<_> = std::iter::from_fn(|| group.pop_next()).collect();
        assert_eq!(sent, ["x1", "y9", "x3"]);
        assert!(group.idle());
    }

    #[test]
    fn b110_the_delay_grows_by_the_factor_and_stops_at_its_cap() {
        let policy = BackoffPolicy { interval: Duration::from_millis(100), factor: 2.0, jitter: 0.0 };
        let mut group: Group<()> = Group::new(policy, 1, Code::ResourceExhausted, Instant::now());
        let delays: Vec<u128> = (0..5).map(|_| group.next_delay().as_millis()).collect();
        assert_eq!(delays, [100, 200, 400, 400, 400]);
        assert!(group.worker_freed(), "alone, the next flight goes at once");
        assert_eq!(group.next_delay(), Duration::from_millis(100));
    }

    #[test]
    fn b127_a_fleet_routers_group_runs_the_schedule_fleet_size_times_slower() {
        let policy = BackoffPolicy { interval: Duration::from_millis(100), factor: 2.0, jitter: 0.0 };
        let mut group: Group<()> = Group::new(policy, 3, Code::ResourceExhausted, Instant::now());
        let delays: Vec<u128> = (0..4).map(|_| group.next_delay().as_millis()).collect();
        assert_eq!(delays, [300, 600, 1200, 1200]);
        assert_eq!(group.open_probe().1, Duration::from_millis(1200), "its patience too");
        assert!(!group.worker_freed(), "in a fleet, the next flight waits a delay");
        assert_eq!(group.next_delay(), Duration::from_millis(300));
    }

    #[test]
    fn b129_the_patience_is_four_of_the_slowest_recent_refusals_within_its_bounds() {
        let policy = BackoffPolicy { interval: Duration::from_millis(100), factor: 2.0, jitter: 0.0 };
        let mut group: Group<()> = Group::new(policy, 1, Code::ResourceExhausted, Instant::now());
        let ms = Duration::from_millis;
        assert_eq!(group.patience(), ms(400), "no refusal timed: the longest delay");
        group.refused_in(ms(10));
        assert_eq!(group.patience(), ms(40));
        group.refused_in(ms(2));
        assert_eq!(group.patience(), ms(36), "a quicker refusal moves it an eighth of the way");
        group.refused_in(ms(30));
        assert_eq!(group.patience(), ms(120), "a slower one at once");
        for _ in 0..40 {
            group.refused_in(Duration::ZERO);
        }
        assert_eq!(group.patience(), ms(25), "at least a quarter of an interval");
        group.refused_in(ms(250));
        assert_eq!(group.patience(), ms(400), "at most the longest delay");
    }

    #[test]
    fn b129_each_resume_presumed_unheard_doubles_the_patience() {
        let policy = BackoffPolicy { interval: Duration::from_millis(100), factor: 2.0, jitter: 0.0 };
        let mut group: Group<()> = Group::new(policy, 1, Code::ResourceExhausted, Instant::now());
        group.refused_in(Duration::from_millis(5));
        let mut patience = Vec::new();
        let mut presumed = Vec::new();
        for _ in 0..5 {
            let (id, waits) = group.open_probe();
            patience.push(waits.as_millis());
            assert!(group.presume_resume(id) && !group.presume_resume(id), "presumed once");
            presumed.push(id);
        }
        assert_eq!(patience, [25, 50, 100, 200, 400]);
        for id in presumed {
            assert_eq!(group.close_probe(id), (false, None), "no open probe's");
        }
        // An answer from the pool: the patience is the pool's again.
        group.heard();
        assert_eq!(group.open_probe().1, Duration::from_millis(25));
        let mut fleet: Group<()> = Group::new(policy, 3, Code::ResourceExhausted, Instant::now());
        fleet.refused_in(Duration::ZERO);
        assert_eq!(fleet.patience(), Duration::from_millis(75), "a fleet's floor is N times one router's");
    }

    #[test]
    fn b109_pools_are_remembered_with_a_bound() {
        let mut pools = PoolMemory::new(2);
        let a = |n: &str| ActorId::parse(&format!("demo/{n}")).unwrap();
        pools.remember(&a("a"), "p1");
        pools.remember(&a("b"), "p2");
        pools.remember(&a("c"), "p1");
        assert_eq!(pools.remembered(), 2);
        assert_eq!(pools.pool(&a("a")), None, "the oldest is forgotten");
        assert_eq!(pools.pool(&a("c")).as_deref(), Some("p1"));
        pools.remember(&a("d"), "");
        assert_eq!(pools.pool(&a("d")), None, "an empty name is no pool");
        let key = GroupKey::for_answer(Code::ResourceExhausted, &a("a"), &pools).unwrap();
        assert_eq!(key.to_string(), "atespace:demo");
        let key = GroupKey::for_answer(Code::ResourceExhausted, &a("c"), &pools).unwrap();
        assert_eq!(key.to_string(), "pool:p1");
        assert_eq!(GroupKey::for_answer(Code::Unavailable, &a("c"), &pools), Some(GroupKey::ControlPlane));
        assert_eq!(GroupKey::for_answer(Code::FailedPrecondition, &a("c"), &pools), None);
        assert_eq!(GroupKey::for_answer(Code::Aborted, &a("c"), &pools), None);
    }
}
