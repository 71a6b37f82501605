//! The byte-plane block format: elements cut into segments, each segment's
//! bytes split into planes (byte p of every element), each plane stored
//! raw, as one repeated byte, or Huffman-coded, whichever is smallest.
//!
//! ```text
//! header (see `header`)
//! per segment, per plane (least significant byte first):
//!     u8  mode: 0 raw, 1 constant, 2 huffman
//!     u32 payload length (little-endian)
//!     payload: the plane's bytes | the one byte | `huffman` table + streams
//! the last (decoded length % width) bytes, raw
//! ```
//!
//! Why planes: in a float the sign/exponent byte carries 3-6 bits of
//! information and the low mantissa bytes nearly 8, so coding planes
//! separately lets the entropy coder work where it pays and copy the rest.
//! Why segments: one table per segment follows the statistics of each part
//! of a block (a KV block is a layer's K then V; their value ranges differ),
//! and bounds the decoder's scratch memory to a segment.

use crate::header::{Header, HEADER_LEN, VERSION, VERSION_FAST};
use crate::window;
use crate::CodecError;
use crate::{huffman, DEFAULT_SEGMENT};

const RAW: u8 = 0;
const CONSTANT: u8 = 1;
const HUFFMAN: u8 = 2;
/// The high plane of 2-byte elements in `window`'s code (format version 2).
const WINDOW: u8 = 3;
const RECORD: usize = 5;

/// How planes are coded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Profile {
    /// Huffman wherever it is smallest (format version 1).
    Compact,
    /// For 2-byte elements: the high plane in the window code with rows
    /// of `row` elements, every other plane raw or constant (version 2).
    Fast { row: usize },
}

impl Profile {
    /// The fast profile where it applies to `width`, else compact.
    pub fn fast(width: usize, row: usize) -> Profile {
        if width == 2 && (1..=window::MAX_ROW).contains(&row) {
            Profile::Fast { row }
        } else {
            Profile::Compact
        }
    }

    /// Elements per segment: `segment`, except that a fast segment holds
    /// whole rows (columns restart at each segment): one that does not
    /// becomes the whole rows nearest [`DEFAULT_SEGMENT`].
    pub fn segment(self, segment: u32) -> u32 {
        match self {
            Profile::Fast { row } if segment == 0 || !(segment as usize).is_multiple_of(row) => {
                (row * (DEFAULT_SEGMENT as usize / row).max(1)) as u32
            }
            _ => segment.max(1),
        }
    }
}

/// Encode `src` (elements of `width` bytes, `segment` elements per
/// segment) into `out` (cleared first).
pub fn encode(
    src: &[u8],
    width: usize,
    segment: u32,
    profile: Profile,
    out: &mut Vec<u8>,
) -> Result<(), CodecError> {
    if !(1..=8).contains(&width) {
        return Err(CodecError::BadWidth { width });
    }
    let segment = profile.segment(segment);
    out.clear();
    out.reserve(src.len() + HEADER_LEN);
    let n = src.len() / width;
    let seg = segment as usize;
    let version = match profile {
        Profile::Compact => VERSION,
        Profile::Fast { .. } => VERSION_FAST,
    };
    let mut header = Header {
        version,
        width,
        decoded_len: src.len() as u64,
        encoded_len: 0,
        segment,
    };
    header.write(out);
    let mut start = 0;
    while start < n {
        let m = seg.min(n - start);
        let elems = &src[start * width..(start + m) * width];
        for p in 0..width {
            match profile {
                Profile::Fast { row } if p == 1 => encode_window(elems, row, out),
                Profile::Fast { .. } => encode_plane(elems, width, p, false, out),
                Profile::Compact => encode_plane(elems, width, p, true, out),
            }
        }
        start += m;
    }
    out.extend_from_slice(&src[n * width..]);
    header.encoded_len = out.len() as u64;
    out[12..20].copy_from_slice(&header.encoded_len.to_le_bytes());
    Ok(())
}

/// The high plane of a fast segment: the window code, or raw where that
/// is no smaller.
fn encode_window(elems: &[u8], row: usize, out: &mut Vec<u8>) {
    let hi: Vec<u8> = elems.chunks_exact(2).map(|c| c[1]).collect();
    let plan = window::plan(&hi, row);
    if plan.len >= hi.len() {
        return encode_plane(elems, 2, 1, false, out);
    }
    let at = out.len();
    out.extend_from_slice(&[WINDOW, 0, 0, 0, 0]);
    window::encode(&hi, row, &plan, out);
    let len = (out.len() - at - RECORD) as u32;
    out[at + 1..at + RECORD].copy_from_slice(&len.to_le_bytes());
}

fn encode_plane(elems: &[u8], width: usize, p: usize, entropy: bool, out: &mut Vec<u8>) {
    let m = elems.len() / width;
    let byte = |i: usize| elems[i * width + p];
    let mut counts = [0u32; 256];
    for c in elems.chunks_exact(width) {
        counts[c[p] as usize] += 1;
    }
    let at = out.len();
    out.extend_from_slice(&[RAW, 0, 0, 0, 0]);
    let constant = m > 0 && counts[byte(0) as usize] as usize == m;
    let lengths = huffman::code_lengths(&counts).filter(|_| entropy);
    match lengths {
        _ if constant => {
            out[at] = CONSTANT;
            out.push(byte(0));
        }
        Some(l) if huffman::cost_bytes(&counts, &l) < m => {
            out[at] = HUFFMAN;
            huffman::encode(&l, m, byte, out);
        }
        _ => out.extend(elems.chunks_exact(width).map(|c| c[p])),
    }
    let len = (out.len() - at - RECORD) as u32;
    out[at + 1..at + RECORD].copy_from_slice(&len.to_le_bytes());
}

/// Where a decoded segment's plane is: raw bytes at an offset of the
/// encoded block, in the scratch buffer, or a window payload (the high
/// plane, decoded straight into the output with the low plane).
#[derive(Clone, Copy)]
enum Source {
    Enc(usize),
    Scratch,
    Window(usize, usize),
}

/// Decode `enc` into `out`, which must be exactly the decoded length.
pub fn decode(enc: &[u8], out: &mut [u8]) -> Result<(), CodecError> {
    let h = Header::parse(enc)?;
    if h.decoded_len != out.len() as u64 {
        return Err(CodecError::WrongLength {
            len: h.decoded_len,
            limit: out.len() as u64,
        });
    }
    let enc = &enc[..h.encoded_len as usize];
    let (width, seg) = (h.width, h.segment as usize);
    let n = out.len() / width;
    let mut scratch = vec![0u8; width * seg.min(n)];
    let mut table = huffman::new_table();
    let mut window = window::Scratch::default();
    let mut at = HEADER_LEN;
    let mut start = 0;
    while start < n {
        let m = seg.min(n - start);
        let (next, sources) = decode_segment(enc, at, &mut scratch, &mut table, m, h)?;
        at = next;
        let mut planes: [&[u8]; 8] = [&[]; 8];
        for (p, src) in sources.iter().take(width).enumerate() {
            planes[p] = match *src {
                Source::Enc(o) => &enc[o..o + m],
                Source::Scratch => &scratch[p * m..(p + 1) * m],
                Source::Window(o, len) => &enc[o..o + len],
            };
        }
        let dst = &mut out[start * width..(start + m) * width];
        if let Source::Window(..) = sources[1] {
            let parsed = window::parse(planes[1], m, &mut window)?;
            let ahead = &enc[next.min(enc.len())..];
            window::decode(&parsed, planes[0], &mut window, dst, ahead)?;
        } else {
            interleave(&planes[..width], dst);
        }
        start += m;
    }
    let tail = enc.get(at..).unwrap_or(&[]);
    if tail.len() != out.len() - n * width {
        return Err(CodecError::Corrupt {
            plane: 0,
            what: "trailing bytes",
        });
    }
    out[n * width..].copy_from_slice(tail);
    Ok(())
}

/// Read one segment's plane records starting at `at`; coded planes are
/// decoded into `scratch` (plane p at `p * m`). Returns the next offset.
fn decode_segment(
    enc: &[u8],
    mut at: usize,
    scratch: &mut [u8],
    table: &mut huffman::Table,
    m: usize,
    h: Header,
) -> Result<(usize, [Source; 8]), CodecError> {
    let width = h.width;
    let window_ok = |p: usize| h.version == VERSION_FAST && width == 2 && p == 1;
    let mut sources = [Source::Scratch; 8];
    for (p, source) in sources.iter_mut().enumerate().take(width) {
        let truncated = CodecError::Truncated {
            what: "plane",
            len: enc.len(),
            need: at + RECORD,
        };
        let rec = enc.get(at..at + RECORD).ok_or(truncated.clone())?;
        let len = u32::from_le_bytes([rec[1], rec[2], rec[3], rec[4]]) as usize;
        let body_at = at + RECORD;
        let body = enc
            .get(body_at..body_at.saturating_add(len))
            .ok_or(truncated)?;
        let dst = &mut scratch[p * m..(p + 1) * m];
        let corrupt = |what| CodecError::Corrupt { plane: p, what };
        match rec[0] {
            RAW if len == m => *source = Source::Enc(body_at),
            CONSTANT if len == 1 => dst.fill(body[0]),
            HUFFMAN => huffman::decode(body, dst, p, table)?,
            WINDOW if window_ok(p) => *source = Source::Window(body_at, len),
            RAW | CONSTANT => return Err(corrupt("plane length")),
            _ => return Err(corrupt("plane mode")),
        }
        at = body_at + len;
    }
    Ok((at, sources))
}

/// Gather element i's bytes from `planes[p][i]` into `out`.
fn interleave(planes: &[&[u8]], out: &mut [u8]) {
    match planes {
        [a, b] => {
            for ((o, &x), &y) in out.chunks_exact_mut(2).zip(*a).zip(*b) {
                o.copy_from_slice(&[x, y]);
            }
        }
        [a, b, c, d] => {
            let src = a.iter().zip(*b).zip(*c).zip(*d);
            for (o, (((&x, &y), &z), &w)) in out.chunks_exact_mut(4).zip(src) {
                o.copy_from_slice(&[x, y, z, w]);
            }
        }
        _ => {
            let w = planes.len();
            for (i, o) in out.chunks_exact_mut(w).enumerate() {
                for (p, b) in o.iter_mut().enumerate() {
                    *b = planes[p][i];
                }
            }
        }
    }
}

/// Split `src` into its byte planes (plane p = byte p of every element,
/// back to back in `dst`; a trailing partial element is copied last).
pub fn shuffle(src: &[u8], width: usize, dst: &mut [u8]) -> Result<(), CodecError> {
    check_width(width, src.len(), dst.len())?;
    let n = src.len() / width;
    for (i, c) in src.chunks_exact(width).enumerate() {
        for (p, &b) in c.iter().enumerate() {
            dst[p * n + i] = b;
        }
    }
    dst[n * width..].copy_from_slice(&src[n * width..]);
    Ok(())
}

/// The inverse of [`shuffle`].
pub fn unshuffle(src: &[u8], width: usize, dst: &mut [u8]) -> Result<(), CodecError> {
    check_width(width, src.len(), dst.len())?;
    let n = src.len() / width;
    if n > 0 {
        let planes: Vec<&[u8]> = src[..n * width].chunks(n).collect();
        interleave(&planes, &mut dst[..n * width]);
    }
    dst[n * width..].copy_from_slice(&src[n * width..]);
    Ok(())
}

fn check_width(width: usize, src: usize, dst: usize) -> Result<(), CodecError> {
    if !(1..=8).contains(&width) {
        return Err(CodecError::BadWidth { width });
    }
    if src != dst {
        return Err(CodecError::WrongLength {
            len: src as u64,
            limit: dst as u64,
        });
    }
    Ok(())
}
