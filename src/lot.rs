//! The parking lot: a fixed number of slots for parked requests (B23-B30).
//!
//! Admission is a compare-and-swap on one counter, so with max K and any
//! number of callers racing, exactly K are admitted (B29) without a lock.
//! A [`Slot`] is a guard: it releases exactly once, on its explicit
//! [`Slot::release`] or on drop, and records that caller's own parked time
//! (B27, B32).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;

use crate::clock::Clock;
use crate::metrics::{Metrics, WaitOutcome};

/// The bounded set of parked requests.
pub struct ParkingLot {
    max: usize,
    active: AtomicUsize,
    clock: Arc<dyn Clock>,
    metrics: Metrics,
    /// Exponentially weighted mean of served parks, in seconds.
    served_wait: Mutex<Option<f64>>,
}

/// What happened to a caller at its lot decision, counted in
/// `atenet_router_park_decisions_total` so that every caller that reached
/// the lot is accounted for exactly once.
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
    pub fn label(self) -> &'static str {
        match self {
            LotDecision::Fast => "fast",
            LotDecision::Admitted => "admitted",
            LotDecision::Shed => "shed",
            LotDecision::Left => "left",
        }
    }
}

/// Weight of the newest sample in [`ParkingLot::retry_after`]'s mean.
const SERVED_WAIT_ALPHA: f64 = 0.2;
/// Retry-After never promises more than this.
const MAX_RETRY_AFTER_SECS: u64 = 60;

impl ParkingLot {
    /// A lot of `max` slots (`max` > 0; a zero lot means parking is off and
    /// no lot exists at all, B22).
    pub fn new(max: usize, clock: Arc<dyn Clock>, metrics: Metrics) -> Arc<ParkingLot> {
        Arc::new(ParkingLot {
            max,
            active: AtomicUsize::new(0),
            clock,
            metrics,
            served_wait: Mutex::new(None),
        })
    }

    /// Slots held now.
    pub fn active(&self) -> usize {
        self.active.load(Ordering::Acquire)
    }

    /// The capacity.
    pub fn max(&self) -> usize {
        self.max
    }

    /// The `Retry-After` seconds for a capacity 503: how long a parked
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
        self.metrics.decision(decision).inc();
    }

    /// Takes a slot, or counts a rejection and returns `None` when the lot is
    /// full (B26).
    pub fn try_admit(self: &Arc<Self>) -> Option<Slot> {
        let admitted = self
            .active
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < self.max).then_some(n + 1))
            .is_ok();
        if !admitted {
            self.metrics.parking_rejected.inc();
            self.note_decision(LotDecision::Shed);
            return None;
        }
        self.note_decision(LotDecision::Admitted);
        self.metrics.parking_active.inc();
        Some(Slot { lot: Arc::clone(self), taken: self.clock.now(), released: false })
    }
}

/// One caller's place in the lot.
pub struct Slot {
    lot: Arc<ParkingLot>,
    taken: Instant,
    released: bool,
}

impl Slot {
    /// Releases the slot and records the wait with `outcome` (B32, B33).
    /// Later releases, including the one on drop, do nothing.
    pub fn release(&mut self, outcome: WaitOutcome) {
        if std::mem::replace(&mut self.released, true) {
            return;
        }
        let waited = self.lot.clock.now().saturating_duration_since(self.taken);
        // The counter cannot go below zero: each admission adds exactly one.
        self.lot.active.fetch_sub(1, Ordering::AcqRel);
        self.lot.metrics.parking_active.dec();
        self.lot.metrics.wait(outcome).observe(waited.as_secs_f64());
        if outcome == WaitOutcome::Served {
            self.lot.note_served(waited.as_secs_f64());
        }
    }
}

impl Drop for Slot {
    /// A slot dropped without a result belongs to a caller whose stream went
    /// away (B27, B28).
    fn drop(&mut self) {
        self.release(WaitOutcome::Canceled);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use std::time::Duration;

    #[test]
    fn b26_b27_admission_release_once_and_wait_sample() {
        let clock = ManualClock::new();
        let metrics = Metrics::new();
        let lot = ParkingLot::new(2, Arc::new(clock.clone()), metrics.clone());
        let mut a = lot.try_admit().unwrap();
        let b = lot.try_admit().unwrap();
        assert!(lot.try_admit().is_none(), "B26: full lot sheds");
        assert_eq!(metrics.parking_rejected.get(), 1);
        assert_eq!(metrics.parking_active.get(), 2);
        clock.advance(Duration::from_millis(250));
        a.release(WaitOutcome::Served);
        a.release(WaitOutcome::Error);
        drop(a);
        assert_eq!(lot.active(), 1, "B27: double release is a no-op");
        let served = metrics.wait(WaitOutcome::Served);
        assert_eq!(served.get_sample_count(), 1);
        assert!((served.get_sample_sum() - 0.25).abs() < 1e-9, "own parked time");
        assert_eq!(metrics.wait(WaitOutcome::Error).get_sample_count(), 0);
        drop(b);
        assert_eq!(lot.active(), 0);
        assert_eq!(metrics.parking_active.get(), 0);
        assert_eq!(metrics.wait(WaitOutcome::Canceled).get_sample_count(), 1, "B28: dropped = canceled");
    }

    #[test]
    fn retry_after_follows_recent_served_parks() {
        let clock = ManualClock::new();
        let lot = ParkingLot::new(4, Arc::new(clock.clone()), Metrics::new());
        assert_eq!(lot.retry_after(), 1, "nothing observed yet");
        let mut slot = lot.try_admit().unwrap();
        clock.advance(Duration::from_millis(3200));
        slot.release(WaitOutcome::Served);
        assert_eq!(lot.retry_after(), 4, "rounded up");
        for _ in 0..40 {
            let mut slot = lot.try_admit().unwrap();
            clock.advance(Duration::from_millis(100));
            slot.release(WaitOutcome::Served);
        }
        assert_eq!(lot.retry_after(), 1, "follows the pool as it recovers; never below 1");
        let mut slot = lot.try_admit().unwrap();
        clock.advance(Duration::from_secs(100_000));
        slot.release(WaitOutcome::BudgetExhausted);
        assert_eq!(lot.retry_after(), 1, "only served parks count");
    }

    #[test]
    fn b29_exact_admission_under_concurrency() {
        let metrics = Metrics::new();
        let lot = ParkingLot::new(100, Arc::new(crate::clock::SystemClock), metrics.clone());
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
        assert_eq!(metrics.parking_rejected.get(), 300);
        drop(slots);
        assert_eq!(lot.active(), 0);
        assert_eq!(metrics.parking_active.get(), 0);
    }
}
