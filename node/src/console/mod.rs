//! The operator console: a browser page every node serves at `/` on its HTTP
//! port, showing the whole cluster from whichever node it is opened on.
//!
//! - [`series`]: what is plotted, read by metric name from the node's own
//!   `/metrics` exposition through one table (renames are one line there);
//! - [`history`]: the node's ring of samples (default one hour at 5 s), kept
//!   from start so the plots have data when the page opens, no Prometheus;
//! - [`prefixes`]: the prefixes this node's lookups found most often, per tenant;
//! - [`cluster`]: the cluster view, gathered from every member over the
//!   internal `ConsoleService.Summary` RPC, with alive / suspect / gone states;
//! - [`http`]: the JSON API (`/api/v1/{cluster,history,top-prefixes}`) and the
//!   page's assets, embedded in the binary (uPlot vendored, no CDN).
//!
//! [`Console`] owns the state; [`crate::NodeServer`] creates one per node,
//! starts its sampler and mounts its routes next to `/metrics`. Registries of
//! the same process that the node's `/metrics` does not serve (an engine's,
//! for its TTFT and cached-prompt plots) are sampled too when the embedder
//! hands them in ([`crate::NodeServer::console_sources`]).

pub mod cluster;
pub mod history;
pub mod http;
pub mod prefixes;
pub mod series;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use kvfabric_proto::internal::v1::SummaryResponse;
use parking_lot::Mutex;
use prometheus_client::registry::Registry;
use tokio::sync::watch;

use crate::cluster::ClusterNode;
use crate::exposition::encode_text;
use kvfabric_store::keys::BlockKey;
use kvfabric_store::Store;

use history::History;
use prefixes::PrefixTracker;
use series::{Snapshot, HIT_RATIO};

/// Prefixes one node keeps hit counts of.
const PREFIX_CAPACITY: usize = 4096;
/// Prefixes one node reports to a console.
const PREFIXES_REPORTED: usize = 50;

/// One node's console state.
pub struct Console {
    store: Store,
    registry: Arc<Registry>,
    /// Further registries sampled into the history (not served on `/metrics`).
    sources: Vec<Arc<Registry>>,
    node: Option<Arc<ClusterNode>>,
    history: Mutex<History>,
    prefixes: Arc<PrefixTracker>,
    /// Every member ever seen (id -> gRPC address): one that left the view is "gone".
    seen: Mutex<BTreeMap<String, String>>,
    interval: Duration,
}

impl Console {
    /// The console of `store` (and its cluster side `node`, if any), sampling
    /// `registry` at the node's `console_interval_ms`.
    pub fn new(store: Store, registry: Arc<Registry>, node: Option<Arc<ClusterNode>>) -> Console {
        let cfg = store.config();
        let interval_ms = cfg.console_interval_ms.max(100);
        let samples = cfg.console_history_samples.max(1) as usize;
        Console {
            history: Mutex::new(History::new(interval_ms, samples)),
            prefixes: Arc::new(PrefixTracker::new(PREFIX_CAPACITY)),
            seen: Mutex::new(BTreeMap::new()),
            interval: Duration::from_millis(interval_ms),
            store,
            registry,
            sources: Vec::new(),
            node,
        }
    }

    /// Also sample `sources` (registries of this process the node's
    /// `/metrics` does not serve, e.g. an embedding engine's) into the history.
    pub fn with_sources(mut self, sources: Vec<Arc<Registry>>) -> Console {
        self.sources = sources;
        self
    }

    /// [`Console::new`] with its sampler running until `stop` turns true.
    pub fn start(
        store: Store,
        registry: Registry,
        sources: Vec<Arc<Registry>>,
        node: Option<Arc<ClusterNode>>,
        stop: watch::Receiver<bool>,
    ) -> Arc<Console> {
        let console = Arc::new(Console::new(store, Arc::new(registry), node).with_sources(sources));
        console.spawn_sampler(stop);
        console
    }

    /// The tracker lookups record found prefixes in.
    pub fn prefixes(&self) -> &Arc<PrefixTracker> {
        &self.prefixes
    }

    /// The registry the node's `/metrics` serves.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// The node's store.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// Sampling interval of the history ring.
    pub fn interval(&self) -> Duration {
        self.interval
    }

    /// The exposition text of now (the node's registry, then every extra
    /// source), per-tier gauges refreshed first (as `/metrics` does).
    fn snapshot(&self) -> Snapshot {
        self.store.stats();
        let mut text = encode_text(&self.registry);
        for source in &self.sources {
            text.push_str(&encode_text(source));
        }
        Snapshot::parse(&text)
    }

    /// Take one history sample now.
    pub fn sample(&self) {
        let snap = self.snapshot();
        self.history.lock().record(snap, unix_ms());
        self.note_members();
    }

    /// Sample every interval (the first at once) until `stop` turns true.
    pub fn spawn_sampler(self: &Arc<Self>, mut stop: watch::Receiver<bool>) {
        let console = self.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(console.interval);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = tick.tick() => {
                        let c = console.clone();
                        // stats() walks the block index: off the async workers.
                        let _ = tokio::task::spawn_blocking(move || c.sample()).await;
                    }
                    _ = async { stop.wait_for(|s| *s).await.is_ok() } => break,
                }
            }
        });
    }

    /// Remember the members of the current view (so a departed one shows as gone).
    fn note_members(&self) {
        if let Some(node) = &self.node {
            let view = node.view();
            let mut seen = self.seen.lock();
            for (id, n) in &view.nodes {
                seen.insert(id.clone(), n.grpc_addr.clone());
            }
        } else {
            let id = self.store.config().node_id.clone();
            let addr = self.store.config().grpc_listen.to_string();
            self.seen.lock().insert(id, addr);
        }
    }

    /// This node's summary: tiers, counters, hit ratio, top prefixes and
    /// (with `with_history`) the history ring.
    pub fn summary(&self, with_history: bool) -> SummaryResponse {
        let stats = self.store.stats();
        let snap = Snapshot::parse(&encode_text(&self.registry));
        let hit_ratio =
            series::value(&HIT_RATIO, &Snapshot::default(), &snap, 0.0).unwrap_or(f64::NAN);
        let store = &self.store;
        let top_prefixes = self.prefixes.top(PREFIXES_REPORTED, |tip, depth| {
            depth_tokens(store, tip, depth)
        });
        SummaryResponse {
            node_id: self
                .node
                .as_ref()
                .map_or(stats.node_id, |n| n.info().node_id.clone()),
            tiers: stats
                .tiers
                .into_iter()
                .map(crate::wire::tier_stats_to_proto)
                .collect(),
            hit_blocks: stats.hit_blocks,
            miss_blocks: stats.miss_blocks,
            hit_tokens: stats.hit_tokens,
            miss_tokens: stats.miss_tokens,
            history: with_history.then(|| self.history.lock().to_pb()),
            top_prefixes,
            hit_ratio,
        }
    }
}

/// Tokens in a prefix of `depth` blocks ending at `tip`, when this node holds
/// the tip (full blocks before it, the tip's own count last); 0 otherwise.
fn depth_tokens(store: &Store, tip: &BlockKey, depth: u32) -> u64 {
    match store.block_infos(std::slice::from_ref(tip)).first() {
        Some(Some(info)) => {
            u64::from(depth.saturating_sub(1)) * u64::from(info.layout.block_tokens)
                + u64::from(info.tokens)
        }
        _ => 0,
    }
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}
