//! Launch bounds and geometry of the router's softmax/top-k and the sampler of the decode step.
use super::Bounds;

/// This family's kernels (joined into [`super::BOUNDS`]).
pub const BOUNDS: [Bounds; 0] = [];

/// Sizes the HIP sources read as `STRATA_<NAME>`.
pub const GEOMETRY: &[(&str, usize)] = &[];
