//! `bench transfer --security MODE`: tcp throughput between two engines in
//! MODE (certificates made for the run, a peer of its own, READs showing the
//! peer's capability) against the same run's plain pair, and what bounds it.
//!
//! Where the time goes: both processes' CPU time over each measurement
//! (`cpu_cores`, this process from getrusage and the peer from /proc) gives
//! the core-nanoseconds each byte costs (`cpu_ns_per_byte`), so the secured
//! mode's added work per byte is visible next to its throughput. The bounds
//! are the per-core speeds of the primitives each payload byte passes through
//! (blake3 keyed for `authenticate`'s MAC, AES-GCM for `encrypt`), measured
//! in the same run, and the ratio they allow when the CPU limits both
//! modes: a plain byte costs C core-ns (measured, both processes), a secured
//! one at least C plus one pass of the primitive on each side, so ratio <=
//! C / (C + 2 / H) with H the primitive's GB/s on one core.

use std::time::{Duration, Instant};

use std::sync::Arc;

use kvfabric_transfer::security::SecurityMode;
use kvfabric_transfer::{SharedRegion, TransferConfig, TransferEngine, TransportChoice};
use serde_json::{json, Value};

use super::args::{config, identity, TransferArgs};
use super::peer::{ratio, read_throughput, spawn_peer};

/// CPU seconds (user + system) of process `pid` so far, from /proc.
fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command (which may hold spaces) start past ')'.
    let rest = stat.rsplit_once(')')?.1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    (hz > 0).then(|| ticks / hz as f64)
}

/// CPU seconds of this process and of `peer` together.
fn cpu_both(peer: u32) -> Option<f64> {
    Some(cpu_seconds(std::process::id())? + cpu_seconds(peer)?)
}

/// A throughput figure with the cores both processes kept busy meanwhile.
pub(super) struct Costed {
    pub gbps: f64,
    /// CPU seconds of both processes per wall second of the measurement.
    pub cpu_cores: Option<f64>,
}

impl Costed {
    /// Core-nanoseconds (both processes) each payload byte cost.
    pub fn cpu_ns_per_byte(&self) -> Option<f64> {
        self.cpu_cores.map(|c| c / self.gbps)
    }

    pub fn json(&self) -> Value {
        json!({
            "gbps": self.gbps,
            "cpu_cores": self.cpu_cores,
            "cpu_ns_per_byte": self.cpu_ns_per_byte(),
        })
    }
}

/// Run `measure` (a GB/s figure) and count both processes' CPU meanwhile.
pub(super) async fn costed(
    peer: u32,
    measure: impl std::future::Future<Output = anyhow::Result<f64>>,
) -> anyhow::Result<Costed> {
    let (cpu0, t0) = (cpu_both(peer), Instant::now());
    let gbps = measure.await?;
    let wall = t0.elapsed().as_secs_f64();
    let cpu_cores = cpu0.zip(cpu_both(peer)).map(|(a, b)| (b - a) / wall);
    Ok(Costed { gbps, cpu_cores })
}

/// GB/s of `f` run over `len`-byte inputs for about `dur`, on this thread.
fn single_core_gbps(len: usize, dur: Duration, mut f: impl FnMut()) -> f64 {
    f();
    let started = Instant::now();
    let mut n = 0u64;
    while started.elapsed() < dur {
        f();
        n += 1;
    }
    n as f64 * len as f64 / started.elapsed().as_secs_f64() / 1e9
}

/// One core's speed of each primitive a secured payload byte passes
/// through, over 1 MiB inputs (the tcp slice): blake3 keyed (the MAC of
/// `authenticate`, one-shot and fed in 256 KiB pieces as the links feed it),
/// AES-128-GCM and AES-256-GCM seal (ring, as rustls runs `encrypt`), and
/// xxh3 (the plain mode's optional checksum) for scale.
pub(super) fn primitives(dur: Duration) -> anyhow::Result<Value> {
    use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_128_GCM, AES_256_GCM};
    let len = 1usize << 20;
    let data: Vec<u8> = (0..len).map(|i| (i * 7 % 251) as u8).collect();
    let key = [7u8; 32];
    let blake3 = single_core_gbps(len, dur, || {
        std::hint::black_box(blake3::keyed_hash(&key, &data));
    });
    let blake3_pieces = single_core_gbps(len, dur, || {
        let mut h = blake3::Hasher::new_keyed(&key);
        for piece in data.chunks(256 << 10) {
            h.update(piece);
        }
        std::hint::black_box(h.finalize());
    });
    let mut buf = data.clone();
    let mut aes = |alg: &'static ring::aead::Algorithm| -> anyhow::Result<f64> {
        let k =
            UnboundKey::new(alg, &key[..alg.key_len()]).map_err(|_| anyhow::anyhow!("ring key"))?;
        let k = LessSafeKey::new(k);
        Ok(single_core_gbps(len, dur, || {
            let nonce = Nonce::assume_unique_for_key([0; 12]);
            let tag = k.seal_in_place_separate_tag(nonce, Aad::empty(), &mut buf);
            let _ = std::hint::black_box(tag);
        }))
    };
    let aes128 = aes(&AES_128_GCM)?;
    let aes256 = aes(&AES_256_GCM)?;
    let xxh3 = single_core_gbps(len, dur, || {
        std::hint::black_box(kvfabric_transfer::checksum::checksum(&data));
    });
    Ok(json!({
        "blake3_keyed_gbps": blake3,
        "blake3_keyed_256k_pieces_gbps": blake3_pieces,
        "aes128_gcm_gbps": aes128,
        "aes256_gcm_gbps": aes256,
        "xxh3_gbps": xxh3,
    }))
}

/// The ratio to `none` a secured mode can reach when the CPU is what
/// limits both (it is here: see `cpu_cores`): a plain byte costs
/// `none_ns_per_byte` core-ns (both processes), a secured one at least that
/// plus one pass of the primitive on each side, 2 / `primitive_gbps`.
pub(super) fn bound_ratio(none_ns_per_byte: f64, primitive_gbps: f64) -> f64 {
    none_ns_per_byte / (none_ns_per_byte + 2.0 / primitive_gbps)
}

/// tcp throughput between two engines in the secured `mode`: certificates
/// made for the run, a peer of its own, READs showing its capability.
pub(super) async fn secured_throughput(
    args: &TransferArgs,
    mode: SecurityMode,
) -> anyhow::Result<Costed> {
    let dir = tempfile::tempdir()?;
    use kvfabric_transfer::security::Principal;
    let ids = [Principal::node("bench"), Principal::node("peer")];
    kvfabric_transfer::security::certs::init(dir.path(), &ids, 1)?;
    let peer = spawn_peer(args, Some((mode.as_str(), dir.path())))?;
    let with_certs = TransferArgs {
        certs_dir: Some(dir.path().to_path_buf()),
        ..args.clone()
    };
    let cfg = TransferConfig {
        identity: identity(&with_certs, "bench")?,
        ..config(args, TransportChoice::Tcp, "127.0.0.1:0")
    };
    let mut registry = prometheus_client::registry::Registry::default();
    let engine = TransferEngine::start(cfg, &mut registry).await?;
    // The checks a cluster read makes: the peer proves it is node "peer".
    engine.expect_node(&peer.addr, "peer");
    let region = Arc::new(SharedRegion::create(
        "bench-secured",
        args.segment_bytes as usize,
    )?);
    // SAFETY: nothing else uses the region yet. Fault its pages in before timing.
    unsafe { region.slice_mut(0, region.len())? }.fill(1);
    let local = engine.register(region);
    let secs = Duration::from_secs(args.seconds);
    let (seg, op, batch) = (args.segment_bytes, args.op_bytes, args.batch_ops);
    let read = read_throughput(&engine, &peer, local, seg, op, batch, secs);
    costed(peer.child.id(), read).await
}

/// The `security` object of the report: the secured figure, the plain ones
/// around it, the ratio to their mean, the primitives' speeds and the
/// bounds they set.
pub(super) fn report(
    mode: SecurityMode,
    none: &[&Costed],
    secured: &Costed,
    secs: Duration,
) -> anyhow::Result<Value> {
    let none_gbps = none.iter().map(|c| c.gbps).sum::<f64>() / none.len().max(1) as f64;
    let prims = primitives(secs.min(Duration::from_secs(1)))?;
    let per_core = |k: &str| prims[k].as_f64().unwrap_or(f64::NAN);
    let primitive = match mode {
        SecurityMode::Encrypt => per_core("aes128_gcm_gbps"),
        _ => per_core("blake3_keyed_256k_pieces_gbps"),
    };
    let none_cost =
        none.iter().filter_map(|c| c.cpu_ns_per_byte()).sum::<f64>() / none.len().max(1) as f64;
    Ok(json!({
        "mode": mode.as_str(),
        "tcp_gbps": secured.gbps,
        "tcp_ratio_to_none": ratio(secured.gbps, Some(none_gbps)),
        "none_tcp_gbps_mean": none_gbps,
        "none": none.iter().map(|c| c.json()).collect::<Vec<_>>(),
        "secured": secured.json(),
        "cpu_ns_per_byte_over_none": secured.cpu_ns_per_byte().map(|s| s / none_cost),
        "primitives": prims,
        "bound_ratio": bound_ratio(none_cost, primitive),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_time_of_this_process_is_read_and_grows() {
        let a = cpu_seconds(std::process::id()).expect("own /proc stat");
        let t = Instant::now();
        let mut x = 0u64;
        while t.elapsed() < Duration::from_millis(100) {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(1));
        }
        let b = cpu_seconds(std::process::id()).expect("own /proc stat");
        assert!(b > a, "{a} -> {b}");
        // 0.2 ns a plain byte; 2 passes at 10 GB/s add 0.2 ns: half the speed.
        assert!((bound_ratio(0.2, 10.0) - 0.5).abs() < 1e-12);
    }
}
