//! Time as a dependency.
//!
//! The budget, backoff and lot logic read time only through [`Clock`], so
//! their unit tests drive a manual clock and never sleep.

use std::time::Instant;

/// A source of monotonic time.
pub trait Clock: Send + Sync + 'static {
    /// The current instant.
    fn now(&self) -> Instant;
}

/// The real monotonic clock.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Instant {
        Instant::now()
    }
}

#[cfg(any(test, feature = "testkit"))]
pub use manual::ManualClock;

#[cfg(any(test, feature = "testkit"))]
mod manual {
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use parking_lot::Mutex;

    use super::Clock;

    /// A clock that moves only when told to: the test double.
    #[derive(Clone, Debug)]
    pub struct ManualClock {
        now: Arc<Mutex<Instant>>,
    }

    impl ManualClock {
        /// A clock stopped at the current real instant.
        pub fn new() -> ManualClock {
            ManualClock { now: Arc::new(Mutex::new(Instant::now())) }
        }

        /// Moves time forward.
        pub fn advance(&self, by: Duration) {
            *self.now.lock() += by;
        }

        /// Moves time to `at` (never backwards).
        pub fn set(&self, at: Instant) {
            let mut now = self.now.lock();
            if at > *now {
                *now = at;
            }
        }
    }

    impl Default for ManualClock {
        fn default() -> Self {
            ManualClock::new()
        }
    }

    impl Clock for ManualClock {
        fn now(&self) -> Instant {
            *self.now.lock()
        }
    }
}
