//! Float conversions, and the float operations `core` lacks, each one PTX instruction with its
//! rounding mode spelled out.
#[cfg(target_arch = "nvptx64")]
use core::arch::asm;

/// fp16 bits to f32 (exact).
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
pub fn f16_to_f32(h: u16) -> f32 {
    let r: f32;
    // SAFETY: register-only conversion.
    unsafe {
        asm!("cvt.f32.f16 {r}, {h};", r = out(reg32) r, h = in(reg16) h,
             options(nostack, pure, nomem))
    };
    r
}

/// f32 to fp16 bits, round to nearest even (`strata_gpu_shared::f16::f32_to_f16`).
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
pub fn f32_to_f16(x: f32) -> u16 {
    let r: u16;
    // SAFETY: register-only conversion.
    unsafe {
        asm!("cvt.rn.f16.f32 {r}, {x};", r = out(reg16) r, x = in(reg32) x,
             options(nostack, pure, nomem))
    };
    r
}

/// f32 to i32, round to nearest even; saturates out of range, NaN gives 0
/// (`f32::round_ties_even` then `as i32` on the host).
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
pub fn f32_to_i32_rne(x: f32) -> i32 {
    let r: i32;
    // SAFETY: register-only conversion.
    unsafe {
        asm!("cvt.rni.s32.f32 {r}, {x};", r = out(reg32) r, x = in(reg32) x,
             options(nostack, pure, nomem))
    };
    r
}

/// `sqrt(x)` correctly rounded (`sqrt.rn.f32`; `strata_gpu_shared::math::sqrt_rn`).
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
pub fn sqrt_rn(x: f32) -> f32 {
    let r: f32;
    // SAFETY: register-only arithmetic.
    unsafe {
        asm!("sqrt.rn.f32 {r}, {x};", r = out(reg32) r, x = in(reg32) x,
             options(nostack, pure, nomem))
    };
    r
}

/// `a * b + c` rounded once (`fma.rn.f32`; `strata_gpu_shared::math::fma`). Only where a spec
/// says fma: the PTX check admits it in the attention entries alone.
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
pub fn fma_rn(a: f32, b: f32, c: f32) -> f32 {
    let r: f32;
    // SAFETY: register-only arithmetic.
    unsafe {
        asm!("fma.rn.f32 {r}, {a}, {b}, {c};", r = out(reg32) r, a = in(reg32) a, b = in(reg32) b, c = in(reg32) c,
             options(nostack, pure, nomem))
    };
    r
}

// The simulator's (`super::sim`): the same roundings in software.
#[cfg(not(target_arch = "nvptx64"))]
pub use strata_gpu_shared::f16::{f16_to_f32, f32_to_f16};

#[cfg(not(target_arch = "nvptx64"))]
pub fn f32_to_i32_rne(x: f32) -> i32 {
    x.round_ties_even() as i32
}

/// (A NaN result is `sqrt.rn`'s canonical NaN, 0x7fffffff, where the host's would keep a sign.)
#[cfg(not(target_arch = "nvptx64"))]
pub fn sqrt_rn(x: f32) -> f32 {
    let r = x.sqrt();
    if r.is_nan() {
        f32::from_bits(0x7fff_ffff)
    } else {
        r
    }
}

#[cfg(not(target_arch = "nvptx64"))]
pub fn fma_rn(a: f32, b: f32, c: f32) -> f32 {
    a.mul_add(b, c)
}
