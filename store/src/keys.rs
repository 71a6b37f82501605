//! Block keys and layouts, as the store names them.
//!
//! The key library itself (the hash chain, its golden vectors, the layout
//! encoding and its wire form) lives in `kvfabric-types`, which the engine
//! and the connector share without depending on the store; this module
//! re-exports it so `kvfabric_store::keys` keeps its paths (how its errors
//! become the store's is in `error.rs`).

pub use kvfabric_types::keys::{BlockKey, KeyChain, ModelFingerprint, KEY_LEN};
pub use kvfabric_types::layout::{BlockOrder, DType, KvLayout};

/// SHARDS' spatial hash of a key, the sampling hash of the capacity planner
/// and of the adaptive order's shadows: the key's words folded and mixed
/// (murmur3's finalizer), so keys that are not themselves hashes sample
/// evenly too.
#[inline]
pub(crate) fn spot(key: &BlockKey) -> u64 {
    let mut x = 0u64;
    for (i, c) in key.0.chunks_exact(8).enumerate() {
        let w = u64::from_le_bytes(c.try_into().unwrap_or([0; 8]));
        x ^= w.rotate_left(i as u32 * 17);
    }
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    x ^ (x >> 33)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::StoreError;

    #[test]
    fn key_and_layout_errors_are_invalid_arguments() {
        let e: StoreError = BlockKey::from_slice(&[0u8; 31]).unwrap_err().into();
        assert!(matches!(e, StoreError::InvalidArgument(_)), "{e}");
        let region = kvfabric_types::SharedRegion::create("t", 4096).unwrap();
        let e: StoreError = region.check(4096, 1).unwrap_err().into();
        assert!(
            matches!(
                e,
                StoreError::Region(kvfabric_transfer::TransferError::OutOfBounds { .. })
            ),
            "{e}"
        );
    }
}
