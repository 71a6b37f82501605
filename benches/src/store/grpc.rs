//! The gRPC phase of `kvfabric bench store`: a standalone node in this
//! process, `clients` connections putting then getting every block.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::bail;
use kvfabric_node::cluster::client::CacheClient;
use kvfabric_proto::v1::{GetRequest, PutHeader, PutRequest};
use kvfabric_store::{NodeConfig, Registry, Store};
use serde_json::{json, Value};

use super::shared::{gbps, key, layout, pct_ms, BLOCK};

/// Put then get every block over gRPC from `clients` connections to a
/// standalone node in this process: throughput and get latency into `out`.
pub(super) fn grpc(
    sources: &[Vec<u8>],
    clients: usize,
    out: &mut serde_json::Map<String, Value>,
) -> anyhow::Result<()> {
    let n = sources.len();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let (url, stop, server) = grpc_node(n).await?;
        let mut cs = Vec::new();
        for _ in 0..clients {
            // The store's own client: the same windows and frame size as the server.
            cs.push(kvfabric_node::cluster::client::connect(&url, Duration::from_secs(60)).await?);
        }
        // Shared, not cloned per put: the timed loop moves no bytes of its own.
        let sources: Arc<Vec<bytes::Bytes>> = Arc::new(
            sources
                .iter()
                .map(|s| bytes::Bytes::copy_from_slice(s))
                .collect(),
        );
        let (put, _) = grpc_phase(&cs, &sources, false).await?;
        let (get, mut lat) = grpc_phase(&cs, &sources, true).await?;
        out.insert("grpc_put_gbps".into(), json!(put));
        out.insert("grpc_get_gbps".into(), json!(get));
        out.insert("grpc_get_p50_ms".into(), json!(pct_ms(&mut lat, 0.5)));
        out.insert("grpc_get_p99_ms".into(), json!(pct_ms(&mut lat, 0.99)));
        let _ = stop.send(());
        server.await??;
        Ok(())
    })
}

/// A standalone RAM node with room for `n` blocks: its gRPC URL, the sender
/// that stops it, its serve task.
async fn grpc_node(
    n: usize,
) -> anyhow::Result<(
    String,
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<Result<(), kvfabric_node::NodeError>>,
)> {
    let cfg = NodeConfig {
        ram_capacity: bytesize::ByteSize::b((n * BLOCK + (64 << 20)) as u64),
        ..Default::default()
    };
    let mut registry = Registry::default();
    let store = Store::open(cfg, &mut registry)?;
    let g = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let h = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}", g.local_addr()?);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(
        kvfabric_node::NodeServer::standalone(store, registry, g, h).serve(async {
            let _ = stopped.await;
        }),
    );
    Ok((url, stop, server))
}

/// Every block once (a get when `get`, else a put), spread over the
/// clients: (GB/s, per-op latencies).
async fn grpc_phase(
    cs: &[CacheClient],
    sources: &Arc<Vec<bytes::Bytes>>,
    get: bool,
) -> anyhow::Result<(f64, Vec<Duration>)> {
    let (n, clients) = (sources.len(), cs.len());
    let tasks: Vec<_> = cs
        .iter()
        .cloned()
        .enumerate()
        .map(|(c, mut client)| {
            let sources = sources.clone();
            tokio::spawn(async move {
                let mut lat = Vec::new();
                for i in (c..sources.len()).step_by(clients) {
                    let t = Instant::now();
                    grpc_op(&mut client, &sources[i], i, get).await?;
                    lat.push(t.elapsed());
                }
                Ok::<_, anyhow::Error>(lat)
            })
        })
        .collect();
    let t = Instant::now();
    let mut lat = Vec::new();
    for task in tasks {
        lat.extend(task.await??);
    }
    Ok((gbps(n * BLOCK, t.elapsed()), lat))
}

/// One get of block `i` (checked for its size) or one put of `source` as it.
async fn grpc_op(
    client: &mut CacheClient,
    source: &bytes::Bytes,
    i: usize,
    get: bool,
) -> anyhow::Result<()> {
    if get {
        let req = GetRequest {
            key: key(i).0.to_vec(),
            offset: 0,
            length: 0,
        };
        let mut s = client.get(req).await?.into_inner();
        let mut got = 0;
        while let Some(m) = s.message().await? {
            got += m.data.len();
        }
        if got != BLOCK {
            bail!("grpc get returned {got} bytes");
        }
    } else {
        let header = PutHeader {
            key: key(i).0.to_vec(),
            layout: Some((&layout()).into()),
            size: BLOCK as u64,
            ..Default::default()
        };
        let msg = PutRequest {
            header: Some(header),
            data: source.clone(),
        };
        client.put(tokio_stream::iter(vec![msg])).await?;
    }
    Ok(())
}
