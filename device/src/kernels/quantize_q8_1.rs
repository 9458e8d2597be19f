//! `quantize_q8_1`: f32 activations to q8_1 blocks, one warp per 32-value group, lane `j`
//! owning value `j`. Spec: `strata_gpu_shared::order` (quantize_q8_1).
use crate::arch::{convert, index, mem, warp};
use strata_gpu_shared::formats::{q8_1, GROUP};
use strata_gpu_shared::launch::QUANTIZE_WARPS;
use strata_gpu_shared::order::q8_1_scale;

/// One warp quantizes one 32-value group, lane `j` holding value `v`: writes the block at
/// `block` (lane `j` its quant, lane 0 `d` and `s`). Every lane of the warp must call it.
///
/// # Safety
/// `block` is one writable q8_1 block in device memory, 4-byte aligned.
#[inline(always)]
pub unsafe fn quantize_group(v: f32, block: *mut u8) {
    let lane = index::lane();
    let amax = warp::warp_max_f32(v.abs());
    let d = convert::f32_to_f16(q8_1_scale(amax));
    let df = convert::f16_to_f32(d);
    let q = if df == 0.0 { 0 } else { convert::f32_to_i32_rne(v / df).clamp(-127, 127) };
    let sum = warp::warp_sum_i32(q);
    mem::st_u8(block.add(q8_1::OFF_Q + lane as usize), q as i8 as u8);
    if lane == 0 {
        mem::st_u16(block.add(q8_1::OFF_D), d);
        mem::st_u16(block.add(q8_1::OFF_S), convert::f32_to_f16(df * sum as f32));
    }
}

crate::entry! {
    /// `x`: `groups * 32` f32 values (rows laid end to end); `out`: `groups` q8_1 blocks.
    /// Launch: `ceil(groups / QUANTIZE_WARPS)` blocks of `32 * QUANTIZE_WARPS` threads.
    ///
    /// # Safety
    /// `x` and `out` must be device buffers of the sizes above; `out` must not overlap `x`.
    pub unsafe fn quantize_q8_1(x: *const f32, out: *mut u8, groups: u32) {
        crate::arch::sync::chain_grids();
        let g = index::block_idx() * QUANTIZE_WARPS + index::warp_in_block();
        if g >= groups {
            return; // the whole warp leaves together; nothing below needs the others
        }
        let v = f32::from_bits(mem::ld_nc_u32(x.add((g * GROUP as u32 + index::lane()) as usize) as *const u8));
        quantize_group(v, out.add(g as usize * q8_1::BYTES));
    }
}
