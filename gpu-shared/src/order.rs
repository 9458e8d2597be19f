//! The float arithmetic every kernel variant and backend performs, in order. Integer parts
//! (group dot products, quant sums, maxima) are exact and may be computed in any order; only
//! the float steps below are fixed. The replicas in [`crate::replica`] are these specs run on
//! the CPU, and the GPU kernels compute them lane by lane.
//!
//! The decode step's families state their orders in their replica modules: embedding rows
//! ([`crate::replica::embed`]), RMSNorm and the residual add ([`crate::replica::norm`]), the
//! per-head norm, RoPE, chunked attention and its merge ([`crate::replica::attention`]), the
//! router's top-k ([`crate::replica::route`]) and the sampler ([`crate::replica::sample`]).
//!
//! ## `quantize_q8_1` (one 32-value group)
//!
//! 1. `amax` = maxNum over `|x_j|` (NaN inputs are ignored; exact in any order).
//! 2. `d` = fp16_rn(min(amax / 127, 65504)) (IEEE division, then round to nearest even; the
//!    clamp keeps `d` finite). `df` = f32(d).
//! 3. `q_j` = 0 when `df == 0`, else clamp(rne(x_j / df), -127, 127), where rne rounds to
//!    nearest even, saturates +-inf, and maps NaN to 0.
//! 4. `s` = fp16_rn(df * f32(sum_j q_j)) (the sum is exact).
//!
//! No step produces NaN, so the fp16 fields are identical whatever NaN encoding a GPU uses.
//!
//! ## `mmvq` (one output value: weight row `m` times activation row `r`)
//!
//! For group `b` of the row, decoded as in [`crate::replica::decode_group`] (fp16 `dw`, int8
//! values `v`, integer factors `f[0]` for values 0..16 and `f[1]` for 16..32, shift `k`):
//! `S_b = f[0] * dot(v[..16], q[..16]) + f[1] * dot(v[16..], q[16..])` is an exact integer
//! (`|S_b| < 2^24` for every format), and `c_b = (dw_b * dx_b) * (f32(S_b) * 2^-k)`: the scale
//! product first, then times the group's exact value ([`group_scale`]; `f32(S_b)` and the power
//! of two are exact, so that factor is the exact rational `S_b / 2^k`).
//!
//! The row's groups are split over [`LANES`] partial sums: partial `p` is the left-to-right sum,
//! starting from +0.0, of `c_b` for `b = p, p + 32, p + 64, ...`. The 32 partials are then
//! combined by [`butterfly_sum`]. A variant may give one group to several threads (the integer
//! `S_b` is exact) or several rows to one warp, but the partials and the tree stay as here.

//!
//! ## `matvec_f32` / `matvec_f16` / `matvec_bf16` (float weights, f32 activations)
//!
//! Partial `p` (of [`LANES`]) is the left-to-right sum from +0.0 of `w[j] * x[j]` (the product
//! rounded to f32, then added: no fma) for `j = p, p + 32, ...`; f16 and bf16 weights widen to
//! f32 exactly. The partials are combined by [`butterfly_sum`].
//!
//! ## Accumulating outputs (`mmvq`, `matvec`, `moe_combine`)
//!
//! These kernels take `accumulate` (0 or 1). With 0 each output value `v` is stored as
//! computed; with 1 the kernel stores `y + v`, `y` the value the output held before: one IEEE
//! addition, the residual add `add_f32` with `a = y`, `b = v` ([`stored`]). So a producer that
//! accumulates into the residual stream gives the bits of the producer followed by the add.

//!
//! ## `argmax_rows` (sampler head: greedy pick)
//!
//! The index of the best element of each row under [`argmax_better`]: a larger number wins; a
//! NaN never wins over a number (so +inf wins, and a row of -inf returns index 0); equal values
//! (-0 equals +0) go to the lowest index. This is a maximum under a total order, so it is the
//! same whatever order the elements are compared in: the split kernel (one block per
//! [`crate::launch::HEAD_CHUNK`] elements, then a pass over the chunks) and the one-block
//! reference agree by construction. A row of all NaN returns index 0 and sets its flag.
//!
//! ## `row_top_prob` (sampler head: probability of the maximum, for draft acceptance)
//!
//! `m` = maxNum over the row (NaN ignored; -inf if all NaN). Term `t_j` = 0 for a NaN `x_j`, 1
//! when `x_j == m`, else [`crate::math::exp_neg`]`(x_j - m)`. The row is cut into chunks of
//! `HEAD_CHUNK` elements. In a chunk, thread `t` (of [`HEAD_THREADS`]) sums `t_j` for
//! `j = t, t + 256, ...` (positions within the chunk) left to right from +0.0; each warp's 32
//! thread sums go through the butterfly; the chunk sum is the left-to-right sum from +0.0 of the
//! 8 warp sums. The row total is the left-to-right sum from +0.0 of the chunk sums, and the
//! result is `1 / total` (0 when the total is 0, i.e. an all-NaN row).
//!
//! ## `quantize_q8_0_scaled`
//!
//! `v_j = x_j * scale` (one multiply; the scale is per row or per column), then the
//! `quantize_q8_1` steps 1-3 on `v` (no `s`): Q8_0 blocks of fp16 `d` and 32 int8.

/// Threads per block of the head kernels (8 warps).
pub const HEAD_THREADS: usize = 256;

/// The value an accumulating kernel stores over `prev` (see "Accumulating outputs" above).
#[inline(always)]
pub fn stored(prev: f32, v: f32, accumulate: bool) -> f32 {
    if accumulate {
        prev + v
    } else {
        v
    }
}

/// Whether `(va, ia)` beats `(vb, ib)` in `argmax_rows`.
#[inline(always)]
pub fn argmax_better(va: f32, ia: u32, vb: f32, ib: u32) -> bool {
    match (va.is_nan(), vb.is_nan()) {
        (true, true) => ia < ib,
        (true, false) => false,
        (false, true) => true,
        (false, false) => va > vb || (va == vb && ia < ib),
    }
}

/// The softmax term of `x` against the row maximum `m` (`row_top_prob`).
#[inline(always)]
pub fn top_prob_term(x: f32, m: f32) -> f32 {
    if x.is_nan() {
        0.0
    } else if x == m {
        1.0
    } else {
        crate::math::exp_neg(x - m)
    }
}

/// `(p, i)` as one integer whose order is [`argmax_better`]'s, for `p` as [`top_prob_term`]
/// returns it (a number in `[+0.0, 1]`: no NaN, no `-0.0`): the probability's bits above the
/// inverted id, so a larger `p` wins and an equal `p` goes to the lower id. The router's kernels
/// rank an expert by how many keys are above its own, one integer comparison a pair. 0 is below
/// every such key: it marks a slot holding no expert.
#[inline(always)]
pub fn prob_key(p: f32, i: u32) -> u64 {
    ((p.to_bits() as u64) << 32) | !i as u64
}

/// The probability and id of a [`prob_key`].
#[inline(always)]
pub fn prob_key_parts(key: u64) -> (f32, u32) {
    (f32::from_bits((key >> 32) as u32), !(key as u32))
}

/// Partial sums per output value: the lanes of one warp.
pub const LANES: usize = 32;

/// The warp butterfly: for `o` in 16, 8, 4, 2, 1, each lane `l` becomes `v[l] + v[l ^ o]`. All
/// lanes end with the same bits; returns that value.
pub fn butterfly_sum(mut v: [f32; LANES]) -> f32 {
    let mut o = LANES / 2;
    while o > 0 {
        let prev = v;
        for (l, x) in v.iter_mut().enumerate() {
            *x = prev[l] + prev[l ^ o];
        }
        o /= 2;
    }
    v[0]
}

/// `turn(first) + turn(first + step)` for `H` sums at once (the caller's `H`), as a loop of two
/// turns, so a GPU thread holds one copy of `turn`'s body. A macro, not a function taking a
/// closure: a kernel entry's closures are functions LLVM may leave out of line once two entries
/// share them (as `attn_chunk` and `attn_chunk_two` do), with a call and a stack frame.
macro_rules! two_turns {
    ($first:expr, $step:expr, |$at:ident| $turn:expr) => {{
        let (first, step): (u32, u32) = ($first, $step);
        let (mut sum, mut i) = ([0.0f32; H], 0);
        loop {
            let $at = first + i * step;
            let v = $turn;
            if i == 1 {
                break add_each(sum, v);
            }
            (sum, i) = (v, 1);
        }
    }};
}

/// [`butterfly_sum`] of the partials `leaf(0), ..., leaf(31)` computed by one thread, for `H`
/// sums at once. Lane 0's value is `n2(0) + n2(1)` with `n_s(p) = n_2s(p) + n_2s(p + s)` and
/// `n32(p) = leaf(p)`: the sum of the even lanes' subtree and the odd lanes'
/// ([`butterfly_half_tree`]), so every addition is one of the butterfly's, with the same two
/// operands. The halves are a loop of two turns (a GPU thread keeps one half's values, and its
/// code holds one half written out).
#[inline(always)]
pub fn butterfly_tree<const H: usize>(leaf: impl Fn(u32) -> [f32; H]) -> [f32; H] {
    two_turns!(0, 1, |half| butterfly_half_tree(half, &|first, off| leaf(first + off)))
}

/// The butterfly's subtree of the 16 lanes `p = half (mod 2)`, `n2(half)` above, for `H` sums at
/// once: a loop of two turns of 8 leaves, each turn written out. Leaf `p` is asked for as
/// `leaf(first, off)`, `p = first + off`: the turn's first leaf (`half`, then `half + 2`) and an
/// offset that is a constant once inlined, so a GPU thread addresses each leaf of a turn at a
/// constant offset from the turn's addresses (given `p` alone, the compiler formed `first | off`
/// and an address computation a leaf and head).
/// The leaves come subtree by subtree (`n8(p) = (leaf(p) + leaf(p + 16)) + (leaf(p + 8) +
/// leaf(p + 24))` for `p = half, half + 4, half + 2, half + 6`), each added to its sibling as
/// soon as both are there. Two threads can each take one half of a sum: `even + odd` is the
/// butterfly's last addition, and as addition commutes both get its bits.
#[inline(always)]
pub fn butterfly_half_tree<const H: usize>(half: u32, leaf: &impl Fn(u32, u32) -> [f32; H]) -> [f32; H] {
    debug_assert!(half < 2);
    two_turns!(half, 2, |first| n4(first, leaf))
}

#[inline(always)]
fn n4<const H: usize>(first: u32, leaf: &impl Fn(u32, u32) -> [f32; H]) -> [f32; H] {
    add_each(n8(first, 0, leaf), n8(first, 4, leaf))
}

#[inline(always)]
fn n8<const H: usize>(first: u32, off: u32, leaf: &impl Fn(u32, u32) -> [f32; H]) -> [f32; H] {
    add_each(add_each(leaf(first, off), leaf(first, off + 16)), add_each(leaf(first, off + 8), leaf(first, off + 24)))
}

/// `a[i] + b[i]` for each `i`. An index loop: the optimizer unrolls it and keeps the arrays in
/// registers (an array's by-value iterator kept them in local memory on nvptx).
#[inline(always)]
#[allow(clippy::needless_range_loop)]
fn add_each<const H: usize>(mut a: [f32; H], b: [f32; H]) -> [f32; H] {
    for i in 0..H {
        a[i] += b[i];
    }
    a
}

/// A warp's reduction of `n` terms: lane `p`'s partial starts at +0.0 and takes `acc =
/// step(acc, j)` for `j = p, p + 32, ...` in turn, then the [`butterfly_sum`] of the 32
/// partials. [`lane_sum`] and [`lane_dot`] are its two steps.
fn lane_fold(n: usize, step: impl Fn(f32, usize) -> f32) -> f32 {
    let mut partials = [0.0f32; LANES];
    for (p, acc) in partials.iter_mut().enumerate() {
        for j in (p..n).step_by(LANES) {
            *acc = step(*acc, j);
        }
    }
    butterfly_sum(partials)
}

/// `f(0) + ... + f(n - 1)` as a warp sums it: lane `p` adds `f(p), f(p + 32), ...` left to
/// right from +0.0, then the [`butterfly_sum`] of the 32 partials.
pub fn lane_sum(n: usize, f: impl Fn(usize) -> f32) -> f32 {
    lane_fold(n, |acc, j| acc + f(j))
}

/// `a(0) * b(0) + ... + a(n - 1) * b(n - 1)` as a warp sums it with fused multiply-adds: lane
/// `p`'s partial takes `acc = fma(a(j), b(j), acc)` for `j = p, p + 32, ...` from +0.0, then
/// the [`butterfly_sum`] of the 32 partials.
pub fn lane_dot(n: usize, a: impl Fn(usize) -> f32, b: impl Fn(usize) -> f32) -> f32 {
    lane_fold(n, |acc, j| crate::math::fma(a(j), b(j), acc))
}

/// `f32(s) * 2^-k`, exact for `|s| < 2^24` and the shifts the formats use (0, 2, 3).
pub fn group_scale(s: i32, k: u32) -> f32 {
    s as f32 * f32::from_bits((127 - k) << 23)
}

/// Scale of one q8_1 group: `min(amax / 127, 65504)` before rounding to fp16.
pub fn q8_1_scale(amax: f32) -> f32 {
    (amax / 127.0).min(65504.0)
}

/// Quant of one value given the group's widened scale `df` (step 3 above). Returns the i32
/// that the GPU's `cvt.rni.s32.f32` plus the clamp gives.
pub fn q8_1_quant(x: f32, df: f32) -> i32 {
    if df == 0.0 {
        return 0;
    }
    // `as i32` saturates and maps NaN to 0, like cvt.rni.s32.f32.
    ((x / df).round_ties_even_core() as i32).clamp(-127, 127)
}

/// `round_ties_even` is a `std` method; `core` lacks it on stable, so spell it out: add and
/// subtract 2^23 (exact for |x| < 2^23 under the default round-to-nearest-even), which leaves
/// integral values as they are.
trait RoundTiesEven {
    fn round_ties_even_core(self) -> f32;
}

impl RoundTiesEven for f32 {
    fn round_ties_even_core(self) -> f32 {
        const TWO23: f32 = 8_388_608.0;
        let a = if self < 0.0 { -self } else { self };
        if !(a < TWO23) {
            return self; // already integral, infinite or NaN
        }
        let r = (a + TWO23) - TWO23;
        if self < 0.0 || (self == 0.0 && self.is_sign_negative()) {
            -r
        } else {
            r
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    extern crate std;

    #[test]
    fn round_ties_even_matches_std() {
        let mut s = 12345u64;
        let mut next = || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        };
        let specials = [0.5f32, 1.5, 2.5, -0.5, -2.5, 8388607.5, -8388607.5, 0.49999997, -0.0];
        for x in specials {
            assert_eq!(x.round_ties_even_core().to_bits(), std::primitive::f32::round_ties_even(x).to_bits(), "{x}");
        }
        for _ in 0..2_000_000 {
            let x = f32::from_bits(next() as u32);
            let (a, b) = (x.round_ties_even_core(), std::primitive::f32::round_ties_even(x));
            assert!(a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan()), "{x:e}");
        }
    }

    #[test]
    fn prob_key_orders_as_argmax_better() {
        // Probabilities as the router makes them (0, 1, ties, subnormals, neighbours), ids up to
        // the largest: the keys' order must be `argmax_better`'s, both ways, and round-trip.
        let mut s = 99u32;
        let mut next = move || {
            s = s.wrapping_mul(1664525).wrapping_add(1013904223);
            s
        };
        let fixed = [0.0f32, 1.0, f32::from_bits(1), f32::MIN_POSITIVE, 0.5, f32::from_bits(0x3f7f_ffff)];
        let draw = |kind: u32, r: u32| match kind % 3 {
            0 => fixed[(r % fixed.len() as u32) as usize],
            1 => f32::from_bits(r % 0x3f80_0001), // any bits in [+0, 1]
            _ => top_prob_term(-((r % 2000) as f32) * 0.01, 0.0),
        };
        for n in 0..200_000u32 {
            let (pa, pb) = (draw(n, next()), draw(n / 3, next()));
            let (ia, ib) = (next() % 512, if n % 5 == 0 { u32::MAX - 1 } else { next() % 512 });
            let (ka, kb) = (prob_key(pa, ia), prob_key(pb, ib));
            assert_eq!(ka > kb, argmax_better(pa, ia, pb, ib), "({pa:e}, {ia}) vs ({pb:e}, {ib})");
            assert_eq!(kb > ka, argmax_better(pb, ib, pa, ia), "({pb:e}, {ib}) vs ({pa:e}, {ia})");
            assert!(ka > 0 && prob_key_parts(ka) == (pa, ia));
        }
    }

    #[test]
    fn butterfly_matches_pairwise_tree_by_hand() {
        // With o = 16, 8, 4, 2, 1, lane 0 ends with ((((v0+v16)+(v8+v24))+...)): check against an
        // independently written recursive halving.
        fn halving(v: &[f32]) -> f32 {
            if v.len() == 1 {
                return v[0];
            }
            let h = v.len() / 2;
            let folded: std::vec::Vec<f32> = (0..h).map(|i| v[i] + v[i + h]).collect();
            halving(&folded)
        }
        let mut s = 7u32;
        for _ in 0..1000 {
            let mut v = [0f32; LANES];
            for x in v.iter_mut() {
                s = s.wrapping_mul(1664525).wrapping_add(1013904223);
                *x = (s as i32 as f32) * 1e-7;
            }
            assert_eq!(butterfly_sum(v).to_bits(), halving(&v).to_bits());
        }
    }

    #[test]
    fn butterfly_tree_is_the_butterfly() {
        // Several sums at once, each from partials of mixed signs and magnitudes (so that a
        // different addition order would round differently), against `butterfly_sum`.
        let mut s = 0x5eed_u32;
        let mut next = move || {
            s = s.wrapping_mul(1664525).wrapping_add(1013904223);
            s
        };
        for _ in 0..2000 {
            let mut v = [[0f32; LANES]; 3];
            for (k, row) in v.iter_mut().enumerate() {
                for x in row.iter_mut() {
                    let r = next();
                    *x = (r as i32 as f32) * f32::from_bits((100 + (r % 40) + 4 * k as u32) << 23);
                }
            }
            let leaf = |p: u32| [v[0][p as usize], v[1][p as usize], v[2][p as usize]];
            let tree = butterfly_tree(leaf);
            // Two threads' halves joined either way round (the attention's pairs of threads).
            let by_parts = |first, off| leaf(first + off);
            let (even, odd) = (butterfly_half_tree(0, &by_parts), butterfly_half_tree(1, &by_parts));
            for k in 0..3 {
                let want = butterfly_sum(v[k]).to_bits();
                assert_eq!(tree[k].to_bits(), want, "sum {k} of {:?}", v[k]);
                assert_eq!((even[k] + odd[k]).to_bits(), want, "halves of sum {k} of {:?}", v[k]);
                assert_eq!((odd[k] + even[k]).to_bits(), want, "halves of sum {k} of {:?}", v[k]);
            }
        }
    }
}
