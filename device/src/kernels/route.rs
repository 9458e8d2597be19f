//! `router_topk`: the MoE router's softmax, top-k and renormalisation, one warp per token,
//! `ROUTER_WARPS` tokens per block. Spec: `strata_gpu_shared::replica::route`.
//!
//! Lane `l` holds experts `l, l + 32, ...` (`ROUTER_PER_LANE` slots, in registers). Each of the
//! `k` passes takes the warp's best expert strictly worse than the previous pick (lane-local
//! scan, then the head's warp argmax); every lane sees the same pick, so every lane adds it to
//! the sum in slot order, and lane `r` keeps pick `r` for the store.
use crate::arch::{index, warp};
use crate::kernels::head::{keep_better, ld_f32, warp_best, NONE};
use crate::unroll;
use strata_gpu_shared::launch::route::{ROUTER_PER_LANE, ROUTER_WARPS};
use strata_gpu_shared::order::{argmax_better, top_prob_term};
use strata_gpu_shared::replica::route::FIRST;

// The `unroll!` lists below name every slot.
const _: () = assert!(ROUTER_PER_LANE == 16);

/// One warp per token (warps past `tokens`, from a padded grid, return at once).
///
/// # Safety
/// `logits`: `tokens * n_expert` f32 with `1 <= n_expert <= ROUTER_MAX_EXPERTS`;
/// `ids`, `weights`: `tokens * k` with `1 <= k <= min(ROUTER_MAX_K, n_expert)`.
#[no_mangle]
pub unsafe extern "ptx-kernel" fn router_topk(logits: *const f32, tokens: u32, n_expert: u32, k: u32, ids: *mut u32, weights: *mut f32) {
    crate::arch::sync::chain_grids();
    let t = index::block_idx() * ROUTER_WARPS + index::warp_in_block();
    if t >= tokens {
        return; // the whole warp
    }
    let row = logits.add(t as usize * n_expert as usize);
    let lane = index::lane();
    let expert = |i: usize| lane + 32 * i as u32;
    let mut p = [f32::NAN; ROUTER_PER_LANE];
    let mut m = f32::NEG_INFINITY;
    unroll!(i in [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15] {
        if expert(i) < n_expert {
            p[i] = ld_f32(row, expert(i) as usize);
            m = m.max(p[i]);
        }
    });
    let m = warp::warp_max_f32(m);
    unroll!(i in [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15] {
        p[i] = top_prob_term(p[i], m);
    });
    let (mut prev, mut mine, mut sum) = (FIRST, (0.0f32, 0u32), 0.0f32);
    let mut r = 0;
    while r < k {
        let mut best = (-1.0f32, NONE); // loses to every expert
        unroll!(i in [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15] {
            if expert(i) < n_expert && argmax_better(prev.0, prev.1, p[i], expert(i)) {
                keep_better(&mut best, p[i], expert(i));
            }
        });
        best = warp_best(best);
        if lane == r {
            mine = best;
        }
        sum += best.0;
        prev = best;
        r += 1;
    }
    if lane < k {
        let at = t as usize * k as usize + lane as usize;
        *ids.add(at) = mine.1;
        *weights.add(at) = if sum == 0.0 { 0.0 } else { mine.0 / sum };
    }
}
