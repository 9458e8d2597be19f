//! `sample_rows`: one token drawn per row of `n` logits under top-k, top-p and temperature
//! (temperature 0, greedy, is the host's `argmax_rows` instead).
//!
//! 1. The random number of row `t` depends only on the seed and its position
//!    `pos = pos0 + t` ([`uniform`]: splitmix64 of `seed + (pos + 1) * 0x9E3779B97F4A7C15`, top 24
//!    bits times 2^-24, so `u` is exact and in `[0, 1)`). A token's draw is therefore the same
//!    whatever window or row it is computed in (speculative decoding redraws it).
//! 2. Candidates: the `K = min(top_k, n)` best elements under [`argmax_better`] (larger wins, NaN
//!    never beats a number, ties to the lower index), in rank order: rank `r` is the best element
//!    strictly worse than rank `r - 1` (a total order, so the ranks are unique; an element is
//!    compared by `(value, index)`).
//! 3. `l_0` = rank 0's value; `p_r = exp_neg((l_r - l_0) * inv_temp)` (the difference rounded,
//!    the product rounded, then [`exp_neg`]; NaN and `-inf` candidates get 0).
//! 4. `cum_r` = the left-to-right sums from +0.0 of `p_0 ..= p_r`.
//! 5. `n_keep` = the smallest `n >= 1` with `cum_{n-1} >= top_p * cum_{K-1}` (one multiply).
//!    `top_p = 1` keeps every candidate up to the last one that adds to the sum; the ones after
//!    it can never be drawn anyway.
//! 6. `target = u * cum_{n_keep-1}`; the drawn rank is the first `r < n_keep` with
//!    `cum_r > target`, else `n_keep - 1` (only when the sums are 0 or `u * cum` rounds up to
//!    `cum`). The row's output is that candidate's index.
//!
//! Every row has a defined draw: a row whose rank 0 is `+inf`, `-inf` or NaN has all `p_r = 0`
//! and draws rank 0, its argmax.
use crate::launch::route::SAMPLE_MAX_K;
use crate::math::exp_neg;
use crate::order::argmax_better;

/// splitmix64's output for the state `seed + (pos + 1) * golden`: the `pos`-th output (from 0)
/// of the sequential generator started at `seed`.
pub fn splitmix64(seed: u64, pos: u64) -> u64 {
    let mut z = seed.wrapping_add(pos.wrapping_add(1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The uniform number of position `pos`: the top 24 bits of [`splitmix64`] times 2^-24.
pub fn uniform(seed: u64, pos: u64) -> f32 {
    (splitmix64(seed, pos) >> 40) as f32 * f32::from_bits((127 - 24) << 23)
}

/// Steps 3-6 on the candidates' values in rank order (`1 <= vals.len()`), which are replaced by
/// the cumulative sums; returns the drawn rank.
pub fn draw_rank(vals: &mut [f32], top_p: f32, inv_temp: f32, u: f32) -> usize {
    let l0 = vals[0];
    let mut cum = 0.0f32;
    for v in vals.iter_mut() {
        cum += exp_neg((*v - l0) * inv_temp);
        *v = cum;
    }
    let threshold = top_p * cum;
    let keep = (1..=vals.len()).find(|&n| vals[n - 1] >= threshold).unwrap_or(vals.len());
    let target = u * vals[keep - 1];
    (0..keep).find(|&r| vals[r] > target).unwrap_or(keep - 1)
}

/// The drawn index of one row (`1 <= top_k <= SAMPLE_MAX_K`, `row` not empty).
pub fn sample_row(row: &[f32], top_k: usize, top_p: f32, inv_temp: f32, u: f32) -> u32 {
    let kk = top_k.min(row.len());
    let (mut idx, mut val) = ([0u32; SAMPLE_MAX_K], [0f32; SAMPLE_MAX_K]);
    for r in 0..kk {
        let mut best = (f32::NAN, u32::MAX); // loses to every element
        for (j, &v) in row.iter().enumerate() {
            let j = j as u32;
            let eligible = r == 0 || argmax_better(val[r - 1], idx[r - 1], v, j);
            if eligible && argmax_better(v, j, best.0, best.1) {
                best = (v, j);
            }
        }
        (val[r], idx[r]) = best;
    }
    idx[draw_rank(&mut val[..kk], top_p, inv_temp, u)]
}

/// Draws `ids[t]` for each row `t` of `logits` (rows of `n`), at position `pos0 + t`.
#[allow(clippy::too_many_arguments)]
pub fn sample_rows(logits: &[f32], n: usize, top_k: usize, top_p: f32, inv_temp: f32, seed: u64, pos0: u64, ids: &mut [u32]) {
    for (t, (row, id)) in logits.chunks_exact(n).zip(ids.iter_mut()).enumerate() {
        *id = sample_row(row, top_k, top_p, inv_temp, uniform(seed, pos0 + t as u64));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splitmix64_is_the_published_sequence() {
        // The first outputs of splitmix64 seeded with 0 (Vigna's reference implementation).
        assert_eq!(splitmix64(0, 0), 0xE220_A839_7B1D_CDAF);
        assert_eq!(splitmix64(0, 1), 0x6E78_9E6A_A1B9_65F4);
        assert_eq!(splitmix64(0, 2), 0x06C4_5D18_8009_454F);
        assert_eq!(uniform(0, 0), (0xE220_A8u32 as f64 / 16_777_216.0) as f32);
    }

    #[test]
    fn draw_follows_the_cumulative_sums() {
        // p = 1, 1, e^-1 (two tied leaders); the sums 1, 2, 2.37.
        let vals = [3.0f32, 3.0, 2.0];
        let draw = |u: f32, top_p: f32| draw_rank(&mut vals.clone(), top_p, 1.0, u);
        assert_eq!(draw(0.0, 1.0), 0);
        assert_eq!(draw(0.5, 1.0), 1); // target 1.18: the first sum above is 2
        assert_eq!(draw(0.99, 1.0), 2);
        assert_eq!(draw(0.99, 0.5), 1); // keep 2: threshold 1.18, the first sum reaching it is 2
        assert_eq!(draw(0.99, 0.4), 0); // keep 1: threshold 0.95 <= 1
    }
}
