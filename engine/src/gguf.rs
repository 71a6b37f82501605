//! GGUF v2/v3 reader: metadata and tensor directory over a memory-mapped file.
//!
//! The file is mapped once (memmap2) and never copied: tensor data are slices
//! of the map, metadata values are parsed into owned values at open. Every
//! offset and length read from the file is bounds-checked, so a truncated or
//! malformed file is an [`EngineError::Model`], never a panic. Used by the
//! model loader (tensors, hyper-parameters) and by the tokenizer and chat
//! template (the `tokenizer.*` keys).

use std::collections::BTreeMap;
use std::path::Path;

use memmap2::Mmap;

use crate::EngineError;

const MAGIC: &[u8; 4] = b"GGUF";
const DEFAULT_ALIGNMENT: u64 = 32;

/// A ggml tensor element type (the ones this engine reads, plus `Other`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GgmlType {
    F32,
    F16,
    Q4_0,
    Q4_1,
    Q8_0,
    /// Any other ggml type id (not supported by the kernels).
    Other(u32),
}

impl GgmlType {
    fn from_id(id: u32) -> Self {
        match id {
            0 => GgmlType::F32,
            1 => GgmlType::F16,
            2 => GgmlType::Q4_0,
            3 => GgmlType::Q4_1,
            8 => GgmlType::Q8_0,
            other => GgmlType::Other(other),
        }
    }

    /// (elements per block, bytes per block), None for unknown types.
    pub fn block_shape(self) -> Option<(usize, usize)> {
        match self {
            GgmlType::F32 => Some((1, 4)),
            GgmlType::F16 => Some((1, 2)),
            GgmlType::Q4_0 => Some((32, 18)),
            GgmlType::Q4_1 => Some((32, 20)),
            GgmlType::Q8_0 => Some((32, 34)),
            GgmlType::Other(_) => None,
        }
    }
}

/// One metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum MetaValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    U64(u64),
    I64(i64),
    F32(f32),
    F64(f64),
    Bool(bool),
    Str(String),
    Array(Vec<MetaValue>),
}

impl MetaValue {
    /// The value as an unsigned integer, if it is a non-negative integer.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            MetaValue::U8(v) => Some(v as u64),
            MetaValue::U16(v) => Some(v as u64),
            MetaValue::U32(v) => Some(v as u64),
            MetaValue::U64(v) => Some(v),
            MetaValue::I8(v) => u64::try_from(v).ok(),
            MetaValue::I16(v) => u64::try_from(v).ok(),
            MetaValue::I32(v) => u64::try_from(v).ok(),
            MetaValue::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// The value as a signed integer, if it is an integer that fits.
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            MetaValue::I8(v) => Some(v as i64),
            MetaValue::I16(v) => Some(v as i64),
            MetaValue::I32(v) => Some(v as i64),
            MetaValue::I64(v) => Some(v),
            MetaValue::U8(v) => Some(v as i64),
            MetaValue::U16(v) => Some(v as i64),
            MetaValue::U32(v) => Some(v as i64),
            MetaValue::U64(v) => i64::try_from(v).ok(),
            _ => None,
        }
    }
}

/// Where a tensor lives in the file and what it is.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorInfo {
    pub name: String,
    /// ggml order: `dims[0]` is the contiguous (innermost) dimension.
    pub dims: Vec<u64>,
    pub ggml_type: GgmlType,
    /// Absolute byte range of the data inside the file.
    pub data_start: usize,
    pub data_len: usize,
}

impl TensorInfo {
    /// Number of elements.
    pub fn elements(&self) -> u64 {
        self.dims.iter().product()
    }
}

/// An open, validated GGUF file.
pub struct GgufFile {
    mmap: Mmap,
    version: u32,
    metadata: BTreeMap<String, MetaValue>,
    tensors: Vec<TensorInfo>,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("version", &self.version)
            .field("metadata_keys", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .finish()
    }
}

fn bad(msg: impl Into<String>) -> EngineError {
    EngineError::Model(msg.into())
}

/// Bounds-checked little-endian cursor over the mapped bytes.
struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], EngineError> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&e| e <= self.buf.len())
            .ok_or_else(|| bad(format!("truncated GGUF at byte {}", self.pos)))?;
        let s = &self.buf[self.pos..end];
        self.pos = end;
        Ok(s)
    }
    fn arr<const N: usize>(&mut self) -> Result<[u8; N], EngineError> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N)?);
        Ok(a)
    }
    fn u32(&mut self) -> Result<u32, EngineError> {
        Ok(u32::from_le_bytes(self.arr()?))
    }
    fn u64(&mut self) -> Result<u64, EngineError> {
        Ok(u64::from_le_bytes(self.arr()?))
    }
    fn len(&mut self) -> Result<usize, EngineError> {
        let n = self.u64()?;
        // Any length beyond the file is malformed; this also bounds allocations.
        if n > self.buf.len() as u64 {
            return Err(bad(format!("length {n} beyond end of file")));
        }
        Ok(n as usize)
    }
    fn string(&mut self) -> Result<String, EngineError> {
        let n = self.len()?;
        let b = self.take(n)?;
        String::from_utf8(b.to_vec()).map_err(|_| bad("metadata string is not UTF-8"))
    }
    fn value(&mut self, ty: u32, depth: u32) -> Result<MetaValue, EngineError> {
        Ok(match ty {
            0 => MetaValue::U8(self.arr::<1>()?[0]),
            1 => MetaValue::I8(self.arr::<1>()?[0] as i8),
            2 => MetaValue::U16(u16::from_le_bytes(self.arr()?)),
            3 => MetaValue::I16(i16::from_le_bytes(self.arr()?)),
            4 => MetaValue::U32(self.u32()?),
            5 => MetaValue::I32(i32::from_le_bytes(self.arr()?)),
            6 => MetaValue::F32(f32::from_le_bytes(self.arr()?)),
            7 => MetaValue::Bool(self.arr::<1>()?[0] != 0),
            8 => MetaValue::Str(self.string()?),
            9 => {
                if depth > 4 {
                    return Err(bad("metadata arrays nested too deep"));
                }
                let ety = self.u32()?;
                let n = self.len()?;
                let mut v = Vec::with_capacity(n.min(1 << 20));
                for _ in 0..n {
                    v.push(self.value(ety, depth + 1)?);
                }
                MetaValue::Array(v)
            }
            10 => MetaValue::U64(self.u64()?),
            11 => MetaValue::I64(i64::from_le_bytes(self.arr()?)),
            12 => MetaValue::F64(f64::from_le_bytes(self.arr()?)),
            other => return Err(bad(format!("unknown metadata value type {other}"))),
        })
    }
}

impl GgufFile {
    /// Map and parse `path`; validates the header, metadata and every tensor's extent.
    pub fn open(path: &Path) -> Result<GgufFile, EngineError> {
        let file = std::fs::File::open(path)
            .map_err(|e| bad(format!("cannot open {}: {e}", path.display())))?;
        // SAFETY: the map is read-only; the model file is not expected to be
        // modified while the engine runs (same contract as every mmap loader).
        let mmap = unsafe { Mmap::map(&file) }?;
        Self::parse(mmap)
    }

    fn parse(mmap: Mmap) -> Result<GgufFile, EngineError> {
        let mut c = Cursor { buf: &mmap, pos: 0 };
        if c.take(4)? != MAGIC {
            return Err(bad("not a GGUF file (bad magic)"));
        }
        let version = c.u32()?;
        if !(2..=3).contains(&version) {
            return Err(bad(format!("unsupported GGUF version {version}")));
        }
        let n_tensors = c.len()?;
        let n_kv = c.len()?;
        let mut metadata = BTreeMap::new();
        for _ in 0..n_kv {
            let key = c.string()?;
            let ty = c.u32()?;
            let v = c.value(ty, 0)?;
            metadata.insert(key, v);
        }
        let alignment = metadata
            .get("general.alignment")
            .and_then(MetaValue::as_u64)
            .unwrap_or(DEFAULT_ALIGNMENT);
        if alignment == 0 || !alignment.is_power_of_two() {
            return Err(bad(format!("bad general.alignment {alignment}")));
        }
        let mut raw = Vec::with_capacity(n_tensors.min(1 << 16));
        for _ in 0..n_tensors {
            let name = c.string()?;
            let n_dims = c.u32()?;
            if n_dims == 0 || n_dims > 4 {
                return Err(bad(format!("tensor {name}: {n_dims} dimensions")));
            }
            let mut dims = Vec::with_capacity(n_dims as usize);
            for _ in 0..n_dims {
                dims.push(c.u64()?);
            }
            let ty = GgmlType::from_id(c.u32()?);
            let offset = c.u64()?;
            raw.push((name, dims, ty, offset));
        }
        let data_base = (c.pos as u64).div_ceil(alignment) * alignment;
        let file_len = mmap.len() as u64;
        let mut tensors = Vec::with_capacity(raw.len());
        for (name, dims, ggml_type, offset) in raw {
            let elements = dims
                .iter()
                .try_fold(1u64, |a, &d| a.checked_mul(d))
                .ok_or_else(|| bad(format!("tensor {name}: dims overflow")))?;
            let data_len = match ggml_type.block_shape() {
                Some((per_block, bytes)) => {
                    if elements % per_block as u64 != 0 {
                        return Err(bad(format!("tensor {name}: not a whole number of blocks")));
                    }
                    (elements / per_block as u64)
                        .checked_mul(bytes as u64)
                        .ok_or_else(|| bad(format!("tensor {name}: size overflow")))?
                }
                // Unknown types: extent unknown; keep it empty (never read by the kernels).
                None => 0,
            };
            let start = data_base
                .checked_add(offset)
                .filter(|s| s.checked_add(data_len).is_some_and(|e| e <= file_len))
                .ok_or_else(|| bad(format!("tensor {name}: data beyond end of file")))?;
            tensors.push(TensorInfo {
                name,
                dims,
                ggml_type,
                data_start: start as usize,
                data_len: data_len as usize,
            });
        }
        Ok(GgufFile {
            mmap,
            version,
            metadata,
            tensors,
        })
    }

    /// GGUF format version (2 or 3).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// The whole mapped file (for content hashing).
    pub fn bytes(&self) -> &[u8] {
        &self.mmap
    }

    /// All metadata, sorted by key.
    pub fn metadata(&self) -> &BTreeMap<String, MetaValue> {
        &self.metadata
    }

    /// A raw metadata value.
    pub fn get(&self, key: &str) -> Option<&MetaValue> {
        self.metadata.get(key)
    }

    /// A string value.
    pub fn get_str(&self, key: &str) -> Option<&str> {
        match self.metadata.get(key)? {
            MetaValue::Str(s) => Some(s),
            _ => None,
        }
    }

    /// An unsigned integer value that fits in u32 (any integer width).
    pub fn get_u32(&self, key: &str) -> Option<u32> {
        self.metadata
            .get(key)?
            .as_u64()
            .and_then(|v| u32::try_from(v).ok())
    }

    /// A float value (f32, or f64 narrowed).
    pub fn get_f32(&self, key: &str) -> Option<f32> {
        match *self.metadata.get(key)? {
            MetaValue::F32(v) => Some(v),
            MetaValue::F64(v) => Some(v as f32),
            _ => None,
        }
    }

    /// A boolean value.
    pub fn get_bool(&self, key: &str) -> Option<bool> {
        match *self.metadata.get(key)? {
            MetaValue::Bool(v) => Some(v),
            _ => None,
        }
    }

    /// An array of strings (None if absent or any element is not a string).
    pub fn get_str_array(&self, key: &str) -> Option<Vec<&str>> {
        match self.metadata.get(key)? {
            MetaValue::Array(v) => v
                .iter()
                .map(|e| match e {
                    MetaValue::Str(s) => Some(s.as_str()),
                    _ => None,
                })
                .collect(),
            _ => None,
        }
    }

    /// An array of integers as i32 (None if absent or any element does not fit).
    pub fn get_i32_array(&self, key: &str) -> Option<Vec<i32>> {
        match self.metadata.get(key)? {
            MetaValue::Array(v) => v
                .iter()
                .map(|e| e.as_i64().and_then(|x| i32::try_from(x).ok()))
                .collect(),
            _ => None,
        }
    }

    /// An array of floats (None if absent or any element is not a float).
    pub fn get_f32_array(&self, key: &str) -> Option<Vec<f32>> {
        match self.metadata.get(key)? {
            MetaValue::Array(v) => v
                .iter()
                .map(|e| match *e {
                    MetaValue::F32(x) => Some(x),
                    MetaValue::F64(x) => Some(x as f32),
                    _ => None,
                })
                .collect(),
            _ => None,
        }
    }

    /// Every tensor, in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// The tensor called `name`.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// The raw (packed) bytes of a tensor of this file.
    pub fn tensor_data(&self, t: &TensorInfo) -> &[u8] {
        // Extents were validated at open.
        &self.mmap[t.data_start..t.data_start + t.data_len]
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::io::Write;

    fn s(out: &mut Vec<u8>, v: &str) {
        out.extend_from_slice(&(v.len() as u64).to_le_bytes());
        out.extend_from_slice(v.as_bytes());
    }

    /// A small GGUF v3 file: a few metadata keys and one F32 tensor [2,3].
    pub(crate) fn tiny_gguf() -> Vec<u8> {
        let mut o = Vec::new();
        o.extend_from_slice(b"GGUF");
        o.extend_from_slice(&3u32.to_le_bytes());
        o.extend_from_slice(&1u64.to_le_bytes()); // tensors
        o.extend_from_slice(&5u64.to_le_bytes()); // kv
        s(&mut o, "general.architecture");
        o.extend_from_slice(&8u32.to_le_bytes());
        s(&mut o, "llama");
        s(&mut o, "llama.block_count");
        o.extend_from_slice(&4u32.to_le_bytes());
        o.extend_from_slice(&30u32.to_le_bytes());
        s(&mut o, "llama.rope.freq_base");
        o.extend_from_slice(&6u32.to_le_bytes());
        o.extend_from_slice(&100000f32.to_le_bytes());
        s(&mut o, "tokenizer.ggml.tokens");
        o.extend_from_slice(&9u32.to_le_bytes());
        o.extend_from_slice(&8u32.to_le_bytes());
        o.extend_from_slice(&2u64.to_le_bytes());
        s(&mut o, "<s>");
        s(&mut o, "hi");
        s(&mut o, "tokenizer.ggml.token_type");
        o.extend_from_slice(&9u32.to_le_bytes());
        o.extend_from_slice(&5u32.to_le_bytes());
        o.extend_from_slice(&2u64.to_le_bytes());
        o.extend_from_slice(&3i32.to_le_bytes());
        o.extend_from_slice(&1i32.to_le_bytes());
        // tensor info
        s(&mut o, "w");
        o.extend_from_slice(&2u32.to_le_bytes());
        o.extend_from_slice(&3u64.to_le_bytes());
        o.extend_from_slice(&2u64.to_le_bytes());
        o.extend_from_slice(&0u32.to_le_bytes());
        o.extend_from_slice(&0u64.to_le_bytes());
        while o.len() % 32 != 0 {
            o.push(0);
        }
        for i in 0..6 {
            o.extend_from_slice(&(i as f32).to_le_bytes());
        }
        o
    }

    fn write_tmp(bytes: &[u8]) -> tempfile::NamedTempFile {
        let mut f = tempfile::NamedTempFile::new().expect("tempfile");
        f.write_all(bytes).expect("write");
        f
    }

    #[test]
    fn parses_metadata_and_tensors() {
        let f = write_tmp(&tiny_gguf());
        let g = GgufFile::open(f.path()).expect("open");
        assert_eq!(g.version(), 3);
        assert_eq!(g.get_str("general.architecture"), Some("llama"));
        assert_eq!(g.get_u32("llama.block_count"), Some(30));
        assert_eq!(g.get_f32("llama.rope.freq_base"), Some(100000.0));
        assert_eq!(
            g.get_str_array("tokenizer.ggml.tokens"),
            Some(vec!["<s>", "hi"])
        );
        assert_eq!(
            g.get_i32_array("tokenizer.ggml.token_type"),
            Some(vec![3, 1])
        );
        assert_eq!(g.get_str("llama.block_count"), None);
        let t = g.tensor("w").expect("tensor");
        assert_eq!(t.dims, vec![3, 2]);
        assert_eq!(t.ggml_type, GgmlType::F32);
        let d = g.tensor_data(t);
        assert_eq!(d.len(), 24);
        assert_eq!(f32::from_le_bytes(d[20..24].try_into().unwrap()), 5.0);
    }

    #[test]
    fn rejects_truncated_and_bad_magic() {
        let bytes = tiny_gguf();
        for cut in [3, 10, 40, bytes.len() - 1] {
            let f = write_tmp(&bytes[..cut]);
            match GgufFile::open(f.path()) {
                Err(EngineError::Model(_)) => {}
                other => panic!("cut {cut}: expected a model error, got {other:?}"),
            }
        }
        let mut b = bytes.clone();
        b[0] = b'X';
        let f = write_tmp(&b);
        assert!(matches!(
            GgufFile::open(f.path()),
            Err(EngineError::Model(_))
        ));
        let mut b = bytes;
        b[4] = 9; // version 9
        let f = write_tmp(&b);
        assert!(matches!(
            GgufFile::open(f.path()),
            Err(EngineError::Model(_))
        ));
    }

    #[test]
    fn missing_file_is_an_error() {
        assert!(GgufFile::open(Path::new("/nonexistent/model.gguf")).is_err());
    }
}
