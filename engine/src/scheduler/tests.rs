//! Every way a sequence leaves the scheduler gives its blocks back: the pool
//! is at its starting count once the work is done, on the normal path and on
//! the abort paths (cancelled mid-prefill, failed load, cancelled while
//! loading, saves that end late, a load dropped while the connector still
//! writes). Runs the reference model with a fake fabric.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use kvfabric_connector::{
    BlockId, ConnectorStats, KvConnector, Pending, PendingLoad, PendingLookup, SaveBlock, SaveDone,
};
use kvfabric_types::{BlockKey, DType};
use tokio::sync::mpsc;

use super::fabric_state::LoadBlocks;
use super::*;
use crate::request::{Fork, SamplingParams};

const BT: usize = 16;
const BLOCKS: usize = 8;

fn scheduler(max_batch_tokens: usize, connector: Option<Arc<dyn KvConnector>>) -> Scheduler {
    let m = crate::model::test_model();
    let c = &m.config;
    let layout = KvPool::layout_for(c.layers, c.kv_heads, c.head_dim, BT, DType::F16);
    let kv = KvPool::with_bytes(layout, (BLOCKS * layout.block_bytes()) as u64).expect("pool");
    let cfg = SchedulerConfig {
        max_batch_tokens,
        max_seqs: 4,
        role: Role::Both,
        metrics: EngineMetrics::new(),
        prefix_cache: true,
        spec: crate::spec::SpecConfig::default(),
    };
    Scheduler::new(m, Compute::new(2), kv, cfg, connector)
}

/// Submit a `len`-token prompt straight to the scheduler.
fn submit(s: &mut Scheduler, len: usize, max_tokens: usize) -> mpsc::Receiver<GenerationEvent> {
    let (events, rx) = mpsc::channel(1024);
    s.accept(GenerationRequest {
        prompt: (0..len as u32)
            .map(|i| (i * 31 + 977) % 48_000 + 100)
            .collect(),
        max_tokens,
        sampling: SamplingParams::default(),
        stop_token_ids: vec![],
        namespace: b"blocks".to_vec(),
        owner: None,
        return_logits: false,
        forks: Vec::new(),
        events,
    });
    rx
}

/// Step until nothing is left to run, load or flush.
pub(super) fn settle(s: &mut Scheduler) {
    for _ in 0..500 {
        if s.idle() {
            return;
        }
        s.step();
    }
    panic!("the scheduler did not settle");
}

fn finished(rx: &mut mpsc::Receiver<GenerationEvent>) -> bool {
    while let Ok(ev) = rx.try_recv() {
        if let GenerationEvent::Finished { .. } = ev {
            return true;
        }
    }
    false
}

/// A fabric that holds every block (`find_all`) or none, whose loads and
/// saves end when the test says.
#[derive(Debug, Default)]
pub(super) struct FakeFabric {
    find_all: bool,
    loads: Mutex<Vec<crossbeam::channel::Sender<usize>>>,
    pub(super) saves: Mutex<Vec<SaveBlock>>,
    done: Mutex<Vec<SaveDone>>,
}

pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().expect("fake fabric lock")
}

impl FakeFabric {
    /// End every load in flight with `arrived` blocks verified.
    fn end_loads(&self, arrived: usize) {
        for tx in lock(&self.loads).drain(..) {
            let _ = tx.send(arrived);
        }
    }

    /// End every queued save, stored.
    pub(super) fn end_saves(&self) {
        let saves = std::mem::take(&mut *lock(&self.saves));
        lock(&self.done).extend(saves.into_iter().map(|b| SaveDone {
            key: b.key,
            block: b.block,
            tag: b.tag,
            stored: true,
        }));
    }
}

impl KvConnector for FakeFabric {
    fn start_lookup(&self, keys: Vec<BlockKey>) -> PendingLookup {
        let (tx, rx) = crossbeam::channel::bounded(1);
        let _ = tx.send(if self.find_all { keys.len() } else { 0 });
        Pending::new(rx, keys.len())
    }

    fn prefetch(&self, _keys: &[BlockKey], _owner: Option<std::sync::Arc<str>>) {}

    fn start_load(&self, blocks: Vec<(BlockKey, BlockId)>) -> PendingLoad {
        let (tx, rx) = crossbeam::channel::bounded(1);
        lock(&self.loads).push(tx);
        Pending::new(rx, blocks.len())
    }

    fn save(&self, block: SaveBlock) -> bool {
        lock(&self.saves).push(block);
        true
    }

    fn finished_saves(&self, _wait: Duration) -> Vec<SaveDone> {
        std::mem::take(&mut *lock(&self.done))
    }

    fn flush(&self, _timeout: Duration) -> bool {
        true
    }

    fn holder(&self) -> String {
        "fake".into()
    }

    fn stats(&self) -> ConnectorStats {
        ConnectorStats::default()
    }
}

#[test]
fn a_request_cancelled_mid_prefill_returns_every_block() {
    // 16-token steps: a 60-token prompt takes four steps to prefill.
    let mut s = scheduler(BT, None);
    assert_eq!(s.blocks.available(), BLOCKS);
    let rx = submit(&mut s, 60, 4);
    s.step();
    s.step();
    assert_eq!(s.running[0].computed, 2 * BT, "still prefilling");
    assert_eq!(s.blocks.available(), BLOCKS - 2);
    drop(rx);
    s.step();
    assert!(s.running.is_empty() && s.waiting.is_empty());
    assert_eq!(
        s.blocks.available(),
        BLOCKS,
        "the cancelled table came back"
    );
    assert_eq!(s.blocks.cached(), 2, "its computed blocks stay cached");
}

#[test]
fn a_failed_load_returns_its_blocks_and_the_request_recomputes() {
    let fabric = Arc::new(FakeFabric {
        find_all: true,
        ..FakeFabric::default()
    });
    let mut s = scheduler(2048, Some(fabric.clone()));
    let mut rx = submit(&mut s, 60, 2);
    // Lookup (all 3 full blocks found), then the load takes 3 blocks.
    s.step();
    s.step();
    assert_eq!(s.loading.len(), 1);
    assert_eq!(s.blocks.available(), BLOCKS - 3);
    fabric.end_loads(0);
    settle(&mut s);
    assert!(finished(&mut rx), "recomputed after the failed load");
    fabric.end_saves();
    s.poll_fabric(Duration::ZERO);
    assert_eq!(s.saves.len(), 0);
    assert_eq!(s.blocks.available(), BLOCKS);
}

#[test]
fn a_request_cancelled_while_loading_returns_the_loaded_blocks() {
    let fabric = Arc::new(FakeFabric {
        find_all: true,
        ..FakeFabric::default()
    });
    let mut s = scheduler(2048, Some(fabric.clone()));
    let rx = submit(&mut s, 60, 2);
    s.step();
    s.step();
    assert_eq!(s.blocks.available(), BLOCKS - 3);
    drop(rx);
    // All three arrive, but nobody wants them any more.
    fabric.end_loads(3);
    settle(&mut s);
    assert!(s.running.is_empty() && s.loading.is_empty());
    assert_eq!(s.blocks.available(), BLOCKS);
    assert_eq!(s.blocks.cached(), 3, "the loaded blocks stay cached");
}

#[test]
fn blocks_being_saved_stay_pinned_until_the_save_ends() {
    let fabric = Arc::new(FakeFabric::default());
    let mut s = scheduler(2048, Some(fabric.clone()));
    let mut rx = submit(&mut s, 60, 2);
    settle(&mut s);
    assert!(finished(&mut rx));
    // The request is done; its 3 full blocks are pinned for their saves
    // (the 4th, partial, block is free again).
    assert_eq!(s.saves.len(), 3);
    assert_eq!(s.blocks.available(), BLOCKS - 3);
    fabric.end_saves();
    s.poll_fabric(Duration::ZERO);
    assert_eq!(s.saves.len(), 0);
    assert_eq!(s.blocks.available(), BLOCKS);
    assert_eq!(s.blocks.cached(), 3);
}

#[test]
fn a_load_dropped_mid_flight_keeps_its_blocks_until_the_load_ends() {
    let pool = BlockPool::new(BLOCKS);
    let (tx, rx) = crossbeam::channel::bounded(1);
    let load = LoadBlocks::new(Pending::new(rx, 3), pool.allocate(3));
    drop(load);
    pool.reap();
    assert_eq!((pool.available(), pool.parked()), (BLOCKS - 3, 1));
    tx.send(3).expect("send");
    pool.reap();
    assert_eq!((pool.available(), pool.parked()), (BLOCKS, 0));
    // A load that already ended gives its blocks back at once.
    let (tx, rx) = crossbeam::channel::bounded(1);
    let mut load = LoadBlocks::new(Pending::new(rx, 2), pool.allocate(2));
    tx.send(2).expect("send");
    assert_eq!(load.wait(Duration::ZERO), Some(2));
    drop(load);
    assert_eq!((pool.available(), pool.parked()), (BLOCKS, 0));
}

/// `n` samples: forks share the prompt's full blocks and copy its partial
/// one; every block comes back when they end or are cancelled, and a fork
/// that finds no block left gets an error instead of corrupting another's.
#[test]
fn forks_share_the_prompt_and_give_every_block_back() {
    let mut s = scheduler(256, None);
    let fork = |s: &mut Scheduler, n: usize| {
        let (rxs, forks): (Vec<_>, Vec<_>) = (0..n)
            .map(|_| {
                let (events, rx) = mpsc::channel(1024);
                (
                    rx,
                    Fork {
                        sampling: SamplingParams::default(),
                        events,
                    },
                )
            })
            .unzip();
        let (events, rx) = mpsc::channel(1024);
        s.accept(GenerationRequest {
            prompt: (0..40u32).map(|i| i * 7 + 300).collect(),
            max_tokens: 4,
            sampling: SamplingParams::default(),
            stop_token_ids: vec![],
            namespace: b"forks".to_vec(),
            owner: None,
            return_logits: false,
            forks,
            events,
        });
        (rx, rxs)
    };
    // 40 tokens = 2 full blocks + 1 partial: 3 forks need 3 copies, 6 in all.
    let (mut rx, mut rxs) = fork(&mut s, 3);
    s.step();
    assert_eq!(s.running.len(), 4, "the forks run after one prefill");
    assert_eq!(s.blocks.available(), BLOCKS - 6);
    drop(rxs.pop());
    settle(&mut s);
    assert!(finished(&mut rx) && rxs.iter_mut().all(finished));
    assert_eq!(s.blocks.available(), BLOCKS);
    // 6 forks: the pool has 8 blocks, 3 for the prompt, so one fork fails.
    let (mut rx, mut rxs) = fork(&mut s, 6);
    s.step();
    let mut failed = 0;
    for r in rxs.iter_mut() {
        if let Ok(GenerationEvent::Error(_)) = r.try_recv() {
            failed += 1;
        }
    }
    assert_eq!(failed, 1);
    settle(&mut s);
    assert!(finished(&mut rx));
    assert_eq!(s.blocks.available(), BLOCKS);
}

#[test]
fn the_gauges_read_zero_once_every_request_finished() {
    // Six requests over four sequence slots: some wait, all run, all finish.
    let mut s = scheduler(2048, None);
    let mut rxs: Vec<_> = (0..6).map(|i| submit(&mut s, 20 + i, 3)).collect();
    s.step();
    let m = s.cfg.metrics.clone();
    assert_eq!(m.running_requests.get(), 4, "four admitted");
    assert_eq!(m.waiting_requests.get(), 2, "two waiting");
    settle(&mut s);
    assert!(rxs.iter_mut().all(finished), "every request finished");
    // The last step still ran sequences; the gauges show what it left.
    assert_eq!(m.running_requests.get(), 0, "nothing runs when idle");
    assert_eq!(m.waiting_requests.get(), 0, "nothing waits when idle");
}
