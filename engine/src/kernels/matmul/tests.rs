//! The packed matmul against the sequential-FMA reference, every path.

use super::*;
use crate::kernels::test_weights::{random_q4_1, random_q8_0};

#[test]
fn matmul_equals_sequential_fma_reference_on_every_isa_and_batch() {
    let (n, k) = (128, 96);
    let (info, bytes, deq) = random_q4_1(n, k, 7);
    let w = PackedMatrix::pack(&[(&info, &bytes)]).expect("pack");
    let mut row = vec![0f32; k];
    w.row(5, &mut row);
    assert_eq!(row, deq[5 * k..6 * k]);
    let m = 130;
    let x: Vec<f32> = (0..m * k)
        .map(|i| ((i * 37 % 101) as f32 - 50.0) / 31.0)
        .collect();
    let mut want = vec![0f32; m * n];
    for r in 0..m {
        for c in 0..n {
            let mut acc = 0f32;
            for j in 0..k {
                acc = deq[c * k + j].mul_add(x[r * k + j], acc);
            }
            want[r * n + c] = acc;
        }
    }
    for threads in [1, 2] {
        let pool = ThreadPool::new(threads);
        for isa in Isa::all_detected() {
            for rows in [1, 3, m] {
                let mut out = vec![0f32; rows * n];
                w.matmul(&pool, isa, &x[..rows * k], rows, &mut out);
                assert!(
                    out.iter()
                        .zip(&want)
                        .all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{isa:?} rows={rows} threads={threads}"
                );
            }
        }
    }
}

#[test]
fn pack_rejects_bad_shapes() {
    let (info, bytes, _) = random_q4_1(32, 64, 1);
    assert!(PackedMatrix::pack(&[(&info, &bytes)]).is_err());
    assert!(PackedMatrix::pack(&[]).is_err());
}

/// Every row count, through the fused kernels (1 row; 2..=16 rows in passes
/// of up to 8 rows on AVX-512, up to 6 on AVX2) and past them (the scratch
/// path), equals the sequential-FMA reference bit for bit, for both
/// quantized formats, every ISA and thread count.
#[test]
fn fused_rows_equal_sequential_fma_reference() {
    let isas = Isa::all_detected();
    let (n, k) = (192, 160);
    for q8 in [false, true] {
        let (info, bytes, deq) = if q8 {
            random_q8_0(n, k, 11)
        } else {
            random_q4_1(n, k, 11)
        };
        let w = PackedMatrix::pack(&[(&info, &bytes)]).expect("pack");
        let m = 18;
        let x: Vec<f32> = (0..m * k)
            .map(|i| ((i * 53 % 97) as f32 - 48.0) / 13.0)
            .collect();
        let mut want = vec![0f32; m * n];
        for r in 0..m {
            for c in 0..n {
                let mut acc = 0f32;
                for j in 0..k {
                    acc = deq[c * k + j].mul_add(x[r * k + j], acc);
                }
                want[r * n + c] = acc;
            }
        }
        for threads in [1, 2, 3] {
            let pool = ThreadPool::new(threads);
            for &isa in &isas {
                for rows in 1..=m {
                    let mut out = vec![f32::NAN; rows * n];
                    w.matmul(&pool, isa, &x[..rows * k], rows, &mut out);
                    let same = out
                        .iter()
                        .zip(&want)
                        .all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(same, "q8={q8} {isa:?} rows={rows} threads={threads}");
                }
            }
        }
    }
}

/// The small-batch fused path equals the scratch path bit for bit for every
/// row count it takes (2..=16: one pass and several), every ISA, both
/// quantized formats and thread counts, with side lines requested (they
/// change no value) and without; several matrix shapes, so that half tiles,
/// whole tiles (16 tiles or more, up to 3-4 rows), 16-column passes and
/// chunk counts vary.
#[test]
fn fused_rows_equal_scratch_path_with_and_without_side_lines() {
    let side_buf = vec![0u8; 64 * 1024];
    let mut side = SideLines::with_span_bytes(4096);
    for i in 0..16 {
        side.push(side_buf[i * 4096..].as_ptr());
    }
    for (n, k, seed) in [(64, 32, 5), (320, 96, 6), (128, 544, 7), (1024, 64, 8)] {
        for q8 in [false, true] {
            let (info, bytes, _) = if q8 {
                random_q8_0(n, k, seed)
            } else {
                random_q4_1(n, k, seed)
            };
            let w = PackedMatrix::pack(&[(&info, &bytes)]).expect("pack");
            let x: Vec<f32> = (0..16 * k)
                .map(|i| ((i * 29 % 103) as f32 - 51.0) / 17.0)
                .collect();
            for threads in [1, 2] {
                let pool = ThreadPool::new(threads);
                for isa in Isa::all_detected() {
                    for m in 2..=16 {
                        let (x, mut want) = (&x[..m * k], vec![0f32; m * n]);
                        w.matmul_scratch(&pool, isa, x, m, &mut want);
                        for lines in [&SideLines::none(), &side] {
                            let mut out = vec![f32::NAN; m * n];
                            w.matmul_prefetching(&pool, isa, x, m, &mut out, lines);
                            let same = out
                                .iter()
                                .zip(&want)
                                .all(|(a, b)| a.to_bits() == b.to_bits());
                            let what = format!("n={n} k={k} q8={q8} {isa:?} m={m}");
                            assert!(same, "{what} threads={threads} side={}", lines.lines());
                        }
                    }
                }
            }
        }
    }
}
