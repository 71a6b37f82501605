//! Compressed disk blocks: which blocks the disk tier stores through
//! `kvfabric-codec`, and how a read turns an extent back into block bytes.
//!
//! A block is stored encoded when that saves at least one disk unit
//! ([`DISK_ALIGN`]) of its extent (so the tier holds more blocks in the same
//! bytes), and raw otherwise. The codec is recorded in the block's index
//! record ([`DiskCodec`]), so blocks written before compression existed (or
//! with it off) read back as they are. The block's checksum covers the
//! decoded bytes: a corrupt encoded extent either fails to decode or decodes
//! to bytes that fail the checksum, and both are a miss.

use std::borrow::Cow;

use kvfabric_codec::Profile;

use crate::extent::DISK_ALIGN;
use crate::keys::{DType, KvLayout};

/// How a block's bytes sit in its disk extent (a byte of the index record).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum DiskCodec {
    /// The block's bytes as they are.
    #[default]
    Raw,
    /// A `kvfabric-codec` byte-plane block (its header says its lengths).
    Planes,
}

impl DiskCodec {
    pub(crate) fn code(self) -> u8 {
        match self {
            DiskCodec::Raw => 0,
            DiskCodec::Planes => kvfabric_codec::CODEC_PLANES,
        }
    }

    pub(crate) fn from_code(c: u8) -> Option<Self> {
        match c {
            0 => Some(DiskCodec::Raw),
            kvfabric_codec::CODEC_PLANES => Some(DiskCodec::Planes),
            _ => None,
        }
    }
}

/// What [`compress`] did with a block.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Compressed {
    /// Encoded; the encoding spares at least one disk unit.
    Encoded(Vec<u8>),
    /// Not encoded: the sampled estimate says it would not spare a unit.
    Skipped,
    /// Encoded, but it spared no unit (or the encoder refused it): raw.
    NoGain,
}

/// `data` (a block of `layout`) encoded, when that spares at least one disk
/// unit. The demotion path pays the encoder (~0.2-0.6 GB/s per core) on
/// every block, so a sampled estimate of the encoded length
/// (`kvfabric_codec::estimate_encoded_len`, a few percent of an encode)
/// runs first and data that cannot spare a unit is not encoded at all.
///
/// f16 blocks take the codec's fast profile (the window code over rows of
/// `kv_heads x head_dim` channels): on the engine's blocks it is as small
/// as the compact profile (1.165 against 1.163, `bench kv`) and decodes
/// several times faster, so a read from disk pays less CPU. bf16 and f32
/// take the compact profile (the window code is shaped for f16's exponent),
/// and so does an f16 block that Huffman codes in fewer disk units.
pub(crate) fn compress(data: &[u8], layout: &KvLayout) -> Compressed {
    let width = layout.dtype.size();
    // One segment (one code table) per layer's K or V.
    let segment = (layout.half_layer_bytes() / width).clamp(1, u32::MAX as usize) as u32;
    let profile = match layout.dtype {
        DType::F16 => Profile::fast(width, (layout.kv_heads * layout.head_dim) as usize),
        _ => Profile::Compact,
    };
    let units = |n: usize| (n as u64).div_ceil(DISK_ALIGN);
    let estimate = kvfabric_codec::estimate_encoded_len(data, width, segment);
    if units(estimate) >= units(data.len()) {
        return Compressed::Skipped;
    }
    let mut enc = Vec::new();
    if let Err(e) = kvfabric_codec::encode_with(data, width, segment, profile, &mut enc) {
        tracing::warn!("block not compressed: {e}");
        return Compressed::NoGain;
    }
    // Data the window code fits worse than Huffman (the compact estimate
    // says a unit less): the compact encoding, when it is smaller.
    if profile != Profile::Compact && units(estimate) < units(enc.len()) {
        let mut compact = Vec::new();
        let done = kvfabric_codec::encode_segmented(data, width, segment, &mut compact);
        if done.is_ok() && compact.len() < enc.len() {
            enc = compact;
        }
    }
    if units(enc.len()) < units(data.len()) {
        Compressed::Encoded(enc)
    } else {
        Compressed::NoGain
    }
}

/// The block's `len` bytes from its extent's bytes `stored`; None when they
/// do not decode (corrupt), which the caller treats as a checksum failure.
pub(crate) fn block_bytes(codec: DiskCodec, stored: &[u8], len: u64) -> Option<Cow<'_, [u8]>> {
    match codec {
        DiskCodec::Raw => stored.get(..len as usize).map(Cow::Borrowed),
        DiskCodec::Planes => match kvfabric_codec::decode_to_vec(stored, len) {
            Ok(v) if v.len() as u64 == len => Some(Cow::Owned(v)),
            Ok(_) => None,
            Err(e) => {
                tracing::warn!("compressed disk block does not decode: {e}");
                None
            }
        },
    }
}
