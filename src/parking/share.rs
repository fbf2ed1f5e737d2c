//! Per-atespace shares of a bounded resource: the flight table and the
//! requests the router holds (B78, B79, B80).
//!
//! A tenant that sends many requests for many actors must not take a
//! resource every tenant needs: the flights (so another tenant's running
//! actors could not even be looked up) or the ext_proc streams Envoy's
//! circuit breaker lets through (so every other tenant got Envoy's bare
//! 503). But a tenant alone must not be held to a part of a router nobody
//! else uses either. So a [`SharePolicy`] is work-conserving: an atespace
//! holding less than its `share` takes one more whenever it asks; one
//! holding its share or more takes one more only while `reserve` of the
//! whole stays free after it. A flood, of one atespace or many, can never
//! take the last `reserve`: that is left to the atespaces under their
//! share, so another tenant's requests for its running actors still find
//! room (B24). A hard cap is the reserve equal to the whole: nothing beyond
//! the share, ever.
//!
//! Counting is exact under concurrency, as the lot's (B29): an atespace's
//! count changes only under its shard's lock, and the whole's count beyond
//! a share only by a compare-and-swap that keeps the reserve free, so with
//! K left and any number of callers racing, exactly K get a [`ShareHold`].
//! An entry lives exactly while its atespace holds something, so memory is
//! bounded by the resource, not by the number of tenants.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::actor::target::ActorId;

const SHARDS: usize = 16;

/// How much of a whole one atespace may hold (B79, B80).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SharePolicy {
    /// What an atespace may always take (at least 1).
    pub share: usize,
    /// The resource, all atespaces together.
    pub whole: usize,
    /// What an atespace at its share must leave free to take one more.
    pub reserve: usize,
}

impl SharePolicy {
    /// At most `share` for one atespace, whatever the rest holds: an
    /// operator's explicit cap.
    pub fn capped(share: usize, whole: usize) -> SharePolicy {
        SharePolicy { share: share.max(1), whole, reserve: whole }
    }

    /// The default: half of `whole` (at least 1) for any atespace, and
    /// beyond it anything while an eighth of `whole` stays free, so that a
    /// tenant alone has 7/8 of the router and the eighth it leaves is what
    /// the other tenants' first requests find.
    pub fn work_conserving(whole: usize) -> SharePolicy {
        SharePolicy { share: (whole / 2).max(1), whole, reserve: whole / 8 }
    }

    /// Whether an atespace holding `share` or more may never take more.
    pub fn is_cap(&self) -> bool {
        self.reserve >= self.whole
    }

    /// Whether an atespace at its share may take one more with `total` of
    /// the whole held by all of them.
    fn leaves_reserve(&self, total: usize) -> bool {
        total.saturating_add(1).saturating_add(self.reserve) <= self.whole
    }
}

impl fmt::Display for SharePolicy {
    /// As `/statusz` shows the flag: the cap, or the share and the reserve.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_cap() {
            write!(f, "{}", self.share)
        } else {
            write!(f, "{}, more while {} stay free", self.share, self.reserve)
        }
    }
}

/// Held counts by atespace, one map per shard.
type Shard = Mutex<HashMap<Box<str>, usize>>;

/// What each atespace holds of one resource.
pub struct AtespaceShares {
    policy: SharePolicy,
    /// What all atespaces hold together.
    total: AtomicUsize,
    shards: Box<[Shard]>,
}

impl AtespaceShares {
    /// Shares under `policy`.
    pub fn new(policy: SharePolicy) -> Arc<AtespaceShares> {
        let policy = SharePolicy { share: policy.share.max(1), ..policy };
        Arc::new(AtespaceShares {
            policy,
            total: AtomicUsize::new(0),
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
        })
    }

    fn shard(&self, atespace: &str) -> &Shard {
        // FNV-1a: stable and cheap; the shard only spreads lock contention.
        let hash = atespace
            .bytes()
            .fold(0xcbf2_9ce4_8422_2325_u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3));
        &self.shards[(hash % SHARDS as u64) as usize]
    }

    /// One more for `actor`'s atespace, unless it holds its share and taking
    /// one would leave less than the reserve free: the hold gives it back
    /// when dropped.
    pub fn try_take(self: &Arc<Self>, actor: &ActorId) -> Option<ShareHold> {
        let atespace = actor.atespace();
        let mut shard = self.shard(atespace).lock();
        let held = shard.get(atespace).copied().unwrap_or(0);
        if held < self.policy.share {
            self.total.fetch_add(1, Ordering::AcqRel);
        } else {
            // Beyond the share: only if the reserve stays free, decided by
            // one compare-and-swap so racing atespaces cannot both take it.
            let policy = self.policy;
            self.total
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |t| {
                    policy.leaves_reserve(t).then_some(t + 1)
                })
                .ok()?;
        }
        match shard.get_mut(atespace) {
            Some(held) => *held += 1,
            None => {
                shard.insert(Box::from(atespace), 1);
            }
        }
        Some(ShareHold { shares: Arc::clone(self), actor: actor.clone() })
    }

    /// What `atespace` holds now.
    #[cfg(any(test, feature = "testkit"))]
    pub fn held(&self, atespace: &str) -> usize {
        self.shard(atespace).lock().get(atespace).copied().unwrap_or(0)
    }

    /// What all atespaces hold now.
    #[cfg(any(test, feature = "testkit"))]
    pub fn total(&self) -> usize {
        self.total.load(Ordering::Acquire)
    }

    fn give_back(&self, atespace: &str) {
        let mut shard = self.shard(atespace).lock();
        if let Some(held) = shard.get_mut(atespace) {
            *held -= 1;
            if *held == 0 {
                shard.remove(atespace);
            }
            self.total.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// One unit of an atespace's share, given back exactly once, on drop.
pub struct ShareHold {
    shares: Arc<AtespaceShares>,
    /// Whose atespace holds it (an `Arc` clone: no allocation per hold).
    actor: ActorId,
}

impl Drop for ShareHold {
    fn drop(&mut self) {
        self.shares.give_back(self.actor.atespace());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn actor(reference: &str) -> ActorId {
        ActorId::parse(reference).unwrap()
    }

    /// Takes one for each of `actors`, racing from `threads` threads.
    fn race(
        shares: &Arc<AtespaceShares>,
        threads: usize,
        actors: impl Fn(usize, usize) -> String + Copy + Send + 'static,
    ) -> Vec<ShareHold> {
        let barrier = Arc::new(std::sync::Barrier::new(threads));
        (0..threads)
            .map(|t| {
                let (shares, barrier) = (Arc::clone(shares), Arc::clone(&barrier));
                std::thread::spawn(move || {
                    barrier.wait();
                    (0..50).filter_map(|i| shares.try_take(&actor(&actors(t, i)))).collect::<Vec<_>>()
                })
            })
            .collect::<Vec<_>>()
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect()
    }

    #[test]
    fn a_cap_holds_an_atespace_to_its_share_and_others_are_untouched() {
        let shares = AtespaceShares::new(SharePolicy::capped(2, 10));
        let a = [shares.try_take(&actor("greedy/a")), shares.try_take(&actor("greedy/b"))];
        assert!(a.iter().all(Option::is_some));
        assert!(shares.try_take(&actor("greedy/c")).is_none(), "the third is refused, 8 free or not");
        assert!(shares.try_take(&actor("other/x")).is_some(), "another atespace is not");
        drop(a);
        assert_eq!(shares.held("greedy"), 0);
        assert!(shares.try_take(&actor("greedy/c")).is_some(), "room once given back");
    }

    #[test]
    fn b79_b80_an_atespace_alone_takes_all_but_the_reserve_which_stays_for_the_others() {
        let policy = SharePolicy { share: 4, whole: 16, reserve: 2 };
        let shares = AtespaceShares::new(policy);
        let mut greedy: Vec<ShareHold> =
            (0..14).map(|i| shares.try_take(&actor(&format!("greedy/g{i}"))).expect("room")).collect();
        assert!(shares.try_take(&actor("greedy/more")).is_none(), "the last 2 are the reserve");
        // Another atespace's first requests take the reserve, up to its share.
        let other: Vec<ShareHold> = (0..4)
            .map(|i| shares.try_take(&actor(&format!("other/o{i}"))).expect("under its share"))
            .collect();
        assert_eq!((shares.held("other"), shares.total()), (4, 18));
        assert!(shares.try_take(&actor("other/beyond")).is_none(), "at its share, nothing is free");
        // What the flood gives back goes to it again only past the reserve.
        greedy.truncate(10);
        assert!(shares.try_take(&actor("greedy/more")).is_none(), "14 held: taking 1 leaves 1 free");
        greedy.truncate(9);
        assert!(shares.try_take(&actor("greedy/more")).is_some(), "13 held: 2 stay free");
        drop((greedy, other));
        assert_eq!(shares.total(), 0);
    }

    #[test]
    fn a_flood_racing_never_takes_the_reserve() {
        // Eight atespaces, each already at its share of 1, race: together
        // they stop exactly where 10 of 100 stay free.
        let shares = AtespaceShares::new(SharePolicy { share: 1, whole: 100, reserve: 10 });
        let firsts: Vec<ShareHold> =
            (0..8).map(|t| shares.try_take(&actor(&format!("flood{t}/first"))).unwrap()).collect();
        let holds = race(&shares, 8, |t, i| format!("flood{t}/a{i}"));
        assert_eq!((firsts.len() + holds.len(), shares.total()), (90, 90));
        assert!(shares.try_take(&actor("flood0/more")).is_none());
        assert!(shares.try_take(&actor("newcomer/first")).is_some(), "a newcomer's first request gets in");
    }

    #[test]
    fn the_default_is_half_and_leaves_an_eighth() {
        assert_eq!(
            SharePolicy::work_conserving(4096),
            SharePolicy { share: 2048, whole: 4096, reserve: 512 }
        );
        assert_eq!(SharePolicy::work_conserving(1), SharePolicy { share: 1, whole: 1, reserve: 0 });
        assert!(SharePolicy::capped(7, 4096).is_cap() && !SharePolicy::work_conserving(4096).is_cap());
        assert_eq!(SharePolicy::capped(7, 4096).to_string(), "7");
        assert_eq!(SharePolicy::work_conserving(2048).to_string(), "1024, more while 256 stay free");
    }

    #[test]
    fn an_entry_lives_only_while_something_is_held() {
        let shares = AtespaceShares::new(SharePolicy::capped(3, 10));
        for i in 0..1000 {
            drop(shares.try_take(&actor(&format!("t{i}/a"))));
        }
        let entries: usize = shares.shards.iter().map(|s| s.lock().len()).sum();
        assert_eq!((entries, shares.total()), (0, 0));
    }

    #[test]
    fn a_cap_is_exact_under_concurrency() {
        let shares = AtespaceShares::new(SharePolicy::capped(5, 400));
        let holds = race(&shares, 8, |t, i| format!("one/t{t}-{i}"));
        assert_eq!(holds.len(), 5);
        assert_eq!(shares.held("one"), 5);
    }
}
