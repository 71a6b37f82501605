//! [`RemoteConnector`]: the connector over a `kvfabric node` running in
//! another process, reached through its gRPC CacheService.
//!
//! For deployments that keep the cache daemon apart from the engine (one
//! node per host shared by several engines, or a node with big disks).
//! Blocks travel as gRPC messages (one copy more than the embedded
//! connector's transfer READ straight into the pool); everything else is the
//! same connector: lookups with a timeout, verified loads, write-behind
//! saves of missing keys only. The node verifies a block's checksum when it
//! reads it, and the connector verifies it again before it copies the KV
//! bytes into the engine's pool. Loads are whole blocks (no layer-wise
//! streaming through gRPC); saves carry the per-layer trailer so engines
//! with an embedded node can stream these blocks. A secured node is reached
//! over mutual TLS with the identity the engine loaded from its
//! `[cluster.security]` settings; an engine without one is told at start
//! (an error log naming the settings) that its node wants a certificate
//! (and one with a certificate, that its node speaks plaintext). Every call
//! carries the engine's `[connector] node_api_key` for a node with a tenants
//! file, and every put the owner of its block (the request's tenant;
//! `crate::node_key`); a refused key is told at start and on each failed
//! save as [`ConnectorError::NodeApiKey`], naming the setting.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use futures::future::BoxFuture;
use futures::FutureExt;
use kvfabric_node::cluster::client::{
    check_tls, connect_lazy_with, connect_with, get_block_with, put_block_with, CacheClient,
};
use kvfabric_node::cluster::{HolderEntry, HolderTier};
use kvfabric_proto::v1::{ExistsRequest, LookupRequest, StatsRequest};
use kvfabric_transfer::security::NodeIdentity;
use kvfabric_types::{BlockKey, KvLayout};

use crate::connector::{
    checksum_ok, load_each, payload_fits, Backend, Connector, LoadBlock, LoadOptions,
};
use crate::node_key::NodeKey;
use crate::{
    BlockId, ConnectFn, ConnectorConfig, ConnectorError, KvMemory, LoadProgress, SaveBlock,
};

/// Limit on one call to the node (a whole-block get or put included); a
/// call that runs over is a miss or a failed save, never a hang. Lookups
/// are cut earlier, by `lookup_timeout_ms`.
const RPC_TIMEOUT: Duration = Duration::from_secs(5);

/// The connector over a node in another process.
pub type RemoteConnector = Connector<RemoteBackend>;

/// A gRPC client of the node and the engine's KV pool.
pub struct RemoteBackend {
    client: CacheClient,
    addr: String,
    node_id: Arc<OnceLock<String>>,
    mem: Arc<KvMemory>,
    key: NodeKey,
}

impl Connector<RemoteBackend> {
    /// The engine's [`ConnectFn`] for the node at `addr` (`host:port`),
    /// over mutual TLS with `identity` when given (a secured node's).
    /// Call it inside a tokio runtime; the connection is opened lazily, so
    /// an engine starts even while its node is still starting.
    pub fn connect_fn(
        addr: String,
        cfg: ConnectorConfig,
        identity: Option<Arc<NodeIdentity>>,
    ) -> ConnectFn {
        let key = cfg.node_api_key.clone();
        Connector::connect_fn_with(cfg, move |mem, rt| {
            let key = NodeKey::new(key.as_ref())?;
            let client = connect_lazy_with(&addr, RPC_TIMEOUT, identity.as_deref())?;
            let node_id = Arc::new(OnceLock::new());
            {
                let (mut client, node_id, key) = (client.clone(), node_id.clone(), key.clone());
                let (addr, tls) = (addr.clone(), identity.is_some());
                rt.spawn(async move {
                    match probe(&mut client, &addr, &key, tls).await {
                        Ok(id) => {
                            let _ = node_id.set(id);
                        }
                        Err(e @ (ConnectorError::NodeApiKey { .. } | ConnectorError::Store(_) | ConnectorError::Fabric(_))) => {
                            tracing::error!(node = %addr, "fabric node unusable (every load and save will fail): {e}")
                        }
                        Err(e) => tracing::debug!(node = %addr, "fabric node not answering yet: {e}"),
                    }
                });
            }
            Ok(Arc::new(RemoteBackend {
                client,
                addr,
                node_id,
                mem: Arc::new(mem),
                key,
            }))
        })
    }

    /// Whether an engine with `cfg` (its `node_api_key`) and `identity` can
    /// use the node at `addr`: the node's id, or why not
    /// ([`ConnectorError::NodeApiKey`] for a missing or unknown key, a
    /// `Store` error naming the TLS settings for a TLS mismatch). What an
    /// engine checks at start (logged there, as its connection is lazy);
    /// for tools and tests that want the answer.
    pub async fn check_node(
        addr: &str,
        cfg: &ConnectorConfig,
        identity: Option<&NodeIdentity>,
    ) -> Result<String, ConnectorError> {
        let key = NodeKey::new(cfg.node_api_key.as_ref())?;
        let mut client = connect_with(addr, RPC_TIMEOUT, identity).await?;
        probe(&mut client, addr, &key, identity.is_some()).await
    }
}

/// Ask the node at `addr` for its id with `key`; a refused key or a TLS
/// mismatch (`tls`: this client has a certificate) is said so.
async fn probe(
    client: &mut CacheClient,
    addr: &str,
    key: &NodeKey,
    tls: bool,
) -> Result<String, ConnectorError> {
    match client.stats(key.request(StatsRequest {})).await {
        Ok(r) => Ok(r.into_inner().node_id),
        Err(s) => {
            if let Some(e) = key.refused(addr, &s) {
                return Err(e);
            }
            check_tls(addr, RPC_TIMEOUT, tls).await?;
            Err(ConnectorError::Node {
                node: addr.to_string(),
                call: "stats",
                status: s,
            })
        }
    }
}

impl RemoteBackend {
    /// Read one whole block through the node and copy its KV bytes into
    /// engine block `block`; true only if it matched its checksum.
    async fn read(self: Arc<Self>, key: BlockKey, block: BlockId) -> bool {
        let mut client = self.client.clone();
        let (header, data) = match get_block_with(&mut client, &key, self.key.metadata(None)).await
        {
            Ok(Some(b)) => b,
            Ok(None) => return false,
            Err(s) => {
                tracing::debug!(node = %self.addr, status = %s, "fabric block read failed; recomputing");
                return false;
            }
        };
        let Some(layout) = header
            .layout
            .as_ref()
            .and_then(|l| KvLayout::try_from(l).ok())
        else {
            return false;
        };
        let mem = &self.mem;
        let from = &header.node_id;
        if !payload_fits(mem, &layout, data.len() as u64, from)
            || !checksum_ok(&data, &[], header.checksum, from)
        {
            return false;
        }
        let kv = &data[..mem.block_bytes()];
        // SAFETY: the engine keeps a loading block out of every forward
        // pass until the load ends; this task is its only writer.
        let Ok(dst) = (unsafe {
            mem.region
                .slice_mut(mem.block_offset(block) as usize, kv.len())
        }) else {
            return false;
        };
        dst.copy_from_slice(kv);
        true
    }
}

impl Backend for RemoteBackend {
    fn lookup(self: Arc<Self>, keys: Vec<BlockKey>) -> BoxFuture<'static, Vec<HolderEntry>> {
        async move {
            let req = LookupRequest {
                keys: keys.iter().map(|k| k.as_bytes().to_vec()).collect(),
                with_holders: true,
            };
            match self.client.clone().lookup(self.key.request(req)).await {
                Ok(r) => r
                    .into_inner()
                    .holders
                    .into_iter()
                    .map(|h| HolderEntry {
                        node_id: h.node_id,
                        tier: HolderTier::Ram,
                        size: h.size,
                        checksum: h.checksum,
                    })
                    .collect(),
                Err(s) => {
                    tracing::debug!(node = %self.addr, status = %s, "lookup failed: counted as a miss");
                    Vec::new()
                }
            }
        }
        .boxed()
    }

    fn load(
        self: Arc<Self>,
        blocks: Vec<LoadBlock>,
        _progress: Arc<LoadProgress>,
        opts: LoadOptions,
    ) -> BoxFuture<'static, usize> {
        // Whole blocks only: a gRPC Get streams the block as one message.
        async move {
            load_each(blocks, opts.concurrency, |b| {
                self.clone().read(b.key, b.block)
            })
            .await
        }
        .boxed()
    }

    fn prefetch(
        self: Arc<Self>,
        _keys: Vec<BlockKey>,
        _owner: Option<Arc<str>>,
    ) -> BoxFuture<'static, usize> {
        // The node reads remote blocks itself when asked; nothing to stage here.
        async { 0 }.boxed()
    }

    fn exists(self: Arc<Self>, keys: Vec<BlockKey>) -> BoxFuture<'static, Vec<bool>> {
        async move {
            let n = keys.len();
            let req = ExistsRequest {
                keys: keys.iter().map(|k| k.as_bytes().to_vec()).collect(),
            };
            match self.client.clone().exists(self.key.request(req)).await {
                Ok(r) if r.get_ref().present.len() == n => r.into_inner().present,
                // Unknown: store them; a put of a present key is a no-op.
                _ => vec![false; n],
            }
        }
        .boxed()
    }

    fn store(
        self: Arc<Self>,
        blocks: Vec<SaveBlock>,
    ) -> BoxFuture<'static, Vec<Result<bool, ConnectorError>>> {
        async move {
            let mut out = Vec::with_capacity(blocks.len());
            for b in blocks {
                let mem = &self.mem;
                // SAFETY: the engine does not change a block queued for
                // saving until the save is reported finished.
                let bytes = unsafe {
                    mem.region
                        .slice(mem.block_offset(b.block) as usize, mem.block_bytes())
                };
                let r = match bytes {
                    Ok(bytes) => {
                        let mut client = self.client.clone();
                        let payload = crate::trailer::with_trailer(&mem.layout, &b.key, bytes);
                        let meta = self.key.metadata(b.owner.as_deref());
                        put_block_with(&mut client, &b.key, &mem.layout, &payload, false, meta)
                            .await
                            .map(|r| !r.already_present)
                            .map_err(|s| {
                                self.key.refused(&self.addr, &s).unwrap_or_else(|| {
                                    ConnectorError::Node {
                                        node: self.addr.clone(),
                                        call: "put",
                                        status: s,
                                    }
                                })
                            })
                    }
                    Err(e) => Err(e.into()),
                };
                out.push(r);
            }
            out
        }
        .boxed()
    }

    fn holder(&self) -> String {
        self.node_id
            .get()
            .cloned()
            .unwrap_or_else(|| self.addr.clone())
    }
}
