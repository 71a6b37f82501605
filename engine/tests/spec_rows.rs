//! The claim speculative decoding rests on, asserted bitwise on the reference
//! model: the logits of k tokens verified as extra rows of one forward pass
//! (alone or beside other sequences' rows) are those of decoding the k
//! tokens one at a time.

use kvfabric_testkit::engine::driver as common;

use common::DType;
use kvfabric_engine::kv::BlockId;
use kvfabric_engine::model::SeqChunk;

const BT: usize = 16;

fn prompt(seed: u32, len: usize) -> Vec<u32> {
    (0..len as u32)
        .map(|i| (i * 7919 + seed * 104_729) % 49_000 + 10)
        .collect()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Prefill `p`, then decode `steps` greedy tokens one per pass: the tokens
/// fed (the first is sampled from the prompt) and each step's logits.
fn one_at_a_time(p: &[u32], table: &[BlockId], steps: usize) -> (Vec<u32>, Vec<Vec<u32>>) {
    let (m, cx) = (common::model(), common::compute());
    let mut kv = common::pool(BT, table.len() + 8, DType::F16);
    let (first, _) = common::greedy(&mut kv, table, p, 1);
    let mut fed = vec![common::argmax(&first)];
    let mut logits = Vec::new();
    for s in 0..steps {
        let tok = [fed[s]];
        let out = m
            .forward(
                cx,
                &mut kv,
                &[SeqChunk {
                    tokens: &tok,
                    start: p.len() + s,
                    blocks: table,
                    logits: true,
                }],
            )
            .expect("decode");
        let row = out[0].clone().expect("logits");
        fed.push(common::argmax(&row));
        logits.push(bits(&row));
    }
    (fed, logits)
}

#[test]
fn verified_rows_are_bitwise_one_at_a_time_decoding() {
    let (m, cx) = (common::model(), common::compute());
    let k = 9;
    for (seed, len) in [(1u32, 20usize), (2, 47), (3, 64)] {
        let a = prompt(seed, len);
        let blocks = (len + k + 1).div_ceil(BT);
        let table: Vec<BlockId> = (0..blocks as u32).collect();
        let (fed, want) = one_at_a_time(&a, &table, k);
        // Alone: the prompt, then all k tokens in one pass, k rows of logits.
        let mut kv = common::pool(BT, 2 * blocks + 8, DType::F16);
        common::greedy(&mut kv, &table, &a, 1);
        let out = m
            .forward_rows(
                cx,
                &mut kv,
                &[SeqChunk {
                    tokens: &fed[..k],
                    start: len,
                    blocks: &table,
                    logits: false,
                }],
                &[k],
                &mut |_| {},
            )
            .expect("verify");
        let got: Vec<Vec<u32>> = out[0].iter().map(|r| bits(r)).collect();
        assert_eq!(got, want, "prompt {seed}: rows alone");

        // Beside a prefill and a decode of other sequences, in other blocks.
        let mut kv = common::pool(BT, 2 * blocks + 8, DType::F16);
        common::greedy(&mut kv, &table, &a, 1);
        let other = prompt(seed + 10, 30);
        let t_other: Vec<BlockId> = (blocks as u32..blocks as u32 + 2).collect();
        let t_dec: Vec<BlockId> = (blocks as u32 + 2..blocks as u32 + 4).collect();
        common::greedy(&mut kv, &t_dec, &other[..20], 1);
        let out = m
            .forward_rows(
                cx,
                &mut kv,
                &[
                    SeqChunk {
                        tokens: &other,
                        start: 0,
                        blocks: &t_other,
                        logits: false,
                    },
                    SeqChunk {
                        tokens: &fed[..k],
                        start: len,
                        blocks: &table,
                        logits: false,
                    },
                    SeqChunk {
                        tokens: &other[20..21],
                        start: 20,
                        blocks: &t_dec,
                        logits: false,
                    },
                ],
                &[1, k, 1],
                &mut |_| {},
            )
            .expect("verify in a batch");
        let got: Vec<Vec<u32>> = out[1].iter().map(|r| bits(r)).collect();
        assert_eq!(got, want, "prompt {seed}: rows in a batch");
        assert_eq!((out[0].len(), out[2].len()), (1, 1));
    }
}
