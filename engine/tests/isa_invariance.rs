//! The reference model's logits have the same bits on every ISA this CPU
//! runs (scalar, AVX2, AVX-512), through each matmul path: a batched prefill
//! (the dequantization scratch), a decode batch of 3 rows (AVX-512's fused
//! rows) and single-row decode (the fused columns). The blake3 of all
//! logits is printed so that a kernel change can be checked against the
//! figure before it (`cargo test -p kvfabric-engine --test isa_invariance
//! -- --nocapture`).

use kvfabric_engine::kernels::{Compute, Isa, ThreadPool};
use kvfabric_engine::kv::KvPool;
use kvfabric_engine::model::SeqChunk;
use kvfabric_testkit::engine::driver as common;
use kvfabric_testkit::engine::driver::{argmax, DType};

const PROMPTS: [&[u32]; 3] = [
    &[1, 504, 3458, 282, 4649, 30, 2],
    &[1, 1848, 1337, 12, 42, 9001, 77, 5, 8, 13, 21],
    &[1, 2000, 3000],
];

/// All logits (prefill of the three prompts together, then 3 decode steps
/// of the three together, then 3 of the first alone), as one byte string.
fn logits_bits(cx: &Compute) -> Vec<u8> {
    let m = common::model();
    let blocks_per_seq = 2;
    let mut kv: KvPool = common::pool(16, 3 * blocks_per_seq, DType::F16);
    let tables: Vec<Vec<u32>> = (0..3u32).map(|s| (s * 2..s * 2 + 2).collect()).collect();
    let mut bits = Vec::new();
    let take = |v: &[f32], bits: &mut Vec<u8>| {
        bits.extend(v.iter().flat_map(|x| x.to_bits().to_le_bytes()));
        argmax(v)
    };
    let chunks: Vec<SeqChunk> = PROMPTS
        .iter()
        .zip(&tables)
        .map(|(p, t)| SeqChunk {
            tokens: p,
            start: 0,
            blocks: t,
            logits: true,
        })
        .collect();
    let out = m.forward(cx, &mut kv, &chunks).expect("prefill");
    let mut last: Vec<[u32; 1]> = out
        .iter()
        .map(|l| [take(l.as_ref().expect("logits"), &mut bits)])
        .collect();
    let mut pos: Vec<usize> = PROMPTS.iter().map(|p| p.len()).collect();
    for step in 0..6 {
        let seqs = if step < 3 { 3 } else { 1 };
        let chunks: Vec<SeqChunk> = (0..seqs)
            .map(|s| SeqChunk {
                tokens: &last[s],
                start: pos[s],
                blocks: &tables[s],
                logits: true,
            })
            .collect();
        let out = m.forward(cx, &mut kv, &chunks).expect("decode");
        for (s, l) in out.iter().enumerate() {
            last[s] = [take(l.as_ref().expect("logits"), &mut bits)];
            pos[s] += 1;
        }
    }
    bits
}

#[test]
fn logits_are_the_same_bits_on_every_isa() {
    let best = Isa::detect();
    let mut isas = vec![Isa::Scalar];
    if best != Isa::Scalar {
        isas.push(Isa::Avx2);
    }
    if best == Isa::Avx512 {
        isas.push(Isa::Avx512);
    }
    let mut hashes = Vec::new();
    for isa in isas {
        let cx = Compute {
            isa,
            pool: ThreadPool::new(2),
        };
        let hash = blake3::hash(&logits_bits(&cx));
        eprintln!("{isa:?}: logits blake3 {hash}");
        hashes.push((isa, hash));
    }
    for (isa, hash) in &hashes[1..] {
        assert_eq!(*hash, hashes[0].1, "{isa:?} differs from scalar");
    }
}
