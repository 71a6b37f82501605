//! [`Rec`]: how the block index and the eviction orders name a stored
//! block's record. Its own file so the orders (which carry it) and the
//! index (whose records hold the orders' slots) do not import each other.

/// The index of a record in the block index's slab (stable while its key
/// is stored).
pub(crate) type Rec = u32;
