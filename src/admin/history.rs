//! The status page's last ten minutes (B91): a ring of [`CAPACITY`]
//! samples, one every [`SAMPLE_INTERVAL`], that its charts draw.
//!
//! Sampling reads only what the router keeps anyway: the lot's slot count,
//! the verdicts [`RecentRequests`] counts under the lock it already takes
//! for every request, and the buckets of the parked-wait histogram (B32).
//! So the request path does nothing more for the charts, and no thread is
//! added: the samples are taken by one task on the timer thread that
//! schedules its own successor, a few microseconds every two seconds. They
//! are taken whether anyone looks or not, so that the page shows the ten
//! minutes before an operator opened it (sampling when the page renders
//! would show nothing of an incident nobody was watching). The ring is
//! allocated once, whole: memory is the same at startup and a week later.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::parking::clock::Clock;
use crate::parking::lot::ParkingLot;
use crate::parking::timer::Scheduler;
use crate::telemetry::metrics::Metrics;
use crate::telemetry::recent::{RecentRequests, VerdictKind};

/// How often a sample is taken: the page's own refresh period, so that
/// every refresh shows one new point.
pub const SAMPLE_INTERVAL: Duration = Duration::from_secs(2);
/// How far back the charts reach.
pub const WINDOW: Duration = Duration::from_secs(600);
/// Samples kept: the window at the sampling interval.
pub const CAPACITY: usize = (WINDOW.as_secs() / SAMPLE_INTERVAL.as_secs()) as usize;
/// The percentiles of parked waits each sample keeps.
pub const WAIT_QUANTILES: [f64; 3] = [0.5, 0.9, 0.99];

/// The router at one sampling instant.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    pub at: Instant,
    /// Lot slots held at that instant.
    pub parked: usize,
    /// Verdicts given since the sample before, per second, by
    /// [`VerdictKind`].
    pub verdicts_per_second: [f64; VerdictKind::ALL.len()],
    /// [`WAIT_QUANTILES`] of the parked waits that ended since the sample
    /// before, in seconds; `None` when none ended.
    pub waits: Option<[f64; WAIT_QUANTILES.len()]>,
}

/// The last [`CAPACITY`] samples, oldest first.
pub struct History {
    samples: Mutex<VecDeque<Sample>>,
}

impl Default for History {
    fn default() -> History {
        History { samples: Mutex::new(VecDeque::with_capacity(CAPACITY)) }
    }
}

impl History {
    /// A copy of the samples, oldest first.
    pub fn samples(&self) -> Vec<Sample> {
        self.samples.lock().iter().cloned().collect()
    }

    fn push(&self, sample: Sample) {
        let mut samples = self.samples.lock();
        if samples.len() == CAPACITY {
            samples.pop_front();
        }
        samples.push_back(sample);
    }
}

/// What a sample is read from.
pub struct Sources {
    /// `None` with parking off: nothing parks, nothing waits.
    pub lot: Option<Arc<ParkingLot>>,
    pub recent: Arc<RecentRequests>,
    pub metrics: Metrics,
    pub clock: Arc<dyn Clock>,
}

/// The counters at the previous sample, which the next one takes its
/// differences from.
struct Totals {
    at: Instant,
    verdicts: [u64; VerdictKind::ALL.len()],
    /// Cumulative counts of the wait histogram's buckets, `+Inf` last.
    waits: Vec<u64>,
}

/// Takes samples into a [`History`].
pub struct Sampler {
    history: Arc<History>,
    sources: Sources,
    last: Option<Totals>,
}

impl Sampler {
    pub fn new(history: Arc<History>, sources: Sources) -> Sampler {
        Sampler { history, sources, last: None }
    }

    /// Takes one sample. The first has no interval to count over: it says
    /// nothing was given, which is true of a router that has just started.
    pub fn sample(&mut self) {
        let now = self.sources.clock.now();
        let (bounds, waits) = self.sources.metrics.parked_wait_buckets();
        let longest = self.sources.metrics.take_longest_parked_wait().as_secs_f64();
        let totals = Totals { at: now, verdicts: self.sources.recent.verdict_counts(), waits };
        let (verdicts_per_second, waits) = match &self.last {
            None => ([0.0; VerdictKind::ALL.len()], None),
            Some(last) => {
                let seconds = now.saturating_duration_since(last.at).as_secs_f64().max(1e-3);
                let rates = std::array::from_fn(|i| {
                    totals.verdicts[i].saturating_sub(last.verdicts[i]) as f64 / seconds
                });
                let ended: Vec<u64> = totals
                    .waits
                    .iter()
                    .zip(&last.waits)
                    .map(|(now, then)| now.saturating_sub(*then))
                    .collect();
                (rates, quantiles(bounds, &ended, longest))
            }
        };
        let parked = self.sources.lot.as_ref().map_or(0, |lot| lot.active());
        self.history.push(Sample { at: now, parked, verdicts_per_second, waits });
        self.last = Some(totals);
    }

    /// Samples now and then every [`SAMPLE_INTERVAL`] on `scheduler`, for
    /// as long as it runs (the timer thread drops the pending task when it
    /// stops).
    pub fn start(mut self, scheduler: Arc<dyn Scheduler>) {
        self.sample();
        let due = self.sources.clock.now() + SAMPLE_INTERVAL;
        self.schedule(scheduler, due);
    }

    fn schedule(mut self, scheduler: Arc<dyn Scheduler>, due: Instant) {
        let next = Arc::clone(&scheduler);
        scheduler.schedule(
            due,
            Box::new(move || {
                self.sample();
                // On the grid of the first sample, unless the timer fell a
                // whole interval behind: then from now, without a burst.
                let now = self.sources.clock.now();
                let due =
                    if due + SAMPLE_INTERVAL > now { due + SAMPLE_INTERVAL } else { now + SAMPLE_INTERVAL };
                self.schedule(next, due);
            }),
        );
    }
}

/// [`WAIT_QUANTILES`] of the observations counted in `cumulative` (a
/// histogram's cumulative bucket counts for `bounds`, then `+Inf`),
/// interpolated linearly within a bucket as Prometheus' `histogram_quantile`
/// does, but never past `longest`, the longest wait observed (a bucket's
/// upper bound is only a bound: 5 s waits in the 5-10 s bucket read as up
/// to 10 s otherwise); one in the `+Inf` bucket counts as the highest
/// bound. `None` without observations.
pub fn quantiles(bounds: &[f64], cumulative: &[u64], longest: f64) -> Option<[f64; WAIT_QUANTILES.len()]> {
    let total = *cumulative.last()?;
    if total == 0 {
        return None;
    }
    Some(WAIT_QUANTILES.map(|q| {
        let rank = q * total as f64;
        let Some(bucket) = cumulative.iter().position(|&n| n as f64 >= rank) else {
            return bounds.last().copied().unwrap_or(0.0);
        };
        let Some(&upper) = bounds.get(bucket) else {
            return bounds.last().copied().unwrap_or(0.0).max(longest);
        };
        let (lower, below) = match bucket {
            0 => (0.0, 0),
            b => (bounds[b - 1], cumulative[b - 1]),
        };
        let upper = upper.min(longest.max(lower));
        let inside = cumulative[bucket] - below;
        if inside == 0 {
            return upper;
        }
        lower + (upper - lower) * (rank - below as f64) / inside as f64
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parking::band::Band;
    use crate::parking::clock::ManualClock;
    use crate::parking::lot::WaitOutcome;
    use crate::parking::timer::ManualScheduler;
    use crate::telemetry::recent::{Answered, RecentVerdict};

    fn answered(verdict: RecentVerdict) -> Answered<'static> {
        Answered {
            method: b"GET",
            path: b"/",
            actor: "demo/a",
            verdict,
            target: "",
            duration: Duration::ZERO,
        }
    }

    struct Rig {
        clock: ManualClock,
        scheduler: ManualScheduler,
        lot: Arc<ParkingLot>,
        recent: Arc<RecentRequests>,
        history: Arc<History>,
    }

    fn rig() -> Rig {
        let clock = ManualClock::new();
        let scheduler = ManualScheduler::new(clock.clone());
        let metrics = Metrics::new();
        let lot = ParkingLot::new(100, 0, 100, Arc::new(clock.clone()), metrics.lot_instruments());
        let recent = Arc::new(RecentRequests::default());
        let history = Arc::new(History::default());
        let sources = Sources {
            lot: Some(Arc::clone(&lot)),
            recent: Arc::clone(&recent),
            metrics,
            clock: Arc::new(clock.clone()),
        };
        Sampler::new(Arc::clone(&history), sources).start(Arc::new(scheduler.clone()));
        Rig { clock, scheduler, lot, recent, history }
    }

    #[test]
    fn b91_samples_every_interval_on_the_scheduler_into_a_fixed_ring() {
        let r = rig();
        assert_eq!(r.history.samples().len(), 1, "one sample at the start");
        r.scheduler.advance(SAMPLE_INTERVAL * 3);
        let samples = r.history.samples();
        assert_eq!(samples.len(), 4);
        assert!(samples.windows(2).all(|w| w[1].at - w[0].at == SAMPLE_INTERVAL), "on the interval's grid");
        assert_eq!(r.scheduler.pending(), 1, "one task waits for the next sample, never more");
        // A day of samples later: still the window, and nothing more.
        r.scheduler.advance(Duration::from_secs(24 * 3600));
        let samples = r.history.samples();
        assert_eq!(samples.len(), CAPACITY);
        assert_eq!(samples.last().unwrap().at - samples[0].at, WINDOW - SAMPLE_INTERVAL);
        assert_eq!(r.history.samples.lock().capacity(), CAPACITY, "the ring never grew");
        assert_eq!(r.scheduler.pending(), 1);
    }

    #[test]
    fn b91_a_sample_counts_verdicts_by_kind_and_slots_held_over_its_interval() {
        let r = rig();
        let verdicts = [
            (RecentVerdict::Routed, 8),
            (RecentVerdict::Rejected { status: 503, reason: "atenet_lot_full" }, 2),
            (RecentVerdict::Rejected { status: 503, reason: "atenet_atespace_full" }, 1),
            (RecentVerdict::Rejected { status: 503, reason: "atenet_flights_full" }, 1),
            (RecentVerdict::Rejected { status: 503, reason: "atenet_budget_exhausted" }, 4),
            (RecentVerdict::Rejected { status: 404, reason: "atenet_not_found" }, 6),
        ];
        for (verdict, n) in verdicts {
            (0..n).for_each(|_| r.recent.record(answered(verdict)));
        }
        let held: Vec<_> = (0..3).map(|_| r.lot.try_admit("demo", Band::Standard).unwrap()).collect();
        r.scheduler.advance(SAMPLE_INTERVAL);
        let last = r.history.samples().pop().unwrap();
        // Per second over the 2 s interval: routed 8, shed 4, budget 4, errors 6.
        assert_eq!(last.verdicts_per_second, [4.0, 2.0, 2.0, 3.0]);
        assert_eq!(last.parked, 3);
        assert_eq!(last.waits, None, "no parked wait ended");
        r.scheduler.advance(SAMPLE_INTERVAL);
        assert_eq!(
            r.history.samples().pop().unwrap().verdicts_per_second,
            [0.0; 4],
            "differences, not totals"
        );
        drop(held);
    }

    #[test]
    fn b91_wait_percentiles_are_those_of_the_waits_that_ended_in_the_interval() {
        let r = rig();
        // Ten waits end in the first interval: nine of 0.3 s, one of 1.5 s.
        let mut slots: Vec<_> = (0..10).map(|_| r.lot.try_admit("demo", Band::Standard).unwrap()).collect();
        r.clock.advance(Duration::from_millis(300));
        slots.drain(..9).for_each(|slot| {
            slot.release(WaitOutcome::Served);
        });
        r.clock.advance(Duration::from_millis(1200));
        slots.pop().unwrap().release(WaitOutcome::BudgetExhausted);
        r.scheduler.advance(Duration::from_millis(500));
        let [p50, p90, p99] = r.history.samples().pop().unwrap().waits.expect("waits ended");
        // Buckets (0.25, 0.5] and (1, 2.5]: ranks 5 and 9 fall among the
        // nine, rank 9.9 on the one.
        assert!((0.25..=0.5).contains(&p50) && p90 == 0.5, "{p50} {p90}");
        assert!((1.0..=2.5).contains(&p99), "{p99}");
        // A later interval counts only its own: one wait of 20 ms.
        let slot = r.lot.try_admit("demo", Band::Standard).unwrap();
        r.clock.advance(Duration::from_millis(20));
        slot.release(WaitOutcome::Canceled);
        r.scheduler.advance(SAMPLE_INTERVAL);
        let waits = r.history.samples().pop().unwrap().waits.unwrap();
        assert!(
            waits.iter().all(|w| (0.01..=0.025).contains(w)),
            "every outcome counts, only this interval's: {waits:?}"
        );
    }

    #[test]
    fn quantiles_interpolate_within_a_bucket_as_prometheus_does() {
        let bounds = [1.0, 2.0, 4.0];
        // 10 in (0, 1], 10 in (1, 2], none in (2, 4], 0 in +Inf.
        assert_eq!(quantiles(&bounds, &[10, 20, 20, 20], 2.0), Some([1.0, 1.8, 1.98]));
        assert_eq!(quantiles(&bounds, &[0, 0, 0, 0], 0.0), None);
        assert_eq!(quantiles(&bounds, &[], 0.0), None);
        // Everything beyond the last bound: the longest wait.
        assert_eq!(quantiles(&bounds, &[0, 0, 0, 5], 7.5), Some([7.5; 3]));
    }

    #[test]
    fn b91_percentiles_never_read_past_the_longest_wait() {
        // Ten waits of 5 s in the (4, 10] bucket: interpolating to the
        // bucket's bound read p99 as 9.94 s (seen on the page: 9.2-9.95 s
        // with a longest wait of 5 s).
        let bounds = [1.0, 4.0, 10.0];
        let [p50, p90, p99] = quantiles(&bounds, &[0, 0, 10, 10], 5.0).unwrap();
        assert!(p50 <= 5.0 && p90 <= 5.0 && p99 <= 5.0, "{p50} {p90} {p99}");
        assert!(p50 > 4.0, "still inside the bucket: {p50}");
    }
}
