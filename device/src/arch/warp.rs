//! Warp shuffles and the reductions built on them. All lanes of the warp must take part.
#[cfg(target_arch = "nvptx64")]
use core::arch::asm;

#[cfg(target_arch = "nvptx64")]
const FULL: u32 = 0xffff_ffff;

/// Value of `v` in lane `lane ^ mask`.
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
pub fn shfl_xor_u32(v: u32, mask: u32) -> u32 {
    let r: u32;
    // SAFETY: register-only warp shuffle with the full member mask; callers keep the whole warp
    // converged. Deliberately not `pure`: a pure asm may be sunk into a branch that only some
    // lanes take (e.g. `if lane == 0 { store(sum) }`), and a shuffle there reads lanes that never
    // arrive. Without `pure` it counts as a side effect and stays where it is written.
    unsafe {
        asm!("shfl.sync.bfly.b32 {r}, {v}, {m}, 0x1f, {full};",
             r = out(reg32) r, v = in(reg32) v, m = in(reg32) mask, full = in(reg32) FULL,
             options(nostack, nomem))
    };
    r
}

/// Value of `v` in lane `src` (every lane reads the same lane; `src < 32`).
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
pub fn shfl_u32(v: u32, src: u32) -> u32 {
    let r: u32;
    // SAFETY: register-only warp shuffle with the full member mask, as `shfl_xor_u32` (and not
    // `pure`, for the same reason).
    unsafe {
        asm!("shfl.sync.idx.b32 {r}, {v}, {s}, 0x1f, {full};",
             r = out(reg32) r, v = in(reg32) v, s = in(reg32) src, full = in(reg32) FULL,
             options(nostack, nomem))
    };
    r
}

/// The simulator's (`super::sim`).
#[cfg(not(target_arch = "nvptx64"))]
pub fn shfl_xor_u32(v: u32, mask: u32) -> u32 {
    super::sim::shfl(v, super::index::lane() ^ mask)
}

#[cfg(not(target_arch = "nvptx64"))]
pub fn shfl_u32(v: u32, src: u32) -> u32 {
    super::sim::shfl(v, src)
}

#[inline(always)]
pub fn shfl_xor_f32(v: f32, mask: u32) -> f32 {
    f32::from_bits(shfl_xor_u32(v.to_bits(), mask))
}

/// Butterfly sum over the warp: for `o` in 16, 8, 4, 2, 1, `v = v + v[lane ^ o]`. Every lane ends
/// with the same bits (each pair adds the same two operands). This is `order::butterfly_sum`.
#[inline(always)]
pub fn warp_sum_f32(mut v: f32) -> f32 {
    let mut o = 16;
    while o > 0 {
        v += shfl_xor_f32(v, o);
        o >>= 1;
    }
    v
}

/// Warp maximum (IEEE maxNum: a NaN operand loses to a number). Exact, so the order is free.
#[inline(always)]
pub fn warp_max_f32(mut v: f32) -> f32 {
    let mut o = 16;
    while o > 0 {
        v = v.max(shfl_xor_f32(v, o));
        o >>= 1;
    }
    v
}

/// Each word of `v` summed over its run of `width` adjacent lanes (`width` a power of two up to
/// 32, runs starting at multiples of it): every lane of a run gets the run's sums. The words go
/// through the butterfly round by round together. The whole warp calls it, converged.
#[inline(always)]
pub fn sum_lanes_u32<const N: usize>(mut v: [u32; N], width: u32) -> [u32; N] {
    let mut m = 1;
    while m < width {
        v = v.map(|x| x + shfl_xor_u32(x, m));
        m <<= 1;
    }
    v
}

/// Warp integer sum (exact).
#[inline(always)]
pub fn warp_sum_i32(mut v: i32) -> i32 {
    let mut o = 16;
    while o > 0 {
        v = v.wrapping_add(shfl_xor_u32(v as u32, o) as i32);
        o >>= 1;
    }
    v
}

/// What [`store_row_sums`] adds lane `r`'s row sum to with `accumulate`: the value at `out(r)`
/// for lane `r < rows`, +0.0 in the other lanes or without `accumulate`. A kernel loads it when
/// its grid wait returns, so that the load's latency passes beside its partials' instead of
/// after its butterflies (no other thread of the launch writes `out(r)`: the same value).
///
/// # Safety
/// As [`store_row_sums`].
#[inline(always)]
pub unsafe fn row_sums_base(rows: u32, accumulate: bool, out: impl Fn(usize) -> *mut f32) -> f32 {
    let lane = super::index::lane();
    if accumulate && lane < rows { super::mem::ld_f32(out(lane as usize), 0) } else { 0.0 }
}

/// Sums each used row slot's partials over the warp (butterfly) and has lane `r` store row
/// `r`'s sum at `out(r)`, or with `accumulate` add it to the value there
/// ([`super::mem::st_f32_acc`]): `base`, from [`row_sums_base`], or loaded by lane `r` after its
/// butterfly where `base` is `None` (for kernels with no register to hold it). The common tail
/// of the one-warp-per-output-row kernels.
///
/// # Safety
/// `out(r)` must be a valid, 4-byte aligned f32 address for every `r < rows`, touched by no
/// other thread of the launch.
#[inline(always)]
pub unsafe fn store_row_sums<const N: usize>(acc: &[f32; N], rows: u32, accumulate: bool, base: Option<f32>, out: impl Fn(usize) -> *mut f32) {
    let lane = super::index::lane();
    for (r, &a) in acc.iter().enumerate() {
        if r as u32 >= rows {
            continue;
        }
        let v = warp_sum_f32(a);
        if lane == r as u32 {
            super::mem::st_f32_acc(out(r), v, accumulate, base);
        }
    }
}
