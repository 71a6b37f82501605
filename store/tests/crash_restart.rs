//! Multi-process tests: block keys agree across processes, and durable puts
//! survive a kill -9 of the node process bit-exact.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use kvfabric_store::{
    BlockKey, BlockOrder, DType, KeyChain, KvLayout, ModelFingerprint, NodeConfig, Registry, Store,
};

const BIN: &str = env!("CARGO_BIN_EXE_kvfabric-store-crashtest");

fn layout() -> KvLayout {
    KvLayout {
        layers: 2,
        kv_heads: 2,
        head_dim: 64,
        dtype: DType::F32,
        block_tokens: 32,
        order: BlockOrder::LayerKvTokenHead,
    }
}

fn block_key(i: u32) -> BlockKey {
    BlockKey(*blake3::hash(&i.to_le_bytes()).as_bytes())
}

#[test]
fn keys_are_equal_across_processes() {
    let run = || {
        let out = Command::new(BIN).arg("keys").output().unwrap();
        assert!(out.status.success());
        String::from_utf8(out.stdout).unwrap()
    };
    let (a, b) = (run(), run());
    assert_eq!(a, b);
    let fp = ModelFingerprint::new(&[7u8; 32], "llama");
    let tokens: Vec<u32> = (0..32 * 5).map(|t| t * 7 + 1).collect();
    let here: String = KeyChain::new(b"tenant-a", &fp, &layout())
        .keys(&tokens)
        .iter()
        .map(|k| format!("{}\n", k.to_hex()))
        .collect();
    assert_eq!(a, here);
    assert_eq!(a.lines().count(), 5);
}

#[test]
fn durable_blocks_survive_kill_dash_nine() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(BIN)
        .arg("write")
        .arg(dir.path())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut acked = Vec::new();
    while acked.len() < 40 && Instant::now() < deadline {
        match lines.next() {
            Some(Ok(l)) => acked.push(l.strip_prefix("ack ").unwrap().parse::<u32>().unwrap()),
            _ => break,
        }
    }
    child.kill().unwrap(); // SIGKILL, mid-stream
    child.wait().unwrap();
    assert!(
        acked.len() >= 40,
        "writer acknowledged only {} puts",
        acked.len()
    );

    let cfg = NodeConfig {
        ram_capacity: bytesize::ByteSize::mib(2),
        disk_path: Some(dir.path().join("data")),
        disk_capacity: bytesize::ByteSize::mib(64),
        ..Default::default()
    };
    let store = Store::open(cfg, &mut Registry::default()).unwrap();
    let len = layout().block_bytes();
    let mut buf = vec![0u8; len];
    for &i in &acked {
        let info = store.get_into(&block_key(i), 0, &mut buf).unwrap();
        assert!(info.is_some(), "acknowledged durable block {i} lost");
        assert!(
            buf == kvfabric_testkit::testdata::bytes(u64::from(i), len),
            "block {i} not bit-exact"
        );
    }
    let disk = &store.stats().tiers[1];
    assert_eq!(disk.checksum_failures, 0);
}
