//! What the store tells about a block: [`BlockInfo`] (its facts and the
//! fastest tier holding it) and [`PutOutcome`] (what a put did). Their own
//! file: the lifecycle handles, the index and the tier above RAM (`upper`)
//! all name them, and none of those imports another for them.

use crate::keys::{BlockKey, KvLayout};
use crate::tier::Tier;

/// What a put did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PutOutcome {
    /// The key was already stored; nothing changed.
    pub already_present: bool,
    /// Fastest tier the block is in after the put.
    pub tier: Tier,
}

/// Facts about one stored block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockInfo {
    pub key: BlockKey,
    pub layout: KvLayout,
    pub len: u64,
    /// xxh3-64 of the bytes.
    pub checksum: u64,
    pub tokens: u32,
    /// Tier the read was served from (fastest holding the block).
    pub tier: Tier,
}
