//! What every ctl subcommand shares: the gRPC client it talks through, the
//! API key on each request and the tiers' printed names. A leaf: the
//! subcommands import it, and it imports none of them.

use anyhow::anyhow;
use kvfabric_node::cluster::client::CacheClient;
use kvfabric_proto::v1::Tier;

/// `msg` with `authorization: Bearer <key>` when a key is given.
pub(super) fn authed<T>(msg: T, key: Option<&str>) -> anyhow::Result<tonic::Request<T>> {
    let mut r = tonic::Request::new(msg);
    if let Some(k) = key {
        let v = format!("Bearer {k}")
            .parse()
            .map_err(|_| anyhow!("--api-key must be printable ASCII"))?;
        r.metadata_mut().insert("authorization", v);
    }
    Ok(r)
}

/// A tier's name as ctl prints it.
pub(super) fn tier_name(t: i32) -> &'static str {
    match Tier::try_from(t) {
        Ok(Tier::Vram) => "vram",
        Ok(Tier::Ram) => "ram",
        Ok(Tier::Disk) => "disk",
        _ => "?",
    }
}

/// The client every subcommand talks through.
pub(super) type Client = CacheClient;
