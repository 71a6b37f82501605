//! The announcer's bookkeeping: which keys this node holds (as last read
//! from its store), announcements to retry, owners to re-seed, and the paced
//! full refresh's cursor.
//!
//! `held` mirrors the store's key set, kept from the store's change feed, in
//! key order: a refresh walks it in chunks after a cursor, so no step copies
//! more than one chunk and the store's lock is taken only to read that
//! chunk's blocks. Nothing here does I/O; `announce.rs` drives it.
//!
//! [`Announcer`] holds it with the rest of the announcer's state (the
//! change feed, the directory epoch, the wake-up), one field of the node.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::ops::Bound;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Instant;

use kvfabric_store::keys::BlockKey;
use kvfabric_store::ChangeFeed;
use tokio::sync::Notify;

/// Announcements that failed and are retried each period, at most this many
/// keys; beyond it the owner is re-seeded by a refresh once it answers.
const RETRY_CAP: usize = 1 << 16;

/// Which owners a refresh re-announces to: every owner, or these.
pub(super) type Owners = Option<BTreeSet<String>>;

/// A full refresh under way: keys after `cursor` are still to go.
#[derive(Debug)]
struct Refresh {
    cursor: Option<BlockKey>,
    owners: Owners,
    /// Keys walked so far.
    walked: usize,
}

/// What one owner's directory was last seen as.
struct OwnerSeen {
    epoch: u64,
    at: Instant,
}

/// The announcer's state (behind `ClusterNode::sync_state`).
pub(super) struct SyncState {
    /// Keys held here, as last read from the store.
    pub held: BTreeSet<BlockKey>,
    retry: HashSet<BlockKey>,
    /// Owners that missed more announcements than the retry set keeps.
    lost: HashSet<String>,
    refresh: Option<Refresh>,
    owners_seen: HashMap<String, OwnerSeen>,
    /// Full refreshes finished so far.
    pub refreshes_done: u64,
}

impl SyncState {
    /// State for a node whose store holds `held` now: a refresh of every
    /// owner is due (announce what the store recovered).
    pub fn new(held: impl IntoIterator<Item = BlockKey>) -> Self {
        SyncState {
            held: held.into_iter().collect(),
            retry: HashSet::new(),
            lost: HashSet::new(),
            refresh: Some(Refresh {
                cursor: None,
                owners: None,
                walked: 0,
            }),
            owners_seen: HashMap::new(),
            refreshes_done: 0,
        }
    }

    /// Re-announce every held key owned by `owners` (None: by anyone),
    /// merged with a refresh under way, which restarts from the first key.
    pub fn request_refresh(&mut self, owners: Owners) {
        let merged = match (self.refresh.take(), owners) {
            (None, o) => o,
            (Some(Refresh { owners: None, .. }), _) | (Some(_), None) => None,
            (
                Some(Refresh {
                    owners: Some(a), ..
                }),
                Some(b),
            ) => Some(&a | &b),
        };
        self.refresh = Some(Refresh {
            cursor: None,
            owners: merged,
            walked: 0,
        });
    }

    /// Keys the refresh under way has walked (None: none under way).
    pub fn walked(&self) -> Option<usize> {
        self.refresh.as_ref().map(|r| r.walked)
    }

    /// The refresh's next (up to) `n` keys and whom they go to; None when
    /// no refresh is under way. The refresh ends with its last chunk.
    pub fn next_chunk(&mut self, n: usize) -> Option<(Vec<BlockKey>, Owners)> {
        let r = self.refresh.as_mut()?;
        let from = match &r.cursor {
            Some(c) => Bound::Excluded(*c),
            None => Bound::Unbounded,
        };
        let keys: Vec<BlockKey> = self
            .held
            .range((from, Bound::Unbounded))
            .take(n.max(1))
            .copied()
            .collect();
        let owners = r.owners.clone();
        r.walked += keys.len();
        if keys.len() < n.max(1) {
            self.refresh = None;
            self.refreshes_done += 1;
        } else {
            r.cursor = keys.last().copied();
        }
        Some((keys, owners))
    }

    /// `keys` failed to reach `owner`: retried next period, or, past the
    /// retry bound, the owner is re-seeded once it answers again.
    pub fn failed(&mut self, owner: &str, keys: impl ExactSizeIterator<Item = BlockKey>) {
        if self.retry.len() + keys.len() <= RETRY_CAP {
            self.retry.extend(keys);
        } else {
            self.lost.insert(owner.to_string());
        }
    }

    /// Up to `n` keys to retry now.
    pub fn take_retry(&mut self, n: usize) -> Vec<BlockKey> {
        let keys: Vec<BlockKey> = self.retry.iter().take(n).copied().collect();
        for k in &keys {
            self.retry.remove(k);
        }
        keys
    }

    /// `owner` answered with directory `epoch` at `now`. A changed epoch
    /// (it restarted, or dropped entries) or an owner that missed
    /// announcements gets a refresh of its keys.
    pub fn saw_owner(&mut self, owner: &str, epoch: u64, now: Instant) {
        let changed = self
            .owners_seen
            .insert(owner.to_string(), OwnerSeen { epoch, at: now })
            .is_some_and(|s| s.epoch != epoch);
        let lost = self.lost.remove(owner);
        if changed || lost {
            tracing::info!(%owner, changed, lost, "owner's directory needs re-seeding: refresh");
            self.request_refresh(Some(BTreeSet::from([owner.to_string()])));
        }
    }

    /// When `owner` last answered (None: never).
    pub fn last_seen(&self, owner: &str) -> Option<Instant> {
        self.owners_seen.get(owner).map(|s| s.at)
    }

    /// Forget owners no longer in the view (a rejoin starts afresh).
    pub fn retain_owners(&mut self, live: impl Fn(&str) -> bool) {
        self.owners_seen.retain(|o, _| live(o));
        self.lost.retain(|o| live(o));
    }
}

/// The announcer's state: what the store reported and the announcer has
/// not taken yet, the held keys, retries and the refresh under way (held
/// across an announcement's RPCs, so announcements go out in the order the
/// store changed), this node's directory epoch, and the wake-up of its task.
pub(crate) struct Announcer {
    pub(super) changes: Arc<ChangeFeed>,
    pub(super) state: tokio::sync::Mutex<SyncState>,
    /// This node's directory epoch (see [`ClusterNode::directory_epoch`]).
    pub(super) epoch: AtomicU64,
    pub(super) kick: Notify,
}

impl Announcer {
    /// Watch `store`'s changes from now on; the keys it holds already are
    /// the first refresh's.
    pub(super) fn watch(store: &kvfabric_store::Store) -> Self {
        let changes = Arc::new(ChangeFeed::new());
        let held = store.watch_changes(changes.clone());
        Announcer {
            changes,
            state: tokio::sync::Mutex::new(SyncState::new(held)),
            epoch: AtomicU64::new(start_epoch()),
            kick: Notify::new(),
        }
    }
}

/// A directory epoch for a node starting now: differs between restarts.
fn start_epoch() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(nanos);
    h.write_u32(std::process::id());
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn k(i: u8) -> BlockKey {
        BlockKey([i; 32])
    }

    #[test]
    fn a_refresh_walks_every_key_in_chunks_and_ends() {
        let mut s = SyncState::new((0..10).map(k));
        let mut seen = Vec::new();
        while let Some((keys, owners)) = s.next_chunk(4) {
            assert!(owners.is_none());
            assert!(keys.len() <= 4);
            seen.extend(keys);
        }
        assert_eq!(seen, (0..10).map(k).collect::<Vec<_>>());
        assert_eq!(s.refreshes_done, 1);
        assert!(s.next_chunk(4).is_none());
    }

    #[test]
    fn keys_added_or_removed_mid_walk_do_not_derail_the_cursor() {
        let mut s = SyncState::new((0..10).map(|i| k(i * 2)));
        let (first, _) = s.next_chunk(3).unwrap();
        assert_eq!(first, vec![k(0), k(2), k(4)]);
        s.held.remove(&k(4));
        s.held.remove(&k(6));
        s.held.insert(k(5));
        let (next, _) = s.next_chunk(3).unwrap();
        assert_eq!(next, vec![k(5), k(8), k(10)]);
    }

    #[test]
    fn requests_merge_and_restart_the_walk() {
        let mut s = SyncState::new((0..10).map(k));
        while s.next_chunk(100).is_some() {}
        s.request_refresh(Some(BTreeSet::from(["a".to_string()])));
        let _ = s.next_chunk(2);
        s.request_refresh(Some(BTreeSet::from(["b".to_string()])));
        let (keys, owners) = s.next_chunk(2).unwrap();
        assert_eq!(keys, vec![k(0), k(1)], "restarted from the first key");
        assert_eq!(owners.unwrap().len(), 2);
        s.request_refresh(None);
        assert!(s.next_chunk(2).unwrap().1.is_none(), "all owners wins");
    }

    #[test]
    fn a_changed_epoch_or_a_lost_owner_triggers_a_refresh_of_that_owner() {
        let mut s = SyncState::new(std::iter::empty());
        while s.next_chunk(8).is_some() {}
        let now = Instant::now();
        s.saw_owner("o", 1, now);
        s.saw_owner("o", 1, now);
        assert!(
            s.walked().is_none(),
            "first sight and an unchanged epoch: nothing to do"
        );
        s.saw_owner("o", 2, now);
        let (_, owners) = s.next_chunk(8).unwrap();
        assert_eq!(owners, Some(BTreeSet::from(["o".to_string()])));
        // Too many failures: the owner is re-seeded when it answers.
        s.failed(
            "p",
            (0..=RETRY_CAP as u32)
                .map(|_| k(1))
                .collect::<Vec<_>>()
                .into_iter(),
        );
        assert!(s.take_retry(10).is_empty());
        s.saw_owner("p", 5, now);
        assert!(s.walked().is_some());
    }
}
