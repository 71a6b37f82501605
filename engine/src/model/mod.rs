//! The Llama model: hyper-parameters from GGUF metadata and packed weights.
//!
//! Loading repacks every matrix once for the kernels (q|k|v and gate|up are
//! fused so a layer runs four matmuls), keeps norms as f32, and computes the
//! model fingerprint (blake3 of the whole weights file + architecture string)
//! that names this model's KV blocks in the fabric. The forward pass is in
//! [`llama`], the weights in `weights`.

pub mod llama;
mod weights;

use std::path::PathBuf;

pub use weights::{LayerWeights, LlamaConfig, LlamaModel};

/// File name of the reference model (SmolLM2-135M-Instruct, Q4_1) in the
/// model cache `kvfabric model fetch` fills.
pub const REFERENCE_MODEL_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

/// Where tests and tools look for the reference model:
/// `$KVFABRIC_MODEL_PATH`, else `~/.cache/kvfabric/models/` (the default
/// cache of `kvfabric model fetch`). It may not exist yet.
pub fn reference_model_path() -> PathBuf {
    std::env::var_os("KVFABRIC_MODEL_PATH")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let home = std::env::var_os("HOME")
                .map(PathBuf::from)
                .unwrap_or_default();
            home.join(".cache/kvfabric/models")
                .join(REFERENCE_MODEL_FILE)
        })
}

pub use llama::{ForwardOutput, RowLogits, SeqChunk};

/// The reference model, loaded once per test binary (unit tests that run
/// the engine need `kvfabric model fetch` first, like the integration tests).
#[cfg(test)]
pub(crate) fn test_model() -> std::sync::Arc<LlamaModel> {
    static M: std::sync::OnceLock<std::sync::Arc<LlamaModel>> = std::sync::OnceLock::new();
    M.get_or_init(|| {
        let p = reference_model_path();
        assert!(
            p.exists(),
            "{}: run `kvfabric model fetch` first",
            p.display()
        );
        std::sync::Arc::new(LlamaModel::load(&p, |_, _| {}).expect("load the reference model"))
    })
    .clone()
}
