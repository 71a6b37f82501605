//! `kvfabric bench transfer`.
