//! `router_topk`: the MoE router's softmax, top-k and renormalisation, one warp per token,
//! `ROUTER_WARPS` tokens per block. Spec: `strata_gpu_shared::replica::route`.
//!
//! Lane `l` holds experts `l, l + 32, ...` (`ROUTER_PER_LANE` slots, in registers) as
//! [`prob_key`]s, whose integer order is the spec's [`argmax_better`] order on
//! `(probability, id)`, and keeps the best of its slots. Each of the `k` passes takes the warp's
//! maximum key (two `redux.sync`), which is the best expert not yet taken: the spec's pick. The
//! lane that held it clears that slot and finds its next best; every lane adds the pick to the
//! sum in slot order, and lane `r` keeps pick `r` for the store. (The spec's scan of every expert
//! against the previous pick, done per pass, kept one warp busy for ~2,600 dependent
//! instructions: 10.8 us a launch on the H200.)
//!
//! A one-token window also gets its expert group table here (`table` not null): the `k` picks are
//! distinct valid experts, so `moe::group` makes each its own group, in increasing id; lane `r`
//! finds its pick's place among the others (`k` shuffles) and writes that group. The window's
//! `moe_group` launch is then not needed.
//!
//! [`argmax_better`]: strata_gpu_shared::order::argmax_better
use crate::arch::{index, warp};
use crate::kernels::head::ld_f32;
use crate::unroll;
use strata_gpu_shared::launch::route::{ROUTER_PER_LANE, ROUTER_WARPS};
use strata_gpu_shared::moe;
use strata_gpu_shared::order::{prob_key, prob_key_parts, top_prob_term};

// The `unroll!` lists below name every slot.
const _: () = assert!(ROUTER_PER_LANE == 16);

/// The best of a lane's keys (0 when it holds none), as a tree of pairwise maxima: four dependent
/// steps where a running maximum took fifteen, on the path every pick of the `k` passes waits on.
#[inline(always)]
fn lane_best(key: &[u64; ROUTER_PER_LANE]) -> u64 {
    let mut m = *key;
    let mut half = ROUTER_PER_LANE / 2;
    while half > 0 {
        for i in 0..half {
            m[i] = m[i].max(m[i + half]);
        }
        half /= 2;
    }
    m[0]
}

/// One warp per token (warps past `tokens`, from a padded grid, return at once).
///
/// # Safety
/// `logits`: `tokens * n_expert` f32 with `1 <= n_expert <= ROUTER_MAX_EXPERTS`;
/// `ids`, `weights`: `tokens * k` with `1 <= k <= min(ROUTER_MAX_K, n_expert)`; `table`: null,
/// or for `tokens == 1` the `moe::table_words(k)` u32 of the window's group table.
#[no_mangle]
pub unsafe extern "ptx-kernel" fn router_topk(logits: *const f32, tokens: u32, n_expert: u32, k: u32, ids: *mut u32, weights: *mut f32, table: *mut u32) {
    crate::arch::sync::chain_grids();
    let t = index::block_idx() * ROUTER_WARPS + index::warp_in_block();
    if t >= tokens {
        return; // the whole warp
    }
    let row = logits.add(t as usize * n_expert as usize);
    let lane = index::lane();
    let expert = |i: usize| lane + 32 * i as u32;
    let mut l = [0.0f32; ROUTER_PER_LANE];
    let mut m = f32::NEG_INFINITY;
    unroll!(i in [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15] {
        if expert(i) < n_expert {
            l[i] = ld_f32(row, expert(i) as usize);
            m = m.max(l[i]);
        }
    });
    let m = warp::warp_max_f32(m);
    // Slots past `n_expert` keep key 0, below every expert's.
    let mut key = [0u64; ROUTER_PER_LANE];
    unroll!(i in [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15] {
        if expert(i) < n_expert {
            key[i] = prob_key(top_prob_term(l[i], m), expert(i));
        }
    });
    let mut best = lane_best(&key);
    let (mut mine, mut sum) = ((0.0f32, 0u32), 0.0f32);
    let mut r = 0;
    while r < k {
        let (p, id) = prob_key_parts(warp::warp_max_u64(best));
        if lane == r {
            mine = (p, id);
        }
        sum += p;
        if id % 32 == lane {
            let slot = (id / 32) as usize;
            unroll!(i in [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15] {
                if i == slot {
                    key[i] = 0;
                }
            });
            best = lane_best(&key);
        }
        r += 1;
    }
    if lane < k {
        let at = t as usize * k as usize + lane as usize;
        *ids.add(at) = mine.1;
        *weights.add(at) = if sum == 0.0 { 0.0 } else { mine.0 / sum };
    }
    if !table.is_null() {
        one_token_table(mine.1, k, table);
    }
}

/// The group table `moe::group` builds for one token's `k` picks, lane `r < k` holding pick `r`
/// (distinct ids below `n_expert`): `k` groups of one entry in increasing id, no errors. Lane
/// `r`'s group is its rank among the picks. The whole warp calls it, converged.
#[inline(always)]
unsafe fn one_token_table(id: u32, k: u32, table: *mut u32) {
    let (lane, n) = (index::lane(), k as usize);
    let mut rank = 0u32;
    let mut r = 0;
    while r < k {
        rank += (warp::shfl_u32(id, r) < id) as u32;
        r += 1;
    }
    if lane < k {
        let g = rank as usize;
        *table.add(moe::EXPERT + g) = id;
        *table.add(moe::start(n) + g) = rank;
        *table.add(moe::count(n) + g) = 1;
        *table.add(moe::entries(n) + g) = lane;
    }
    if lane == 0 {
        *table.add(moe::N_GROUPS) = k;
        *table.add(moe::ERRORS) = 0;
    }
}
