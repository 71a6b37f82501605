//! `kvfabric node` child processes on loopback for the multi-process cluster
//! tests, blocks with deterministic contents in a small layout, and the
//! cluster RPCs the tests check (ClusterStatus members, lookup, exists, reads
//! that compare bytes).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use super::command::{kvfabric_command, log_tail};
use crate::{eventually, free_port};
use std::time::{Duration, Instant};

use kvfabric_node::cluster::client::{self, CacheClient};
use kvfabric_store::{BlockKey, BlockOrder, DType, KeyChain, KvLayout, ModelFingerprint};

/// A small layout: 2 layers x 2 heads x 16 dims x 16 tokens of f16 = 4 KiB blocks.
pub fn layout() -> KvLayout {
    KvLayout {
        layers: 2,
        kv_heads: 2,
        head_dim: 16,
        dtype: DType::F16,
        block_tokens: 16,
        order: BlockOrder::LayerKvTokenHead,
    }
}

/// `n` chained keys of a prompt identified by `seed`.
pub fn keys(seed: u32, n: usize) -> Vec<BlockKey> {
    let chain = KeyChain::new(
        b"cluster-test",
        &ModelFingerprint::new(&[7; 32], "llama"),
        &layout(),
    );
    let tokens: Vec<u32> = (0..(n * 16) as u32)
        .map(|t| t.wrapping_mul(31).wrapping_add(seed))
        .collect();
    chain.keys(&tokens)
}

/// Deterministic contents of the block `key` (`len` bytes).
pub fn data(key: &BlockKey, len: usize) -> Vec<u8> {
    let mut s = u64::from_le_bytes(key.0[..8].try_into().unwrap_or([1; 8])) | 1;
    (0..len)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s as u8
        })
        .collect()
}

/// One `kvfabric node` child process.
pub struct NodeProc {
    pub id: String,
    pub grpc: String,
    pub transfer: String,
    /// HTTP address (/metrics, /health, the console at /).
    pub http: String,
    args: Vec<String>,
    log: PathBuf,
    child: Option<Child>,
}

impl NodeProc {
    /// Start node `id` with its files under `dir` and `membership` flags
    /// (`--etcd ...` or `--peers ...`); `disk` adds a disk tier.
    pub fn start(id: &str, dir: &Path, membership: &[String], disk: bool) -> NodeProc {
        Self::start_on(id, dir, membership, disk, free_port(), free_port())
    }

    pub fn start_on(
        id: &str,
        dir: &Path,
        membership: &[String],
        disk: bool,
        grpc_port: u16,
        transfer_port: u16,
    ) -> NodeProc {
        let grpc = format!("127.0.0.1:{grpc_port}");
        let transfer = format!("127.0.0.1:{transfer_port}");
        let http = format!("127.0.0.1:{}", free_port());
        let mut args: Vec<String> = vec![
            "node".into(),
            "--node-id".into(),
            id.into(),
            "--grpc-listen".into(),
            grpc.clone(),
            "--http-listen".into(),
            http.clone(),
            "--ram-capacity".into(),
            "32MiB".into(),
            "--transfer-listen".into(),
            transfer.clone(),
        ];
        if disk {
            args.extend([
                "--disk-path".into(),
                dir.join(format!("{id}.disk")).display().to_string(),
                "--disk-capacity".into(),
                "128MiB".into(),
            ]);
        }
        args.extend(membership.iter().cloned());
        let mut n = NodeProc {
            id: id.into(),
            grpc,
            transfer,
            http,
            args,
            log: dir.join(format!("{id}.log")),
            child: None,
        };
        n.spawn();
        n
    }

    fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        let mut cmd = kvfabric_command("info,kvfabric_store=debug");
        cmd.args(&self.args)
            .stdout(Stdio::null())
            .stderr(Stdio::from(log));
        self.child = Some(cmd.spawn().expect("start kvfabric node"));
    }

    /// SIGKILL: a crash, no goodbye.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM and wait (up to 10 s): a clean leave.
    pub fn terminate(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = Command::new("kill")
                .args(["-TERM", &c.id().to_string()])
                .status();
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = c.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Start again with the same flags (same disk tier).
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    /// The node's log so far (for failure messages).
    pub fn log(&self) -> String {
        log_tail(&self.log)
    }

    /// A client of this node (retried until it answers, up to 15 s).
    pub async fn client(&self) -> CacheClient {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            match client::connect(&self.grpc, Duration::from_secs(2)).await {
                Ok(c) => return c,
                Err(e) if Instant::now() > deadline => {
                    panic!("node {} never answered: {e}\n{}", self.id, self.log())
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    }
}

impl Drop for NodeProc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Node ids that `node`'s ClusterStatus lists as alive.
pub async fn alive(c: &mut CacheClient) -> Vec<String> {
    match c
        .cluster_status(kvfabric_proto::v1::ClusterStatusRequest {})
        .await
    {
        Ok(r) => {
            let mut ids: Vec<String> = r
                .into_inner()
                .nodes
                .into_iter()
                .filter(|n| n.alive)
                .map(|n| n.node_id)
                .collect();
            ids.sort();
            ids
        }
        Err(_) => Vec::new(),
    }
}

/// Wait until `node` sees exactly `ids` alive.
pub async fn wait_members(node: &NodeProc, ids: &[&str], within: Duration) {
    let mut c = node.client().await;
    let mut want: Vec<String> = ids.iter().map(|s| s.to_string()).collect();
    want.sort();
    let what = format!("{} to see {:?}", node.id, want);
    eventually(&what, within, || {
        let mut c = c.clone();
        let want = want.clone();
        async move { (alive(&mut c).await == want).then_some(()) }
    })
    .await;
    let _ = &mut c;
}

/// Put `keys` on `c` (durable when asked), contents from [`data`].
pub async fn put_all(c: &mut CacheClient, keys: &[BlockKey], durable: bool) {
    let len = layout().block_bytes();
    for k in keys {
        client::put_block(c, k, &layout(), &data(k, len), durable)
            .await
            .expect("put");
    }
}

/// Cluster lookup: (prefix length, holder node ids). Panics on a request error.
pub async fn lookup(c: &mut CacheClient, keys: &[BlockKey]) -> (usize, Vec<String>) {
    let r = c
        .lookup(kvfabric_proto::v1::LookupRequest {
            keys: keys.iter().map(|k| k.as_bytes().to_vec()).collect(),
            with_holders: true,
        })
        .await
        .expect("lookup must not fail (misses only)")
        .into_inner();
    (
        r.prefix_blocks as usize,
        r.holders.into_iter().map(|h| h.node_id).collect(),
    )
}

/// Cluster exists, per key. Panics on a request error.
pub async fn exists(c: &mut CacheClient, keys: &[BlockKey]) -> Vec<bool> {
    c.exists(kvfabric_proto::v1::ExistsRequest {
        keys: keys.iter().map(|k| k.as_bytes().to_vec()).collect(),
    })
    .await
    .expect("exists must not fail (misses only)")
    .into_inner()
    .present
}

/// Read every key through `c` and check the bytes; returns the serving node ids.
pub async fn read_all_exact(
    c: &mut CacheClient,
    keys: &[BlockKey],
    logs: &[&NodeProc],
) -> Vec<String> {
    let len = layout().block_bytes();
    let mut served = Vec::new();
    for k in keys {
        let Some((h, bytes)) = client::get_block(c, k).await.expect("get") else {
            let logs: Vec<String> = logs
                .iter()
                .map(|n| format!("--- {} ---\n{}", n.id, n.log()))
                .collect();
            panic!(
                "block {k:?} not found ({} read before it)\n{}",
                served.len(),
                logs.join("\n")
            );
        };
        assert_eq!(bytes.len(), len);
        assert!(
            bytes == data(k, len),
            "block {k:?} read back different bytes"
        );
        served.push(h.node_id);
    }
    served
}
