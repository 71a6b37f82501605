//! Block keys for Python: [`Layout`], [`KeyChain`] and
//! [`model_fingerprint`], the bundled engine's chain (`kvfabric-types`)
//! exposed as is, so a block any engine keys here is the block the same
//! prefix names everywhere else.

use kvfabric_types::{BlockKey, BlockOrder, DType, KeyChain as Chain, KvLayout, ModelFingerprint};
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::error::PyClientError;

/// Shape of one block's bytes.
#[pyclass(module = "kvfabric._native", frozen, eq, hash)]
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Layout {
    pub(crate) inner: KvLayout,
}

fn order_name(o: BlockOrder) -> &'static str {
    match o {
        BlockOrder::LayerKvTokenHead => "layer_kv_token_head",
        BlockOrder::EnginePage => "engine_page",
    }
}

#[pymethods]
impl Layout {
    #[new]
    #[pyo3(signature = (layers, kv_heads, head_dim, dtype, block_tokens, order = "layer_kv_token_head"))]
    fn new(
        layers: u32,
        kv_heads: u32,
        head_dim: u32,
        dtype: &str,
        block_tokens: u32,
        order: &str,
    ) -> PyResult<Self> {
        let dtype: DType = dtype.parse().map_err(|_| {
            PyClientError::arg("dtype", format!("{dtype:?}: want f32, f16 or bf16"))
        })?;
        let order = match order {
            "layer_kv_token_head" => BlockOrder::LayerKvTokenHead,
            "engine_page" => BlockOrder::EnginePage,
            o => {
                return Err(PyClientError::arg(
                    "order",
                    format!("{o:?}: want layer_kv_token_head or engine_page"),
                )
                .into())
            }
        };
        let inner = KvLayout {
            layers,
            kv_heads,
            head_dim,
            dtype,
            block_tokens,
            order,
        };
        inner
            .validate()
            .map_err(|e| PyClientError::arg("layout", e.to_string()))?;
        Ok(Layout { inner })
    }

    #[getter]
    fn layers(&self) -> u32 {
        self.inner.layers
    }
    #[getter]
    fn kv_heads(&self) -> u32 {
        self.inner.kv_heads
    }
    #[getter]
    fn head_dim(&self) -> u32 {
        self.inner.head_dim
    }
    #[getter]
    fn dtype(&self) -> &'static str {
        self.inner.dtype.name()
    }
    #[getter]
    fn block_tokens(&self) -> u32 {
        self.inner.block_tokens
    }
    #[getter]
    fn order(&self) -> &'static str {
        order_name(self.inner.order)
    }
    /// Bytes of one whole block.
    #[getter]
    fn block_bytes(&self) -> usize {
        self.inner.block_bytes()
    }
    /// Bytes of one layer of a block (K and V).
    #[getter]
    fn layer_bytes(&self) -> usize {
        self.inner.layer_bytes()
    }

    fn __repr__(&self) -> String {
        let l = &self.inner;
        format!(
            "Layout(layers={}, kv_heads={}, head_dim={}, dtype='{}', block_tokens={}, order='{}')",
            l.layers,
            l.kv_heads,
            l.head_dim,
            l.dtype.name(),
            l.block_tokens,
            order_name(l.order)
        )
    }
}

/// 32 bytes naming a model's KV: a content hash (or any stable id) of its
/// weights, and its architecture description.
#[pyfunction]
pub fn model_fingerprint<'py>(
    py: Python<'py>,
    weights_id: &[u8],
    architecture: &str,
) -> Bound<'py, PyBytes> {
    let weights = blake3_of(weights_id);
    PyBytes::new(py, &ModelFingerprint::new(&weights, architecture).0)
}

fn blake3_of(bytes: &[u8]) -> [u8; 32] {
    // A 32-byte id is taken as the weights' hash itself (the bundled
    // engine's fingerprints); anything else is hashed down to one.
    match <[u8; 32]>::try_from(bytes) {
        Ok(h) => h,
        Err(_) => *blake3::hash(bytes).as_bytes(),
    }
}

/// Turns token sequences into block keys for one namespace, model and layout.
#[pyclass(module = "kvfabric._native", frozen)]
pub struct KeyChain {
    chain: Chain,
}

/// A 32-byte key from Python bytes.
pub(crate) fn key_of(bytes: &[u8]) -> Result<BlockKey, PyClientError> {
    BlockKey::from_slice(bytes)
        .map_err(|_| PyClientError::arg("key", format!("{} bytes, want 32", bytes.len())))
}

#[pymethods]
impl KeyChain {
    #[new]
    fn new(namespace: &[u8], model: &[u8], layout: &Layout) -> PyResult<Self> {
        let model: [u8; 32] = model.try_into().map_err(|_| {
            PyClientError::arg(
                "model",
                format!("{} bytes, want the 32 of model_fingerprint()", model.len()),
            )
        })?;
        Ok(KeyChain {
            chain: Chain::new(namespace, &ModelFingerprint(model), &layout.inner),
        })
    }

    /// Tokens per block.
    #[getter]
    fn block_tokens(&self) -> usize {
        self.chain.block_tokens()
    }

    /// Keys (32 bytes each) of every full block of `tokens`, in order.
    fn keys<'py>(&self, py: Python<'py>, tokens: Vec<u32>) -> Vec<Bound<'py, PyBytes>> {
        let keys = py.detach(|| self.chain.keys(&tokens));
        keys.iter().map(|k| PyBytes::new(py, &k.0)).collect()
    }

    /// Key of the block holding `tokens` after the block keyed `parent`.
    #[pyo3(signature = (parent, tokens))]
    fn next<'py>(
        &self,
        py: Python<'py>,
        parent: Option<&[u8]>,
        tokens: Vec<u32>,
    ) -> PyResult<Bound<'py, PyBytes>> {
        if tokens.len() != self.chain.block_tokens() {
            return Err(PyClientError::arg(
                "tokens",
                format!(
                    "{} tokens, a block has {}",
                    tokens.len(),
                    self.chain.block_tokens()
                ),
            )
            .into());
        }
        let parent = parent.map(key_of).transpose()?;
        Ok(PyBytes::new(
            py,
            &self.chain.next(parent.as_ref(), &tokens).0,
        ))
    }
}
