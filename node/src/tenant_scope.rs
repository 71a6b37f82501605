//! Tenants on the gRPC CacheService: who is calling, and which keys are theirs.
//!
//! [`authenticate`] is a tonic interceptor: the `authorization` metadata
//! (`Bearer <key>`) is checked against the node's tenants file
//! (`[node] tenants_file`) and the caller's [`Identity`] is put in the
//! request's extensions; a missing or unknown key is `UNAUTHENTICATED` with
//! the reason. [`TenantScoped`] wraps the CacheService (single node or
//! cluster-wide) and re-keys every key a tenant that is not `trusted` sends
//! with [`scope_key`] (keyed by its namespace) before the service sees it,
//! so tenant B's `Get`, `Lookup`, `Put`, `Remove` or `Pin` of a key can only
//! ever reach B's blocks: a key computed from tenant A's prompt, or copied
//! from A's traffic, names a different block when B sends it. A put's key
//! travels in its stream's first message, which the wrapper cannot rewrite;
//! it passes [`PutKeyScope`] in the extensions and `CacheServer::put`
//! applies it.
//!
//! Trusted tenants (engines in remote mode, operators' tools) and
//! single-tenant mode use keys as sent. Node-to-node calls (Stats, and the
//! local-only `Remove`/`Pin`/`Unpin` fan-out) carry no tenant key: on a
//! secured cluster the caller's node certificate admits them; in mode
//! `none` a node with a tenants file refuses the fan-out (it reaches only
//! the receiving node), and a cluster status forwards its caller's key.

use std::sync::Arc;

use kvfabric_proto::v1::cache_service_server::CacheService;
use kvfabric_proto::v1::{
    CapacityRequest, CapacityResponse, ClusterStatusRequest, ClusterStatusResponse, ExistsRequest,
    ExistsResponse, GetRequest, LookupRequest, LookupResponse, PinRequest, PinResponse, PutRequest,
    PutResponse, RemoveRequest, RemoveResponse, StatsRequest, StatsResponse, UnpinRequest,
    UnpinResponse,
};
use kvfabric_tenants::namespace::scope_key;
use kvfabric_tenants::{Identity, TenantGate};
use kvfabric_transfer::security::NodeIdentity;
use tonic::{Request, Response, Status, Streaming};

use kvfabric_store::keys::BlockKey;

/// The namespace a put's key is scoped to (set by [`TenantScoped`]).
#[derive(Clone, Debug)]
pub struct PutKeyScope(pub Arc<[u8]>);

impl PutKeyScope {
    /// The key `key` is stored under.
    pub fn apply(&self, key: BlockKey) -> BlockKey {
        BlockKey(scope_key(&self.0, key.as_bytes()))
    }
}

/// Metadata a trusted caller (an engine putting a tenant's blocks) names the
/// tiers' share owner of a put with (a tenant's name, or `shared:<name>`).
pub const OWNER_METADATA: &str = "x-kvfabric-owner";

/// Who a put's block counts to in the tiers' shares (`shares`): the calling
/// tenant's owner; a trusted tenant may name another in
/// [`OWNER_METADATA`]. `None`: nobody (single-tenant mode).
pub fn put_owner<T>(req: &Request<T>) -> Option<String> {
    let who = req.extensions().get::<Identity>()?;
    let tenant = who.tenant()?;
    let named = req
        .metadata()
        .get(OWNER_METADATA)
        .and_then(|v| v.to_str().ok())
        .filter(|v| tenant.trusted && !v.is_empty() && v.len() <= 80);
    Some(named.map_or_else(|| tenant.owner.to_string(), str::to_string))
}

/// The interceptor: authenticate the `authorization` metadata with `gate`.
/// A call without one from a peer whose mutual-TLS certificate names a node
/// (a cluster member's Stats, or its local-only Remove/Pin/Unpin fan-out) is
/// [`Identity::cluster_node`]; a key, when sent, always decides.
pub fn authenticate(
    gate: TenantGate,
    identity: Option<Arc<NodeIdentity>>,
) -> impl FnMut(Request<()>) -> Result<Request<()>, Status> + Clone {
    move |mut req: Request<()>| {
        crate::cluster::security::refuse_revoked(identity.as_deref(), &req)?;
        let auth = req
            .metadata()
            .get("authorization")
            .map(|v| v.to_str().unwrap_or(""));
        if auth.is_none() && crate::cluster::security::caller(&req).is_some() {
            req.extensions_mut().insert(Identity::cluster_node());
            return Ok(req);
        }
        match gate.authenticate(auth) {
            Ok(who) => {
                req.extensions_mut().insert(who);
                Ok(req)
            }
            Err(d) => Err(Status::unauthenticated(d.message())),
        }
    }
}

/// A CacheService whose keys are scoped to the calling tenant.
pub struct TenantScoped<S> {
    inner: S,
}

impl<S> TenantScoped<S> {
    pub fn new(inner: S) -> Self {
        TenantScoped { inner }
    }
}

/// The caller's key scope: `None` = keys used as sent.
fn scope_of<T>(req: &Request<T>) -> Option<Arc<[u8]>> {
    req.extensions()
        .get::<Identity>()
        .and_then(|who| who.key_scope().map(Arc::from))
}

fn scoped_key(scope: &[u8], key: &mut Vec<u8>) -> Result<(), Status> {
    let k = BlockKey::from_slice(key)?;
    *key = scope_key(scope, k.as_bytes()).to_vec();
    Ok(())
}

/// `req` with the keys `keys` picks re-keyed to the caller's scope.
fn rekey<T>(
    req: Request<T>,
    keys: impl FnOnce(&mut T) -> Vec<&mut Vec<u8>>,
) -> Result<Request<T>, Status> {
    let Some(scope) = scope_of(&req) else {
        return Ok(req);
    };
    let (meta, ext, mut msg) = req.into_parts();
    for k in keys(&mut msg) {
        scoped_key(&scope, k)?;
    }
    Ok(Request::from_parts(meta, ext, msg))
}

#[tonic::async_trait]
impl<S: CacheService> CacheService for TenantScoped<S> {
    async fn lookup(
        &self,
        req: Request<LookupRequest>,
    ) -> Result<Response<LookupResponse>, Status> {
        let req = rekey(req, |m| m.keys.iter_mut().collect())?;
        self.inner.lookup(req).await
    }

    async fn exists(
        &self,
        req: Request<ExistsRequest>,
    ) -> Result<Response<ExistsResponse>, Status> {
        let req = rekey(req, |m| m.keys.iter_mut().collect())?;
        self.inner.exists(req).await
    }

    async fn put(
        &self,
        mut req: Request<Streaming<PutRequest>>,
    ) -> Result<Response<PutResponse>, Status> {
        if let Some(scope) = scope_of(&req) {
            req.extensions_mut().insert(PutKeyScope(scope));
        }
        self.inner.put(req).await
    }

    type GetStream = S::GetStream;

    async fn get(&self, req: Request<GetRequest>) -> Result<Response<S::GetStream>, Status> {
        let req = rekey(req, |m| vec![&mut m.key])?;
        self.inner.get(req).await
    }

    async fn remove(
        &self,
        req: Request<RemoveRequest>,
    ) -> Result<Response<RemoveResponse>, Status> {
        let req = rekey(req, |m| m.keys.iter_mut().collect())?;
        self.inner.remove(req).await
    }

    async fn pin(&self, req: Request<PinRequest>) -> Result<Response<PinResponse>, Status> {
        let req = rekey(req, |m| m.keys.iter_mut().collect())?;
        self.inner.pin(req).await
    }

    async fn unpin(&self, req: Request<UnpinRequest>) -> Result<Response<UnpinResponse>, Status> {
        let req = rekey(req, |m| m.keys.iter_mut().collect())?;
        self.inner.unpin(req).await
    }

    async fn stats(&self, req: Request<StatsRequest>) -> Result<Response<StatsResponse>, Status> {
        self.inner.stats(req).await
    }

    async fn capacity(
        &self,
        req: Request<CapacityRequest>,
    ) -> Result<Response<CapacityResponse>, Status> {
        self.inner.capacity(req).await
    }

    async fn cluster_status(
        &self,
        req: Request<ClusterStatusRequest>,
    ) -> Result<Response<ClusterStatusResponse>, Status> {
        self.inner.cluster_status(req).await
    }
}
