//! The continuous-batching scheduler on the reference model: results equal
//! the direct forward pass bitwise whatever the batching, chunking, prefix
//! cache hits or preemption; cancellation frees blocks; bad requests fail.

use std::sync::Arc;

use bytesize::ByteSize;
use kvfabric_engine::model::LlamaModel;
use kvfabric_engine::{
    EngineBuilder, EngineConfig, FinishReason, GenerationEvent, Role, RunningEngine, SamplingParams,
};
use kvfabric_testkit::engine::requests::{self, collect, stop, Outcome};
use tokio::sync::mpsc;

const BT: usize = 16;

fn shared_model() -> Arc<LlamaModel> {
    kvfabric_testkit::engine::model()
}

fn engine(
    model: &Arc<LlamaModel>,
    blocks: usize,
    max_batch_tokens: usize,
    role: Role,
) -> RunningEngine {
    let c = &model.config;
    // One block of the default KV dtype.
    let dtype = EngineConfig::default().kv_dtype.into();
    let block_bytes =
        kvfabric_engine::kv::KvPool::layout_for(c.layers, c.kv_heads, c.head_dim, BT, dtype)
            .block_bytes();
    let cfg = EngineConfig {
        threads: 2,
        block_tokens: BT,
        kv_pool: ByteSize::b((blocks * block_bytes) as u64),
        max_batch_tokens,
        max_seqs: 8,
        role,
        ..EngineConfig::default()
    };
    EngineBuilder::new(cfg).start(model.clone()).expect("start")
}

fn submit(e: &RunningEngine, prompt: &[u32], max_tokens: usize) -> mpsc::Receiver<GenerationEvent> {
    let sampling = SamplingParams::default();
    let (req, rx) = requests::request(prompt, max_tokens, sampling, b"test", 1024);
    requests::submit(e, req);
    rx
}

fn prompt(seed: u32, len: usize) -> Vec<u32> {
    (0..len as u32)
        .map(|i| (i * 31 + seed * 977) % 48_000 + 100)
        .collect()
}

#[test]
fn concurrent_chunked_cached_and_preempted_runs_equal_running_alone() {
    let model = shared_model();
    let prompts = [prompt(1, 70), prompt(2, 33), prompt(3, 5), prompt(1, 50)];
    let steps = 6;
    // Reference: each request alone, big batch budget.
    let alone: Vec<Outcome> = prompts
        .iter()
        .map(|p| {
            let e = engine(&model, 32, 2048, Role::Both);
            let o = collect(submit(&e, p, steps));
            stop(e);
            o
        })
        .collect();
    for o in &alone {
        assert_eq!(o.0.len(), steps);
        assert_eq!(o.2, FinishReason::Length);
    }
    // Together, 32-token steps (chunked prefill at block boundaries), one engine.
    let e = engine(&model, 32, 32, Role::Both);
    let rxs: Vec<_> = prompts.iter().map(|p| submit(&e, p, steps)).collect();
    let together: Vec<Outcome> = rxs.into_iter().map(collect).collect();
    for (i, (a, t)) in alone.iter().zip(&together).enumerate() {
        assert_eq!(a.0, t.0, "request {i}: tokens");
        assert!(a.1 == t.1, "request {i}: logits differ bitwise");
    }
    // Prefix cache: prompt 0 again; 64 of its 70 tokens are whole cached blocks.
    let again = collect(submit(&e, &prompts[0], steps));
    assert_eq!(again.3.cached_tokens, 64);
    assert_eq!(again.3.prompt_tokens, 70);
    assert!(again.1 == alone[0].1, "cached-prefix logits differ bitwise");
    stop(e);
    // A pool too small for all at once: preemption, still identical.
    let e = engine(&model, 7, 64, Role::Both);
    let rxs: Vec<_> = prompts.iter().map(|p| submit(&e, p, steps)).collect();
    for (i, rx) in rxs.into_iter().enumerate() {
        let o = collect(rx);
        assert_eq!(o.0, alone[i].0, "preempted request {i}: tokens");
        assert!(o.1 == alone[i].1, "preempted request {i}: logits");
    }
    stop(e);
}

#[test]
fn cancel_frees_blocks_and_bad_requests_fail() {
    let model = shared_model();
    let e = engine(&model, 6, 2048, Role::Both);
    // Cancel after the first token: its blocks must come back.
    let mut rx = submit(&e, &prompt(5, 60), 1000);
    assert!(matches!(
        rx.blocking_recv(),
        Some(GenerationEvent::Admitted { cached_tokens: 0 })
    ));
    assert!(matches!(
        rx.blocking_recv(),
        Some(GenerationEvent::Token { .. })
    ));
    drop(rx);
    // Needs all 6 blocks (90 + 5 tokens): only possible if the cancelled request freed its 4+.
    let o = collect(submit(&e, &prompt(6, 90), 5));
    assert_eq!(o.0.len(), 5);
    // Errors.
    for (p, what) in [
        (vec![], "empty"),
        (prompt(7, 200), "larger than the pool"),
        (vec![60_000], "bad id"),
    ] {
        let mut rx = submit(&e, &p, 3);
        match rx.blocking_recv() {
            Some(GenerationEvent::Error(_)) => {}
            other => panic!("{what}: expected an error, got {other:?}"),
        }
    }
    stop(e);
    // Prefill role: one token, then Finished.
    let e = engine(&model, 8, 2048, Role::Prefill);
    let o = collect(submit(&e, &prompt(8, 20), 50));
    assert_eq!(o.0.len(), 1);
    assert_eq!(o.3.completion_tokens, 1);
    stop(e);
}

#[test]
fn scheduler_reports_batch_size_and_kv_pool_use() {
    let model = shared_model();
    let metrics = kvfabric_engine::http::EngineMetrics::new();
    let mut registry = prometheus_client::registry::Registry::default();
    metrics.register(&mut registry);
    let c = &model.config;
    // One block of the default KV dtype.
    let dtype = EngineConfig::default().kv_dtype.into();
    let block_bytes =
        kvfabric_engine::kv::KvPool::layout_for(c.layers, c.kv_heads, c.head_dim, BT, dtype)
            .block_bytes();
    let cfg = EngineConfig {
        threads: 2,
        block_tokens: BT,
        kv_pool: ByteSize::b((32 * block_bytes) as u64),
        ..EngineConfig::default()
    };
    let e = EngineBuilder::new(cfg)
        .metrics(metrics.clone())
        .start(model.clone())
        .expect("start");
    let rx = submit(&e, &prompt(3, 40), 4);
    collect(rx);
    stop(e);
    assert_eq!(metrics.kv_blocks_total.get(), 32);
    // A true gauge: reported after every step, so once the
    // request finished (40 prompt + 3 generated tokens held 3 16-token
    // blocks while it ran) the pool reads 0 blocks in use.
    assert_eq!(metrics.kv_blocks_used.get(), 0);
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).expect("encode");
    let steps = text
        .lines()
        .find(|l| l.starts_with("kvfabric_engine_batch_size_count"))
        .and_then(|l| l.split_whitespace().last())
        .and_then(|v| v.parse::<u64>().ok())
        .expect("batch_size histogram in /metrics");
    // One prefill step of 40 tokens, then a decode step per further token.
    assert!(steps >= 4, "{steps} steps observed\n{text}");
}
