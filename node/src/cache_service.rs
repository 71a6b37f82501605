//! `CacheServer`: kvfabric.v1.CacheService for a single node, over [`Store`].
//!
//! Input is validated before anything is stored (key length, layout, size
//! limits, stream length vs header), so a bad request never damages stored
//! blocks: a failed put drops its reservation, which frees its room. Store
//! calls that may touch the disk run under `spawn_blocking`.

use std::pin::Pin;
use std::time::Duration;

use bytes::Bytes;
use futures::{Stream, StreamExt};
use kvfabric_proto::v1::cache_service_server::CacheService;
use kvfabric_proto::v1::{
    CapacityRequest, CapacityResponse, ClusterStatusRequest, ClusterStatusResponse, ExistsRequest,
    ExistsResponse, GetHeader, GetRequest, GetResponse, Holder, LookupRequest, LookupResponse,
    NodeStatus, PinRequest, PinResponse, PutRequest, PutResponse, RemoveRequest, RemoveResponse,
    StatsRequest, StatsResponse, UnpinRequest, UnpinResponse,
};
use tonic::{Request, Response, Status, Streaming};

use crate::store_status;
use crate::tenant_scope::{put_owner, PutKeyScope};
use crate::NodeError;
use kvfabric_store::keys::{BlockKey, KvLayout};
use kvfabric_store::ReadLease;
use kvfabric_store::{BadArgument, StoreError};
use kvfabric_store::{ReserveOutcome, Store};

/// Size of the data chunks of a Get or Put stream.
pub const STREAM_CHUNK: usize = 1 << 20;

/// The gRPC face of one node's store.
pub struct CacheServer {
    store: Store,
    grpc_addr: String,
}

impl CacheServer {
    /// Serve `store`; `grpc_addr` is what ClusterStatus reports for this node.
    pub fn new(store: Store, grpc_addr: String) -> Self {
        CacheServer { store, grpc_addr }
    }
}

fn parse_keys(keys: &[Vec<u8>]) -> Result<Vec<BlockKey>, Status> {
    keys.iter()
        .map(|k| BlockKey::from_slice(k).map_err(Status::from))
        .collect()
}

async fn blocking<T: Send + 'static, E: Into<NodeError> + Send + 'static>(
    f: impl FnOnce() -> Result<T, E> + Send + 'static,
) -> Result<T, Status> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| Status::internal(format!("store task failed: {e}")))?
        .map_err(|e| e.into().status())
}

/// A leased block's bytes, owned by `Bytes`: Get stream chunks are slices of
/// the RAM arena, not copies. The lease (the block cannot be evicted or its
/// extent reused) ends when tonic has encoded the last chunk and dropped it.
struct LeasedBytes(ReadLease);

impl AsRef<[u8]> for LeasedBytes {
    fn as_ref(&self) -> &[u8] {
        self.0.bytes()
    }
}

/// `body` cut into stream chunks of [`STREAM_CHUNK`] bytes, without copying.
pub(crate) fn chunks(body: &Bytes) -> impl Iterator<Item = Bytes> + '_ {
    (0..body.len())
        .step_by(STREAM_CHUNK)
        .map(move |at| body.slice(at..(at + STREAM_CHUNK).min(body.len())))
}

type GetStream = Pin<Box<dyn Stream<Item = Result<GetResponse, Status>> + Send + 'static>>;

#[tonic::async_trait]
impl CacheService for CacheServer {
    async fn lookup(
        &self,
        req: Request<LookupRequest>,
    ) -> Result<Response<LookupResponse>, Status> {
        let req = req.into_inner();
        let keys = parse_keys(&req.keys)?;
        let found = self.store.lookup(&keys);
        let node_id = self.store.config().node_id.clone();
        let holders = if req.with_holders {
            found
                .iter()
                .map(|i| Holder {
                    node_id: node_id.clone(),
                    tier: i.tier as i32,
                    size: i.len,
                    checksum: i.checksum,
                })
                .collect()
        } else {
            Vec::new()
        };
        Ok(Response::new(LookupResponse {
            prefix_blocks: found.len() as u32,
            holders,
        }))
    }

    async fn exists(
        &self,
        req: Request<ExistsRequest>,
    ) -> Result<Response<ExistsResponse>, Status> {
        let keys = parse_keys(&req.into_inner().keys)?;
        Ok(Response::new(ExistsResponse {
            present: self.store.exists(&keys),
        }))
    }

    async fn put(
        &self,
        req: Request<Streaming<PutRequest>>,
    ) -> Result<Response<PutResponse>, Status> {
        // A tenant's put lands under its scoped key (`tenant_scope.rs`).
        let scope = req.extensions().get::<PutKeyScope>().cloned();
        let owner = put_owner(&req).map(|name| self.store.owner(&name));
        let mut stream = req.into_inner();
        let first = stream
            .message()
            .await?
            .ok_or_else(|| Status::invalid_argument("empty put stream"))?;
        let header = first
            .header
            .ok_or_else(|| Status::invalid_argument("first put message carries no header"))?;
        let mut key = BlockKey::from_slice(&header.key)?;
        if let Some(scope) = &scope {
            key = scope.apply(key);
        }
        let layout_pb = header
            .layout
            .ok_or_else(|| Status::invalid_argument("put header has no layout"))?;
        let layout = KvLayout::try_from(&layout_pb)?;
        let size = header.size;
        let max = self.store.config().max_block_size.as_u64();
        if size == 0 || size > max {
            return Err(Status::invalid_argument(format!(
                "block size {size} is outside 1..={max} (max_block_size)"
            )));
        }
        let too_long = |n: u64| put_too_long(n, size);
        let short = |n: u64| put_short(n, size);
        // Settle the common bad cases before reserving room (which may evict):
        // an inline put is checked whole, a streamed one must have a second message.
        let mut received = first.data.len() as u64;
        let mut second = None;
        if received > size {
            return Err(too_long(received));
        } else if received == size {
            if let Some(m) = stream.message().await? {
                if !m.data.is_empty() {
                    return Err(too_long(received + m.data.len() as u64));
                }
            }
        } else {
            second = Some(stream.message().await?.ok_or_else(|| short(received))?);
        }
        let store = self.store.clone();
        let (tokens, durable) = (header.tokens, header.durable);
        let outcome = blocking(move || store.reserve(key, layout, size, tokens, durable)).await?;
        let mut reservation = match outcome {
            ReserveOutcome::Present(p) => {
                // Idempotent: consume and check the stream, store nothing.
                drain_put(&mut stream, second, received, size).await?;
                return Ok(Response::new(PutResponse {
                    already_present: p.already_present,
                    tier: p.tier as i32,
                }));
            }
            ReserveOutcome::Reserved(r) => r,
        };
        if let Some(owner) = owner {
            reservation.set_owner(owner);
        }
        // Dropping `reservation` on any error below revokes it.
        reservation.write(0, &first.data).map_err(store_status)?;
        let mut next = second;
        while let Some(m) = next.take() {
            let at = received;
            received += m.data.len() as u64;
            if received > size {
                return Err(too_long(received));
            }
            reservation.write(at, &m.data).map_err(store_status)?;
            next = stream.message().await?;
        }
        if received != size {
            return Err(short(received));
        }
        let checksum = header.checksum;
        let p = blocking(move || reservation.commit(checksum)).await?;
        Ok(Response::new(PutResponse {
            already_present: p.already_present,
            tier: p.tier as i32,
        }))
    }

    type GetStream = GetStream;

    async fn get(&self, req: Request<GetRequest>) -> Result<Response<GetStream>, Status> {
        let req = req.into_inner();
        let key = BlockKey::from_slice(&req.key)?;
        let store = self.store.clone();
        let node_id = self.store.config().node_id.clone();
        let messages = blocking(move || {
            let Some(lease) = store.lease(&key)? else {
                return Err(NodeError::Store(StoreError::NotFound { key }));
            };
            let range = get_range(req.offset, req.length, lease.bytes().len() as u64)?;
            let info = *lease.info();
            let mut out = vec![GetResponse {
                header: Some(GetHeader {
                    size: info.len,
                    layout: Some((&info.layout).into()),
                    checksum: info.checksum,
                    node_id,
                    tier: info.tier as i32,
                }),
                data: Default::default(),
            }];
            let body = Bytes::from_owner(LeasedBytes(lease)).slice(range);
            out.extend(chunks(&body).map(|data| GetResponse { header: None, data }));
            Ok(out)
        })
        .await?;
        let s = futures::stream::iter(messages.into_iter().map(Ok)).boxed();
        Ok(Response::new(s))
    }

    async fn remove(
        &self,
        req: Request<RemoveRequest>,
    ) -> Result<Response<RemoveResponse>, Status> {
        let keys = parse_keys(&req.into_inner().keys)?;
        let store = self.store.clone();
        let removed = blocking(move || store.remove(&keys)).await?;
        Ok(Response::new(RemoveResponse {
            removed: removed as u32,
        }))
    }

    async fn pin(&self, req: Request<PinRequest>) -> Result<Response<PinResponse>, Status> {
        let req = req.into_inner();
        let keys = parse_keys(&req.keys)?;
        let ttl = (req.ttl_ms > 0).then(|| Duration::from_millis(req.ttl_ms));
        Ok(Response::new(PinResponse {
            pinned: self.store.pin(&keys, ttl) as u32,
        }))
    }

    async fn unpin(&self, req: Request<UnpinRequest>) -> Result<Response<UnpinResponse>, Status> {
        let keys = parse_keys(&req.into_inner().keys)?;
        Ok(Response::new(UnpinResponse {
            unpinned: self.store.unpin(&keys) as u32,
        }))
    }

    async fn stats(&self, _req: Request<StatsRequest>) -> Result<Response<StatsResponse>, Status> {
        Ok(Response::new(crate::wire::stats_to_proto(
            self.store.stats(),
        )))
    }

    async fn capacity(
        &self,
        _req: Request<CapacityRequest>,
    ) -> Result<Response<CapacityResponse>, Status> {
        Ok(Response::new(crate::wire::capacity_to_proto(
            self.store.capacity(),
        )))
    }

    async fn cluster_status(
        &self,
        _req: Request<ClusterStatusRequest>,
    ) -> Result<Response<ClusterStatusResponse>, Status> {
        let s = crate::wire::stats_to_proto(self.store.stats());
        let lookups = s.hit_blocks + s.miss_blocks;
        let hit_ratio = if lookups == 0 {
            0.0
        } else {
            s.hit_blocks as f64 / lookups as f64
        };
        Ok(Response::new(ClusterStatusResponse {
            nodes: vec![NodeStatus {
                node_id: s.node_id,
                grpc_addr: self.grpc_addr.clone(),
                transfer_addr: String::new(),
                alive: true,
                tiers: s.tiers,
                hit_ratio,
                served_blocks: s.served_blocks,
                transfer_in_bytes: s.transfer_in_bytes,
                transfer_out_bytes: s.transfer_out_bytes,
            }],
        }))
    }
}

/// The byte range a GetRequest asks for (`length` 0 = to the end), checked
/// against the block's size.
pub(crate) fn get_range(
    offset: u64,
    length: u64,
    total: u64,
) -> Result<std::ops::Range<usize>, NodeError> {
    let end = if length == 0 {
        Some(total)
    } else {
        offset.checked_add(length)
    };
    match end {
        Some(end) if offset <= end && end <= total => Ok(offset as usize..end as usize),
        _ => Err(NodeError::Store(StoreError::InvalidArgument(
            BadArgument::RangeOutsideBlock {
                offset,
                len: length,
                block_len: total,
            },
        ))),
    }
}

/// Read the rest of a put stream whose block is already present: the data
/// must still add up to the declared `size` (nothing is stored).
async fn drain_put(
    stream: &mut Streaming<PutRequest>,
    second: Option<PutRequest>,
    mut received: u64,
    size: u64,
) -> Result<(), Status> {
    let mut next = second;
    while let Some(m) = next.take() {
        received += m.data.len() as u64;
        if received > size {
            return Err(put_too_long(received, size));
        }
        next = stream.message().await?;
    }
    if received != size {
        return Err(put_short(received, size));
    }
    Ok(())
}

fn put_too_long(n: u64, size: u64) -> Status {
    Status::invalid_argument(format!(
        "put data is longer than the declared size {size} ({n}+ bytes)"
    ))
}

fn put_short(n: u64, size: u64) -> Status {
    Status::invalid_argument(format!("put data is {n} bytes, the header declared {size}"))
}
