//! The tokenizer's piece cache: the BPE ids of short pre-tokenized pieces.
//!
//! The engine tokenizes requests concurrently, so the cache must not make
//! them take turns (one lock held for a whole encode did: two 32k-token
//! prompts took as long as both one after the other). It is split into
//! shards, each a map behind its own lock, and a lock is only ever taken with
//! `try_lock`, for one lookup or one insert: BPE runs outside every lock, and
//! a shard another thread holds at that instant is skipped (the piece is
//! computed, or not remembered) rather than waited for. An encode therefore
//! never waits for another. The cache only remembers what `encode` returned
//! for a piece, so whether it hits never changes the ids.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::{Mutex, MutexGuard, TryLockError};

/// Shards of the cache; two concurrent encodes rarely want the same one.
const SHARDS: usize = 16;
/// Pieces longer than this skip the cache (rare, and would bloat it).
pub(super) const MAX_PIECE_BYTES: usize = 64;
/// A shard is cleared when it reaches this many entries (64k in all).
const MAX_SHARD_ENTRIES: usize = 64 * 1024 / SHARDS;

type Map = HashMap<String, Vec<u32>>;

/// One shard, on its own cache line so that shards' locks do not share one.
#[repr(align(64))]
#[derive(Default)]
struct Shard(Mutex<Map>);

impl Shard {
    /// The map, or None while another thread holds it. A poisoned lock only
    /// means a thread panicked mid-insert: the map itself is still valid.
    fn try_map(&self) -> Option<MutexGuard<'_, Map>> {
        match self.0.try_lock() {
            Ok(map) => Some(map),
            Err(TryLockError::Poisoned(p)) => Some(p.into_inner()),
            Err(TryLockError::WouldBlock) => None,
        }
    }
}

/// Piece text -> BPE ids, shared by every thread that encodes.
pub(super) struct PieceCache {
    shards: Box<[Shard]>,
    hasher: RandomState,
}

impl std::fmt::Debug for PieceCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PieceCache({SHARDS} shards)")
    }
}

impl PieceCache {
    pub(super) fn new() -> PieceCache {
        PieceCache {
            shards: (0..SHARDS).map(|_| Shard::default()).collect(),
            hasher: RandomState::new(),
        }
    }

    /// Append the ids of `piece` to `out`: the cached ones, or those `encode`
    /// appends (then remembered, when the piece is short enough).
    pub(super) fn encode(
        &self,
        piece: &str,
        out: &mut Vec<u32>,
        encode: impl FnOnce(&mut Vec<u32>),
    ) {
        if piece.len() > MAX_PIECE_BYTES {
            encode(out);
            return;
        }
        let shard = &self.shards[(self.hasher.hash_one(piece) % SHARDS as u64) as usize];
        if let Some(ids) = shard.try_map().as_ref().and_then(|m| m.get(piece)) {
            out.extend_from_slice(ids);
            return;
        }
        let start = out.len();
        encode(out);
        if let Some(mut map) = shard.try_map() {
            if map.len() >= MAX_SHARD_ENTRIES {
                map.clear();
            }
            map.insert(piece.to_owned(), out[start..].to_vec());
        }
    }

    /// Every shard's lock, held (tests: "an encode never waits for the cache").
    #[cfg(test)]
    pub(super) fn hold_all(&self) -> Vec<MutexGuard<'_, Map>> {
        self.shards
            .iter()
            .map(|s| s.0.lock().unwrap_or_else(|p| p.into_inner()))
            .collect()
    }

    /// Cached pieces in all shards.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.hold_all().iter().map(|m| m.len()).sum()
    }
}
