//! Per-atespace shares of a bounded resource: the flight table and the
//! requests the router holds (B78, B79).
//!
//! A tenant that sends many requests for many actors must not take a
//! resource every tenant needs: the flights (so another tenant's running
//! actors could not even be looked up) or the ext_proc streams Envoy's
//! circuit breaker lets through (so every other tenant got Envoy's bare
//! 503). Each atespace may hold at most `cap` of it at once; the rest of the
//! resource stays for the others.
//!
//! Counting is exact under concurrency, as the lot's (B29): an atespace's
//! count changes only under its shard's lock, so with K left of its share
//! and any number of its callers racing, exactly K get a [`ShareHold`]. An
//! entry lives exactly while its atespace holds something, so memory is
//! bounded by the resource, not by the number of tenants.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;

use crate::ateapi::target::ActorId;

const SHARDS: usize = 16;

/// Held counts by atespace, one map per shard.
type Shard = Mutex<HashMap<Box<str>, usize>>;

/// What each atespace holds of one resource.
pub struct AtespaceShares {
    cap: usize,
    shards: Box<[Shard]>,
}

impl AtespaceShares {
    /// Shares of at most `cap` (at least 1) per atespace.
    pub fn new(cap: usize) -> Arc<AtespaceShares> {
        Arc::new(AtespaceShares {
            cap: cap.max(1),
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

    /// One more for `actor`'s atespace, unless it holds its share: the hold
    /// gives it back when dropped.
    pub fn try_take(self: &Arc<Self>, actor: &ActorId) -> Option<ShareHold> {
        let atespace = actor.atespace();
        let mut shard = self.shard(atespace).lock();
        match shard.get_mut(atespace) {
            Some(held) if *held >= self.cap => return None,
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

    fn give_back(&self, atespace: &str) {
        let mut shard = self.shard(atespace).lock();
        if let Some(held) = shard.get_mut(atespace) {
            *held -= 1;
            if *held == 0 {
                shard.remove(atespace);
            }
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

    #[test]
    fn an_atespace_holds_at_most_its_share_and_others_are_untouched() {
        let shares = AtespaceShares::new(2);
        let a = [shares.try_take(&actor("greedy/a")), shares.try_take(&actor("greedy/b"))];
        assert!(a.iter().all(Option::is_some));
        assert!(shares.try_take(&actor("greedy/c")).is_none(), "the third is refused");
        assert!(shares.try_take(&actor("other/x")).is_some(), "another atespace is not");
        drop(a);
        assert_eq!(shares.held("greedy"), 0);
        assert!(shares.try_take(&actor("greedy/c")).is_some(), "room once given back");
    }

    #[test]
    fn an_entry_lives_only_while_something_is_held() {
        let shares = AtespaceShares::new(3);
        for i in 0..1000 {
            drop(shares.try_take(&actor(&format!("t{i}/a"))));
        }
        let entries: usize = shares.shards.iter().map(|s| s.lock().len()).sum();
        assert_eq!(entries, 0);
    }

    #[test]
    fn exact_under_concurrency() {
        let shares = AtespaceShares::new(5);
        let barrier = Arc::new(std::sync::Barrier::new(8));
        let holds: Vec<ShareHold> = (0..8)
            .map(|t| {
                let (shares, barrier) = (Arc::clone(&shares), Arc::clone(&barrier));
                std::thread::spawn(move || {
                    barrier.wait();
                    (0..50)
                        .filter_map(|i| shares.try_take(&actor(&format!("one/t{t}-{i}"))))
                        .collect::<Vec<_>>()
                })
            })
            .collect::<Vec<_>>()
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect();
        assert_eq!(holds.len(), 5);
        assert_eq!(shares.held("one"), 5);
    }
}
