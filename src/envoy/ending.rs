//! Who ends a stream once its verdict is out: the router, at once (B77),
//! or, once the router is stopping, Envoy (B104).
//!
//! gRPC core closes a connection the moment its last stream ends after the
//! GOAWAY of a stop, with `shutdown(SHUT_RDWR)` and `close()`. Linux answers
//! any data that arrives after that (Envoy's window updates, pings, stream
//! resets: frames sent before it saw the close) with a RST, and the RST
//! throws away whatever the router's socket had not yet sent and Envoy's
//! socket had not yet read: the last verdicts, which Envoy then fails with
//! its 503. So once the router stops, no stream ends by the router's own
//! status: each sends its verdict and waits until Envoy ends the stream
//! (it resets it the moment it has the verdict), and only then, or after
//! [`ENVOY_END_PATIENCE`], sends the status. The last stream of a connection
//! then ends by Envoy's reset, after Envoy has read every frame before it.
//! A status sent before the stop is written before the GOAWAY: gRPC's
//! GOAWAY carries a PING, and the connection closes only after Envoy's
//! answer to it, which Envoy sends only after reading everything before.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a stopping router waits for Envoy to end a stream whose verdict
/// it sent before sending the status itself: Envoy resets the stream within
/// milliseconds of the verdict, unless it was configured to process later
/// phases (then its next message ends the wait as well).
pub const ENVOY_END_PATIENCE: Duration = Duration::from_secs(2);

/// Whether the router is stopping, and the streams ending by the router's
/// own status right now.
#[derive(Default)]
pub struct StreamEndings {
    stopping: AtomicBool,
    closing: AtomicUsize,
}

/// How a stream whose verdict is ready ends.
pub enum Ending {
    /// The verdict and the status at once; dropping this says the
    /// status is out.
    Close(Closing),
    /// The verdict, then the status once Envoy ended the stream.
    LetEnvoyEnd,
}

/// A stream ending by its own status before the stop.
pub struct Closing(Arc<StreamEndings>);

impl Drop for Closing {
    fn drop(&mut self) {
        self.0.closing.fetch_sub(1, Ordering::SeqCst);
    }
}

impl StreamEndings {
    pub fn new() -> Arc<StreamEndings> {
        Arc::new(StreamEndings::default())
    }

    /// How a stream whose verdict is ready ends. Sequentially consistent
    /// with [`StreamEndings::stop`]: either this sees the stop, or the stop
    /// sees this stream closing and waits for it.
    pub fn begin(self: &Arc<Self>) -> Ending {
        self.closing.fetch_add(1, Ordering::SeqCst);
        let closing = Closing(Arc::clone(self));
        if self.stopping.load(Ordering::SeqCst) {
            drop(closing);
            Ending::LetEnvoyEnd
        } else {
            Ending::Close(closing)
        }
    }

    /// From now on Envoy ends every stream; waits (at most `patience`)
    /// until every status sent before is out, so that gRPC's GOAWAY, sent
    /// next, follows it. Returns whether they all went out.
    pub fn stop(&self, patience: Duration) -> bool {
        self.stopping.store(true, Ordering::SeqCst);
        let deadline = Instant::now() + patience;
        while self.closing.load(Ordering::SeqCst) > 0 {
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn b104_a_stop_waits_for_statuses_already_going_out_and_then_lets_envoy_end() {
        let endings = StreamEndings::new();
        let Ending::Close(closing) = endings.begin() else { panic!("before the stop the router ends") };
        assert!(!endings.stop(Duration::from_millis(20)), "a status still going out holds the stop");
        assert!(matches!(endings.begin(), Ending::LetEnvoyEnd), "once stopping, Envoy ends");
        drop(closing);
        assert!(endings.stop(Duration::ZERO));
    }

    #[test]
    fn b104_every_stream_either_seen_by_the_stop_or_seeing_it() {
        for _ in 0..200 {
            let endings = StreamEndings::new();
            let (ending, all_out) = std::thread::scope(|s| {
                let stream = s.spawn(|| endings.begin());
                let all_out = endings.stop(Duration::from_millis(2));
                (stream.join().unwrap(), all_out)
            });
            // A stream that ends by its own status still holds its guard
            // here: the stop cannot have passed it.
            assert!(!(matches!(ending, Ending::Close(_)) && all_out), "the stop passed a closing stream");
        }
    }
}
