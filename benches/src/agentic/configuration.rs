//! One configuration of the agentic bench: engines with no reuse, the local
//! prefix cache or the fabric, driven through the trace by the bench's
//! router; and the save-on / save-off pair the fabric figures come from.

use std::sync::Arc;
use std::time::Duration;

use anyhow::anyhow;
use kvfabric_engine::kv::KvPool;
use kvfabric_engine::model::LlamaModel;
use kvfabric_router::pick::{PickParams, Policy};
use kvfabric_store::KeyChain;

use super::args::AgenticArgs;
use super::driver::{drive, DriveParams};
use super::engines::{engine_config, EngineSet};
use super::fabric::{decode_step, FabricCluster};
use super::routing::{BenchRouter, PrefixSource};
use super::stats::{self, RunSummary};
use super::trace::Workload;

/// Which prefix reuse a configuration has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Reuse {
    None,
    Local,
    Fabric,
}

pub(super) struct ConfigRun {
    pub(super) summary: RunSummary,
    pub(super) records: Vec<stats::RequestRecord>,
    pub(super) connector: Option<kvfabric_connector::ConnectorStats>,
    /// Affinity picks that kept / moved a session.
    pub(super) affinity: (u64, u64),
}

/// The router of one run: `policy` over the engines; for `prefix`, an index
/// fed by the fabric nodes' KV events and keys chained as the engines chain them.
fn bench_router(
    args: &AgenticArgs,
    model: &LlamaModel,
    cfg: &kvfabric_engine::EngineConfig,
    policy: Policy,
    fabric: Option<&FabricCluster>,
) -> BenchRouter {
    let prefix = match (policy, fabric) {
        (Policy::Prefix, Some(f)) => {
            let c = &model.config;
            let layout = KvPool::layout_for(
                c.layers,
                c.kv_heads,
                c.head_dim,
                cfg.block_tokens,
                cfg.kv_dtype.into(),
            );
            let chain = KeyChain::new(b"", &model.fingerprint(), &layout);
            let events = (0..args.engines).map(|i| f.kv_events(i)).collect();
            Some(PrefixSource::follow(events, chain, cfg.block_tokens))
        }
        _ => None,
    };
    let params = PickParams {
        prefix_overlap_weight: args.prefix_overlap_weight,
        prefix_session_weight: args.prefix_session_weight,
        ..PickParams::default()
    };
    BenchRouter::new(policy, params, args.seed, args.engines, prefix)
}

pub(super) async fn run_configuration(
    args: &AgenticArgs,
    model: &Arc<LlamaModel>,
    workload: &Workload,
    reuse: Reuse,
    fabric: Option<&FabricCluster>,
    policy: Policy,
) -> anyhow::Result<ConfigRun> {
    let cfg = kvfabric_engine::EngineConfig {
        kv_dtype: args.dtype.kv_dtype.into(),
        ..engine_config(args.threads, args.kv_pool_mib, reuse != Reuse::None)
    };
    let mut router = bench_router(args, model, &cfg, policy, fabric);
    let connects = (0..args.engines)
        .map(|i| match (reuse, fabric) {
            (Reuse::Fabric, Some(f)) => Ok(Some(f.connect_fn(i, true))),
            (Reuse::Fabric, None) => Err(anyhow!("the fabric configuration needs a cluster")),
            _ => Ok(None),
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let set = EngineSet::start(model, &cfg, connects)?;
    let params = DriveParams {
        rate: args.rate,
        answer_tokens: args.answer_tokens,
        seed: args.seed,
        burst_start: args.burst_start,
    };
    let handles = set.handles();
    let driven = drive(&handles, workload, &params, &mut router).await;
    drop(handles);
    let connectors = set.connectors();
    let connector = if connectors.is_empty() {
        None
    } else {
        // Counters once every save ended (pending_saves > 0 in the report
        // means they did not within 30 s).
        let flushed = connectors.clone();
        tokio::task::spawn_blocking(move || {
            flushed.iter().all(|c| c.flush(Duration::from_secs(30)))
        })
        .await
        .map_err(|e| anyhow!("flush task: {e}"))?;
        Some(connectors.iter().map(|c| c.stats()).sum())
    };
    drop(connectors);
    set.stop().await?;
    let (records, wall) = driven?;
    Ok(ConfigRun {
        summary: RunSummary::new(&records, cfg.block_tokens, wall),
        records,
        connector,
        affinity: (router.affinity_hits, router.affinity_fallbacks),
    })
}

/// Decode step time with saving on and off, alternated, best of each.
pub(super) async fn save_on_off(
    args: &AgenticArgs,
    model: &Arc<LlamaModel>,
    fabric: &FabricCluster,
) -> anyhow::Result<(f64, f64, u64)> {
    let cfg = engine_config(args.threads, args.kv_pool_mib, true);
    let (mut on, mut off, mut saved) = (f64::MAX, f64::MAX, 0);
    for r in 0..args.step_repeats.max(1) {
        for save in [true, false] {
            let seed = args.seed.wrapping_mul(1000) + 2 * r as u64 + u64::from(save);
            let (step, s) = decode_step(
                model,
                &cfg,
                fabric.connect_fn(r, save),
                args.step_batch,
                100,
                args.step_tokens,
                seed,
            )
            .await?;
            let ms = step.as_secs_f64() * 1e3;
            if save {
                on = on.min(ms);
                saved += s;
            } else {
                off = off.min(ms);
                anyhow::ensure!(s == 0, "the save-off connector saved {s} blocks");
            }
        }
    }
    Ok((on, off, saved))
}
