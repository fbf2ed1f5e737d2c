//! What each signal means in each part of the router's life (B43, B75, B94,
//! B105).
//!
//! One thread receives SIGTERM, SIGINT and SIGHUP and decides, from the
//! phase the router is in, where each goes:
//!
//! - SIGTERM and SIGINT always go to [`Signals::stops`]: while serving they
//!   start the drain; while a successor starts they end its start (the
//!   router then drains); during a drain or once a successor serves, they
//!   skip the waits left.
//! - SIGHUP that a process sent (kill(2)) starts a handover only while the
//!   router serves ([`Signals::handovers`]). One that arrives during a
//!   handover or a drain is logged and ignored: the handover under way already starts
//!   the binary on disk with the same flags, which is all a SIGHUP asks
//!   for; a router that has handed over or is draining is leaving, and the
//!   successor (or the next start) is the one to restart. Done afterwards,
//!   it would retry a successor that just failed, or start one from a
//!   router that is gone.
//! - SIGHUP that the kernel sent (`si_code` `SI_KERNEL`) is nobody's request
//!   for a handover, in any phase (B105): it is logged and ignored. The kernel
//!   sends it, with SIGCONT, to a stopped process group that becomes
//!   orphaned, such as a successor stopped (SIGSTOP) when its predecessor
//!   exits, which otherwise started a second handover nobody asked for; and
//!   to a terminal's session when the terminal hangs up, where a shell
//!   passes its own hangup on to its jobs with kill(2), a process's SIGHUP.
//!
//! The phase moves under a compare-and-swap shared with the main thread,
//! so a SIGHUP is either the one that starts a handover or one that is
//! ignored, never both and never neither.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;

use crossbeam_channel::{Receiver, Sender};
use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
use signal_hook::iterator::exfiltrator::WithOrigin;
use signal_hook::iterator::SignalsInfo;
use signal_hook::low_level::siginfo::Cause;

/// Where the router is, as far as signals are concerned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
enum Phase {
    Serving,
    /// A successor is starting.
    Starting,
    /// A successor serves; this router finishes its streams.
    HandedOver,
    Draining,
}

impl Phase {
    fn from(value: u8) -> Phase {
        match value {
            0 => Phase::Serving,
            1 => Phase::Starting,
            2 => Phase::HandedOver,
            _ => Phase::Draining,
        }
    }
}

/// The router's signals, sorted by what they ask for.
pub struct Signals {
    phase: Arc<AtomicU8>,
    /// SIGTERM and SIGINT, by number.
    pub stops: Receiver<i32>,
    /// SIGHUPs that start a handover: at most one until the router serves
    /// alone again ([`Signals::serving`]).
    pub handovers: Receiver<()>,
}

impl Signals {
    /// Registers the handlers and starts the thread that sorts them. Call it
    /// before any socket opens, so that an early SIGTERM is not lost: a
    /// signal that arrives before the router serves waits in its channel.
    pub fn install() -> std::io::Result<Signals> {
        let mut raw = SignalsInfo::<WithOrigin>::new([SIGTERM, SIGINT, SIGHUP])?;
        let phase = Arc::new(AtomicU8::new(Phase::Serving as u8));
        let (stop_tx, stops) = crossbeam_channel::unbounded();
        let (handover_tx, handovers) = crossbeam_channel::unbounded();
        let sorting = Arc::clone(&phase);
        std::thread::Builder::new().name("atenet-signals".into()).spawn(move || {
            for origin in raw.forever() {
                let by = if origin.cause == Cause::Kernel { By::Kernel } else { By::Process };
                if !sort(origin.signal, by, &sorting, &stop_tx, &handover_tx) {
                    return;
                }
            }
        })?;
        Ok(Signals { phase, stops, handovers })
    }

    /// A handover was refused: the router serves alone again, and the next
    /// SIGHUP starts another. A stop that came meanwhile keeps its phase.
    pub fn serving(&self) {
        let _ = self.phase.compare_exchange(
            Phase::Starting as u8,
            Phase::Serving as u8,
            Ordering::AcqRel,
            Ordering::Acquire,
        );
    }

    /// The successor serves: this router only finishes its streams now.
    pub fn handed_over(&self) {
        self.phase.store(Phase::HandedOver as u8, Ordering::Release);
    }
}

/// Who sent a signal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum By {
    /// A process, with kill(2) and its kin: an operator, a supervisor, a shell.
    Process,
    /// The kernel itself (`SI_KERNEL`): a terminal's hangup, or a stopped
    /// process group orphaned.
    Kernel,
}

/// Sends one signal where the phase and its sender say; false once the
/// main thread is gone.
fn sort(signal: i32, by: By, phase: &AtomicU8, stops: &Sender<i32>, handovers: &Sender<()>) -> bool {
    if signal == SIGHUP && by == By::Kernel {
        log::info!(
            "SIGHUP ignored: the kernel sent it, not a process (a stopped process group orphaned, or a \
             terminal's hangup); a handover is asked for with kill -HUP"
        );
        return true;
    }
    if signal != SIGHUP {
        // A drain from now on, unless a successor already serves.
        let _ = phase.fetch_update(Ordering::AcqRel, Ordering::Acquire, |p| {
            (Phase::from(p) != Phase::HandedOver).then_some(Phase::Draining as u8)
        });
        return stops.send(signal).is_ok();
    }
    match phase.compare_exchange(
        Phase::Serving as u8,
        Phase::Starting as u8,
        Ordering::AcqRel,
        Ordering::Acquire,
    ) {
        Ok(_) => handovers.send(()).is_ok(),
        Err(now) => {
            let why = match Phase::from(now) {
                Phase::Starting => "a handover is under way, and starts the binary on disk already",
                Phase::HandedOver => "this router has handed over; signal its successor",
                Phase::Serving | Phase::Draining => "this router is draining",
            };
            log::info!("SIGHUP ignored: {why}");
            true
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn channels() -> (Sender<i32>, Receiver<i32>, Sender<()>, Receiver<()>) {
        let (s, sr) = crossbeam_channel::unbounded();
        let (h, hr) = crossbeam_channel::unbounded();
        (s, sr, h, hr)
    }

    #[test]
    fn b94_one_sighup_starts_a_handover_and_the_next_is_ignored_until_serving_again() {
        let (s, sr, h, hr) = channels();
        let phase = AtomicU8::new(Phase::Serving as u8);
        assert!(sort(SIGHUP, By::Process, &phase, &s, &h) && sort(SIGHUP, By::Process, &phase, &s, &h));
        assert_eq!(hr.try_iter().count(), 1, "the second SIGHUP came during the handover");
        phase.store(Phase::Serving as u8, Ordering::Release);
        assert!(sort(SIGHUP, By::Process, &phase, &s, &h));
        assert_eq!(hr.try_iter().count(), 1, "a refused handover serves on: the next SIGHUP counts");
        assert!(sr.is_empty());
    }

    #[test]
    fn b94_stops_always_go_through_and_sighups_after_them_are_ignored() {
        let (s, sr, h, hr) = channels();
        for start in [Phase::Serving, Phase::Starting, Phase::HandedOver, Phase::Draining] {
            let phase = AtomicU8::new(start as u8);
            assert!(sort(SIGTERM, By::Process, &phase, &s, &h));
            assert!(sort(SIGHUP, By::Process, &phase, &s, &h));
            assert!(sort(SIGINT, By::Kernel, &phase, &s, &h));
            let after = if start == Phase::HandedOver { Phase::HandedOver } else { Phase::Draining };
            assert_eq!(Phase::from(phase.load(Ordering::Acquire)), after, "from {start:?}");
        }
        assert_eq!(sr.try_iter().collect::<Vec<_>>(), [SIGTERM, SIGINT].repeat(4));
        assert!(hr.is_empty(), "no handover once stopping");
    }

    #[test]
    fn b105_a_sighup_from_the_kernel_starts_no_handover_in_any_phase() {
        let (s, sr, h, hr) = channels();
        for start in [Phase::Serving, Phase::Starting, Phase::HandedOver, Phase::Draining] {
            let phase = AtomicU8::new(start as u8);
            assert!(sort(SIGHUP, By::Kernel, &phase, &s, &h));
            assert_eq!(Phase::from(phase.load(Ordering::Acquire)), start, "the phase stays");
        }
        assert!(hr.is_empty() && sr.is_empty(), "neither a handover nor a stop");
        let phase = AtomicU8::new(Phase::Serving as u8);
        assert!(sort(SIGHUP, By::Process, &phase, &s, &h));
        assert_eq!(hr.try_iter().count(), 1, "a process's SIGHUP after it still hands over");
    }
}
