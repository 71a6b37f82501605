//! [`FabricConnector`]: the connector over a cluster node in this process
//! (the default deployment, see [`crate::EmbeddedNode`]).
//!
//! The engine's KV pool is registered with the node's transfer engine, so a
//! block held by a peer is READ straight into its engine block (layer by
//! layer, see [`crate::stream`]) and a block held here is copied from the
//! node's RAM tier; saves copy from the pool into the RAM tier, followed by
//! the block's per-layer checksums, counted to the request's tenant in the
//! node's tier shares (`SaveBlock::owner`), and announce the new holdings to
//! their directory owners.

use std::sync::Arc;

use futures::future::BoxFuture;
use futures::FutureExt;
use kvfabric_node::cluster::{ClusterNode, HolderEntry};
use kvfabric_store::{Owner, PutOptions, ReserveOutcome, Store};
use kvfabric_transfer::SegmentId;
use kvfabric_types::BlockKey;

use crate::connector::{Backend, Connector, LoadBlock, LoadOptions};
use crate::{
    trailer, ConnectFn, ConnectorConfig, ConnectorError, KvMemory, LoadProgress, SaveBlock,
};

/// The connector over an embedded [`ClusterNode`].
pub type FabricConnector = Connector<EmbeddedBackend>;

/// The embedded node and the engine's registered KV pool.
pub struct EmbeddedBackend {
    node: Arc<ClusterNode>,
    mem: Arc<KvMemory>,
    segment: SegmentId,
}

impl Drop for EmbeddedBackend {
    fn drop(&mut self) {
        // The KV pool goes away with the engine: peers must not reach it any more.
        let _ = self.node.transfer().unregister(self.segment);
    }
}

impl Connector<EmbeddedBackend> {
    /// The engine's [`ConnectFn`] for `node`. Call it inside the tokio
    /// runtime the node runs on: the connector's tasks run there.
    pub fn connect_fn(node: Arc<ClusterNode>, cfg: ConnectorConfig) -> ConnectFn {
        Connector::connect_fn_with(cfg, move |mem, _| {
            let segment = node.transfer().register(mem.region.clone());
            Ok(Arc::new(EmbeddedBackend {
                node,
                mem: Arc::new(mem),
                segment,
            }))
        })
    }
}

impl Backend for EmbeddedBackend {
    fn lookup(self: Arc<Self>, keys: Vec<BlockKey>) -> BoxFuture<'static, Vec<HolderEntry>> {
        async move { self.node.lookup(&keys).await }.boxed()
    }

    fn load(
        self: Arc<Self>,
        blocks: Vec<LoadBlock>,
        progress: Arc<LoadProgress>,
        opts: LoadOptions,
    ) -> BoxFuture<'static, usize> {
        async move {
            crate::stream::load_blocks(
                &self.node,
                &self.mem,
                self.segment,
                &blocks,
                &progress,
                opts,
            )
            .await
        }
        .boxed()
    }

    fn prefetch(
        self: Arc<Self>,
        keys: Vec<BlockKey>,
        owner: Option<Arc<str>>,
    ) -> BoxFuture<'static, usize> {
        async move {
            // The copies count to the request's tenant, as its saves do.
            let owner = owner.map_or(Owner::NONE, |o| self.node.store().owner(&o));
            let holders = self.node.lookup(&keys).await;
            let me = self.node.info().node_id.clone();
            let mut copied = Vec::new();
            for (key, h) in keys.iter().zip(&holders) {
                if h.node_id == me {
                    continue;
                }
                // A remote read verifies the block's checksum; the put checks it again.
                let Ok(Some(b)) = self.node.get(key).await else {
                    break;
                };
                let store = self.node.store().clone();
                let key = *key;
                let put = tokio::task::spawn_blocking(move || {
                    let opts = PutOptions {
                        checksum: Some(b.checksum),
                        owner,
                        ..PutOptions::default()
                    };
                    store.put(key, b.layout, &b.data, opts)
                })
                .await;
                match put {
                    Ok(Ok(_)) => copied.push(key),
                    _ => break,
                }
            }
            self.node.announce_keys(&copied).await;
            copied.len()
        }
        .boxed()
    }

    fn exists(self: Arc<Self>, keys: Vec<BlockKey>) -> BoxFuture<'static, Vec<bool>> {
        async move { self.node.exists(&keys).await }.boxed()
    }

    fn store(
        self: Arc<Self>,
        blocks: Vec<SaveBlock>,
    ) -> BoxFuture<'static, Vec<Result<bool, ConnectorError>>> {
        async move {
            let n = blocks.len();
            let keys: Vec<BlockKey> = blocks.iter().map(|b| b.key).collect();
            let store = self.node.store().clone();
            let mem = self.mem.clone();
            // Copying megabytes is blocking work.
            let stored = tokio::task::spawn_blocking(move || {
                blocks
                    .iter()
                    .map(|b| store_block(&store, &mem, b))
                    .collect::<Vec<_>>()
            })
            .await
            .unwrap_or_else(|e| {
                let source = std::sync::Arc::new(e);
                (0..n)
                    .map(|_| {
                        Err(ConnectorError::Task {
                            task: "save",
                            source: source.clone(),
                        })
                    })
                    .collect()
            });
            let new: Vec<BlockKey> = keys
                .iter()
                .zip(&stored)
                .filter(|(_, r)| matches!(r, Ok(true)))
                .map(|(k, _)| *k)
                .collect();
            // Visible cluster-wide before the blocks are reported saved.
            self.node.announce_keys(&new).await;
            stored
        }
        .boxed()
    }

    fn holder(&self) -> String {
        self.node.info().node_id.clone()
    }
}

/// Copy one block from the KV pool into the node's RAM tier, followed by
/// its per-layer trailer; Ok(false) when the node already had it.
fn store_block(store: &Store, mem: &KvMemory, b: &SaveBlock) -> Result<bool, ConnectorError> {
    let len = mem.block_bytes();
    let total = len + trailer::trailer_len(&mem.layout);
    match store.reserve(b.key, mem.layout, total as u64, b.tokens, false)? {
        ReserveOutcome::Present(_) => Ok(false),
        ReserveOutcome::Reserved(mut r) => {
            // The request's tenant: the block counts to its tier shares.
            if let Some(owner) = &b.owner {
                r.set_owner(store.owner(owner));
            }
            // SAFETY: the engine does not change a block queued for saving
            // until the save is reported finished.
            let bytes = unsafe { mem.region.slice(mem.block_offset(b.block) as usize, len) }?;
            r.write(0, bytes)?;
            r.write(len as u64, &trailer::build(&mem.layout, &b.key, bytes))?;
            r.commit(None)?;
            Ok(true)
        }
    }
}
