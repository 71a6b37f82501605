//! What every peer is asked to do ([`PeerWorkload`]), what it reports
//! ([`Rates`]) and how a peer's run ended ([`PeerOutcome`]): the vocabulary
//! the venv driver, the child runner and the bench share.

use serde_json::{json, Value};

/// Pinned llama-cpp-python (the version the reference figures used).
pub const LLAMA_CPP_PYTHON_VERSION: &str = "0.3.36";
/// Pinned PyPI gguf (the converter; same as the engine's oracle venv).
pub const GGUF_VERSION: &str = "0.19.0";

/// The exact work every engine does, so all columns time the same tokens.
#[derive(Clone, Debug)]
pub struct PeerWorkload {
    pub threads: usize,
    pub repeats: usize,
    pub decode_steps: usize,
    pub prefill512: Vec<u32>,
    pub prefill2048: Vec<u32>,
    /// Eight 128-token prompts; batch 1 decodes the first one.
    pub decode_prompts: Vec<Vec<u32>>,
}

/// The four rates of one engine, tokens per second.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Rates {
    pub prefill512: f64,
    pub prefill2048: f64,
    pub decode1: f64,
    pub decode8: f64,
}

impl Rates {
    /// The report's keys for these rates: `<prefix>_prefill512_tps` ...
    /// (`prefill512_tps` ... for an empty prefix), null when not measured.
    pub fn keys(prefix: &str, rates: Option<&Rates>) -> Vec<(String, Value)> {
        let name = |figure: &str| {
            if prefix.is_empty() {
                format!("{figure}_tps")
            } else {
                format!("{prefix}_{figure}_tps")
            }
        };
        let v = |f: fn(&Rates) -> f64| rates.map_or(Value::Null, |r| json!(f(r)));
        vec![
            (name("prefill512"), v(|r| r.prefill512)),
            (name("prefill2048"), v(|r| r.prefill2048)),
            (name("decode1"), v(|r| r.decode1)),
            (name("decode8"), v(|r| r.decode8)),
        ]
    }
}

/// What one peer gave: its rates plus details worth reporting, or why not.
#[derive(Clone, Debug)]
pub enum PeerOutcome {
    Measured { rates: Rates, details: Value },
    Unavailable(String),
}
