//! kvfabric-engine: the bundled prefill/decode engine.
//!
//! GGUF loading, tokenizer, Llama forward pass with batch-invariant kernels,
//! paged KV in fabric-sized blocks, continuous batching and the OpenAI API.
//! See docs/ARCHITECTURE.md, "Engine".

pub mod batch;
pub mod chat;
mod clock;
pub mod config;
pub mod engine;
mod error;
pub mod gguf;
pub mod grammar;
pub mod http;
pub mod kernels;
pub mod kv;
pub mod metrics;
pub mod model;
pub mod request;
pub mod sampling;
pub mod scheduler;
pub mod spec;
pub mod tokenizer;

pub use config::{EngineConfig, IsaChoice, KvDtype, Role};
pub use engine::{EngineBuilder, RunningEngine};
pub use error::{EngineError, GrammarFault, LibraryError};
pub use metrics::EngineMetrics;
pub use request::{
    EngineHandle, FinishReason, Fork, GenerationEvent, GenerationRequest, KeyBasis, SamplingParams,
    TransferParams, Usage,
};
