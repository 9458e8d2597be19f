//! Replica of `quantize_q8_1`: f32 rows to q8_1 blocks (spec in [`crate::order`]).
use crate::f16::{f16_to_f32, f32_to_f16};
use crate::formats::{q8_1, GROUP};
use crate::order::{q8_1_quant, q8_1_scale};

/// Quantizes one 32-value group into one 36-byte q8_1 block.
pub fn quantize_group(x: &[f32], out: &mut [u8]) {
    let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let d = f32_to_f16(q8_1_scale(amax));
    let df = f16_to_f32(d);
    let mut sum = 0i32;
    for (j, &v) in x[..GROUP].iter().enumerate() {
        let q = q8_1_quant(v, df);
        sum += q;
        out[q8_1::OFF_Q + j] = q as i8 as u8;
    }
    let s = f32_to_f16(df * sum as f32);
    out[q8_1::OFF_D..q8_1::OFF_D + 2].copy_from_slice(&d.to_le_bytes());
    out[q8_1::OFF_S..q8_1::OFF_S + 2].copy_from_slice(&s.to_le_bytes());
}

/// Quantizes `x` (any number of rows of a length that is a multiple of 32, laid end to end)
/// into `x.len() / 32` consecutive blocks of `out`.
pub fn quantize(x: &[f32], out: &mut [u8]) {
    for (g, block) in x.chunks_exact(GROUP).zip(out.chunks_exact_mut(q8_1::BYTES)) {
        quantize_group(g, block);
    }
}
