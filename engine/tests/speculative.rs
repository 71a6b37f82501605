//! Speculative decoding is lossless on the reference model: for many
//! prompts, greedy and sampled (temperature 0.8, seeded), alone and mixed
//! into a batch, the tokens and every token's logits are bitwise those of
//! the same engine without speculation, and drafts were in fact accepted.

use std::sync::Arc;

use bytesize::ByteSize;
use kvfabric_engine::gguf::GgufFile;
use kvfabric_engine::http::EngineMetrics;
use kvfabric_engine::model::LlamaModel;
use kvfabric_engine::spec::SpecConfig;
use kvfabric_engine::tokenizer::Tokenizer;
use kvfabric_engine::{
    EngineBuilder, EngineConfig, GenerationEvent, RunningEngine, SamplingParams,
};
use kvfabric_testkit::engine::requests::{self, stop};
use tokio::sync::mpsc;

const BT: usize = 16;
const STEPS: usize = 40;

fn engine(model: &Arc<LlamaModel>, spec: bool, metrics: &EngineMetrics) -> RunningEngine {
    let c = &model.config;
    let block_bytes = c.layers * 2 * BT * c.kv_heads * c.head_dim * 4;
    let cfg = EngineConfig {
        threads: 2,
        block_tokens: BT,
        kv_pool: ByteSize::b((160 * block_bytes) as u64),
        max_seqs: 8,
        spec: SpecConfig {
            enabled: spec,
            max_batch: 8,
            // Fixed (the AVX-512 figures) so drafts happen on any machine:
            // what is tested is that outputs and state do not change.
            verify_base_cost: Some(0.13),
            verify_row_cost: Some(0.16),
            ..SpecConfig::default()
        },
        ..EngineConfig::default()
    };
    EngineBuilder::new(cfg)
        .metrics(metrics.clone())
        .start(model.clone())
        .expect("start")
}

/// Tokens and each token's logits (bits).
type Run = (Vec<u32>, Vec<Vec<u32>>);

fn submit(e: &RunningEngine, prompt: &[u32], temperature: f32) -> mpsc::Receiver<GenerationEvent> {
    let sampling = SamplingParams {
        temperature,
        seed: Some(42),
        ..SamplingParams::default()
    };
    let (req, rx) = requests::request(prompt, STEPS, sampling, b"spec", 4096);
    requests::submit(e, req);
    rx
}

fn collect(rx: mpsc::Receiver<GenerationEvent>) -> Run {
    let (tokens, logits, _, _) = requests::collect(rx);
    (tokens, logits)
}

/// Prompts whose continuations copy their context (tool calls, code
/// edits, lists) and ones that do not.
fn prompts() -> Vec<Vec<u32>> {
    let g = GgufFile::open(&kvfabric_testkit::engine::model_path()).expect("gguf");
    let t = Tokenizer::from_gguf(&g).expect("tokenizer");
    let code = "def area(width, height):\n    return width * height\n\n\
                def perimeter(width, height):\n    return 2 * (width + height)\n";
    [
        format!("{code}\n# The same file with width renamed to w:\n"),
        "Tool schema: {\"name\": \"read_file\", \"arguments\": {\"path\": \"src/main.rs\", \
         \"line\": 42}}\nCall read_file on src/main.rs line 42.\nCall: {\"name\": \""
            .to_string(),
        "Monday, Tuesday, Wednesday, Thursday, Friday. Again: Monday, Tuesday,".to_string(),
        "The capital of France is".to_string(),
        format!("{code}{code}"),
        "Write a short story about a robot who learns to paint.".to_string(),
    ]
    .iter()
    .map(|s| t.encode(s, false))
    .collect()
}

#[test]
fn tokens_and_logits_equal_decoding_without_speculation() {
    let model = kvfabric_testkit::engine::model();
    let prompts = prompts();
    for temperature in [0.0f32, 0.8] {
        let off_metrics = EngineMetrics::new();
        let e = engine(&model, false, &off_metrics);
        let off: Vec<Run> = prompts
            .iter()
            .map(|p| collect(submit(&e, p, temperature)))
            .collect();
        stop(e);
        assert_eq!(off_metrics.spec_drafted_tokens.get(), 0);
        // Alone (batch 1), then all at once (verification rows mixed into
        // a batch of decodes and prefills).
        let metrics = EngineMetrics::new();
        let e = engine(&model, true, &metrics);
        for (i, p) in prompts.iter().enumerate() {
            let on = collect(submit(&e, p, temperature));
            assert_eq!(on.0, off[i].0, "t={temperature} prompt {i} alone: tokens");
            assert!(on.1 == off[i].1, "t={temperature} prompt {i} alone: logits");
        }
        stop(e);
        let alone_accepted = metrics.spec_accepted_tokens.get();
        let e = engine(&model, true, &metrics);
        let rxs: Vec<_> = prompts.iter().map(|p| submit(&e, p, temperature)).collect();
        for (i, rx) in rxs.into_iter().enumerate() {
            let on = collect(rx);
            assert_eq!(on.0, off[i].0, "t={temperature} prompt {i} batched: tokens");
            assert!(
                on.1 == off[i].1,
                "t={temperature} prompt {i} batched: logits"
            );
        }
        stop(e);
        let accepted = metrics.spec_accepted_tokens.get();
        eprintln!(
            "t={temperature}: drafted {}, accepted {alone_accepted} alone, {accepted} in all",
            metrics.spec_drafted_tokens.get()
        );
        assert!(alone_accepted > 0, "no draft accepted at batch 1");
        assert!(accepted > alone_accepted, "no draft accepted in a batch");
        assert!(
            metrics.spec_drafted_tokens.get() > accepted,
            "some drafts are rejected (the rollback path ran)"
        );
    }
}
