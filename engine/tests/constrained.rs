//! Grammar-constrained decoding on the reference model, through the real
//! scheduler: sampled at temperature 1.0 with `n = 3` (each fork its own
//! matcher) and logits returned, every sample is JSON valid against the
//! schema, every sent row is the masked one (the sampled token allowed,
//! others at -inf), and with speculative decoding on, or with the masks
//! prepared during the forward pass (a core left to spare), the tokens and
//! rows are bitwise the same (drafts verified against the mask).

use std::sync::Arc;

use bytesize::ByteSize;
use kvfabric_engine::gguf::GgufFile;
use kvfabric_engine::grammar::{GrammarSpec, Grammars};
use kvfabric_engine::http::EngineMetrics;
use kvfabric_engine::model::LlamaModel;
use kvfabric_engine::spec::SpecConfig;
use kvfabric_engine::tokenizer::Tokenizer;
use kvfabric_engine::{
    EngineBuilder, EngineConfig, FinishReason, Fork, RunningEngine, SamplingParams,
};
use kvfabric_testkit::engine::requests::{self, stop};
use serde_json::{json, Value};
use tokio::sync::mpsc;

const BT: usize = 16;

fn engine(
    model: &Arc<LlamaModel>,
    spec: bool,
    threads: usize,
    metrics: &EngineMetrics,
) -> RunningEngine {
    let c = &model.config;
    let block_bytes = c.layers * 2 * BT * c.kv_heads * c.head_dim * 4;
    let cfg = EngineConfig {
        threads,
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

fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 16},
            "age": {"type": "integer", "minimum": 0, "maximum": 99},
            "pet": {"enum": ["cat", "dog"]}
        },
        "required": ["name", "age", "pet"],
        "additionalProperties": false
    })
}

/// Tokens and rows of each of `n` samples (seeded) of one constrained request.
fn run(
    e: &RunningEngine,
    t: &Tokenizer,
    sampling: &SamplingParams,
    n: usize,
) -> Vec<requests::Outcome> {
    // A prompt that repeats JSON, so drafting proposes tokens.
    let prompt = t.encode(
        "{\"name\": \"Ann\", \"age\": 31, \"pet\": \"cat\"}\n\
         {\"name\": \"Bob\", \"age\": 42, \"pet\": \"dog\"}\n\
         {\"name\": \"Ann\", \"age\": 31, \"pet\": \"cat\"}\n",
        false,
    );
    let (mut req, rx) = requests::request(&prompt, 60, sampling.clone(), b"json", 256);
    req.stop_token_ids = t.stop_token_ids();
    let mut rxs = vec![rx];
    for k in 1..n {
        let (tx, rx) = mpsc::channel(256);
        let mut s = sampling.clone();
        s.seed = s.seed.map(|x| x + 1000 * k as u64);
        req.forks.push(Fork {
            sampling: s,
            events: tx,
        });
        rxs.push(rx);
    }
    requests::submit(e, req);
    rxs.into_iter().map(requests::collect).collect()
}

#[test]
fn sampled_outputs_follow_the_schema_with_and_without_speculation() {
    let model = kvfabric_testkit::engine::model();
    let g = GgufFile::open(&kvfabric_testkit::engine::model_path()).expect("gguf");
    let t = Arc::new(Tokenizer::from_gguf(&g).expect("tokenizer"));
    let grammars = Grammars::new(t.clone(), t.stop_token_ids());
    let constraint = grammars
        .compile(&GrammarSpec::json_schema(schema()))
        .expect("schema compiles");
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut runs = Vec::new();
    // Kernels on every core (masks computed when the rows are sampled),
    // with and without speculation, then on one core less (masks computed
    // by a helper during the forward pass, when there is a core to spare).
    for (spec, threads) in [(false, cores), (true, cores), (false, (cores - 1).max(1))] {
        let metrics = EngineMetrics::new();
        let e = engine(&model, spec, threads, &metrics);
        let mut outcomes = Vec::new();
        for seed in 0..4 {
            let sampling = SamplingParams {
                temperature: 1.0,
                seed: Some(seed),
                constraint: Some(constraint.clone()),
                ..SamplingParams::default()
            };
            outcomes.extend(run(&e, &t, &sampling, 3));
        }
        stop(e);
        if spec {
            assert!(
                metrics.spec_drafted_tokens.get() > 0,
                "drafts were proposed"
            );
        }
        runs.push(outcomes);
    }
    let mut distinct = std::collections::HashSet::new();
    for (tokens, rows, reason, _) in &runs[0] {
        assert_eq!(*reason, FinishReason::Stop, "the grammar completed");
        let text = t.decode(tokens);
        let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
        let obj = v.as_object().expect("an object");
        assert_eq!(obj.len(), 3, "{text}");
        assert!(
            v["name"].as_str().is_some_and(|s| s.chars().count() <= 16),
            "{text}"
        );
        assert!(v["age"].as_u64().is_some_and(|a| a <= 99), "{text}");
        assert!(v["pet"] == "cat" || v["pet"] == "dog", "{text}");
        for (j, (tok, row)) in tokens.iter().zip(rows).enumerate() {
            let row: Vec<f32> = row.iter().map(|b| f32::from_bits(*b)).collect();
            assert!(
                row[*tok as usize].is_finite(),
                "the sampled token was allowed"
            );
            let allowed = row.iter().filter(|x| x.is_finite()).count();
            assert!(allowed < row.len(), "the row sent is the masked one");
            if j == 0 {
                // An object starts with `{` (or `{"`, `{"name`, ...): a handful of ids.
                assert!(allowed < 16, "{allowed} ids allowed first");
            }
        }
        distinct.insert(text);
    }
    assert!(distinct.len() > 1, "sampling still samples: {distinct:?}");
    assert!(
        runs[0] == runs[1],
        "speculation changes no token and no row"
    );
    assert!(
        runs[0] == runs[2],
        "masks prepared during the pass change nothing"
    );
}
