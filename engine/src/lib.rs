//! kvfabric-engine: the bundled prefill/decode engine.
//!
//! GGUF loading, tokenizer, Llama forward pass with batch-invariant kernels,
//! paged KV in fabric-sized blocks, continuous batching and the OpenAI API.
//! See docs/ARCHITECTURE.md, "Engine".

mod error;
pub mod request;

pub use error::EngineError;
pub use request::{
    EngineHandle, FinishReason, GenerationEvent, GenerationRequest, SamplingParams, Usage,
};
