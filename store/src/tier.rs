//! `Tier`: which of a node's tiers holds a block, the store's own name for
//! it. The node crate maps it to the wire's `kvfabric.v1.Tier` at its edge.

/// A node's tiers, fastest first, and `Absent` for a block in none of them
/// (a removed block's change event, a key not stored).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub enum Tier {
    /// In no tier of this node.
    #[default]
    Absent,
    /// GPU device memory (feature `cuda`).
    Vram,
    /// The node's host-RAM arena (a registered transfer segment).
    Ram,
    /// The node's NVMe / file tier.
    Disk,
}

impl Tier {
    /// The tier's name in metrics labels and logs (`vram`, `ram`, `disk`,
    /// `absent`).
    pub fn as_str(self) -> &'static str {
        match self {
            Tier::Absent => "absent",
            Tier::Vram => "vram",
            Tier::Ram => "ram",
            Tier::Disk => "disk",
        }
    }
}
