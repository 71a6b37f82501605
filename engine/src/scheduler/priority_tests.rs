//! The batch class's rules: an interactive request gets a slot within one
//! step even when batch sequences fill them all, batch requests wait while
//! interactive ones do, at most `batch_cap` run, and a paused batch
//! sequence produces the tokens it would have produced unpaused.

use kvfabric_types::DType;
use tokio::sync::mpsc;

use super::super::tests::settle;
use super::super::*;
use crate::request::SamplingParams;

const BT: usize = 16;
const BLOCKS: usize = 32;

fn scheduler(max_seqs: usize, batch_cap: usize) -> Scheduler {
    let m = crate::model::test_model();
    let c = &m.config;
    let layout = KvPool::layout_for(c.layers, c.kv_heads, c.head_dim, BT, DType::F16);
    let kv = KvPool::with_bytes(layout, (BLOCKS * layout.block_bytes()) as u64).expect("pool");
    let cfg = SchedulerConfig {
        max_batch_tokens: 2048,
        max_seqs,
        role: Role::Both,
        metrics: EngineMetrics::new(),
        prefix_cache: true,
        spec: crate::spec::SpecConfig::default(),
    };
    Scheduler::new(m, Compute::new(2), kv, cfg, None).with_batch_cap(batch_cap)
}

fn request(
    seed: u32,
    max_tokens: usize,
    sampling: SamplingParams,
) -> (GenerationRequest, mpsc::Receiver<GenerationEvent>) {
    let (events, rx) = mpsc::channel(1024);
    let req = GenerationRequest {
        prompt: (0..40u32)
            .map(|i| (i * 31 + seed * 977) % 48_000 + 100)
            .collect(),
        max_tokens,
        sampling,
        stop_token_ids: vec![],
        namespace: b"priority".to_vec(),
        owner: None,
        return_logits: false,
        forks: Vec::new(),
        events,
    };
    (req, rx)
}

/// The generated ids, once the request finished.
fn tokens(rx: &mut mpsc::Receiver<GenerationEvent>) -> Vec<u32> {
    let mut out = Vec::new();
    while let Ok(ev) = rx.try_recv() {
        match ev {
            GenerationEvent::Token { id, .. } => out.push(id),
            GenerationEvent::Finished { .. } => return out,
            GenerationEvent::Error(e) => panic!("request failed: {e}"),
            _ => {}
        }
    }
    panic!("the request did not finish");
}

fn interactive_running(s: &Scheduler) -> usize {
    s.running.iter().filter(|q| !q.batch).count()
}

#[test]
fn an_interactive_request_gets_a_slot_within_one_step_when_batch_fills_them_all() {
    let mut s = scheduler(2, 2);
    let mut batch: Vec<_> = (0..2)
        .map(|i| {
            let (r, rx) = request(i, 12, SamplingParams::default());
            s.accept_batch(r);
            rx
        })
        .collect();
    s.step();
    assert_eq!(s.batch_busy(), 2, "batch work fills the idle slots");
    let (r, mut rx) = request(7, 4, SamplingParams::default());
    s.accept(r);
    s.step();
    assert_eq!(interactive_running(&s), 1, "admitted at the next step");
    assert_eq!(s.batch_busy(), 1, "one batch sequence yielded its slot");
    assert_eq!(s.cfg.metrics.batch_yields.get(), 1);
    settle(&mut s);
    assert_eq!(tokens(&mut rx).len(), 4);
    for b in batch.iter_mut() {
        assert_eq!(
            tokens(b).len(),
            12,
            "the paused batch request still completes"
        );
    }
}

#[test]
fn batch_sequences_sit_out_the_steps_of_an_interactive_prefill() {
    let mut s = scheduler(4, 2);
    let (r, _b) = request(1, 30, SamplingParams::default());
    s.accept_batch(r);
    s.step();
    s.step();
    let generated = |s: &Scheduler| s.running.iter().find(|q| q.batch).map(|q| q.generated);
    let before = generated(&s);
    let (r, _i) = request(8, 4, SamplingParams::default());
    s.accept(r);
    s.step();
    assert_eq!(interactive_running(&s), 1);
    assert_eq!(generated(&s), before, "no batch row in the prefill's step");
    s.step();
    assert_eq!(
        generated(&s).map(|g| g - 1),
        before,
        "it goes on at the next step"
    );
}

#[test]
fn batch_requests_wait_while_interactive_ones_do_and_respect_their_cap() {
    let mut s = scheduler(2, 1);
    let (r, _b1) = request(1, 8, SamplingParams::default());
    s.accept_batch(r);
    let (r, _b2) = request(2, 8, SamplingParams::default());
    s.accept_batch(r);
    s.step();
    assert_eq!(s.batch_busy(), 1, "capped at one batch sequence");
    assert!(
        s.running.len() == 1,
        "the other slot stays free for interactive work"
    );
    // Three interactive requests on two slots: batch yields, and no batch
    // request is admitted while one of them still waits.
    let _rxs: Vec<_> = (0..3)
        .map(|i| {
            let (r, rx) = request(10 + i, 30, SamplingParams::default());
            s.accept(r);
            rx
        })
        .collect();
    s.step();
    assert_eq!(interactive_running(&s), 2);
    assert_eq!(
        s.batch_busy(),
        0,
        "batch yields while interactive work waits"
    );
    s.step();
    assert_eq!(
        s.batch_busy(),
        0,
        "and is not readmitted while it still waits"
    );
}

#[test]
fn a_paused_batch_sequence_produces_the_tokens_it_would_have_unpaused() {
    let seeded = SamplingParams {
        temperature: 0.8,
        seed: Some(42),
        ..SamplingParams::default()
    };
    for sampling in [SamplingParams::default(), seeded] {
        // Alone, never paused.
        let mut s = scheduler(1, 1);
        let (r, mut rx) = request(3, 16, sampling.clone());
        s.accept_batch(r);
        settle(&mut s);
        let alone = tokens(&mut rx);
        // Paused mid-decode by an interactive request, then resumed.
        let mut s = scheduler(1, 1);
        let (r, mut rx) = request(3, 16, sampling.clone());
        s.accept_batch(r);
        for _ in 0..5 {
            s.step();
        }
        let (r, mut irx) = request(9, 6, SamplingParams::default());
        s.accept(r);
        s.step();
        assert_eq!(s.batch_busy(), 0, "paused");
        assert_eq!(s.cfg.metrics.batch_yields.get(), 1);
        settle(&mut s);
        assert_eq!(tokens(&mut irx).len(), 6);
        assert_eq!(tokens(&mut rx), alone, "{sampling:?}");
    }
}
