//! The grammar module's unit tests on the tiny test vocabulary: masks, advancing,
//! sampling under a mask, compile errors and the cache, Lark grammars.

use serde_json::json;

use super::*;
use crate::tokenizer::tests::tiny;

/// The tiny vocabulary (ids 0/1 `<|im_start|>`/`<|im_end|>`, 256 bytes,
/// a few merges) with `<|im_end|>` as the stop id.
fn grammars() -> (Arc<Tokenizer>, Grammars) {
    let t = Arc::new(tiny());
    (t.clone(), Grammars::new(t, vec![1]))
}

fn id(t: &Tokenizer, text: &str) -> u32 {
    let ids = t.encode(text, false);
    assert_eq!(ids.len(), 1, "{text:?} is one token");
    ids[0]
}

#[test]
fn mask_allows_only_what_the_schema_can_continue_with() {
    let (t, g) = grammars();
    let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"], "additionalProperties": false});
    let c = g
        .compile(&GrammarSpec::json_schema(schema))
        .expect("compiles");
    let mut m = c.matcher();
    let mut logits = vec![0.5f32; t.vocab_size()];
    m.mask(&mut logits).expect("mask");
    let allowed: Vec<u32> = (0..logits.len() as u32)
        .filter(|&i| logits[i as usize].is_finite())
        .collect();
    assert_eq!(allowed, vec![id(&t, "{")], "an object starts with {{");
    // Advance through `{"a": 7}` and the stop id becomes the only choice.
    for ch in ["{", "\"", "a", "\"", ":", " ", "7", "}"] {
        let mut row = vec![0.0f32; t.vocab_size()];
        m.mask(&mut row).expect("mask");
        let tok = id(&t, ch);
        assert!(row[tok as usize].is_finite(), "{ch:?} allowed");
        m.advance(tok).expect("advance");
    }
    assert!(m.is_accepting());
    let mut row = vec![0.0f32; t.vocab_size()];
    if !m.is_stopped() {
        m.mask(&mut row).expect("mask");
        assert!(row[1].is_finite(), "the stop id ends a complete object");
        assert!(row[id(&t, "}") as usize].is_infinite());
    }
}

#[test]
fn a_forbidden_token_is_never_sampled_even_when_it_dominates() {
    let (t, g) = grammars();
    let schema = json!({"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"], "additionalProperties": false});
    let c = g
        .compile(&GrammarSpec::json_schema(schema))
        .expect("compiles");
    for seed in 0..20 {
        let mut m = c.matcher();
        let mut s = crate::sampling::Sampler::new(&crate::SamplingParams {
            temperature: 1.0,
            seed: Some(seed),
            ..Default::default()
        });
        let mut out = Vec::new();
        for _ in 0..64 {
            // The raw model "wants" `x` above everything, and prefers the stop id.
            let mut row = vec![0.0f32; t.vocab_size()];
            row[id(&t, "x") as usize] = 50.0;
            row[1] = 5.0;
            m.mask(&mut row).expect("mask");
            let tok = s.sample(&row);
            assert_ne!(tok, id(&t, "x"), "masked token sampled");
            if tok == 1 {
                break;
            }
            m.advance(tok).expect("allowed token advances");
            out.push(tok);
            if m.is_stopped() {
                break;
            }
        }
        let text = t.decode(&out);
        let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
        assert!(v["ok"].is_boolean(), "{text}");
    }
}

#[test]
fn advancing_past_a_token_the_mask_forbids_fails() {
    let (t, g) = grammars();
    let c = g
        .compile(&GrammarSpec::json_schema(json!({"type": "object"})))
        .expect("compiles");
    let mut m = c.matcher();
    assert!(m.advance(id(&t, "x")).is_err());
}

#[test]
fn bad_schemas_fail_with_the_compilers_reason_and_good_ones_are_cached() {
    let (_, g) = grammars();
    let e = g
        .compile(&GrammarSpec::json_schema(json!({"type": "frobnicate"})))
        .expect_err("unknown type");
    assert!(
        matches!(&e, EngineError::Grammar(GrammarFault::Parser(p)) if p.to_string().contains("frobnicate")),
        "{e}"
    );
    let e = g
        .compile(&GrammarSpec::json_schema(
            json!({"$ref": "#/$defs/missing"}),
        ))
        .expect_err("dangling ref");
    assert!(matches!(e, EngineError::Grammar { .. }));
    let spec = GrammarSpec::json_schema(json!({"type": "array", "items": {"type": "string"}}));
    let a = g.compile(&spec).expect("compiles");
    let b = g.compile(&spec).expect("cached");
    assert!(Arc::ptr_eq(&a.0, &b.0), "the second compile is a cache hit");
}

#[test]
fn lark_grammars_compile_and_constrain() {
    let (t, g) = grammars();
    let c = g
        .compile(&GrammarSpec::Lark("start: \"he\" \"llo\" | \"x\"".into()))
        .expect("compiles");
    let mut m = c.matcher();
    let mut row = vec![0.0f32; t.vocab_size()];
    m.mask(&mut row).expect("mask");
    assert!(row[id(&t, "hello") as usize].is_finite());
    assert!(row[id(&t, "x") as usize].is_finite());
    assert!(row[id(&t, "y") as usize].is_infinite());
    m.advance(id(&t, "hello")).expect("advance");
    assert!(m.is_stopped(), "nothing can follow");
}

#[test]
fn compact_keeps_a_schemas_own_options() {
    assert_eq!(
        compact(json!({"type": "object"}))["x-guidance"]["whitespace_flexible"],
        json!(false)
    );
    let own = json!({"type": "object", "x-guidance": {"whitespace_flexible": true}});
    assert_eq!(compact(own.clone()), own);
}

#[test]
fn a_prepared_mask_is_used_once_and_dropped_by_advancing() {
    let (t, g) = grammars();
    let c = g
        .compile(&GrammarSpec::json_schema(json!({"type": "object"})))
        .expect("compiles");
    let mut m = c.matcher();
    m.prepare();
    let mut row = vec![0.0f32; t.vocab_size()];
    m.mask(&mut row).expect("prepared mask");
    assert!(row[id(&t, "{") as usize].is_finite());
    m.prepare();
    m.advance(id(&t, "{")).expect("advance");
    let mut row = vec![0.0f32; t.vocab_size()];
    m.mask(&mut row).expect("fresh mask");
    assert!(
        row[id(&t, "{") as usize].is_infinite(),
        "the mask prepared before `{{` is not reused after it"
    );
}

#[test]
fn a_draft_is_valid_up_to_the_first_token_the_grammar_forbids() {
    let (t, g) = grammars();
    let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"], "additionalProperties": false});
    let c = g
        .compile(&GrammarSpec::json_schema(schema))
        .expect("compiles");
    let mut m = c.matcher();
    let good: Vec<u32> = ["{", "\"", "a", "\""].iter().map(|s| id(&t, s)).collect();
    assert_eq!(m.valid_prefix(&good), 4);
    let bad = [id(&t, "{"), id(&t, "x"), id(&t, "\"")];
    assert_eq!(m.valid_prefix(&bad), 1, "cut at `x`");
    assert_eq!(m.valid_prefix(&[u32::MAX]), 0, "an id past the vocabulary");
    // Checking advanced nothing.
    let mut row = vec![0.0f32; t.vocab_size()];
    m.mask(&mut row).expect("mask");
    assert!(row[id(&t, "{") as usize].is_finite());
}
