//! Block keys and layouts, as the store names them.
//!
//! The key library itself (the hash chain, its golden vectors, the layout
//! encoding and its wire form) lives in `kvfabric-types`, which the engine
//! and the connector share without depending on the store; this module
//! re-exports it so `kvfabric_store::keys` keeps its paths (how its errors
//! become the store's is in `error.rs`).

pub use kvfabric_types::keys::{BlockKey, KeyChain, ModelFingerprint, KEY_LEN};
pub use kvfabric_types::layout::{BlockOrder, DType, KvLayout};

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
