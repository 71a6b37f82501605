//! In-process clusters for the cluster tests: N nodes on loopback (static
//! peers, tcp transport), each with its own store, gRPC server, directory
//! shard and transfer engine; and a tcp proxy in front of a holder's
//! transfer port that a test can freeze or cut mid-stream (a holder that
//! stalls or dies mid-read). Used by the node's cluster tests.

use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kvfabric_node::cluster::{ClusterConfig, ClusterNode, HolderEntry, ReadTarget};
use kvfabric_node::NodeServer;
use kvfabric_store::{BlockKey, KvLayout, NodeConfig, PutOptions, Registry, Store};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::free_port;

pub use crate::blocks::{data, key, layout};

#[derive(Clone)]
pub struct Options {
    pub ram: u64,
    pub remote_read_timeout_ms: u64,
    pub reconcile_interval_ms: u64,
    /// Static peers: a peer silent this long leaves the view.
    pub failure_timeout_ms: u64,
    /// Directory refresh pace: blocks per chunk, chunks per period.
    pub refresh_chunk_blocks: usize,
    pub refresh_chunks_per_period: usize,
    /// Nodes (by index) whose transfer port peers reach through a [`Proxy`].
    pub proxied: Vec<usize>,
    /// The stores' RAM watermarks (high, low); None: the config's defaults.
    pub watermarks: Option<(f64, f64)>,
    /// Each store's `vram_capacity` (0: none; needs the `cuda` feature, and a
    /// test opens the tier itself with `kvfabric_store::vram::VramTier::open`).
    pub vram: u64,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            ram: 64 << 20,
            remote_read_timeout_ms: 1500,
            reconcile_interval_ms: 1000,
            failure_timeout_ms: 2000,
            refresh_chunk_blocks: 4096,
            refresh_chunks_per_period: 16,
            proxied: Vec::new(),
            watermarks: None,
            vram: 0,
        }
    }
}

pub struct Cluster {
    pub nodes: Vec<Arc<ClusterNode>>,
    /// proxies[i]: the proxy in front of node i's transfer port, if proxied.
    pub proxies: Vec<Option<Proxy>>,
    stops: Vec<tokio::sync::oneshot::Sender<()>>,
    peers: Vec<String>,
    grpc_ports: Vec<u16>,
    opts: Options,
}

impl Cluster {
    /// Nodes "n0", "n1", ... that all see each other.
    pub async fn start(n: usize, opts: Options) -> Cluster {
        let ports: Vec<(u16, u16)> = (0..n).map(|_| (free_port(), free_port())).collect();
        let mut proxies = Vec::new();
        for (i, (_, t)) in ports.iter().enumerate() {
            proxies.push(if opts.proxied.contains(&i) {
                Some(Proxy::start(format!("127.0.0.1:{t}")).await)
            } else {
                None
            });
        }
        let peers: Vec<String> = ports
            .iter()
            .enumerate()
            .map(|(i, (g, t))| {
                let transfer = match &proxies[i] {
                    Some(p) => p.addr.clone(),
                    None => format!("127.0.0.1:{t}"),
                };
                format!("n{i}=127.0.0.1:{g}={transfer}")
            })
            .collect();
        let mut nodes = Vec::new();
        let mut stops = Vec::new();
        for (i, (g, t)) in ports.iter().enumerate() {
            let grpc = TcpListener::bind(("127.0.0.1", *g))
                .await
                .expect("grpc bind");
            let (node, stop) = start_node(i, &peers, grpc, format!("127.0.0.1:{t}"), &opts).await;
            nodes.push(node);
            stops.push(stop);
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while nodes.iter().any(|x| x.view().nodes.len() < n) {
            assert!(Instant::now() < deadline, "nodes did not see each other");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // Let each node's announcer handle the view change (a sync) before
        // the test starts counting on what was or was not announced.
        tokio::time::sleep(Duration::from_millis(300)).await;
        Cluster {
            nodes,
            proxies,
            stops,
            grpc_ports: ports.iter().map(|(g, _)| *g).collect(),
            peers,
            opts,
        }
    }

    /// Stop node `i` and start it again on its gRPC port with an empty
    /// store and directory (a process restart), quicker than peers notice.
    pub async fn restart(&mut self, i: usize) {
        self.stop(i);
        let deadline = Instant::now() + Duration::from_secs(10);
        let grpc = loop {
            match TcpListener::bind(("127.0.0.1", self.grpc_ports[i])).await {
                Ok(l) => break l,
                Err(e) => assert!(Instant::now() < deadline, "grpc port not freed: {e}"),
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        let (node, stop) = start_node(i, &self.peers, grpc, "127.0.0.1:0".into(), &self.opts).await;
        self.nodes[i] = node;
        self.stops[i] = stop;
    }

    /// Store `keys` (layout `l`) on node `i` and register them with their owners.
    pub async fn put(&self, i: usize, keys: &[BlockKey], l: KvLayout) {
        let store = self.nodes[i].store();
        for k in keys {
            store
                .put(*k, l, &data(k, l.block_bytes()), PutOptions::default())
                .expect("put");
        }
        self.nodes[i].sync().await;
    }

    /// Stop node `i`'s gRPC server (it leaves membership first).
    pub fn stop(&mut self, i: usize) {
        let (tx, _) = tokio::sync::oneshot::channel();
        let _ = std::mem::replace(&mut self.stops[i], tx).send(());
    }
}

/// Node `n{i}` serving on `grpc`, its transfer engine on `transfer`.
async fn start_node(
    i: usize,
    peers: &[String],
    grpc: TcpListener,
    transfer: String,
    opts: &Options,
) -> (Arc<ClusterNode>, tokio::sync::oneshot::Sender<()>) {
    let d = NodeConfig::default();
    let (high_watermark, low_watermark) = opts
        .watermarks
        .unwrap_or((d.high_watermark, d.low_watermark));
    let cfg = NodeConfig {
        node_id: format!("n{i}"),
        ram_capacity: bytesize::ByteSize::b(opts.ram),
        vram_capacity: bytesize::ByteSize::b(opts.vram),
        high_watermark,
        low_watermark,
        ..d
    };
    let mut registry = Registry::default();
    let store = Store::open(cfg, &mut registry).expect("store opens");
    let cluster = ClusterConfig {
        peers: peers.to_vec(),
        transfer_listen: transfer,
        transfer_transport: "tcp".into(),
        probe_interval_ms: 100,
        failure_timeout_ms: opts.failure_timeout_ms,
        remote_read_timeout_ms: opts.remote_read_timeout_ms,
        reconcile_interval_ms: opts.reconcile_interval_ms,
        refresh_chunk_blocks: opts.refresh_chunk_blocks,
        refresh_chunks_per_period: opts.refresh_chunks_per_period,
        ..ClusterConfig::default()
    };
    let http = TcpListener::bind("127.0.0.1:0").await.expect("http bind");
    let addr = grpc.local_addr().expect("grpc addr");
    let node = ClusterNode::start(store, cluster, addr, &mut registry)
        .await
        .expect("node starts");
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(
        NodeServer::cluster(node.clone(), registry, grpc, http).serve(async {
            let _ = rx.await;
        }),
    );
    (node, tx)
}

/// Whole blocks into `targets[i]`, the way the connector loads a prefix:
/// [`ClusterNode::lease_many`], one [`ClusterNode::read_leased`] of the
/// leased prefix, then each block's xxh3 checked in order (a corrupt one is
/// reported with [`ClusterNode::report_corrupt`]). Returns how many leading
/// blocks were read and verified: it stops at the first miss, failed read or
/// corrupt block.
pub async fn read_verified(
    node: &ClusterNode,
    keys: &[BlockKey],
    hints: &[Option<HolderEntry>],
    targets: &[ReadTarget<'_>],
) -> usize {
    node.read_verified(keys, hints, targets).await
}

const PASS: u8 = 0;
const FREEZE: u8 = 1;
const CUT: u8 = 2;

/// A tcp proxy to one address. Frozen, it stops forwarding (connections
/// stay open, bytes stop); cut, it closes every connection and refuses new
/// ones — optionally only after a number of bytes came back from the target.
pub struct Proxy {
    pub addr: String,
    state: Arc<ProxyState>,
}

struct ProxyState {
    mode: AtomicU8,
    /// Cut once this many bytes flowed back from the target (u64::MAX = never).
    cut_after: AtomicU64,
    back_bytes: AtomicU64,
}

impl Proxy {
    pub async fn start(target: String) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("proxy bind");
        let addr = listener.local_addr().expect("proxy addr").to_string();
        let state = Arc::new(ProxyState {
            mode: AtomicU8::new(PASS),
            cut_after: AtomicU64::new(u64::MAX),
            back_bytes: AtomicU64::new(0),
        });
        let st = state.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                if st.mode.load(Ordering::SeqCst) == CUT {
                    continue;
                }
                let Ok(server) = TcpStream::connect(&target).await else {
                    continue;
                };
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
                let (cr, cw) = client.into_split();
                let (sr, sw) = server.into_split();
                tokio::spawn(pump(cr, sw, st.clone(), false));
                tokio::spawn(pump(sr, cw, st.clone(), true));
            }
        });
        Proxy { addr, state }
    }

    pub fn freeze(&self) {
        self.state.mode.store(FREEZE, Ordering::SeqCst);
    }

    pub fn cut(&self) {
        self.state.mode.store(CUT, Ordering::SeqCst);
    }

    /// Cut every connection once `bytes` more have come back from the target.
    pub fn cut_after(&self, bytes: u64) {
        let now = self.state.back_bytes.load(Ordering::SeqCst);
        self.state.cut_after.store(now + bytes, Ordering::SeqCst);
    }

    /// Bytes that came back from the target so far.
    pub fn back_bytes(&self) -> u64 {
        self.state.back_bytes.load(Ordering::SeqCst)
    }
}

async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    st: Arc<ProxyState>,
    back: bool,
) {
    let mut buf = vec![0u8; 64 << 10];
    loop {
        let Ok(n) = from.read(&mut buf).await else {
            return;
        };
        if n == 0 {
            return;
        }
        let chunk = &buf[..n];
        if back {
            let before = st.back_bytes.fetch_add(n as u64, Ordering::SeqCst);
            let limit = st.cut_after.load(Ordering::SeqCst);
            if before + n as u64 >= limit {
                // Forward up to the limit, then the holder "dies".
                let keep = limit.saturating_sub(before) as usize;
                let _ = to.write_all(&chunk[..keep.min(n)]).await;
                st.mode.store(CUT, Ordering::SeqCst);
                return;
            }
        }
        loop {
            match st.mode.load(Ordering::SeqCst) {
                PASS => break,
                CUT => return,
                _ => tokio::time::sleep(Duration::from_millis(10)).await,
            }
        }
        if to.write_all(chunk).await.is_err() {
            return;
        }
    }
}
