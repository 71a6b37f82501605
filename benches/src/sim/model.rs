//! The simulation proper: the agentic trace on N engines as a seeded
//! discrete-event run, with no real engine, node or network.
//!
//! - Sessions join and turns are paced exactly as `bench agentic`'s driver
//!   does (session s+1 joins when session s's first turn is answered; at
//!   most `rate` sends per second) and each turn goes to the engine
//!   [`route`] picks: the same uniform random routing, so with the same
//!   seed and engine count every turn lands where the measured run sent it.
//! - The cluster-wide cache is one real [`Store`] of the cluster's total
//!   capacity (engines x node RAM), default eviction; what an engine
//!   computed is put when it finishes. Each block remembers the engine that
//!   computed it (random placement: no session routing).
//! - Each engine has its own KV pool ([`LocalPool`]), an LRU of the blocks it
//!   computed or loaded. As the engine admits a request, its hit is the
//!   longest prefix in its pool, then the longest run after that the
//!   cluster's cache has, looked up at submission.
//! - An engine serves one request at a time (FIFO): cluster hits held by
//!   another engine cross that engine's link out and this one's link in
//!   (each link a FIFO at the measured throughput), then the rest of the
//!   prompt is prefilled (fixed cost + per token), then the answer decoded.
//!   TTFT = queueing + load + prefill; end-to-end adds the decode.
//!
//! What it leaves out (and so where it can be wrong): continuous batching
//! (an engine overlapping one request's decode with another's prefill), the
//! layer-wise load hiding part of the transfer behind the forward pass, and
//! lookup / lease RPC latency.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};

use kvfabric_store::{BlockKey, KeyChain, KvLayout, NodeConfig, PutOptions, Registry, Store};

use super::pool::LocalPool;
use crate::agentic::stats::percentile;
use crate::agentic::trace::{oracle_cached_tokens, route, SplitMix64, TraceEntry, Workload};

/// Measured costs the model runs on.
#[derive(Clone, Debug, PartialEq)]
pub struct Costs {
    /// Prefill cost per request, whatever its length.
    pub prefill_fixed_ms: f64,
    /// Prefill cost per prompt token computed.
    pub prefill_ms_per_token: f64,
    /// Decode cost per generated token after the first.
    pub decode_ms_per_token: f64,
    /// What one host link carries, bytes per second (one direction).
    pub link_bytes_per_s: f64,
    /// Bytes of one block of KV on the wire.
    pub block_bytes: u64,
}

/// One simulated configuration.
#[derive(Clone, Debug)]
pub struct SimParams {
    pub engines: usize,
    /// Most sends per second, all engines together (0 = no pacing).
    pub rate: f64,
    pub answer_tokens: usize,
    pub seed: u64,
    /// Cluster-wide cache, blocks (0 = no cache: every prompt prefilled).
    pub capacity_blocks: usize,
    /// Tokens per block (the engine's `block_tokens`).
    pub block_tokens: usize,
    /// Each engine's KV pool, blocks: its local prefix cache, consulted
    /// before the cluster's (0 = none, as an engine without the cache).
    pub pool_blocks: usize,
    /// Compute the oracle hit ratio (quadratic in the trace: small runs only).
    pub oracle: bool,
}

/// What one simulated run predicts.
#[derive(Clone, Debug, PartialEq)]
pub struct SimResult {
    pub requests: usize,
    pub prompt_tokens: u64,
    pub cached_tokens: u64,
    pub hit_ratio: f64,
    pub oracle_hit_ratio: Option<f64>,
    /// Hit blocks held by the requesting engine (its own pool or its
    /// node) / by another one.
    pub local_blocks: u64,
    pub remote_blocks: u64,
    /// Of `local_blocks`, those found in the engine's own pool.
    pub pool_hit_blocks: u64,
    /// Bytes out of and into each engine's link.
    pub link_out_bytes: Vec<u64>,
    pub link_in_bytes: Vec<u64>,
    pub ttft_ms: Vec<f64>,
    pub e2e_ms: Vec<f64>,
    pub load_ms: Vec<f64>,
    /// Submit of the first request to the end of the last.
    pub wall_s: f64,
}

impl SimResult {
    pub fn ttft_p(&self, p: f64) -> f64 {
        percentile(&self.ttft_ms, p)
    }
    pub fn e2e_p(&self, p: f64) -> f64 {
        percentile(&self.e2e_ms, p)
    }
}

/// Time in microseconds (integers keep the event order exact).
type Us = u64;

fn us(ms: f64) -> Us {
    (ms.max(0.0) * 1e3).round() as Us
}

/// A tiny block layout: the store's bookkeeping decides hits, not bytes.
fn tiny_layout(block_tokens: u32) -> KvLayout {
    KvLayout {
        layers: 1,
        kv_heads: 1,
        head_dim: 16,
        dtype: kvfabric_store::DType::F32,
        block_tokens,
        order: kvfabric_store::BlockOrder::LayerKvTokenHead,
    }
}

/// The cluster-wide cache and who holds each block.
struct Cache {
    store: Option<Store>,
    holder: HashMap<BlockKey, usize>,
    chain: KeyChain,
    layout: KvLayout,
    block: Vec<u8>,
}

impl Cache {
    fn new(capacity_blocks: usize, block_tokens: u32) -> anyhow::Result<Cache> {
        let layout = tiny_layout(block_tokens);
        let slot = layout.block_bytes().div_ceil(4096) * 4096;
        let store = if capacity_blocks == 0 {
            None
        } else {
            let cfg = NodeConfig {
                ram_capacity: bytesize::ByteSize::b((capacity_blocks * slot) as u64),
                ..NodeConfig::default()
            };
            cfg.validate()?;
            Some(Store::open(cfg, &mut Registry::default())?)
        };
        let fp = kvfabric_store::ModelFingerprint([9; 32]);
        Ok(Cache {
            store,
            holder: HashMap::new(),
            chain: KeyChain::new(b"bench-sim", &fp, &layout),
            layout,
            block: vec![0u8; layout.block_bytes()],
        })
    }

    /// The keys of `prompt`'s full blocks an engine may reuse (at least one
    /// token is left to compute, as the engine admits a request).
    fn prompt_keys(&self, prompt: &[u32]) -> Vec<BlockKey> {
        let bt = self.chain.block_tokens();
        let usable = prompt.len().saturating_sub(1) / bt;
        self.chain.keys(&prompt[..usable * bt])
    }

    /// The keys of what an engine computed for `prompt` + `answer` (all but
    /// the answer's last token), full blocks only.
    fn computed_keys(&self, prompt: &[u32], answer: &[u32]) -> Vec<BlockKey> {
        let mut computed = prompt.to_vec();
        computed.extend_from_slice(&answer[..answer.len().saturating_sub(1)]);
        let bt = self.chain.block_tokens();
        self.chain.keys(&computed[..computed.len() / bt * bt])
    }

    /// Holders of the longest run of `keys`, from the first, the cache has.
    fn holders(&self, keys: &[BlockKey]) -> Vec<usize> {
        let Some(store) = &self.store else {
            return Vec::new();
        };
        let found = store.lookup(keys).len();
        keys[..found]
            .iter()
            .map(|k| self.holder.get(k).copied().unwrap_or(usize::MAX))
            .collect()
    }

    /// Put what `engine` computed (`keys`, in order) that the cache lacks.
    fn put(&mut self, engine: usize, keys: &[BlockKey]) -> anyhow::Result<()> {
        let Some(store) = &self.store else {
            return Ok(());
        };
        let found = store.lookup(keys).len();
        for k in &keys[found..] {
            store.put(*k, self.layout, &self.block, PutOptions::default())?;
            self.holder.insert(*k, engine);
        }
        Ok(())
    }
}

/// A request in flight.
struct Sent {
    index: usize,
    session: usize,
    turn: usize,
    prompt: Vec<u32>,
    answer: Vec<u32>,
    engine: usize,
}

/// The state of one run.
struct Sim<'a> {
    workload: &'a Workload,
    p: &'a SimParams,
    costs: &'a Costs,
    cache: Cache,
    /// Each engine's own KV pool.
    pools: Vec<LocalPool>,
    rng: SplitMix64,
    answers: Vec<Vec<Vec<u32>>>,
    engine_free: Vec<Us>,
    out_free: Vec<Us>,
    in_free: Vec<Us>,
    /// Completions: (end time, index) -> request.
    done: BinaryHeap<Reverse<(Us, usize)>>,
    in_flight: HashMap<usize, Sent>,
    trace: Vec<(usize, TraceEntry)>,
    r: SimResult,
}

impl Sim<'_> {
    /// Send session `session`'s next turn at `now`.
    fn send(&mut self, session: usize, now: Us) {
        let (p, costs) = (self.p, self.costs);
        let turn = self.answers[session].len();
        let prompt = self.workload.prompt(session, &self.answers[session]);
        let answer: Vec<u32> = (0..p.answer_tokens)
            .map(|_| 100 + self.rng.below(40_000) as u32)
            .collect();
        let engine = route(p.seed, session, turn, p.engines);
        // As the engine admits: its own pool's prefix, then the cluster's.
        let keys = self.cache.prompt_keys(&prompt);
        let pooled = self.pools[engine].prefix(&keys);
        let holders = self.cache.holders(&keys[pooled..]);
        let cached = (pooled + holders.len()) * p.block_tokens;
        self.r.pool_hit_blocks += pooled as u64;
        self.r.local_blocks += pooled as u64;
        let start = now.max(self.engine_free[engine]);
        // Remote hits, grouped by holder, each over the two links in turn.
        let mut by_holder: Vec<(usize, u64)> = Vec::new();
        for &h in &holders {
            if h == engine || h >= p.engines {
                self.r.local_blocks += 1;
                continue;
            }
            self.r.remote_blocks += 1;
            match by_holder.iter_mut().find(|(x, _)| *x == h) {
                Some((_, n)) => *n += 1,
                None => by_holder.push((h, 1)),
            }
        }
        let mut loaded = start;
        for (h, n) in by_holder {
            let bytes = n * costs.block_bytes;
            let from = loaded.max(self.out_free[h]).max(self.in_free[engine]);
            let end = from + us(bytes as f64 / costs.link_bytes_per_s * 1e3);
            (self.out_free[h], self.in_free[engine], loaded) = (end, end, end);
            self.r.link_out_bytes[h] += bytes;
            self.r.link_in_bytes[engine] += bytes;
        }
        let computed = prompt.len() - cached;
        let first =
            loaded + us(costs.prefill_fixed_ms + computed as f64 * costs.prefill_ms_per_token);
        let end = first + us(p.answer_tokens.saturating_sub(1) as f64 * costs.decode_ms_per_token);
        self.engine_free[engine] = end;
        self.r.ttft_ms.push((first - now) as f64 / 1e3);
        self.r.e2e_ms.push((end - now) as f64 / 1e3);
        self.r.load_ms.push((loaded - start) as f64 / 1e3);
        self.r.prompt_tokens += prompt.len() as u64;
        self.r.cached_tokens += cached as u64;
        let index = self.in_flight.len() + self.trace.len();
        self.done.push(Reverse((end, index)));
        let sent = Sent {
            index,
            session,
            turn,
            prompt,
            answer,
            engine,
        };
        self.in_flight.insert(index, sent);
    }

    /// Request `index` finished: its blocks are cached; its (session, turn).
    fn finish(&mut self, index: usize) -> anyhow::Result<(usize, usize)> {
        let s = self
            .in_flight
            .remove(&index)
            .ok_or_else(|| anyhow::anyhow!("lost request {index}"))?;
        let keys = self.cache.computed_keys(&s.prompt, &s.answer);
        self.cache.put(s.engine, &keys)?;
        self.pools[s.engine].touch(&keys);
        self.answers[s.session].push(s.answer.clone());
        let done = (s.session, s.turn);
        self.trace.push((
            s.index,
            TraceEntry {
                prompt: s.prompt,
                answer: s.answer,
            },
        ));
        Ok(done)
    }
}

/// Run the trace of `workload` under `p` with `costs`.
pub fn simulate(workload: &Workload, p: &SimParams, costs: &Costs) -> anyhow::Result<SimResult> {
    anyhow::ensure!(p.engines > 0, "engines must be > 0");
    anyhow::ensure!(p.block_tokens > 0, "block tokens must be > 0");
    let sessions = workload.users.len();
    let total: usize = workload.users.iter().map(Vec::len).sum();
    let mut sim = Sim {
        workload,
        p,
        costs,
        cache: Cache::new(p.capacity_blocks, p.block_tokens as u32)?,
        pools: (0..p.engines)
            .map(|_| LocalPool::new(p.pool_blocks))
            .collect(),
        rng: SplitMix64::new(p.seed ^ 0x51a1),
        answers: vec![Vec::new(); sessions],
        engine_free: vec![0; p.engines],
        out_free: vec![0; p.engines],
        in_free: vec![0; p.engines],
        done: BinaryHeap::new(),
        in_flight: HashMap::new(),
        trace: Vec::with_capacity(total),
        r: SimResult {
            requests: total,
            prompt_tokens: 0,
            cached_tokens: 0,
            hit_ratio: 0.0,
            oracle_hit_ratio: None,
            local_blocks: 0,
            remote_blocks: 0,
            pool_hit_blocks: 0,
            link_out_bytes: vec![0; p.engines],
            link_in_bytes: vec![0; p.engines],
            ttft_ms: Vec::new(),
            e2e_ms: Vec::new(),
            load_ms: Vec::new(),
            wall_s: 0.0,
        },
    };
    let interval = if p.rate > 0.0 { us(1e3 / p.rate) } else { 0 };
    let mut ready: VecDeque<usize> = (0..sessions.min(1)).collect();
    let mut next_session = ready.len();
    let (mut now, mut next_send) = (0 as Us, 0 as Us);
    while sim.trace.len() < total {
        let next_done = sim.done.peek().map(|Reverse((t, _))| *t);
        let send_at = next_send.max(now);
        if !ready.is_empty() && next_done.is_none_or(|d| send_at <= d) {
            let session = ready.pop_front().unwrap_or_default();
            now = send_at;
            sim.send(session, now);
            next_send = now + interval;
            continue;
        }
        let Some(Reverse((t, index))) = sim.done.pop() else {
            anyhow::bail!("no request in flight and no session ready");
        };
        now = now.max(t);
        // As the driver: the next session joins, then this one goes on.
        let (session, turn) = sim.finish(index)?;
        if turn == 0 && next_session < sessions {
            ready.push_back(next_session);
            next_session += 1;
        }
        if turn + 1 < workload.users[session].len() {
            ready.push_back(session);
        }
    }
    let mut r = sim.r;
    r.wall_s = now as f64 / 1e6;
    r.hit_ratio = r.cached_tokens as f64 / r.prompt_tokens.max(1) as f64;
    if p.oracle {
        let mut trace = sim.trace;
        trace.sort_by_key(|(i, _)| *i);
        let entries: Vec<TraceEntry> = trace.into_iter().map(|(_, e)| e).collect();
        let oracle: usize = oracle_cached_tokens(&entries, p.block_tokens).iter().sum();
        r.oracle_hit_ratio = Some(oracle as f64 / r.prompt_tokens.max(1) as f64);
    }
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agentic::trace::WorkloadShape;

    /// One token per byte: a workload without a model.
    fn workload(sessions: usize, turns: usize) -> Workload {
        let encode = |t: &str| t.bytes().map(u32::from).collect::<Vec<u32>>();
        let shape = WorkloadShape {
            sessions,
            turns,
            system_tokens: 600,
            history_tokens: 400,
        };
        Workload::generate(&encode, 3, &shape)
    }

    fn costs() -> Costs {
        Costs {
            prefill_fixed_ms: 20.0,
            prefill_ms_per_token: 0.5,
            decode_ms_per_token: 15.0,
            link_bytes_per_s: 1e9,
            block_bytes: 1 << 20,
        }
    }

    fn params(engines: usize, capacity_blocks: usize) -> SimParams {
        SimParams {
            engines,
            rate: 2.0,
            answer_tokens: 8,
            seed: 1,
            capacity_blocks,
            block_tokens: 64,
            pool_blocks: 0,
            oracle: true,
        }
    }

    #[test]
    fn the_same_seed_predicts_the_same_figures() {
        let w = workload(6, 3);
        let a = simulate(&w, &params(4, 10_000), &costs()).expect("sim");
        let b = simulate(&w, &params(4, 10_000), &costs()).expect("sim");
        assert_eq!(a, b);
        let c = simulate(
            &w,
            &SimParams {
                seed: 2,
                ..params(4, 10_000)
            },
            &costs(),
        )
        .expect("sim");
        assert_ne!(a.link_in_bytes, c.link_in_bytes, "routing follows the seed");
    }

    #[test]
    fn an_ample_cache_reaches_the_oracle_and_no_cache_hits_nothing() {
        let w = workload(6, 3);
        let r = simulate(&w, &params(4, 10_000), &costs()).expect("sim");
        let oracle = r.oracle_hit_ratio.expect("oracle");
        assert!(oracle > 0.3, "{oracle}");
        assert!(
            (r.hit_ratio - oracle).abs() < 1e-9,
            "{} vs {oracle}",
            r.hit_ratio
        );
        // A tiny cache loses hits; none loses all, and every TTFT grows.
        let small = simulate(&w, &params(4, 8), &costs()).expect("sim");
        assert!(
            small.hit_ratio < r.hit_ratio,
            "{} {}",
            small.hit_ratio,
            r.hit_ratio
        );
        let none = simulate(&w, &params(4, 0), &costs()).expect("sim");
        assert_eq!((none.cached_tokens, none.remote_blocks), (0, 0));
        assert!(none.ttft_p(0.5) > r.ttft_p(0.5));
    }

    #[test]
    fn one_engine_moves_nothing_and_the_bytes_on_links_add_up() {
        let w = workload(6, 3);
        let one = simulate(&w, &params(1, 10_000), &costs()).expect("sim");
        assert_eq!(one.remote_blocks, 0);
        assert_eq!(one.link_in_bytes, vec![0]);
        let four = simulate(&w, &params(4, 10_000), &costs()).expect("sim");
        assert!(four.remote_blocks > 0);
        let out: u64 = four.link_out_bytes.iter().sum();
        let into: u64 = four.link_in_bytes.iter().sum();
        assert_eq!(out, into);
        assert_eq!(into, four.remote_blocks * (1 << 20));
        // The same hits either way: placement changes where, not whether.
        assert_eq!(one.cached_tokens, four.cached_tokens);
    }

    #[test]
    fn blocks_in_an_engines_own_pool_cross_no_link() {
        let w = workload(6, 4);
        let bare = simulate(&w, &params(3, 10_000), &costs()).expect("sim");
        let pooled = SimParams {
            pool_blocks: 10_000,
            ..params(3, 10_000)
        };
        let r = simulate(&w, &pooled, &costs()).expect("sim");
        // The pool changes where a hit comes from, not whether it is one.
        assert_eq!(r.cached_tokens, bare.cached_tokens);
        assert_eq!(bare.pool_hit_blocks, 0);
        assert!(r.pool_hit_blocks > 0);
        assert!(
            r.remote_blocks < bare.remote_blocks,
            "{} vs {}",
            r.remote_blocks,
            bare.remote_blocks
        );
        assert_eq!(
            r.local_blocks + r.remote_blocks,
            bare.local_blocks + bare.remote_blocks
        );
        let into: u64 = r.link_in_bytes.iter().sum();
        assert_eq!(into, r.remote_blocks * (1 << 20));
    }

    #[test]
    fn a_pool_keeps_hits_the_cluster_cache_lost() {
        let w = workload(6, 3);
        let (small, pooled) = (
            params(1, 8),
            SimParams {
                pool_blocks: 10_000,
                ..params(1, 8)
            },
        );
        let a = simulate(&w, &small, &costs()).expect("sim");
        let b = simulate(&w, &pooled, &costs()).expect("sim");
        assert!(b.hit_ratio > a.hit_ratio, "{} {}", b.hit_ratio, a.hit_ratio);
    }
}
