//! Cluster: membership, key ownership and directory shards.
//!
//! - [`membership`]: which nodes are alive (single, static peers, or etcd).
//! - [`rendezvous`]: which live node owns a key's directory entry.
//! - [`directory`]: the entries a node owns (who holds which block, where).

pub mod directory;
pub mod membership;
pub mod rendezvous;
#[doc(hidden)]
pub mod etcd_process;

pub use directory::{DirectoryShard, HolderEntry, HolderTier};
pub use membership::{Membership, MembershipSource, MembershipView, NodeInfo};
