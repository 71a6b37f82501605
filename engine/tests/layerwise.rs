//! The scheduler's layer-wise loading on the reference model, against an
//! in-memory fabric that streams real KV blocks layer by layer:
//! * the forward pass runs while the load streams (it blocks on a layer
//!   that has not arrived) and the output is bitwise the cold run's;
//! * a layer that fails its check mid-stream voids that step: the engine
//!   uses the blocks before the failed one and recomputes the rest;
//! * a stream stalled beyond `layer_wait` voids the step too; the sequence
//!   waits for the load to end and then uses every block.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytesize::ByteSize;
use kvfabric_connector::{
    BlockId, ConnectFn, ConnectorStats, KvConnector, KvMemory, LoadProgress, Pending, PendingLoad,
    PendingLookup, SaveBlock, SaveDone,
};
use kvfabric_engine::http::EngineMetrics;
use kvfabric_engine::model::LlamaModel;
use kvfabric_engine::{EngineBuilder, EngineConfig, Role, RunningEngine, SamplingParams};
use kvfabric_testkit::engine::requests::{self, stop};
use kvfabric_types::BlockKey;

const BT: usize = 16;

/// What the fake fabric does to a load.
#[derive(Clone, Copy, Debug)]
enum Fault {
    None,
    /// Layer `layer` of block `block` fails its check.
    FailAt {
        block: usize,
        layer: usize,
    },
    /// Layer `layer` arrives `delay` late (the stream completes afterwards).
    Stall {
        layer: usize,
        delay: Duration,
    },
}

type Blocks = Arc<Mutex<HashMap<BlockKey, Vec<u8>>>>;

/// A fabric in this process: saves copy blocks into a map, loads stream
/// them back layer by layer from a thread.
#[derive(Debug)]
struct MemFabric {
    mem: KvMemory,
    blocks: Blocks,
    fault: Fault,
    layer_wait: Duration,
    done_tx: crossbeam::channel::Sender<SaveDone>,
    done_rx: crossbeam::channel::Receiver<SaveDone>,
    /// Set when a load saw the engine blocked on one of its layers.
    saw_waiter: Arc<AtomicBool>,
}

impl MemFabric {
    fn connect(
        blocks: Blocks,
        fault: Fault,
        layer_wait: Duration,
        saw: Arc<AtomicBool>,
    ) -> ConnectFn {
        Box::new(move |mem, _| {
            let (done_tx, done_rx) = crossbeam::channel::unbounded();
            let c: Arc<dyn KvConnector> = Arc::new(MemFabric {
                mem,
                blocks,
                fault,
                layer_wait,
                done_tx,
                done_rx,
                saw_waiter: saw,
            });
            Ok(c)
        })
    }
}

fn answered(n: usize, most: usize) -> Pending {
    let (tx, rx) = crossbeam::channel::bounded(1);
    let _ = tx.send(n);
    Pending::new(rx, most)
}

impl KvConnector for MemFabric {
    fn start_lookup(&self, keys: Vec<BlockKey>) -> PendingLookup {
        let map = self.blocks.lock().expect("map");
        let found = keys.iter().take_while(|k| map.contains_key(k)).count();
        answered(found, keys.len())
    }

    fn prefetch(&self, _keys: &[BlockKey], _owner: Option<std::sync::Arc<str>>) {}

    fn start_load(&self, blocks: Vec<(BlockKey, BlockId)>) -> PendingLoad {
        let (tx, rx) = crossbeam::channel::bounded(1);
        let progress = Arc::new(LoadProgress::default());
        let n = blocks.len();
        let src: Vec<Vec<u8>> = {
            let map = self.blocks.lock().expect("map");
            blocks.iter().map(|(k, _)| map[k].clone()).collect()
        };
        let (mem, fault, p, saw) = (
            self.mem.clone(),
            self.fault,
            progress.clone(),
            self.saw_waiter.clone(),
        );
        std::thread::spawn(move || {
            let layers = mem.layout.layers as usize;
            let lb = mem.layout.layer_bytes();
            p.start_streaming(n);
            let mut ok = n;
            // The layer where the engine must be blocked on the stream first.
            let gate = match fault {
                Fault::None => layers - 1,
                Fault::FailAt { layer, .. } | Fault::Stall { layer, .. } => layer,
            };
            for l in 0..layers {
                // Wait (bounded) until the engine's forward pass blocks on this layer.
                if l == gate {
                    let until = Instant::now() + Duration::from_secs(5);
                    while p.waiters() == 0 && Instant::now() < until {
                        std::thread::sleep(Duration::from_millis(1));
                    }
                    if p.waiters() > 0 {
                        saw.store(true, Ordering::SeqCst);
                    }
                }
                if let Fault::Stall { layer, delay } = fault {
                    if layer == l {
                        std::thread::sleep(delay);
                    }
                }
                for (j, (_, b)) in blocks.iter().enumerate().take(ok) {
                    if let Fault::FailAt { block, layer } = fault {
                        if block == j && layer == l {
                            ok = j;
                            p.fail();
                            break;
                        }
                    }
                    let at = mem.block_offset(*b) as usize + l * lb;
                    // SAFETY: the engine does not touch a loading block's bytes
                    // before the layer is published.
                    let dst = unsafe { mem.region.slice_mut(at, lb) }.expect("slice");
                    dst.copy_from_slice(&src[j][l * lb..(l + 1) * lb]);
                }
                if ok == n {
                    p.layers_ready(l + 1);
                }
            }
            let _ = tx.send(ok);
        });
        Pending::streamed(rx, n, progress, self.layer_wait)
    }

    fn save(&self, b: SaveBlock) -> bool {
        let len = self.mem.block_bytes();
        // SAFETY: the engine keeps a block queued for saving unchanged.
        let bytes = unsafe {
            self.mem
                .region
                .slice(self.mem.block_offset(b.block) as usize, len)
        }
        .expect("slice")
        .to_vec();
        self.blocks
            .lock()
            .expect("map")
            .entry(b.key)
            .or_insert(bytes);
        let _ = self.done_tx.send(SaveDone {
            key: b.key,
            block: b.block,
            tag: b.tag,
            stored: true,
        });
        true
    }

    fn finished_saves(&self, wait: Duration) -> Vec<SaveDone> {
        let mut out: Vec<SaveDone> = self.done_rx.try_iter().collect();
        if out.is_empty() && !wait.is_zero() {
            if let Ok(d) = self.done_rx.recv_timeout(wait) {
                out.push(d);
            }
        }
        out
    }

    fn flush(&self, _timeout: Duration) -> bool {
        true
    }

    fn holder(&self) -> String {
        "mem".into()
    }

    fn stats(&self) -> ConnectorStats {
        ConnectorStats::default()
    }
}

fn engine(
    model: &Arc<LlamaModel>,
    connect: Option<ConnectFn>,
    metrics: &EngineMetrics,
) -> RunningEngine {
    let c = &model.config;
    // One block of the default KV dtype.
    let dtype = EngineConfig::default().kv_dtype.into();
    let block_bytes =
        kvfabric_engine::kv::KvPool::layout_for(c.layers, c.kv_heads, c.head_dim, BT, dtype)
            .block_bytes();
    let cfg = EngineConfig {
        threads: 2,
        block_tokens: BT,
        kv_pool: ByteSize::b((64 * block_bytes) as u64),
        max_batch_tokens: 256,
        max_seqs: 4,
        role: Role::Both,
        ..EngineConfig::default()
    };
    EngineBuilder::new(cfg)
        .metrics(metrics.clone())
        .connector(connect)
        .start(model.clone())
        .expect("start")
}

/// Greedy tokens, logits bits and cached tokens of one request.
fn run(e: &RunningEngine, prompt: &[u32], max_tokens: usize) -> (Vec<u32>, Vec<Vec<u32>>, usize) {
    let sampling = SamplingParams::default();
    let (req, rx) = requests::request(prompt, max_tokens, sampling, b"layerwise", 1024);
    requests::submit(e, req);
    let (toks, logits, _, usage) = requests::collect(rx);
    (toks, logits, usage.cached_tokens)
}

#[test]
fn streamed_loads_are_bit_exact_and_faults_fall_back_to_recompute() {
    let model = kvfabric_testkit::engine::model();
    let first: Vec<u32> = (0..197u32).map(|i| (i * 31 + 977) % 48_000 + 100).collect();
    let mut second = first.clone();
    second.extend((0..20u32).map(|i| (i * 53 + 11) % 48_000 + 100));

    // The cold run: no fabric.
    let cold_engine = engine(&model, None, &EngineMetrics::new());
    let cold = run(&cold_engine, &second, 4);
    stop(cold_engine);
    assert_eq!(cold.2, 0);

    // Engine A computes `first` and saves its blocks.
    let blocks: Blocks = Arc::default();
    let saw = Arc::new(AtomicBool::new(false));
    let a = engine(
        &model,
        Some(MemFabric::connect(
            blocks.clone(),
            Fault::None,
            Duration::from_secs(5),
            saw.clone(),
        )),
        &EngineMetrics::new(),
    );
    run(&a, &first, 8);
    stop(a);
    assert!(blocks.lock().expect("map").len() >= 12);

    let cases = [
        // (fault, layer wait, cached tokens expected, steps discarded)
        (Fault::None, Duration::from_secs(5), 12 * BT, 0),
        (
            Fault::FailAt { block: 5, layer: 7 },
            Duration::from_secs(5),
            5 * BT,
            1,
        ),
        (
            Fault::Stall {
                layer: 3,
                delay: Duration::from_millis(600),
            },
            Duration::from_millis(100),
            12 * BT,
            1,
        ),
    ];
    for (fault, wait, cached, fallbacks) in cases {
        let metrics = EngineMetrics::new();
        let saw = Arc::new(AtomicBool::new(false));
        // What A saved, without what earlier cases' engines saved.
        let saved: Blocks = Arc::new(Mutex::new(blocks.lock().expect("map").clone()));
        let b = engine(
            &model,
            Some(MemFabric::connect(saved, fault, wait, saw.clone())),
            &metrics,
        );
        let warm = run(&b, &second, 4);
        stop(b);
        assert_eq!(warm.2, cached, "{fault:?}: cached tokens");
        assert_eq!(
            warm.0, cold.0,
            "{fault:?}: greedy tokens differ from the cold run"
        );
        assert!(
            warm.1 == cold.1,
            "{fault:?}: logits differ from the cold run"
        );
        assert_eq!(
            metrics.stream_fallbacks.get(),
            fallbacks,
            "{fault:?}: discarded steps"
        );
        assert!(
            metrics.streamed_steps.get() >= 1,
            "{fault:?}: no step ran on the stream"
        );
        assert!(
            saw.load(Ordering::SeqCst),
            "{fault:?}: the forward pass never waited on a layer"
        );
    }
}
