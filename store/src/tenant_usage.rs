//! The store's tenant-share surface: naming an owner, taking a tenants
//! file's shares, and reporting every owner's use of the tiers (with its
//! metrics). The accounting itself is [`crate::shares`], part of the locked
//! state; this file is the `Store` methods on top of it, apart so that the
//! state does not import the store.

use kvfabric_tenants::Tenants;

use crate::metrics::{TenantTierLabel, TierName};
#[cfg(doc)]
use crate::store::PutOptions;
use crate::tenant_shares::{Owner, TierUsage};
use crate::Store;

impl Store {
    /// The owner named `name` (a tenant's [`Identity::owner`]); blocks put
    /// with it count to its share ([`PutOptions::owner`],
    /// [`crate::Reservation::set_owner`]).
    pub fn owner(&self, name: &str) -> Owner {
        self.shared.inner.lock().shares.owner(name)
    }

    /// Take the tier shares of `tenants` (the file in force; called again on
    /// each reload). Enforced only when the store was opened with a tenants
    /// file (`[node] tenants_file`).
    pub fn set_shares(&self, tenants: &Tenants) {
        self.shared.inner.lock().shares.configure(tenants.owners());
    }

    /// Every owner's bytes and shares of the tiers (also refreshes
    /// `kvfabric_tenant_tier_bytes` and `kvfabric_tenant_tier_share_bytes`).
    pub fn tenant_usage(&self) -> Vec<TierUsage> {
        let usage = self.shared.inner.lock().shares.usage();
        let m = &self.shared.metrics;
        let has_disk = self.shared.disk.is_some();
        for u in &usage {
            let mut tiers = vec![(TierName::Ram, u.ram_used, u.ram_share)];
            if has_disk {
                tiers.push((TierName::Disk, u.disk_used, u.disk_share));
            }
            for (tier, used, share) in tiers {
                let label = TenantTierLabel {
                    tenant: u.owner.to_string(),
                    tier,
                };
                m.tenant_tier_bytes.get_or_create(&label).set(used as i64);
                m.tenant_tier_share_bytes
                    .get_or_create(&label)
                    .set(share as i64);
            }
        }
        usage
    }
}
