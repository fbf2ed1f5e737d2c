//! The ext_proc streams open now, bounded, and which of them have not said
//! anything yet (B74).
//!
//! Envoy sends `request_headers` the moment it opens a stream, so a stream
//! that stays silent is not Envoy's, and each one holds a task, an HTTP/2
//! stream and gRPC core's call arena. The cap keeps their memory bounded by
//! configuration; the count of silent ones lets the drain stop waiting as
//! soon as only they are left.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::telemetry::metrics::Metrics;

/// How long a new stream may stay silent before it is closed.
pub const FIRST_MESSAGE_TIMEOUT: Duration = Duration::from_secs(5);

/// The open streams, at most `cap`.
pub struct StreamSlots {
    cap: usize,
    open: AtomicUsize,
    silent: AtomicUsize,
    metrics: Metrics,
}

impl StreamSlots {
    pub fn new(cap: usize, metrics: Metrics) -> Arc<StreamSlots> {
        Arc::new(StreamSlots { cap, open: AtomicUsize::new(0), silent: AtomicUsize::new(0), metrics })
    }

    /// A slot for a new stream, or `None` (counted) when `cap` are open.
    /// Exact under concurrency: the count is raised before it is checked.
    pub fn open(self: &Arc<Self>) -> Option<StreamSlot> {
        if self.open.fetch_add(1, Ordering::AcqRel) >= self.cap {
            self.open.fetch_sub(1, Ordering::AcqRel);
            self.metrics.count_stream_refused();
            return None;
        }
        self.silent.fetch_add(1, Ordering::AcqRel);
        self.metrics.streams_opened(1);
        Some(StreamSlot { slots: Arc::clone(self), silent: true })
    }

    /// Streams open now.
    pub fn open_now(&self) -> usize {
        self.open.load(Ordering::Acquire)
    }

    /// Open streams that have sent no message yet.
    pub fn silent_now(&self) -> usize {
        self.silent.load(Ordering::Acquire)
    }
}

/// One open stream; dropping it closes the slot, however the stream ended.
pub struct StreamSlot {
    slots: Arc<StreamSlots>,
    silent: bool,
}

impl StreamSlot {
    /// The stream's first message arrived.
    pub fn spoke(&mut self) {
        if std::mem::replace(&mut self.silent, false) {
            self.slots.silent.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

impl Drop for StreamSlot {
    fn drop(&mut self) {
        self.spoke();
        self.slots.open.fetch_sub(1, Ordering::AcqRel);
        self.slots.metrics.streams_opened(-1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn b74_at_most_cap_open_and_silent_ones_counted() {
        let metrics = Metrics::new();
        let slots = StreamSlots::new(2, metrics.clone());
        let mut a = slots.open().expect("room");
        let b = slots.open().expect("room");
        assert!(slots.open().is_none(), "over the cap");
        assert_eq!((slots.open_now(), slots.silent_now()), (2, 2));
        a.spoke();
        a.spoke();
        assert_eq!((slots.open_now(), slots.silent_now()), (2, 1));
        drop(b);
        assert_eq!((slots.open_now(), slots.silent_now()), (1, 0));
        let c = slots.open().expect("a slot came free");
        drop((a, c));
        assert_eq!((slots.open_now(), slots.silent_now(), metrics.streams_active()), (0, 0, 0));
        assert_eq!(metrics.streams_refused(), 1);
    }

    #[test]
    fn b74_exact_under_concurrency() {
        let slots = StreamSlots::new(100, Metrics::new());
        let held: Vec<Vec<StreamSlot>> = std::thread::scope(|s| {
            let threads: Vec<_> =
                (0..8).map(|_| s.spawn(|| (0..50).filter_map(|_| slots.open()).collect())).collect();
            threads.into_iter().map(|t| t.join().unwrap()).collect()
        });
        assert_eq!(held.iter().map(Vec::len).sum::<usize>(), 100);
        assert_eq!(slots.open_now(), 100);
    }
}
