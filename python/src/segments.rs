//! Caller memory a batch reads into or writes from, held for as long as the
//! batch runs.
//!
//! A block's bytes are one or more segments in order (one page per layer,
//! say), each from anything with the buffer protocol (numpy arrays,
//! memoryview, bytearray), a CPU torch tensor, or an `(address, nbytes)`
//! pair of memory the caller keeps alive. [`Segments`] owns the buffer
//! exports (so the memory can neither move nor be freed) and hands the
//! batch plain [`Span`]s.

use pyo3::buffer::PyBuffer;
use pyo3::prelude::*;
use pyo3::types::PyTuple;

use crate::error::PyClientError;

/// One contiguous piece of caller memory.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Span {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: a span points into memory `Segments` keeps exported (or the caller
// promised to keep alive) until the batch that uses it has ended.
unsafe impl Send for Span {}
unsafe impl Sync for Span {}

impl Span {
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// # Safety
    /// The batch owning this span must be its only user while it runs
    /// (the span is a pointer into caller memory, not a borrow of `self`).
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn as_mut(&self) -> &mut [u8] {
        std::slice::from_raw_parts_mut(self.ptr, self.len)
    }

    /// # Safety
    /// Nobody writes the memory while the batch reads it.
    pub(crate) unsafe fn as_ref(&self) -> &[u8] {
        std::slice::from_raw_parts(self.ptr, self.len)
    }
}

/// The spans of every block of a batch, and what keeps them alive.
pub(crate) struct Segments {
    pub(crate) blocks: Vec<Vec<Span>>,
    _exports: Vec<PyBuffer<u8>>,
    _objects: Vec<Py<PyAny>>,
}

/// How a batch uses its buffers.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Access {
    Read,
    Write,
}

impl Segments {
    /// The segments of each block in `buffers` (a sequence, per block, of a
    /// sequence of buffers); `access` Write refuses read-only buffers.
    pub(crate) fn extract(buffers: &Bound<'_, PyAny>, access: Access) -> PyResult<Self> {
        let mut out = Segments {
            blocks: Vec::new(),
            _exports: Vec::new(),
            _objects: Vec::new(),
        };
        for block in buffers.try_iter()? {
            let block = block?;
            let mut spans = Vec::new();
            for seg in block.try_iter().map_err(|_| {
                PyClientError::arg(
                    "buffers",
                    "each block's buffers must be a sequence of buffers",
                )
            })? {
                spans.push(out.span_of(&seg?, access)?);
            }
            out.blocks.push(spans);
        }
        Ok(out)
    }

    /// Total bytes of block `i`.
    pub(crate) fn block_len(&self, i: usize) -> usize {
        self.blocks[i].iter().map(Span::len).sum()
    }

    fn span_of(&mut self, obj: &Bound<'_, PyAny>, access: Access) -> PyResult<Span> {
        if let Ok(t) = obj.cast::<PyTuple>() {
            return raw_span(t);
        }
        if obj.hasattr("data_ptr")? && obj.hasattr("element_size")? {
            let span = tensor_span(obj)?;
            self._objects.push(obj.clone().unbind());
            return Ok(span);
        }
        let view = obj
            .py()
            .import("builtins")?
            .getattr("memoryview")?
            .call1((obj,))?;
        if !view.getattr("c_contiguous")?.extract::<bool>()? {
            return Err(PyClientError::arg("buffer", "not C-contiguous").into());
        }
        let bytes = view.call_method1("cast", ("B",))?;
        let buf = PyBuffer::<u8>::get(&bytes)?;
        if access == Access::Write && buf.readonly() {
            return Err(
                PyClientError::arg("buffer", "read-only, and this call writes into it").into(),
            );
        }
        let span = Span {
            ptr: buf.buf_ptr() as *mut u8,
            len: buf.len_bytes(),
        };
        self._exports.push(buf);
        Ok(span)
    }
}

/// An `(address, nbytes)` pair.
fn raw_span(t: &Bound<'_, PyTuple>) -> PyResult<Span> {
    let (addr, len): (usize, usize) = t.extract().map_err(|_| {
        PyClientError::arg(
            "buffer",
            "a tuple buffer must be (address, nbytes), two ints",
        )
    })?;
    if addr == 0 && len != 0 {
        return Err(PyClientError::arg("buffer", "address 0").into());
    }
    Ok(Span {
        ptr: addr as *mut u8,
        len,
    })
}

/// A torch tensor's memory: contiguous and in host memory only.
fn tensor_span(t: &Bound<'_, PyAny>) -> PyResult<Span> {
    if !t.call_method0("is_contiguous")?.extract::<bool>()? {
        return Err(PyClientError::arg("tensor", "not contiguous").into());
    }
    let device: String = t.getattr("device")?.getattr("type")?.extract()?;
    if device != "cpu" {
        return Err(PyClientError::arg(
            "tensor",
            format!("on {device}: pass host memory (a pinned staging tensor)"),
        )
        .into());
    }
    let ptr: usize = t.call_method0("data_ptr")?.extract()?;
    let n: usize = t.call_method0("numel")?.extract()?;
    let size: usize = t.call_method0("element_size")?.extract()?;
    Ok(Span {
        ptr: ptr as *mut u8,
        len: n * size,
    })
}
