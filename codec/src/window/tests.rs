//! The window code: packing, round trips through every decoder this CPU
//! has (each must equal the scalar one bit for bit), and lying payloads.

use super::*;
use crate::sample::{kv_like, Rng};
use crate::{encode_fast, Header, Profile};

#[test]
fn packing_round_trips_at_every_length() {
    let mut r = Rng(3);
    for n in 0..40 {
        let v5: Vec<u8> = (0..n).map(|_| (r.next() % 32) as u8).collect();
        let v2: Vec<u8> = v5.iter().map(|v| v & 3).collect();
        let (mut p5, mut p2) = (Vec::new(), Vec::new());
        pack5(&v5, &mut p5);
        pack2(&v2, &mut p2);
        assert_eq!((p5.len(), p2.len()), (packed5_len(n), packed2_len(n)));
        let (mut b5, mut b2) = (vec![0; n], vec![0; n.div_ceil(8) * 8]);
        unpack5(&p5, &mut b5);
        unpack2_times4(&p2, &mut b2);
        let v2x4: Vec<u8> = v2.iter().map(|v| v * 4).collect();
        assert_eq!((&b5, &b2[..n]), (&v5, &v2x4[..]), "n {n}");
        let mut b5x4 = vec![0; n.div_ceil(8) * 8];
        unpack5_times4(&p5, &mut b5x4);
        assert!(b5x4.iter().zip(&v5).all(|(a, b)| *a == b * 4), "n {n}");
    }
}

#[test]
fn escape_streams_unpack_alike_on_every_path() {
    // Lengths around the vector step (64 values) and the pad.
    let mut r = Rng(5);
    for n in [0, 1, 7, 8, 63, 64, 65, 127, 128, 129, 200, 1000, 4097] {
        let v: Vec<u8> = (0..n).map(|_| (r.next() % 32) as u8).collect();
        for bits in [2, 5] {
            let v: Vec<u8> = v
                .iter()
                .map(|x| if bits == 2 { x & 3 } else { *x })
                .collect();
            let mut packed = Vec::new();
            if bits == 2 {
                pack2(&v, &mut packed);
            } else {
                pack5(&v, &mut packed);
            }
            let mut dst = vec![0xee; 3];
            unpack_times4(&packed, n, &mut dst, bits);
            assert_eq!(dst.len(), n.div_ceil(8) * 8 + PAD, "n {n} bits {bits}");
            let want: Vec<u8> = v.iter().map(|x| x * 4).collect();
            assert_eq!(&dst[..n], &want[..], "n {n} bits {bits}");
            assert!(
                dst[n..].iter().all(|&z| z == 0),
                "pad zero, n {n} bits {bits}"
            );
        }
    }
}

/// Extra bits an exponent `e` costs under base `b` beyond the field's 2
/// (the code the module doc describes, written out independently).
fn extra_bits(b: u8, e: u8) -> u32 {
    match b as i32 - e as i32 {
        0..=2 => 0,
        3..=5 => 2,
        _ => 7,
    }
}

/// High bytes whose exponents sit near a per-column scale, with a tail
/// of far ones (every escape level occurs), `m` elements.
fn high_bytes(m: usize, row: usize, seed: u64) -> Vec<u8> {
    let mut r = Rng(seed | 1);
    let top: Vec<u8> = (0..row).map(|_| 6 + (r.next() % 20) as u8).collect();
    (0..m)
        .map(|i| {
            let x = r.next();
            let e = match x % 10 {
                0..=6 => top[i % row] - (x >> 8) as u8 % 3,
                7 | 8 => top[i % row].saturating_sub(3 + (x >> 8) as u8 % 3),
                _ => (x >> 8) as u8 % 32,
            };
            ((x >> 20) as u8 & 0x83) | (e << 2)
        })
        .collect()
}

/// Decode `hi` (with low bytes `lo`) through the dispatching decoder and
/// the scalar one; both must give the interleaved input.
fn check_decoders(hi: &[u8], lo: &[u8], row: usize) {
    let mut body = Vec::new();
    let plan = plan(hi, row);
    encode(hi, row, &plan, &mut body);
    assert_eq!(body.len(), plan.len);
    // Each base is the cheapest for its column.
    for (c, &b) in plan.bases.iter().enumerate() {
        let col = hi.iter().skip(c).step_by(row).map(|h| (h >> 2) & 31);
        let cost = |b: u8| col.clone().map(|e| extra_bits(b, e)).sum::<u32>();
        assert!((0..32).all(|o| cost(b) <= cost(o)), "column {c}");
    }
    let want: Vec<u8> = lo.iter().zip(hi).flat_map(|(&l, &h)| [l, h]).collect();
    let mut s = Scratch::default();
    let p = parse(&body, hi.len(), &mut s).unwrap();
    let mut out = vec![0u8; 2 * hi.len()];
    decode(&p, lo, &mut s, &mut out, &[]).unwrap();
    assert_eq!(out, want, "dispatched decoder, row {row}, m {}", hi.len());
    let mut out = vec![0u8; 2 * hi.len()];
    decode_tail(&p, lo, &mut s, &mut out, 0, (0, 0)).unwrap();
    assert_eq!(out, want, "scalar decoder, row {row}, m {}", hi.len());
}

#[test]
fn every_decoder_returns_the_high_bytes_bit_for_bit() {
    // Rows the AVX-512 loop takes (64k), only AVX2 (32 mod 64), neither.
    for (row, m) in [
        (192, 12288),
        (64, 4096),
        (96, 3072),
        (40, 1000),
        (192, 12288 - 37),
        (7, 5),
    ] {
        let hi = high_bytes(m, row, row as u64 * 31 + m as u64);
        let lo: Vec<u8> = (0..m).map(|i| (i * 7 + 3) as u8).collect();
        check_decoders(&hi, &lo, row);
    }
    // Every possible high byte, in every column.
    let hi: Vec<u8> = (0..4096).map(|i| (i * 37 % 256) as u8).collect();
    check_decoders(&hi, &hi, 64);
}

#[test]
#[cfg(target_arch = "x86_64")]
fn each_simd_loop_equals_the_scalar_decoder() {
    let (row, m) = (192, 12288);
    let hi = high_bytes(m, row, 9);
    let lo: Vec<u8> = (0..m).map(|i| (i * 13) as u8).collect();
    let mut body = Vec::new();
    encode(&hi, row, &plan(&hi, row), &mut body);
    let mut s = Scratch::default();
    let p = parse(&body, m, &mut s).unwrap();
    let mut want = vec![0u8; 2 * m];
    decode_tail(&p, &lo, &mut s, &mut want, 0, (0, 0)).unwrap();
    for (name, run) in x86::loops() {
        let Some(run) = run else {
            eprintln!("{name}: not on this CPU, skipped");
            continue;
        };
        let mut out = vec![0u8; 2 * m];
        let (done, k1, k2) = run(&p, &lo, &s, &mut out);
        assert_eq!(done, m, "{name} decodes whole steps");
        assert_eq!((k1, k2), (p.n1, p.n2), "{name} consumes every escape");
        assert_eq!(out, want, "{name}");
    }
}

#[test]
fn fast_blocks_round_trip_and_compress_kv_like_data() {
    for len in [2 * 12288 * 4, 2 * 12288 * 4 + 2 * 100 + 1, 10, 0] {
        let src = kv_like(2, len, 5);
        let mut src = src;
        if len % 2 == 1 {
            src.push(0xab);
        }
        let mut enc = Vec::new();
        encode_fast(&src, 2, 192, &mut enc).unwrap();
        assert_eq!(Header::parse(&enc).unwrap().version, crate::VERSION_FAST);
        let mut back = vec![0u8; src.len()];
        crate::decode(&enc, &mut back).unwrap();
        assert_eq!(back, src, "len {len}");
        if len > 1000 {
            let ratio = src.len() as f64 / enc.len() as f64;
            assert!(ratio > 1.1, "KV-like f16 compresses: {ratio}");
        }
    }
    // Other widths fall back to the compact profile.
    assert_eq!(Profile::fast(4, 192), Profile::Compact);
    let src = kv_like(4, 4096, 1);
    let mut enc = Vec::new();
    encode_fast(&src, 4, 192, &mut enc).unwrap();
    assert_eq!(Header::parse(&enc).unwrap().version, crate::VERSION);
}

#[test]
fn lying_payloads_are_errors_never_panics() {
    let (row, m) = (64, 640);
    let hi = high_bytes(m, row, 4);
    let lo = vec![1u8; m];
    let mut body = Vec::new();
    encode(&hi, row, &plan(&hi, row), &mut body);
    let run = |b: &[u8]| -> Result<Vec<u8>, CodecError> {
        let mut s = Scratch::default();
        let p = parse(b, m, &mut s)?;
        let mut out = vec![0u8; 2 * m];
        decode(&p, &lo, &mut s, &mut out, &[])?;
        Ok(out)
    };
    assert!(run(&body).is_ok());
    // Row 0, counts past m or past n1, a length that does not add up.
    let set_u32 = |at: usize, v: u32| {
        let mut b = body.clone();
        b[at..at + 4].copy_from_slice(&v.to_le_bytes());
        b
    };
    let mut zero_row = body.clone();
    zero_row[..2].copy_from_slice(&[0, 0]);
    for bad in [
        zero_row,
        set_u32(2, m as u32 + 1),
        set_u32(6, u32::MAX),
        body[..body.len() - 1].to_vec(),
    ] {
        assert!(matches!(run(&bad), Err(CodecError::Corrupt { .. })));
    }
    // Counts that disagree with the fields (streams kept the right size):
    // the decoder runs out of, or leaves over, escape values.
    let n1 = u32::from_le_bytes([body[2], body[3], body[4], body[5]]);
    let l2_at = FIXED + packed5_len(row) + packed5_len(m);
    for fewer in [4u32, 8] {
        let mut b = body.clone();
        b[2..6].copy_from_slice(&(n1 - fewer).to_le_bytes());
        b.drain(l2_at..l2_at + fewer as usize / 4);
        assert_escapes_corrupt(run(&b));
    }
    let mut more = body.clone();
    more[2..6].copy_from_slice(&(n1 + 4).to_le_bytes());
    more.insert(l2_at, 0);
    assert_escapes_corrupt(run(&more));
    // Every flipped byte gives an error or some output, never a panic.
    for i in 0..body.len() {
        let mut b = body.clone();
        b[i] ^= 0x5a;
        let _ = run(&b);
    }
}

#[test]
fn a_window_plane_needs_the_fast_version() {
    let src = kv_like(2, 2 * 12288, 2);
    let mut enc = Vec::new();
    encode_fast(&src, 2, 192, &mut enc).unwrap();
    let mut back = vec![0u8; src.len()];
    let mut old = enc.clone();
    old[1] = crate::VERSION;
    assert!(matches!(
        crate::decode(&old, &mut back),
        Err(CodecError::Corrupt {
            what: "plane mode",
            ..
        })
    ));
    old[1] = crate::VERSION_FAST + 1;
    assert!(matches!(
        crate::decode(&old, &mut back),
        Err(CodecError::UnknownFormat { .. })
    ));
}

/// Probe: decode speed of fast and compact blocks against memcpy on
/// KV-like f16 (`cargo test --release -p kvfabric-codec perf_ -- --ignored
/// --nocapture`); `bench kv` measures the engine's real blocks.
#[test]
#[ignore]
fn perf_fast_decode() {
    let src = kv_like(2, 1_474_560, 11);
    let (mut fast, mut compact) = (Vec::new(), Vec::new());
    type Encoder = fn(&[u8], &mut Vec<u8>);
    let encoders: [(&str, &mut Vec<u8>, Encoder); 2] = [
        ("fast", &mut fast, |s, o| encode_fast(s, 2, 192, o).unwrap()),
        ("compact", &mut compact, |s, o| {
            crate::encode(s, 2, o).unwrap()
        }),
    ];
    for (name, out, run) in encoders {
        let t = std::time::Instant::now();
        run(&src, out);
        let gbps = src.len() as f64 / t.elapsed().as_secs_f64() / 1e9;
        println!("{name} encode {gbps:.2} GB/s");
    }
    let mut out = vec![0u8; src.len()];
    let mut time = |f: &mut dyn FnMut(&mut [u8])| {
        let mut best = f64::MAX;
        for _ in 0..2000 {
            let t = std::time::Instant::now();
            f(&mut out);
            best = best.min(t.elapsed().as_secs_f64());
        }
        src.len() as f64 / best / 1e9
    };
    let memcpy = time(&mut |o| o.copy_from_slice(std::hint::black_box(&src)));
    let f = time(&mut |o| crate::decode(&fast, o).unwrap());
    let c = time(&mut |o| crate::decode(&compact, o).unwrap());
    println!(
        "memcpy {memcpy:.2} GB/s; fast {f:.2} ({:.3}x, ratio {:.4}); compact {c:.2} ({:.3}x, ratio {:.4})",
        f / memcpy,
        src.len() as f64 / fast.len() as f64,
        c / memcpy,
        src.len() as f64 / compact.len() as f64
    );
}

/// Probe: each vector loop on one 12288-element segment of KV-like f16
/// high bytes (GB/s of decoded bytes), against memcpy of the same bytes.
#[test]
#[ignore]
#[cfg(target_arch = "x86_64")]
fn perf_loops() {
    let src = kv_like(2, 2 * 12288, 12);
    let (hi, lo): (Vec<u8>, Vec<u8>) = src.chunks_exact(2).map(|c| (c[1], c[0])).unzip();
    let mut body = Vec::new();
    encode(&hi, 192, &plan(&hi, 192), &mut body);
    let mut s = Scratch::default();
    let p = parse(&body, hi.len(), &mut s).unwrap();
    let mut out = vec![0u8; src.len()];
    let mut time = |f: &mut dyn FnMut(&mut [u8])| {
        let t = std::time::Instant::now();
        for _ in 0..20000 {
            f(std::hint::black_box(&mut out));
        }
        src.len() as f64 * 20000.0 / t.elapsed().as_secs_f64() / 1e9
    };
    let memcpy = time(&mut |o| o.copy_from_slice(std::hint::black_box(&src)));
    for (name, run) in x86::loops() {
        if let Some(run) = run {
            let g = time(&mut |o| {
                run(&p, &lo, &s, o);
            });
            println!(
                "{name}: {g:.2} GB/s, {:.3}x memcpy ({memcpy:.2})",
                g / memcpy
            );
        }
    }
}

/// Probe: fast decode of 64 distinct blocks (from DRAM, as `bench kv`
/// decodes them) against memcpy of the same number of distinct blocks.
#[test]
#[ignore]
fn perf_fast_decode_cold() {
    // Many distinct blocks, as `bench kv` decodes them: from DRAM.
    let many: Vec<Vec<u8>> = (0..64)
        .map(|k| {
            let mut e = Vec::new();
            encode_fast(&kv_like(2, 1_474_560, 100 + k), 2, 192, &mut e).unwrap();
            e
        })
        .collect();
    let mut out = vec![0u8; 1_474_560];
    let t = std::time::Instant::now();
    for _ in 0..5 {
        for e in &many {
            crate::decode(e, &mut out).unwrap();
        }
    }
    let cold = 5.0 * 64.0 * 1_474_560.0 / t.elapsed().as_secs_f64() / 1e9;
    let raw: Vec<Vec<u8>> = (0..64).map(|k| kv_like(2, 1_474_560, 100 + k)).collect();
    let t = std::time::Instant::now();
    for _ in 0..5 {
        for r in &raw {
            out.copy_from_slice(std::hint::black_box(r));
        }
    }
    let memcpy = 5.0 * 64.0 * 1_474_560.0 / t.elapsed().as_secs_f64() / 1e9;
    println!(
        "64 distinct blocks: fast decode {cold:.2} GB/s, memcpy {memcpy:.2}: {:.3}x",
        cold / memcpy
    );
}

/// The decoder's refusal of escape counts that disagree with the fields.
fn assert_escapes_corrupt<T: std::fmt::Debug>(res: Result<T, CodecError>) {
    assert!(
        matches!(
            res,
            Err(CodecError::Corrupt {
                what: "window escapes",
                ..
            })
        ),
        "{res:?}"
    );
}
