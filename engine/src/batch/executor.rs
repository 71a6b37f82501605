//! [`BatchExecutor`]: what the batch runner needs from the server it runs
//! batches through. The HTTP layer implements it for its state
//! (`http/batch.rs`: each line goes through the very handler an interactive
//! request takes), so the runner runs requests without importing the HTTP
//! layer, which holds the [`BatchService`](super::BatchService) it serves.

use std::future::Future;

use kvfabric_tenants::Identity;
use serde_json::Value;

/// Runs a batch's request lines as interactive requests would run.
pub trait BatchExecutor: Send + Sync + 'static {
    /// Run one request body against `endpoint` (`/v1/chat/completions` or
    /// `/v1/completions`) as `who`: the HTTP status and the JSON body, an
    /// error body included.
    fn execute(
        &self,
        who: Identity,
        endpoint: &str,
        body: Vec<u8>,
    ) -> impl Future<Output = (u16, Value)> + Send;

    /// The identity stored under `owner` (a tenant's name, or the anonymous
    /// label in single-tenant mode): a batch whose creator this process does
    /// not know (after a restart) resumes as it. None: no such tenant (any more).
    fn identity_of(&self, owner: &str) -> Option<Identity>;
}
