//! Engine configuration (`[engine]` in the kvfabric config file).
//!
//! Every field has a default; unknown fields are refused so a typo is an
//! error at startup rather than a silently ignored setting.

use std::net::SocketAddr;
use std::path::PathBuf;

use bytesize::ByteSize;
use serde::{Deserialize, Serialize};

/// What this engine does with a request.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Prefill and decode (default).
    #[default]
    Both,
    /// Prefill only: finish after the first token, KV left cached for the connector to save.
    Prefill,
    /// Decode only: start from KV loaded through the connector (local prefix cache until then).
    Decode,
}

/// The instruction set the kernels run with.
///
/// Every choice gives the same bits (the kernels reduce in one fixed order
/// on every ISA); it changes speed only, so it is for measuring and for
/// working around a CPU, never for results.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum IsaChoice {
    /// The best this CPU supports (default).
    #[default]
    Auto,
    /// Portable scalar code.
    Scalar,
    /// AVX2 + FMA + F16C.
    Avx2,
    /// AVX-512 F/BW/VL (and AVX2).
    Avx512,
}

/// Element type of K and V in the engine's KV pool (and so in every block
/// it shares with the fabric).
///
/// K and V are computed in f32 and rounded once (to nearest, ties to even)
/// when written to the pool; attention widens them back exactly. The dtype
/// is part of the block layout and so of every block key: engines of
/// different dtypes never read each other's blocks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KvDtype {
    /// IEEE binary16 (default): half the bytes of f32, as llama.cpp's default cache.
    #[default]
    F16,
    /// bfloat16: f32's exponent range, 8 bits of mantissa.
    Bf16,
    /// f32: the values as computed.
    F32,
}

impl From<kvfabric_types::DType> for KvDtype {
    fn from(d: kvfabric_types::DType) -> Self {
        match d {
            kvfabric_types::DType::F16 => KvDtype::F16,
            kvfabric_types::DType::BF16 => KvDtype::Bf16,
            kvfabric_types::DType::F32 => KvDtype::F32,
        }
    }
}

impl From<KvDtype> for kvfabric_types::DType {
    fn from(d: KvDtype) -> Self {
        match d {
            KvDtype::F16 => kvfabric_types::DType::F16,
            KvDtype::Bf16 => kvfabric_types::DType::BF16,
            KvDtype::F32 => kvfabric_types::DType::F32,
        }
    }
}

/// Settings of the bundled engine.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EngineConfig {
    /// Kernel threads; 0 = one per core. Default: 0.
    pub threads: usize,
    /// Tokens per KV block, the unit shared with the fabric. Default: 64.
    pub block_tokens: usize,
    /// Memory of the paged KV pool, allocated and backed by pages at start
    /// (no page faults while a prefix is loaded into it). Default: 512 MiB.
    pub kv_pool: ByteSize,
    /// Most tokens in one forward step (decode tokens + prefill chunks). Default: 2048.
    pub max_batch_tokens: usize,
    /// Most sequences running at once. Default: 16.
    pub max_seqs: usize,
    /// both | prefill | decode. Default: both.
    pub role: Role,
    /// HTTP listen address of the OpenAI API. Default: 127.0.0.1:8000.
    pub listen: SocketAddr,
    /// Model id the API answers to. Default: "smollm2".
    pub model_name: String,
    /// Reuse blocks of earlier requests held in this engine's KV pool. Default: true.
    pub prefix_cache: bool,
    /// Kernel instruction set: auto | scalar | avx2 | avx512 (env
    /// `KVFABRIC_ISA`, flag `--isa`); one the CPU lacks is refused at start.
    /// Default: auto.
    pub isa: IsaChoice,
    /// Tenants file (API keys, namespaces, limits; docs/SECURITY.md). None:
    /// single-tenant mode, no keys checked (logged at start). Default: none.
    pub tenants_file: Option<PathBuf>,
    /// How often the tenants file is re-read (a revoked key is refused from
    /// the next read on). Default: 1000 ms.
    pub tenants_reload_ms: u64,
    /// Element type of the KV pool's K and V: f16 | bf16 | f32 (env
    /// `KVFABRIC_KV_DTYPE`, flag `--kv-dtype`). Default: f16.
    pub kv_dtype: KvDtype,
    /// `[engine.spec]`: speculative decoding (see [`crate::spec::SpecConfig`]).
    pub spec: crate::spec::SpecConfig,
    /// `[engine.batch]`: the async batch API (see [`crate::batch::BatchConfig`]).
    pub batch: crate::batch::BatchConfig,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            threads: 0,
            block_tokens: 64,
            kv_pool: ByteSize::mib(512),
            max_batch_tokens: 2048,
            max_seqs: 16,
            role: Role::Both,
            listen: SocketAddr::from(([127, 0, 0, 1], 8000)),
            model_name: "smollm2".into(),
            prefix_cache: true,
            isa: IsaChoice::Auto,
            tenants_file: None,
            tenants_reload_ms: 1000,
            kv_dtype: KvDtype::F16,
            spec: crate::spec::SpecConfig::default(),
            batch: crate::batch::BatchConfig::default(),
        }
    }
}

impl EngineConfig {
    /// Refuse settings the engine cannot run with.
    pub fn validate(&self) -> Result<(), crate::EngineError> {
        let bad = |m: &str| {
            Err(crate::EngineError::InvalidRequest(format!(
                "engine config: {m}"
            )))
        };
        if self.block_tokens == 0 {
            return bad("block_tokens must be > 0");
        }
        if self.max_batch_tokens < self.block_tokens {
            return bad("max_batch_tokens must be >= block_tokens");
        }
        if self.max_seqs == 0 {
            return bad("max_seqs must be > 0");
        }
        if self.batch.max_seqs == 0 {
            return bad("batch.max_seqs must be > 0");
        }
        if self.spec.enabled && self.spec.max_draft == 0 {
            return bad("spec.max_draft must be > 0 when spec.enabled");
        }
        let (base, row) = (self.spec.verify_base_cost, self.spec.verify_row_cost);
        if base.is_some() != row.is_some() {
            return bad(
                "spec.verify_base_cost and spec.verify_row_cost are given together or not at all",
            );
        }
        if [base, row]
            .into_iter()
            .flatten()
            .any(|c| !(c.is_finite() && c >= 0.0))
        {
            return bad("spec.verify_base_cost and spec.verify_row_cost must be finite and >= 0");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::length::PassCost;

    #[test]
    fn defaults_round_trip_and_unknown_fields_are_refused() {
        let c = EngineConfig::default();
        let s = serde_json::to_string(&c).expect("ser");
        let back: EngineConfig = serde_json::from_str(&s).expect("de");
        assert_eq!(back, c);
        let partial: EngineConfig =
            serde_json::from_str(r#"{"role": "prefill", "kv_pool": "64 MiB"}"#).expect("partial");
        assert_eq!(partial.role, Role::Prefill);
        assert_eq!(partial.kv_pool, ByteSize::mib(64));
        assert_eq!(partial.block_tokens, 64);
        assert_eq!(partial.isa, IsaChoice::Auto);
        let scalar: EngineConfig = serde_json::from_str(r#"{"isa": "scalar"}"#).expect("isa");
        assert_eq!(scalar.isa, IsaChoice::Scalar);
        assert!(serde_json::from_str::<EngineConfig>(r#"{"isa": "sse"}"#).is_err());
        assert_eq!(partial.kv_dtype, KvDtype::F16);
        let f32kv: EngineConfig = serde_json::from_str(r#"{"kv_dtype": "f32"}"#).expect("kv_dtype");
        assert_eq!(
            kvfabric_types::DType::from(f32kv.kv_dtype),
            kvfabric_types::DType::F32
        );
        assert!(serde_json::from_str::<EngineConfig>(r#"{"kv_dtype": "f8"}"#).is_err());
        for d in [KvDtype::F16, KvDtype::Bf16, KvDtype::F32] {
            let t = kvfabric_types::DType::from(d);
            assert_eq!(KvDtype::from(t), d);
            // The config's names are the layout's names.
            assert_eq!(serde_json::to_value(d).expect("ser"), t.name());
        }
        assert!(serde_json::from_str::<EngineConfig>(r#"{"treads": 2}"#).is_err());
        assert!(serde_json::from_str::<EngineConfig>(r#"{"role": "both2"}"#).is_err());
        let spec: EngineConfig =
            serde_json::from_str(r#"{"spec": {"max_draft": 8}}"#).expect("spec");
        assert_eq!((spec.spec.max_draft, spec.spec.enabled), (8, true));
        assert!(serde_json::from_str::<EngineConfig>(r#"{"spec": {"draft": 8}}"#).is_err());
        // The verify cost model: both keys or neither, finite and >= 0.
        let given: EngineConfig =
            serde_json::from_str(r#"{"spec": {"verify_base_cost": 0.1, "verify_row_cost": 0.2}}"#)
                .expect("costs");
        assert!(given.validate().is_ok());
        assert_eq!(given.spec.given_cost(), Some(PassCost::linear(0.1, 0.2)));
        assert_eq!(EngineConfig::default().spec.given_cost(), None);
        for (base, row) in [
            (Some(0.1), None),
            (None, Some(0.2)),
            (Some(-1.0), Some(0.2)),
        ] {
            let mut c = EngineConfig::default();
            (c.spec.verify_base_cost, c.spec.verify_row_cost) = (base, row);
            assert!(c.validate().is_err(), "{base:?} {row:?}");
        }
        let bad = EngineConfig {
            max_batch_tokens: 8,
            ..EngineConfig::default()
        };
        assert!(bad.validate().is_err());
        assert!(EngineConfig::default().validate().is_ok());
    }
}
