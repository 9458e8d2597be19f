//! `quantize_q8_0_scaled`: f32 rows times per-row or per-column scales to Q8_0 blocks, one warp
//! per block (lane `j` owns value `j`), and `quantize_q8_0_scaled_ref`, one thread per block.
//! Spec: `strata_gpu_shared::order` (quantize_q8_0_scaled).
use crate::arch::{convert, index, mem, warp};
use strata_gpu_shared::formats::{q8_0, GROUP};
use strata_gpu_shared::launch::QUANTIZE_WARPS;
use strata_gpu_shared::order::q8_1_scale;

/// `x[i] * scale` with the row's or the column's scale.
#[inline(always)]
unsafe fn scaled(x: *const f32, k: u32, scales: *const f32, per_column: u32, i: u32) -> f32 {
    let s = if per_column != 0 { i % k } else { i / k };
    let xi = f32::from_bits(mem::ld_nc_u32(x.add(i as usize) as *const u8));
    xi * f32::from_bits(mem::ld_nc_u32(scales.add(s as usize) as *const u8))
}

#[inline(always)]
fn quant(v: f32, df: f32) -> i32 {
    if df == 0.0 {
        0
    } else {
        convert::f32_to_i32_rne(v / df).clamp(-127, 127)
    }
}

crate::entry! {
    /// Launch: `ceil(groups / QUANTIZE_WARPS)` blocks of `32 * QUANTIZE_WARPS` threads.
    ///
    /// # Safety
    /// `x`: `groups * 32` f32 in rows of `k` (a multiple of 32); `scales`: one per row or per
    /// column; `out`: `groups` Q8_0 blocks, not overlapping the inputs.
    pub unsafe fn quantize_q8_0_scaled(x: *const f32, k: u32, scales: *const f32, per_column: u32, groups: u32, out: *mut u8) {
        crate::arch::sync::chain_grids();
        let g = index::block_idx() * QUANTIZE_WARPS + index::warp_in_block();
        if g >= groups {
            return; // whole warp
        }
        let lane = index::lane();
        let v = scaled(x, k, scales, per_column, g * GROUP as u32 + lane);
        let d = convert::f32_to_f16(q8_1_scale(warp::warp_max_f32(v.abs())));
        let block = out.add(g as usize * q8_0::BYTES);
        mem::st_u8(block.add(q8_0::OFF_Q + lane as usize), quant(v, convert::f16_to_f32(d)) as i8 as u8);
        if lane == 0 {
            mem::st_u16(block.add(q8_0::OFF_D), d);
        }
    }
}

crate::entry! {
    /// The one-thread-per-block reference. Launch: `ceil(groups / (32 * QUANTIZE_WARPS))` blocks of
    /// `32 * QUANTIZE_WARPS` threads.
    ///
    /// # Safety
    /// As [`quantize_q8_0_scaled`].
    pub unsafe fn quantize_q8_0_scaled_ref(x: *const f32, k: u32, scales: *const f32, per_column: u32, groups: u32, out: *mut u8) {
        crate::arch::sync::chain_grids();
        let g = index::block_idx() * index::block_dim() + index::thread_idx();
        if g >= groups {
            return;
        }
        let base = g * GROUP as u32;
        let mut amax = 0.0f32;
        for j in 0..GROUP as u32 {
            amax = amax.max(scaled(x, k, scales, per_column, base + j).abs());
        }
        let d = convert::f32_to_f16(q8_1_scale(amax));
        let df = convert::f16_to_f32(d);
        let block = out.add(g as usize * q8_0::BYTES);
        for j in 0..GROUP as u32 {
            mem::st_u8(block.add(q8_0::OFF_Q + j as usize), quant(scaled(x, k, scales, per_column, base + j), df) as i8 as u8);
        }
        mem::st_u16(block.add(q8_0::OFF_D), d);
    }
}
