//! The contract between the HTTP front and the scheduler.
//!
//! The HTTP layer turns an OpenAI request into a [`GenerationRequest`] and
//! submits it through an [`EngineHandle`]; the scheduler streams
//! [`GenerationEvent`]s back on the request's channel. Dropping the receiver
//! (client disconnected, stop sequence seen) cancels the request: the
//! scheduler notices the closed channel at its next step and frees the blocks.

use kvfabric_types::{KeyChain, KvLayout, ModelFingerprint};
use tokio::sync::mpsc;

/// How the next token is chosen.
#[derive(Clone, Debug, PartialEq)]
pub struct SamplingParams {
    /// 0 = greedy (argmax, ties to the lowest id).
    pub temperature: f32,
    /// Nucleus sampling mass; 1.0 = off.
    pub top_p: f32,
    /// Keep only the k most likely tokens; 0 = off.
    pub top_k: usize,
    /// Seed of the request's own RNG: same seed, same prompt -> same tokens.
    /// None = drawn from the OS.
    pub seed: Option<u64>,
    /// Only tokens this grammar allows (`response_format`, forced tool
    /// calls); each sample runs its own matcher from it (`crate::grammar`).
    pub constraint: Option<crate::grammar::Constraint>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 0.0,
            top_p: 1.0,
            top_k: 0,
            seed: None,
            constraint: None,
        }
    }
}

/// One generation job.
#[derive(Debug)]
pub struct GenerationRequest {
    /// Prompt token ids (chat template already applied).
    pub prompt: Vec<u32>,
    /// Upper bound on generated tokens.
    pub max_tokens: usize,
    /// Sampling configuration.
    pub sampling: SamplingParams,
    /// Token ids that end generation (the model's EOS / end-of-turn ids).
    pub stop_token_ids: Vec<u32>,
    /// Tenant cache salt: requests in different namespaces never share KV.
    pub namespace: Vec<u8>,
    /// Who the blocks this request saves into the fabric count to in the
    /// node's tier shares (the tenant's [`kvfabric_tenants::Identity::owner`]);
    /// None: nobody (single-tenant mode).
    pub owner: Option<std::sync::Arc<str>>,
    /// Send the full logits row with every token (logprobs, tests and
    /// bit-exactness checks).
    pub return_logits: bool,
    /// More samples of the same prompt (OpenAI `n`): the prompt is computed
    /// once, then each fork takes its own first token from the same logits
    /// and decodes on its own, sharing the prompt's full KV blocks.
    pub forks: Vec<Fork>,
    /// Where the scheduler streams events.
    pub events: mpsc::Sender<GenerationEvent>,
}

/// One more sample of a request's prompt: its own sampling (seed) and its
/// own event channel, which behaves exactly as the request's own.
#[derive(Debug)]
pub struct Fork {
    pub sampling: SamplingParams,
    pub events: mpsc::Sender<GenerationEvent>,
}

/// Why generation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// A stop token was produced.
    Stop,
    /// `max_tokens` or the context length was reached.
    Length,
}

/// Token counts for the OpenAI `usage` object.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    /// Prompt tokens whose KV was reused (local prefix cache or fabric).
    pub cached_tokens: usize,
}

/// What a prefill-role engine hands to the decode side (OpenAI
/// `kv_transfer_params`): the prompt's full blocks, saved in the fabric.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TransferParams {
    /// Node of the fabric that saved them (the embedded node of this engine).
    pub holder: String,
    /// Keys of the prompt's leading full blocks, in order, all saved.
    pub block_keys: Vec<kvfabric_types::BlockKey>,
    /// Tokens per block.
    pub block_tokens: usize,
}

/// What the scheduler streams back.
#[derive(Clone, Debug, PartialEq)]
pub enum GenerationEvent {
    /// Sent once, when the request first has its prefix in place: how many
    /// prompt tokens were reused (local prefix cache or fabric).
    Admitted { cached_tokens: usize },
    /// One generated token (the stop token itself is not sent).
    Token { id: u32, logits: Option<Vec<f32>> },
    /// Prefill role only, sent just before `Finished`: the prompt's blocks
    /// are saved in the fabric and visible cluster-wide.
    Saved(TransferParams),
    /// Generation ended normally.
    Finished { reason: FinishReason, usage: Usage },
    /// The request failed (e.g. prompt longer than the context).
    Error(String),
}

/// What names a prompt's blocks on one engine besides the tokens and the
/// namespace: the model's fingerprint and the KV pool's layout. The
/// scheduler keys every sequence with [`KeyBasis::chain`], and
/// `POST /v1/kvfabric/keys` answers with the same chain.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KeyBasis {
    pub model: ModelFingerprint,
    pub layout: KvLayout,
}

impl KeyBasis {
    /// The key chain of `namespace` (tenant, `cache_salt`) on this engine.
    pub fn chain(&self, namespace: &[u8]) -> KeyChain {
        KeyChain::new(namespace, &self.model, &self.layout)
    }
}

/// Cloneable handle to submit requests to a running engine.
#[derive(Clone, Debug)]
pub struct EngineHandle {
    submit: mpsc::Sender<GenerationRequest>,
    /// The scheduler's low-priority intake (batch jobs), when it has one.
    batch: Option<mpsc::Sender<GenerationRequest>>,
    /// How the scheduler keys blocks (None: a test's fake engine).
    keys: Option<KeyBasis>,
}

impl EngineHandle {
    /// Wrap the scheduler's intake channel.
    pub fn new(submit: mpsc::Sender<GenerationRequest>) -> Self {
        EngineHandle {
            submit,
            batch: None,
            keys: None,
        }
    }

    /// The handle of a scheduler that keys blocks by `basis`.
    pub fn with_keys(mut self, basis: KeyBasis) -> Self {
        self.keys = Some(basis);
        self
    }

    /// How the engine behind this handle keys blocks (None: unknown).
    pub fn key_basis(&self) -> Option<&KeyBasis> {
        self.keys.as_ref()
    }

    /// Wrap both intakes of a scheduler: `submit` for interactive requests,
    /// `batch` for requests that run below them (see `scheduler/priority.rs`).
    pub fn with_batch_intake(
        submit: mpsc::Sender<GenerationRequest>,
        batch: mpsc::Sender<GenerationRequest>,
    ) -> Self {
        EngineHandle {
            submit,
            batch: Some(batch),
            keys: None,
        }
    }

    /// A handle whose requests run at batch priority: admitted only when no
    /// interactive request waits, paused when one does. A handle without a
    /// batch intake (a test's fake engine) returns itself.
    pub fn batch_class(&self) -> EngineHandle {
        EngineHandle {
            submit: self.batch.clone().unwrap_or_else(|| self.submit.clone()),
            batch: None,
            keys: self.keys,
        }
    }

    /// Queue a request; fails only when the engine has shut down.
    pub async fn submit(&self, req: GenerationRequest) -> Result<(), crate::EngineError> {
        self.submit
            .send(req)
            .await
            .map_err(|_| crate::EngineError::ShutDown)
    }
}
