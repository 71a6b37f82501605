//! The model's weights and hyper-parameters, loaded from a GGUF file:
//! [`LlamaConfig`], [`LayerWeights`], [`LlamaModel`] (the forward pass over
//! them is in [`super::llama`]).

use std::path::Path;

use kvfabric_types::ModelFingerprint;

use crate::gguf::{GgmlType, GgufFile};
use crate::kernels::{f16_to_f32, PackedMatrix};
use crate::EngineError;

/// Llama hyper-parameters read from `llama.*` metadata.
#[derive(Clone, Debug, PartialEq)]
pub struct LlamaConfig {
    pub layers: usize,
    pub hidden: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub ffn: usize,
    pub vocab: usize,
    pub context_length: usize,
    pub rope_base: f32,
    pub rms_eps: f32,
}

impl LlamaConfig {
    /// Read from metadata; only the `llama` architecture is supported.
    pub fn from_gguf(g: &GgufFile) -> Result<LlamaConfig, EngineError> {
        let arch = g.get_str("general.architecture").unwrap_or("");
        if arch != "llama" {
            return Err(EngineError::Model(format!(
                "unsupported architecture {arch:?}"
            )));
        }
        let need = |k: &str| {
            g.get_u32(&format!("llama.{k}"))
                .map(|v| v as usize)
                .ok_or_else(|| EngineError::Model(format!("missing llama.{k}")))
        };
        let hidden = need("embedding_length")?;
        let heads = need("attention.head_count")?;
        let kv_heads = g
            .get_u32("llama.attention.head_count_kv")
            .map_or(heads, |v| v as usize);
        if heads == 0 || kv_heads == 0 || hidden % heads != 0 || heads % kv_heads != 0 {
            return Err(EngineError::Model(format!(
                "bad head geometry: hidden {hidden}, heads {heads}, kv heads {kv_heads}"
            )));
        }
        let head_dim = hidden / heads;
        if head_dim % 16 != 0 {
            return Err(EngineError::Model(format!(
                "head_dim {head_dim} not a multiple of 16"
            )));
        }
        let vocab = match g.get_u32("llama.vocab_size") {
            Some(v) => v as usize,
            None => g
                .tensor("token_embd.weight")
                .map(|t| t.dims[1] as usize)
                .ok_or_else(|| EngineError::Model("missing token_embd.weight".into()))?,
        };
        Ok(LlamaConfig {
            layers: need("block_count")?,
            hidden,
            heads,
            kv_heads,
            head_dim,
            ffn: need("feed_forward_length")?,
            vocab,
            context_length: g
                .get_u32("llama.context_length")
                .map_or(4096, |v| v as usize),
            rope_base: g.get_f32("llama.rope.freq_base").unwrap_or(10000.0),
            rms_eps: g
                .get_f32("llama.attention.layer_norm_rms_epsilon")
                .unwrap_or(1e-5),
        })
    }

    /// The architecture string hashed into the model fingerprint.
    pub fn architecture(&self) -> String {
        format!(
            "llama;layers={};hidden={};heads={};kv_heads={};head_dim={};ffn={};vocab={};rope_base={};eps={};rope=interleaved",
            self.layers, self.hidden, self.heads, self.kv_heads, self.head_dim, self.ffn, self.vocab,
            self.rope_base, self.rms_eps
        )
    }
}

/// One transformer block's weights.
#[derive(Debug)]
pub struct LayerWeights {
    pub attn_norm: Vec<f32>,
    /// Rows: q (heads*head_dim) | k (kv_heads*head_dim) | v (kv_heads*head_dim).
    pub qkv: PackedMatrix,
    pub attn_out: PackedMatrix,
    pub ffn_norm: Vec<f32>,
    /// Rows: gate (ffn) | up (ffn).
    pub gate_up: PackedMatrix,
    pub down: PackedMatrix,
}

/// A loaded model: config, packed weights, rope table, fingerprint.
#[derive(Debug)]
pub struct LlamaModel {
    pub config: LlamaConfig,
    pub token_embd: PackedMatrix,
    /// `None` = tied to `token_embd`.
    pub output: Option<PackedMatrix>,
    pub output_norm: Vec<f32>,
    pub layers: Vec<LayerWeights>,
    /// Per position, per pair i: (cos, sin) of pos * base^(-2i/head_dim).
    pub(super) rope: Vec<(f32, f32)>,
    fingerprint: ModelFingerprint,
}

fn vector(g: &GgufFile, name: &str, len: usize) -> Result<Vec<f32>, EngineError> {
    let t = g
        .tensor(name)
        .ok_or_else(|| EngineError::Model(format!("missing tensor {name}")))?;
    if t.elements() != len as u64 {
        return Err(EngineError::Model(format!(
            "tensor {name}: {} elements, want {len}",
            t.elements()
        )));
    }
    let b = g.tensor_data(t);
    match t.ggml_type {
        GgmlType::F32 => Ok(b
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()),
        GgmlType::F16 => Ok(b
            .chunks_exact(2)
            .map(|c| f16_to_f32(u16::from_le_bytes([c[0], c[1]])))
            .collect()),
        t => Err(EngineError::Model(format!(
            "tensor {name}: norm of type {t:?}"
        ))),
    }
}

fn matrix(
    g: &GgufFile,
    names: &[String],
    k: usize,
    ns: &[usize],
) -> Result<PackedMatrix, EngineError> {
    let mut parts = Vec::new();
    for (name, &n) in names.iter().zip(ns) {
        let t = g
            .tensor(name)
            .ok_or_else(|| EngineError::Model(format!("missing tensor {name}")))?;
        if t.dims.as_slice() != [k as u64, n as u64] {
            return Err(EngineError::Model(format!(
                "tensor {name}: dims {:?}, want [{k}, {n}]",
                t.dims
            )));
        }
        parts.push((t, g.tensor_data(t)));
    }
    PackedMatrix::pack(&parts)
}

impl LlamaModel {
    /// Load and repack a GGUF Llama; `progress(done, total)` is called after each layer.
    pub fn load(
        path: &Path,
        mut progress: impl FnMut(usize, usize),
    ) -> Result<LlamaModel, EngineError> {
        let g = GgufFile::open(path)?;
        let c = LlamaConfig::from_gguf(&g)?;
        let total = c.layers + 2;
        let weights_hash = blake3::hash(g.bytes());
        let fingerprint = ModelFingerprint::new(weights_hash.as_bytes(), &c.architecture());
        progress(1, total);
        let (h, hd) = (c.hidden, c.head_dim);
        let token_embd = matrix(&g, &["token_embd.weight".into()], h, &[c.vocab])?;
        let output = match g.tensor("output.weight") {
            Some(_) => Some(matrix(&g, &["output.weight".into()], h, &[c.vocab])?),
            None => None,
        };
        let output_norm = vector(&g, "output_norm.weight", h)?;
        let mut layers = Vec::with_capacity(c.layers);
        for l in 0..c.layers {
            let n = |s: &str| format!("blk.{l}.{s}.weight");
            layers.push(LayerWeights {
                attn_norm: vector(&g, &n("attn_norm"), h)?,
                qkv: matrix(
                    &g,
                    &[n("attn_q"), n("attn_k"), n("attn_v")],
                    h,
                    &[c.heads * hd, c.kv_heads * hd, c.kv_heads * hd],
                )?,
                attn_out: matrix(&g, &[n("attn_output")], c.heads * hd, &[h])?,
                ffn_norm: vector(&g, &n("ffn_norm"), h)?,
                gate_up: matrix(&g, &[n("ffn_gate"), n("ffn_up")], h, &[c.ffn, c.ffn])?,
                down: matrix(&g, &[n("ffn_down")], c.ffn, &[h])?,
            });
            progress(l + 2, total);
        }
        let half = hd / 2;
        let mut rope = Vec::with_capacity(c.context_length * half);
        for pos in 0..c.context_length {
            for i in 0..half {
                let inv = (c.rope_base as f64).powf(-((2 * i) as f64) / hd as f64);
                let a = pos as f64 * inv;
                rope.push((a.cos() as f32, a.sin() as f32));
            }
        }
        progress(total, total);
        Ok(LlamaModel {
            config: c,
            token_embd,
            output,
            output_norm,
            layers,
            rope,
            fingerprint,
        })
    }

    /// blake3(weights file) + architecture: names this model's KV in the fabric.
    pub fn fingerprint(&self) -> ModelFingerprint {
        self.fingerprint
    }

    /// Bytes of packed weights held in memory.
    pub fn weight_bytes(&self) -> usize {
        let l: usize = self
            .layers
            .iter()
            .map(|l| {
                l.qkv.bytes()
                    + l.attn_out.bytes()
                    + l.gate_up.bytes()
                    + l.down.bytes()
                    + 8 * l.attn_norm.len()
            })
            .sum();
        l + self.token_embd.bytes()
            + self.output.as_ref().map_or(0, |o| o.bytes())
            + self.rope.len() * 8
    }
}
