//! `ClusterCacheService`: kvfabric.v1.CacheService answered for the whole
//! cluster. Lookup, Exists and Get see every node (directory + remote reads);
//! Put lands in this node's tiers (through the single-node [`CacheServer`])
//! and is announced to the key's owner before it is acknowledged; Remove,
//! Pin and Unpin reach every holder; ClusterStatus asks each live node's Stats.
//!
//! Calls a node fans out to its peers carry the `x-kvfabric-local` metadata
//! header, which makes the peer act on its own store only (no loops).

use std::pin::Pin;
use std::sync::Arc;

use bytes::Bytes;
use futures::{Stream, StreamExt};
use kvfabric_proto::v1::cache_service_client::CacheServiceClient;
use kvfabric_proto::v1::cache_service_server::CacheService;
use kvfabric_proto::v1::{
    CapacityRequest, CapacityResponse, ClusterStatusRequest, ClusterStatusResponse, ExistsRequest,
    ExistsResponse, GetHeader, GetRequest, GetResponse, LookupRequest, LookupResponse, NodeStatus,
    PinRequest, PinResponse, PutRequest, PutResponse, RemoveRequest, RemoveResponse, StatsRequest,
    StatsResponse, UnpinRequest, UnpinResponse,
};
use tonic::{Request, Response, Status, Streaming};

use crate::cache_service::{chunks, CacheServer};
use crate::cluster::node_state::{holder_pb, ClusterNode};
use crate::console::prefixes::PrefixTracker;
use kvfabric_store::keys::BlockKey;

/// Metadata header marking a fanned-out call: act on the local store only.
pub const LOCAL_ONLY_HEADER: &str = "x-kvfabric-local";

/// The cluster-wide cache API of one node.
pub struct ClusterCacheService {
    local: CacheServer,
    node: Arc<ClusterNode>,
    /// The console's top-prefixes table, told of every found prefix.
    prefixes: Option<Arc<PrefixTracker>>,
}

impl ClusterCacheService {
    /// Answer for the cluster `node` belongs to; `local` serves its own store.
    pub fn new(local: CacheServer, node: Arc<ClusterNode>) -> Self {
        ClusterCacheService {
            local,
            node,
            prefixes: None,
        }
    }

    /// Record every lookup's found prefix in `tracker` (the console's top prefixes).
    pub fn with_prefix_tracker(mut self, tracker: Arc<PrefixTracker>) -> Self {
        self.prefixes = Some(tracker);
        self
    }

    fn local_only<T>(req: &Request<T>) -> bool {
        req.metadata().contains_key(LOCAL_ONLY_HEADER)
    }

    /// Run `call` on every other live node holding some of `keys`, with the
    /// keys it holds, marked local-only; returns the sum of the counts.
    async fn fan_out<F, Fut>(&self, keys: &[BlockKey], call: F) -> u32
    where
        F: Fn(CacheServiceClient<tonic::transport::Channel>, Vec<Vec<u8>>) -> Fut,
        Fut: std::future::Future<Output = Result<u32, Status>>,
    {
        let view = self.node.view();
        let me = self.node.info().node_id.clone();
        let mut per_node: std::collections::HashMap<String, Vec<Vec<u8>>> = Default::default();
        for (k, holders) in keys.iter().zip(self.node.locate(keys).await) {
            for h in holders.into_iter().filter(|h| h.node_id != me) {
                per_node
                    .entry(h.node_id)
                    .or_default()
                    .push(k.as_bytes().to_vec());
            }
        }
        let timeout = self.node.config().rpc_timeout();
        let calls = per_node.into_iter().filter_map(|(id, ks)| {
            let peer = view.nodes.get(&id)?;
            let ch = self.node.channel(&id, &peer.grpc_addr).ok()?;
            let fut = call(CacheServiceClient::new(ch), ks);
            Some(async move {
                match tokio::time::timeout(timeout, fut).await {
                    Ok(Ok(n)) => n,
                    Ok(Err(s)) => {
                        tracing::info!(node = %id, status = %s, "fan-out call failed");
                        0
                    }
                    Err(_) => 0,
                }
            })
        });
        futures::future::join_all(calls).await.into_iter().sum()
    }
}

fn parse_keys(keys: &[Vec<u8>]) -> Result<Vec<BlockKey>, Status> {
    keys.iter()
        .map(|k| BlockKey::from_slice(k).map_err(Status::from))
        .collect()
}

fn marked<T>(msg: T) -> Request<T> {
    let mut r = Request::new(msg);
    r.metadata_mut().insert(
        LOCAL_ONLY_HEADER,
        tonic::metadata::MetadataValue::from_static("1"),
    );
    r
}

type GetStream = Pin<Box<dyn Stream<Item = Result<GetResponse, Status>> + Send + 'static>>;

#[tonic::async_trait]
impl CacheService for ClusterCacheService {
    async fn lookup(
        &self,
        req: Request<LookupRequest>,
    ) -> Result<Response<LookupResponse>, Status> {
        if Self::local_only(&req) {
            return self.local.lookup(req).await;
        }
        let tenant = req
            .extensions()
            .get::<kvfabric_tenants::Identity>()
            .map(|who| who.label().to_string());
        let req = req.into_inner();
        let keys = parse_keys(&req.keys)?;
        let prefix = self.node.lookup(&keys).await;
        if let Some(t) = &self.prefixes {
            t.record(tenant.as_deref().unwrap_or("default"), &keys, &prefix);
        }
        Ok(Response::new(LookupResponse {
            prefix_blocks: prefix.len() as u32,
            holders: if req.with_holders {
                prefix.iter().map(holder_pb).collect()
            } else {
                Vec::new()
            },
        }))
    }

    async fn exists(
        &self,
        req: Request<ExistsRequest>,
    ) -> Result<Response<ExistsResponse>, Status> {
        if Self::local_only(&req) {
            return self.local.exists(req).await;
        }
        let keys = parse_keys(&req.into_inner().keys)?;
        Ok(Response::new(ExistsResponse {
            present: self.node.exists(&keys).await,
        }))
    }

    async fn put(
        &self,
        req: Request<Streaming<PutRequest>>,
    ) -> Result<Response<PutResponse>, Status> {
        let resp = self.local.put(req).await?;
        // Registered with the key's owner before the put is acknowledged.
        self.node.sync().await;
        Ok(resp)
    }

    type GetStream = GetStream;

    async fn get(&self, req: Request<GetRequest>) -> Result<Response<GetStream>, Status> {
        if Self::local_only(&req) {
            return self.local.get(req).await;
        }
        let req = req.into_inner();
        let key = BlockKey::from_slice(&req.key)?;
        let Some(block) = self.node.get(&key).await? else {
            return Err(Status::not_found(format!(
                "block {key:?} is held by no node"
            )));
        };
        let total = block.data.len() as u64;
        let range = crate::cache_service::get_range(req.offset, req.length, total)?;
        let mut out = vec![GetResponse {
            header: Some(GetHeader {
                size: total,
                layout: Some((&block.layout).into()),
                checksum: block.checksum,
                node_id: block.node_id.clone(),
                tier: block.tier as i32,
            }),
            data: Bytes::new(),
        }];
        let body = Bytes::from(block.data).slice(range);
        out.extend(chunks(&body).map(|data| GetResponse { header: None, data }));
        Ok(Response::new(
            futures::stream::iter(out.into_iter().map(Ok)).boxed(),
        ))
    }

    async fn remove(
        &self,
        req: Request<RemoveRequest>,
    ) -> Result<Response<RemoveResponse>, Status> {
        if Self::local_only(&req) {
            let r = self.local.remove(req).await;
            self.node.sync().await;
            return r;
        }
        let keys = parse_keys(&req.get_ref().keys)?;
        let remote = self
            .fan_out(&keys, |mut c, ks| async move {
                Ok(c.remove(marked(RemoveRequest { keys: ks }))
                    .await?
                    .into_inner()
                    .removed)
            })
            .await;
        let local = self.local.remove(req).await?.into_inner().removed;
        self.node.sync().await;
        Ok(Response::new(RemoveResponse {
            removed: local + remote,
        }))
    }

    async fn pin(&self, req: Request<PinRequest>) -> Result<Response<PinResponse>, Status> {
        if Self::local_only(&req) {
            return self.local.pin(req).await;
        }
        let keys = parse_keys(&req.get_ref().keys)?;
        let ttl_ms = req.get_ref().ttl_ms;
        let remote = self
            .fan_out(&keys, |mut c, ks| async move {
                Ok(c.pin(marked(PinRequest { keys: ks, ttl_ms }))
                    .await?
                    .into_inner()
                    .pinned)
            })
            .await;
        let local = self.local.pin(req).await?.into_inner().pinned;
        Ok(Response::new(PinResponse {
            pinned: local + remote,
        }))
    }

    async fn unpin(&self, req: Request<UnpinRequest>) -> Result<Response<UnpinResponse>, Status> {
        if Self::local_only(&req) {
            return self.local.unpin(req).await;
        }
        let keys = parse_keys(&req.get_ref().keys)?;
        let remote = self
            .fan_out(&keys, |mut c, ks| async move {
                Ok(c.unpin(marked(UnpinRequest { keys: ks }))
                    .await?
                    .into_inner()
                    .unpinned)
            })
            .await;
        let local = self.local.unpin(req).await?.into_inner().unpinned;
        Ok(Response::new(UnpinResponse {
            unpinned: local + remote,
        }))
    }

    async fn stats(&self, _req: Request<StatsRequest>) -> Result<Response<StatsResponse>, Status> {
        Ok(Response::new(self.node.stats()))
    }

    async fn capacity(
        &self,
        req: Request<CapacityRequest>,
    ) -> Result<Response<CapacityResponse>, Status> {
        self.local.capacity(req).await
    }

    async fn cluster_status(
        &self,
        req: Request<ClusterStatusRequest>,
    ) -> Result<Response<ClusterStatusResponse>, Status> {
        let view = self.node.view();
        let me = self.node.info().node_id.clone();
        let timeout = self.node.config().rpc_timeout();
        // Peers with a tenants file want a credential: secured, this node's
        // certificate is one; in mode none, the caller's key is passed on.
        let auth = req.metadata().get("authorization").cloned();
        let asks = view.nodes.values().map(|n| {
            let me = me.clone();
            let auth = auth.clone();
            async move {
                let stats = if n.node_id == me {
                    Some(self.node.stats())
                } else {
                    match self.node.channel(&n.node_id, &n.grpc_addr) {
                        Ok(ch) => {
                            let mut c = CacheServiceClient::new(ch);
                            let mut ask = Request::new(StatsRequest {});
                            if let Some(a) = auth {
                                ask.metadata_mut().insert("authorization", a);
                            }
                            match tokio::time::timeout(timeout, c.stats(ask)).await {
                                Ok(Ok(r)) => Some(r.into_inner()),
                                _ => None,
                            }
                        }
                        Err(_) => None,
                    }
                };
                let field = |f: fn(&StatsResponse) -> u64| stats.as_ref().map_or(0, f);
                let served_blocks = field(|s| s.served_blocks);
                let transfer_in_bytes = field(|s| s.transfer_in_bytes);
                let transfer_out_bytes = field(|s| s.transfer_out_bytes);
                let (tiers, hit_ratio) = match &stats {
                    Some(s) => {
                        let all = s.hit_blocks + s.miss_blocks;
                        let ratio = if all == 0 {
                            0.0
                        } else {
                            s.hit_blocks as f64 / all as f64
                        };
                        (s.tiers.clone(), ratio)
                    }
                    None => (Vec::new(), 0.0),
                };
                NodeStatus {
                    node_id: n.node_id.clone(),
                    grpc_addr: n.grpc_addr.clone(),
                    transfer_addr: n.transfer_addr.clone(),
                    // Listed by membership; a node that did not answer its Stats
                    // is still listed, with no tiers.
                    alive: stats.is_some(),
                    tiers,
                    hit_ratio,
                    served_blocks,
                    transfer_in_bytes,
                    transfer_out_bytes,
                }
            }
        });
        let nodes = futures::future::join_all(asks).await;
        Ok(Response::new(ClusterStatusResponse { nodes }))
    }
}
