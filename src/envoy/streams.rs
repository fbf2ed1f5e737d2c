//! The ext_proc streams open now, bounded, and which of them have not said
//! anything yet (B74).
//!
//! Envoy sends `request_headers` the moment it opens a stream, so a stream
//! that stays silent is not Envoy's, and each one holds a task, an HTTP/2
//! stream and gRPC core's call arena. The cap keeps their memory bounded by
//! configuration; the count of silent ones lets the drain stop waiting as
//! soon as only they are left.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::telemetry::metrics::Metrics;

/// How long a new stream may stay silent before it is closed.
pub const FIRST_MESSAGE_TIMEOUT: Duration = Duration::from_secs(5);

/// The open streams, at most `cap`.
pub struct StreamSlots {
    cap: u64,
    /// Open streams in the high half, the silent ones among them in the
    /// low half: one word, so that [`StreamSlots::counts`] reads both at
    /// one instant (two loads could pair a count from before a stream
    /// opened and spoke with one from after).
    counts: AtomicU64,
    metrics: Metrics,
}

const OPEN: u64 = 1 << 32;
const SILENT: u64 = 1;

impl StreamSlots {
    pub fn new(cap: usize, metrics: Metrics) -> Arc<StreamSlots> {
        // Each half holds up to 2^32 - 1: far more streams than file
        // descriptors.
        let cap = u64::try_from(cap).unwrap_or(u64::MAX).min(u64::from(u32::MAX));
        Arc::new(StreamSlots { cap, counts: AtomicU64::new(0), metrics })
    }

    /// A slot for a new stream, or `None` (counted) when `cap` are open.
    /// Exact under concurrency: the count is raised before it is checked.
    pub fn open(self: &Arc<Self>) -> Option<StreamSlot> {
        if self.counts.fetch_add(OPEN + SILENT, Ordering::AcqRel) / OPEN >= self.cap {
            self.counts.fetch_sub(OPEN + SILENT, Ordering::AcqRel);
            self.metrics.count_stream_refused();
            return None;
        }
        self.metrics.streams_opened(1);
        Some(StreamSlot { slots: Arc::clone(self), silent: true })
    }

    /// Streams open now, and how many of them have sent no message yet,
    /// read together.
    pub fn counts(&self) -> (usize, usize) {
        let counts = self.counts.load(Ordering::Acquire);
        ((counts / OPEN) as usize, (counts % OPEN) as usize)
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
            self.slots.counts.fetch_sub(SILENT, Ordering::AcqRel);
        }
    }
}

impl Drop for StreamSlot {
    fn drop(&mut self) {
        self.spoke();
        self.slots.counts.fetch_sub(OPEN, Ordering::AcqRel);
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
        assert_eq!(slots.counts(), (2, 2));
        a.spoke();
        a.spoke();
        assert_eq!(slots.counts(), (2, 1));
        drop(b);
        assert_eq!(slots.counts(), (1, 0));
        let c = slots.open().expect("a slot came free");
        drop((a, c));
        assert_eq!((slots.counts(), metrics.streams_active()), ((0, 0), 0));
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
        assert_eq!(slots.counts(), (100, 100));
    }
}
