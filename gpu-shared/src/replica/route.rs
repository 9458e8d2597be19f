//! `router_topk`: the MoE router after the router matvec (llama.cpp's softmax, top-k by
//! probability, selected weights divided by their sum), for one token's row of `n_expert`
//! logits and `k` selections.
//!
//! 1. `m` = maxNum of the row (NaN ignored; exact in any order).
//! 2. `p_i` = [`top_prob_term`]`(l_i, m)`: 0 for a NaN logit, 1 where `l_i == m`, else
//!    [`crate::math::exp_neg`]`(l_i - m)`. For finite logits this is `exp_neg(l_i - m)`; the
//!    `== m` rule gives a `+inf` logit probability 1 (not `exp_neg(inf - inf)` = 0) and a row of
//!    `-inf` equal probabilities, the limits of the softmax. Every `p_i` is in `[0, 1]`.
//! 3. Selection `r = 0..k` takes the best expert not yet taken, under [`argmax_better`] on
//!    `(p_i, i)`: larger `p` wins, equal `p` goes to the lower id. That is a total order, so the
//!    picks are unique; slot `r` is the best expert strictly worse than slot `r - 1`'s (slot 0
//!    is compared against [`FIRST`], which every expert is worse than).
//! 4. `sum` = the left-to-right sum from +0.0 of the `k` picked `p` in slot order;
//!    `weights[r] = p_r / sum` (IEEE division). The softmax denominator `sum_i p_i` is not
//!    computed: it cancels in this renormalisation (`(p_r / D) / sum_s (p_s / D)`), so the
//!    weights are llama.cpp's up to rounding. An all-NaN row has `sum == 0` and gets weights
//!    +0.0 (0/0's NaN bits differ between CPUs and GPUs), with ids `0..k`.
use crate::order::{argmax_better, top_prob_term};

/// The "previous pick" before slot 0: `(+inf, 0)` beats every `(p, i)` with `p <= 1`.
pub const FIRST: (f32, u32) = (f32::INFINITY, 0);

/// Routes one token: `ids.len() == weights.len() == k`, `1 <= k <= logits.len()`.
pub fn route_token(logits: &[f32], ids: &mut [u32], weights: &mut [f32]) {
    let m = logits.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
    let mut prev = FIRST;
    let mut sum = 0.0f32;
    for (id, w) in ids.iter_mut().zip(weights.iter_mut()) {
        let mut best = (-1.0f32, u32::MAX); // loses to every expert
        for (i, &l) in logits.iter().enumerate() {
            let (p, i) = (top_prob_term(l, m), i as u32);
            if argmax_better(prev.0, prev.1, p, i) && argmax_better(p, i, best.0, best.1) {
                best = (p, i);
            }
        }
        (*id, *w) = (best.1, best.0);
        sum += best.0;
        prev = best;
    }
    for w in weights.iter_mut() {
        *w = if sum == 0.0 { 0.0 } else { *w / sum };
    }
}

/// Routes `logits.len() / n_expert` tokens; `ids` and `weights` hold `k` per token.
pub fn router_topk(logits: &[f32], n_expert: usize, k: usize, ids: &mut [u32], weights: &mut [f32]) {
    for ((row, id), w) in logits.chunks_exact(n_expert).zip(ids.chunks_exact_mut(k)).zip(weights.chunks_exact_mut(k)) {
        route_token(row, id, w);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ties_go_to_the_lower_id_and_weights_renormalise() {
        let (mut ids, mut w) = ([0u32; 3], [0f32; 3]);
        route_token(&[1.0, 3.0, 2.0, 3.0, f32::NAN], &mut ids, &mut w);
        assert_eq!(ids, [1, 3, 2]);
        assert_eq!(w[0], w[1]);
        let p2 = crate::math::exp_neg(-1.0);
        let sum = (1.0f32 + 1.0) + p2;
        assert_eq!(w, [1.0 / sum, 1.0 / sum, p2 / sum]);
    }

    #[test]
    fn infinities_and_nan_rows_are_defined() {
        let (mut ids, mut w) = ([0u32; 2], [0f32; 2]);
        route_token(&[0.0, f32::INFINITY, 5.0], &mut ids, &mut w);
        assert_eq!((ids, w), ([1, 0], [1.0, 0.0]));
        route_token(&[f32::NEG_INFINITY; 4], &mut ids, &mut w);
        assert_eq!((ids, w), ([0, 1], [0.5, 0.5]));
        route_token(&[f32::NAN; 4], &mut ids, &mut w);
        assert_eq!((ids, w.map(f32::to_bits)), ([0, 1], [0, 0]));
    }
}
