//! The parking lot: a fixed number of slots for parked requests (B23-B30),
//! shared fairly between atespaces and ordered by priority band.
//!
//! Admission decides under one lock which slots are held, by band and in
//! the order they were taken, so with max K and any number of callers
//! racing, exactly K are held (B29), and a caller that takes a lower band's
//! slot takes it from exactly one holder. Only callers at the park
//! transition take the lock: a request served on its first attempt never
//! does. Each atespace's share is counted under its shard's lock,
//! taken first, so a tenant at its cap is refused without ever holding
//! (even for an instant) a slot another tenant could have had. A [`Slot`]
//! is a guard: it is released exactly once, by [`Slot::release`] (which
//! consumes it), on drop, or by the newcomer that preempts it (whichever
//! takes it out of the lot's book first), and records that caller's own
//! parked time.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::Waker;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use prometheus::{Histogram, IntCounter, IntGauge};

use crate::parking::band::Band;
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
    /// The caller's own deadline (its headers) passed while parked.
    Deadline,
    /// A caller of a higher band took the slot.
    Preempted,
}

impl WaitOutcome {
    /// Every value, in the order of their discriminants.
    pub const ALL: [WaitOutcome; 7] = [
        WaitOutcome::Served,
        WaitOutcome::BudgetExhausted,
        WaitOutcome::Canceled,
        WaitOutcome::Timeout,
        WaitOutcome::Error,
        WaitOutcome::Deadline,
        WaitOutcome::Preempted,
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
            WaitOutcome::Preempted => "preempted",
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

/// The lot's instruments, resolved to their label values
/// once, so that recording touches only atomics.
#[derive(Clone)]
pub struct LotInstruments {
    /// `atenet_router_parking_active`.
    pub active: IntGauge,
    /// `atenet_router_parking_rejected_total`, by the shed caller's
    /// [`Band`].
    pub rejected: [IntCounter; 3],
    /// `atenet_router_parking_preempted_total`, by the preempted caller's
    /// [`Band`].
    pub preempted: [IntCounter; 3],
    /// `atenet_router_parking_early_rejected_total`.
    pub early_rejected: IntCounter,
    /// `atenet_router_parking_atespace_rejected_total`.
    pub atespace_rejected: IntCounter,
    /// `atenet_router_park_decisions_total`, by [`LotDecision`].
    pub decisions: [IntCounter; 6],
    /// `atenet_router_parking_wait_duration_seconds`, by [`WaitOutcome`]
    /// and [`Band`].
    pub waits: [[Histogram; 3]; 7],
    /// The longest wait recorded since the status page last took it, in
    /// microseconds: a histogram's buckets only bound a wait, and the page's
    /// percentiles must not read past the longest one.
    pub longest_wait_micros: Arc<AtomicU64>,
}

impl LotInstruments {
    fn decision(&self, decision: LotDecision) -> &IntCounter {
        &self.decisions[decision as usize]
    }

    fn wait(&self, outcome: WaitOutcome, band: Band) -> &Histogram {
        &self.waits[outcome as usize][band as usize]
    }
}

/// The bounded set of parked requests.
pub struct ParkingLot {
    max: usize,
    /// Sheddable callers parked at most.
    max_sheddable: usize,
    /// Slots held; changed only under `book`'s lock, read without it.
    active: AtomicUsize,
    book: Mutex<Book>,
    shares: Shares,
    clock: Arc<dyn Clock>,
    instruments: LotInstruments,
    served: Mutex<ServedParks>,
}

/// What the lot has learnt from served parks: the one estimate.
#[derive(Default)]
struct ServedParks {
    /// Exponentially weighted mean of served parks, in seconds.
    mean: Option<f64>,
    /// When the last park was served.
    sampled_at: Option<Instant>,
    /// When a caller was last admitted despite the estimate.
    probed_at: Option<Instant>,
}

/// The slots held, by band, each band's by the order they were taken: the
/// newest of the lowest band is the one a higher band takes.
#[derive(Default)]
struct Book {
    by_band: [BTreeMap<u64, Arc<Ticket>>; 3],
    next_seq: u64,
}

impl Book {
    /// The slot a caller of `band` takes when the lot is full: the newest of
    /// the lowest band below it, taken out of the book.
    fn take_victim(&mut self, band: Band) -> Option<Arc<Ticket>> {
        let mut lower = Band::ALL.into_iter().take_while(|b| *b < band);
        lower.find_map(|b| self.by_band[b as usize].pop_last().map(|(_, ticket)| ticket))
    }
}

/// What the lot's book holds of one slot, and how its holder learns that a
/// higher band took it.
struct Ticket {
    atespace: Box<str>,
    band: Band,
    seq: u64,
    taken: Instant,
    preemption: Mutex<Preemption>,
}

#[derive(Default)]
struct Preemption {
    preempted: bool,
    /// The holder's task, woken when it is preempted.
    waker: Option<Waker>,
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
/// despite the estimate.
pub const PROBE_INTERVAL: Duration = Duration::from_secs(1);
/// Retry-After never promises more than this.
const MAX_RETRY_AFTER_SECS: u64 = 60;

impl ParkingLot {
    /// A lot of `max` slots (`max` > 0; a zero lot means parking is off and
    /// no lot exists at all), of which one atespace may hold
    /// `max_per_atespace` (0: no cap), and sheddable callers at most
    /// `max_sheddable`.
    pub fn new(
        max: usize,
        max_per_atespace: usize,
        max_sheddable: usize,
        clock: Arc<dyn Clock>,
        instruments: LotInstruments,
    ) -> Arc<ParkingLot> {
        Arc::new(ParkingLot {
            max,
            max_sheddable,
            active: AtomicUsize::new(0),
            book: Mutex::new(Book::default()),
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

    /// Slots held now by each band, lowest first.
    pub fn active_by_band(&self) -> [usize; 3] {
        let book = self.book.lock();
        Band::ALL.map(|b| book.by_band[b as usize].len())
    }

    /// How long a parked request has recently taken from park to serve: an
    /// exponentially weighted mean of served parks, so it follows the pool's
    /// current state. `None` before any park was served. The one estimate
    /// behind `Retry-After` and early rejection.
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

    /// Takes a slot for a caller of `atespace` in `band`, or counts the
    /// refusal (B26, B69, B117). Either way the decision is counted. A full
    /// lot gives a lower band's newest slot to a critical or standard
    /// caller (B118): its holder is preempted.
    pub fn try_admit(self: &Arc<Self>, atespace: &str, band: Band) -> Result<Slot, Refusal> {
        let now = self.clock.now();
        if !self.shares.reserve(atespace, now) {
            self.instruments.atespace_rejected.inc();
            self.note_decision(LotDecision::AtespaceFull);
            return Err(Refusal::AtespaceFull);
        }
        let mut book = self.book.lock();
        let held = self.active.load(Ordering::Acquire);
        let over_share = band == Band::Sheddable && book.by_band[band as usize].len() >= self.max_sheddable;
        let victim = if over_share {
            None
        } else if held < self.max {
            self.active.store(held + 1, Ordering::Release);
            self.instruments.active.inc();
            Some(None)
        } else {
            book.take_victim(band).map(Some)
        };
        let Some(victim) = victim else {
            drop(book);
            self.shares.free(atespace, now);
            self.instruments.rejected[band as usize].inc();
            self.note_decision(LotDecision::Shed);
            return Err(Refusal::LotFull);
        };
        let seq = book.next_seq;
        book.next_seq += 1;
        let ticket = Arc::new(Ticket {
            atespace: Box::from(atespace),
            band,
            seq,
            taken: now,
            preemption: Mutex::default(),
        });
        book.by_band[band as usize].insert(seq, Arc::clone(&ticket));
        drop(book);
        self.note_decision(LotDecision::Admitted);
        if let Some(victim) = victim {
            self.preempt(&victim);
        }
        Ok(Slot { lot: Some(Arc::clone(self)), ticket })
    }

    /// Settles a slot a higher band took: already out of the book,
    /// so no other release can happen; its wait is recorded once, here, and
    /// its holder woken to answer its client.
    fn preempt(&self, victim: &Ticket) {
        let now = self.clock.now();
        self.shares.free(&victim.atespace, victim.taken);
        self.instruments.preempted[victim.band as usize].inc();
        self.record_wait(victim, now, WaitOutcome::Preempted);
        let waker = {
            let mut preemption = victim.preemption.lock();
            preemption.preempted = true;
            preemption.waker.take()
        };
        if let Some(waker) = waker {
            waker.wake();
        }
    }

    /// The atespaces holding slots now, most slots first, at most `top`, and
    /// how many hold slots in all.
    pub fn atespaces(&self, top: usize) -> (Vec<AtespaceView>, usize) {
        self.shares.views(self.clock.now(), top)
    }

    /// Frees a slot with `outcome`, unless a higher band took it first:
    /// whoever takes the ticket out of the book settles it. Whether
    /// this call freed it.
    fn free(&self, ticket: &Ticket, outcome: WaitOutcome) -> bool {
        {
            let mut book = self.book.lock();
            if book.by_band[ticket.band as usize].remove(&ticket.seq).is_none() {
                return false;
            }
            // Each admission adds exactly one, and each slot leaves the book
            // once: the counter cannot go below zero.
            self.active.fetch_sub(1, Ordering::AcqRel);
        }
        let now = self.clock.now();
        self.shares.free(&ticket.atespace, ticket.taken);
        self.instruments.active.dec();
        let waited = self.record_wait(ticket, now, outcome);
        if outcome == WaitOutcome::Served {
            self.note_served(waited);
        }
        true
    }

    /// Records one slot's wait (B32, B33); the seconds waited.
    fn record_wait(&self, ticket: &Ticket, now: Instant, outcome: WaitOutcome) -> f64 {
        let waited = now.saturating_duration_since(ticket.taken);
        self.instruments.wait(outcome, ticket.band).observe(waited.as_secs_f64());
        let micros = waited.as_micros().try_into().unwrap_or(u64::MAX);
        self.instruments.longest_wait_micros.fetch_max(micros, Ordering::Relaxed);
        waited.as_secs_f64()
    }
}

/// One caller's place in the lot.
pub struct Slot {
    /// `None` once released.
    lot: Option<Arc<ParkingLot>>,
    ticket: Arc<Ticket>,
}

/// What became of a slot its holder gave back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Release {
    /// Freed now, its wait recorded with the holder's outcome.
    Freed,
    /// A higher band had taken it already: its wait was recorded as
    /// preempted, and the holder's answer is that it was preempted.
    Preempted,
}

impl Slot {
    /// Releases the slot and records the wait with `outcome`,
    /// unless a higher band took it first.
    pub fn release(mut self, outcome: WaitOutcome) -> Release {
        match self.lot.take() {
            Some(lot) if !lot.free(&self.ticket, outcome) => Release::Preempted,
            _ => Release::Freed,
        }
    }

    /// Whether a higher band took this slot; if not, `waker` is woken
    /// when one does.
    pub fn preempted(&self, waker: &Waker) -> bool {
        let mut preemption = self.ticket.preemption.lock();
        if !preemption.preempted && !preemption.waker.as_ref().is_some_and(|w| w.will_wake(waker)) {
            preemption.waker = Some(waker.clone());
        }
        preemption.preempted
    }
}

impl Drop for Slot {
    /// A slot dropped without a result belongs to a caller whose stream went
    /// away (B27, B28).
    fn drop(&mut self) {
        if let Some(lot) = self.lot.take() {
            lot.free(&self.ticket, WaitOutcome::Canceled);
        }
    }
}

/// One atespace on the status page.
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
        ParkingLot::new(max, per_atespace, max, clock, Metrics::new().lot_instruments())
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
        let slot = lot.try_admit("demo", Band::Standard).unwrap();
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
        let probe = lot.try_admit("demo", Band::Standard).unwrap();
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
        let a = lot.try_admit("demo", Band::Standard).unwrap();
        let b = lot.try_admit("demo", Band::Standard).unwrap();
        assert_eq!(
            lot.try_admit("demo", Band::Standard).err(),
            Some(Refusal::LotFull),
            "B26: full lot sheds"
        );
        assert_eq!(m.rejected[Band::Standard as usize].get(), 1);
        assert_eq!(m.active.get(), 2);
        clock.advance(Duration::from_millis(250));
        a.release(WaitOutcome::Served);
        assert_eq!(lot.active(), 1, "B27: released once (release consumes the slot)");
        let served = m.wait(WaitOutcome::Served, Band::Standard);
        assert_eq!(served.get_sample_count(), 1);
        assert!((served.get_sample_sum() - 0.25).abs() < 1e-9, "own parked time");
        assert_eq!(m.wait(WaitOutcome::Error, Band::Standard).get_sample_count(), 0);
        drop(b);
        assert_eq!(lot.active(), 0);
        assert_eq!(m.active.get(), 0);
        assert_eq!(
            m.wait(WaitOutcome::Canceled, Band::Standard).get_sample_count(),
            1,
            "B28: dropped = canceled"
        );
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
        let slot = lot.try_admit("demo", Band::Standard).unwrap();
        clock.advance(Duration::from_millis(3200));
        slot.release(WaitOutcome::Served);
        assert_eq!(lot.estimate(), Some(Duration::from_millis(3200)));
        assert_eq!(lot.retry_after(), 4, "rounded up");
        for _ in 0..40 {
            let slot = lot.try_admit("demo", Band::Standard).unwrap();
            clock.advance(Duration::from_millis(100));
            slot.release(WaitOutcome::Served);
        }
        assert!(lot.estimate().unwrap() < Duration::from_millis(110), "follows the pool as it recovers");
        assert_eq!(lot.retry_after(), 1, "never below 1");
        let slot = lot.try_admit("demo", Band::Standard).unwrap();
        clock.advance(Duration::from_secs(100_000));
        slot.release(WaitOutcome::BudgetExhausted);
        assert_eq!(lot.retry_after(), 1, "only served parks count");
    }

    #[test]
    fn b69_an_atespace_at_its_cap_is_shed_while_others_park() {
        let clock = ManualClock::new();
        let lot = lot(10, 2, Arc::new(clock.clone()));
        let greedy: Vec<Slot> = (0..2).map(|_| lot.try_admit("greedy", Band::Standard).unwrap()).collect();
        clock.advance(Duration::from_secs(3));
        assert_eq!(lot.try_admit("greedy", Band::Standard).err(), Some(Refusal::AtespaceFull));
        assert_eq!(lot.try_admit("greedy", Band::Standard).err(), Some(Refusal::AtespaceFull));
        let polite = lot.try_admit("polite", Band::Standard).unwrap();
        assert_eq!(lot.active(), 3, "a refused atespace holds nothing extra");
        let m = &lot.instruments;
        assert_eq!((m.atespace_rejected.get(), m.rejected[Band::Standard as usize].get()), (2, 0));
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
        let again = lot.try_admit("greedy", Band::Standard).expect("room again once a slot is freed");
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
            let held = lot.try_admit(&tenant, Band::Standard).unwrap();
            assert_eq!(lot.try_admit(&tenant, Band::Standard).err(), Some(Refusal::AtespaceFull));
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
        let held = lot.try_admit("a", Band::Standard).unwrap();
        assert_eq!(lot.try_admit("b", Band::Standard).err(), Some(Refusal::LotFull));
        drop(held);
        assert!(lot.try_admit("b", Band::Standard).is_ok(), "b's failed try left nothing behind");
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
                            lot.try_admit(
                                if i % 2 == 0 { "shared" } else { ["x", "y", "z"][(i + t) % 3] },
                                Band::Standard,
                            )
                            .ok()
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        let slots: Vec<Slot> = handles.into_iter().flat_map(|h| h.join().unwrap()).collect();
        let held = |name: &str| slots.iter().filter(|s| &*s.ticket.atespace == name).count();
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
                    (0..50).filter_map(|_| lot.try_admit("demo", Band::Standard).ok()).collect::<Vec<_>>()
                })
            })
            .collect();
        let slots: Vec<Slot> = handles.into_iter().flat_map(|h| h.join().unwrap()).collect();
        assert_eq!(slots.len(), 100, "exactly K of N > K admitted");
        assert_eq!(lot.instruments.rejected[Band::Standard as usize].get(), 300);
        drop(slots);
        assert_eq!(lot.active(), 0);
        assert_eq!(lot.instruments.active.get(), 0);
    }

    fn banded_lot(max: usize, sheddable: usize, clock: Arc<dyn Clock>) -> Arc<ParkingLot> {
        ParkingLot::new(max, 0, sheddable, clock, Metrics::new().lot_instruments())
    }

    #[test]
    fn b117_sheddable_callers_hold_at_most_their_share_and_are_shed_beyond_it() {
        let lot = banded_lot(4, 1, Arc::new(ManualClock::new()));
        let m = &lot.instruments;
        let first = lot.try_admit("demo", Band::Sheddable).unwrap();
        assert_eq!(lot.try_admit("demo", Band::Sheddable).err(), Some(Refusal::LotFull), "beyond its share");
        assert_eq!(m.rejected[Band::Sheddable as usize].get(), 1);
        assert_eq!(m.decision(LotDecision::Shed).get(), 1);
        let others: Vec<Slot> = (0..3).map(|_| lot.try_admit("demo", Band::Standard).unwrap()).collect();
        assert_eq!(lot.active_by_band(), [1, 3, 0]);
        drop(first);
        assert!(lot.try_admit("demo", Band::Sheddable).is_ok(), "its share is given back");
        drop(others);
        let none = banded_lot(4, 0, Arc::new(ManualClock::new()));
        assert_eq!(none.try_admit("demo", Band::Sheddable).err(), Some(Refusal::LotFull), "0: never parks");
        assert_eq!(none.active(), 0);
    }

    /// A waker that counts its wakes.
    struct Wakes(AtomicUsize);

    impl futures::task::ArcWake for Wakes {
        fn wake_by_ref(this: &Arc<Self>) {
            this.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn b118_a_full_lot_gives_the_newest_slot_of_the_lowest_band_to_a_higher_one() {
        let clock = ManualClock::new();
        let lot = banded_lot(4, 4, Arc::new(clock.clone()));
        let m = &lot.instruments;
        let old_sheddable = lot.try_admit("a", Band::Sheddable).unwrap();
        let new_sheddable = lot.try_admit("b", Band::Sheddable).unwrap();
        let standards: Vec<Slot> = (0..2).map(|_| lot.try_admit("c", Band::Standard).unwrap()).collect();
        let wakes = Arc::new(Wakes(AtomicUsize::new(0)));
        let waker = futures::task::waker(Arc::clone(&wakes));
        assert!(!new_sheddable.preempted(&waker) && !old_sheddable.preempted(&waker));
        clock.advance(Duration::from_millis(700));
        assert_eq!(lot.try_admit("d", Band::Sheddable).err(), Some(Refusal::LotFull), "no lower band");
        let critical = lot.try_admit("d", Band::Critical).expect("takes a lower band's slot");
        assert!(new_sheddable.preempted(&waker), "the newest of the lowest band");
        assert!(!old_sheddable.preempted(&waker));
        assert_eq!(wakes.0.load(Ordering::SeqCst), 1, "its holder is woken");
        assert_eq!(lot.active(), 4, "the slot changed hands: the lot holds its size");
        assert_eq!(lot.active_by_band(), [1, 2, 1]);
        let preempted = m.wait(WaitOutcome::Preempted, Band::Sheddable);
        assert_eq!(preempted.get_sample_count(), 1);
        assert!((preempted.get_sample_sum() - 0.7).abs() < 1e-9, "its own parked time");
        assert_eq!(m.preempted[Band::Sheddable as usize].get(), 1);
        assert_eq!(new_sheddable.release(WaitOutcome::Served), Release::Preempted, "settled already");
        assert_eq!(preempted.get_sample_count(), 1, "recorded once");
        assert_eq!(m.wait(WaitOutcome::Served, Band::Sheddable).get_sample_count(), 0);
        assert_eq!(lot.atespaces(20).0.iter().find(|v| v.atespace == "b"), None, "its share freed");
        let standard = lot.try_admit("e", Band::Standard).expect("a standard caller takes the other one");
        assert!(old_sheddable.preempted(&waker));
        assert_eq!(lot.try_admit("f", Band::Standard).err(), Some(Refusal::LotFull), "not its own band");
        assert_eq!(m.rejected[Band::Standard as usize].get(), 1);
        let second = lot.try_admit("f", Band::Critical).expect("a critical caller takes a standard slot");
        assert_eq!(lot.active_by_band(), [0, 2, 2]);
        let more: Vec<Slot> = (0..2).map(|_| lot.try_admit("g", Band::Critical).unwrap()).collect();
        assert_eq!(lot.active_by_band(), [0, 0, 4]);
        assert_eq!(lot.try_admit("g", Band::Critical).err(), Some(Refusal::LotFull), "no lower band left");
        assert_eq!(m.wait(WaitOutcome::Preempted, Band::Standard).get_sample_count(), 3);
        drop((old_sheddable, standards, critical, standard, second, more));
        assert_eq!((lot.active(), m.active.get()), (0, 0));
        let waits: u64 = m.waits.iter().flatten().map(Histogram::get_sample_count).sum();
        assert_eq!(waits, 9, "every slot taken recorded exactly once");
        assert_eq!(lot.atespaces(20), (vec![], 0));
    }

    #[test]
    fn b29_b118_exact_admission_and_one_settlement_per_slot_under_concurrency() {
        let lot = banded_lot(16, 8, Arc::new(crate::parking::clock::SystemClock));
        let barrier = Arc::new(std::sync::Barrier::new(6));
        let handles: Vec<_> = (0..6)
            .map(|t| {
                let (lot, barrier) = (Arc::clone(&lot), Arc::clone(&barrier));
                std::thread::spawn(move || {
                    barrier.wait();
                    let (mut admitted, mut held) = (0u64, Vec::new());
                    for i in 0..400 {
                        let band = Band::ALL[(i + t) % 3];
                        if let Ok(slot) = lot.try_admit("demo", band) {
                            admitted += 1;
                            held.push(slot);
                        }
                        assert!(lot.active() <= 16, "never more than the lot");
                        if i % 3 == 0 && !held.is_empty() {
                            held.swap_remove(i % held.len()).release(WaitOutcome::Served);
                        }
                    }
                    admitted
                })
            })
            .collect();
        let admitted: u64 = handles.into_iter().map(|h| h.join().unwrap()).sum();
        let m = &lot.instruments;
        assert_eq!((lot.active(), m.active.get()), (0, 0));
        let waits: u64 = m.waits.iter().flatten().map(Histogram::get_sample_count).sum();
        assert_eq!(waits, admitted, "each slot settled exactly once, preempted or released");
        assert!(m.preempted.iter().map(IntCounter::get).sum::<u64>() > 0, "preemption raced releases");
        assert_eq!(lot.active_by_band(), [0, 0, 0]);
    }
}
