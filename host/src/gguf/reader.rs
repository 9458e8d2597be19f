//! The GGUF reader: memory-maps a file and validates everything before any tensor is used.
//!
//! Every length, count and offset read from the file is checked against the bytes that remain
//! before it is used, so a hostile file makes the reader refuse, never panic, allocate absurd
//! memory or read out of bounds. Each refusal is a [`GgufError`] naming the file, the tensor
//! (where there is one) and the byte offset.
use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};

use super::types::{foreign_type_name, GgmlType};
use super::value::Value;
use super::{DEFAULT_ALIGNMENT, MAGIC, MAX_DIMS};

/// What is wrong with a file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    Io(String),
    BadMagic(u32),
    UnsupportedVersion(u32),
    /// The file ends inside something that needs `need` more bytes.
    Truncated { what: &'static str, need: u64 },
    /// A count or length larger than the rest of the file could hold.
    TooLarge { what: &'static str, count: u64 },
    BadUtf8(&'static str),
    BadValueType(u32),
    BadBool(u8),
    NestingTooDeep,
    BadAlignment(String),
    DuplicateKey(String),
    DuplicateTensor,
    BadDims(String),
    UnknownType(u32),
    UnsupportedType(u32, &'static str),
    RowNotWhole { row: u64, block: u64 },
    Misaligned { offset: u64, alignment: u64 },
    OutOfFile { start: u64, end: u64, file_len: u64 },
    Overlap(String),
    NoSuchTensor,
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ErrorKind::Io(e) => write!(f, "{e}"),
            ErrorKind::BadMagic(m) => write!(f, "not a GGUF file (magic {m:#010x}, expected \"GGUF\")"),
            ErrorKind::UnsupportedVersion(v) => write!(f, "GGUF version {v} is not supported (2 and 3 are)"),
            ErrorKind::Truncated { what, need } => write!(f, "file ends inside {what} ({need} more bytes needed)"),
            ErrorKind::TooLarge { what, count } => write!(f, "{what} of {count} cannot fit in the rest of the file"),
            ErrorKind::BadUtf8(what) => write!(f, "{what} is not valid UTF-8"),
            ErrorKind::BadValueType(t) => write!(f, "unknown metadata value type {t}"),
            ErrorKind::BadBool(b) => write!(f, "bool value {b} (must be 0 or 1)"),
            ErrorKind::NestingTooDeep => write!(f, "arrays nested deeper than 8 levels"),
            ErrorKind::BadAlignment(v) => write!(f, "general.alignment {v} is not a power of two u32"),
            ErrorKind::DuplicateKey(k) => write!(f, "metadata key {k:?} appears twice"),
            ErrorKind::DuplicateTensor => write!(f, "tensor name appears twice"),
            ErrorKind::BadDims(d) => write!(f, "bad shape: {d}"),
            ErrorKind::UnknownType(t) => write!(f, "unknown tensor type {t}"),
            ErrorKind::UnsupportedType(t, n) => write!(f, "tensor type {n} ({t}) is not supported by Strata"),
            ErrorKind::RowNotWhole { row, block } => write!(f, "row length {row} is not a multiple of the type's block of {block}"),
            ErrorKind::Misaligned { offset, alignment } => write!(f, "data offset {offset} is not aligned to {alignment}"),
            ErrorKind::OutOfFile { start, end, file_len } => write!(f, "data bytes {start}..{end} lie outside the file ({file_len} bytes)"),
            ErrorKind::Overlap(other) => write!(f, "data overlaps tensor {other:?}"),
            ErrorKind::NoSuchTensor => write!(f, "no such tensor"),
        }
    }
}

/// A refusal: the file, the tensor if one is concerned, the byte offset, and what is wrong.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GgufError {
    pub file: PathBuf,
    pub tensor: Option<String>,
    pub offset: u64,
    pub kind: ErrorKind,
}

impl fmt::Display for GgufError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file.display())?;
        if let Some(t) = &self.tensor {
            write!(f, ": tensor {t:?}")?;
        }
        match self.kind {
            // Not about a place in the file.
            ErrorKind::Io(_) | ErrorKind::NoSuchTensor => write!(f, ": {}", self.kind),
            _ => write!(f, ": at byte {}: {}", self.offset, self.kind),
        }
    }
}

impl std::error::Error for GgufError {}

/// One tensor, validated: its data lies inside the file, aligned, overlapping no other.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    pub name: String,
    /// `dims[0]` is the row length (ggml's ne0).
    pub dims: Vec<u64>,
    pub ty: GgmlType,
    /// Absolute byte offset of the data in the file.
    pub offset: u64,
    pub bytes: u64,
}

impl TensorInfo {
    pub fn elements(&self) -> u64 {
        self.dims.iter().product()
    }

    /// Rows of `dims[0]` values.
    pub fn rows(&self) -> u64 {
        self.dims[1..].iter().product()
    }

    pub fn row_bytes(&self) -> u64 {
        self.dims[0] / self.ty.block_values() * self.ty.block_bytes()
    }
}

enum Bytes {
    Mapped(memmap2::Mmap),
    Owned(Vec<u8>),
}

/// An open, validated GGUF file.
pub struct GgufFile {
    pub path: PathBuf,
    pub version: u32,
    pub alignment: u64,
    pub metadata: Vec<(String, Value)>,
    pub tensors: Vec<TensorInfo>,
    /// Absolute offset of the data section.
    pub data_offset: u64,
    bytes: Bytes,
}

/// Bounds-checked little-endian reads over the file's bytes.
struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
    path: &'a Path,
    tensor: Option<String>,
}

const MAX_NESTING: u32 = 8;

impl<'a> Cursor<'a> {
    fn err(&self, kind: ErrorKind) -> GgufError {
        GgufError { file: self.path.to_path_buf(), tensor: self.tensor.clone(), offset: self.pos as u64, kind }
    }

    fn remaining(&self) -> u64 {
        (self.buf.len() - self.pos) as u64
    }

    fn take(&mut self, n: u64, what: &'static str) -> Result<&'a [u8], GgufError> {
        if n > self.remaining() {
            return Err(self.err(ErrorKind::Truncated { what, need: n - self.remaining() }));
        }
        let s = &self.buf[self.pos..self.pos + n as usize];
        self.pos += n as usize;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N], GgufError> {
        Ok(self.take(N as u64, what)?.try_into().expect("take returned N bytes"))
    }

    fn u8(&mut self, what: &'static str) -> Result<u8, GgufError> {
        Ok(self.array::<1>(what)?[0])
    }
    fn u32(&mut self, what: &'static str) -> Result<u32, GgufError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }
    fn u64(&mut self, what: &'static str) -> Result<u64, GgufError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// Checks that `count` items of at least `min_size` bytes each can fit in the rest of the
    /// file, before anything is allocated for them.
    fn check_count(&self, count: u64, min_size: u64, what: &'static str) -> Result<(), GgufError> {
        if count.checked_mul(min_size).is_none_or(|n| n > self.remaining()) {
            return Err(self.err(ErrorKind::TooLarge { what, count }));
        }
        Ok(())
    }

    fn string(&mut self, what: &'static str) -> Result<String, GgufError> {
        let at = self.pos;
        let len = self.u64(what)?;
        self.check_count(len, 1, what)?;
        let bytes = self.take(len, what)?;
        std::str::from_utf8(bytes).map(str::to_owned).map_err(|_| {
            let mut e = self.err(ErrorKind::BadUtf8(what));
            e.offset = at as u64;
            e
        })
    }

    /// Smallest encoding of a value of `ty`, for count checks.
    fn min_size(ty: u32) -> u64 {
        match ty {
            0 | 1 | 7 => 1,
            2 | 3 => 2,
            4..=6 => 4,
            8 => 8,      // empty string: its u64 length
            9 => 12,     // empty array: u32 type + u64 count
            _ => 8,
        }
    }

    fn value(&mut self, ty: u32, depth: u32) -> Result<Value, GgufError> {
        Ok(match ty {
            0 => Value::U8(self.u8("u8 value")?),
            1 => Value::I8(self.u8("i8 value")? as i8),
            2 => Value::U16(u16::from_le_bytes(self.array("u16 value")?)),
            3 => Value::I16(i16::from_le_bytes(self.array("i16 value")?)),
            4 => Value::U32(self.u32("u32 value")?),
            5 => Value::I32(self.u32("i32 value")? as i32),
            6 => Value::F32(f32::from_le_bytes(self.array("f32 value")?)),
            7 => match self.u8("bool value")? {
                b @ 0..=1 => Value::Bool(b == 1),
                b => {
                    self.pos -= 1;
                    return Err(self.err(ErrorKind::BadBool(b)));
                }
            },
            8 => Value::String(self.string("string value")?),
            9 => {
                if depth >= MAX_NESTING {
                    return Err(self.err(ErrorKind::NestingTooDeep));
                }
                let at = self.pos;
                let elem = self.u32("array type")?;
                if elem > 12 {
                    self.pos = at;
                    return Err(self.err(ErrorKind::BadValueType(elem)));
                }
                let count = self.u64("array length")?;
                self.check_count(count, Self::min_size(elem), "array")?;
                let mut items = Vec::with_capacity(count as usize);
                for _ in 0..count {
                    items.push(self.value(elem, depth + 1)?);
                }
                Value::Array(items)
            }
            10 => Value::U64(self.u64("u64 value")?),
            11 => Value::I64(self.u64("i64 value")? as i64),
            12 => Value::F64(f64::from_le_bytes(self.array("f64 value")?)),
            t => {
                self.pos -= 4;
                return Err(self.err(ErrorKind::BadValueType(t)));
            }
        })
    }
}

impl GgufFile {
    /// Maps and validates `path`.
    pub fn open(path: impl AsRef<Path>) -> Result<GgufFile, GgufError> {
        let path = path.as_ref();
        let io = |e: std::io::Error| GgufError { file: path.to_path_buf(), tensor: None, offset: 0, kind: ErrorKind::Io(e.to_string()) };
        let file = std::fs::File::open(path).map_err(io)?;
        let len = file.metadata().map_err(io)?.len();
        let bytes = if len == 0 {
            Bytes::Owned(Vec::new()) // mmap of an empty file fails; parse refuses it below
        } else {
            // SAFETY: the map is read-only and private to this process. If another process
            // truncates or rewrites the file while it is mapped, reads may fault or see new
            // bytes; model files are not modified while in use, and every parsed offset is
            // re-checked against the map's length, never trusted from the file alone.
            Bytes::Mapped(unsafe { memmap2::Mmap::map(&file) }.map_err(io)?)
        };
        Self::parse(bytes, path)
    }

    /// Validates a GGUF image held in memory (tests, fuzzing); `path` names it in errors.
    pub fn from_bytes(bytes: Vec<u8>, path: impl AsRef<Path>) -> Result<GgufFile, GgufError> {
        Self::parse(Bytes::Owned(bytes), path.as_ref())
    }

    fn parse(bytes: Bytes, path: &Path) -> Result<GgufFile, GgufError> {
        let buf: &[u8] = match &bytes {
            Bytes::Mapped(m) => m,
            Bytes::Owned(v) => v,
        };
        let mut c = Cursor { buf, pos: 0, path, tensor: None };
        let magic = c.u32("the magic")?;
        if magic != MAGIC {
            c.pos = 0;
            return Err(c.err(ErrorKind::BadMagic(magic)));
        }
        let version = c.u32("the version")?;
        if !(2..=3).contains(&version) {
            c.pos = 4;
            return Err(c.err(ErrorKind::UnsupportedVersion(version)));
        }
        let n_tensors = c.u64("the tensor count")?;
        let n_kv = c.u64("the metadata count")?;
        // A key/value needs at least a u64 key length, a u32 type and a 1-byte value; a tensor
        // info a u64 name length, u32 n_dims, u32 type and u64 offset.
        c.check_count(n_kv, 13, "metadata count")?;
        let mut metadata = Vec::with_capacity(n_kv as usize);
        let mut keys = HashMap::new();
        let mut alignment = DEFAULT_ALIGNMENT;
        for _ in 0..n_kv {
            let at = c.pos;
            let key = c.string("a metadata key")?;
            let ty = c.u32("a metadata value type")?;
            let value = c.value(ty, 0)?;
            if keys.insert(key.clone(), ()).is_some() {
                c.pos = at;
                return Err(c.err(ErrorKind::DuplicateKey(key)));
            }
            if key == "general.alignment" {
                alignment = match value {
                    Value::U32(a) if a.is_power_of_two() => a as u64,
                    ref v => {
                        c.pos = at;
                        return Err(c.err(ErrorKind::BadAlignment(v.to_string())));
                    }
                };
            }
            metadata.push((key, value));
        }
        c.check_count(n_tensors, 24, "tensor count")?;
        let mut infos = Vec::with_capacity(n_tensors as usize);
        let mut names = HashMap::new();
        for _ in 0..n_tensors {
            c.tensor = None;
            let name = c.string("a tensor name")?;
            c.tensor = Some(name.clone());
            if names.insert(name.clone(), ()).is_some() {
                return Err(c.err(ErrorKind::DuplicateTensor));
            }
            let info_at = c.pos;
            let n_dims = c.u32("the tensor's dimension count")?;
            if n_dims == 0 || n_dims > MAX_DIMS {
                c.pos = info_at;
                return Err(c.err(ErrorKind::BadDims(format!("{n_dims} dimensions (1..={MAX_DIMS} allowed)"))));
            }
            let mut dims = Vec::with_capacity(n_dims as usize);
            for _ in 0..n_dims {
                dims.push(c.u64("the tensor's dimensions")?);
            }
            let type_at = c.pos;
            let type_id = c.u32("the tensor's type")?;
            let offset = c.u64("the tensor's offset")?;
            c.pos = type_at;
            let ty = GgmlType::from_id(type_id).ok_or_else(|| {
                c.err(match foreign_type_name(type_id) {
                    Some(n) => ErrorKind::UnsupportedType(type_id, n),
                    None => ErrorKind::UnknownType(type_id),
                })
            })?;
            c.pos = info_at;
            let elements = dims.iter().try_fold(1u64, |a, &d| a.checked_mul(d));
            let elements = match elements {
                Some(e) if !dims.contains(&0) => e,
                _ => return Err(c.err(ErrorKind::BadDims(format!("{dims:?} (zero or overflowing)")))),
            };
            if dims[0] % ty.block_values() != 0 {
                return Err(c.err(ErrorKind::RowNotWhole { row: dims[0], block: ty.block_values() }));
            }
            // elements fits u64 and block_bytes <= 210, block_values >= 1: no overflow below
            // unless the tensor is absurd, which checked_mul reports.
            let bytes = (elements / ty.block_values())
                .checked_mul(ty.block_bytes())
                .ok_or_else(|| c.err(ErrorKind::BadDims(format!("{dims:?} is too large"))))?;
            c.pos = type_at + 12;
            if offset % alignment != 0 {
                c.pos = type_at + 4;
                return Err(c.err(ErrorKind::Misaligned { offset, alignment }));
            }
            infos.push((TensorInfo { name, dims, ty, offset, bytes }, type_at + 4));
        }
        c.tensor = None;
        let data_offset = (c.pos as u64).div_ceil(alignment) * alignment;
        let file_len = buf.len() as u64;
        for (t, field_at) in &mut infos {
            let start = data_offset.checked_add(t.offset);
            let end = start.and_then(|s| s.checked_add(t.bytes));
            match (start, end) {
                (Some(s), Some(e)) if e <= file_len => t.offset = s,
                _ => {
                    return Err(GgufError {
                        file: path.to_path_buf(),
                        tensor: Some(t.name.clone()),
                        offset: *field_at as u64,
                        kind: ErrorKind::OutOfFile {
                            start: data_offset.saturating_add(t.offset),
                            end: data_offset.saturating_add(t.offset).saturating_add(t.bytes),
                            file_len,
                        },
                    })
                }
            }
        }
        let mut order: Vec<usize> = (0..infos.len()).collect();
        order.sort_by_key(|&i| infos[i].0.offset);
        for w in order.windows(2) {
            let (a, b) = (&infos[w[0]].0, &infos[w[1]].0);
            if a.offset + a.bytes > b.offset {
                return Err(GgufError { file: path.to_path_buf(), tensor: Some(b.name.clone()), offset: infos[w[1]].1 as u64, kind: ErrorKind::Overlap(a.name.clone()) });
            }
        }
        let tensors = infos.into_iter().map(|(t, _)| t).collect();
        Ok(GgufFile { path: path.to_path_buf(), version, alignment, metadata, tensors, data_offset, bytes })
    }

    fn buf(&self) -> &[u8] {
        match &self.bytes {
            Bytes::Mapped(m) => m,
            Bytes::Owned(v) => v,
        }
    }

    pub fn len(&self) -> u64 {
        self.buf().len() as u64
    }

    /// The whole file's bytes (tensor byte ranges were validated when it was opened).
    pub fn bytes(&self) -> &[u8] {
        self.buf()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.metadata.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    pub fn tensor(&self, name: &str) -> Result<&TensorInfo, GgufError> {
        self.tensors.iter().find(|t| t.name == name).ok_or_else(|| GgufError {
            file: self.path.clone(),
            tensor: Some(name.to_string()),
            offset: 0,
            kind: ErrorKind::NoSuchTensor,
        })
    }

    /// The tensor's bytes (validated inside the file when the file was opened).
    pub fn data(&self, t: &TensorInfo) -> &[u8] {
        &self.buf()[t.offset as usize..(t.offset + t.bytes) as usize]
    }
}
