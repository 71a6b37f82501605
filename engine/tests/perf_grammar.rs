//! Cost of grammar-constrained decoding per step on the reference model
//! (ignored probe; prints one JSON line):
//! `cargo test --release -p kvfabric-engine --test perf_grammar -- --ignored --nocapture`.
//!
//! Decodes `json_schema` answers (temperature 1.0, several seeds) one token
//! at a time and times, in the same run, the model's batch-1 decode step
//! and the grammar's work for that step (mask the row, advance past the
//! token): `mask_over_step` is the share a constrained sequence adds to
//! its own step. `overlapped_over_serial` compares the wall time per token
//! of mask-then-forward with the scheduler's way (the mask prepared on a
//! helper thread while the forward pass runs), alternating seeds between
//! the two in the same run, with kernel threads on every core and on one
//! core less (the scheduler overlaps only then). Also times building the vocabulary trie with the first
//! compile, a compile of a new schema, and a cache hit.

use std::sync::Arc;
use std::time::{Duration, Instant};

use kvfabric_engine::gguf::GgufFile;
use kvfabric_engine::grammar::{Constraint, GrammarSpec, Grammars};
use kvfabric_engine::kernels::Compute;
use kvfabric_engine::model::SeqChunk;
use kvfabric_engine::sampling::Sampler;
use kvfabric_engine::tokenizer::Tokenizer;
use kvfabric_engine::SamplingParams;
use kvfabric_testkit::engine::driver::{self as common, DType};
use serde_json::json;

const BT: usize = 16;
const MAX_STEPS: usize = 80;

fn person() -> serde_json::Value {
    json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 24},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "pet": {"enum": ["cat", "dog", "none"]},
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 3}
        },
        "required": ["name", "age", "pet", "tags"],
        "additionalProperties": false
    })
}

fn percentile(v: &mut [Duration], p: f64) -> f64 {
    v.sort_unstable();
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    v[i].as_secs_f64() * 1e3
}

fn chunk<'a>(tokens: &'a [u32], start: usize, blocks: &'a [u32]) -> SeqChunk<'a> {
    SeqChunk {
        tokens,
        start,
        blocks,
        logits: true,
    }
}

/// The person schema compiled, and the ms of its first compile (which
/// builds the vocabulary trie), of a new schema's compile, of a cache hit.
fn compile_costs(grammars: &Grammars) -> (Constraint, [f64; 3]) {
    let timed = |spec: serde_json::Value| {
        let at = Instant::now();
        let c = grammars
            .compile(&GrammarSpec::json_schema(spec))
            .expect("compiles");
        (c, at.elapsed().as_secs_f64() * 1e3)
    };
    let (c, first) = timed(person());
    let mut other = person();
    other["properties"]["city"] = json!({"type": "string"});
    let (_, new_schema) = timed(other);
    let (_, cached) = timed(person());
    (c, [first, new_schema, cached])
}

#[test]
#[ignore]
fn perf_grammar_mask_per_step() {
    let (model, cx) = (common::model(), common::compute());
    let g = GgufFile::open(&common::model_path()).expect("gguf");
    let t = Arc::new(Tokenizer::from_gguf(&g).expect("tokenizer"));
    let grammars = Grammars::new(t.clone(), t.stop_token_ids());
    let (c, compile_costs) = compile_costs(&grammars);

    let prompt = t.encode_prompt(
        "<|im_start|>user\nDescribe a person as JSON.<|im_end|>\n<|im_start|>assistant\n",
    );
    let blocks = (prompt.len() + MAX_STEPS).div_ceil(BT);
    let mut kv = common::pool(BT, blocks, DType::F16);
    let stop = t.stop_token_ids();
    let (mut steps, mut masks) = (Vec::new(), Vec::new());
    // Wall time of (mask + forward) per token, serial and with the mask
    // prepared on a helper thread during the forward pass (the scheduler's
    // way), with kernels on every core and on one core less.
    let one_less = Compute::new(cx.pool.threads().saturating_sub(1).max(1));
    let mut wall = [[Duration::ZERO; 2]; 2];
    let mut walked = [[0usize; 2]; 2];
    for seed in 0..24u64 {
        let (overlap, spare) = (seed % 2 == 1, (seed / 2) % 2 == 1);
        let cx = if spare { &one_less } else { cx };
        let mut s = Sampler::new(&SamplingParams {
            temperature: 1.0,
            seed: Some(seed / 4),
            constraint: Some(c.clone()),
            ..SamplingParams::default()
        });
        let table: Vec<u32> = (0..blocks as u32).collect();
        let out = model
            .forward(cx, &mut kv, &[chunk(&prompt, 0, &table)])
            .expect("prefill");
        let mut row = out[0].clone().expect("logits");
        for pos in prompt.len()..prompt.len() + MAX_STEPS {
            let at = Instant::now();
            s.constrain(&mut row).expect("mask");
            let tok = s.sample(&row);
            let done = stop.contains(&tok) || s.accept(tok).expect("advance");
            let masked = at.elapsed();
            if done {
                break;
            }
            let one = [tok];
            let at = Instant::now();
            let out = if overlap {
                let mut g = s.take_grammar().expect("constrained");
                let (out, g) = std::thread::scope(|sc| {
                    let h = sc.spawn(move || {
                        g.prepare();
                        g
                    });
                    let out = model.forward(cx, &mut kv, &[chunk(&one, pos, &table)]);
                    (out, h.join().expect("helper"))
                });
                s.put_grammar(g);
                out
            } else {
                model.forward(cx, &mut kv, &[chunk(&one, pos, &table)])
            };
            let stepped = at.elapsed();
            row = out.expect("decode")[0].clone().expect("logits");
            wall[usize::from(spare)][usize::from(overlap)] += masked + stepped;
            walked[usize::from(spare)][usize::from(overlap)] += 1;
            if !overlap && !spare {
                masks.push(masked);
                steps.push(stepped);
            }
        }
    }
    let per_token =
        |s: usize, k: usize| wall[s][k].as_secs_f64() * 1e3 / walked[s][k].max(1) as f64;
    let n = masks.len();
    let mask_mean = masks.iter().sum::<Duration>().as_secs_f64() * 1e3 / n as f64;
    let step_mean = steps.iter().sum::<Duration>().as_secs_f64() * 1e3 / steps.len() as f64;
    println!(
        "{}",
        json!({
            "tokens": n,
            "first_compile_ms": compile_costs[0],
            "compile_ms": compile_costs[1],
            "cache_hit_ms": compile_costs[2],
            "mask_ms_mean": mask_mean,
            "mask_ms_p50": percentile(&mut masks, 0.5),
            "mask_ms_p99": percentile(&mut masks, 0.99),
            "decode_step_ms_mean": step_mean,
            "decode_step_ms_p50": percentile(&mut steps, 0.5),
            "mask_over_step": mask_mean / step_mean,
            "all_cores": {"serial_ms_per_token": per_token(0, 0), "overlapped_ms_per_token": per_token(0, 1),
                "overlapped_over_serial": per_token(0, 1) / per_token(0, 0)},
            "one_core_spare": {"serial_ms_per_token": per_token(1, 0), "overlapped_ms_per_token": per_token(1, 1),
                "overlapped_over_serial": per_token(1, 1) / per_token(1, 0)},
        })
    );
}
