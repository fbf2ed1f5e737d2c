//! The parking lot: a fixed number of slots for parked requests (B23-B30).
//!
//! Admission is a compare-and-swap on one counter, so with max K and any
//! number of callers racing, exactly K are admitted (B29) without a lock.
//! A [`Slot`] is a guard: it is released exactly once, by
//! [`Slot::release`] (which consumes it) or on drop, and records that
//! caller's own parked time (B27, B32).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;
use prometheus::{Histogram, IntCounter, IntGauge};

use crate::clock::Clock;

/// How a parked caller's wait ended (B33); the `outcome` label of
/// `atenet_router_parking_wait_duration_seconds`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WaitOutcome {
    Served,
    BudgetExhausted,
    Canceled,
    Timeout,
    Error,
}

impl WaitOutcome {
    /// Every value, in the order of their discriminants.
    pub const ALL: [WaitOutcome; 5] = [
        WaitOutcome::Served,
        WaitOutcome::BudgetExhausted,
        WaitOutcome::Canceled,
        WaitOutcome::Timeout,
        WaitOutcome::Error,
    ];

    /// The label value.
    pub fn name(self) -> &'static str {
        match self {
            WaitOutcome::Served => "served",
            WaitOutcome::BudgetExhausted => "budget_exhausted",
            WaitOutcome::Canceled => "canceled",
            WaitOutcome::Timeout => "timeout",
            WaitOutcome::Error => "error",
        }
    }
}

/// What happened to a caller at its lot decision, counted in
/// `atenet_router_park_decisions_total` so that every caller that reached
/// the lot is accounted for exactly once (B55).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LotDecision {
    /// Served without a slot: on the first attempt, or finished just before
    /// taking one (B24).
    Fast,
    /// Took a slot.
    Admitted,
    /// Shed: the lot was full (B26).
    Shed,
    /// Went away before a decision was needed.
    Left,
}

impl LotDecision {
    /// Every value, in the order of their discriminants.
    pub const ALL: [LotDecision; 4] = [LotDecision::Fast, LotDecision::Admitted, LotDecision::Shed, LotDecision::Left];

    /// The label value.
    pub fn name(self) -> &'static str {
        match self {
            LotDecision::Fast => "fast",
            LotDecision::Admitted => "admitted",
            LotDecision::Shed => "shed",
            LotDecision::Left => "left",
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
    /// `atenet_router_park_decisions_total`, by [`LotDecision`].
    pub decisions: [IntCounter; 4],
    /// `atenet_router_parking_wait_duration_seconds`, by [`WaitOutcome`].
    pub waits: [Histogram; 5],
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
    clock: Arc<dyn Clock>,
    instruments: LotInstruments,
    /// Exponentially weighted mean of served parks, in seconds.
    served_wait: Mutex<Option<f64>>,
}

/// Weight of the newest sample in [`ParkingLot::retry_after`]'s mean.
const SERVED_WAIT_ALPHA: f64 = 0.2;
/// Retry-After never promises more than this.
const MAX_RETRY_AFTER_SECS: u64 = 60;

impl ParkingLot {
    /// A lot of `max` slots (`max` > 0; a zero lot means parking is off and
    /// no lot exists at all, B22).
    pub fn new(max: usize, clock: Arc<dyn Clock>, instruments: LotInstruments) -> Arc<ParkingLot> {
        Arc::new(ParkingLot { max, active: AtomicUsize::new(0), clock, instruments, served_wait: Mutex::new(None) })
    }

    /// Slots held now.
    pub fn active(&self) -> usize {
        self.active.load(Ordering::Acquire)
    }

    /// The `Retry-After` seconds for a capacity 503 (B48): how long a parked
    /// request has recently taken from park to serve (an exponentially
    /// weighted mean, so it follows the pool's current state), rounded up,
    /// at least 1 and at most 60. Before any park has been served: 1.
    pub fn retry_after(&self) -> u64 {
        let mean = self.served_wait.lock().unwrap_or(0.0);
        (mean.ceil() as u64).clamp(1, MAX_RETRY_AFTER_SECS)
    }

    fn note_served(&self, waited: f64) {
        let mut mean = self.served_wait.lock();
        *mean = Some(match *mean {
            None => waited,
            Some(m) => m + SERVED_WAIT_ALPHA * (waited - m),
        });
    }

    /// Counts a caller's lot decision.
    pub fn note_decision(&self, decision: LotDecision) {
        self.instruments.decision(decision).inc();
    }

    /// Takes a slot, or counts a rejection and returns `None` when the lot is
    /// full (B26). Either way the decision is counted.
    pub fn try_admit(self: &Arc<Self>) -> Option<Slot> {
        let admitted = self
            .active
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < self.max).then_some(n + 1))
            .is_ok();
        if !admitted {
            self.instruments.rejected.inc();
            self.note_decision(LotDecision::Shed);
            return None;
        }
        self.note_decision(LotDecision::Admitted);
        self.instruments.active.inc();
        Some(Slot { lot: Some(Arc::clone(self)), taken: self.clock.now() })
    }

    fn free(&self, taken: Instant, outcome: WaitOutcome) {
        let waited = self.clock.now().saturating_duration_since(taken).as_secs_f64();
        // The counter cannot go below zero: each admission adds exactly one,
        // and each slot frees once.
        self.active.fetch_sub(1, Ordering::AcqRel);
        self.instruments.active.dec();
        self.instruments.wait(outcome).observe(waited);
        if outcome == WaitOutcome::Served {
            self.note_served(waited);
        }
    }
}

/// One caller's place in the lot.
pub struct Slot {
    /// `None` once released.
    lot: Option<Arc<ParkingLot>>,
    taken: Instant,
}

impl Slot {
    /// Releases the slot and records the wait with `outcome` (B32, B33).
    pub fn release(mut self, outcome: WaitOutcome) {
        if let Some(lot) = self.lot.take() {
            lot.free(self.taken, outcome);
        }
    }
}

impl Drop for Slot {
    /// A slot dropped without a result belongs to a caller whose stream went
    /// away (B27, B28).
    fn drop(&mut self) {
        if let Some(lot) = self.lot.take() {
            lot.free(self.taken, WaitOutcome::Canceled);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use crate::metrics::Metrics;
    use std::time::Duration;

    fn lot(max: usize, clock: Arc<dyn Clock>) -> Arc<ParkingLot> {
        ParkingLot::new(max, clock, Metrics::new().lot_instruments())
    }

    #[test]
    fn labels_are_listed_in_discriminant_order() {
        assert!(WaitOutcome::ALL.iter().enumerate().all(|(i, o)| *o as usize == i));
        assert!(LotDecision::ALL.iter().enumerate().all(|(i, d)| *d as usize == i));
    }

    #[test]
    fn b26_b27_admission_release_once_and_wait_sample() {
        let clock = ManualClock::new();
        let lot = lot(2, Arc::new(clock.clone()));
        let m = &lot.instruments;
        let a = lot.try_admit().unwrap();
        let b = lot.try_admit().unwrap();
        assert!(lot.try_admit().is_none(), "B26: full lot sheds");
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
    }

    #[test]
    fn retry_after_follows_recent_served_parks() {
        let clock = ManualClock::new();
        let lot = lot(4, Arc::new(clock.clone()));
        assert_eq!(lot.retry_after(), 1, "nothing observed yet");
        let slot = lot.try_admit().unwrap();
        clock.advance(Duration::from_millis(3200));
        slot.release(WaitOutcome::Served);
        assert_eq!(lot.retry_after(), 4, "rounded up");
        for _ in 0..40 {
            let slot = lot.try_admit().unwrap();
            clock.advance(Duration::from_millis(100));
            slot.release(WaitOutcome::Served);
        }
        assert_eq!(lot.retry_after(), 1, "follows the pool as it recovers; never below 1");
        let slot = lot.try_admit().unwrap();
        clock.advance(Duration::from_secs(100_000));
        slot.release(WaitOutcome::BudgetExhausted);
        assert_eq!(lot.retry_after(), 1, "only served parks count");
    }

    #[test]
    fn b29_exact_admission_under_concurrency() {
        let lot = lot(100, Arc::new(crate::clock::SystemClock));
        let barrier = Arc::new(std::sync::Barrier::new(8));
        let handles: Vec<_> = (0..8)
            .map(|_| {
                let (lot, barrier) = (Arc::clone(&lot), Arc::clone(&barrier));
                std::thread::spawn(move || {
                    barrier.wait();
                    (0..50).filter_map(|_| lot.try_admit()).collect::<Vec<_>>()
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
