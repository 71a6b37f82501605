//! Deterministic pseudo-random test data, seekable by offset, so two processes
//! can agree on every byte of a gigabyte without shipping it. Used by the
//! multi-process transfer tests and their peer binary, and the store's crash
//! test and its writer binary. The two fixture binaries cannot take a
//! dev-dependency, so they compile this same file in with `#[path]`: one
//! stream, no copy.

/// Word `i` of the stream for `seed` (splitmix64 of the position).
fn word(seed: u64, i: u64) -> u64 {
    let mut z = seed ^ i.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Fill `buf` (which starts at byte `base` of the stream) with the stream for `seed`.
pub fn fill(buf: &mut [u8], seed: u64, base: u64) {
    let head = (((8 - base % 8) % 8) as usize).min(buf.len());
    let byte_at = |pos: u64| word(seed, pos / 8).to_le_bytes()[(pos % 8) as usize];
    for (k, b) in buf[..head].iter_mut().enumerate() {
        *b = byte_at(base + k as u64);
    }
    let first_word = (base + head as u64) / 8;
    let tail_base = base + (buf.len() - (buf.len() - head) % 8) as u64;
    let mut words = buf[head..].chunks_exact_mut(8);
    for (j, chunk) in words.by_ref().enumerate() {
        chunk.copy_from_slice(&word(seed, first_word + j as u64).to_le_bytes());
    }
    let tail = words.into_remainder();
    for (k, b) in tail.iter_mut().enumerate() {
        *b = byte_at(tail_base + k as u64);
    }
}

/// The first `len` bytes of the stream for `seed`.
pub fn bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    fill(&mut v, seed, 0);
    v
}

/// Offset (within `buf`) of the first byte that differs from the stream, if any.
pub fn first_mismatch(buf: &[u8], seed: u64, base: u64) -> Option<usize> {
    let mut expect = vec![0u8; 1 << 16];
    for (c, chunk) in buf.chunks(1 << 16).enumerate() {
        let at = c * (1 << 16);
        let e = &mut expect[..chunk.len()];
        fill(e, seed, base + at as u64);
        if e != chunk {
            let k = e.iter().zip(chunk).position(|(a, b)| a != b).unwrap_or(0);
            return Some(at + k);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seekable_and_detects_a_flipped_byte() {
        let mut whole = vec![0u8; 1000];
        fill(&mut whole, 7, 0);
        let mut part = vec![0u8; 333];
        fill(&mut part, 7, 101);
        assert_eq!(&whole[101..434], &part[..]);
        assert_eq!(first_mismatch(&whole, 7, 0), None);
        whole[500] ^= 1;
        assert_eq!(first_mismatch(&whole, 7, 0), Some(500));
        assert!(first_mismatch(&whole, 8, 0).is_some());
    }
}
