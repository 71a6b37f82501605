//! Owned handles on the pool's blocks: a reference is a value, and dropping
//! it gives the block back.
//!
//! The prefix cache ([`super::prefix_cache`]) counts references per block.
//! Counting by hand (a `retain` here, a `release` on every exit path) is how
//! blocks leak or get freed under a reader; so the engine never touches the
//! counts. It holds references through three types, each of which releases
//! what it holds when dropped (the model is Dynamo's block guards, and the
//! store's `Reservation`/`ReadLease`):
//!
//! * [`BlockTable`]: the blocks of one sequence (or one fabric load), one
//!   reference per entry, in order; its ids are what the forward pass reads.
//! * [`Block`]: one extra reference to one block, e.g. the pin that keeps a
//!   block unchanged while the connector saves it.
//! * A parked table ([`BlockTable::park_until`]): blocks someone else may
//!   still write (a fabric load whose sequence went away). They stay out of
//!   the free list until the writer says it is done, and [`BlockPool::reap`]
//!   frees them then.
//!
//! Handles share the manager through an `Arc<Mutex<_>>`: the scheduler runs
//! on one thread, so the lock is never contended; it is there so the
//! scheduler (and the handles in it) can move to its thread.

use std::ops::Range;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use kvfabric_types::BlockKey;

use super::pool::BlockId;
use super::prefix_cache::BlockManager;

/// A test for "the writer of parked blocks is done" (polled by [`BlockPool::reap`]).
type DoneFn = Box<dyn FnMut() -> bool + Send>;

struct Shared {
    manager: BlockManager,
    /// Blocks kept out of circulation until their writer is done.
    parked: Vec<(Vec<BlockId>, DoneFn)>,
}

type Inner = Arc<Mutex<Shared>>;

fn lock(inner: &Inner) -> MutexGuard<'_, Shared> {
    // A panic while the lock was held leaves counts that are still
    // consistent (every method finishes its update before it can panic).
    inner.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The blocks of a KV pool: hands out tables and pins, keeps the prefix cache.
#[derive(Clone)]
pub struct BlockPool {
    inner: Inner,
}

impl std::fmt::Debug for BlockPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let g = lock(&self.inner);
        f.debug_struct("BlockPool")
            .field("available", &g.manager.available())
            .field("cached", &g.manager.cached())
            .field("parked", &g.parked.len())
            .finish()
    }
}

impl BlockPool {
    /// A pool of `blocks` blocks, all free.
    pub fn new(blocks: usize) -> BlockPool {
        BlockPool {
            inner: Arc::new(Mutex::new(Shared {
                manager: BlockManager::new(blocks),
                parked: Vec::new(),
            })),
        }
    }

    /// Blocks that can be allocated now (free + cached).
    pub fn available(&self) -> usize {
        lock(&self.inner).manager.available()
    }

    /// Blocks holding a cached prefix with no user.
    pub fn cached(&self) -> usize {
        lock(&self.inner).manager.cached()
    }

    /// Parked tables still waiting for their writer.
    pub fn parked(&self) -> usize {
        lock(&self.inner).parked.len()
    }

    /// An empty table.
    pub fn table(&self) -> BlockTable {
        BlockTable {
            inner: self.inner.clone(),
            ids: Vec::new(),
        }
    }

    /// Up to `n` blocks (fewer when the pool runs out), evicting the least
    /// recently used cached blocks once the free ones are gone.
    pub fn allocate(&self, n: usize) -> BlockTable {
        let mut t = self.table();
        while t.len() < n && t.grow() {}
        t
    }

    /// The blocks of the longest run of leading `keys` in the prefix cache.
    pub fn lookup(&self, keys: &[BlockKey]) -> BlockTable {
        let ids = lock(&self.inner).manager.lookup(keys);
        BlockTable {
            inner: self.inner.clone(),
            ids,
        }
    }

    /// Free the parked blocks whose writer is done.
    pub fn reap(&self) {
        let mut g = lock(&self.inner);
        let Shared { manager, parked } = &mut *g;
        parked.retain_mut(|(ids, done)| {
            if !done() {
                return true;
            }
            for &b in ids.iter() {
                manager.release(b);
            }
            false
        });
    }
}

/// Blocks in order, one reference each; dropping the table (or truncating
/// it) releases them. At zero references a block named in the prefix cache
/// stays cached, any other block is free.
pub struct BlockTable {
    inner: Inner,
    ids: Vec<BlockId>,
}

impl std::fmt::Debug for BlockTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("BlockTable").field(&self.ids).finish()
    }
}

impl BlockTable {
    /// The block ids, in order (what the forward pass reads and writes).
    pub fn ids(&self) -> &[BlockId] {
        &self.ids
    }

    /// Number of blocks.
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    /// No blocks.
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// Allocate one more block at the end; false when the pool is out of
    /// free and cached blocks.
    pub fn grow(&mut self) -> bool {
        match lock(&self.inner).manager.allocate() {
            Some(b) => {
                self.ids.push(b);
                true
            }
            None => false,
        }
    }

    /// Keep the first `len` blocks, release the rest.
    pub fn truncate(&mut self, len: usize) {
        if len >= self.ids.len() {
            return;
        }
        let mut g = lock(&self.inner);
        for b in self.ids.drain(len..) {
            g.manager.release(b);
        }
    }

    /// Release every block.
    pub fn clear(&mut self) {
        self.truncate(0);
    }

    /// Move the blocks from `at` on into a new table.
    pub fn split_off(&mut self, at: usize) -> BlockTable {
        BlockTable {
            inner: self.inner.clone(),
            ids: self.ids.split_off(at.min(self.ids.len())),
        }
    }

    /// Move `other`'s blocks to the end of this table (same pool).
    pub fn append(&mut self, mut other: BlockTable) {
        assert!(
            Arc::ptr_eq(&self.inner, &other.inner),
            "tables of two pools"
        );
        self.ids.append(&mut other.ids);
    }

    /// A new table holding one more reference to each block in `range`.
    pub fn share(&self, range: Range<usize>) -> BlockTable {
        let ids = self.ids[range].to_vec();
        let mut g = lock(&self.inner);
        for &b in &ids {
            g.manager.retain(b);
        }
        BlockTable {
            inner: self.inner.clone(),
            ids,
        }
    }

    /// One more reference to block `i`, held until the [`Block`] is dropped.
    pub fn pin(&self, i: usize) -> Block {
        let id = self.ids[i];
        lock(&self.inner).manager.retain(id);
        Block {
            inner: self.inner.clone(),
            id,
        }
    }

    /// Name block `i` in the prefix cache (a key held by another block is
    /// left as it is).
    pub fn register(&self, i: usize, key: BlockKey) {
        lock(&self.inner).manager.register(self.ids[i], key);
    }

    /// The key block `i` is cached under.
    pub fn key_of(&self, i: usize) -> Option<BlockKey> {
        lock(&self.inner).manager.key_of(self.ids[i])
    }

    /// Keep these blocks out of circulation until `done` says their writer
    /// has finished; [`BlockPool::reap`] releases them then.
    pub fn park_until(mut self, done: impl FnMut() -> bool + Send + 'static) {
        let ids = std::mem::take(&mut self.ids);
        if !ids.is_empty() {
            lock(&self.inner).parked.push((ids, Box::new(done)));
        }
    }
}

impl Drop for BlockTable {
    fn drop(&mut self) {
        self.clear();
    }
}

/// One reference to one block; dropping it releases the block.
pub struct Block {
    inner: Inner,
    id: BlockId,
}

impl std::fmt::Debug for Block {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Block").field(&self.id).finish()
    }
}

impl Block {
    /// The block's id in the pool.
    pub fn id(&self) -> BlockId {
        self.id
    }
}

impl Drop for Block {
    fn drop(&mut self) {
        lock(&self.inner).manager.release(self.id);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::*;

    fn key(i: u8) -> BlockKey {
        BlockKey([i; 32])
    }

    #[test]
    fn dropped_tables_and_pins_return_their_blocks() {
        let pool = BlockPool::new(4);
        let t = pool.allocate(3);
        assert_eq!(t.len(), 3);
        assert_eq!(pool.available(), 1);
        let pin = t.pin(1);
        let shared = t.share(0..2);
        drop(t);
        // Block 0 is still shared, block 1 shared and pinned, block 2 free.
        assert_eq!(pool.available(), 2);
        drop(shared);
        assert_eq!(pool.available(), 3);
        drop(pin);
        assert_eq!(pool.available(), 4);
        assert_eq!(
            pool.allocate(9).len(),
            4,
            "all back, allocation stops at the pool"
        );
        assert_eq!(pool.available(), 4);
    }

    #[test]
    fn split_append_and_truncate_move_references_without_leaks() {
        let pool = BlockPool::new(6);
        let mut a = pool.allocate(4);
        let tail = a.split_off(2);
        assert_eq!((a.len(), tail.len()), (2, 2));
        let mut b = pool.table();
        b.append(tail);
        assert!(b.grow());
        assert_eq!(pool.available(), 1);
        b.truncate(1);
        assert_eq!(pool.available(), 3);
        a.append(b);
        assert_eq!(a.len(), 3);
        a.clear();
        assert_eq!(pool.available(), 6);
    }

    #[test]
    fn registered_blocks_stay_cached_after_their_table_is_dropped() {
        let pool = BlockPool::new(3);
        let t = pool.allocate(2);
        t.register(0, key(1));
        t.register(1, key(2));
        assert_eq!(t.key_of(1), Some(key(2)));
        let ids = t.ids().to_vec();
        drop(t);
        assert_eq!((pool.available(), pool.cached()), (3, 2));
        let hit = pool.lookup(&[key(1), key(2), key(3)]);
        assert_eq!(hit.ids(), &ids[..]);
        assert_eq!((pool.available(), pool.cached()), (1, 0));
        drop(hit);
        assert_eq!((pool.available(), pool.cached()), (3, 2));
    }

    #[test]
    fn parked_blocks_come_back_only_when_their_writer_is_done() {
        let pool = BlockPool::new(4);
        let t = pool.allocate(3);
        let done = Arc::new(AtomicBool::new(false));
        let d = done.clone();
        t.park_until(move || d.load(Ordering::SeqCst));
        assert_eq!((pool.available(), pool.parked()), (1, 1));
        pool.reap();
        assert_eq!(pool.available(), 1, "the writer is not done: still held");
        assert_eq!(
            pool.allocate(4).len(),
            1,
            "parked blocks are never handed out"
        );
        done.store(true, Ordering::SeqCst);
        pool.reap();
        assert_eq!((pool.available(), pool.parked()), (4, 0));
    }
}
