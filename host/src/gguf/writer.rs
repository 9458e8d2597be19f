//! The GGUF writer (v3): metadata and tensors in, a file that the reader and the `gguf` Python
//! package both load. Used by tests, the synthetic bench models and the built-in model.
use std::io::Write;
use std::path::Path;

use super::types::GgmlType;
use super::value::Value;
use super::{DEFAULT_ALIGNMENT, MAGIC};

struct Tensor {
    name: String,
    dims: Vec<u64>,
    ty: GgmlType,
    data: Vec<u8>,
}

#[derive(Default)]
pub struct GgufWriter {
    metadata: Vec<(String, Value)>,
    tensors: Vec<Tensor>,
}

/// A tensor of the streaming path: declared before any data is written, its data produced
/// later, in turn ([`GgufWriter::write_streaming`]).
#[derive(Clone, Debug, PartialEq)]
pub struct TensorDecl {
    pub name: String,
    pub dims: Vec<u64>,
    pub ty: GgmlType,
}

impl TensorDecl {
    /// Bytes of its data (an error when the shape does not fit the type).
    pub fn data_len(&self) -> Result<u64, String> {
        data_len(&self.name, &self.dims, self.ty)
    }
}

/// Where [`GgufWriter::write_streaming`] takes one tensor's data.
pub struct TensorSink<'a, W: Write> {
    out: &'a mut W,
    written: u64,
}

impl<W: Write> TensorSink<'_, W> {
    pub fn write(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.written += bytes.len() as u64;
        self.out.write_all(bytes)
    }
}

/// Bytes of a `dims` tensor of `ty`: 1 to 4 dimensions, rows of whole blocks, no overflow.
fn data_len(name: &str, dims: &[u64], ty: GgmlType) -> Result<u64, String> {
    let bad = |why: String| Err(format!("tensor {name}: shape {dims:?} does not fit {}: {why}", ty.name()));
    if dims.is_empty() || dims.len() > super::MAX_DIMS as usize {
        return bad(format!("{} dimensions (1 to {} allowed)", dims.len(), super::MAX_DIMS));
    }
    if !dims[0].is_multiple_of(ty.block_values()) {
        return bad(format!("rows of {} values are not whole blocks of {}", dims[0], ty.block_values()));
    }
    let elements = dims.iter().try_fold(1u64, |a, &d| a.checked_mul(d));
    elements.and_then(|e| (e / ty.block_values()).checked_mul(ty.block_bytes())).ok_or_else(|| format!("tensor {name}: shape {dims:?} is too large"))
}

fn put_string(out: &mut Vec<u8>, s: &str) {
    out.extend((s.len() as u64).to_le_bytes());
    out.extend(s.as_bytes());
}

fn put_value(out: &mut Vec<u8>, v: &Value) {
    match v {
        Value::U8(x) => out.push(*x),
        Value::I8(x) => out.push(*x as u8),
        Value::U16(x) => out.extend(x.to_le_bytes()),
        Value::I16(x) => out.extend(x.to_le_bytes()),
        Value::U32(x) => out.extend(x.to_le_bytes()),
        Value::I32(x) => out.extend(x.to_le_bytes()),
        Value::F32(x) => out.extend(x.to_le_bytes()),
        Value::Bool(x) => out.push(*x as u8),
        Value::String(s) => put_string(out, s),
        Value::Array(items) => {
            // An empty array is written as an array of u8 (its element type is not recoverable).
            out.extend(items.first().map_or(0, Value::type_id).to_le_bytes());
            out.extend((items.len() as u64).to_le_bytes());
            for i in items {
                put_value(out, i);
            }
        }
        Value::U64(x) => out.extend(x.to_le_bytes()),
        Value::I64(x) => out.extend(x.to_le_bytes()),
        Value::F64(x) => out.extend(x.to_le_bytes()),
    }
}

impl GgufWriter {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn meta(&mut self, key: &str, value: Value) -> &mut Self {
        self.metadata.push((key.to_string(), value));
        self
    }

    /// Adds a tensor; `data` must be exactly its size in `ty` (checked).
    pub fn tensor(&mut self, name: &str, dims: &[u64], ty: GgmlType, data: Vec<u8>) -> Result<&mut Self, String> {
        let want = data_len(name, dims, ty)?;
        if data.len() as u64 != want {
            return Err(format!("tensor {name}: {} bytes given, {} {dims:?} needs {want}", data.len(), ty.name()));
        }
        self.tensors.push(Tensor { name: name.to_string(), dims: dims.to_vec(), ty, data });
        Ok(self)
    }

    fn alignment(&self) -> u64 {
        match self.metadata.iter().find(|(k, _)| k == "general.alignment") {
            Some((_, Value::U32(a))) => *a as u64,
            _ => DEFAULT_ALIGNMENT,
        }
    }

    /// The metadata and tensor infos of a file holding `tensors` (name, shape, type, data bytes),
    /// padded to the start of the data section, and each tensor's offset in that section.
    fn header<'a>(&self, tensors: impl Iterator<Item = (&'a str, &'a [u64], GgmlType, u64)>) -> (Vec<u8>, Vec<u64>) {
        let align = self.alignment();
        let tensors: Vec<_> = tensors.collect();
        let mut out = Vec::new();
        out.extend(MAGIC.to_le_bytes());
        out.extend(3u32.to_le_bytes());
        out.extend((tensors.len() as u64).to_le_bytes());
        out.extend((self.metadata.len() as u64).to_le_bytes());
        for (k, v) in &self.metadata {
            put_string(&mut out, k);
            out.extend(v.type_id().to_le_bytes());
            put_value(&mut out, v);
        }
        let mut offset = 0u64;
        let mut offsets = Vec::new();
        for (name, dims, ty, bytes) in tensors {
            put_string(&mut out, name);
            out.extend((dims.len() as u32).to_le_bytes());
            for d in dims {
                out.extend(d.to_le_bytes());
            }
            out.extend(ty.id().to_le_bytes());
            out.extend(offset.to_le_bytes());
            offsets.push(offset);
            offset = (offset + bytes).div_ceil(align) * align;
        }
        let data_start = (out.len() as u64).div_ceil(align) * align;
        out.resize(data_start as usize, 0);
        (out, offsets)
    }

    /// The whole file as bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
        let (mut out, offsets) = self.header(self.tensors.iter().map(|t| (t.name.as_str(), t.dims.as_slice(), t.ty, t.data.len() as u64)));
        let data_start = out.len() as u64;
        for (t, off) in self.tensors.iter().zip(offsets) {
            out.resize((data_start + off) as usize, 0);
            out.extend(&t.data);
        }
        out
    }

    /// Size of the file [`write_streaming`](Self::write_streaming) writes for `tensors`.
    pub fn streaming_len(&self, tensors: &[TensorDecl]) -> Result<u64, String> {
        let lens = tensors.iter().map(TensorDecl::data_len).collect::<Result<Vec<_>, _>>()?;
        let (header, offsets) = self.header(tensors.iter().zip(&lens).map(|(t, &n)| (t.name.as_str(), t.dims.as_slice(), t.ty, n)));
        Ok(header.len() as u64 + offsets.last().zip(lens.last()).map_or(0, |(o, n)| o + n))
    }

    /// Writes a file too big to hold in memory: this writer's metadata and the infos of
    /// `tensors` first, then each tensor's data as `data(i, sink)` writes it, in order (checked to
    /// be exactly its size), with the alignment padding between. The bytes are those
    /// [`to_bytes`](Self::to_bytes) gives for the same tensors added with [`tensor`](Self::tensor);
    /// this writer must hold no tensor of its own. Returns the bytes written.
    pub fn write_streaming<W: Write>(
        &self,
        out: &mut W,
        tensors: &[TensorDecl],
        mut data: impl FnMut(usize, &mut TensorSink<'_, W>) -> std::io::Result<()>,
    ) -> std::io::Result<u64> {
        let invalid = |e: String| std::io::Error::new(std::io::ErrorKind::InvalidInput, e);
        if !self.tensors.is_empty() {
            return Err(invalid("write_streaming: the writer already holds tensors".into()));
        }
        let lens = tensors.iter().map(TensorDecl::data_len).collect::<Result<Vec<_>, _>>().map_err(invalid)?;
        let (header, offsets) = self.header(tensors.iter().zip(&lens).map(|(t, &n)| (t.name.as_str(), t.dims.as_slice(), t.ty, n)));
        out.write_all(&header)?;
        let mut at = 0u64;
        for (i, (t, (&off, &len))) in tensors.iter().zip(offsets.iter().zip(&lens)).enumerate() {
            out.write_all(&vec![0; (off - at) as usize])?;
            let mut sink = TensorSink { out, written: 0 };
            data(i, &mut sink)?;
            if sink.written != len {
                return Err(invalid(format!("tensor {}: {} bytes written, {} {:?} needs {len}", t.name, sink.written, t.ty.name(), t.dims)));
            }
            at = off + len;
        }
        Ok(header.len() as u64 + at)
    }

    pub fn write(&self, path: &Path) -> std::io::Result<()> {
        let mut f = std::fs::File::create(path)?;
        f.write_all(&self.to_bytes())?;
        f.sync_all()
    }
}
