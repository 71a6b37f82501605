//! The tokenizer's piece cache: the BPE ids of short pre-tokenized pieces.
//!
//! The engine tokenizes requests concurrently, so the cache must not make
//! them take turns (one lock held for a whole encode did: two 32k-token
//! prompts took as long as both one after the other). Nor may it make them
//! share cache lines per piece: an encode spends ~100 ns a token, about what
//! one lock's line moving between cores costs, and a map shared by shards
//! behind per-lookup locks still ran two encodes at ~1.2x one.
//!
//! So the cache is a few slots, each a map behind its own lock, and an
//! encode leases one for its whole length ([`PieceCache::lease`]): it tries
//! its thread's home slot, then the others, with `try_lock` only, and runs
//! uncached if every slot is taken. A slot is used by one encode at a time,
//! no encode ever waits for another, and a thread keeps finding its own
//! (warm) slot. The cache only remembers what `encode` returned for a piece,
//! so whether it hits never changes the ids.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::{Mutex, MutexGuard, TryLockError};

/// Slots: more than the encodes that usually run at once.
const SLOTS: usize = 4;
/// Pieces longer than this skip the cache (rare, and would bloat it).
const MAX_PIECE_BYTES: usize = 64;
/// A slot is cleared when it reaches this many entries (64k in all).
const MAX_SLOT_ENTRIES: usize = 64 * 1024 / SLOTS;

type Map = HashMap<String, Vec<u32>>;

/// One slot, on its own cache lines so that slots' locks do not share one.
#[repr(align(128))]
#[derive(Default)]
struct Slot(Mutex<Map>);

/// Piece text -> BPE ids, in slots leased to one encode at a time.
pub(super) struct PieceCache {
    slots: Box<[Slot]>,
    hasher: RandomState,
}

impl std::fmt::Debug for PieceCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PieceCache({SLOTS} slots)")
    }
}

/// One encode's use of the cache: a slot it holds alone, or none (uncached).
pub(super) struct Lease<'a>(Option<MutexGuard<'a, Map>>);

impl PieceCache {
    pub(super) fn new() -> PieceCache {
        PieceCache {
            slots: (0..SLOTS).map(|_| Slot::default()).collect(),
            hasher: RandomState::new(),
        }
    }

    /// A free slot, the calling thread's home slot first; never waits.
    pub(super) fn lease(&self) -> Lease<'_> {
        let home = self.hasher.hash_one(std::thread::current().id()) as usize;
        for k in 0..SLOTS {
            match self.slots[(home + k) % SLOTS].0.try_lock() {
                Ok(map) => return Lease(Some(map)),
                // A poisoned lock only means an encode panicked mid-insert: the map is valid.
                Err(TryLockError::Poisoned(p)) => return Lease(Some(p.into_inner())),
                Err(TryLockError::WouldBlock) => {}
            }
        }
        Lease(None)
    }

    /// Every slot's lock, held (tests: "an encode never waits for the cache").
    #[cfg(test)]
    pub(super) fn hold_all(&self) -> Vec<MutexGuard<'_, Map>> {
        self.slots
            .iter()
            .map(|s| s.0.lock().unwrap_or_else(|p| p.into_inner()))
            .collect()
    }

    /// Cached pieces in all slots.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.hold_all().iter().map(|m| m.len()).sum()
    }
}

impl Lease<'_> {
    /// Append the ids of `piece` to `out`: the cached ones, or those `encode`
    /// appends (then remembered, when the piece is short enough).
    pub(super) fn encode(
        &mut self,
        piece: &str,
        out: &mut Vec<u32>,
        encode: impl FnOnce(&mut Vec<u32>),
    ) {
        let Some(map) = self.0.as_mut().filter(|_| piece.len() <= MAX_PIECE_BYTES) else {
            encode(out);
            return;
        };
        if let Some(ids) = map.get(piece) {
            out.extend_from_slice(ids);
            return;
        }
        let start = out.len();
        encode(out);
        if map.len() >= MAX_SLOT_ENTRIES {
            map.clear();
        }
        map.insert(piece.to_owned(), out[start..].to_vec());
    }
}
