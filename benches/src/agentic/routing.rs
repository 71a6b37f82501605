//! How `bench agentic` picks the engine of each turn (`--routing`): the
//! router crate's own policies ([`kvfabric_router::pick::choose`], the same
//! function `kvfabric router` calls), over the bench's view of each engine:
//! - load: tokens in flight (prompt + answer tokens, added when a turn is
//!   sent, removed when it finishes), as the router counts them (counting
//!   only the uncached tokens piled every session onto one engine: 0 bytes
//!   moved at 1.5x random's TTFT p50; the KV a request holds costs attention
//!   time too);
//! - the session's last engine (affinity; [`SessionMap`], as the router);
//! - for `prefix`, each engine's cached prefix of the prompt from a
//!   [`PrefixIndex`] fed by its fabric node's KV events (the store's change
//!   feed, [`kvfabric_store::ChangeFeed::subscribe`]: the stream
//!   `KvEventService.KvEvents` serves), and the prompt's block keys computed
//!   as the engine computes them ([`KeyChain`] over the prompt's tokens);
//!   which of those blocks other prompts share comes from a
//!   [`PrefixBranches`] of the prompts routed so far (a router sees every
//!   prompt it routes).
//!
//! `random` keeps the bench's seeded draw ([`route`]), so a seed routes
//! every configuration and every run alike.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kvfabric_router::pick::{
    choose, AffinityOutcome, PickInput, PickParams, Policy, PrefixBranches, PrefixIndex, SessionMap,
};
use kvfabric_store::{BlockChange, KeyChain, KvEventRecord};
use tokio::sync::broadcast::{self, error::RecvError};
use tokio::task::JoinHandle;

use super::trace::route;

/// The block -> engines index a `prefix` router reads, kept from the nodes'
/// KV events by one task per node.
pub struct PrefixSource {
    index: Arc<Mutex<PrefixIndex>>,
    branches: PrefixBranches,
    chain: KeyChain,
    block_tokens: usize,
    tasks: Vec<JoinHandle<()>>,
}

impl PrefixSource {
    /// Follow `events[i]` (engine i's node) into one index; `chain` computes
    /// prompt block keys as the engines do.
    pub fn follow(
        events: Vec<broadcast::Receiver<KvEventRecord>>,
        chain: KeyChain,
        block_tokens: usize,
    ) -> Self {
        let index = Arc::new(Mutex::new(PrefixIndex::new()));
        let tasks = events
            .into_iter()
            .enumerate()
            .map(|(engine, mut rx)| {
                let index = index.clone();
                tokio::spawn(async move {
                    loop {
                        let r = rx.recv().await;
                        let mut ix = index.lock().unwrap_or_else(|p| p.into_inner());
                        match r {
                            Ok(e) => match e.change {
                                BlockChange::Stored => ix.apply(engine, e.key.0, true),
                                BlockChange::Removed => ix.apply(engine, e.key.0, false),
                                BlockChange::Tier => {}
                            },
                            // Missed events: what this engine holds is unknown; forget it.
                            Err(RecvError::Lagged(_)) => ix.clear_engine(engine),
                            Err(RecvError::Closed) => return,
                        }
                    }
                })
            })
            .collect();
        PrefixSource {
            index,
            branches: PrefixBranches::new(1 << 20),
            chain,
            block_tokens,
            tasks,
        }
    }

    /// The full-block keys of `prompt`.
    fn keys(&self, prompt: &[u32]) -> Vec<[u8; 32]> {
        let full = prompt.len() / self.block_tokens;
        self.chain
            .keys(&prompt[..full * self.block_tokens])
            .into_iter()
            .map(|k| k.0)
            .collect()
    }

    /// Leading blocks of `prompt` each of `engines` engines holds.
    #[cfg(test)]
    fn cached(&self, prompt: &[u32], engines: usize) -> Vec<usize> {
        let keys = self.keys(prompt);
        let ix = self.index.lock().unwrap_or_else(|p| p.into_inner());
        ix.cached_blocks(&keys, engines)
    }

    /// Route `prompt` (recording its branches): what each of `engines`
    /// engines' nodes hold of it (leading blocks; blocks past the shared
    /// prefix, one by one), its full blocks, and how many of them other
    /// prompts share.
    fn observe(&mut self, prompt: &[u32], engines: usize) -> Observed {
        let keys = self.keys(prompt);
        let shared = self.branches.observe(&keys);
        let ix = self.index.lock().unwrap_or_else(|p| p.into_inner());
        Observed {
            cached: ix.cached_blocks(&keys, engines),
            own_held: ix.held_blocks(&keys[shared.min(keys.len())..], engines),
            blocks: keys.len(),
            shared,
        }
    }
}

/// What a `prefix` pick knows of one prompt.
struct Observed {
    cached: Vec<usize>,
    own_held: Vec<usize>,
    blocks: usize,
    shared: usize,
}

impl Drop for PrefixSource {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// Routing state of one configuration's run.
pub struct BenchRouter {
    policy: Policy,
    params: PickParams,
    seed: u64,
    loads: Vec<u64>,
    next: usize,
    sessions: SessionMap,
    prefix: Option<PrefixSource>,
    /// Affinity picks that kept / moved a session.
    pub affinity_hits: u64,
    pub affinity_fallbacks: u64,
}

impl BenchRouter {
    /// A router over `engines` engines; `prefix` is needed by (and only
    /// used by) the `prefix` policy.
    pub fn new(
        policy: Policy,
        params: PickParams,
        seed: u64,
        engines: usize,
        prefix: Option<PrefixSource>,
    ) -> Self {
        BenchRouter {
            policy,
            params,
            seed,
            loads: vec![0; engines.max(1)],
            next: 0,
            sessions: SessionMap::new(100_000, Duration::from_secs(3600)),
            prefix,
            affinity_hits: 0,
            affinity_fallbacks: 0,
        }
    }

    /// The policy.
    pub fn policy(&self) -> Policy {
        self.policy
    }

    /// The engine of `session`'s `turn` (`prompt`) and the tokens reserved on
    /// it (`tokens`); hand both back to [`BenchRouter::release`].
    pub fn pick(
        &mut self,
        session: usize,
        turn: usize,
        prompt: &[u32],
        tokens: u64,
    ) -> (usize, u64) {
        let n = self.loads.len();
        let id = session.to_string();
        let now = Instant::now();
        let sticky = match self.policy {
            Policy::Affinity => self.sessions.get(&id, now),
            _ => None,
        };
        let (cached, own_held, prompt_blocks, shared) = match (&mut self.prefix, self.policy) {
            (Some(p), Policy::Prefix) => {
                let o = p.observe(prompt, n);
                (o.cached, o.own_held, o.blocks, Some(o.shared))
            }
            _ => (Vec::new(), Vec::new(), 0, None),
        };
        let choice = choose(
            self.policy,
            &self.params,
            &PickInput {
                loads: &self.loads,
                start: self.next,
                draw: route(self.seed, session, turn, n) as u64,
                sticky,
                cached_blocks: &cached,
                own_held: &own_held,
                prompt_blocks,
                shared_blocks: shared,
                block_tokens: self.prefix.as_ref().map_or(1, |p| p.block_tokens),
            },
        );
        tracing::debug!(
            session,
            turn,
            loads = ?self.loads,
            cached = ?cached,
            own_held = ?own_held,
            prompt_blocks,
            shared = ?shared,
            engine = choice.index,
            "bench route"
        );
        match choice.affinity {
            AffinityOutcome::Hit => self.affinity_hits += 1,
            AffinityOutcome::Fallback => self.affinity_fallbacks += 1,
            AffinityOutcome::New | AffinityOutcome::NotAsked => {}
        }
        if self.policy == Policy::Affinity {
            self.sessions.set(&id, choice.index, now);
        }
        self.next = choice.index + 1;
        self.loads[choice.index] += tokens;
        (choice.index, tokens)
    }

    /// A turn on `engine` finished: its `tokens` are no longer in flight.
    pub fn release(&mut self, engine: usize, tokens: u64) {
        if let Some(l) = self.loads.get_mut(engine) {
            *l = l.saturating_sub(tokens);
        }
    }
}

#[cfg(test)]
mod tests {
    use kvfabric_store::{BlockKey, BlockOrder, DType, KvLayout, ModelFingerprint};

    use super::*;

    fn chain() -> KeyChain {
        let layout = KvLayout {
            layers: 1,
            kv_heads: 1,
            head_dim: 4,
            dtype: DType::F16,
            block_tokens: 4,
            order: BlockOrder::LayerKvTokenHead,
        };
        KeyChain::new(b"", &ModelFingerprint::new(&[1; 32], "llama"), &layout)
    }

    #[test]
    fn random_routes_as_the_seeded_trace_did() {
        let mut r = BenchRouter::new(Policy::Random, PickParams::default(), 7, 3, None);
        for s in 0..10 {
            for t in 0..3 {
                assert_eq!(r.pick(s, t, &[1, 2, 3], 10), (route(7, s, t, 3), 10));
            }
        }
    }

    #[tokio::test]
    async fn prefix_follows_the_nodes_kv_events() {
        let (tx0, rx0) = broadcast::channel(16);
        let (tx1, rx1) = broadcast::channel(16);
        let c = chain();
        let prompt: Vec<u32> = (0..13).collect();
        let keys = c.keys(&prompt[..12]);
        let src = PrefixSource::follow(vec![rx0, rx1], c, 4);
        let mut r = BenchRouter::new(Policy::Prefix, PickParams::default(), 1, 2, Some(src));
        let event = |k: BlockKey, change| KvEventRecord {
            sequence: 0,
            key: k,
            change,
            tier: kvfabric_store::Tier::Ram,
            owner: None,
        };
        // Engine 1's node holds the prompt's first 3 blocks.
        for k in &keys {
            tx1.send(event(*k, BlockChange::Stored)).expect("send");
        }
        tx0.send(event(keys[0], BlockChange::Stored)).expect("send");
        let deadline = Instant::now() + Duration::from_secs(5);
        while r.prefix.as_ref().map(|p| p.cached(&prompt, 2)) != Some(vec![1, 3]) {
            assert!(Instant::now() < deadline, "events not applied");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(r.pick(0, 0, &prompt, 20), (1, 20));
        r.release(1, 20);
        // Engine 1 evicts them: engine 0 (1 block) wins.
        for k in &keys {
            tx1.send(event(*k, BlockChange::Removed)).expect("send");
        }
        while r.prefix.as_ref().map(|p| p.cached(&prompt, 2)) != Some(vec![1, 0]) {
            assert!(Instant::now() < deadline, "events not applied");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(r.pick(0, 1, &prompt, 20), (0, 20));
    }
}
