//! The parking lot: a fixed number of slots for parked requests (B23-B30),
//! shared fairly between atespaces (B69).
//!
//! Admission is a compare-and-swap on one counter, so with max K and any
//! number of callers racing, exactly K are admitted (B29) without a lock.
//! Each atespace's share is counted under its shard's lock, taken first, so
//! a tenant at its cap is refused without ever holding (even for an
//! instant) a slot another tenant could have had. A [`Slot`] is a guard: it
//! is released exactly once, by [`Slot::release`] (which consumes it) or on
//! drop, and records that caller's own parked time (B27, B32).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use prometheus::{Histogram, IntCounter, IntGauge};

use crate::parking::clock::Clock;

/// How a parked caller's wait ended (B33); the `outcome` label of
/// `atenet_router_parking_wait_duration_seconds`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WaitOutcome {
    Served,
    BudgetExhausted,
    Canceled,
    Timeout,
    Error,
    /// The caller's own deadline (its headers, B68) passed while parked.
    Deadline,
}

impl WaitOutcome {
    /// Every value, in the order of their discriminants.
    pub const ALL: [WaitOutcome; 6] = [
        WaitOutcome::Served,
        WaitOutcome::BudgetExhausted,
        WaitOutcome::Canceled,
        WaitOutcome::Timeout,
        WaitOutcome::Error,
        WaitOutcome::Deadline,
    ];

    /// The label value.
    pub fn name(self) -> &'static str {
        match self {
            WaitOutcome::Served => "served",
            WaitOutcome::BudgetExhausted => "budget_exhausted",
            WaitOutcome::Canceled => "canceled",
            WaitOutcome::Timeout => "timeout",
            WaitOutcome::Error => "error",
            WaitOutcome::Deadline => "deadline",
        }
    }
}

/// What happened to a caller at its lot decision, counted in
/// `atenet_router_park_decisions_total` so that every caller that reached
/// the lot is accounted for exactly once (B55).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LotDecision {
    /// Served without a slot: on the first attempt, or finished just before
    /// taking one.
    Fast,
    /// Took a slot.
    Admitted,
    /// Shed: the lot was full.
    Shed,
    /// Went away before a decision was needed.
    Left,
    /// Refused at once: the time to serve a park exceeds what is left of
    /// the caller's deadline.
    EarlyRejected,
    /// Shed: its atespace held its share of the lot.
    AtespaceFull,
}

impl LotDecision {
    /// Every value, in the order of their discriminants.
    pub const ALL: [LotDecision; 6] = [
        LotDecision::Fast,
        LotDecision::Admitted,
        LotDecision::Shed,
        LotDecision::Left,
        LotDecision::EarlyRejected,
        LotDecision::AtespaceFull,
    ];

    /// The label value.
    pub fn name(self) -> &'static str {
        match self {
            LotDecision::Fast => "fast",
            LotDecision::Admitted => "admitted",
            LotDecision::Shed => "shed",
            LotDecision::Left => "left",
            LotDecision::EarlyRejected => "early_rejected",
            LotDecision::AtespaceFull => "atespace_full",
        }
    }
}

/// The lot's instruments (B31-B34, B55), resolved to their label values
/// once, so that recording touches only atomics.
#[derive(Clone)]
pub struct LotInstruments {
    /// `atenet_router_parking_active`.
    pub active: IntGauge,
    /// `atenet_router_parking_rejected_total`.
    pub rejected: IntCounter,
    /// `atenet_router_parking_early_rejected_total`.
    pub early_rejected: IntCounter,
    /// `atenet_router_parking_atespace_rejected_total`.
    pub atespace_rejected: IntCounter,
    /// `atenet_router_park_decisions_total`, by [`LotDecision`].
    pub decisions: [IntCounter; 6],
    /// `atenet_router_parking_wait_duration_seconds`, by [`WaitOutcome`].
    pub waits: [Histogram; 6],
    /// The longest wait recorded since the status page last took it, in
    /// microseconds: a histogram's buckets only bound a wait, and the page's
    /// percentiles must not read past the longest one.
    pub longest_wait_micros: Arc<AtomicU64>,
}

impl LotInstruments {
    fn decision(&self, decision: LotDecision) -> &IntCounter {
        &self.decisions[decision as usize]
    }

    fn wait(&self, outcome: WaitOutcome) -> &Histogram {
        &self.waits[outcome as usize]
    }
}

/// The bounded set of parked requests.
pub struct ParkingLot {
    max: usize,
    active: AtomicUsize,
    shares: Shares,
    clock: Arc<dyn Clock>,
    instruments: LotInstruments,
    served: Mutex<ServedParks>,
}

/// What the lot has learnt from served parks: the one estimate (B48, B68).
#[derive(Default)]
struct ServedParks {
    /// Exponentially weighted mean of served parks, in seconds.
    mean: Option<f64>,
    /// When the last park was served.
    sampled_at: Option<Instant>,
    /// When a caller was last admitted despite the estimate.
    probed_at: Option<Instant>,
}

/// Why a caller got no slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The lot is full.
    LotFull,
    /// The caller's atespace holds its share.
    AtespaceFull,
}

/// Weight of the newest sample in [`ParkingLot::estimate`]'s mean.
const SERVED_WAIT_ALPHA: f64 = 0.2;
/// With no park served for this long, one caller per this long is admitted
/// despite the estimate (B68).
pub const PROBE_INTERVAL: Duration = Duration::from_secs(1);
/// Retry-After never promises more than this.
const MAX_RETRY_AFTER_SECS: u64 = 60;

impl ParkingLot {
    /// A lot of `max` slots (`max` > 0; a zero lot means parking is off and
    /// no lot exists at all, B22), of which one atespace may hold
    /// `max_per_atespace` (0: no cap).
    pub fn new(
        max: usize,
        max_per_atespace: usize,
        clock: Arc<dyn Clock>,
        instruments: LotInstruments,
    ) -> Arc<ParkingLot> {
        Arc::new(ParkingLot {
            max,
            active: AtomicUsize::new(0),
            shares: Shares::new(max_per_atespace, clock.now()),
            clock,
            instruments,
            served: Mutex::new(ServedParks::default()),
        })
    }

    /// Slots held now.
    pub fn active(&self) -> usize {
        self.active.load(Ordering::Acquire)
    }

    /// How long a parked request has recently taken from park to serve: an
    /// exponentially weighted mean of served parks, so it follows the pool's
    /// current state. `None` before any park was served. The one estimate
    /// behind `Retry-After` (B48) and early rejection (B68).
    pub fn estimate(&self) -> Option<Duration> {
        self.served.lock().mean.map(|mean| Duration::from_secs_f64(mean.max(0.0)))
    }

    /// The `Retry-After` seconds for a capacity 503 (B48): the estimate,
    /// rounded up, at least 1 and at most 60; 1 before any park was served.
    pub fn retry_after(&self) -> u64 {
        let seconds = self.estimate().map_or(0.0, |d| d.as_secs_f64());
        (seconds.ceil() as u64).clamp(1, MAX_RETRY_AFTER_SECS)
    }

    fn note_served(&self, waited: f64) {
        let mut served = self.served.lock();
        served.mean = Some(match served.mean {
            None => waited,
            Some(m) => m + SERVED_WAIT_ALPHA * (waited - m),
        });
        served.sampled_at = Some(self.clock.now());
    }

    /// Whether a caller with `remaining` time should be refused at once
    /// because parks take longer than that (B68); if so it is counted.
    ///
    /// Only served parks move the estimate, and early rejection keeps short
    /// callers from ever being served: a stale estimate would refuse them
    /// forever after the pool recovered. So once no park has been served for
    /// [`PROBE_INTERVAL`], one caller per interval is admitted anyway, and
    /// its park, if served, brings the estimate back to the truth.
    pub fn rejects_early(&self, remaining: Duration) -> bool {
        let now = self.clock.now();
        {
            let mut served = self.served.lock();
            let Some(mean) = served.mean else { return false };
            if Duration::from_secs_f64(mean.max(0.0)) <= remaining {
                return false;
            }
            let quiet =
                |at: Option<Instant>| at.is_none_or(|at| now.saturating_duration_since(at) >= PROBE_INTERVAL);
            if quiet(served.sampled_at) && quiet(served.probed_at) {
                served.probed_at = Some(now);
                return false;
            }
        }
        self.instruments.early_rejected.inc();
        self.note_decision(LotDecision::EarlyRejected);
        true
    }

    /// Counts a caller's lot decision.
    pub fn note_decision(&self, decision: LotDecision) {
        self.instruments.decision(decision).inc();
    }

    /// Takes a slot for a caller of `atespace`, or counts the refusal (B26,
    /// B69). Either way the decision is counted.
    pub fn try_admit(self: &Arc<Self>, atespace: &str) -> Result<Slot, Refusal> {
        let now = self.clock.now();
        if !self.shares.reserve(atespace, now) {
            self.instruments.atespace_rejected.inc();
            self.note_decision(LotDecision::AtespaceFull);
            return Err(Refusal::AtespaceFull);
        }
        let admitted = self
            .active
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < self.max).then_some(n + 1))
            .is_ok();
        if !admitted {
            self.shares.free(atespace, now);
            self.instruments.rejected.inc();
            self.note_decision(LotDecision::Shed);
            return Err(Refusal::LotFull);
        }
        self.note_decision(LotDecision::Admitted);
        self.instruments.active.inc();
        Ok(Slot { lot: Some(Arc::clone(self)), atespace: Box::from(atespace), taken: now })
    }

    /// The atespaces holding slots now, most slots first, at most `top`, and
    /// how many hold slots in all (B93).
    pub fn atespaces(&self, top: usize) -> (Vec<AtespaceView>, usize) {
        self.shares.views(self.clock.now(), top)
    }

    fn free(&self, atespace: &str, taken: Instant, outcome: WaitOutcome) {
        let now = self.clock.now();
        let waited = now.saturating_duration_since(taken).as_secs_f64();
        self.shares.free(atespace, taken);
        // The counter cannot go below zero: each admission adds exactly one,
        // and each slot frees once.
        self.active.fetch_sub(1, Ordering::AcqRel);
        self.instruments.active.dec();
        self.instruments.wait(outcome).observe(waited);
        let micros = now.saturating_duration_since(taken).as_micros().try_into().unwrap_or(u64::MAX);
        self.instruments.longest_wait_micros.fetch_max(micros, Ordering::Relaxed);
        if outcome == WaitOutcome::Served {
            self.note_served(waited);
        }
    }
}

/// One caller's place in the lot.
pub struct Slot {
    /// `None` once released.
    lot: Option<Arc<ParkingLot>>,
    atespace: Box<str>,
    taken: Instant,
}

impl Slot {
    /// Releases the slot and records the wait with `outcome` (B32, B33).
    pub fn release(mut self, outcome: WaitOutcome) {
        if let Some(lot) = self.lot.take() {
            lot.free(&self.atespace, self.taken, outcome);
        }
    }
}

impl Drop for Slot {
    /// A slot dropped without a result belongs to a caller whose stream went
    /// away (B27, B28).
    fn drop(&mut self) {
        if let Some(lot) = self.lot.take() {
            lot.free(&self.atespace, self.taken, WaitOutcome::Canceled);
        }
    }
}

/// One atespace on the status page (B69).
#[derive(Clone, Debug, PartialEq)]
pub struct AtespaceView {
    pub atespace: String,
    pub slots: usize,
    pub oldest_wait: Duration,
    /// Callers shed by the per-atespace cap in the last minute.
    pub sheds_last_minute: u64,
}

/// Every atespace's share of the lot, in shards keyed by name. An entry
/// lives exactly while its atespace holds a slot (a caller is shed only by
/// an atespace holding its cap), so the map is bounded by the lot, not by
/// the number of tenants; its shed count goes with it.
struct Shares {
    /// 0: no cap.
    cap: usize,
    /// Where the shed windows' seconds count from.
    origin: Instant,
    shards: Box<[ShareShard]>,
}

/// One shard of [`Shares`]: atespace name to its share.
type ShareShard = Mutex<HashMap<Box<str>, Share>>;

#[derive(Default)]
struct Share {
    slots: usize,
    /// When each held slot was taken (several at the same instant counted).
    taken: BTreeMap<Instant, usize>,
    sheds: ShedWindow,
}

/// Sheds per second over the last minute.
struct ShedWindow {
    /// Counts per second, indexed by the second modulo 60, with the second
    /// each was counted in.
    seconds: [(u64, u32); 60],
}

impl Default for ShedWindow {
    fn default() -> ShedWindow {
        ShedWindow { seconds: [(0, 0); 60] }
    }
}

impl ShedWindow {
    fn count(&mut self, second: u64) {
        let cell = &mut self.seconds[(second % 60) as usize];
        if cell.0 != second {
            *cell = (second, 0);
        }
        cell.1 = cell.1.saturating_add(1);
    }

    fn last_minute(&self, second: u64) -> u64 {
        self.seconds.iter().filter(|(s, _)| second.saturating_sub(*s) < 60).map(|(_, n)| u64::from(*n)).sum()
    }
}

const SHARE_SHARDS: usize = 16;

impl Shares {
    fn new(cap: usize, origin: Instant) -> Shares {
        Shares { cap, origin, shards: (0..SHARE_SHARDS).map(|_| Mutex::new(HashMap::new())).collect() }
    }

    fn second(&self, now: Instant) -> u64 {
        now.saturating_duration_since(self.origin).as_secs()
    }

    fn shard(&self, atespace: &str) -> &Mutex<HashMap<Box<str>, Share>> {
        let hash = atespace
            .bytes()
            .fold(0xcbf2_9ce4_8422_2325_u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3));
        &self.shards[(hash % SHARE_SHARDS as u64) as usize]
    }

    /// Counts one more slot for `atespace`, unless it holds its cap.
    fn reserve(&self, atespace: &str, now: Instant) -> bool {
        let mut shard = self.shard(atespace).lock();
        if !shard.contains_key(atespace) {
            shard.insert(Box::from(atespace), Share::default());
        }
        let share = shard.get_mut(atespace).expect("just made sure");
        if self.cap > 0 && share.slots >= self.cap {
            share.sheds.count(self.second(now));
            return false;
        }
        share.slots += 1;
        *share.taken.entry(now).or_default() += 1;
        true
    }

    fn free(&self, atespace: &str, taken: Instant) {
        let mut shard = self.shard(atespace).lock();
        let Some(share) = shard.get_mut(atespace) else { return };
        share.slots = share.slots.saturating_sub(1);
        if let Some(n) = share.taken.get_mut(&taken) {
            *n -= 1;
            if *n == 0 {
                share.taken.remove(&taken);
            }
        }
        if share.slots == 0 {
            shard.remove(atespace);
        }
    }

    fn views(&self, now: Instant, top: usize) -> (Vec<AtespaceView>, usize) {
        let second = self.second(now);
        let mut views: Vec<AtespaceView> = Vec::new();
        for shard in self.shards.iter() {
            let shard = shard.lock();
            views.extend(shard.iter().map(|(name, share)| AtespaceView {
                atespace: name.to_string(),
                slots: share.slots,
                oldest_wait:
                    share.taken.keys().next().map_or(Duration::ZERO, |t| now.saturating_duration_since(*t)),
                sheds_last_minute: share.sheds.last_minute(second),
            }));
        }
        views.sort_by(|a, b| b.slots.cmp(&a.slots).then_with(|| a.atespace.cmp(&b.atespace)));
        let total = views.len();
        views.truncate(top);
        (views, total)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parking::clock::ManualClock;
    use crate::telemetry::metrics::Metrics;

    fn lot(max: usize, per_atespace: usize, clock: Arc<dyn Clock>) -> Arc<ParkingLot> {
        ParkingLot::new(max, per_atespace, clock, Metrics::new().lot_instruments())
    }

    #[test]
    fn labels_are_listed_in_discriminant_order() {
        assert!(WaitOutcome::ALL.iter().enumerate().all(|(i, o)| *o as usize == i));
        assert!(LotDecision::ALL.iter().enumerate().all(|(i, d)| *d as usize == i));
    }

    #[test]
    fn b68_early_rejection_follows_the_estimate_and_probes_when_it_is_stale() {
        let clock = ManualClock::new();
        let lot = lot(4, 0, Arc::new(clock.clone()));
        let m = &lot.instruments;
        assert!(!lot.rejects_early(Duration::ZERO), "no estimate: nobody is rejected early");
        let slot = lot.try_admit("demo").unwrap();
        clock.advance(Duration::from_secs(2));
        slot.release(WaitOutcome::Served);
        assert_eq!(lot.estimate(), Some(Duration::from_secs(2)));
        assert!(!lot.rejects_early(Duration::from_secs(2)), "enough time left");
        assert!(lot.rejects_early(Duration::from_millis(1999)));
        clock.advance(PROBE_INTERVAL - Duration::from_millis(1));
        assert!(lot.rejects_early(Duration::from_millis(300)), "the estimate is fresh");
        assert_eq!(m.early_rejected.get(), 2);
        // No park served for a probe interval: one caller gets through, then
        // the rest of that interval is refused again.
        clock.advance(Duration::from_millis(1));
        assert!(!lot.rejects_early(Duration::from_millis(300)), "the probe");
        assert!(lot.rejects_early(Duration::from_millis(300)));
        clock.advance(PROBE_INTERVAL);
        assert!(!lot.rejects_early(Duration::from_millis(300)), "the next probe");
        // The probe is served quickly: the estimate moves towards it.
        let probe = lot.try_admit("demo").unwrap();
        clock.advance(Duration::from_millis(100));
        probe.release(WaitOutcome::Served);
        assert_eq!(lot.estimate(), Some(Duration::from_secs_f64(2.0 + 0.2 * (0.1 - 2.0))));
        assert_eq!(m.early_rejected.get(), 3);
        assert_eq!(m.decision(LotDecision::EarlyRejected).get(), 3);
    }

    #[test]
    fn b26_b27_admission_release_once_and_wait_sample() {
        let clock = ManualClock::new();
        let lot = lot(2, 0, Arc::new(clock.clone()));
        let m = &lot.instruments;
        let a = lot.try_admit("demo").unwrap();
        let b = lot.try_admit("demo").unwrap();
        assert_eq!(lot.try_admit("demo").err(), Some(Refusal::LotFull), "B26: full lot sheds");
        assert_eq!(m.rejected.get(), 1);
        assert_eq!(m.active.get(), 2);
        clock.advance(Duration::from_millis(250));
        a.release(WaitOutcome::Served);
        assert_eq!(lot.active(), 1, "B27: released once (release consumes the slot)");
        let served = m.wait(WaitOutcome::Served);
        assert_eq!(served.get_sample_count(), 1);
        assert!((served.get_sample_sum() - 0.25).abs() < 1e-9, "own parked time");
        assert_eq!(m.wait(WaitOutcome::Error).get_sample_count(), 0);
        drop(b);
        assert_eq!(lot.active(), 0);
        assert_eq!(m.active.get(), 0);
        assert_eq!(m.wait(WaitOutcome::Canceled).get_sample_count(), 1, "B28: dropped = canceled");
        let decided = |d| m.decision(d).get();
        assert_eq!((decided(LotDecision::Admitted), decided(LotDecision::Shed)), (2, 1));
        assert_eq!(lot.atespaces(20), (vec![], 0), "nothing held, nothing shown");
    }

    #[test]
    fn b48_b68_one_estimate_behind_retry_after_and_early_rejection() {
        let clock = ManualClock::new();
        let lot = lot(4, 0, Arc::new(clock.clone()));
        assert_eq!(lot.estimate(), None, "no estimate before a served park");
        assert_eq!(lot.retry_after(), 1, "nothing observed yet");
        let slot = lot.try_admit("demo").unwrap();
        clock.advance(Duration::from_millis(3200));
        slot.release(WaitOutcome::Served);
        assert_eq!(lot.estimate(), Some(Duration::from_millis(3200)));
        assert_eq!(lot.retry_after(), 4, "rounded up");
        for _ in 0..40 {
            let slot = lot.try_admit("demo").unwrap();
            clock.advance(Duration::from_millis(100));
            slot.release(WaitOutcome::Served);
        }
        assert!(lot.estimate().unwrap() < Duration::from_millis(110), "follows the pool as it recovers");
        assert_eq!(lot.retry_after(), 1, "never below 1");
        let slot = lot.try_admit("demo").unwrap();
        clock.advance(Duration::from_secs(100_000));
        slot.release(WaitOutcome::BudgetExhausted);
        assert_eq!(lot.retry_after(), 1, "only served parks count");
    }

    #[test]
    fn b69_an_atespace_at_its_cap_is_shed_while_others_park() {
        let clock = ManualClock::new();
        let lot = lot(10, 2, Arc::new(clock.clone()));
        let greedy: Vec<Slot> = (0..2).map(|_| lot.try_admit("greedy").unwrap()).collect();
        clock.advance(Duration::from_secs(3));
        assert_eq!(lot.try_admit("greedy").err(), Some(Refusal::AtespaceFull));
        assert_eq!(lot.try_admit("greedy").err(), Some(Refusal::AtespaceFull));
        let polite = lot.try_admit("polite").unwrap();
        assert_eq!(lot.active(), 3, "a refused atespace holds nothing extra");
        let m = &lot.instruments;
        assert_eq!((m.atespace_rejected.get(), m.rejected.get()), (2, 0));
        assert_eq!(m.decision(LotDecision::AtespaceFull).get(), 2);
        let (views, total) = lot.atespaces(20);
        assert_eq!((views.len(), total), (2, 2));
        assert_eq!(lot.atespaces(1).1, 2, "B93: the total counts what the top leaves out");
        assert_eq!(
            views[0],
            AtespaceView {
                atespace: "greedy".into(),
                slots: 2,
                oldest_wait: Duration::from_secs(3),
                sheds_last_minute: 2
            }
        );
        assert_eq!(
            (views[1].atespace.as_str(), views[1].slots, views[1].sheds_last_minute),
            ("polite", 1, 0)
        );
        let mut greedy = greedy.into_iter();
        drop(greedy.next());
        let again = lot.try_admit("greedy").expect("room again once a slot is freed");
        clock.advance(Duration::from_secs(61));
        let view = lot.atespaces(20).0.into_iter().find(|v| v.atespace == "greedy").unwrap();
        assert_eq!((view.slots, view.sheds_last_minute), (2, 0), "sheds older than a minute are forgotten");
        drop((again, polite, greedy));
        // Bounded by the lot, not by tenants: nothing is kept for an
        // atespace that holds no slot, however recently it was shed.
        assert!(lot.shares.shards.iter().all(|shard| shard.lock().is_empty()));
    }

    #[test]
    fn b69_a_shed_atespace_that_frees_its_slots_leaves_nothing_behind() {
        let lot = lot(4, 1, Arc::new(ManualClock::new()));
        for i in 0..1000 {
            let tenant = format!("tenant-{i}");
            let held = lot.try_admit(&tenant).unwrap();
            assert_eq!(lot.try_admit(&tenant).err(), Some(Refusal::AtespaceFull));
            drop(held);
        }
        assert!(
            lot.shares.shards.iter().all(|shard| shard.lock().is_empty()),
            "one entry per tenant ever seen"
        );
    }

    #[test]
    fn b69_a_lot_full_refusal_gives_the_atespace_reservation_back() {
        let lot = lot(1, 1, Arc::new(ManualClock::new()));
        let held = lot.try_admit("a").unwrap();
        assert_eq!(lot.try_admit("b").err(), Some(Refusal::LotFull));
        drop(held);
        assert!(lot.try_admit("b").is_ok(), "b's failed try left nothing behind");
    }

    #[test]
    fn b29_b69_exact_admission_under_concurrency() {
        let lot = lot(100, 7, Arc::new(crate::parking::clock::SystemClock));
        let barrier = Arc::new(std::sync::Barrier::new(8));
        let handles: Vec<_> = (0..8)
            .map(|t| {
                let (lot, barrier) = (Arc::clone(&lot), Arc::clone(&barrier));
                std::thread::spawn(move || {
                    barrier.wait();
                    // Every thread competes for the same atespace, and for
                    // the lot through 29 others.
                    (0..50)
                        .filter_map(|i| {
                            lot.try_admit(if i % 2 == 0 { "shared" } else { ["x", "y", "z"][(i + t) % 3] })
                                .ok()
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        let slots: Vec<Slot> = handles.into_iter().flat_map(|h| h.join().unwrap()).collect();
        let held = |name: &str| slots.iter().filter(|s| &*s.atespace == name).count();
        assert_eq!(held("shared"), 7, "exactly K of many simultaneous callers of one atespace");
        assert_eq!((held("x"), held("y"), held("z")), (7, 7, 7));
        assert_eq!(lot.active(), 28);
        drop(slots);
        assert_eq!(lot.active(), 0);
        assert_eq!(lot.instruments.active.get(), 0);
        assert_eq!(lot.atespaces(20), (vec![], 0));
    }

    #[test]
    fn b29_exact_admission_under_concurrency_without_a_cap() {
        let lot = lot(100, 0, Arc::new(crate::parking::clock::SystemClock));
        let barrier = Arc::new(std::sync::Barrier::new(8));
        let handles: Vec<_> = (0..8)
            .map(|_| {
                let (lot, barrier) = (Arc::clone(&lot), Arc::clone(&barrier));
                std::thread::spawn(move || {
                    barrier.wait();
                    (0..50).filter_map(|_| lot.try_admit("demo").ok()).collect::<Vec<_>>()
                })
            })
            .collect();
        let slots: Vec<Slot> = handles.into_iter().flat_map(|h| h.join().unwrap()).collect();
        assert_eq!(slots.len(), 100, "exactly K of N > K admitted");
        assert_eq!(lot.instruments.rejected.get(), 300);
        drop(slots);
        assert_eq!(lot.active(), 0);
        assert_eq!(lot.instruments.active.get(), 0);
    }
}
