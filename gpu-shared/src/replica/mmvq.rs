//! Replica of `mmvq`: one quantized weight row times one q8_1 activation row (spec in
//! [`crate::order`]).
use super::{row_group, IntGroup};
use crate::f16::f16_to_f32;
use crate::formats::{q8_1, WeightFormat};
use crate::order::{butterfly_sum, group_scale, LANES};

/// Exact integer dot of a decoded weight group with a q8_1 block's quants:
/// `f[0] * dot(v[..16], q[..16]) + f[1] * dot(v[16..], q[16..])`.
pub fn group_dot(g: &IntGroup, xblock: &[u8]) -> i32 {
    let q = &xblock[q8_1::OFF_Q..q8_1::OFF_Q + 32];
    let half = |h: usize| -> i32 { (16 * h..16 * h + 16).map(|j| g.v[j] as i32 * q[j] as i8 as i32).sum() };
    g.f[0] * half(0) + g.f[1] * half(1)
}

/// `wrow` holds one weight row of `format`, `xrow` the activation row's q8_1 blocks (one per
/// 32 values).
pub fn row_dot(format: WeightFormat, wrow: &[u8], xrow: &[u8]) -> f32 {
    let mut partial = [0.0f32; LANES];
    for (b, xb) in xrow.chunks_exact(q8_1::BYTES).enumerate() {
        let g = row_group(format, wrow, b);
        let dw = f16_to_f32(g.d);
        let dx = f16_to_f32(u16::from_le_bytes([xb[q8_1::OFF_D], xb[q8_1::OFF_D + 1]]));
        partial[b % LANES] += (dw * dx) * group_scale(group_dot(&g, xb), format.shift());
    }
    butterfly_sum(partial)
}
