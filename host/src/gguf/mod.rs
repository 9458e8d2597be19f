//! GGUF files: the tensor types Strata knows ([`types`]), a validating memory-mapped reader
//! ([`reader`]) and a writer ([`writer`]) for tests, synthetic models and the built-in model.
//!
//! Layout (v2 and v3, little-endian): magic `GGUF`, u32 version, u64 tensor count, u64 metadata
//! count; the metadata key/value pairs; the tensor infos (name, u32 n_dims, u64 dims, u32 type,
//! u64 offset relative to the data section); padding to `general.alignment` (default 32); the
//! data section.

pub mod reader;
pub mod types;
pub mod value;
pub mod writer;

pub use reader::{GgufError, GgufFile, TensorInfo};
pub use types::GgmlType;
pub use value::Value;
pub use writer::{GgufWriter, TensorDecl, TensorSink};

/// `GGUF` read as a little-endian u32.
pub const MAGIC: u32 = 0x4655_4747;
/// Alignment of tensor data when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// Most dimensions a tensor may have (ggml's GGML_MAX_DIMS).
pub const MAX_DIMS: u32 = 4;
