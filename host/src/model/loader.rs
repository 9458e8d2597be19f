//! Reading an architecture's keys and tensors from a GGUF file, with errors that name the file
//! and what is wrong: shared by every model module.
use crate::error::{Error, Result};
use crate::gguf::{GgmlType, GgufFile, TensorInfo, Value};
use strata_gpu_shared::formats::{FloatFormat, WeightFormat};

use super::weights::{Data, Weight, WeightId};
use super::LoadOptions;

/// Reads keys and tensors, with errors that name the file and what is wrong.
pub(super) struct Loader<'a> {
    pub(super) file: &'a GgufFile,
    /// The architecture, the prefix of its keys.
    pub(super) arch: &'static str,
    /// The file's tensors by name (one lookup per tensor, whatever the file's tensor count).
    by_name: std::collections::HashMap<&'a str, &'a TensorInfo>,
    pub(super) list: Vec<Weight>,
    pub(super) options: LoadOptions,
}

impl<'a> Loader<'a> {
    /// A loader for `file`, which must declare `arch` (another architecture is refused by name).
    pub(super) fn new(file: &'a GgufFile, arch: &'static str, options: LoadOptions) -> Result<Loader<'a>> {
        let l = Loader { file, arch, by_name: file.tensors.iter().map(|t| (t.name.as_str(), t)).collect(), list: Vec::new(), options };
        match file.get("general.architecture").and_then(Value::as_str) {
            Some(a) if a == arch => Ok(l),
            Some(other) => Err(l.err("architecture", format!("`{other}` is not {arch}"))),
            None => Err(l.err("key general.architecture", "missing: not a model file")),
        }
    }

    pub(super) fn err(&self, what: impl Into<String>, detail: impl Into<String>) -> Error {
        Error::Model { file: self.file.path.clone(), what: Some(what.into()), detail: detail.into() }
    }

    pub(super) fn key(&self, name: &str) -> Option<&Value> {
        self.file.get(&format!("{}.{name}", self.arch))
    }

    /// An integer key; scalar, or an array whose elements are all equal (per-layer keys).
    pub(super) fn uint(&self, name: &str, default: Option<u64>) -> Result<usize> {
        let full = format!("{}.{name}", self.arch);
        let v = match self.key(name) {
            None => return default.map(|d| d as usize).ok_or_else(|| self.err(format!("key {full}"), "missing")),
            Some(Value::Array(items)) => {
                let vals: Vec<Option<u64>> = items.iter().map(Value::as_u64).collect();
                match vals.first() {
                    Some(Some(first)) if vals.iter().all(|v| *v == Some(*first)) => Some(*first),
                    _ => return Err(self.err(format!("key {full}"), "per-layer values that differ are not supported")),
                }
            }
            Some(v) => v.as_u64(),
        };
        let v = v.ok_or_else(|| self.err(format!("key {full}"), "not a non-negative integer"))?;
        usize::try_from(v).ok().filter(|&v| v <= u32::MAX as usize).ok_or_else(|| self.err(format!("key {full}"), format!("{v} is out of range")))
    }

    pub(super) fn float(&self, name: &str, default: Option<f32>) -> Result<f32> {
        let full = format!("{}.{name}", self.arch);
        match self.key(name) {
            None => default.ok_or_else(|| self.err(format!("key {full}"), "missing")),
            Some(Value::F32(v)) if v.is_finite() => Ok(*v),
            Some(Value::F64(v)) if v.is_finite() => Ok(*v as f32),
            Some(v) => Err(self.err(format!("key {full}"), format!("expected a finite float, found {v}"))),
        }
    }

    pub(super) fn info(&self, name: &str) -> Option<&TensorInfo> {
        self.by_name.get(name).copied()
    }

    /// Tensor `name` with dims `want` (ggml order), as stored.
    pub(super) fn tensor(&mut self, name: &str, want: &[usize], allowed: &[Kind]) -> Result<WeightId> {
        let t = self.info(name).ok_or_else(|| self.err(format!("tensor {name}"), "missing"))?.clone();
        let dims: Vec<usize> = t.dims.iter().map(|&d| d as usize).collect();
        if dims != want {
            return Err(self.err(format!("tensor {name}"), format!("shape {dims:?}, expected {want:?}")));
        }
        if !allowed.iter().any(|k| k.admits(t.ty)) {
            let names: Vec<&str> = allowed.iter().map(|k| k.describe()).collect();
            return Err(self.err(format!("tensor {name}"), format!("type {} is not supported here (supported: {})", t.ty.name(), names.join(", "))));
        }
        let (rows, n_expert) = match dims.len() {
            1 => (1, 1),
            2 => (dims[1], 1),
            _ => (dims[1], dims[2]),
        };
        Ok(self.push(Weight { name: name.into(), ty: t.ty, rows, cols: dims[0], n_expert, data: Data::File { offset: t.offset as usize, len: t.bytes as usize } }))
    }

    pub(super) fn push(&mut self, w: Weight) -> WeightId {
        self.list.push(w);
        WeightId(self.list.len() - 1)
    }

    /// A norm (or bias) vector of `n` values, widened to f32 and repeated `repeat` times.
    pub(super) fn vector(&mut self, name: &str, n: usize, repeat: usize) -> Result<WeightId> {
        self.floats(name, &[n], repeat)
    }

    /// A float tensor of dims `want`, widened to f32 (every value finite) and repeated `repeat`
    /// times, as one prepared vector.
    pub(super) fn floats(&mut self, name: &str, want: &[usize], repeat: usize) -> Result<WeightId> {
        let id = self.tensor(name, want, &[Kind::Float])?;
        let w = self.take_last(id);
        let Data::File { offset, len } = w.data else { unreachable!("tensors come from the file") };
        let bytes = &self.file.bytes()[offset..offset + len];
        let format = float_format(w.ty).expect("Kind::Float admits float types only");
        let n: usize = want.iter().product();
        let values: Vec<f32> = (0..n).map(|j| format.get(bytes, j)).collect();
        if values.iter().any(|v| !v.is_finite()) {
            return Err(self.err(format!("tensor {name}"), "holds a non-finite value"));
        }
        Ok(self.push(Weight { name: name.into(), ty: GgmlType::F32, rows: repeat, cols: n, n_expert: 1, data: Data::F32(values.repeat(repeat)) }))
    }

    /// Removes the weight just pushed (a fused tensor only its slices are kept of).
    pub(super) fn take_last(&mut self, id: WeightId) -> Weight {
        debug_assert_eq!(id.0 + 1, self.list.len());
        self.list.pop().expect("just pushed")
    }

    /// The rows `rows` (each a matrix and a row of it, counted over its experts' matrices
    /// stacked; in that order) of checked matrices of one type and width, from the file or
    /// gathered before, copied into a weight of its own of `n_expert` matrices.
    pub(super) fn gather_rows<'w>(&mut self, name: &str, rows: impl Iterator<Item = (&'w Weight, usize)>, n_expert: usize) -> WeightId {
        let file = self.file.bytes();
        let (mut bytes, mut first) = (Vec::new(), None::<&Weight>);
        for (w, r) in rows {
            let head = *first.get_or_insert(w);
            debug_assert!(w.ty == head.ty && w.cols == head.cols, "{name}: rows of one type and width");
            let row_bytes = w.bytes() / (w.rows * w.n_expert);
            bytes.extend_from_slice(&w.matrix(file)[r * row_bytes..(r + 1) * row_bytes]);
        }
        let w = first.expect("at least one row");
        let n = bytes.len() / (w.bytes() / (w.rows * w.n_expert)) / n_expert;
        self.push(Weight { name: name.into(), ty: w.ty, rows: n, cols: w.cols, n_expert, data: Data::Rows(std::sync::Arc::new(bytes)) })
    }
}

/// Every row of a matrix (counted over its experts' matrices stacked), for [`Loader::gather_rows`].
pub(super) fn all_rows(w: &Weight) -> impl Iterator<Item = (&Weight, usize)> {
    (0..w.rows * w.n_expert).map(move |r| (w, r))
}

/// Rows `first..first + rows` of a matrix of the file, as a weight (not in the list).
pub(super) fn rows_of(w: &Weight, name: &str, first: usize, rows: usize) -> Weight {
    let row_bytes = w.bytes() / w.rows;
    let Data::File { offset, .. } = w.data else { unreachable!("matrices come from the file") };
    Weight { name: name.into(), rows, data: Data::File { offset: offset + first * row_bytes, len: rows * row_bytes }, ..w.clone() }
}

/// What a tensor's role accepts.
#[derive(Clone, Copy)]
pub(super) enum Kind {
    /// F32, F16, BF16.
    Float,
    /// Any quantized weight format.
    Quant,
}

impl Kind {
    fn admits(self, ty: GgmlType) -> bool {
        match self {
            Kind::Float => matches!(ty, GgmlType::F32 | GgmlType::F16 | GgmlType::Bf16),
            Kind::Quant => matches!(ty, GgmlType::Quant(_)),
        }
    }

    fn describe(self) -> &'static str {
        match self {
            Kind::Float => "F32, F16, BF16",
            Kind::Quant => "Q8_0, Q6_K, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ4_NL, IQ4_XS, Q2_0",
        }
    }
}

/// The float format of the float matvec for a float tensor type.
pub fn float_format(ty: GgmlType) -> Option<FloatFormat> {
    match ty {
        GgmlType::F32 => Some(FloatFormat::F32),
        GgmlType::F16 => Some(FloatFormat::F16),
        GgmlType::Bf16 => Some(FloatFormat::Bf16),
        GgmlType::Quant(_) => None,
    }
}

/// Matrices: quantized or float.
pub(super) const MATRIX: &[Kind] = &[Kind::Quant, Kind::Float];


/// The quantized format of a weight, when it has one.
pub fn quant_format(ty: GgmlType) -> Option<WeightFormat> {
    match ty {
        GgmlType::Quant(f) => Some(f),
        _ => None,
    }
}
