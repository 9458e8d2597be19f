//! Launch bounds and geometry of the embedding rows, RMSNorm, residual add and float matvec of the decode step.
use super::Bounds;

/// This family's kernels (joined into [`super::BOUNDS`]).
pub const BOUNDS: [Bounds; 0] = [];

/// Sizes the HIP sources read as `STRATA_<NAME>`.
pub const GEOMETRY: &[(&str, usize)] = &[];
