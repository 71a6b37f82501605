//! A cheap estimate of a block's encoded length, from a sample: lets a
//! caller (the disk tier on its demotion path) skip encoding data that
//! would not shrink, at a small fraction of the encoder's cost.
//!
//! Per segment and plane (the units the encoder codes), [`SAMPLES`] bytes
//! are read at quasi-random positions (a multiplicative walk with a step
//! coprime to the segment length, so a sample never locks onto a channel
//! stride of the block's layout) and their order-0 entropy is estimated
//! with the Miller-Madow correction (the plug-in entropy of a sample
//! underestimates; on uniform bytes 512 samples would read ~7.7 bits
//! without it, ~7.98 with it). The plane's estimated cost is then what the
//! encoder would pay for that entropy: the smaller of raw and Huffman
//! (table included), plus its record.
//!
//! The estimate ignores that Huffman spends a little over the entropy
//! (0.02-0.05 bits per byte on KV planes), so it leans towards "compresses":
//! a wrong guess that way costs one wasted encode (what every block paid
//! before), the other way a block stored raw that could have spared a unit.
//! Measured by `kvfabric bench store` (disk write with and without it).

use crate::huffman;

/// Bytes sampled per segment and plane.
pub const SAMPLES: usize = 512;
const RECORD: usize = 5;

/// Estimated encoded length of `src` (elements of `width` bytes, `segment`
/// elements per segment), header included. Widths outside 1..=8 (which the
/// encoder refuses) estimate as the raw length.
pub fn encoded_len(src: &[u8], width: usize, segment: u32) -> usize {
    if !(1..=8).contains(&width) {
        return src.len();
    }
    let n = src.len() / width;
    let seg = (segment.max(1) as usize).min(n.max(1));
    // n log2 n for every count a sample can reach.
    let nlogn: Vec<f64> = (0..=SAMPLES)
        .map(|c| {
            if c == 0 {
                0.0
            } else {
                c as f64 * (c as f64).log2()
            }
        })
        .collect();
    let mut total = crate::HEADER_LEN + (src.len() - n * width);
    let mut start = 0;
    while start < n {
        let m = seg.min(n - start);
        let elems = &src[start * width..(start + m) * width];
        for p in 0..width {
            total += RECORD + plane_cost(elems, width, p, m, &nlogn);
        }
        start += m;
    }
    total
}

/// Estimated bytes of plane `p` of a segment of `m` elements.
fn plane_cost(elems: &[u8], width: usize, p: usize, m: usize, nlogn: &[f64]) -> usize {
    let k = SAMPLES.min(m);
    let step = coprime_step(m);
    let mut counts = [0u16; 256];
    let mut i = 0usize;
    for _ in 0..k {
        counts[elems[i * width + p] as usize] += 1;
        i += step;
        if i >= m {
            i -= m;
        }
    }
    let mut sum = 0.0;
    let mut distinct = 0usize;
    for &c in &counts {
        if c > 0 {
            sum += nlogn[c as usize];
            distinct += 1;
        }
    }
    if distinct <= 1 {
        // Likely one repeated byte (a constant plane).
        return 1;
    }
    let kf = k as f64;
    let plug_in = kf.log2() - sum / kf;
    let bits = plug_in + (distinct - 1) as f64 / (2.0 * kf * std::f64::consts::LN_2);
    let coded = huffman::LENGTHS_BYTES
        + 4 * huffman::STREAMS
        + (m as f64 * bits.min(8.0) / 8.0).ceil() as usize;
    coded.min(m)
}

/// A step near `m` times the golden ratio's fraction, coprime to `m`, so
/// `i * step mod m` visits every element before repeating.
fn coprime_step(m: usize) -> usize {
    if m <= 2 {
        return 1;
    }
    let mut s = ((m as f64 * 0.618_033_988_75) as usize).max(1);
    while gcd(s, m) != 1 {
        s += 1;
    }
    s
}

fn gcd(mut a: usize, mut b: usize) -> usize {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}
