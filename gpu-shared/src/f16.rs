//! IEEE binary16 <-> binary32 conversions, bit-exact with the GPU's `cvt.f32.f16` and
//! `cvt.rn.f16.f32` (round to nearest, ties to even; overflow to infinity; NaN stays NaN with
//! the quiet bit set and the top payload bits kept).

/// Widens an fp16 bit pattern to f32. Exact: every half value is a float value.
pub fn f16_to_f32(h: u16) -> f32 {
    let sign = ((h as u32) & 0x8000) << 16;
    let exp = ((h >> 10) & 0x1f) as u32;
    let man = (h & 0x3ff) as u32;
    let bits = match (exp, man) {
        (0, 0) => sign,
        // Subnormal half: value = man * 2^-24, normal as a float. Shift the mantissa up until
        // its leading one reaches bit 10, lowering the exponent once per shift.
        (0, _) => {
            let shift = man.leading_zeros() - 21; // bring bit 9.. to bit 10
            let m = (man << shift) & 0x3ff;
            let e = 127 - 15 + 1 - shift;
            sign | (e << 23) | (m << 13)
        }
        (0x1f, 0) => sign | 0x7f80_0000,
        (0x1f, _) => sign | 0x7fc0_0000 | (man << 13),
        _ => sign | ((exp + 127 - 15) << 23) | (man << 13),
    };
    f32::from_bits(bits)
}

/// Narrows an f32 to fp16 bits, round to nearest, ties to even.
pub fn f32_to_f16(x: f32) -> u16 {
    let bits = x.to_bits();
    let sign = ((bits >> 16) & 0x8000) as u16;
    let exp = ((bits >> 23) & 0xff) as i32;
    let man = bits & 0x7f_ffff;
    if exp == 0xff {
        return if man == 0 {
            sign | 0x7c00
        } else {
            sign | 0x7e00 | (man >> 13) as u16
        };
    }
    // Unbiased exponent of the half result.
    let e = exp - 127 + 15;
    if e >= 0x1f {
        return sign | 0x7c00;
    }
    if e <= 0 {
        // Result is subnormal or zero: the value is (1.man) * 2^(exp-127); in units of 2^-24
        // that is (0x80_0000 | man) >> (14 - e) with round to nearest even.
        if e < -10 {
            return sign; // below half the smallest subnormal: rounds to zero
        }
        let full = if exp == 0 { man } else { man | 0x80_0000 };
        let shift = (14 - e) as u32;
        return sign | round_shift_even(full, shift) as u16;
    }
    // Normal: keep 10 mantissa bits, round the 13 dropped bits; a carry may bump the exponent
    // (and up to infinity), which adding the rounded value to the exponent field handles.
    let half = ((e as u32) << 10) | (man >> 13);
    let rounded = half + round_increment(man, 13);
    sign | rounded as u16
}

/// `v >> shift`, rounded to nearest with ties to even.
fn round_shift_even(v: u32, shift: u32) -> u32 {
    (v >> shift) + round_increment(v, shift)
}

/// 1 when dropping the low `shift` bits of `v` must round up (nearest, ties to even).
fn round_increment(v: u32, shift: u32) -> u32 {
    let halfway = 1u32 << (shift - 1);
    let rest = v & ((1u32 << shift) - 1);
    let odd = (v >> shift) & 1;
    (rest > halfway || (rest == halfway && odd == 1)) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn widen_matches_half_crate_on_every_pattern() {
        for h in 0..=u16::MAX {
            let want = half::f16::from_bits(h).to_f32();
            let got = f16_to_f32(h);
            if want.is_nan() {
                assert!(got.is_nan(), "{h:#06x}");
                assert_eq!(got.to_bits() & 0x8000_0000, want.to_bits() & 0x8000_0000);
            } else {
                assert_eq!(got.to_bits(), want.to_bits(), "{h:#06x}");
            }
        }
    }

    #[test]
    fn narrow_matches_half_crate() {
        // Every f32 whose top 20 bits vary (covers every exponent, boundary and tie pattern
        // at the 13-bit rounding point), plus a splitmix sweep of arbitrary patterns.
        let check = |bits: u32| {
            let x = f32::from_bits(bits);
            let want = half::f16::from_f32(x).to_bits();
            let got = f32_to_f16(x);
            if x.is_nan() {
                assert_eq!(got & 0x7c00, 0x7c00);
                assert_ne!(got & 0x3ff, 0, "{bits:#010x}");
            } else {
                assert_eq!(got, want, "{bits:#010x} ({x:e})");
            }
        };
        for hi in 0..(1u32 << 20) {
            for lo in [0u32, 0xfff, 0x1000, 0x1001, 0x1fff] {
                check((hi << 12) | lo);
            }
        }
        let mut s = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..1_000_000 {
            s = s.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = s;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            check((z ^ (z >> 31)) as u32);
        }
    }
}
