//! Float functions whose every operation is specified, so the Rust kernels, the HIP kernels and
//! the replica compute the same bits (a library `expf` differs between CUDA, HIP and libm). Plain
//! `f32` arithmetic only: Rust never contracts it into fma, and the HIP twin
//! (`device/hip/strata_hip.h`, `exp_neg`) is compiled with contraction off. A fused
//! multiply-add appears only where a spec names it ([`fma`]).

/// `log2(e)`, `ln(2)` split into a high part with 16 significant bits (so `n * LN2_HI` is exact
/// for the `|n| <= 150` used here) and the rest.
const LOG2E: f32 = core::f32::consts::LOG2_E;
const _: () = assert!(LOG2E.to_bits() == 0x3fb8_aa3b);
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

/// The logistic `1 / (1 + e^-x)` from [`exp_neg`]: `1 / (1 + exp_neg(-x))` for `x >= 0`,
/// `e / (1 + e)` with `e = exp_neg(x)` for `x < 0`; NaN is returned as is.
#[inline(always)]
pub fn sigmoid(x: f32) -> f32 {
    if x >= 0.0 {
        1.0 / (1.0 + exp_neg(-x))
    } else if x < 0.0 {
        let e = exp_neg(x);
        e / (1.0 + e)
    } else {
        x
    }
}

/// `ln(1 + y)` for `0 <= y <= 1`, relative error about 2e-7: `s = y / (2 + y)` (so
/// `s <= 1/3`), `s2 = s * s`, `p = 1 + s2(1/3 + s2(1/5 + ... + s2(1/15 + s2/17)))` by Horner
/// (each step one multiply then one add, from `1/17`), result `(2 * s) * p` (the atanh series).
#[inline(always)]
pub fn ln_1p_unit(y: f32) -> f32 {
    let s = y / (2.0 + y);
    let s2 = s * s;
    let mut p = 1.0 / 17.0;
    p = p * s2 + 1.0 / 15.0;
    p = p * s2 + 1.0 / 13.0;
    p = p * s2 + 1.0 / 11.0;
    p = p * s2 + 1.0 / 9.0;
    p = p * s2 + 1.0 / 7.0;
    p = p * s2 + 1.0 / 5.0;
    p = p * s2 + 1.0 / 3.0;
    p = p * s2 + 1.0;
    (2.0 * s) * p
}

/// `ln(1 + e^x)`, as ggml's softplus: `x` itself above 20 (and for NaN); otherwise
/// `max(x, 0) + ln_1p_unit(exp_neg(-|x|))`, the max taken as `if x > 0 { x } else { 0 }`.
#[inline(always)]
pub fn softplus(x: f32) -> f32 {
    if !(x <= 20.0) {
        return x;
    }
    let (pos, neg_abs) = if x > 0.0 { (x, -x) } else { (0.0, x) };
    pos + ln_1p_unit(exp_neg(neg_abs))
}

/// `sqrt(x)` correctly rounded (round to nearest even), as IEEE `sqrt` and PTX `sqrt.rn.f32`
/// compute it: `core` has no `sqrt`, so the replica computes it from the integer square root of
/// the significand. Negative inputs (not -0) and NaN give NaN; +-0 and +inf are returned as is.
pub fn sqrt_rn(x: f32) -> f32 {
    if x.is_nan() || x < 0.0 {
        return f32::NAN;
    }
    if x == 0.0 || x == f32::INFINITY {
        return x;
    }
    let bits = x.to_bits();
    let (mut mant, mut e) = match (bits >> 23) & 0xff {
        0 => {
            // Subnormal: bring the leading one to bit 23.
            let m = (bits & 0x7f_ffff) as u64;
            let shift = m.leading_zeros() - 40;
            (m << shift, -149 - shift as i32)
        }
        exp => (((bits & 0x7f_ffff) | 1 << 23) as u64, exp as i32 - 150),
    };
    // x = mant * 2^e with e even, mant in [2^23, 2^25); sqrt(x) = sqrt(mant * 2^26) * 2^(e/2 - 13).
    if e & 1 != 0 {
        mant <<= 1;
        e -= 1;
    }
    let m = mant << 26;
    let r = isqrt_u64(m);
    let sticky = r * r != m;
    // Keep 24 significant bits of r, rounding to nearest even (the dropped bits and the sticky
    // remainder decide).
    let drop = (64 - r.leading_zeros()) - 24;
    let (mut q, rest, half) = (r >> drop, r & ((1 << drop) - 1), 1u64 << (drop - 1));
    if rest > half || (rest == half && (sticky || q & 1 == 1)) {
        q += 1;
    }
    let mut exp2 = e / 2 - 13 + drop as i32;
    if q == 1 << 24 {
        q >>= 1;
        exp2 += 1;
    }
    f32::from_bits(((exp2 + 23 + 127) as u32) << 23 | (q as u32 & 0x7f_ffff))
}

/// `floor(sqrt(m))`, digit by digit.
fn isqrt_u64(m: u64) -> u64 {
    let (mut rem, mut root) = (m, 0u64);
    let mut bit = 1u64 << 62;
    while bit > m {
        bit >>= 2;
    }
    while bit != 0 {
        if rem >= root + bit {
            rem -= root + bit;
            root = (root >> 1) + bit;
        } else {
            root >>= 1;
        }
        bit >>= 2;
    }
    root
}

/// `a * b + c` rounded once (IEEE fusedMultiplyAdd, round to nearest even): what PTX `fma.rn.f32`
/// and HIP's `fma_f32` compute. Only where a spec says fma (the attention dot products and value
/// sums, [`crate::replica::attention`]).
///
/// In f64: the product is exact (24 + 24 significant bits), the sum is rounded to odd (rounded
/// to nearest, then where that was inexact and gave an even significand, moved one ulp toward
/// the exact sum, whose error TwoSum gives exactly), and rounding that to f32 is then correct:
/// round-to-odd in a format of at least two more bits never double-rounds (53 >= 24 + 2).
#[inline(always)]
pub fn fma(a: f32, b: f32, c: f32) -> f32 {
    let (ab, c) = (a as f64 * b as f64, c as f64);
    let s = ab + c;
    let t = s - ab;
    let err = (ab - (s - t)) + (c - t);
    let bits = s.to_bits();
    let odd = if err != 0.0 && bits & 1 == 0 && s.is_finite() {
        // Sign and magnitude: the next bit pattern is the larger magnitude.
        f64::from_bits(if (err > 0.0) == (s > 0.0) { bits + 1 } else { bits - 1 })
    } else {
        s
    };
    odd as f32
}

#[cfg(test)]
mod tests {
    use super::*;
    extern crate std;

    /// Against the platform's `fmaf` (std's `mul_add`: the FMA instruction or the C library's
    /// correctly rounded one): random operands of every magnitude, products near the addend
    /// (cancellation), sums on a halfway point of f32 (where rounding twice goes wrong),
    /// subnormal results, zeros of both signs, infinities and NaN.
    #[test]
    fn fma_matches_the_platform_fmaf() {
        let seed = 0x2545_f491_4f6c_dd1du64;
        std::println!("fma_matches_the_platform_fmaf: seed {seed:#x}");
        let mut s = seed;
        let mut next = || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        };
        let check = |a: f32, b: f32, c: f32| {
            let (ours, theirs) = (fma(a, b, c), a.mul_add(b, c));
            assert!(ours.to_bits() == theirs.to_bits() || (ours.is_nan() && theirs.is_nan()), "fma({a:e}, {b:e}, {c:e}) = {ours:e} ({:#x}), platform {theirs:e} ({:#x})", ours.to_bits(), theirs.to_bits());
        };
        let mut halfway = 0;
        let specials = [0.0f32, -0.0, 1.0, -1.0, f32::MIN_POSITIVE, 1e-45, -1e-45, f32::MAX, f32::INFINITY, f32::NEG_INFINITY, f32::NAN, 0.5, 3.0];
        for a in specials {
            for b in specials {
                for c in specials {
                    check(a, b, c);
                }
            }
        }
        for _ in 0..2_000_000 {
            let r = next();
            let (a, b) = (f32::from_bits(r as u32), f32::from_bits((r >> 32) as u32));
            check(a, b, f32::from_bits(next() as u32)); // any magnitudes
            let p = a * b;
            let c = -p * (1.0 + (next() % 64) as f32 * f32::EPSILON);
            check(a, b, c); // cancellation
            // Near halfway: `x * y = 1 + e`, `0 < |e| < 2^-29`, so `c + 2^-24 x y` (`c` in [1, 2))
            // is within an f64 half-ulp of the f32 halfway point `c + 2^-24` without being it:
            // rounded to f64 and then to f32 it would tie; rounded once it must not.
            let x = f32::from_bits(0x3f80_0000 | (next() as u32 & 0x007f_ffff));
            let y = 1.0 / x;
            let e = x as f64 * y as f64 - 1.0;
            if e != 0.0 && e.abs() < 2f64.powi(-29) {
                halfway += 1;
                let c = f32::from_bits(0x3f80_0000 | (next() as u32 & 0x007f_ffff));
                check(x * 2f32.powi(-24), y, c);
                check(-x * 2f32.powi(-24), y, -c);
                // The same where f32's last place is 2^-149 (subnormal sums): the product near 2^-150.
                check(x * 2f32.powi(-75), y * 2f32.powi(-75), f32::from_bits(next() as u32 & 0x007f_ffff));
            }
        }
        assert!(halfway > 10_000, "only {halfway} near-halfway cases");
    }

    #[test]
    fn sqrt_rn_matches_ieee_sqrt() {
        let mut s = 0x9e37_79b9_7f4a_7c15u64;
        let check = |x: f32| {
            let (a, b) = (sqrt_rn(x), std::primitive::f32::sqrt(x));
            assert!(a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan()), "sqrt({x:e} = {:#x}): {a:e} vs {b:e}", x.to_bits());
        };
        for x in [0.0f32, -0.0, 1.0, 2.0, 4.0, f32::MIN_POSITIVE, 1e-45, f32::MAX, f32::INFINITY, -1.0, f32::NAN, 0.25, 3.0] {
            check(x);
        }
        for b in 1..70_000u32 {
            check(f32::from_bits(b)); // subnormals and the smallest normals
        }
        for _ in 0..3_000_000 {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            check(f32::from_bits(s as u32 & 0x7fff_ffff));
        }
    }

    #[test]
    fn sigmoid_and_softplus_match_float64() {
        let (mut worst_sig, mut worst_sp) = (0.0f64, 0.0f64);
        let mut x = -60.0f32;
        while x < 60.0 {
            let xd = x as f64;
            let (sig, sp) = (1.0 / (1.0 + (-xd).exp()), xd.exp().ln_1p());
            worst_sig = worst_sig.max(((sigmoid(x) as f64 - sig) / sig).abs());
            if x <= 20.0 {
                worst_sp = worst_sp.max(((softplus(x) as f64 - sp) / sp).abs());
            } else {
                assert_eq!(softplus(x), x);
            }
            x += 0.000_917;
        }
        assert!(worst_sig < 1e-6, "sigmoid: worst relative error {worst_sig:e}");
        assert!(worst_sp < 1e-6, "softplus: worst relative error {worst_sp:e}");
        assert_eq!(sigmoid(0.0), 0.5);
        assert!(sigmoid(f32::NAN).is_nan() && softplus(f32::NAN).is_nan());
        assert_eq!(sigmoid(f32::NEG_INFINITY), 0.0);
        assert_eq!(sigmoid(f32::INFINITY), 1.0);
        let mut y = 0.0f32;
        while y <= 1.0 {
            let want = (y as f64).ln_1p();
            assert!((ln_1p_unit(y) as f64 - want).abs() <= 3e-7 * want.max(1e-30), "ln_1p({y})");
            y += 0.000_37;
        }
    }

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
