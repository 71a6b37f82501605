//! kvfabric-types: the words the engine, the connector, the store and the
//! transfer engine share.
//!
//! A block is named by a [`BlockKey`] (from a [`KeyChain`] over a tenant, a
//! [`ModelFingerprint`] and a [`KvLayout`]), its bytes are shaped by its
//! [`KvLayout`], and they live in a [`SharedRegion`] that a peer process can
//! map. These are the types every crate passes across its boundary; the
//! engine needs them and nothing of the store's storage stack (RocksDB,
//! io_uring, etcd, gRPC) or the transfer engine's transports, so they live
//! here, in a crate that depends on none of those. The store re-exports the
//! keys as `kvfabric_store::keys`, the transfer engine the region as
//! `kvfabric_transfer::SharedRegion`. See docs/ARCHITECTURE.md, "Block key".
//!
//! ```
//! use kvfabric_types::{BlockOrder, DType, KeyChain, KvLayout, ModelFingerprint};
//!
//! let layout = KvLayout {
//!     layers: 2,
//!     kv_heads: 1,
//!     head_dim: 4,
//!     dtype: DType::F32,
//!     block_tokens: 2,
//!     order: BlockOrder::LayerKvTokenHead,
//! };
//! let model = ModelFingerprint::new(&[0u8; 32], "llama");
//! let keys = KeyChain::new(b"tenant", &model, &layout).keys(&[1, 2, 3, 4, 5]);
//! assert_eq!(keys.len(), 2); // the partial third block has no key
//! ```

mod error;
pub mod keys;
pub mod layout;
#[cfg(feature = "proto")]
mod proto;
pub mod region;

pub use error::{IoError, TypesError};
pub use keys::{BlockKey, KeyChain, ModelFingerprint, KEY_LEN};
pub use layout::{BlockOrder, DType, KvLayout};
pub use region::{page_size, SharedRegion};
