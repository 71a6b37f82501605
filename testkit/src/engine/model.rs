//! The reference model (SmolLM2-135M-Instruct Q4_1) for the tests that run
//! it: its path, checked to exist, and the model loaded once per test binary.
//! The lookup itself (`$KVFABRIC_MODEL_PATH`, else the fetched cache path) is
//! the engine's `reference_model_path`, which `kvfabric model path` prints.

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use kvfabric_engine::model::LlamaModel;

/// The reference model's path; panics (saying how to fetch it) if absent.
pub fn model_path() -> PathBuf {
    let p = kvfabric_engine::model::reference_model_path();
    assert!(
        p.exists(),
        "reference model not found at {}: run `kvfabric model fetch` first",
        p.display()
    );
    p
}

/// The reference model, loaded once per test binary.
pub fn model() -> Arc<LlamaModel> {
    static M: OnceLock<Arc<LlamaModel>> = OnceLock::new();
    M.get_or_init(|| Arc::new(LlamaModel::load(&model_path(), |_, _| {}).expect("load model")))
        .clone()
}
