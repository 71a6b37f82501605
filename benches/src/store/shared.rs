//! What every section of the store bench shares: the 1.5 MiB block (its
//! layout, keys and contents), the rounds of the interleaved comparisons, the
//! client threads and the throughput/latency figures. A leaf: the sections
//! (`disk`, `grpc`, `redis`, `sampling`) and the bench's driver import it,
//! and it imports none of them.

use std::time::{Duration, Instant};

use kvfabric_store::{BlockKey, BlockOrder, DType, KvLayout};

/// 1.5 MiB: 24 layers x K,V x 64 tokens x 2 heads x 64 x f32.
pub(super) fn layout() -> KvLayout {
    KvLayout {
        layers: 24,
        kv_heads: 2,
        head_dim: 64,
        dtype: DType::F32,
        block_tokens: 64,
        order: BlockOrder::LayerKvTokenHead,
    }
}

pub(super) const BLOCK: usize = 3 << 19;

pub(super) fn key(i: usize) -> BlockKey {
    let mut k = [0u8; 32];
    k[..8].copy_from_slice(&(i as u64).to_le_bytes());
    k[8] = 0xb1;
    BlockKey(k)
}

pub(super) fn block_data(i: usize) -> Vec<u8> {
    let mut x = (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..BLOCK / 8)
        .flat_map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x.to_le_bytes()
        })
        .collect()
}

pub(super) fn gbps(bytes: usize, d: Duration) -> f64 {
    bytes as f64 / d.as_secs_f64() / 1e9
}

pub(super) fn pct_ms(lat: &mut [Duration], p: f64) -> f64 {
    if lat.is_empty() {
        return 0.0;
    }
    lat.sort();
    let i = ((lat.len() as f64 - 1.0) * p).round() as usize;
    lat[i].as_secs_f64() * 1e3
}

/// Rounds of every interleaved comparison (the best round of each is kept).
pub(super) const ROUNDS: usize = 3;

/// Run `op(i)` for i in 0..n over `clients` threads (block i goes to thread i % clients).
pub(super) fn parallel(
    clients: usize,
    n: usize,
    op: impl Fn(usize) -> anyhow::Result<()> + Sync,
) -> anyhow::Result<Vec<Duration>> {
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..clients)
            .map(|c| {
                let op = &op;
                s.spawn(move || -> anyhow::Result<Vec<Duration>> {
                    let mut lat = Vec::new();
                    for i in (c..n).step_by(clients) {
                        let t = Instant::now();
                        op(i)?;
                        lat.push(t.elapsed());
                    }
                    Ok(lat)
                })
            })
            .collect();
        let mut all = Vec::new();
        for h in hs {
            all.extend(
                h.join()
                    .map_err(|_| anyhow::anyhow!("bench thread panicked"))??,
            );
        }
        Ok(all)
    })
}

pub(super) fn parking<T>(v: T) -> std::sync::Mutex<T> {
    std::sync::Mutex::new(v)
}
