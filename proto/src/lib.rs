//! kvfabric-proto: the wire contract.
//!
//! - [`v1`]: the public, versioned cache API (`kvfabric.v1.CacheService`) that
//!   engines, clients and `kvfabric ctl` use.
//! - [`internal::v1`]: node-to-node services (directory shards, read leases).
//!
//! Everything here is generated from `proto/**/*.proto` by `build.rs`; the
//! field documentation lives in those files. [`FILE_DESCRIPTOR_SET`] feeds gRPC
//! server reflection so `grpcurl` works against a node.

/// Public cache API, version 1.
pub mod v1 {
    tonic::include_proto!("kvfabric.v1");
}

/// Node-to-node services.
pub mod internal {
    /// Version 1 of the internal services.
    pub mod v1 {
        tonic::include_proto!("kvfabric.internal.v1");
    }
}

/// Encoded `FileDescriptorSet` of every kvfabric proto, for gRPC reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/kvfabric_descriptor.bin"));

/// Length in bytes of a block key on the wire.
pub const BLOCK_KEY_LEN: usize = 32;
