//! A small client of a node's CacheService for tools, the remote connector
//! and tests (`kvfabric ctl`, the cluster tests and bench): connect with a
//! timeout (over mutual TLS when given an identity), put a whole block, get
//! a whole block (with the caller's metadata: API key, owner), and tell a caller without a certificate that the node it
//! failed to reach wants one, or a client with one that the node speaks
//! plaintext ([`check_tls`]). Callers need no gRPC
//! crates of their own.

use std::time::Duration;

use bytes::Bytes;
use kvfabric_proto::v1::cache_service_client::CacheServiceClient;
use kvfabric_proto::v1::{GetHeader, GetRequest, PutHeader, PutRequest, PutResponse};
use tonic::metadata::MetadataMap;
use tonic::transport::{Channel, Endpoint};
use tonic::{Extensions, Request};

use kvfabric_transfer::security::NodeIdentity;

use crate::cache_service::chunks;
use crate::{BadNodeArgument, BadNodeConfig, NodeError};
use kvfabric_store::keys::{BlockKey, KvLayout};

/// A CacheService client on one channel.
pub type CacheClient = CacheServiceClient<Channel>;

/// Connect to the node at `addr` (`host:port` or `http://host:port`).
pub async fn connect(addr: &str, timeout: Duration) -> Result<CacheClient, NodeError> {
    connect_with(addr, timeout, None).await
}

/// Connect to the node at `addr`, over mutual TLS with `identity` when
/// given (a secured cluster refuses a client without a certificate of its CA).
pub async fn connect_with(
    addr: &str,
    timeout: Duration,
    identity: Option<&NodeIdentity>,
) -> Result<CacheClient, NodeError> {
    let ch = endpoint(addr, timeout, identity)?
        .connect()
        .await
        .map_err(|source| NodeError::Connect {
            addr: addr.to_string(),
            source,
        })?;
    Ok(client(ch))
}

/// A client of the node at `addr` that connects on first use (so a caller
/// can start before the node does); every call is bounded by `timeout`.
pub fn connect_lazy(addr: &str, timeout: Duration) -> Result<CacheClient, NodeError> {
    connect_lazy_with(addr, timeout, None)
}

/// [`connect_lazy`], over mutual TLS with `identity` when given.
pub fn connect_lazy_with(
    addr: &str,
    timeout: Duration,
    identity: Option<&NodeIdentity>,
) -> Result<CacheClient, NodeError> {
    Ok(client(endpoint(addr, timeout, identity)?.connect_lazy()))
}

/// `Ok` unless the node at `addr` and this client disagree about TLS: a
/// client without a certificate (`client_tls` false) of a node that speaks
/// TLS gets [`BadNodeConfig::TlsRequired`], a client with one of a plaintext
/// node [`BadNodeConfig::TlsNotSpoken`], each naming the settings to change. For
/// a caller whose call failed, to say why: either mismatch shows in tonic
/// only as a bare "transport error" (a TLS server answers plaintext HTTP/2
/// with an alert and closes; a plaintext one closes on a ClientHello).
/// Unreachable or silent nodes are `Ok`: the caller's own error says more.
pub async fn check_tls(addr: &str, timeout: Duration, client_tls: bool) -> Result<(), NodeError> {
    let addr_owned = || addr.to_string();
    match (speaks_tls(addr, timeout).await, client_tls) {
        (Some(true), false) => Err(NodeError::Config(BadNodeConfig::TlsRequired {
            addr: addr_owned(),
        })),
        (Some(false), true) => Err(NodeError::Config(BadNodeConfig::TlsNotSpoken {
            addr: addr_owned(),
        })),
        _ => Ok(()),
    }
}

/// Whether the server at `addr` speaks TLS, from its answer to what a
/// plaintext gRPC client sends first (the HTTP/2 preface): a TLS alert
/// record (content type 21, version 3.x) is what a TLS server does with
/// bytes that are not TLS; anything else is a plaintext server. None: no
/// answer within `timeout`.
async fn speaks_tls(addr: &str, timeout: Duration) -> Option<bool> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let host = addr.split_once("://").map_or(addr, |(_, rest)| rest);
    let host = host.trim_end_matches('/');
    let probe = async {
        let mut s = tokio::net::TcpStream::connect(host).await.ok()?;
        s.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
            .await
            .ok()?;
        let mut head = [0u8; 2];
        s.read_exact(&mut head).await.ok()?;
        Some(head == [0x15, 0x03])
    };
    tokio::time::timeout(timeout, probe).await.ok().flatten()
}

fn endpoint(
    addr: &str,
    timeout: Duration,
    identity: Option<&NodeIdentity>,
) -> Result<Endpoint, NodeError> {
    let url = match (addr.contains("://"), identity.is_some()) {
        (true, _) => addr.to_string(),
        (false, true) => format!("https://{addr}"),
        (false, false) => format!("http://{addr}"),
    };
    let e = Endpoint::from_shared(url)
        .map_err(|e| {
            NodeError::InvalidArgument(BadNodeArgument::Address {
                addr: addr.to_string(),
                source: e,
            })
        })?
        .connect_timeout(timeout)
        .timeout(timeout);
    let e = crate::node_server::grpc_endpoint(e);
    let Some(id) = identity else {
        return Ok(e);
    };
    e.tls_config(crate::cluster::security::client_tls(id, None))
        .map_err(|e| {
            NodeError::Config(BadNodeConfig::Tls {
                what: "tls",
                source: e,
            })
        })
}

fn client(ch: Channel) -> CacheClient {
    CacheServiceClient::new(ch)
        .max_decoding_message_size(256 << 20)
        .max_encoding_message_size(256 << 20)
}

/// Put one whole block (streamed in 1 MiB chunks).
pub async fn put_block(
    client: &mut CacheClient,
    key: &BlockKey,
    layout: &KvLayout,
    data: &[u8],
    durable: bool,
) -> Result<PutResponse, tonic::Status> {
    put_block_with(client, key, layout, data, durable, MetadataMap::new()).await
}

/// [`put_block`] with `meta` on the request (a node with a tenants file
/// wants `authorization`; a trusted caller may name the block's owner in
/// `x-kvfabric-owner`).
pub async fn put_block_with(
    client: &mut CacheClient,
    key: &BlockKey,
    layout: &KvLayout,
    data: &[u8],
    durable: bool,
    meta: MetadataMap,
) -> Result<PutResponse, tonic::Status> {
    let header = PutHeader {
        key: key.as_bytes().to_vec(),
        layout: Some(layout.into()),
        size: data.len() as u64,
        checksum: None,
        durable,
        tokens: 0,
    };
    // One copy of the block; the messages are slices of it.
    let data = Bytes::copy_from_slice(data);
    let mut parts = chunks(&data);
    let mut msgs = vec![PutRequest {
        header: Some(header),
        data: parts.next().unwrap_or_default(),
    }];
    msgs.extend(parts.map(|data| PutRequest { header: None, data }));
    let req = Request::from_parts(meta, Extensions::default(), futures::stream::iter(msgs));
    Ok(client.put(req).await?.into_inner())
}

/// Get one whole block: None when no node holds it (NOT_FOUND).
pub async fn get_block(
    client: &mut CacheClient,
    key: &BlockKey,
) -> Result<Option<(GetHeader, Vec<u8>)>, tonic::Status> {
    get_block_with(client, key, MetadataMap::new()).await
}

/// [`get_block`] with `meta` on the request (`authorization`).
pub async fn get_block_with(
    client: &mut CacheClient,
    key: &BlockKey,
    meta: MetadataMap,
) -> Result<Option<(GetHeader, Vec<u8>)>, tonic::Status> {
    let msg = GetRequest {
        key: key.as_bytes().to_vec(),
        offset: 0,
        length: 0,
    };
    let req = Request::from_parts(meta, Extensions::default(), msg);
    let mut stream = match client.get(req).await {
        Ok(s) => s.into_inner(),
        Err(s) if s.code() == tonic::Code::NotFound => return Ok(None),
        Err(s) => return Err(s),
    };
    let mut header = None;
    let mut data = Vec::new();
    while let Some(m) = stream.message().await? {
        if let Some(h) = m.header {
            data.reserve(h.size as usize);
            header = Some(h);
        }
        data.extend_from_slice(&m.data);
    }
    match header {
        Some(h) => Ok(Some((h, data))),
        None => Err(tonic::Status::internal("get stream carried no header")),
    }
}

/// True when `status` is a miss (NOT_FOUND), as opposed to a failed request.
pub fn is_miss(status: &tonic::Status) -> bool {
    status.code() == tonic::Code::NotFound
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// What rustls answers the HTTP/2 preface with: a fatal decode_error alert.
    const ALERT: &[u8] = &[0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x32];

    /// A one-connection server that reads the client's first bytes and answers `reply`.
    async fn answering(reply: &'static [u8]) -> String {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap().to_string();
        tokio::spawn(async move {
            let (mut s, _) = l.accept().await.unwrap();
            let mut buf = [0u8; 24];
            let _ = s.read_exact(&mut buf).await;
            let _ = s.write_all(reply).await;
        });
        addr
    }

    #[tokio::test]
    async fn a_tls_mismatch_either_way_is_a_typed_error_naming_the_settings() {
        let tls = answering(ALERT).await;
        let err = check_tls(&tls, Duration::from_secs(2), false)
            .await
            .unwrap_err();
        assert!(
            matches!(&err, NodeError::Config(BadNodeConfig::TlsRequired { addr }) if *addr == tls),
            "{err:?}"
        );
        let msg = err.to_string();
        assert!(
            msg.contains("--tls-cert") && msg.contains("KVFABRIC_TLS_CERT"),
            "{msg}"
        );
        // A TLS client of that node is fine; of a plaintext gRPC server (an
        // HTTP/2 SETTINGS frame first) it is told the node speaks none.
        let tls_again = answering(ALERT).await;
        assert!(check_tls(&tls_again, Duration::from_secs(2), true)
            .await
            .is_ok());
        let h2 = || answering(&[0x00, 0x00, 0x00, 0x04, 0x00, 0x00, 0x00, 0x00, 0x00]);
        let plain = h2().await;
        assert!(check_tls(&plain, Duration::from_secs(2), false)
            .await
            .is_ok());
        let plain = h2().await;
        let err = check_tls(&plain, Duration::from_secs(2), true)
            .await
            .unwrap_err();
        assert!(
            matches!(&err, NodeError::Config(BadNodeConfig::TlsNotSpoken { addr }) if *addr == plain),
            "{err:?}"
        );
        // A closed port says nothing either way.
        let closed = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().to_string()
        };
        assert!(check_tls(&closed, Duration::from_secs(2), false)
            .await
            .is_ok());
        assert!(check_tls(&closed, Duration::from_secs(2), true)
            .await
            .is_ok());
        // An address with a scheme, as the connect functions take it.
        let tls = answering(ALERT).await;
        let with_scheme = format!("https://{tls}");
        assert!(check_tls(&with_scheme, Duration::from_secs(2), false)
            .await
            .is_err());
    }
}
