//! Wall-clock seconds for the API's timestamps (a response's `created`, a
//! batch's `created_at` and stage times). A leaf: the HTTP layer and the
//! batch runner both read it.

use std::time::{SystemTime, UNIX_EPOCH};

/// Seconds since the Unix epoch (the `created` field).
pub(crate) fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}
