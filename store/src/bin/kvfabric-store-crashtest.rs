//! Helper process for the store's multi-process tests (store/tests/).
//!
//! - `kvfabric-store-crashtest keys`: print the block keys of a fixed token
//!   sequence, one hex key per line (keys must match across processes).
//! - `kvfabric-store-crashtest write DIR`: open a store with its disk tier in
//!   DIR and put durable blocks 0, 1, 2, ... printing `ack N` after each put is
//!   acknowledged, until killed (the test kills it with SIGKILL mid-stream).

use std::io::Write;

use kvfabric_store::{
    BlockKey, BlockOrder, DType, KeyChain, KvLayout, ModelFingerprint, NodeConfig, PutOptions,
    Registry, Store,
};

// The test kit's stream, compiled in: a binary cannot take the kit as a
// dev-dependency, and the test checks the bytes against the same file.
#[path = "../../../testkit/src/testdata.rs"]
#[allow(dead_code)]
mod testdata;

/// Layout of the crash-test blocks (64 KiB each).
pub fn crash_layout() -> KvLayout {
    KvLayout {
        layers: 2,
        kv_heads: 2,
        head_dim: 64,
        dtype: DType::F32,
        block_tokens: 32,
        order: BlockOrder::LayerKvTokenHead,
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        Some("keys") => {
            let fp = ModelFingerprint::new(&[7u8; 32], "llama");
            let chain = KeyChain::new(b"tenant-a", &fp, &crash_layout());
            let tokens: Vec<u32> = (0..32 * 5).map(|t| t * 7 + 1).collect();
            for k in chain.keys(&tokens) {
                println!("{}", k.to_hex());
            }
            Ok(())
        }
        Some("write") => {
            let dir = std::path::PathBuf::from(args.get(2).ok_or("write needs DIR")?);
            let store = Store::open(crash_config(&dir), &mut Registry::default())?;
            let layout = crash_layout();
            let mut out = std::io::stdout().lock();
            for i in 0..100_000u32 {
                let data = testdata::bytes(u64::from(i), layout.block_bytes());
                let opts = PutOptions {
                    durable: true,
                    ..Default::default()
                };
                store.put(block_key(i), layout, &data, opts)?;
                writeln!(out, "ack {i}")?;
                out.flush()?;
            }
            Ok(())
        }
        _ => Err("usage: kvfabric-store-crashtest keys | write DIR".into()),
    }
}

/// The config both the writer and the verifier open.
fn crash_config(dir: &std::path::Path) -> NodeConfig {
    NodeConfig {
        ram_capacity: bytesize::ByteSize::mib(2),
        disk_path: Some(dir.join("data")),
        disk_capacity: bytesize::ByteSize::mib(64),
        ..Default::default()
    }
}

fn block_key(i: u32) -> BlockKey {
    BlockKey(*blake3::hash(&i.to_le_bytes()).as_bytes())
}
