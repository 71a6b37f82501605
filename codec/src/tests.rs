//! Round trips over the shapes the codec meets, and the failure paths:
//! truncated, corrupted and lying input is an error, never a panic.

use super::*;

use crate::sample::Rng;

/// f32 values like a KV block's: per-channel scales over 64 channels.
fn kv_like(n: usize, seed: u64) -> Vec<f32> {
    let mut r = Rng(seed | 1);
    let scales: Vec<f32> = (0..64).map(|_| 0.05 + 4.0 * r.unit() as f32).collect();
    (0..n).map(|i| r.normal() * scales[i % 64]).collect()
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Truncating f32 -> f16-like 16-bit words (top sign/exponent/mantissa bits
/// of an f16 made by shifting exponent range; enough for plane statistics).
fn half_bytes(v: &[f32]) -> Vec<u8> {
    v.iter()
        .flat_map(|x| {
            let b = x.to_bits();
            let exp = ((b >> 23) & 0xff) as i32 - 127 + 15;
            let h = if exp <= 0 {
                (b >> 16) as u16 & 0x8000
            } else {
                ((b >> 16) & 0x8000) as u16
                    | ((exp.min(30) as u16) << 10)
                    | ((b >> 13) & 0x3ff) as u16
            };
            h.to_le_bytes()
        })
        .collect()
}

fn round_trip(src: &[u8], width: usize, segment: u32) -> Vec<u8> {
    let mut enc = Vec::new();
    encode_segmented(src, width, segment, &mut enc).unwrap();
    let h = Header::parse(&enc).unwrap();
    assert_eq!(h.decoded_len, src.len() as u64);
    assert_eq!(h.encoded_len, enc.len() as u64);
    let mut out = vec![0xAAu8; src.len()];
    decode(&enc, &mut out).unwrap();
    assert_eq!(
        out,
        src,
        "width {width} segment {segment} len {}",
        src.len()
    );
    // Padding after the block (a disk extent's) is ignored.
    let mut padded = enc.clone();
    padded.resize(enc.len() + 4096, 0x5c);
    assert_eq!(decode_to_vec(&padded, src.len() as u64).unwrap(), src);
    enc
}

#[test]
fn floats_round_trip_and_compress() {
    let v = kv_like(3 * 12288 + 77, 7);
    let f32b = f32_bytes(&v);
    let f16b = half_bytes(&v);
    let e32 = round_trip(&f32b, 4, DEFAULT_SEGMENT);
    let e16 = round_trip(&f16b, 2, DEFAULT_SEGMENT);
    // Sign/exponent bytes of normal values carry far less than 8 bits.
    assert!(
        e32.len() * 100 < f32b.len() * 95,
        "{} vs {}",
        e32.len(),
        f32b.len()
    );
    assert!(
        e16.len() * 100 < f16b.len() * 92,
        "{} vs {}",
        e16.len(),
        f16b.len()
    );
    for segment in [1, 3, 64, 1000, u32::MAX] {
        round_trip(&f16b[..5000], 2, segment);
        round_trip(&f32b[..4003], 4, segment);
    }
}

#[test]
fn any_bytes_any_width_round_trip() {
    let mut r = Rng(99);
    let random: Vec<u8> = (0..20_011).map(|_| r.next() as u8).collect();
    let constant = vec![7u8; 9000];
    let two_symbols: Vec<u8> = (0..9000)
        .map(|i| if i % 17 == 0 { 1 } else { 200 })
        .collect();
    // Heavily skewed: code lengths must be limited to 11 bits.
    let skewed: Vec<u8> = (0..60_000u32)
        .map(|i| (i.trailing_zeros().min(30) * 8) as u8)
        .collect();
    for data in [&random, &constant, &two_symbols, &skewed] {
        for width in 1..=8 {
            for len in [0, 1, 5, 17, 1000, data.len()] {
                round_trip(&data[..len], width, 333);
            }
        }
    }
    // Random bytes do not grow by more than the records.
    let enc = round_trip(&random, 2, DEFAULT_SEGMENT);
    assert!(enc.len() <= random.len() + HEADER_LEN + 16);
}

#[test]
fn code_lengths_are_limited_and_complete() {
    let mut counts = [0u32; 256];
    // Fibonacci counts: an unlimited Huffman code would be 40+ bits deep.
    let (mut a, mut b) = (1u32, 1u32);
    for c in counts.iter_mut().take(45) {
        *c = a;
        (a, b) = (b, a.saturating_add(b));
    }
    let l = huffman::code_lengths(&counts).unwrap();
    assert!(l.iter().all(|&x| x as u32 <= huffman::MAX_LEN));
    let kraft: u64 = l
        .iter()
        .filter(|&&x| x > 0)
        .map(|&x| 1u64 << (huffman::MAX_LEN - x as u32))
        .sum();
    assert_eq!(kraft, 1 << huffman::MAX_LEN);
    assert!(l[44] <= l[0], "frequent symbols get short codes");
}

fn sample_block() -> (Vec<u8>, Vec<u8>) {
    let src = half_bytes(&kv_like(2 * 2000 + 3, 5));
    let mut enc = Vec::new();
    encode_segmented(&src, 2, 1500, &mut enc).unwrap();
    (src, enc)
}

#[test]
fn truncated_input_is_an_error() {
    let (src, enc) = sample_block();
    let mut out = vec![0u8; src.len()];
    for cut in 0..enc.len() {
        assert!(decode(&enc[..cut], &mut out).is_err(), "cut at {cut}");
    }
}

#[test]
fn corrupt_input_never_panics() {
    let (src, enc) = sample_block();
    let mut r = Rng(3);
    let mut out = vec![0u8; src.len()];
    let mut errors = 0;
    for _ in 0..3000 {
        let mut bad = enc.clone();
        for _ in 0..1 + r.next() % 4 {
            let i = (r.next() as usize) % bad.len();
            bad[i] ^= 1 << (r.next() % 8);
        }
        // Either an error or some bytes; a checksum above catches the latter.
        if decode(&bad, &mut out).is_err() {
            errors += 1;
        }
    }
    assert!(errors > 0);
    // Pure noise, with and without a valid-looking header.
    for len in [0, 10, 24, 100, 5000] {
        let noise: Vec<u8> = (0..len).map(|_| r.next() as u8).collect();
        assert!(decode(&noise, &mut out).is_err());
        let mut framed = enc[..HEADER_LEN].to_vec();
        framed.extend_from_slice(&noise);
        let n = framed.len() as u64;
        framed[12..20].copy_from_slice(&n.to_le_bytes());
        let _ = decode(&framed, &mut out);
    }
}

#[test]
fn lengths_are_refused_before_allocating() {
    let (src, mut enc) = sample_block();
    // The caller's expected length is enforced.
    let mut short = vec![0u8; src.len() - 1];
    assert!(matches!(
        decode(&enc, &mut short),
        Err(CodecError::WrongLength { .. })
    ));
    assert!(matches!(
        decode_to_vec(&enc, src.len() as u64 - 1),
        Err(CodecError::WrongLength { .. })
    ));
    // A header claiming an absurd size is refused, not allocated.
    enc[4..12].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(matches!(
        decode_to_vec(&enc, 1 << 30),
        Err(CodecError::WrongLength { .. })
    ));
    // An encoded length past the input is truncation.
    let (_, mut enc) = sample_block();
    enc[12..20].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(matches!(
        decode_to_vec(&enc, 1 << 30),
        Err(CodecError::Truncated { .. })
    ));
    // Unknown codec ids and versions are refused.
    let (_, mut enc) = sample_block();
    enc[1] = 9;
    assert!(matches!(
        decode_to_vec(&enc, 1 << 30),
        Err(CodecError::UnknownFormat { .. })
    ));
}

#[test]
fn the_estimate_tracks_the_encoder() {
    // Random bytes: the estimate says no gain (>= raw, less a unit's noise),
    // as the encoder finds. KV-like halves: within 3% of the encoder.
    let mut r = Rng(99);
    let random: Vec<u8> = (0..300_000).map(|_| r.next() as u8).collect();
    let est = estimate_encoded_len(&random, 2, 12288);
    assert!(
        est + 1024 >= random.len(),
        "random: {est} vs {}",
        random.len()
    );
    let half = half_bytes(&kv_like(24 * 12288, 5));
    let mut enc = Vec::new();
    encode_segmented(&half, 2, 12288, &mut enc).unwrap();
    let est = estimate_encoded_len(&half, 2, 12288) as f64;
    let got = enc.len() as f64;
    assert!(est < 0.95 * half.len() as f64, "kv-like: {est} vs {got}");
    assert!((est / got - 1.0).abs() < 0.03, "kv-like: {est} vs {got}");
    // Constant planes and odd widths estimate without panicking.
    assert!(estimate_encoded_len(&[7u8; 10_001], 4, 100) < 1000);
    assert_eq!(estimate_encoded_len(&[1, 2, 3], 9, 1), 3);
    assert!(estimate_encoded_len(&[], 2, 12288) <= HEADER_LEN);
}
