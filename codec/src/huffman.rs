//! A static, length-limited, canonical Huffman code over bytes, written as
//! four interleaved bit streams so the decoder runs four independent
//! dependency chains at once (the huff0 layout).
//!
//! Codes are at most [`MAX_LEN`] bits, so one table lookup of that many
//! bits decodes a symbol, and one 64-bit refill feeds five symbols. Bits are
//! written least significant first; canonical codes are bit-reversed to
//! match. The table is sent as 256 4-bit code lengths (128 bytes).

use crate::CodecError;

/// Longest code, bits.
pub const MAX_LEN: u32 = 11;
const TABLE: usize = 1 << MAX_LEN;
/// Bytes of the code-length table.
pub const LENGTHS_BYTES: usize = 128;
/// Interleaved streams.
pub const STREAMS: usize = 4;

/// Code lengths (0 = symbol absent) of an optimal code for `counts`,
/// limited to [`MAX_LEN`] bits; None when fewer than two symbols occur.
pub fn code_lengths(counts: &[u32; 256]) -> Option<[u8; 256]> {
    let mut syms: Vec<(u32, usize)> = (0..256)
        .filter(|&s| counts[s] > 0)
        .map(|s| (counts[s], s))
        .collect();
    if syms.len() < 2 {
        return None;
    }
    // Huffman tree over a sorted list (two-queue method): leaves sorted by
    // count, internal nodes created in non-decreasing order.
    syms.sort_unstable();
    let n = syms.len();
    let mut weight: Vec<u64> = syms.iter().map(|&(c, _)| c as u64).collect();
    let mut parent = vec![0usize; 2 * n - 1];
    let (mut leaf, mut inner) = (0usize, n);
    for node in n..2 * n - 1 {
        let mut pick = || {
            let take_leaf = leaf < n && (inner >= node || weight[leaf] <= weight[inner]);
            let i = if take_leaf { leaf } else { inner };
            if take_leaf {
                leaf += 1;
            } else {
                inner += 1;
            }
            i
        };
        let (a, b) = (pick(), pick());
        weight.push(weight[a] + weight[b]);
        parent[a] = node;
        parent[b] = node;
    }
    // Depths, root last.
    let mut depth = vec![0u32; 2 * n - 1];
    for node in (0..2 * n - 2).rev() {
        depth[node] = depth[parent[node]] + 1;
    }
    let mut count_at = [0u32; 64];
    for &d in &depth[..n] {
        count_at[d as usize] += 1;
    }
    limit_lengths(&mut count_at);
    // Most frequent symbols (the end of `syms`) get the shortest codes.
    let mut lengths = [0u8; 256];
    let mut i = n;
    for (len, &count) in count_at.iter().enumerate().take(MAX_LEN as usize + 1) {
        for _ in 0..count {
            i -= 1;
            lengths[syms[i].1] = len as u8;
        }
    }
    Some(lengths)
}

/// Move codes longer than [`MAX_LEN`] up to it and restore the Kraft
/// equality by lengthening shorter codes (miniz's method).
fn limit_lengths(count_at: &mut [u32; 64]) {
    let max = MAX_LEN as usize;
    for len in max + 1..64 {
        count_at[max] += count_at[len];
        count_at[len] = 0;
    }
    let mut total: u64 = (1..=max).map(|l| (count_at[l] as u64) << (max - l)).sum();
    while total > 1 << max {
        count_at[max] -= 1;
        for len in (1..max).rev() {
            if count_at[len] != 0 {
                count_at[len] -= 1;
                count_at[len + 1] += 2;
                break;
            }
        }
        total -= 1;
    }
}

/// Canonical codes for `lengths`, bit-reversed for LSB-first streams.
fn codes(lengths: &[u8; 256]) -> [u16; 256] {
    let mut count_at = [0u16; 16];
    for &l in lengths {
        count_at[l as usize] += 1;
    }
    count_at[0] = 0;
    let mut next = [0u16; 16];
    let mut code = 0u16;
    for len in 1..16 {
        code = (code + count_at[len - 1]) << 1;
        next[len] = code;
    }
    let mut out = [0u16; 256];
    for s in 0..256 {
        let l = lengths[s] as u32;
        if l > 0 {
            out[s] = next[l as usize].reverse_bits() >> (16 - l);
            next[l as usize] += 1;
        }
    }
    out
}

/// Bits `lengths` spend on a plane with `counts`, table included.
pub fn cost_bytes(counts: &[u32; 256], lengths: &[u8; 256]) -> usize {
    let bits: u64 = (0..256).map(|s| counts[s] as u64 * lengths[s] as u64).sum();
    LENGTHS_BYTES + 4 * (STREAMS - 1) + bits.div_ceil(8) as usize + STREAMS
}

/// Split `n` symbols into the four streams' ranges.
pub fn stream_ranges(n: usize) -> [std::ops::Range<usize>; STREAMS] {
    let q = n.div_ceil(STREAMS);
    std::array::from_fn(|k| (k * q).min(n)..((k + 1) * q).min(n))
}

/// Append the table and the four streams of symbols `sym(i)`, `i < n`.
pub fn encode(lengths: &[u8; 256], n: usize, sym: impl Fn(usize) -> u8, out: &mut Vec<u8>) {
    for pair in lengths.chunks_exact(2) {
        out.push(pair[0] | pair[1] << 4);
    }
    let codes = codes(lengths);
    let sizes_at = out.len();
    out.extend_from_slice(&[0u8; 4 * (STREAMS - 1)]);
    for (k, range) in stream_ranges(n).into_iter().enumerate() {
        let start = out.len();
        let (mut buf, mut bits) = (0u64, 0u32);
        for i in range {
            let s = sym(i) as usize;
            buf |= (codes[s] as u64) << bits;
            bits += lengths[s] as u32;
            if bits >= 32 {
                out.extend_from_slice(&(buf as u32).to_le_bytes());
                buf >>= 32;
                bits -= 32;
            }
        }
        out.extend_from_slice(&buf.to_le_bytes()[..bits.div_ceil(8) as usize]);
        if k < STREAMS - 1 {
            let size = (out.len() - start) as u32;
            out[sizes_at + 4 * k..sizes_at + 4 * k + 4].copy_from_slice(&size.to_le_bytes());
        }
    }
}

/// One stream being read: `pos` is the next byte to load into `buf`.
struct Reader<'a> {
    data: &'a [u8],
    pos: usize,
    buf: u64,
    bits: u32,
}

impl<'a> Reader<'a> {
    fn new(data: &'a [u8]) -> Self {
        let mut r = Reader {
            data,
            pos: 0,
            buf: 0,
            bits: 0,
        };
        r.refill();
        r
    }

    /// Top the buffer up to at least 56 bits (zeros past the stream's end).
    #[inline(always)]
    fn refill(&mut self) {
        let word = match self.data.get(self.pos..self.pos + 8) {
            Some(b) => u64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]),
            None => {
                let mut w = [0u8; 8];
                let tail = self.data.get(self.pos..).unwrap_or(&[]);
                w[..tail.len()].copy_from_slice(tail);
                u64::from_le_bytes(w)
            }
        };
        self.buf |= word << self.bits;
        self.pos += (63 - self.bits as usize) >> 3;
        self.bits |= 56;
    }

    #[inline(always)]
    fn symbol(&mut self, table: &[u16; TABLE]) -> u8 {
        let e = table[(self.buf as usize) & (TABLE - 1)];
        let len = (e >> 8) as u32;
        self.buf >>= len;
        self.bits = self.bits.wrapping_sub(len);
        e as u8
    }

    /// Bits consumed past the stream's end (corrupt input).
    fn overran(&self) -> bool {
        (self.pos as u64) * 8 > self.data.len() as u64 * 8 + self.bits as u64
    }
}

/// A decoding table: entry = symbol | length << 8, for every `MAX_LEN`-bit
/// window; Err when the lengths are not a complete prefix code.
/// A decoding table, reused from segment to segment.
pub type Table = [u16; TABLE];

/// A zeroed table on the heap.
pub fn new_table() -> Box<Table> {
    Box::new([0u16; TABLE])
}

fn fill_table(lengths: &[u8; 256], plane: usize, t: &mut Table) -> Result<(), CodecError> {
    let bad = CodecError::Corrupt {
        plane,
        what: "code lengths",
    };
    if lengths.iter().any(|&l| l as u32 > MAX_LEN) {
        return Err(bad);
    }
    let kraft: u64 = lengths
        .iter()
        .filter(|&&l| l > 0)
        .map(|&l| 1u64 << (MAX_LEN - l as u32))
        .sum();
    if kraft != TABLE as u64 {
        return Err(bad);
    }
    let codes = codes(lengths);
    for s in 0..256 {
        let l = lengths[s] as usize;
        if l == 0 {
            continue;
        }
        let entry = s as u16 | (l as u16) << 8;
        let mut i = codes[s] as usize;
        while i < TABLE {
            t[i] = entry;
            i += 1 << l;
        }
    }
    Ok(())
}

/// Decode a plane written by [`encode`] (exactly `enc`) into `out` (its
/// length is the symbol count).
pub fn decode(
    enc: &[u8],
    out: &mut [u8],
    plane: usize,
    table: &mut Table,
) -> Result<(), CodecError> {
    let corrupt = |what| CodecError::Corrupt { plane, what };
    let head = LENGTHS_BYTES + 4 * (STREAMS - 1);
    let h = enc.get(..head).ok_or(corrupt("huffman header"))?;
    let mut lengths = [0u8; 256];
    for (i, &b) in h[..LENGTHS_BYTES].iter().enumerate() {
        lengths[2 * i] = b & 15;
        lengths[2 * i + 1] = b >> 4;
    }
    fill_table(&lengths, plane, table)?;
    let mut at = head;
    let mut streams: [&[u8]; STREAMS] = [&[]; STREAMS];
    for (k, s) in streams.iter_mut().enumerate() {
        let size = if k < STREAMS - 1 {
            let b = &h[LENGTHS_BYTES + 4 * k..LENGTHS_BYTES + 4 * k + 4];
            u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize
        } else {
            enc.len().saturating_sub(at)
        };
        *s = enc
            .get(at..at.saturating_add(size))
            .ok_or(corrupt("stream sizes"))?;
        at += size;
    }
    if decode_streams(table, streams, out) {
        return Err(corrupt("huffman stream (read past its end)"));
    }
    Ok(())
}

/// Decode; true when a stream was read past its end.
fn decode_streams(table: &[u16; TABLE], streams: [&[u8]; STREAMS], out: &mut [u8]) -> bool {
    let ranges = stream_ranges(out.len());
    // Four separate locals (not an array) so each reader's state stays in
    // registers: through an array the decode chains went through memory.
    let [mut r0, mut r1, mut r2, mut r3] = streams.map(Reader::new);
    let common = ranges[STREAMS - 1].len();
    let q = ranges[0].len();
    let (o0, rest) = out.split_at_mut(q.min(out.len()));
    let (o1, rest) = rest.split_at_mut(q.min(rest.len()));
    let (o2, o3) = rest.split_at_mut(q.min(rest.len()));
    // Five symbols per stream per refill (5 x 11 <= 56 bits).
    let fast = common / 5 * 5;
    let quads = o0[..fast]
        .chunks_exact_mut(5)
        .zip(o1[..fast].chunks_exact_mut(5))
        .zip(o2[..fast].chunks_exact_mut(5))
        .zip(o3[..fast].chunks_exact_mut(5));
    for (((a, b), c), d) in quads {
        r0.refill();
        r1.refill();
        r2.refill();
        r3.refill();
        for i in 0..5 {
            a[i] = r0.symbol(table);
            b[i] = r1.symbol(table);
            c[i] = r2.symbol(table);
            d[i] = r3.symbol(table);
        }
    }
    let mut r = [r0, r1, r2, r3];
    for (k, o) in [o0, o1, o2, o3].into_iter().enumerate() {
        for b in o.iter_mut().skip(fast) {
            r[k].refill();
            *b = r[k].symbol(table);
        }
    }
    r.iter().any(Reader::overran)
}
