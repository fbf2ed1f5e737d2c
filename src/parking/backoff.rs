//! Retry delays for a parked flight (B17), and whether saturated flights
//! retry alone or in groups (B114).
//!
//! After the k-th retryable failure the flight waits `d_k * (1 + U[0, jitter))`
//! with `d_1 = interval` and `d_{k+1} = d_k * factor`. There is deliberately no
//! cap and no attempt limit: only the budget ends retries, so a cap would only
//! change how densely the last part of the budget is probed.

use std::time::Duration;

/// The retry schedule's parameters, already normalised by config (B38).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BackoffPolicy {
    pub interval: Duration,
    pub factor: f64,
    pub jitter: f64,
}

/// One flight's position in its retry schedule.
#[derive(Clone, Debug)]
pub struct Backoff {
    policy: BackoffPolicy,
    next_base: Duration,
}

impl Backoff {
    /// A schedule whose first delay is `policy.interval`.
    pub fn new(policy: BackoffPolicy) -> Backoff {
        Backoff { policy, next_base: policy.interval }
    }

    /// The delay before the next attempt, given a uniform sample in `[0, 1)`.
    /// The sample is a parameter so tests can pin it.
    pub fn next_delay(&mut self, unit_sample: f64) -> Duration {
        let base = self.next_base;
        self.next_base = scaled(base, self.policy.factor.max(1.0));
        scaled(base, 1.0 + self.policy.jitter * unit_sample)
    }

    /// The delay before the next attempt with a fresh random sample.
    pub fn next_random_delay(&mut self) -> Duration {
        self.next_delay(fastrand::f64())
    }

    /// As [`Backoff::next_delay`], but the base stops growing at
    /// `cap_intervals` intervals (a saturation group's delay, B110); the
    /// jitter still applies on top.
    pub fn next_delay_capped(&mut self, unit_sample: f64, cap_intervals: u32) -> Duration {
        let cap = scaled(self.policy.interval, f64::from(cap_intervals.max(1)));
        self.next_base = self.next_base.min(cap);
        let delay = self.next_delay(unit_sample);
        self.next_base = self.next_base.min(cap);
        delay
    }

    /// [`Backoff::next_delay_capped`] with a fresh random sample.
    pub fn next_random_delay_capped(&mut self, cap_intervals: u32) -> Duration {
        self.next_delay_capped(fastrand::f64(), cap_intervals)
    }

    /// Starts the schedule again from one interval.
    pub fn reset(&mut self) {
        self.next_base = self.policy.interval;
    }
}

/// How parked flights retry (`--parked-request-dispatch`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dispatch {
    /// Flights waiting on a full pool or an unavailable control plane wait
    /// in saturation groups (B109); the default.
    SaturationGroup,
    /// Every flight retries on its own backoff (B17), as before B109.
    PerFlight,
}

impl Dispatch {
    /// The flag's value for this mode.
    pub fn name(self) -> &'static str {
        match self {
            Dispatch::SaturationGroup => "saturation-group",
            Dispatch::PerFlight => "per-flight",
        }
    }

    /// The mode a flag value names.
    pub fn parse(value: &str) -> Option<Dispatch> {
        [Dispatch::SaturationGroup, Dispatch::PerFlight].into_iter().find(|d| d.name() == value)
    }
}

/// Keeps the arithmetic finite: no budget comes near a day, so a delay this
/// long only ever means "after the deadline".
const MAX_DELAY: Duration = Duration::from_secs(86_400);

/// `d * factor`, saturating at [`MAX_DELAY`]. Computed in floating point and
/// compared before converting back, because `Duration::mul_f64` panics on a
/// product it cannot hold: a large factor must mean "a long delay", never a
/// panic on the thread that schedules the retry.
fn scaled(d: Duration, factor: f64) -> Duration {
    let seconds = d.as_secs_f64() * factor;
    if seconds.is_finite() && seconds < MAX_DELAY.as_secs_f64() {
        Duration::from_secs_f64(seconds.max(0.0))
    } else {
        MAX_DELAY
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(interval_ms: u64, factor: f64, jitter: f64) -> BackoffPolicy {
        BackoffPolicy { interval: Duration::from_millis(interval_ms), factor, jitter }
    }

    #[test]
    fn b17_zero_jitter_gives_exact_geometric_delays() {
        let mut b = Backoff::new(policy(100, 2.0, 0.0));
        let got: Vec<u128> = (0..5).map(|_| b.next_delay(0.7).as_millis()).collect();
        assert_eq!(got, vec![100, 200, 400, 800, 1600]);
    }

    #[test]
    fn b17_default_factor() {
        let mut b = Backoff::new(policy(100, 1.1, 0.0));
        let d: Vec<Duration> = (0..3).map(|_| b.next_delay(0.0)).collect();
        assert_eq!(d[0], Duration::from_millis(100));
        assert_eq!(d[1], Duration::from_millis(110));
        assert_eq!(d[2].as_micros(), 121_000);
    }

    #[test]
    fn b17_jitter_scales_within_bounds() {
        let mut b = Backoff::new(policy(100, 1.0, 0.5));
        assert_eq!(b.next_delay(0.0), Duration::from_millis(100));
        assert_eq!(b.next_delay(0.5), Duration::from_millis(125));
        let top = b.next_delay(0.999_999);
        assert!(top < Duration::from_millis(150) && top > Duration::from_millis(149));
        for _ in 0..1000 {
            let d = b.next_random_delay();
            assert!(d >= Duration::from_millis(100) && d < Duration::from_millis(150));
        }
    }

    #[test]
    fn b17_no_cap_no_attempt_limit() {
        let mut b = Backoff::new(policy(1, 10.0, 0.0));
        let mut last = Duration::ZERO;
        for _ in 0..8 {
            let d = b.next_delay(0.0);
            assert!(d > last);
            last = d;
        }
        assert_eq!(last, Duration::from_secs(10_000));
    }

    #[test]
    fn huge_factors_saturate_instead_of_panicking() {
        for factor in [2e14, 1e300, f64::MAX] {
            let mut b = Backoff::new(policy(100, factor, 0.9));
            let delays: Vec<Duration> = (0..6).map(|_| b.next_delay(0.999)).collect();
            assert_eq!(delays[0], Duration::from_millis(100).mul_f64(1.0 + 0.9 * 0.999));
            assert!(delays[2..].iter().all(|d| *d == MAX_DELAY), "{factor}: {delays:?}");
        }
        let mut b = Backoff::new(BackoffPolicy { interval: MAX_DELAY, factor: 1.0, jitter: 0.99 });
        assert_eq!(b.next_delay(0.999), MAX_DELAY, "jitter on a saturated delay stays finite");
    }
}
