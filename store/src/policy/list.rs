//! `Queues<Q>`: `Q` FIFO queues of block keys as doubly linked lists through
//! one slab, so every operation an eviction order needs (append, unlink from
//! the middle, move to the back of a queue) is O(1).
//!
//! There is no key -> slot index here: the slot a key got is kept by the
//! caller (the store keeps it in the block's record, which it looks up
//! anyway), so an operation on a queued key costs its node and neighbours,
//! not also a probe of a second hash map (at 1M blocks each probe is a cache
//! miss or two).
//!
//! The orders used `VecDeque::retain` (S3-FIFO) and a `BTreeMap` of ticks
//! (LRU) before: a removal scanned a whole queue under the store lock, which
//! at ~700k blocks (a 1 TB disk tier of 1.5 MiB blocks) cost milliseconds per
//! eviction. Freed slots are reused, so the slab holds at most as many nodes
//! as the tier ever held blocks at once.

use allocator_api2::vec::Vec as HugeVec;

use crate::huge_alloc::HugeAlloc;
use crate::keys::BlockKey;
use crate::rec::Rec;

/// No node (end of a list, or an empty queue).
const NIL: u32 = u32::MAX;

/// `Node::queue` of a free slot.
const FREE: u8 = u8::MAX;

/// One queued key: its block's record, its links, its queue and a small
/// per-policy counter.
#[derive(Debug)]
struct Node {
    key: BlockKey,
    /// The key's record in the store's `BlockMap` (the victim's record is
    /// read through it: no index probe).
    rec: Rec,
    prev: u32,
    next: u32,
    queue: u8,
    freq: u8,
}

/// Head, tail and length of one queue.
#[derive(Debug, Clone, Copy)]
struct Ends {
    head: u32,
    tail: u32,
    len: usize,
}

const EMPTY: Ends = Ends {
    head: NIL,
    tail: NIL,
    len: 0,
};

/// A slot in the slab (stable while its key stays queued).
pub type Slot = u32;

/// `Q` queues over one slab; every key is in at most one of them.
#[derive(Debug)]
pub(crate) struct Queues<const Q: usize> {
    /// On huge pages: at a million blocks it is ~50 MB touched at random.
    nodes: HugeVec<Node, HugeAlloc>,
    free: Vec<Slot>,
    /// Keys queued, all queues together.
    count: usize,
    ends: [Ends; Q],
}

impl<const Q: usize> Default for Queues<Q> {
    fn default() -> Self {
        Queues {
            nodes: HugeVec::new_in(HugeAlloc),
            free: Vec::new(),
            count: 0,
            ends: [EMPTY; Q],
        }
    }
}

impl<const Q: usize> Queues<Q> {
    /// Keys queued, all queues together.
    pub fn total(&self) -> usize {
        self.count
    }

    /// Keys in queue `q`.
    pub fn len(&self, q: usize) -> usize {
        self.ends[q].len
    }

    /// The oldest slot of queue `q`.
    pub fn front(&self, q: usize) -> Option<Slot> {
        let h = self.ends[q].head;
        (h != NIL).then_some(h)
    }

    /// The slot after `s` in its queue (towards the back).
    pub fn next(&self, s: Slot) -> Option<Slot> {
        let n = self.nodes[s as usize].next;
        (n != NIL).then_some(n)
    }

    pub fn key(&self, s: Slot) -> BlockKey {
        self.nodes[s as usize].key
    }

    /// The record the caller gave with `s`'s key.
    pub fn rec(&self, s: Slot) -> Rec {
        self.nodes[s as usize].rec
    }

    /// Start loading `s`'s node (see `huge_alloc::prefetch`).
    pub fn prefetch(&self, s: Slot) {
        if let Some(n) = self.nodes.get(s as usize) {
            crate::huge_alloc::prefetch(n);
        }
    }

    /// The queue `s` is in.
    pub fn queue(&self, s: Slot) -> usize {
        self.nodes[s as usize].queue as usize
    }

    pub fn freq(&self, s: Slot) -> u8 {
        self.nodes[s as usize].freq
    }

    pub fn set_freq(&mut self, s: Slot, f: u8) {
        self.nodes[s as usize].freq = f;
    }

    /// Append `key` (not queued yet, its record `rec`) to the back of
    /// queue `q`, counter 0.
    pub fn push_back(&mut self, q: usize, key: BlockKey, rec: Rec) -> Slot {
        let node = Node {
            key,
            rec,
            prev: NIL,
            next: NIL,
            queue: q as u8,
            freq: 0,
        };
        let s = match self.free.pop() {
            Some(s) => {
                self.nodes[s as usize] = node;
                s
            }
            None => {
                self.nodes.push(node);
                (self.nodes.len() - 1) as Slot
            }
        };
        self.count += 1;
        self.link_back(q, s);
        s
    }

    /// Take the key queued at `s` (which must be queued) out of its queue;
    /// its queue and counter. The slot is free for reuse afterwards.
    pub fn remove(&mut self, s: Slot) -> (usize, u8) {
        self.unlink(s);
        self.free.push(s);
        self.count -= 1;
        let n = &mut self.nodes[s as usize];
        let q = std::mem::replace(&mut n.queue, FREE);
        (q as usize, n.freq)
    }

    /// Whether `s` holds `key` (a caller's slot is still its key's).
    pub fn holds(&self, s: Slot, key: &BlockKey) -> bool {
        self.nodes
            .get(s as usize)
            .is_some_and(|n| n.queue != FREE && n.key == *key)
    }

    /// Move `s` to the back of queue `q` (its own queue or another).
    pub fn move_to_back(&mut self, s: Slot, q: usize) {
        let n = &self.nodes[s as usize];
        if n.queue as usize == q && n.next == NIL {
            return;
        }
        self.unlink(s);
        self.nodes[s as usize].queue = q as u8;
        self.link_back(q, s);
    }

    fn link_back(&mut self, q: usize, s: Slot) {
        let tail = self.ends[q].tail;
        {
            let n = &mut self.nodes[s as usize];
            n.prev = tail;
            n.next = NIL;
        }
        if tail == NIL {
            self.ends[q].head = s;
        } else {
            self.nodes[tail as usize].next = s;
        }
        self.ends[q].tail = s;
        self.ends[q].len += 1;
    }

    fn unlink(&mut self, s: Slot) {
        let (prev, next, q) = {
            let n = &self.nodes[s as usize];
            (n.prev, n.next, n.queue as usize)
        };
        if prev == NIL {
            self.ends[q].head = next;
        } else {
            self.nodes[prev as usize].next = next;
        }
        if next == NIL {
            self.ends[q].tail = prev;
        } else {
            self.nodes[next as usize].prev = prev;
        }
        self.ends[q].len -= 1;
    }
}
