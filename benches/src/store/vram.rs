//! `bench store --tiers vram`: the VRAM tier's block copies against plain
//! copies on the same GPU, in the same run (needs the `cuda` feature and a
//! CUDA device).
//!
//! - H2D: the tier's promotions, `VramTier::lease` of blocks held in RAM
//!   only, by `clients` threads (each block's DMA straight from the
//!   registered RAM arena, hashed in VRAM by the GPU, or with `--vram-verify
//!   host` by the CPU while the DMA runs; committed if the hash is the
//!   block's; `vram_verify` in the report says which ran) vs one thread's `cuMemcpyHtoD` of the same blocks, one block
//!   per call, from a pinned buffer (the copy engine with nothing in its way).
//! - D2H: the tier's copies into RAM, `Store::lease` of blocks held in VRAM
//!   only (DMA into a RAM reservation, hashed slice by slice as it lands) vs
//!   `cuMemcpyDtoH` of each block into a pinned buffer.
//! - Client copies: `VramTier::put` from and `get_into` to ordinary
//!   (pageable) buffers, through the pinned staging pool (a CPU copy and the
//!   hash per slice), against the same plain copies.
//! - Host hash: `clients` threads' XXH3 of the same blocks in the (cold)
//!   RAM arena, the part of a promotion its DMA does not hide.
//! - Overlap: compute-bound kernels (`spin`, ~50 ms in all: one kernel of
//!   ~25 ms blocks, `kernel_*`, and 500 of ~0.1 ms, `short_kernels_*`) on a
//!   stream of their own, timed by device events alone and while `clients`
//!   threads put, get, copy into RAM and promote back through the tier (the
//!   promotions' hash kernels included); the slowdown is with / alone - 1,
//!   and `copies_during_*_gbps` what the tier moved meanwhile.
//! - Tiering: puts into a tier of half the blocks (each evicting one into
//!   RAM), then leases of the evicted ones (promotions from RAM).
//!
//! Each comparison runs `ROUNDS` interleaved rounds; every figure is the
//! median of its rounds.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use anyhow::Context;
use bytesize::ByteSize;
use kvfabric_store::vram::VramTier;
use kvfabric_store::{BlockKey, NodeConfig, PutOptions, Registry, Store, VramVerify};
use kvfabric_transfer::cuda::kernels::Kernels;
use kvfabric_transfer::cuda::{GpuEvent, PinnedBuf, VramSegment};
use serde_json::{json, Map, Value};

use super::shared::{gbps, key, layout, parallel, BLOCK, ROUNDS};
use super::{StoreArgs, VerifyArg};

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// A tier for `vram_blocks` blocks over a RAM tier for `ram_blocks`, with
/// the staging the flags name.
fn open_tier(args: &StoreArgs, vram_blocks: usize, ram_blocks: usize) -> anyhow::Result<VramTier> {
    let d = NodeConfig::default();
    let cfg = NodeConfig {
        ram_capacity: ByteSize::b((ram_blocks * BLOCK + (64 << 20)) as u64),
        vram_capacity: ByteSize::b((vram_blocks * BLOCK) as u64),
        vram_staging_slots: args.vram_staging_slots.unwrap_or(d.vram_staging_slots),
        vram_staging_slice: args.vram_staging_slice.unwrap_or(d.vram_staging_slice),
        vram_staging_depth: args.vram_staging_depth.unwrap_or(d.vram_staging_depth),
        vram_verify: match args.vram_verify {
            VerifyArg::Device => VramVerify::Device,
            VerifyArg::Host => VramVerify::Host,
        },
        high_watermark: 1.0,
        low_watermark: 1.0,
        ..d
    };
    let store = Store::open(cfg, &mut Registry::default())?;
    VramTier::open(&store).context("open the VRAM tier (needs a CUDA device)")
}

/// The VRAM section of the store bench.
pub(super) fn vram(sources: &[Vec<u8>], args: &StoreArgs) -> anyhow::Result<Map<String, Value>> {
    let (n, clients) = (sources.len(), args.clients);
    let tier = open_tier(args, n + 1, n)?;
    let dev = tier.device().clone();
    let keys: Vec<BlockKey> = (0..n).map(key).collect();
    let peer_seg = VramSegment::allocate(&dev, n * BLOCK)?;
    let mut pinned = PinnedBuf::new(&dev, BLOCK)?;
    pinned.copy_from_slice(&sources[0]);
    let mut rounds: std::collections::BTreeMap<&str, Vec<f64>> = Default::default();
    for round in 0..=ROUNDS {
        let mut f = client_copies(&tier, sources, &keys, clients)?;
        f.extend(tier_moves(&tier, &keys, clients)?);
        f.extend(plain_copies(&tier, &peer_seg, &mut pinned, n)?);
        f.extend(arena_hash(&tier, n, clients)?);
        if round > 0 {
            // Round 0 warms up (module loads, first touches of the pool).
            for (name, v) in f {
                rounds.entry(name).or_default().push(v);
            }
        }
    }
    let mut out = Map::new();
    out.insert("vram_device".into(), json!(dev.name()));
    let c = tier.store().config();
    let staging = json!({
        "slots": c.vram_staging_slots,
        "slice_bytes": c.vram_staging_slice.as_u64(),
        "depth": c.vram_staging_depth,
    });
    out.insert("vram_staging".into(), staging);
    out.insert(
        "vram_verify".into(),
        json!(if tier.verifies_on_device() {
            "device"
        } else {
            "host"
        }),
    );
    let fig: std::collections::BTreeMap<&str, f64> =
        rounds.into_iter().map(|(k, v)| (k, median(v))).collect();
    let ratio = |a: &str, b: &str| json!(fig[a] / fig[b].max(1e-9));
    out.insert(
        "vram_h2d_vs_memcpy".into(),
        ratio("vram_h2d_gbps", "vram_h2d_memcpy_gbps"),
    );
    out.insert(
        "vram_d2h_vs_memcpy".into(),
        ratio("vram_d2h_gbps", "vram_d2h_memcpy_gbps"),
    );
    out.insert(
        "vram_put_vs_memcpy".into(),
        ratio("vram_put_gbps", "vram_h2d_memcpy_gbps"),
    );
    out.insert(
        "vram_get_vs_memcpy".into(),
        ratio("vram_get_gbps", "vram_d2h_memcpy_gbps"),
    );
    for (name, v) in &fig {
        out.insert((*name).into(), json!(v));
    }
    if let Err(e) = overlap(&tier, sources, &keys, clients, &mut out) {
        // The copies' figures stand without it (e.g. no libnvrtc on the host).
        tracing::warn!("overlap not measured: {e:#}");
        out.insert("overlap_error".into(), json!(format!("{e:#}")));
    }
    drop(tier);
    tiering(args, sources, &keys, &mut out)?;
    out.insert("vram_blocks".into(), json!(n));
    out.insert("vram_clients".into(), json!(clients));
    Ok(out)
}

/// Named GB/s figures of one phase.
type Figures = Vec<(&'static str, f64)>;

/// Clients' copies through the staging pool: `put` of every block from
/// its (pageable) source, then `get_into` of every block into a (pageable)
/// buffer. Leaves every block in VRAM only.
fn client_copies(
    tier: &VramTier,
    sources: &[Vec<u8>],
    keys: &[BlockKey],
    clients: usize,
) -> anyhow::Result<Figures> {
    let n = sources.len();
    tier.remove(keys);
    tier.store().remove(keys)?;
    let t = Instant::now();
    parallel(clients, n, |i| {
        tier.put(keys[i], layout(), &sources[i], PutOptions::default())?;
        Ok(())
    })?;
    let put = gbps(n * BLOCK, t.elapsed());
    let outs: Vec<_> = (0..clients)
        .map(|_| super::shared::parking(vec![0u8; BLOCK]))
        .collect();
    let t = Instant::now();
    parallel(clients, n, |i| {
        let mut dst = outs[i % clients]
            .lock()
            .map_err(|_| anyhow::anyhow!("poisoned"))?;
        tier.get_into(&keys[i], &mut dst[..])?
            .with_context(|| format!("block {i} missing from the VRAM tier"))?;
        Ok(())
    })?;
    Ok(vec![
        ("vram_put_gbps", put),
        ("vram_get_gbps", gbps(n * BLOCK, t.elapsed())),
    ])
}

/// The tier's own block moves, between VRAM and the (registered) RAM
/// arena: every VRAM-only block copied into RAM by a store lease (d2h),
/// then, dropped from VRAM, promoted back by a tier lease (h2d).
fn tier_moves(tier: &VramTier, keys: &[BlockKey], clients: usize) -> anyhow::Result<Figures> {
    let n = keys.len();
    let store = tier.store();
    let t = Instant::now();
    parallel(clients, n, |i| {
        store
            .lease(&keys[i])?
            .with_context(|| format!("block {i} not copied into RAM"))?;
        Ok(())
    })?;
    let d2h = gbps(n * BLOCK, t.elapsed());
    tier.remove(keys);
    let t = Instant::now();
    parallel(clients, n, |i| {
        tier.lease(&keys[i])?
            .with_context(|| format!("block {i} not promoted from RAM"))?;
        Ok(())
    })?;
    Ok(vec![
        ("vram_d2h_gbps", d2h),
        ("vram_h2d_gbps", gbps(n * BLOCK, t.elapsed())),
    ])
}

/// The peer: one thread's `cuMemcpyHtoD`, then `cuMemcpyDtoH`, of `n`
/// blocks, one per call, from and into a pinned buffer; and the same H2D
/// copies from the tier's registered RAM arena (is registered memory as
/// fast as the driver's own pinned memory here?).
fn plain_copies(
    tier: &VramTier,
    peer: &VramSegment,
    pinned: &mut PinnedBuf,
    n: usize,
) -> anyhow::Result<Figures> {
    let t = Instant::now();
    for i in 0..n {
        peer.copy_in(i * BLOCK, pinned)?;
    }
    let h2d = gbps(n * BLOCK, t.elapsed());
    let t = Instant::now();
    for i in 0..n {
        peer.copy_out(i * BLOCK, pinned)?;
    }
    let d2h = gbps(n * BLOCK, t.elapsed());
    let arena = tier.store().region();
    let t = Instant::now();
    for i in 0..n {
        // SAFETY: read only; the bench writes no RAM block meanwhile.
        let src = unsafe { arena.slice(i * BLOCK, BLOCK)? };
        peer.copy_in(i * BLOCK, src)?;
    }
    Ok(vec![
        ("vram_h2d_memcpy_gbps", h2d),
        ("vram_d2h_memcpy_gbps", d2h),
        (
            "vram_h2d_memcpy_from_arena_gbps",
            gbps(n * BLOCK, t.elapsed()),
        ),
    ])
}

/// The host's side of a promotion alone: `clients` threads taking the
/// XXH3 of the `n` blocks of the RAM arena (cold: the last touch was a
/// round ago), which a promotion must do before it commits. GB/s.
fn arena_hash(tier: &VramTier, n: usize, clients: usize) -> anyhow::Result<Figures> {
    let arena = tier.store().region();
    let t = Instant::now();
    parallel(clients, n, |i| {
        // SAFETY: read only; the bench writes no RAM block meanwhile.
        let block = unsafe { arena.slice(i * BLOCK, BLOCK)? };
        std::hint::black_box(kvfabric_transfer::checksum::checksum(block));
        Ok(())
    })?;
    Ok(vec![("host_hash_arena_gbps", gbps(n * BLOCK, t.elapsed()))])
}

/// Time `launches` back-to-back `spin` kernels (blocks x 256 threads x
/// `iters` FMAs each) on their own stream, `runs` times; ms each.
#[allow(clippy::too_many_arguments)]
fn time_kernel(
    tier: &VramTier,
    kernels: &Kernels,
    out: &VramSegment,
    blocks: u32,
    iters: u32,
    launches: u32,
    runs: usize,
) -> anyhow::Result<Vec<f64>> {
    let dev = tier.device();
    let stream = dev.new_stream()?;
    let (start, end) = (GpuEvent::timed(dev)?, GpuEvent::timed(dev)?);
    let mut ms = Vec::with_capacity(runs);
    for _ in 0..runs {
        start.record(&stream)?;
        for _ in 0..launches {
            kernels.spin(out, blocks, iters, &stream)?;
        }
        end.record(&stream)?;
        end.wait()?;
        ms.push(f64::from(start.elapsed_ms(&end)?));
    }
    Ok(ms)
}

/// One shape of GPU load for the overlap figures: `blocks` x 256 threads,
/// `launches` kernels of `ms_each` back to back (~50 ms in all).
struct Load {
    name: &'static str,
    blocks: u32,
    launches: u32,
    ms_each: f64,
}

/// The overlap figures, for two loads that fill every SM: one kernel whose
/// blocks run for ~25 ms (`kernel_*`, the probe of earlier sessions), and
/// 500 kernels of ~0.1 ms, one wave each (`short_kernels_*`, closer to an
/// engine's step). Each is timed alone, then while the tier copies.
fn overlap(
    tier: &VramTier,
    sources: &[Vec<u8>],
    keys: &[BlockKey],
    clients: usize,
    out: &mut Map<String, Value>,
) -> anyhow::Result<()> {
    let kernels = Kernels::compile(tier.device())?;
    let loads = [
        Load {
            name: "kernel",
            blocks: 132 * 16,
            launches: 1,
            ms_each: 50.0,
        },
        Load {
            name: "short_kernels",
            blocks: 132 * 8,
            launches: 500,
            ms_each: 0.1,
        },
    ];
    let buf = VramSegment::allocate(tier.device(), 132 * 16 * 256 * 4)?;
    for load in loads {
        let probe = median(time_kernel(
            tier,
            &kernels,
            &buf,
            load.blocks,
            1 << 14,
            1,
            3,
        )?);
        let iters = ((load.ms_each / probe.max(1e-3)) * f64::from(1u32 << 14)).clamp(1e2, 1e9);
        let time = |runs| {
            time_kernel(
                tier,
                &kernels,
                &buf,
                load.blocks,
                iters as u32,
                load.launches,
                runs,
            )
        };
        let alone = median(time(7)?);
        let stop = AtomicBool::new(false);
        let moved = std::sync::atomic::AtomicUsize::new(0);
        let (with, copy_secs) = std::thread::scope(|s| -> anyhow::Result<(f64, f64)> {
            let t = Instant::now();
            let copier = s.spawn(|| copy_until(tier, sources, keys, clients, &stop, &moved));
            std::thread::sleep(std::time::Duration::from_millis(50));
            let with = time(7);
            stop.store(true, Ordering::Relaxed);
            copier
                .join()
                .map_err(|_| anyhow::anyhow!("copy thread panicked"))??;
            Ok((median(with?), t.elapsed().as_secs_f64()))
        })?;
        let n = load.name;
        out.insert(format!("{n}_alone_ms"), json!(alone));
        out.insert(format!("{n}_with_copies_ms"), json!(with));
        out.insert(format!("{n}_slowdown"), json!(with / alone.max(1e-9) - 1.0));
        let moved = moved.load(Ordering::Relaxed) as f64;
        out.insert(
            format!("copies_during_{n}_gbps"),
            json!(moved / copy_secs / 1e9),
        );
    }
    Ok(())
}

/// Move blocks every way through the tier on `clients` threads until
/// `stop`: put, get, copy into RAM, drop from VRAM and promote back; counts
/// the bytes moved.
fn copy_until(
    tier: &VramTier,
    sources: &[Vec<u8>],
    keys: &[BlockKey],
    clients: usize,
    stop: &AtomicBool,
    moved: &std::sync::atomic::AtomicUsize,
) -> anyhow::Result<()> {
    let n = sources.len();
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..clients)
            .map(|c| {
                s.spawn(move || -> anyhow::Result<()> {
                    let mut dst = vec![0u8; BLOCK];
                    let mut i = c;
                    while !stop.load(Ordering::Relaxed) {
                        let k = i % n;
                        tier.remove(&keys[k..k + 1]);
                        tier.put(keys[k], layout(), &sources[k], PutOptions::default())?;
                        tier.get_into(&keys[k], &mut dst)?;
                        tier.store().lease(&keys[k])?;
                        tier.remove(&keys[k..k + 1]);
                        tier.lease(&keys[k])?;
                        moved.fetch_add(4 * BLOCK, Ordering::Relaxed);
                        i += clients;
                    }
                    Ok(())
                })
            })
            .collect();
        for h in hs {
            h.join()
                .map_err(|_| anyhow::anyhow!("copy thread panicked"))??;
        }
        Ok(())
    })
}

/// Puts into a tier of half the blocks (evicting into RAM), then leases of
/// the evicted half (promotions from RAM).
fn tiering(
    args: &StoreArgs,
    sources: &[Vec<u8>],
    keys: &[BlockKey],
    out: &mut Map<String, Value>,
) -> anyhow::Result<()> {
    let (n, clients) = (sources.len(), args.clients);
    let tier = open_tier(args, n / 2, n + 1)?;
    let t = Instant::now();
    for (i, s) in sources.iter().enumerate() {
        tier.put(keys[i], layout(), s, PutOptions::default())?;
    }
    out.insert(
        "evicting_put_gbps".into(),
        json!(gbps(n * BLOCK, t.elapsed())),
    );
    let evicted: Vec<usize> = (0..n)
        .filter(|i| !tier.contains(&keys[*i..*i + 1])[0])
        .collect();
    tier.remove(keys);
    let t = Instant::now();
    parallel(clients, evicted.len(), |j| {
        tier.lease(&keys[evicted[j]])?
            .with_context(|| format!("block {} lost between VRAM and RAM", evicted[j]))?;
        Ok(())
    })?;
    out.insert(
        "promote_gbps".into(),
        json!(gbps(evicted.len() * BLOCK, t.elapsed())),
    );
    out.insert("promoted_blocks".into(), json!(evicted.len()));
    Ok(())
}
