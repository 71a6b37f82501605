//! LIRS (Jiang & Zhang, SIGMETRICS'02) over one slab with index links: the
//! default order, chosen for agent traffic on `bench eviction`'s numbers.
//!
//! Why LIRS: agent sessions come back in a cycle longer than the tier (each
//! one resends its whole history every turn, the others in between), which
//! is LRU's worst case: it evicts each session just before it returns.
//! LIRS ranks a block by its reuse distance, not its last use: blocks reused
//! within the distance of the blocks already protected are "LIR" and stay;
//! the rest ("HIR") pass through a small queue. On a loop it keeps a fixed
//! set of sessions whole, as Belady's MIN does (~1.00 of MIN on the agentic
//! trace), and one-off blocks (a batch scan) never displace LIR blocks.
//! The prefix rule helps: a request reads its blocks parent first, so the
//! blocks of one session have the same reuse distance and stay or go together.
//!
//! The structure: stack S (recency order of LIR blocks and of recently seen
//! HIR blocks, resident or not), queue Q (resident HIR blocks, the victims,
//! oldest first) and a FIFO of *ghosts* (non-resident HIR blocks still in S,
//! the history that lets a returning block prove a short reuse distance).
//! A node is in S through one pair of links and in Q or the ghost FIFO
//! through another, so every operation is O(1) amortized: stack pruning pops
//! from S's bottom and each node is popped once per entry.
//!
//! One addition to LIRS: a LIR block idle for more than `idle_factor` times
//! its last reuse interval is dead and demoted, so blocks of sessions that
//! ended and of a replaced system prompt leave the protected set instead of
//! waiting for a promotion to push them out (LRU evicts them by itself;
//! plain LIRS stayed below LRU there). A dead block goes to the *front* of
//! Q (the next victim), not its back: it is predicted dead, and the new
//! blocks already waiting in Q (a new session, the new system prompt) are
//! what the tier should keep. A LIR block never reused has no interval of
//! its own: it is dead once idle for longer than the last dead block with
//! an interval was when it was found (the idle time that proved a session
//! over: a session's last answer blocks go with the rest of it), or, before
//! any was found, once older than the oldest ghost with the ghost history
//! full. On `bench eviction` (docs/BENCHMARKS.md) these two rules take
//! `ending` at 50/75% and `version` at 75% from below LRU to LRU (= MIN).
//! A death can be false: a scan starting beside a loop stretches the loop's
//! reuse intervals, and its blocks, taken for dead, would be evicted at
//! once and, put again, taken for dead again (their new interval unknown).
//! So a block evicted after a dead demotion is remembered (a FIFO of up to
//! the resident count, like the ghosts); put again while remembered, it
//! proves the death false: it is protected at once and the never-reused
//! rule's threshold is forgotten until the next true death.
//!
//! A tier that evicts in bursts (a node's default watermarks: a full tier
//! evicts down to 0.85 of its capacity, then fills up to 0.95) holds a
//! varying number of blocks. The LIR set is sized to the count the tier
//! keeps for sure: the resident count at the latest eviction (the *floor*,
//! ending each burst at the low watermark's count). Blocks put above it
//! stay HIR, so the next burst takes them from Q. Sized by the resident
//! count instead, a burst demoted the stack's bottom LIR blocks (the least
//! recently used: LRU's choice) and the blocks put after it became LIR
//! unproven; at 0.95 / 0.85 LIRS then hit what LRU hits on the agentic
//! trace (0.329 at 10-50% of its blocks, `bench eviction --watermarks`).
//!
//! Knobs (docs/CONFIG.md): the HIR share of resident blocks (`hir_percent`,
//! LIRS' usual 1%), the ghost history (`history`: ghosts per resident block;
//! the longest reuse distance LIRS can still see is about this many tiers'
//! worth of evictions, which is what a scan between two turns of a session
//! must stay under for the session to keep its place; a ghost costs a key
//! and links, ~100 bytes with its index entry) and `idle_factor`.

use std::hash::RandomState;

use allocator_api2::vec::Vec as HugeVec;

use super::list::Slot;
use crate::huge_alloc::HugeAlloc;
use crate::keys::BlockKey;
use crate::rec::Rec;

const NIL: u32 = u32::MAX;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// Resident, protected (in S).
    Lir,
    /// Resident, in Q (and in S when seen recently).
    Hir,
    /// Not resident, in S and in the ghost FIFO.
    Ghost,
    /// Not resident, evicted after a dead demotion, in the dead FIFO only.
    Dead,
    Free,
}

#[derive(Debug)]
struct Node {
    key: BlockKey,
    /// The block's record in the store's `BlockMap` (valid while resident).
    rec: Rec,
    /// Links in S.
    s: (u32, u32),
    /// Links in Q (Hir) or in the ghost FIFO (Ghost).
    q: (u32, u32),
    state: State,
    in_s: bool,
    /// Demoted as dead and not read since.
    dead: bool,
    /// The order's clock at the block's last access.
    last: u64,
    /// The block's last reuse interval (clock ticks), 0 = not reused yet.
    irr: u64,
}

/// Ends of one list; `head` is the oldest (S: the bottom; Q: the next victim).
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

#[derive(Clone, Copy, PartialEq, Eq)]
enum List {
    S,
    Q,
    G,
    D,
}

/// LIRS ranking of one tier's blocks.
#[derive(Debug)]
pub struct Lirs {
    /// The slab and the ghost index are on huge pages: at a million blocks
    /// they are hundreds of MB touched at random.
    nodes: HugeVec<Node, HugeAlloc>,
    free: Vec<Slot>,
    s: Ends,
    q: Ends,
    g: Ends,
    /// Blocks evicted after a dead demotion (FIFO through the Q links).
    d: Ends,
    /// The index of every remembered block that is not resident: the
    /// ghosts and the dead FIFO's blocks (a node's state says which). One
    /// map, so an insert probes once: with a map each, every put of a new
    /// block missed in both (two dependent DRAM misses at a million keys):
    /// one table keeps LIRS' op cost at 1M blocks at 0.66-0.73 of its 10k
    /// cost, two gave 0.48-0.52 (docs/BENCHMARKS.md, metadata scale).
    gone: hashbrown::HashMap<BlockKey, Slot, RandomState, HugeAlloc>,
    lir: usize,
    resident: usize,
    hir_percent: f64,
    history: usize,
    /// Ticks once per insert and touch.
    clock: u64,
    /// A LIR block idle for more than this many times its reuse interval is
    /// dead (0 = never).
    idle_factor: f64,
    /// The idle time of the last dead block with a reuse interval, when it
    /// was found: a never-reused LIR block idle longer is dead too.
    dead_idle: Option<u64>,
    /// The resident count at the latest eviction (`evicting`); None before
    /// the first. The LIR set is sized to it (module doc).
    floor: Option<usize>,
}

impl Lirs {
    /// An empty order: `hir_percent` of resident blocks are HIR, up to
    /// `history` ghosts per resident block are remembered, and a LIR block
    /// idle for `idle_factor` times its reuse interval is demoted.
    pub fn new(hir_percent: f64, history: usize, idle_factor: f64) -> Self {
        Lirs {
            nodes: HugeVec::new_in(HugeAlloc),
            free: Vec::new(),
            s: EMPTY,
            q: EMPTY,
            g: EMPTY,
            d: EMPTY,
            gone: hashbrown::HashMap::with_hasher_in(RandomState::new(), HugeAlloc),
            lir: 0,
            resident: 0,
            hir_percent: hir_percent.clamp(0.0, 100.0),
            history,
            clock: 0,
            idle_factor: idle_factor.max(0.0),
            dead_idle: None,
            floor: None,
        }
    }

    /// The most LIR blocks for the resident count, or the eviction floor
    /// when lower (at least one HIR block).
    fn lir_cap(&self) -> usize {
        let base = self.floor.map_or(self.resident, |f| f.min(self.resident));
        let hir = ((base as f64 * self.hir_percent / 100.0) as usize).max(1);
        base.saturating_sub(hir)
    }

    /// The tier is about to evict a block (it is full): its resident count
    /// now is the new floor. `victim_at` calls it; an order that evicts by
    /// another list while keeping this one in step (`adaptive` in LRU mode)
    /// calls it before each eviction too.
    pub(super) fn evicting(&mut self) {
        self.floor = Some(self.resident);
    }

    fn ends(&mut self, l: List) -> &mut Ends {
        match l {
            List::S => &mut self.s,
            List::Q => &mut self.q,
            List::G => &mut self.g,
            List::D => &mut self.d,
        }
    }

    fn links(&mut self, l: List, n: u32) -> &mut (u32, u32) {
        let node = &mut self.nodes[n as usize];
        if l == List::S {
            &mut node.s
        } else {
            &mut node.q
        }
    }

    fn push(&mut self, l: List, n: u32) {
        let tail = self.ends(l).tail;
        *self.links(l, n) = (tail, NIL);
        if tail == NIL {
            self.ends(l).head = n;
        } else {
            self.links(l, tail).1 = n;
        }
        let e = self.ends(l);
        e.tail = n;
        e.len += 1;
        if l == List::S {
            self.nodes[n as usize].in_s = true;
        }
    }

    /// `n` at Q's front (the next victim).
    fn push_front_q(&mut self, n: u32) {
        let head = self.q.head;
        self.nodes[n as usize].q = (NIL, head);
        if head == NIL {
            self.q.tail = n;
        } else {
            self.nodes[head as usize].q.0 = n;
        }
        self.q.head = n;
        self.q.len += 1;
    }

    fn unlink(&mut self, l: List, n: u32) {
        let (prev, next) = *self.links(l, n);
        if prev == NIL {
            self.ends(l).head = next;
        } else {
            self.links(l, prev).1 = next;
        }
        if next == NIL {
            self.ends(l).tail = prev;
        } else {
            self.links(l, next).0 = prev;
        }
        self.ends(l).len -= 1;
        if l == List::S {
            self.nodes[n as usize].in_s = false;
        }
    }

    fn move_to_top(&mut self, n: u32) {
        if self.nodes[n as usize].in_s {
            if self.s.tail == n {
                return;
            }
            self.unlink(List::S, n);
        }
        self.push(List::S, n);
    }

    fn alloc(&mut self, key: BlockKey, rec: Rec, state: State) -> Slot {
        let node = Node {
            key,
            rec,
            s: (NIL, NIL),
            q: (NIL, NIL),
            state,
            in_s: false,
            dead: false,
            last: self.clock,
            irr: 0,
        };
        match self.free.pop() {
            Some(s) => {
                self.nodes[s as usize] = node;
                s
            }
            None => {
                self.nodes.push(node);
                (self.nodes.len() - 1) as Slot
            }
        }
    }

    fn release(&mut self, n: u32) {
        self.nodes[n as usize].state = State::Free;
        self.free.push(n);
    }

    /// Pop HIR entries off S's bottom until a LIR block is there (ghosts
    /// popped are forgotten).
    fn prune(&mut self) {
        while self.s.head != NIL {
            let b = self.s.head;
            match self.nodes[b as usize].state {
                State::Lir => break,
                State::Ghost => {
                    self.unlink(List::S, b);
                    self.forget_ghost(b);
                }
                _ => self.unlink(List::S, b),
            }
        }
    }

    fn forget_ghost(&mut self, b: u32) {
        self.unlink(List::G, b);
        let key = self.nodes[b as usize].key;
        self.gone.remove(&key);
        self.release(b);
    }

    /// The bottom LIR block becomes HIR (back of Q, out of S).
    fn demote_bottom(&mut self) {
        let b = self.s.head;
        if b == NIL {
            return;
        }
        debug_assert_eq!(self.nodes[b as usize].state, State::Lir);
        self.unlink(List::S, b);
        self.nodes[b as usize].state = State::Hir;
        self.lir -= 1;
        self.push(List::Q, b);
        self.prune();
    }

    /// The bottom LIR block is dead (`idle`): HIR at Q's front, out of S.
    fn demote_dead(&mut self) {
        let b = self.s.head;
        let node = &self.nodes[b as usize];
        debug_assert_eq!(node.state, State::Lir);
        if node.irr > 0 {
            self.dead_idle = Some(self.clock - node.last);
        }
        self.unlink(List::S, b);
        self.nodes[b as usize].state = State::Hir;
        self.nodes[b as usize].dead = true;
        self.lir -= 1;
        self.push_front_q(b);
        self.prune();
    }

    /// A HIR block (out of Q) or a returning ghost seen again within S: LIR.
    fn promote(&mut self, n: u32) {
        self.nodes[n as usize].dead = false;
        self.nodes[n as usize].state = State::Lir;
        self.lir += 1;
        self.move_to_top(n);
        // S's bottom is LIR whenever a LIR block exists (HIR entries below
        // the lowest one are pruned), so demotion always takes a LIR block.
        self.prune();
        while self.lir > self.lir_cap() && self.s.head != n {
            self.demote_bottom();
        }
    }

    /// Count an access of `n` (its reuse interval, the clock).
    fn accessed(&mut self, n: u32) {
        self.clock += 1;
        let node = &mut self.nodes[n as usize];
        node.irr = self.clock - node.last;
        node.last = self.clock;
    }

    /// Whether the LIR block `n` is dead: idle for longer than `idle_factor`
    /// times its last reuse interval (a session that ended, a system prompt
    /// replaced by a new version) or, never reused, idle for longer than the
    /// last dead block was (`dead_idle`), or, before there was one, idle
    /// since before the oldest ghost once the ghost history is full (a ghost
    /// that old would have been forgotten too).
    fn idle(&self, n: u32) -> bool {
        let node = &self.nodes[n as usize];
        if node.state != State::Lir || self.idle_factor <= 0.0 {
            return false;
        }
        let idle = self.clock - node.last;
        if node.irr > 0 {
            return idle as f64 > self.idle_factor * node.irr as f64;
        }
        if let Some(d) = self.dead_idle {
            return idle > d;
        }
        self.g.len > 0
            && self.g.len >= self.ghost_cap()
            && node.last < self.nodes[self.g.head as usize].last
    }

    fn ghost_cap(&self) -> usize {
        self.history * self.resident.max(64)
    }

    pub(super) fn insert(&mut self, key: BlockKey, rec: Rec) -> Slot {
        self.resident += 1;
        let Some(n) = self.gone.remove(&key) else {
            return self.insert_new(key, rec);
        };
        if self.nodes[n as usize].state == State::Dead {
            // A false death (see the module doc): protect it, forget the threshold.
            self.unlink(List::D, n);
            self.dead_idle = None;
            self.clock += 1;
            let node = &mut self.nodes[n as usize];
            (node.last, node.irr, node.rec) = (self.clock, 0, rec);
            self.promote(n);
            return n;
        }
        debug_assert_eq!(self.nodes[n as usize].state, State::Ghost);
        self.nodes[n as usize].rec = rec;
        self.accessed(n);
        self.unlink(List::G, n);
        self.promote(n);
        n
    }

    /// Insert a block no list remembers.
    fn insert_new(&mut self, key: BlockKey, rec: Rec) -> Slot {
        self.clock += 1;
        if self.lir < self.lir_cap() {
            let n = self.alloc(key, rec, State::Lir);
            self.lir += 1;
            self.push(List::S, n);
            self.prune();
            return n;
        }
        let n = self.alloc(key, rec, State::Hir);
        self.push(List::S, n);
        self.push(List::Q, n);
        n
    }

    pub(super) fn touch(&mut self, n: Slot, key: &BlockKey) {
        debug_assert!(self.holds(n, key), "stale slot {n} for {key:?}");
        self.accessed(n);
        self.nodes[n as usize].dead = false;
        match self.nodes[n as usize].state {
            State::Lir => {
                let bottom = self.s.head == n;
                self.move_to_top(n);
                if bottom {
                    self.prune();
                }
            }
            State::Hir if self.nodes[n as usize].in_s => {
                self.unlink(List::Q, n);
                self.promote(n);
            }
            State::Hir => {
                self.push(List::S, n);
                self.unlink(List::Q, n);
                self.push(List::Q, n);
            }
            State::Ghost | State::Dead | State::Free => {}
        }
    }

    pub(super) fn remove(&mut self, n: Slot, key: &BlockKey) {
        debug_assert!(self.holds(n, key), "stale slot {n} for {key:?}");
        self.resident -= 1;
        match self.nodes[n as usize].state {
            State::Lir => {
                self.unlink(List::S, n);
                self.lir -= 1;
                self.release(n);
                self.prune();
            }
            State::Hir => {
                self.unlink(List::Q, n);
                if self.nodes[n as usize].dead {
                    self.remember_dead(n, key);
                } else if !self.nodes[n as usize].in_s {
                    self.release(n);
                } else {
                    self.nodes[n as usize].state = State::Ghost;
                    self.push(List::G, n);
                    self.gone.insert(*key, n);
                }
            }
            State::Ghost | State::Dead | State::Free => {}
        }
        self.trim_ghosts();
    }

    /// Forget the oldest ghosts past the history for the resident count
    /// (it falls with every block that leaves).
    fn trim_ghosts(&mut self) {
        while self.g.len > self.ghost_cap() {
            let old = self.g.head;
            self.unlink(List::S, old);
            self.forget_ghost(old);
        }
    }

    /// The HIR block `n` (`key`), demoted as dead and never read since,
    /// leaves: remember it (the dead FIFO holds up to the resident count).
    fn remember_dead(&mut self, n: u32, key: &BlockKey) {
        self.nodes[n as usize].state = State::Dead;
        self.push(List::D, n);
        self.gone.insert(*key, n);
        while self.d.len > self.resident.max(64) {
            let old = self.d.head;
            self.unlink(List::D, old);
            let k = self.nodes[old as usize].key;
            self.gone.remove(&k);
            self.release(old);
        }
    }

    pub(super) fn prefetch(&self, n: Slot) {
        if let Some(node) = self.nodes.get(n as usize) {
            crate::huge_alloc::prefetch(node);
        }
    }

    /// `victim_at` with an eligibility test of the key alone.
    #[cfg(test)]
    pub(super) fn victim(
        &mut self,
        mut eligible: impl FnMut(&BlockKey) -> bool,
    ) -> Option<BlockKey> {
        self.victim_at(|k, _| eligible(k))
    }

    pub(super) fn victim_at(
        &mut self,
        mut eligible: impl FnMut(&BlockKey, Rec) -> bool,
    ) -> Option<BlockKey> {
        self.evicting();
        loop {
            if self.lir > self.lir_cap() {
                self.demote_bottom();
            } else if self.s.head != NIL && self.idle(self.s.head) {
                self.demote_dead();
            } else {
                break;
            }
        }
        let mut at = self.q.head;
        while at != NIL {
            let (key, rec) = (self.nodes[at as usize].key, self.nodes[at as usize].rec);
            if eligible(&key, rec) {
                return Some(key);
            }
            at = self.nodes[at as usize].q.1;
        }
        // Every HIR block is pinned or leased: the oldest eligible LIR block.
        let mut at = self.s.head;
        while at != NIL {
            let n = &self.nodes[at as usize];
            if n.state == State::Lir && eligible(&n.key, n.rec) {
                return Some(n.key);
            }
            at = n.s.1;
        }
        None
    }

    /// Whether `n` holds the resident block `key`.
    pub(super) fn holds(&self, n: Slot, key: &BlockKey) -> bool {
        self.nodes
            .get(n as usize)
            .is_some_and(|x| matches!(x.state, State::Lir | State::Hir) && x.key == *key)
    }

    /// Resident blocks, LIR blocks, ghosts (tests).
    #[cfg(test)]
    pub(super) fn counts(&self) -> (usize, usize, usize) {
        (self.resident, self.lir, self.g.len)
    }
}
