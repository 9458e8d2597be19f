//! Launch bounds and geometry of attention of the decode step: per-head norm + RoPE + KV append, chunked attention and its merge.
use super::Bounds;

/// This family's kernels (joined into [`super::BOUNDS`]).
pub const BOUNDS: [Bounds; 0] = [];

/// Sizes the HIP sources read as `STRATA_<NAME>`.
pub const GEOMETRY: &[(&str, usize)] = &[];
