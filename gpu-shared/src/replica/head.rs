//! Replicas of the sampler-head kernels `argmax_rows` and `row_top_prob` (specs in
//! [`crate::order`]). The split and one-block GPU variants both compute these.
use crate::launch::HEAD_CHUNK;
use crate::order::{argmax_better, butterfly_sum, top_prob_term, HEAD_THREADS, LANES};

/// Index of the row's best element and whether the row is all NaN.
pub fn argmax_row(x: &[f32]) -> (u32, bool) {
    let mut best = 0u32;
    for (j, &v) in x.iter().enumerate().skip(1) {
        if argmax_better(v, j as u32, x[best as usize], best) {
            best = j as u32;
        }
    }
    (best, x.iter().all(|v| v.is_nan()))
}

/// The sum of one chunk's terms in the spec's order (thread strides, warp butterflies, warps
/// left to right).
pub fn chunk_sum(chunk: &[f32], m: f32) -> f32 {
    let mut warps = [0.0f32; HEAD_THREADS / LANES];
    for (w, ws) in warps.iter_mut().enumerate() {
        let mut lanes = [0.0f32; LANES];
        for (l, ls) in lanes.iter_mut().enumerate() {
            let t = w * LANES + l;
            for v in chunk.iter().skip(t).step_by(HEAD_THREADS) {
                *ls += top_prob_term(*v, m);
            }
        }
        *ws = butterfly_sum(lanes);
    }
    warps.iter().fold(0.0, |a, &w| a + w)
}

/// The maximum of a row, NaN ignored (-inf for an all-NaN row).
pub fn row_max(x: &[f32]) -> f32 {
    x.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v))
}

/// The softmax probability of the row's maximum.
pub fn row_top_prob(x: &[f32]) -> f32 {
    let m = row_max(x);
    let total = x.chunks(HEAD_CHUNK).fold(0.0f32, |t, c| t + chunk_sum(c, m));
    if total == 0.0 {
        0.0
    } else {
        1.0 / total
    }
}
