//! Replica of `quantize_q8_0_scaled`: f32 rows times per-row or per-column scales to Q8_0
//! blocks (spec in [`crate::order`]).
use crate::f16::{f16_to_f32, f32_to_f16};
use crate::formats::{q8_0, GROUP};
use crate::order::{q8_1_quant, q8_1_scale};

/// Quantizes 32 already-scaled values into one Q8_0 block.
pub fn quantize_group(v: &[f32], out: &mut [u8]) {
    let amax = v.iter().fold(0.0f32, |m, x| m.max(x.abs()));
    let d = f32_to_f16(q8_1_scale(amax));
    let df = f16_to_f32(d);
    for (j, &x) in v[..GROUP].iter().enumerate() {
        out[q8_0::OFF_Q + j] = q8_1_quant(x, df) as i8 as u8;
    }
    out[q8_0::OFF_D..q8_0::OFF_D + 2].copy_from_slice(&d.to_le_bytes());
}

/// `x`: rows of `k` values; `scales`: one per row (`per_column == false`) or one per column.
pub fn quantize_scaled(x: &[f32], k: usize, scales: &[f32], per_column: bool, out: &mut [u8]) {
    let mut v = [0.0f32; GROUP];
    for (g, block) in out.chunks_exact_mut(q8_0::BYTES).enumerate() {
        let (row, col0) = (g * GROUP / k, g * GROUP % k);
        for (j, vj) in v.iter_mut().enumerate() {
            let s = if per_column { scales[col0 + j] } else { scales[row] };
            *vj = x[g * GROUP + j] * s;
        }
        quantize_group(&v, block);
    }
}
