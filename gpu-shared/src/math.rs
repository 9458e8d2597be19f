//! Float functions whose every operation is specified, so the Rust kernels, the HIP kernels and
//! the replica compute the same bits (a library `expf` differs between CUDA, HIP and libm). Plain
//! `f32` arithmetic only: Rust never contracts it into fma, and the HIP twin
//! (`device/hip/strata_hip.h`, `exp_neg`) is compiled with contraction off.

/// `log2(e)`, `ln(2)` split into a high part with 16 significant bits (so `n * LN2_HI` is exact
/// for the `|n| <= 150` used here) and the rest.
const LOG2E: f32 = 1.442_695_04;
const LN2_HI: f32 = f32::from_bits(0x3f31_7200);
const LN2_LO: f32 = f32::from_bits(0x35bf_be8e);
/// 1.5 * 2^23: adding and subtracting it rounds an |x| < 2^22 to the nearest integer (ties even).
const ROUNDER: f32 = 12_582_912.0;

/// `e^x` for `x <= 0` (the softmax terms `x - max`), relative error about 2e-7. Arguments below
/// -103 (where the result is below the smallest subnormal's half) and NaN give 0.
///
/// Steps, in order: `n = rne(x * LOG2E)`; `r = (x - n * LN2_HI) - n * LN2_LO`;
/// `p = 1 + r(1 + r(1/2 + r(1/6 + r(1/24 + r(1/120 + r/720)))))` by Horner, each step one
/// multiply then one add; result `p * 2^n`, as `(p * 2^(n + 100)) * 2^-100` when `n < -126` so
/// the subnormal result is rounded once.
#[inline(always)]
pub fn exp_neg(x: f32) -> f32 {
    if !(x > -103.0) {
        return 0.0;
    }
    let n = (x * LOG2E + ROUNDER) - ROUNDER;
    let r = (x - n * LN2_HI) - n * LN2_LO;
    let mut p = 1.0 / 720.0;
    p = p * r + 1.0 / 120.0;
    p = p * r + 1.0 / 24.0;
    p = p * r + 1.0 / 6.0;
    p = p * r + 0.5;
    p = p * r + 1.0;
    p = p * r + 1.0;
    let ni = n as i32;
    if ni >= -126 {
        p * f32::from_bits(((ni + 127) as u32) << 23)
    } else {
        (p * f32::from_bits(((ni + 100 + 127) as u32) << 23)) * f32::from_bits((127 - 100) << 23)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    extern crate std;

    #[test]
    fn exp_neg_is_accurate_over_its_range() {
        let mut worst = 0.0f64;
        let mut x = 0.0f32;
        while x > -103.0 {
            let want = (x as f64).exp();
            let got = exp_neg(x) as f64;
            if want >= f32::MIN_POSITIVE as f64 {
                worst = worst.max(((got - want) / want).abs());
            } else {
                // Subnormal results: the polynomial's relative error, plus one rounding to the
                // subnormal grid (steps of 2^-149).
                assert!((got - want).abs() <= 4e-7 * want + 1.41e-45, "{x}: {got:e} vs {want:e}");
            }
            x -= 0.000_731;
        }
        assert!(worst < 4e-7, "worst relative error {worst:e}");
        assert_eq!(exp_neg(0.0), 1.0);
        assert_eq!(exp_neg(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp_neg(-200.0), 0.0);
    }
}
