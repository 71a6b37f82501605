//! `kvfabric bench engine`.
