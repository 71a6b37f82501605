//! Block keys: the deterministic names of KV blocks.
//!
//! `key_i = blake3(namespace_len u32 LE || namespace || model_fingerprint ||
//! layout bytes || key_{i-1} || tokens_i as u32 LE)`, with `key_{-1}` = 32 zero
//! bytes. Nothing here depends on the process, the machine or the build: no
//! std hasher, no seed. The namespace is the tenant's cache salt (two tenants
//! never share a block); the model fingerprint hashes the weights and the
//! architecture; the layout is part of the key so two layouts never alias.
//! This is the one key library: the engine, the connector and external
//! clients all call [`KeyChain`].

use std::fmt;
use std::ops::Range;

use crate::StoreError;

/// Length of a block key in bytes.
pub const KEY_LEN: usize = 32;

/// The 256-bit name of one block of one token prefix.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockKey(pub [u8; KEY_LEN]);

impl BlockKey {
    /// Parse a key received from a client; anything but 32 bytes is refused.
    pub fn from_slice(bytes: &[u8]) -> Result<Self, StoreError> {
        let arr: [u8; KEY_LEN] = bytes.try_into().map_err(|_| {
            StoreError::InvalidArgument(format!(
                "block key must be {KEY_LEN} bytes, got {}",
                bytes.len()
            ))
        })?;
        Ok(BlockKey(arr))
    }

    /// The raw bytes.
    pub fn as_bytes(&self) -> &[u8; KEY_LEN] {
        &self.0
    }

    /// Lower-case hex.
    pub fn to_hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }
}

impl fmt::Debug for BlockKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "BlockKey({})", &self.to_hex()[..16])
    }
}

impl fmt::Display for BlockKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

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
    pub fn validate(&self) -> Result<(), StoreError> {
        if self.layers == 0 || self.kv_heads == 0 || self.head_dim == 0 || self.block_tokens == 0 {
            return Err(StoreError::InvalidArgument(format!(
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
            return Err(StoreError::InvalidArgument(format!(
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
        b[17] = match self.order {
            BlockOrder::LayerKvTokenHead => 1,
        };
        // b[18..22]: format version of this encoding.
        b[18..22].copy_from_slice(&1u32.to_le_bytes());
        b
    }
}

/// What identifies a model's KV: its weights and its architecture.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct ModelFingerprint(pub [u8; 32]);

impl ModelFingerprint {
    /// Fingerprint from the weights' content hash and an architecture description.
    pub fn new(weights_blake3: &[u8; 32], architecture: &str) -> Self {
        let mut h = blake3::Hasher::new();
        h.update(b"kvfabric-model-v1");
        h.update(weights_blake3);
        h.update(&(architecture.len() as u32).to_le_bytes());
        h.update(architecture.as_bytes());
        ModelFingerprint(*h.finalize().as_bytes())
    }
}

/// Turns token sequences into block keys for one tenant, model and layout.
#[derive(Clone, Debug)]
pub struct KeyChain {
    prefix: blake3::Hasher,
    block_tokens: usize,
}

impl KeyChain {
    /// A chain for `namespace` (tenant salt, may be empty), `model`, `layout`.
    pub fn new(namespace: &[u8], model: &ModelFingerprint, layout: &KvLayout) -> Self {
        let mut prefix = blake3::Hasher::new();
        prefix.update(&(namespace.len() as u32).to_le_bytes());
        prefix.update(namespace);
        prefix.update(&model.0);
        prefix.update(&layout.to_key_bytes());
        KeyChain {
            prefix,
            block_tokens: layout.block_tokens as usize,
        }
    }

    /// Tokens per block.
    pub fn block_tokens(&self) -> usize {
        self.block_tokens
    }

    /// Key of the block holding `tokens` after the block keyed `parent` (None for the first).
    pub fn next(&self, parent: Option<&BlockKey>, tokens: &[u32]) -> BlockKey {
        let mut h = self.prefix.clone();
        h.update(parent.map_or(&[0u8; KEY_LEN], |p| &p.0));
        for t in tokens {
            h.update(&t.to_le_bytes());
        }
        BlockKey(*h.finalize().as_bytes())
    }

    /// Keys of every full block of `tokens`, in prefix order (a partial tail block has no key).
    pub fn keys(&self, tokens: &[u32]) -> Vec<BlockKey> {
        let mut out = Vec::with_capacity(tokens.len() / self.block_tokens);
        let mut parent = None;
        for chunk in tokens.chunks_exact(self.block_tokens) {
            let k = self.next(parent.as_ref(), chunk);
            out.push(k);
            parent = Some(k);
        }
        out
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
        if b[17] != 1 || u(18) != 1 {
            return None;
        }
        Some(KvLayout {
            layers: u(0),
            kv_heads: u(4),
            head_dim: u(8),
            block_tokens: u(12),
            dtype: DType::from_code(b[16])?,
            order: BlockOrder::LayerKvTokenHead,
        })
    }
}

impl TryFrom<&kvfabric_proto::v1::KvLayout> for KvLayout {
    type Error = StoreError;

    /// A layout from the wire: unknown dtype or order, or a zero dimension, is refused.
    fn try_from(p: &kvfabric_proto::v1::KvLayout) -> Result<Self, StoreError> {
        use kvfabric_proto::v1 as pb;
        let dtype = match pb::DType::try_from(p.dtype) {
            Ok(pb::DType::DtypeF32) => DType::F32,
            Ok(pb::DType::DtypeF16) => DType::F16,
            Ok(pb::DType::DtypeBf16) => DType::BF16,
            _ => {
                return Err(StoreError::InvalidArgument(format!(
                    "unknown layout dtype {}",
                    p.dtype
                )))
            }
        };
        let order = match pb::BlockOrder::try_from(p.order) {
            Ok(pb::BlockOrder::LayerKvTokenHead) => BlockOrder::LayerKvTokenHead,
            _ => {
                return Err(StoreError::InvalidArgument(format!(
                    "unknown layout block order {}",
                    p.order
                )))
            }
        };
        let l = KvLayout {
            layers: p.layers,
            kv_heads: p.kv_heads,
            head_dim: p.head_dim,
            dtype,
            block_tokens: p.block_tokens,
            order,
        };
        l.validate()?;
        Ok(l)
    }
}

impl From<&KvLayout> for kvfabric_proto::v1::KvLayout {
    fn from(l: &KvLayout) -> Self {
        use kvfabric_proto::v1 as pb;
        let dtype = match l.dtype {
            DType::F32 => pb::DType::DtypeF32,
            DType::F16 => pb::DType::DtypeF16,
            DType::BF16 => pb::DType::DtypeBf16,
        };
        pb::KvLayout {
            layers: l.layers,
            kv_heads: l.kv_heads,
            head_dim: l.head_dim,
            dtype: dtype as i32,
            block_tokens: l.block_tokens,
            order: pb::BlockOrder::LayerKvTokenHead as i32,
        }
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
    fn golden_vector() {
        // Checked in: if this changes, every stored block on every node changes name.
        let fp = ModelFingerprint::new(&[7u8; 32], "llama");
        let chain = KeyChain::new(b"tenant-a", &fp, &layout());
        let keys = chain.keys(&[1, 2, 3, 4, 5, 6, 7, 8, 9]);
        assert_eq!(keys.len(), 2);
        assert_eq!(keys[0].to_hex(), GOLDEN[0]);
        assert_eq!(keys[1].to_hex(), GOLDEN[1]);
    }

    // Computed independently with Python's `blake3` package from the spec in the module doc.
    const GOLDEN: [&str; 2] = [
        "9bdee523b3b7ef4218806b4749434e6ea8fa729dd1f458b7812e7bb047e34e00",
        "18ddd67be1154ac0227b5caa7abe44d163bcf7a7d9a8553f509b8429db9666c9",
    ];

    #[test]
    fn chain_depends_on_everything() {
        let fp = ModelFingerprint::new(&[7u8; 32], "llama");
        let base = KeyChain::new(b"t", &fp, &layout()).keys(&[1, 2, 3, 4, 5, 6, 7, 8]);
        let other_ns = KeyChain::new(b"u", &fp, &layout()).keys(&[1, 2, 3, 4, 5, 6, 7, 8]);
        let other_fp = KeyChain::new(b"t", &ModelFingerprint::new(&[8u8; 32], "llama"), &layout())
            .keys(&[1, 2, 3, 4, 5, 6, 7, 8]);
        let mut l2 = layout();
        l2.dtype = DType::F16;
        let other_layout = KeyChain::new(b"t", &fp, &l2).keys(&[1, 2, 3, 4, 5, 6, 7, 8]);
        let other_first = KeyChain::new(b"t", &fp, &layout()).keys(&[0, 2, 3, 4, 5, 6, 7, 8]);
        for o in [&other_ns, &other_fp, &other_layout] {
            assert_ne!(base[0], o[0]);
        }
        // Same second block tokens, different first block: the parent chains it.
        assert_ne!(base[1], other_first[1]);
        // Prefix property: extending the sequence keeps earlier keys.
        let longer =
            KeyChain::new(b"t", &fp, &layout()).keys(&[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]);
        assert_eq!(&longer[..2], &base[..]);
    }

    #[test]
    fn key_parsing_and_layout_validation() {
        assert!(BlockKey::from_slice(&[0u8; 31]).is_err());
        assert!(BlockKey::from_slice(&[0u8; 32]).is_ok());
        let mut l = layout();
        assert_eq!(l.block_bytes(), 30 * 2 * 4 * 3 * 64 * 4);
        assert_eq!(l.layer_range(1), l.layer_bytes()..2 * l.layer_bytes());
        l.kv_heads = 0;
        assert!(l.validate().is_err());
    }

    #[test]
    fn layout_bytes_and_proto_roundtrip() {
        let l = layout();
        assert_eq!(KvLayout::from_key_bytes(&l.to_key_bytes()), Some(l));
        let p = kvfabric_proto::v1::KvLayout::from(&l);
        assert_eq!(KvLayout::try_from(&p).unwrap(), l);
        let mut bad = p;
        bad.dtype = 0;
        assert!(KvLayout::try_from(&bad).is_err());
        let mut bad = p;
        bad.order = 7;
        assert!(KvLayout::try_from(&bad).is_err());
    }
}
