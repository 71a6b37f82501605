//! The internal gRPC services a cluster node serves to its peers:
//! `DirectoryService` (its directory shard: Announce, Withdraw, Locate,
//! ReportStale) and `HolderService` (read leases for remote reads).

use std::sync::Arc;
use std::time::Duration;

use kvfabric_proto::internal::v1::directory_service_server::DirectoryService;
use kvfabric_proto::internal::v1::holder_service_server::HolderService;
use kvfabric_proto::internal::v1::{
    AnnounceRequest, AnnounceResponse, LeaseManyRequest, LeaseManyResponse, LeaseRequest,
    LeaseResponse, LocateRequest, LocateResponse, Located, ReleaseManyRequest, ReleaseManyResponse,
    ReleaseRequest, ReleaseResponse, StaleRequest, StaleResponse, WithdrawRequest,
    WithdrawResponse,
};
use tonic::{Request, Response, Status};

use crate::cluster::holder::MAX_LEASE;
use crate::cluster::node_state::{holder_entry, holder_pb, ClusterNode};
use crate::cluster::security::authorize;
use kvfabric_store::keys::BlockKey;

fn parse_keys(keys: &[Vec<u8>]) -> Result<Vec<BlockKey>, Status> {
    keys.iter()
        .map(|k| BlockKey::from_slice(k).map_err(Status::from))
        .collect()
}

/// `DirectoryService` over a node's shard.
pub struct DirectoryRpc(pub Arc<ClusterNode>);

#[tonic::async_trait]
impl DirectoryService for DirectoryRpc {
    async fn announce(
        &self,
        req: Request<AnnounceRequest>,
    ) -> Result<Response<AnnounceResponse>, Status> {
        authorize(self.0.identity(), &req, &req.get_ref().node_id)?;
        let req = req.into_inner();
        let mut entries = Vec::with_capacity(req.entries.len());
        for e in &req.entries {
            let key = BlockKey::from_slice(&e.key)?;
            let holder = e
                .holder
                .as_ref()
                .ok_or_else(|| Status::invalid_argument("directory entry without holder"))?;
            if holder.node_id != req.node_id {
                return Err(Status::invalid_argument(format!(
                    "{} announced a block for {}",
                    req.node_id, holder.node_id
                )));
            }
            entries.push((key, holder_entry(holder)));
        }
        // Accepted even when this node's view does not (yet) make it the owner:
        // views converge, and the next view change trims what it does not own.
        let accepted = self.0.shard_announce(entries) as u32;
        let mut resp = Response::new(AnnounceResponse { accepted });
        // Holders watch it: a changed epoch means entries were lost here.
        resp.metadata_mut().insert(
            crate::cluster::announce::EPOCH_HEADER,
            self.0.directory_epoch().into(),
        );
        Ok(resp)
    }

    async fn withdraw(
        &self,
        req: Request<WithdrawRequest>,
    ) -> Result<Response<WithdrawResponse>, Status> {
        authorize(self.0.identity(), &req, &req.get_ref().node_id)?;
        let req = req.into_inner();
        let keys = parse_keys(&req.keys)?;
        let removed = self.0.shard_withdraw(&req.node_id, &keys) as u32;
        Ok(Response::new(WithdrawResponse { removed }))
    }

    async fn locate(
        &self,
        req: Request<LocateRequest>,
    ) -> Result<Response<LocateResponse>, Status> {
        authorize(self.0.identity(), &req, "")?;
        let req = req.into_inner();
        let keys = parse_keys(&req.keys)?;
        let found = self.0.shard_locate(&keys);
        if req.lookup {
            self.0.feed_order_lookup(&keys, &found);
        }
        let located = found
            .into_iter()
            .map(|hs| Located {
                holders: hs.iter().map(holder_pb).collect(),
            })
            .collect();
        Ok(Response::new(LocateResponse { located }))
    }

    async fn report_stale(
        &self,
        req: Request<StaleRequest>,
    ) -> Result<Response<StaleResponse>, Status> {
        // Any member may report another's entry stale (it failed to read it).
        authorize(self.0.identity(), &req, "")?;
        let req = req.into_inner();
        let keys = parse_keys(&req.keys)?;
        let n = self.0.shard_withdraw(&req.node_id, &keys);
        tracing::info!(holder = %req.node_id, entries = n, "stale directory entries dropped");
        Ok(Response::new(StaleResponse {}))
    }
}

/// `HolderService`: leases blocks of this node's RAM arena for remote readers.
pub struct HolderRpc(pub Arc<ClusterNode>);

impl HolderRpc {
    /// Lease `keys` for `reader` (secured: with a capability issued to it).
    async fn lease_keys(
        &self,
        keys: &[Vec<u8>],
        ttl_ms: u64,
        reader: Option<&str>,
    ) -> Result<Vec<LeaseResponse>, Status> {
        let keys = parse_keys(keys)?;
        let ttl = Duration::from_millis(ttl_ms.max(1)).min(MAX_LEASE);
        let leased = self.0.lease_for_peer(&keys, ttl).await;
        let transfer = self.0.transfer();
        Ok(leased
            .into_iter()
            .map(|l| match l {
                None => LeaseResponse::default(),
                Some((lease_id, segment, offset, info)) => LeaseResponse {
                    lease_id,
                    segment_id: segment.0,
                    offset,
                    size: info.len,
                    checksum: info.checksum,
                    layout: Some((&info.layout).into()),
                    capability: reader.map_or_else(Vec::new, |r| {
                        let cap =
                            transfer.issue_capability(lease_id, segment, offset, info.len, ttl, r);
                        cap.encode().to_vec()
                    }),
                },
            })
            .collect())
    }

    /// The reader a lease request is for: secured, the caller's certificate
    /// id (a request claiming another is refused); mode none, nobody.
    fn reader<T>(&self, req: &Request<T>, claimed: &str) -> Result<Option<String>, Status> {
        let id = authorize(self.0.identity(), req, claimed)?;
        Ok(self.0.identity().map(|_| id))
    }
}

#[tonic::async_trait]
impl HolderService for HolderRpc {
    async fn lease(&self, req: Request<LeaseRequest>) -> Result<Response<LeaseResponse>, Status> {
        let reader = self.reader(&req, &req.get_ref().reader)?;
        let req = req.into_inner();
        let mut leases = self
            .lease_keys(&[req.key], req.ttl_ms, reader.as_deref())
            .await?;
        Ok(Response::new(leases.pop().unwrap_or_default()))
    }

    async fn release(
        &self,
        req: Request<ReleaseRequest>,
    ) -> Result<Response<ReleaseResponse>, Status> {
        authorize(self.0.identity(), &req, "")?;
        self.0.release_leases(&[req.into_inner().lease_id]);
        Ok(Response::new(ReleaseResponse {}))
    }

    async fn lease_many(
        &self,
        req: Request<LeaseManyRequest>,
    ) -> Result<Response<LeaseManyResponse>, Status> {
        let reader = self.reader(&req, &req.get_ref().reader)?;
        let req = req.into_inner();
        let leases = self
            .lease_keys(&req.keys, req.ttl_ms, reader.as_deref())
            .await?;
        Ok(Response::new(LeaseManyResponse { leases }))
    }

    async fn release_many(
        &self,
        req: Request<ReleaseManyRequest>,
    ) -> Result<Response<ReleaseManyResponse>, Status> {
        authorize(self.0.identity(), &req, "")?;
        self.0.release_leases(&req.into_inner().lease_ids);
        Ok(Response::new(ReleaseManyResponse {}))
    }
}
