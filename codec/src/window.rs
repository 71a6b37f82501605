//! The window code: the high byte of 16-bit floats (f16's sign, 5-bit
//! exponent and top 2 mantissa bits) in fixed-width fields a SIMD loop
//! unpacks at memory speed, for the fast profile ([`crate::encode_fast`]).
//!
//! Why: a KV block is `[tokens][channels]` per layer, and a channel's
//! exponent sits in a narrow band (its scale), mostly one to three steps
//! below the band's top. The Huffman planes code that band at the entropy
//! bound, but their decoder is a byte-at-a-time table walk (~0.09x memcpy).
//! Here each channel (column `i % row` of a segment) gets a 5-bit base `b`,
//! and each element's exponent `e` is a prefix code relative to it:
//!
//! ```text
//! b-2 <= e <= b       2 bits  (code b - e in the element's field)
//! b-5 <= e <= b-3     2 + 2   (field code 3; b - 3 - e in the L2 stream)
//! anything else       2 + 2 + 5 (field and L2 code 3; e in the L3 stream)
//! ```
//!
//! Sign and the 2 mantissa bits ride raw beside the code: each element has
//! a 5-bit field `sign << 4 | code << 2 | mantissa`. On the engine's f16
//! blocks this gives 1.165 (docs/BENCHMARKS.md, "the codec's fast profile") against the Huffman
//! planes' 1.163, with every field a fixed width.
//!
//! Payload of a window plane (all packed streams little-endian bit order;
//! 5-bit values 8 to 5 bytes, 2-bit values 4 to a byte):
//!
//! ```text
//! u16 row          channels per row (column of element i: i % row)
//! u32 n1           elements whose field code is 3 (L2 values)
//! u32 n2           L2 values that are 3 (L3 values)
//! bases            row 5-bit values
//! fields           m 5-bit values
//! l2               n1 2-bit values
//! l3               n2 5-bit values
//! ```
//!
//! The decoders (scalar here, AVX2 and AVX-512 in `window/x86`) agree
//! bit for bit; a payload whose counts or lengths do not add up is
//! [`CodecError::Corrupt`], and a lying stream value can only make wrong
//! bytes (the block's checksum refuses them), never an out-of-bounds read.

use crate::CodecError;

#[cfg(target_arch = "x86_64")]
mod x86;

/// Bytes before the packed streams.
const FIXED: usize = 2 + 4 + 4;
/// Largest row the format holds.
pub const MAX_ROW: usize = u16::MAX as usize;

/// Bytes of `n` packed 5-bit values.
pub fn packed5_len(n: usize) -> usize {
    n.div_ceil(8) * 5
}

/// Bytes of `n` packed 2-bit values.
pub fn packed2_len(n: usize) -> usize {
    n.div_ceil(4)
}

/// Append `vals` (each < 32) packed 8 to 5 bytes.
fn pack5(vals: &[u8], out: &mut Vec<u8>) {
    for c in vals.chunks(8) {
        let mut w = 0u64;
        for (j, &v) in c.iter().enumerate() {
            w |= ((v & 31) as u64) << (5 * j);
        }
        out.extend_from_slice(&w.to_le_bytes()[..5]);
    }
}

/// Append `vals` (each < 4) packed 4 to a byte.
fn pack2(vals: &[u8], out: &mut Vec<u8>) {
    for c in vals.chunks(4) {
        let b = c
            .iter()
            .enumerate()
            .fold(0u8, |b, (j, &v)| b | ((v & 3) << (2 * j)));
        out.push(b);
    }
}

/// The (up to) 5 bytes of `c` as a little-endian integer; a fixed-size
/// load for whole groups (a variable copy would be a call to memcpy).
#[inline(always)]
pub(crate) fn load40(c: &[u8]) -> u64 {
    match *c {
        [a, b, c, d, e, ..] => u64::from_le_bytes([a, b, c, d, e, 0, 0, 0]),
        _ => c.iter().rev().fold(0, |w, &b| w << 8 | b as u64),
    }
}

/// Unpack `dst.len()` 5-bit values from `src` (at least `packed5_len`).
fn unpack5(src: &[u8], dst: &mut [u8]) {
    for (o, c) in dst.chunks_mut(8).zip(src.chunks(5)) {
        let w = load40(c);
        for (j, v) in o.iter_mut().enumerate() {
            *v = ((w >> (5 * j)) & 31) as u8;
        }
    }
}

/// The encoder's plan for a segment's high bytes: each column's base and
/// the bytes the window payload takes.
pub struct Plan {
    bases: Vec<u8>,
    pub len: usize,
}

/// The base of each column that makes its exponents cheapest, and the
/// payload's length.
pub fn plan(hi: &[u8], row: usize) -> Plan {
    let mut hist = vec![[0u32; 32]; row];
    for r in hi.chunks(row) {
        for (h, &x) in hist.iter_mut().zip(r) {
            h[((x >> 2) & 31) as usize] += 1;
        }
    }
    let (mut n1, mut n2) = (0u64, 0u64);
    let bases = hist
        .iter()
        .map(|h| {
            // below[e]: how many exponents are < e.
            let mut below = [0u64; 33];
            for e in 0..32 {
                below[e + 1] = below[e] + h[e] as u64;
            }
            let within = |lo: usize, hi: usize| below[hi + 1] - below[lo];
            let total = below[32];
            // (extra bits, L2 count, L3 count) of base b.
            let cost = |b: usize| {
                let l1 = within(b.saturating_sub(2), b);
                let l2 = if b >= 3 {
                    within(b.saturating_sub(5), b - 3)
                } else {
                    0
                };
                let (e1, e2) = (total - l1, total - l1 - l2);
                (2 * e1 + 5 * e2, e1, e2)
            };
            let b = (0..32).min_by_key(|&b| (cost(b).0, b)).unwrap_or(0);
            let (_, e1, e2) = cost(b);
            n1 += e1;
            n2 += e2;
            b as u8
        })
        .collect();
    let len = FIXED
        + packed5_len(row)
        + packed5_len(hi.len())
        + packed2_len(n1 as usize)
        + packed5_len(n2 as usize);
    Plan { bases, len }
}

/// Append the window payload of `hi` (a segment's high bytes; column of
/// element i is `i % row`, `1 <= row <= MAX_ROW`) under `plan`.
pub fn encode(hi: &[u8], row: usize, plan: &Plan, out: &mut Vec<u8>) {
    let bases = &plan.bases;
    let mut fields = Vec::with_capacity(hi.len());
    let (mut l2, mut l3) = (Vec::new(), Vec::new());
    for (&h, &b) in hi.iter().zip(bases.iter().cycle()) {
        let e = (h >> 2) & 31;
        let d = b.wrapping_sub(e);
        let code = if d <= 2 { d } else { 3 };
        fields.push((h >> 7) << 4 | code << 2 | (h & 3));
        if code == 3 {
            let d2 = d.wrapping_sub(3);
            l2.push(if d2 <= 2 { d2 } else { 3 });
            if d2 > 2 {
                l3.push(e);
            }
        }
    }
    out.extend_from_slice(&(row as u16).to_le_bytes());
    out.extend_from_slice(&(l2.len() as u32).to_le_bytes());
    out.extend_from_slice(&(l3.len() as u32).to_le_bytes());
    pack5(bases, out);
    pack5(&fields, out);
    pack2(&l2, out);
    pack5(&l3, out);
}

/// A parsed window payload, its escape streams unpacked into `Scratch`.
pub struct Parsed<'a> {
    pub row: usize,
    /// Packed fields, `packed5_len(m)` bytes.
    pub fields: &'a [u8],
    pub n1: usize,
    pub n2: usize,
}

/// Buffers a decoder reuses across segments.
#[derive(Default)]
pub struct Scratch {
    /// Each column's base, times 4 (the exponent's place in the byte).
    pub bases4: Vec<u8>,
    /// The same, less 12 (3 steps: where the L2 window starts).
    pub bases4m12: Vec<u8>,
    /// L2 values times 4, then [`PAD`] zeros (SIMD loads read past n1).
    pub l2: Vec<u8>,
    /// L3 exponents times 4, then [`PAD`] zeros.
    pub l3: Vec<u8>,
    /// Unpacked fields (the scalar decoder's).
    pub fields: Vec<u8>,
}

/// Zero bytes after each escape stream, so a vector load at any index up
/// to the count stays inside the buffer.
pub const PAD: usize = 64;

/// Parse `body` (a window plane of `m` elements) and unpack its bases and
/// escape streams into `s`.
pub fn parse<'a>(body: &'a [u8], m: usize, s: &mut Scratch) -> Result<Parsed<'a>, CodecError> {
    let corrupt = |what| CodecError::Corrupt { plane: 1, what };
    let head = body.get(..FIXED).ok_or(corrupt("window header"))?;
    let row = u16::from_le_bytes([head[0], head[1]]) as usize;
    let u32_at = |i: usize| u32::from_le_bytes([head[i], head[i + 1], head[i + 2], head[i + 3]]);
    let (n1, n2) = (u32_at(2) as usize, u32_at(6) as usize);
    if row == 0 || n1 > m || n2 > n1 {
        return Err(corrupt("window counts"));
    }
    let lens = [
        packed5_len(row),
        packed5_len(m),
        packed2_len(n1),
        packed5_len(n2),
    ];
    if FIXED + lens.iter().sum::<usize>() != body.len() {
        return Err(corrupt("window length"));
    }
    let (bases, rest) = body[FIXED..].split_at(lens[0]);
    let (fields, rest) = rest.split_at(lens[1]);
    let (l2, l3) = rest.split_at(lens[2]);
    unpack_times4(bases, row, &mut s.bases4, 5);
    s.bases4.truncate(row);
    s.bases4m12.clear();
    s.bases4m12
        .extend(s.bases4.iter().map(|b| b.wrapping_sub(12)));
    unpack_times4(l2, n1, &mut s.l2, 2);
    unpack_times4(l3, n2, &mut s.l3, 5);
    Ok(Parsed {
        row,
        fields,
        n1,
        n2,
    })
}

/// Unpack `n` `bits`-bit values (2 or 5) times 4 into `dst`, then [`PAD`]
/// zeros.
fn unpack_times4(src: &[u8], n: usize, dst: &mut Vec<u8>, bits: usize) {
    dst.clear();
    // Whole groups (8 values): the unpackers write them; the pad is past.
    dst.resize(n.div_ceil(8) * 8 + PAD, 0);
    #[cfg(target_arch = "x86_64")]
    let done = x86::unpack_times4(bits, src, n, dst);
    #[cfg(not(target_arch = "x86_64"))]
    let done = 0;
    let (src, out) = (&src[done * bits / 8..], &mut dst[done..n.div_ceil(8) * 8]);
    if bits == 2 {
        unpack2_times4(src, out);
    } else {
        unpack5_times4(src, out);
    }
    dst[n..].fill(0);
}

/// Four 2-bit values of each byte, times 4, as a little-endian u32.
const TIMES4: [u32; 256] = {
    let mut t = [0u32; 256];
    let mut b = 0;
    while b < 256 {
        let mut j = 0;
        while j < 4 {
            t[b] |= (((b >> (2 * j)) & 3) as u32 * 4) << (8 * j);
            j += 1;
        }
        b += 1;
    }
    t
};

/// 2-bit values packed 4 to a byte, each times 4, a table lookup per 4 values; `dst`
/// holds whole groups of 4 (values past the packed ones are garbage).
fn unpack2_times4(src: &[u8], dst: &mut [u8]) {
    for (o, &b) in dst.chunks_exact_mut(4).zip(src) {
        o.copy_from_slice(&TIMES4[b as usize].to_le_bytes());
    }
}

/// [`unpack5`], each value times 4, 8 values per 5 bytes; `dst` holds
/// whole groups of 8.
fn unpack5_times4(src: &[u8], dst: &mut [u8]) {
    for (o, c) in dst.chunks_exact_mut(8).zip(src.chunks(5)) {
        let w = load40(c);
        let mut v = 0u64;
        for j in 0..8 {
            v |= ((w >> (5 * j)) & 31) << (8 * j + 2);
        }
        o.copy_from_slice(&v.to_le_bytes());
    }
}

/// One element's high byte from its field and what its escapes name;
/// advances the escape cursors (checked by the caller against n1, n2).
#[inline(always)]
fn high_byte(f: u8, base4: u8, s: &Scratch, k1: &mut usize, k2: &mut usize) -> u8 {
    let mut e4 = base4.wrapping_sub(f & 0x0c);
    if f & 0x0c == 0x0c {
        let v2 = s.l2[*k1];
        *k1 += 1;
        e4 = base4.wrapping_sub(12).wrapping_sub(v2);
        if v2 == 12 {
            e4 = s.l3[*k2];
            *k2 += 1;
        }
    }
    (f & 0x10) << 3 | (e4 & 0x7c) | (f & 3)
}

/// Decode a window plane into `out` (`m` elements of 2 bytes), taking the
/// low bytes from `lo` (columns restart at every segment). `ahead` is what
/// the caller reads next (the next segment's bytes): the vector loops
/// prefetch it, so its misses overlap this segment's work.
pub fn decode(
    p: &Parsed,
    lo: &[u8],
    s: &mut Scratch,
    out: &mut [u8],
    ahead: &[u8],
) -> Result<(), CodecError> {
    let m = lo.len();
    debug_assert_eq!(out.len(), 2 * m);
    #[cfg(target_arch = "x86_64")]
    let (done, k1, k2) = x86::decode(p, lo, s, out, ahead);
    #[cfg(not(target_arch = "x86_64"))]
    let (done, k1, k2) = {
        let _ = ahead;
        (0, 0, 0)
    };
    decode_tail(p, lo, s, out, done, (k1, k2))
}

/// The scalar decoder from element `from` on, with escape cursors `k`.
fn decode_tail(
    p: &Parsed,
    lo: &[u8],
    s: &mut Scratch,
    out: &mut [u8],
    from: usize,
    (mut k1, mut k2): (usize, usize),
) -> Result<(), CodecError> {
    let m = lo.len();
    let corrupt = |what| CodecError::Corrupt { plane: 1, what };
    if k1 > p.n1 || k2 > p.n2 {
        return Err(corrupt("window escapes"));
    }
    if from == m {
        // The vector loops did it all: their cursors must be at the ends.
        return match (k1 == p.n1, k2 == p.n2) {
            (true, true) => Ok(()),
            _ => Err(corrupt("window escapes")),
        };
    }
    let mut fields = std::mem::take(&mut s.fields);
    fields.resize(m.div_ceil(8) * 8, 0);
    let start = from / 8 * 8;
    unpack5(&p.fields[start / 8 * 5..], &mut fields[start..]);
    let row = p.row;
    for i in from..m {
        // A stream that runs out stops here, before any index passes it.
        if k1 > p.n1 || k2 > p.n2 {
            break;
        }
        let b4 = s.bases4[i % row];
        let h = high_byte(fields[i], b4, s, &mut k1, &mut k2);
        out[2 * i] = lo[i];
        out[2 * i + 1] = h;
    }
    s.fields = fields;
    if k1 != p.n1 || k2 != p.n2 {
        return Err(corrupt("window escapes"));
    }
    Ok(())
}

#[cfg(test)]
mod tests;
