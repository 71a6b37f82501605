//! `Shared`: the state every handle, lease and reservation of one store
//! holds (config, RAM region, disk tier, metrics, the locked index).
//!
//! Its own module, below `store.rs` (the handle), `lifecycle.rs` (leases and
//! reservations) and `tiering.rs` (promotion and demotion), which all
//! implement parts of it: they import it from here instead of from each
//! other.

use std::sync::Arc;

use kvfabric_transfer::SharedRegion;
use parking_lot::Mutex;

use crate::disk::DiskTier;
use crate::metrics::StoreMetrics;
use crate::node_config::NodeConfig;
use crate::state::Inner;

/// State shared by every handle, lease and reservation of one store.
pub(crate) struct Shared {
    pub cfg: NodeConfig,
    pub region: Arc<SharedRegion>,
    pub disk: Option<DiskTier>,
    pub metrics: StoreMetrics,
    pub planner: Arc<crate::planner::Planner>,
    pub inner: Mutex<Inner>,
    pub ram_high: u64,
    pub ram_low: u64,
    pub disk_high: u64,
    pub disk_low: u64,
}
