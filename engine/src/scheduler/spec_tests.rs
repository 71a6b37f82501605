//! Rejected drafts leave no trace: with speculation on, the blocks queued
//! for saving (keys and bytes), the prefix cache (what is cached, under
//! which keys, with which bytes) and the pool's free count are those of the
//! same requests run without it, greedy and sampled; and drafts were both
//! accepted and rejected along the way.

use std::sync::Arc;

use kvfabric_types::BlockKey;
use tokio::sync::mpsc;

use super::tests::{lock, settle, FakeFabric};
use super::*;
use crate::request::SamplingParams;

const BT: usize = 16;
const BLOCKS: usize = 24;

fn scheduler(spec: bool, fabric: Arc<FakeFabric>) -> Scheduler {
    scheduler_with(spec, fabric, |_| {})
}

fn scheduler_with(
    spec: bool,
    fabric: Arc<FakeFabric>,
    edit: impl FnOnce(&mut SpecConfig),
) -> Scheduler {
    let m = crate::model::test_model();
    let c = &m.config;
    let layout = KvPool::layout_for(
        c.layers,
        c.kv_heads,
        c.head_dim,
        BT,
        kvfabric_types::DType::F16,
    );
    let kv = KvPool::with_bytes(layout, (BLOCKS * layout.block_bytes()) as u64).expect("pool");
    let cfg = SchedulerConfig {
        max_batch_tokens: 2048,
        max_seqs: 4,
        role: Role::Both,
        metrics: EngineMetrics::new(),
        prefix_cache: true,
        spec: SpecConfig {
            enabled: spec,
            // Fixed (the AVX-512 figures) so drafts happen on any machine:
            // what is tested is that outputs and state do not change.
            verify_base_cost: Some(0.13),
            verify_row_cost: Some(0.16),
            ..SpecConfig::default()
        },
    };
    let mut cfg = cfg;
    edit(&mut cfg.spec);
    Scheduler::new(m, Compute::new(2), kv, cfg, Some(fabric))
}

/// A prompt that repeats itself, so the model copies and drafts get accepted.
fn prompt(seed: u32) -> Vec<u32> {
    let seg: Vec<u32> = (0..23u32)
        .map(|i| (i * 131 + seed * 7919) % 30_000 + 200)
        .collect();
    [&seg[..], &seg[..], &seg[..], &seg[..9]].concat()
}

/// What a run left behind.
#[derive(Debug, PartialEq)]
struct Trace {
    tokens: Vec<Vec<u32>>,
    /// Blocks queued for saving: key and KV bytes, by key (requests that
    /// run faster queue theirs earlier).
    saved: Vec<(BlockKey, Vec<u8>)>,
    /// Per request, the bytes of the leading blocks the prefix cache holds
    /// for its tokens' keys.
    cached: Vec<Vec<Vec<u8>>>,
    cached_blocks: usize,
    available: usize,
}

fn run(spec: bool, temperature: f32) -> (Trace, u64, u64) {
    let fabric = Arc::new(FakeFabric::default());
    let mut s = scheduler(spec, fabric.clone());
    let mut rxs = Vec::new();
    for seed in 0..3 {
        let (events, rx) = mpsc::channel(1024);
        s.accept(GenerationRequest {
            prompt: prompt(seed),
            max_tokens: 30 + seed as usize * 7,
            sampling: SamplingParams {
                temperature,
                seed: Some(7 + u64::from(seed)),
                ..SamplingParams::default()
            },
            stop_token_ids: vec![],
            namespace: b"trace".to_vec(),
            owner: None,
            return_logits: false,
            forks: Vec::new(),
            events,
        });
        rxs.push(rx);
    }
    settle(&mut s);
    let mut tokens = Vec::new();
    for mut rx in rxs {
        let mut t = Vec::new();
        while let Ok(ev) = rx.try_recv() {
            match ev {
                GenerationEvent::Token { id, .. } => t.push(id),
                GenerationEvent::Finished { .. } => {}
                other => assert!(matches!(other, GenerationEvent::Admitted { .. })),
            }
        }
        tokens.push(t);
    }
    // Saves are pinned until they end: their blocks still hold what was queued.
    let mut saved: Vec<(BlockKey, Vec<u8>)> = lock(&fabric.saves)
        .iter()
        .map(|b| (b.key, s.kv.block_bytes(b.block).to_vec()))
        .collect();
    saved.sort_by_key(|x| x.0);
    fabric.end_saves();
    s.poll_fabric(std::time::Duration::ZERO);
    let chain = s.key_basis().chain(b"trace");
    let cached = (0..3u32)
        .zip(&tokens)
        .map(|(seed, t)| {
            let all = [prompt(seed), t.clone()].concat();
            let full = all.len() / BT * BT;
            let hits = s.blocks.lookup(&chain.keys(&all[..full]));
            hits.ids()
                .iter()
                .map(|&b| s.kv.block_bytes(b).to_vec())
                .collect()
        })
        .collect();
    let m = &s.cfg.metrics;
    let trace = Trace {
        tokens,
        saved,
        cached,
        cached_blocks: s.blocks.cached(),
        available: s.blocks.available(),
    };
    (
        trace,
        m.spec_drafted_tokens.get(),
        m.spec_accepted_tokens.get(),
    )
}

#[test]
fn rejected_drafts_leave_no_trace_in_saves_prefix_cache_or_pool() {
    for temperature in [0.0, 0.8] {
        let (off, drafted, _) = run(false, temperature);
        assert_eq!(drafted, 0);
        let (on, drafted, accepted) = run(true, temperature);
        assert!(
            accepted > 0 && drafted > accepted,
            "t={temperature}: drafts accepted and rejected ({accepted} of {drafted})"
        );
        assert_eq!(on.tokens, off.tokens, "t={temperature}: tokens");
        assert!(!off.saved.is_empty());
        assert!(
            on.saved == off.saved,
            "t={temperature}: saved blocks differ"
        );
        assert!(
            on.cached == off.cached,
            "t={temperature}: prefix cache differs"
        );
        assert_eq!(
            (on.cached_blocks, on.available),
            (off.cached_blocks, off.available),
            "t={temperature}: pool"
        );
        assert_eq!(on.available, BLOCKS);
    }
}

/// With no cost model configured, the scheduler measures one on this
/// machine when it starts (`spec::calibrate`), and outputs stay those of
/// decoding without speculation whatever it finds; without speculation
/// nothing is measured.
#[test]
fn the_pass_cost_is_measured_at_start_and_outputs_stay_the_same() {
    let fabric = Arc::new(FakeFabric::default());
    let mut s = scheduler_with(true, fabric, |c| {
        c.verify_base_cost = None;
        c.verify_row_cost = None;
    });
    let off = scheduler_with(false, Arc::new(FakeFabric::default()), |c| {
        c.verify_base_cost = None;
        c.verify_row_cost = None;
    });
    assert!(off.pass_cost.is_none());
    let cost = s.pass_cost.expect("measured at start");
    // Measured beside other tests, near k's may time alike; 16 verified
    // rows never cost what one row does.
    let t = cost.table();
    assert!(
        t.iter().all(|c| c.is_finite())
            && t.windows(2).all(|w| w[0] <= w[1])
            && cost.of(0) == 1.0
            && cost.of(t.len() - 1) > 1.5,
        "{cost:?}"
    );
    let (events, mut rx) = mpsc::channel(1024);
    s.accept(GenerationRequest {
        prompt: prompt(1),
        max_tokens: 12,
        sampling: SamplingParams {
            temperature: 0.0,
            ..SamplingParams::default()
        },
        stop_token_ids: vec![],
        namespace: b"cost".to_vec(),
        owner: None,
        return_logits: false,
        forks: Vec::new(),
        events,
    });
    settle(&mut s);
    let mut tokens = Vec::new();
    while let Ok(ev) = rx.try_recv() {
        if let GenerationEvent::Token { id, .. } = ev {
            tokens.push(id);
        }
    }
    let (off, _, _) = run(false, 0.0);
    assert_eq!(tokens.len(), 12);
    assert_eq!(
        tokens,
        off.tokens[1][..12],
        "same tokens as without speculation"
    );
}
