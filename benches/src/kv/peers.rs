//! The codecs `bench kv` compares on the same blocks, behind one interface:
//! kvfabric's block codec, zstd level 1 and lz4 on the raw bytes, and zstd-1
//! and lz4 on the byte planes (the same shuffle the codec does, each plane
//! compressed on its own), plus the measured entropy bound.

use kvfabric_codec::{shuffle, unshuffle};

/// One way of compressing a block; `decode` must give back the exact bytes.
pub trait Method {
    fn name(&self) -> &'static str;
    fn encode(&self, block: &[u8], width: usize, out: &mut Vec<u8>) -> anyhow::Result<()>;
    fn decode(&self, enc: &[u8], width: usize, out: &mut [u8]) -> anyhow::Result<()>;
}

/// kvfabric's codec (`kvfabric_codec`), one segment per layer's K or V (as
/// the disk tier uses it).
pub struct KvCodec {
    pub segment: u32,
}

impl Method for KvCodec {
    fn name(&self) -> &'static str {
        "kvcodec"
    }
    fn encode(&self, block: &[u8], width: usize, out: &mut Vec<u8>) -> anyhow::Result<()> {
        kvfabric_codec::encode_segmented(block, width, self.segment, out)?;
        Ok(())
    }
    fn decode(&self, enc: &[u8], _width: usize, out: &mut [u8]) -> anyhow::Result<()> {
        kvfabric_codec::decode(enc, out)?;
        Ok(())
    }
}

/// The codec's fast profile (`kvfabric_codec::encode_fast`): f16 high
/// bytes in the window code over rows of `row` channels, decoded by SIMD
/// loops; other widths fall back to the compact profile.
pub struct KvCodecFast {
    pub segment: u32,
    pub row: usize,
}

impl Method for KvCodecFast {
    fn name(&self) -> &'static str {
        "kvcodec_fast"
    }
    fn encode(&self, block: &[u8], width: usize, out: &mut Vec<u8>) -> anyhow::Result<()> {
        let profile = kvfabric_codec::Profile::fast(width, self.row);
        kvfabric_codec::encode_with(block, width, self.segment, profile, out)?;
        Ok(())
    }
    fn decode(&self, enc: &[u8], _width: usize, out: &mut [u8]) -> anyhow::Result<()> {
        kvfabric_codec::decode(enc, out)?;
        Ok(())
    }
}

/// zstd at level 1 on the raw bytes.
pub struct Zstd1;

impl Method for Zstd1 {
    fn name(&self) -> &'static str {
        "zstd1"
    }
    fn encode(&self, block: &[u8], _w: usize, out: &mut Vec<u8>) -> anyhow::Result<()> {
        *out = zstd::bulk::compress(block, 1)?;
        Ok(())
    }
    fn decode(&self, enc: &[u8], _w: usize, out: &mut [u8]) -> anyhow::Result<()> {
        let n = zstd::bulk::decompress_to_buffer(enc, out)?;
        anyhow::ensure!(n == out.len(), "zstd gave {n} bytes");
        Ok(())
    }
}

/// lz4 (block format) on the raw bytes.
pub struct Lz4;

impl Method for Lz4 {
    fn name(&self) -> &'static str {
        "lz4"
    }
    fn encode(&self, block: &[u8], _w: usize, out: &mut Vec<u8>) -> anyhow::Result<()> {
        *out = lz4_flex::block::compress(block);
        Ok(())
    }
    fn decode(&self, enc: &[u8], _w: usize, out: &mut [u8]) -> anyhow::Result<()> {
        let n = lz4_flex::block::decompress_into(enc, out)?;
        anyhow::ensure!(n == out.len(), "lz4 gave {n} bytes");
        Ok(())
    }
}

/// A general-purpose codec run on each byte plane: planes are shuffled out,
/// each compressed with `inner` behind a 4-byte length.
pub struct Planes<M: Method>(pub M, pub &'static str);

impl<M: Method> Method for Planes<M> {
    fn name(&self) -> &'static str {
        self.1
    }
    fn encode(&self, block: &[u8], width: usize, out: &mut Vec<u8>) -> anyhow::Result<()> {
        let mut planes = vec![0u8; block.len()];
        shuffle(block, width, &mut planes)?;
        out.clear();
        let n = block.len() / width;
        let mut part = Vec::new();
        for p in planes.chunks(n) {
            self.0.encode(p, 1, &mut part)?;
            out.extend_from_slice(&(part.len() as u32).to_le_bytes());
            out.extend_from_slice(&part);
        }
        Ok(())
    }
    fn decode(&self, enc: &[u8], width: usize, out: &mut [u8]) -> anyhow::Result<()> {
        let mut planes = vec![0u8; out.len()];
        let n = out.len() / width;
        let mut at = 0;
        for p in planes.chunks_mut(n) {
            let len = enc
                .get(at..at + 4)
                .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize)
                .ok_or_else(|| anyhow::anyhow!("truncated"))?;
            let part = enc
                .get(at + 4..at + 4 + len)
                .ok_or_else(|| anyhow::anyhow!("truncated"))?;
            self.0.decode(part, 1, p)?;
            at += 4 + len;
        }
        unshuffle(&planes, width, out)?;
        Ok(())
    }
}

/// Order-0 entropy (bits per symbol) of byte plane `plane` of `blocks`.
pub fn plane_entropy(blocks: &[Vec<u8>], width: usize, plane: usize) -> f64 {
    let mut counts = [0u64; 256];
    for b in blocks {
        for c in b.chunks_exact(width) {
            counts[c[plane] as usize] += 1;
        }
    }
    entropy(&counts)
}

/// Order-0 entropy (bits per element) of whole 16-bit elements of `blocks`.
pub fn element_entropy_16(blocks: &[Vec<u8>]) -> f64 {
    let mut counts = vec![0u64; 1 << 16];
    for b in blocks {
        for c in b.chunks_exact(2) {
            counts[u16::from_le_bytes([c[0], c[1]]) as usize] += 1;
        }
    }
    entropy(&counts)
}

fn entropy(counts: &[u64]) -> f64 {
    let total: u64 = counts.iter().sum();
    if total == 0 {
        return 0.0;
    }
    counts
        .iter()
        .filter(|&&c| c > 0)
        .map(|&c| {
            let p = c as f64 / total as f64;
            -p * p.log2()
        })
        .sum()
}
