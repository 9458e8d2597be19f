//! Replica of `matvec_f32` / `matvec_bf16` / `matvec_f16`: a float weight row times an f32
//! activation row (spec in [`crate::order`]; f16 weights widen exactly, like bf16).
use crate::formats::FloatFormat;
use crate::order::{butterfly_sum, LANES};

/// `wrow`: `x.len()` elements of `format`.
pub fn row_dot(format: FloatFormat, wrow: &[u8], x: &[f32]) -> f32 {
    let mut partial = [0.0f32; LANES];
    for (j, &xj) in x.iter().enumerate() {
        partial[j % LANES] += format.get(wrow, j) * xj;
    }
    butterfly_sum(partial)
}
