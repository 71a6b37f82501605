//! The one block/payload checksum of kvfabric: XXH3-64 (seed 0).
//!
//! Transfer payloads, stored blocks (RAM, disk, remote reads) and the
//! connector's per-layer trailers all use it, so it lives in the lowest crate
//! and everyone calls these two functions. It is computed on every put and
//! verified on every read, so its speed is part of every data path: the
//! implementation (twox-hash) picks AVX2 or SSE2 at runtime, about twice as
//! fast here as a build that can only assume SSE2 at compile time. The value
//! is the XXH3 specification's, so any XXH3-64 implementation reads what an
//! older build wrote.

use std::hash::Hasher;

/// XXH3-64 of `bytes`.
pub fn checksum(bytes: &[u8]) -> u64 {
    twox_hash::XxHash3_64::oneshot(bytes)
}

/// The same checksum computed over pieces given in order.
#[derive(Default, Clone)]
pub struct Checksummer(twox_hash::XxHash3_64);

impl Checksummer {
    pub fn new() -> Self {
        Self::default()
    }

    /// Feed the next piece.
    pub fn update(&mut self, bytes: &[u8]) {
        self.0.write(bytes);
    }

    /// The checksum of everything fed so far.
    pub fn digest(&self) -> u64 {
        self.0.finish()
    }
}

impl std::fmt::Debug for Checksummer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Checksummer")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_values_and_pieces_agree() {
        // XXH3-64 of the empty input and of "abc", seed 0 (reference values).
        assert_eq!(checksum(b""), 0x2D06_8005_38D3_94C2);
        assert_eq!(checksum(b"abc"), 0x78AF_5F94_892F_3950);
        let data: Vec<u8> = (0..3_000_000u32).map(|i| (i * 7 % 253) as u8).collect();
        let mut h = Checksummer::new();
        for piece in data.chunks(65_537) {
            h.update(piece);
        }
        assert_eq!(h.digest(), checksum(&data));
    }
}
