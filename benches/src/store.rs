//! `kvfabric bench store`.
