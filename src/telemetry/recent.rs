//! The last requests the router answered, for the status page (B42), and
//! how many verdicts of each kind it gave, for its charts (B91).
//!
//! Every request is recorded, on the fast path: the ring reuses its
//! entries' buffers, and the counts are kept under the lock it takes anyway.
//! Request headers other than the method and the path never reach it, and
//! the path loses its query string before it is stored, so no
//! authorization, cookie, query string or token can appear on the page.

use std::time::{Duration, SystemTime};

use parking_lot::Mutex;

/// How many recent requests the page keeps.
pub const RECENT_CAPACITY: usize = 100;
/// Longest path kept per request.
const MAX_PATH: usize = 200;

/// One answered request.
#[derive(Clone, Debug)]
pub struct RecentRequest {
    pub at: SystemTime,
    pub method: String,
    /// The path without its query string.
    pub path: String,
    pub actor: String,
    pub verdict: RecentVerdict,
    /// The worker address when routed.
    pub target: String,
    pub duration: Duration,
}

/// How a recent request was answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecentVerdict {
    Routed,
    /// The status and reason token of a rejection.
    Rejected {
        status: u16,
        reason: &'static str,
    },
}

impl std::fmt::Display for RecentVerdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RecentVerdict::Routed => f.write_str("200 routed"),
            RecentVerdict::Rejected { status, reason } => write!(f, "{status} {reason}"),
        }
    }
}

/// The kinds of verdict the page charts (B91).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VerdictKind {
    Routed,
    /// Refused by the router for its own capacity: lot, flights or atespace
    /// full, or a deadline shorter than parks take.
    Shed,
    /// Parked for the whole budget without a worker.
    BudgetExhausted,
    /// Every other rejection: unknown or invalid actors, the control
    /// plane's errors, timeouts, routing failures.
    Error,
}

impl VerdictKind {
    /// Every kind, in the order of their discriminants.
    pub const ALL: [VerdictKind; 4] =
        [VerdictKind::Routed, VerdictKind::Shed, VerdictKind::BudgetExhausted, VerdictKind::Error];

    /// The kind of `verdict`.
    pub fn of(verdict: RecentVerdict) -> VerdictKind {
        match verdict {
            RecentVerdict::Routed => VerdictKind::Routed,
            RecentVerdict::Rejected { reason, .. } => match reason {
                "atenet_lot_full"
                | "atenet_flights_full"
                | "atenet_atespace_full"
                | "atenet_deadline_too_short"
                | "atenet_preempted" => VerdictKind::Shed,
                "atenet_budget_exhausted" => VerdictKind::BudgetExhausted,
                _ => VerdictKind::Error,
            },
        }
    }

    /// Its name in the JSON.
    pub fn name(self) -> &'static str {
        match self {
            VerdictKind::Routed => "routed",
            VerdictKind::Shed => "shed",
            VerdictKind::BudgetExhausted => "budget_exhausted",
            VerdictKind::Error => "error",
        }
    }
}

/// A request as the extproc service saw it, borrowed for [`RecentRequests::record`].
pub struct Answered<'a> {
    pub method: &'a [u8],
    pub path: &'a [u8],
    pub actor: &'a str,
    pub verdict: RecentVerdict,
    pub target: &'a str,
    pub duration: Duration,
}

/// The last [`RECENT_CAPACITY`] requests, and how many of each
/// [`VerdictKind`] were given. Every request on the fast path is recorded,
/// so the ring reuses its entries' buffers instead of allocating, and the
/// counts are kept under the lock it takes anyway.
#[derive(Default)]
pub struct RecentRequests {
    ring: Mutex<Ring>,
}

#[derive(Default)]
struct Ring {
    entries: Vec<RecentRequest>,
    /// Where the next entry goes once the ring is full.
    next: usize,
    /// Verdicts given since startup, by [`VerdictKind`].
    verdicts: [u64; VerdictKind::ALL.len()],
}

impl RecentRequests {
    /// Keeps `answered`, stripping the path's query and bounding lengths.
    pub fn record(&self, answered: Answered<'_>) {
        let at = SystemTime::now();
        let mut ring = self.ring.lock();
        ring.verdicts[VerdictKind::of(answered.verdict) as usize] += 1;
        let entry = if ring.entries.len() < RECENT_CAPACITY {
            ring.entries.push(RecentRequest {
                at,
                method: String::new(),
                path: String::new(),
                actor: String::new(),
                verdict: answered.verdict,
                target: String::new(),
                duration: answered.duration,
            });
            ring.entries.last_mut().expect("just pushed")
        } else {
            let next = ring.next;
            ring.next = (next + 1) % RECENT_CAPACITY;
            &mut ring.entries[next]
        };
        entry.at = at;
        entry.verdict = answered.verdict;
        entry.duration = answered.duration;
        let path = answered.path.split(|b| *b == b'?' || *b == b'#').next().unwrap_or_default();
        refill(&mut entry.method, answered.method, 16);
        refill(&mut entry.path, path, MAX_PATH);
        refill(&mut entry.actor, answered.actor.as_bytes(), 128);
        refill(&mut entry.target, answered.target.as_bytes(), 64);
    }

    /// Verdicts given since startup, by [`VerdictKind`].
    pub fn verdict_counts(&self) -> [u64; VerdictKind::ALL.len()] {
        self.ring.lock().verdicts
    }

    /// The entries, newest first.
    pub fn snapshot(&self) -> Vec<RecentRequest> {
        let ring = self.ring.lock();
        // In time order: from the slot written next (the oldest) to the end,
        // then the slots before it.
        let (newest, oldest) = ring.entries.split_at(ring.next.min(ring.entries.len()));
        oldest.iter().chain(newest).rev().cloned().collect()
    }
}

/// Replaces `into`'s text with at most `chars` characters of `bytes`
/// (invalid UTF-8 shown as U+FFFD), keeping its allocation.
fn refill(into: &mut String, bytes: &[u8], chars: usize) {
    into.clear();
    match std::str::from_utf8(bytes) {
        // The usual case, copied whole: no more bytes than allowed characters.
        Ok(text) if text.len() <= chars => into.push_str(text),
        _ => into.extend(String::from_utf8_lossy(bytes).chars().take(chars)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn b42_recent_requests_drop_the_query_and_keep_the_last_hundred() {
        let recent = RecentRequests::default();
        for i in 0..150 {
            let path = format!("/api/{i}?token=secret&x=1");
            let verdict = if i % 2 == 0 {
                RecentVerdict::Routed
            } else {
                RecentVerdict::Rejected { status: 503, reason: "atenet_lot_full" }
            };
            let answered = Answered {
                method: b"GET",
                path: path.as_bytes(),
                actor: "demo/a",
                verdict,
                target: "",
                duration: Duration::ZERO,
            };
            recent.record(answered);
        }
        let all = recent.snapshot();
        assert_eq!(all.len(), RECENT_CAPACITY);
        assert_eq!(all[0].path, "/api/149", "newest first, no query");
        assert_eq!(all[99].path, "/api/50", "oldest last");
        assert!(all.windows(2).all(|w| w[0].at >= w[1].at));
        assert_eq!(all[0].verdict.to_string(), "503 atenet_lot_full");
        assert_eq!(all[1].verdict.to_string(), "200 routed");
        assert!(all.iter().all(|r| !r.path.contains("secret")));
        let few = RecentRequests::default();
        for path in ["/a", "/b"] {
            let answered = Answered {
                method: b"GET",
                path: path.as_bytes(),
                actor: "",
                verdict: RecentVerdict::Routed,
                target: "",
                duration: Duration::ZERO,
            };
            few.record(answered);
        }
        let paths: Vec<String> = few.snapshot().into_iter().map(|r| r.path).collect();
        assert_eq!(paths, ["/b", "/a"]);
    }

    #[test]
    fn refill_bounds_characters_and_shows_bad_bytes() {
        let mut s = String::from("old text");
        refill(&mut s, b"/short", 16);
        assert_eq!(s, "/short");
        refill(&mut s, "é".repeat(20).as_bytes(), 16);
        assert_eq!(s, "é".repeat(16), "characters, not bytes");
        refill(&mut s, b"abcdefghij", 4);
        assert_eq!(s, "abcd");
        refill(&mut s, b"a\xffb", 16);
        assert_eq!(s, "a\u{fffd}b");
    }

    #[test]
    fn b91_verdict_kinds() {
        let rejected = |reason| VerdictKind::of(RecentVerdict::Rejected { status: 503, reason });
        assert_eq!(VerdictKind::of(RecentVerdict::Routed), VerdictKind::Routed);
        for shed in [
            "atenet_lot_full",
            "atenet_flights_full",
            "atenet_atespace_full",
            "atenet_deadline_too_short",
            "atenet_preempted",
        ] {
            assert_eq!(rejected(shed), VerdictKind::Shed, "{shed}");
        }
        assert_eq!(rejected("atenet_budget_exhausted"), VerdictKind::BudgetExhausted);
        for error in
            ["atenet_not_found", "atenet_invalid_target", "atenet_no_capacity", "atenet_caller_deadline"]
        {
            assert_eq!(rejected(error), VerdictKind::Error, "{error}");
        }
        assert!(VerdictKind::ALL.iter().enumerate().all(|(i, k)| *k as usize == i));
    }
}
