//! Batch invariance, asserted bitwise on the reference model: the logits and
//! KV of a sequence are the same alone or in a batch, in one pass or split at
//! block boundaries, and decode steps are the same for batch sizes 1..16;
//! with f16 KV (the default) and f32 KV.

use kvfabric_testkit::engine::driver as common;

use kvfabric_engine::kv::{BlockId, KvPool};
use kvfabric_engine::model::SeqChunk;

use common::DType;

const BT: usize = 16;

fn prompt(seed: u32, len: usize) -> Vec<u32> {
    (0..len as u32)
        .map(|i| (i * 7919 + seed * 104_729) % 49_000 + 10)
        .collect()
}

fn kv_bytes(kv: &KvPool, table: &[BlockId], tokens: usize) -> Vec<u8> {
    // Only whole blocks and the filled part of the last one are compared.
    let layout = *kv.layout();
    let row = (layout.kv_heads * layout.head_dim) as usize * layout.dtype.size();
    let mut out = Vec::new();
    for (bi, &b) in table.iter().enumerate() {
        let filled = tokens.saturating_sub(bi * BT).min(BT);
        for l in 0..layout.layers as usize {
            let r = kv.layer_range(b, l);
            let start = kv.block_range(b).start;
            let bytes = &kv.block_bytes(b)[r.start - start..r.end - start];
            let half = layout.half_layer_bytes();
            out.extend_from_slice(&bytes[..filled * row]);
            out.extend_from_slice(&bytes[half..half + filled * row]);
        }
    }
    out
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn prefill_alone_batched_and_split_are_bitwise_identical_f16() {
    prefill_alone_batched_and_split(DType::F16);
}

#[test]
fn prefill_alone_batched_and_split_are_bitwise_identical_f32() {
    prefill_alone_batched_and_split(DType::F32);
}

fn prefill_alone_batched_and_split(dtype: DType) {
    let (m, cx) = (common::model(), common::compute());
    let a = prompt(1, 150);
    let others = [prompt(2, 37), prompt(3, 90)];
    let nb = 150usize.div_ceil(BT);
    // Alone, one pass.
    let mut kv = common::pool(BT, 3 * nb, dtype);
    let table_a: Vec<BlockId> = (0..nb as u32).collect();
    let alone = m
        .forward(
            cx,
            &mut kv,
            &[SeqChunk {
                tokens: &a,
                start: 0,
                blocks: &table_a,
                logits: true,
            }],
        )
        .expect("alone")[0]
        .clone()
        .expect("logits");
    let kv_alone = kv_bytes(&kv, &table_a, a.len());

    // In a batch with two other sequences, A in the middle and in other blocks.
    let mut kv2 = common::pool(BT, 3 * nb, dtype);
    let t0: Vec<BlockId> = (0..3).collect();
    let ta: Vec<BlockId> = (3..3 + nb as u32).collect();
    let t2: Vec<BlockId> = (3 + nb as u32..3 + nb as u32 + 6).collect();
    let out = m
        .forward(
            cx,
            &mut kv2,
            &[
                SeqChunk {
                    tokens: &others[0],
                    start: 0,
                    blocks: &t0,
                    logits: true,
                },
                SeqChunk {
                    tokens: &a,
                    start: 0,
                    blocks: &ta,
                    logits: true,
                },
                SeqChunk {
                    tokens: &others[1],
                    start: 0,
                    blocks: &t2,
                    logits: false,
                },
            ],
        )
        .expect("batched");
    assert!(out[2].is_none());
    assert_eq!(
        bits(out[1].as_ref().expect("logits")),
        bits(&alone),
        "batched logits"
    );
    assert!(kv_bytes(&kv2, &ta, a.len()) == kv_alone, "batched KV");

    // Split at block boundaries: 0..48, 48..112, 112..150 (with another sequence riding along).
    let mut kv3 = common::pool(BT, 3 * nb, dtype);
    let mut last = None;
    for (s, e) in [(0usize, 48usize), (48, 112), (112, 150)] {
        let out = m
            .forward(
                cx,
                &mut kv3,
                &[
                    SeqChunk {
                        tokens: &a[s..e],
                        start: s,
                        blocks: &table_a,
                        logits: e == 150,
                    },
                    SeqChunk {
                        tokens: &others[0][..5],
                        start: 0,
                        blocks: &t2[..1],
                        logits: true,
                    },
                ],
            )
            .expect("split");
        last = out[0].clone();
    }
    assert_eq!(bits(&last.expect("logits")), bits(&alone), "split logits");
    assert!(kv_bytes(&kv3, &table_a, a.len()) == kv_alone, "split KV");
}

#[test]
fn decode_steps_are_bitwise_identical_across_batch_sizes_1_to_16_f16() {
    decode_steps_across_batch_sizes(DType::F16);
}

#[test]
fn decode_steps_are_bitwise_identical_across_batch_sizes_1_to_16_f32() {
    decode_steps_across_batch_sizes(DType::F32);
}

fn decode_steps_across_batch_sizes(dtype: DType) {
    let (m, cx) = (common::model(), common::compute());
    let n = 16usize;
    let prompts: Vec<Vec<u32>> = (0..n as u32)
        .map(|i| prompt(10 + i, 20 + 3 * i as usize))
        .collect();
    let per = 5; // blocks per sequence: up to 65+1 tokens
    let mut kv = common::pool(BT, n * per, dtype);
    let tables: Vec<Vec<BlockId>> = (0..n)
        .map(|i| ((i * per) as u32..((i + 1) * per) as u32).collect())
        .collect();
    let mut next = Vec::new();
    for i in 0..n {
        let out = m
            .forward(
                cx,
                &mut kv,
                &[SeqChunk {
                    tokens: &prompts[i],
                    start: 0,
                    blocks: &tables[i],
                    logits: true,
                }],
            )
            .expect("prefill");
        next.push(common::argmax(out[0].as_ref().expect("logits")));
    }
    let mut reference: Option<(Vec<u32>, Vec<u8>)> = None;
    for batch in 1..=n {
        let toks: Vec<[u32; 1]> = (0..batch).map(|i| [next[i]]).collect();
        let chunks: Vec<SeqChunk> = (0..batch)
            .map(|i| SeqChunk {
                tokens: &toks[i],
                start: prompts[i].len(),
                blocks: &tables[i],
                logits: true,
            })
            .collect();
        let out = m.forward(cx, &mut kv, &chunks).expect("decode");
        let l0 = bits(out[0].as_ref().expect("logits"));
        let kv0 = kv_bytes(&kv, &tables[0], prompts[0].len() + 1);
        match &reference {
            None => reference = Some((l0, kv0)),
            Some((rl, rk)) => {
                assert_eq!(&l0, rl, "decode logits differ at batch size {batch}");
                assert!(&kv0 == rk, "decode KV differs at batch size {batch}");
            }
        }
    }
}
