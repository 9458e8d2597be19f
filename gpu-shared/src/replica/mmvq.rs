//! Replica of `mmvq`: one quantized weight row times one q8_1 activation row (spec in
//! [`crate::order`]).
use super::decode_group;
use crate::f16::f16_to_f32;
use crate::formats::{q8_1, WeightFormat};
use crate::order::{butterfly_sum, LANES};

/// Exact integer dot of a weight group's values with a q8_1 block's quants.
pub fn group_dot(w: &[i8; 32], xblock: &[u8]) -> i32 {
    w.iter()
        .zip(&xblock[q8_1::OFF_Q..q8_1::OFF_Q + 32])
        .map(|(&a, &b)| a as i32 * b as i8 as i32)
        .sum()
}

/// `wrow` holds the row's `n` blocks of `format`, `xrow` the activation row's `n` q8_1 blocks.
pub fn row_dot(format: WeightFormat, wrow: &[u8], xrow: &[u8]) -> f32 {
    let mut partial = [0.0f32; LANES];
    let blocks = wrow.chunks_exact(format.block_bytes()).zip(xrow.chunks_exact(q8_1::BYTES));
    for (b, (wb, xb)) in blocks.enumerate() {
        let g = decode_group(format, wb);
        let dw = f16_to_f32(g.d);
        let dx = f16_to_f32(u16::from_le_bytes([xb[q8_1::OFF_D], xb[q8_1::OFF_D + 1]]));
        let c = (dw * dx) * group_dot(&g.q, xb) as f32;
        partial[b % LANES] += c;
    }
    butterfly_sum(partial)
}
