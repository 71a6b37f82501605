//! KV layouts: the shape of one block's bytes.
//!
//! A block holds, for each layer, K then V of `block_tokens` tokens, each
//! element of the layout's [`DType`] (little-endian f32, IEEE binary16 or
//! bfloat16). The layout, dtype included, is hashed into every block key
//! ([`KvLayout::to_key_bytes`]), so two layouts never alias (an f16 engine
//! never reads an f32 engine's blocks), and the disk index stores it in the
//! same bytes.

use std::ops::Range;

use crate::TypesError;

/// Element type of K and V.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    F32,
    F16,
    BF16,
}

impl DType {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::F16 | DType::BF16 => 2,
        }
    }

    /// The name used in configs and flags: `f32`, `f16`, `bf16`.
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
        }
    }

    fn code(self) -> u8 {
        match self {
            DType::F32 => 1,
            DType::F16 => 2,
            DType::BF16 => 3,
        }
    }
}

/// Byte order inside a block.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BlockOrder {
    /// For each layer: K then V, each `[block_tokens][kv_heads][head_dim]`.
    LayerKvTokenHead,
    /// Another engine's own page format (vLLM's), moved and stored as opaque
    /// bytes: per layer one contiguous page of `layer_bytes`, layers in
    /// order, the inside of a page the engine's business. Keys differ from
    /// the bundled engine's, so the two never name each other's blocks.
    EnginePage,
}

impl BlockOrder {
    fn code(self) -> u8 {
        match self {
            BlockOrder::LayerKvTokenHead => 1,
            BlockOrder::EnginePage => 2,
        }
    }

    fn from_code(code: u8) -> Option<Self> {
        match code {
            1 => Some(BlockOrder::LayerKvTokenHead),
            2 => Some(BlockOrder::EnginePage),
            _ => None,
        }
    }
}

/// Shape of one block's bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct KvLayout {
    pub layers: u32,
    pub kv_heads: u32,
    pub head_dim: u32,
    pub dtype: DType,
    pub block_tokens: u32,
    pub order: BlockOrder,
}

impl KvLayout {
    /// Refuse layouts with a zero dimension or an absurd size.
    pub fn validate(&self) -> Result<(), TypesError> {
        if self.layers == 0 || self.kv_heads == 0 || self.head_dim == 0 || self.block_tokens == 0 {
            return Err(TypesError::InvalidArgument(format!(
                "layout has a zero dimension: {self:?}"
            )));
        }
        let bytes = (self.layers as u128)
            * 2
            * (self.block_tokens as u128)
            * (self.kv_heads as u128)
            * (self.head_dim as u128)
            * self.dtype.size() as u128;
        if bytes > (1u128 << 40) {
            return Err(TypesError::InvalidArgument(format!(
                "layout describes a {bytes}-byte block"
            )));
        }
        Ok(())
    }

    /// Bytes of K (or V) of one layer.
    pub fn half_layer_bytes(&self) -> usize {
        self.block_tokens as usize
            * self.kv_heads as usize
            * self.head_dim as usize
            * self.dtype.size()
    }

    /// Bytes of one layer (K and V).
    pub fn layer_bytes(&self) -> usize {
        2 * self.half_layer_bytes()
    }

    /// Bytes of the whole block.
    pub fn block_bytes(&self) -> usize {
        self.layers as usize * self.layer_bytes()
    }

    /// Byte range of layer `layer` inside the block (contiguous by construction).
    pub fn layer_range(&self, layer: usize) -> Range<usize> {
        let n = self.layer_bytes();
        layer * n..(layer + 1) * n
    }

    /// The canonical bytes hashed into keys.
    pub fn to_key_bytes(&self) -> [u8; 22] {
        let mut b = [0u8; 22];
        b[0..4].copy_from_slice(&self.layers.to_le_bytes());
        b[4..8].copy_from_slice(&self.kv_heads.to_le_bytes());
        b[8..12].copy_from_slice(&self.head_dim.to_le_bytes());
        b[12..16].copy_from_slice(&self.block_tokens.to_le_bytes());
        b[16] = self.dtype.code();
        b[17] = self.order.code();
        // b[18..22]: format version of this encoding.
        b[18..22].copy_from_slice(&1u32.to_le_bytes());
        b
    }
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for DType {
    type Err = TypesError;

    /// Inverse of [`DType::name`].
    fn from_str(s: &str) -> Result<Self, TypesError> {
        [DType::F32, DType::F16, DType::BF16]
            .into_iter()
            .find(|d| d.name() == s)
            .ok_or_else(|| {
                TypesError::InvalidArgument(format!("dtype {s:?} is not f32, f16 or bf16"))
            })
    }
}

impl DType {
    fn from_code(code: u8) -> Option<Self> {
        match code {
            1 => Some(DType::F32),
            2 => Some(DType::F16),
            3 => Some(DType::BF16),
            _ => None,
        }
    }
}

impl KvLayout {
    /// Inverse of [`KvLayout::to_key_bytes`] (the disk index stores layouts this way).
    pub fn from_key_bytes(b: &[u8; 22]) -> Option<Self> {
        let u = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        if u(18) != 1 {
            return None;
        }
        Some(KvLayout {
            layers: u(0),
            kv_heads: u(4),
            head_dim: u(8),
            block_tokens: u(12),
            dtype: DType::from_code(b[16])?,
            order: BlockOrder::from_code(b[17])?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout() -> KvLayout {
        KvLayout {
            layers: 30,
            kv_heads: 3,
            head_dim: 64,
            dtype: DType::F32,
            block_tokens: 4,
            order: BlockOrder::LayerKvTokenHead,
        }
    }

    #[test]
    fn layout_sizes_and_validation() {
        let mut l = layout();
        assert_eq!(l.block_bytes(), 30 * 2 * 4 * 3 * 64 * 4);
        assert_eq!(l.layer_range(1), l.layer_bytes()..2 * l.layer_bytes());
        l.kv_heads = 0;
        assert!(l.validate().is_err());
    }

    #[test]
    fn key_bytes_roundtrip() {
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            let l = KvLayout { dtype, ..layout() };
            assert_eq!(KvLayout::from_key_bytes(&l.to_key_bytes()), Some(l));
            assert_eq!(dtype.name().parse::<DType>(), Ok(dtype));
            let page = KvLayout {
                order: BlockOrder::EnginePage,
                ..l
            };
            assert_eq!(KvLayout::from_key_bytes(&page.to_key_bytes()), Some(page));
            assert_ne!(page.to_key_bytes(), l.to_key_bytes());
        }
        assert!("f8".parse::<DType>().is_err());
    }

    #[test]
    fn f16_blocks_are_half_the_bytes_and_key_apart() {
        let f32l = layout();
        let f16l = KvLayout {
            dtype: DType::F16,
            ..f32l
        };
        assert_eq!(2 * f16l.block_bytes(), f32l.block_bytes());
        assert_ne!(f16l.to_key_bytes(), f32l.to_key_bytes());
    }
}
