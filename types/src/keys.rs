//! Block keys: the deterministic names of KV blocks.
//!
//! `key_i = blake3(namespace_len u32 LE || namespace || model_fingerprint ||
//! layout bytes || key_{i-1} || tokens_i as u32 LE)`, with `key_{-1}` = 32 zero
//! bytes. Nothing here depends on the process, the machine or the build: no
//! std hasher, no seed. The namespace is the tenant's cache salt (two tenants
//! never share a block); the model fingerprint hashes the weights and the
//! architecture; the layout is part of the key so two layouts never alias.
//! This is the one key library: the engine, the connector and external
//! clients all call [`KeyChain`]. The layout is [`crate::layout`].

use std::fmt;

use crate::layout::KvLayout;
use crate::TypesError;

/// Length of a block key in bytes.
pub const KEY_LEN: usize = 32;

/// The 256-bit name of one block of one token prefix.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockKey(pub [u8; KEY_LEN]);

impl BlockKey {
    /// Parse a key received from a client; anything but 32 bytes is refused.
    pub fn from_slice(bytes: &[u8]) -> Result<Self, TypesError> {
        let arr: [u8; KEY_LEN] = bytes.try_into().map_err(|_| {
            TypesError::InvalidArgument(format!(
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::{BlockOrder, DType};

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
    fn key_parsing() {
        assert!(BlockKey::from_slice(&[0u8; 31]).is_err());
        assert!(BlockKey::from_slice(&[0u8; 32]).is_ok());
    }
}
