//! `adaptive`: LIRS, LRU or `door`, whichever is winning on the tier's
//! recent lookups (set dueling, Qureshi et al., ISCA '07, with whole shadow
//! caches instead of leader sets).
//!
//! `door` (LRU behind a doorkeeper, `policy::door`) is the third order
//! since #48: on production traces where most blocks are put once and never
//! read (the Mooncake FAST'25 traces) it is ahead of both where the tier is
//! scarce, and behind LRU where new blocks come back soon; its shadow and
//! its lead over LRU (`door_score`) run beside LIRS', and another order
//! takes over once ahead of the running one by the margin (below: LIRS
//! against LRU, as before; door's lead is judged the same way).
//!
//! Why: LIRS is near Belady's MIN on agent traffic (sessions that return in
//! a cycle longer than the tier, and scans), but where the working set fits
//! the tier and keeps changing (sessions that end, a Zipf mix whose hot set
//! drifts) it pays a new session's second turn that LRU keeps, and no single
//! LIRS setting closed that without losing the agentic trace
//! (docs/BENCHMARKS.md, the eviction sections). So the tier runs both.
//!
//! Two metadata-only shadow caches (`Shadow`: keys and links, no data)
//! replay the tier's lookups and puts, one ordered by LIRS and one by LRU,
//! each holding as many keys as the tier holds blocks (its most residents
//! so far; times the sample rate), and once full evicting down to the
//! tier's low watermark in proportion, as the tier does (`shadow` says why
//! one at a time was wrong). A lookup's hit in a shadow is its longest
//! held prefix, the store's rule (as the capacity planner's mini-caches
//! count it, `planner::mini`). Their hits feed one score, decayed so it
//! remembers about `window` tiers' worth of looked-up keys: positive, LIRS
//! is ahead; negative, LRU. The other order takes over only once ahead by
//! `margin` times the shadows' size (orders within a few hits of each other
//! would trade places on noise, and each switch costs: the tier's contents
//! were chosen by the other order), or, with `confidence` > 0, once ahead by
//! `confidence` times the square root of the decayed sum of the squared
//! per-lookup differences (a sign-flip test: were the orders even, each
//! difference's sign would be a coin flip), whichever is less. The tier's
//! own victims come from the order that leads: LIRS' queue (its stack and
//! queues are kept in step in every mode), or the least recently used
//! resident (an [`Lru`] over the residents, kept in step too). The tier
//! starts with `start`, LRU by default: where LRU is optimal (a working set
//! that fits and keeps changing), starting with LIRS paid a loss before the
//! score could turn (`bench eviction`'s `ending` trace; docs/BENCHMARKS.md,
//! eviction sections). A tie keeps the mode it has, so a replay of the
//! same operations makes the same choices.
//!
//! A shadow must see what a tier of its order would see. Its size is the
//! tier's, unknown until the tier first evicts: until then the sampled
//! lookups and puts wait (`Pending`) and are replayed then. A looked-up key
//! it lacks is put at once only if the tier held it (no put will come);
//! one the tier lacks too is put when the tier puts it. (Putting it at
//! once too put it twice: the first copy churned out of LIRS' probation
//! queue, the second came back as a ghost hit and was protected.)
//!
//! Sampling (`sample_rate` < 1): only keys whose hash falls below the rate
//! enter the shadows (SHARDS' rule; every access of a sampled key is seen),
//! and each shadow holds the rate times the tier's blocks: the cost of the
//! shadows shrinks with the rate, their estimate gets noisier.
//!
//! Cost: a lookup hashes each key into both shadows (O(1) each, and O(1)
//! amortized for LIRS' pruning); a put, the same; touch and remove add one
//! list operation. The shadows' maps reuse their memory once the tier is
//! full (no allocation per operation). The RAM tier runs it on the store's
//! lookups (`Store::lookup`: without them the order never leaves `start`);
//! the disk tier's order runs LIRS (its order never sees lookups).
//!
//! On a cluster node (`feed_from_cluster`) the shadows replay the cluster
//! instead: the lookups and first RAM holders of the keys the node's
//! directory shard owns (`cluster_lookup`, `cluster_put`; `cluster::
//! order_feed` says why), each shadow holding the most of those keys the
//! cluster's RAM held at once; the tier's own lookups and inserts are not
//! replayed. Its tier's reads by peers and its evicted blocks' next lookups
//! (made on other nodes) never reached its own shadows, so the order it did
//! not run could never show a lead. `stats` counts the shadows' hits.

use super::door::Door;
use super::lirs::Lirs;
use super::list::Slot;
use super::lru::Lru;
use super::shadow::{sampled, Pending, Shadow, ShadowOrder, Size, PUT};
use crate::keys::BlockKey;
use crate::rec::Rec;

/// Which order the tier's victims come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AdaptiveMode {
    Lirs,
    Lru,
    /// LRU behind a doorkeeper (`door`).
    Door,
}

/// The tunables of an [`Adaptive`] order.
#[derive(Clone, Copy, Debug)]
pub struct AdaptiveKnobs {
    pub hir_percent: f64,
    pub history: usize,
    pub idle_factor: f64,
    /// Tiers' worth of looked-up keys the score remembers.
    pub window: f64,
    /// How far ahead (decayed hits, times the shadows' size) the other
    /// order must be to take over.
    pub margin: f64,
    /// Sign-flip test: the other order also takes over once its lead is
    /// this many times the square root of the decayed sum of squared
    /// per-lookup differences (0: the fixed margin alone).
    pub confidence: f64,
    /// The order the tier starts with.
    pub start: AdaptiveMode,
    /// Share of keys the shadows see (0, 1].
    pub sample_rate: f64,
    /// Once full, the shadows evict down to this share of their size: the
    /// tier's low watermark over its high one (`shadow`; 1: one at a time).
    pub burst: f64,
}

/// What an [`Adaptive`] order has seen and chosen since it started: the
/// mode, and its shadows' hits on the lookups they replayed (evidence of
/// why it leads where it does; `Store::adaptive_stats`).
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct AdaptiveStats {
    /// The order the tier's victims come from now.
    pub mode: AdaptiveMode,
    /// Whether the cluster's directory feeds the shadows (else the tier).
    pub cluster_fed: bool,
    /// Lookups the shadows replayed (sampled keys, after the tier first evicted).
    pub lookups: u64,
    /// Blocks the LIRS shadow and the LRU shadow hit on them.
    pub lirs_hits: u64,
    pub lru_hits: u64,
    /// Blocks the `door` shadow hit on them.
    pub door_hits: u64,
    /// Times the mode changed.
    pub switches: u64,
    /// Keys each shadow holds at most now.
    pub shadow_cap: u64,
    /// The decayed score (LIRS minus LRU) now.
    pub score: f64,
    /// The decayed score of `door` (door minus LRU) now.
    pub door_score: f64,
}

/// LIRS and LRU over the tier's blocks, victims from the one that leads.
#[derive(Debug)]
pub struct Adaptive {
    lirs: Lirs,
    /// The residents, least recently used first.
    lru: Lru,
    /// A resident's slot in `lru`, by its LIRS slot (the one the store keeps).
    lru_slot: Vec<Slot>,
    /// The residents behind a doorkeeper (`door`).
    door: Door,
    /// A resident's slot in `door`, by its LIRS slot.
    door_slot: Vec<Slot>,
    /// The LIRS, LRU and door shadows.
    shadows: [Shadow; 3],
    /// Decayed LIRS hits minus LRU hits on the sampled lookups.
    score: f64,
    /// Decayed sum of the squared per-lookup differences (the score's
    /// spread were the two orders even).
    spread: f64,
    /// Decayed door hits minus LRU hits, and the spreads of door minus
    /// LRU and of door minus LIRS.
    door_score: f64,
    door_spread: f64,
    cross_spread: f64,
    mode: AdaptiveMode,
    /// The most blocks the tier has held: the shadows' size.
    most: usize,
    /// What the tier saw before it first evicted (None since).
    pending: Option<Pending>,
    window: f64,
    margin: f64,
    confidence: f64,
    /// Keys whose hash is below this are sampled (u64::MAX: all).
    threshold: u64,
    rate: f64,
    /// The shadows' burst (`AdaptiveKnobs::burst`).
    burst: f64,
    /// Sampled keys of the lookup at hand (kept to reuse its memory).
    scratch: Vec<BlockKey>,
    /// Set by a cluster node: its directory shard's lookups and puts feed
    /// the shadows ([`Adaptive::cluster_lookup`], [`Adaptive::cluster_put`]),
    /// the tier's own lookups and inserts do not; the shadows hold
    /// `cluster_most` keys.
    cluster_fed: bool,
    /// The most keys of the shard held in the cluster at once.
    cluster_most: usize,
    /// Counters of [`AdaptiveStats`].
    lookups: u64,
    hits: [u64; 3],
    switches: u64,
}

impl Adaptive {
    pub fn new(k: AdaptiveKnobs) -> Self {
        let lirs = || Lirs::new(k.hir_percent, k.history, k.idle_factor);
        let rate = k.sample_rate.clamp(f64::MIN_POSITIVE, 1.0);
        let threshold = if rate >= 1.0 {
            u64::MAX
        } else {
            (rate * 2f64.powi(64)) as u64
        };
        Adaptive {
            lirs: lirs(),
            lru: Lru::default(),
            lru_slot: Vec::new(),
            door: Door::default(),
            door_slot: Vec::new(),
            shadows: [
                Shadow::new(ShadowOrder::Lirs(lirs())),
                Shadow::new(ShadowOrder::Lru(Lru::default())),
                Shadow::new(ShadowOrder::Door(Door::default())),
            ],
            score: 0.0,
            spread: 0.0,
            door_score: 0.0,
            door_spread: 0.0,
            cross_spread: 0.0,
            mode: k.start,
            most: 0,
            pending: Some(Pending::default()),
            window: k.window.max(f64::MIN_POSITIVE),
            margin: k.margin.max(0.0),
            confidence: k.confidence.max(0.0),
            threshold,
            rate,
            burst: k.burst,
            scratch: Vec::new(),
            cluster_fed: false,
            cluster_most: 0,
            lookups: 0,
            hits: [0; 3],
            switches: 0,
        }
    }

    /// What the order has seen and chosen so far.
    pub fn stats(&self) -> AdaptiveStats {
        AdaptiveStats {
            mode: self.mode,
            cluster_fed: self.cluster_fed,
            lookups: self.lookups,
            lirs_hits: self.hits[0],
            lru_hits: self.hits[1],
            door_hits: self.hits[2],
            switches: self.switches,
            shadow_cap: self.shadow_cap() as u64,
            score: self.score,
            door_score: self.door_score,
        }
    }

    /// From now on the shadows are fed by a cluster node's directory shard
    /// (see the module doc), not by the tier's lookups and inserts.
    pub fn feed_from_cluster(&mut self) {
        self.cluster_fed = true;
    }

    /// The order the tier's victims come from now (tests).
    #[cfg(test)]
    pub(super) fn mode(&self) -> AdaptiveMode {
        self.mode
    }

    /// Keys each shadow holds: the tier's most blocks times the rate (fed
    /// by a cluster: the most keys of the shard the cluster held at once).
    fn shadow_cap(&self) -> usize {
        let most = if self.cluster_fed {
            self.cluster_most
        } else {
            self.most
        };
        ((most as f64 * self.rate).round() as usize).max(1)
    }

    /// The shadows' size and the share they evict down to when full.
    fn shadow_size(&self) -> Size {
        Size::new(self.shadow_cap(), self.burst)
    }

    /// The store looked up `keys` (prefix order) and held their first
    /// `found`: both shadows replay it, the score moves by their hits'
    /// difference, and the leader leads. Until the tier first evicts, its
    /// size is unknown: the sampled keys wait in `pending`, replayed then.
    pub fn lookup(&mut self, keys: &[BlockKey], found: usize) {
        if !self.cluster_fed {
            self.replay_lookup(keys, found);
        }
    }

    /// A cluster lookup of `keys` (the keys of a looked-up chain this
    /// node's directory shard owns, in chain order), of which the cluster
    /// held the first `found`: replayed as [`Adaptive::lookup`] replays the
    /// tier's (ignored unless fed by the cluster).
    pub fn cluster_lookup(&mut self, keys: &[BlockKey], found: usize) {
        if self.cluster_fed {
            self.replay_lookup(keys, found);
        }
    }

    /// Keys of the shard entered the cluster (no node held them); `held`
    /// keys of the shard are held now: the shadows put them, and hold at
    /// most the largest `held` seen (ignored unless fed by the cluster).
    pub fn cluster_put(&mut self, keys: &[BlockKey], held: usize) {
        if !self.cluster_fed {
            return;
        }
        self.cluster_most = self.cluster_most.max(held);
        for k in keys {
            self.shadow_put(*k);
        }
    }

    /// The lookup of `keys` replayed on the shadows (or kept for them).
    fn replay_lookup(&mut self, keys: &[BlockKey], found: usize) {
        let mut ks = std::mem::take(&mut self.scratch);
        ks.clear();
        let mut found_s = 0;
        for (i, k) in keys.iter().enumerate() {
            if sampled(self.threshold, k) {
                ks.push(*k);
                if i < found {
                    found_s += 1;
                }
            }
        }
        if let Some(p) = &mut self.pending {
            if !ks.is_empty() {
                p.events
                    .push((p.keys.len() as u32, ks.len() as u32, found_s));
                p.keys.extend_from_slice(&ks);
            }
        } else if !ks.is_empty() {
            self.duel(&ks, found_s);
        }
        self.scratch = ks;
    }

    /// Both shadows look up `keys` (sampled, the tier held the first
    /// `found`); the score and the mode follow.
    fn duel(&mut self, keys: &[BlockKey], found: u32) {
        let size = self.shadow_size();
        let cap = size.cap;
        let lirs = self.shadows[0].lookup(keys, found as usize, size) as f64;
        let lru = self.shadows[1].lookup(keys, found as usize, size) as f64;
        let door = self.shadows[2].lookup(keys, found as usize, size) as f64;
        // Forget 1/(window * cap) per key looked up.
        let keep = (1.0 - 1.0 / (self.window * cap as f64)).max(0.0);
        let decay = keep.powi(keys.len() as i32);
        let d = lirs - lru;
        self.score = self.score * decay + d;
        self.spread = self.spread * decay + d * d;
        let dd = door - lru;
        self.door_score = self.door_score * decay + dd;
        self.door_spread = self.door_spread * decay + dd * dd;
        let dx = door - lirs;
        self.cross_spread = self.cross_spread * decay + dx * dx;
        self.lookups += 1;
        self.hits[0] += lirs as u64;
        self.hits[1] += lru as u64;
        self.hits[2] += door as u64;
        let was = self.mode;
        // Each order's lead over LRU; another order takes over once ahead
        // of the one running by the bar (LIRS checked before door: with
        // door never ahead this is the two-order rule exactly).
        let value = |a: &Self, m: AdaptiveMode| match m {
            AdaptiveMode::Lru => 0.0,
            AdaptiveMode::Lirs => a.score,
            AdaptiveMode::Door => a.door_score,
        };
        let spread =
            |a: &Self, x: AdaptiveMode, y: AdaptiveMode| match (x, y) {
                (AdaptiveMode::Lru, AdaptiveMode::Lirs)
                | (AdaptiveMode::Lirs, AdaptiveMode::Lru) => a.spread,
                (AdaptiveMode::Lru, AdaptiveMode::Door)
                | (AdaptiveMode::Door, AdaptiveMode::Lru) => a.door_spread,
                _ => a.cross_spread,
            };
        let mut best = (was, 0.0);
        for cand in [AdaptiveMode::Lru, AdaptiveMode::Lirs, AdaptiveMode::Door] {
            if cand == was {
                continue;
            }
            let mut m = self.margin * cap as f64;
            if self.confidence > 0.0 {
                // Were the orders even, each difference's sign would be a
                // coin flip: the lead's spread is then sqrt(spread).
                m = m.min(self.confidence * spread(self, was, cand).sqrt());
            }
            let lead = value(self, cand) - value(self, was);
            if lead > m && lead > best.1 {
                best = (cand, lead);
            }
        }
        self.mode = best.0;
        if self.mode != was {
            self.switches += 1;
            tracing::debug!(mode = ?self.mode, score = self.score, door_score = self.door_score, "adaptive eviction order switched");
        }
    }

    /// The tier evicts for the first time: its size is known, the shadows
    /// replay what it saw so far.
    fn start_shadows(&mut self) {
        let Some(p) = self.pending.take() else {
            return;
        };
        let size = self.shadow_size();
        for &(start, len, found) in &p.events {
            let keys = &p.keys[start as usize..(start + len) as usize];
            if found == PUT {
                for s in &mut self.shadows {
                    s.put(keys[0], size);
                }
            } else {
                self.duel(keys, found);
            }
        }
    }

    /// A put of `key` for the shadows (or kept for them).
    fn shadow_put(&mut self, key: BlockKey) {
        if !sampled(self.threshold, &key) {
            return;
        }
        if let Some(p) = &mut self.pending {
            p.events.push((p.keys.len() as u32, 1, PUT));
            p.keys.push(key);
        } else {
            let size = self.shadow_size();
            for s in &mut self.shadows {
                s.put(key, size);
            }
        }
    }

    pub(super) fn insert(&mut self, key: BlockKey, rec: Rec) -> Slot {
        if !self.cluster_fed {
            self.shadow_put(key);
        }
        let slot = self.lirs.insert(key, rec);
        let q = self.lru.insert(key, rec);
        let i = slot as usize;
        if self.lru_slot.len() <= i {
            self.lru_slot.resize(i + 1, 0);
        }
        self.lru_slot[i] = q;
        let q = self.door.insert(key, rec);
        if self.door_slot.len() <= i {
            self.door_slot.resize(i + 1, 0);
        }
        self.door_slot[i] = q;
        self.most = self.most.max(self.lru.len());
        slot
    }

    pub(super) fn touch(&mut self, slot: Slot, key: &BlockKey) {
        self.lirs.touch(slot, key);
        self.lru.touch(self.lru_slot[slot as usize], key);
        self.door.touch(self.door_slot[slot as usize], key);
    }

    pub(super) fn remove(&mut self, slot: Slot, key: &BlockKey) {
        self.lirs.remove(slot, key);
        self.lru.remove(self.lru_slot[slot as usize], key);
        self.door.remove(self.door_slot[slot as usize], key);
    }

    pub(super) fn prefetch(&self, slot: Slot) {
        self.lirs.prefetch(slot);
    }

    pub(super) fn victim_at(
        &mut self,
        eligible: impl FnMut(&BlockKey, Rec) -> bool,
    ) -> Option<BlockKey> {
        self.start_shadows();
        match self.mode {
            AdaptiveMode::Lirs => self.lirs.victim_at(eligible),
            AdaptiveMode::Lru => {
                self.lirs.evicting();
                self.lru.victim(eligible)
            }
            AdaptiveMode::Door => {
                self.lirs.evicting();
                self.door.victim(eligible)
            }
        }
    }

    /// What `victim_at` looks at first, when it can tell (LRU mode: the
    /// least recently used resident).
    pub(super) fn peek(&self) -> Option<(BlockKey, Rec)> {
        match self.mode {
            AdaptiveMode::Lirs => None,
            AdaptiveMode::Lru => self.lru.peek(),
            AdaptiveMode::Door => self.door.peek(),
        }
    }

    /// The keys shadow `i` holds (0: LIRS, 1: LRU; tests).
    #[cfg(test)]
    pub(super) fn shadow_keys(&self, i: usize) -> impl Iterator<Item = BlockKey> + '_ {
        self.shadows[i].keys()
    }
}
