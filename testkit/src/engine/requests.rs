//! Requests to a running scheduler from a blocking test (the scheduler and
//! speculative-decoding tests): submit, collect every token with its logits
//! as bits, stop the engine and join its thread.

use kvfabric_engine::{
    FinishReason, GenerationEvent, GenerationRequest, RunningEngine, SamplingParams, Usage,
};
use tokio::sync::mpsc;

/// Tokens, each token's logits (bits), the finish reason and the usage.
pub type Outcome = (Vec<u32>, Vec<Vec<u32>>, FinishReason, Usage);

/// A request for `prompt` in `namespace` that returns logits, with the
/// receiver of its events (`capacity` of them buffered).
pub fn request(
    prompt: &[u32],
    max_tokens: usize,
    sampling: SamplingParams,
    namespace: &[u8],
    capacity: usize,
) -> (GenerationRequest, mpsc::Receiver<GenerationEvent>) {
    let (tx, rx) = mpsc::channel(capacity);
    let req = GenerationRequest {
        prompt: prompt.to_vec(),
        max_tokens,
        sampling,
        stop_token_ids: vec![],
        namespace: namespace.to_vec(),
        owner: None,
        return_logits: true,
        forks: Vec::new(),
        events: tx,
    };
    (req, rx)
}

/// Submit `req` from a thread of its own (the test holds no runtime).
pub fn submit(e: &RunningEngine, req: GenerationRequest) {
    let h = e.handle.clone();
    std::thread::spawn(move || {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("rt")
            .block_on(h.submit(req))
            .expect("submit")
    })
    .join()
    .expect("submit thread");
}

/// Every event up to `Finished`; panics on an error event or a stream that
/// ends without `Finished`.
pub fn collect(mut rx: mpsc::Receiver<GenerationEvent>) -> Outcome {
    let (mut toks, mut logits) = (Vec::new(), Vec::new());
    while let Some(ev) = rx.blocking_recv() {
        match ev {
            GenerationEvent::Token { id, logits: l } => {
                toks.push(id);
                logits.push(l.expect("logits").iter().map(|x| x.to_bits()).collect());
            }
            GenerationEvent::Finished { reason, usage } => return (toks, logits, reason, usage),
            GenerationEvent::Error(e) => panic!("request failed: {e}"),
            GenerationEvent::Saved(_) | GenerationEvent::Admitted { .. } => {}
        }
    }
    panic!("event stream ended without Finished");
}

/// Drop the engine's handle and join its scheduler thread.
pub fn stop(e: RunningEngine) {
    drop(e.handle);
    e.thread.join().expect("scheduler thread");
}
