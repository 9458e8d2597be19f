//! `router_topk`: the MoE router's softmax, top-k and renormalisation, one block of
//! `ROUTER_THREADS` per token. Spec: `strata_gpu_shared::replica::route`.
//!
//! Thread `i` holds experts `i, i + ROUTER_THREADS, ...` (`ROUTER_PER_THREAD` slots) and turns
//! each into its [`prob_key`], whose integer order is the spec's [`argmax_better`] order on
//! `(probability, id)`, into shared memory. An expert's selection slot is then its **rank**: how
//! many keys beat its own (a total order, so every expert has its own rank and the `k` of rank
//! below `k` are the spec's picks, slot by slot). Each thread counts that for its experts
//! against every key, 8 a turn, all threads at once; an expert of rank `r < k` writes pick `r`.
//! Warp 0 then adds the picks in slot order and stores them. (One warp taking the `k` picks one
//! after the other, each the warp's maximum key, with every lane's 16 slots and their softmax
//! terms in registers, was ~2,300 dependent instructions of one warp: 5.2 us a launch under ncu
//! on the H200 for 128 experts, k = 8.)
//!
//! A one-token window also gets its expert group table here (`table` not null): the `k` picks are
//! distinct valid experts, so `moe::group` makes each its own group, in increasing id; lane `r`
//! finds its pick's place among the others (`k` shuffles) and writes that group. The window's
//! `moe_group` launch is then not needed.
//!
//! [`argmax_better`]: strata_gpu_shared::order::argmax_better
use crate::arch::mem::Smem;
use crate::arch::{index, sync, warp};
use crate::kernels::head::ld_f32;
use crate::unroll;
use strata_gpu_shared::launch::route::{ROUTER_KEY_WORD, ROUTER_MAX_K, ROUTER_MAX_WORD, ROUTER_PER_THREAD, ROUTER_PICK_WORD, ROUTER_THREADS};
use strata_gpu_shared::moe;
use strata_gpu_shared::order::{prob_key, top_prob_term};

// The `unroll!` lists below name every slot of a thread and every warp of the block.
const _: () = assert!(ROUTER_PER_THREAD == 4 && ROUTER_THREADS == 128);

/// How many of the first `8 * turns` keys in shared memory beat each of the thread's `S` keys.
/// Keys past `n_expert` are 0, below every expert's.
///
/// Each of a turn's eight keys counts into a counter of its own, summed once at the end (integer
/// adds: any order gives the same rank): one counter a slot made every comparison wait on the
/// previous one's increment, a chain of 128 dependent steps a thread for 128 experts.
#[inline(always)]
unsafe fn ranks<const S: usize>(smem: Smem, key: &[u64; ROUTER_PER_THREAD], turns: u32) -> [u32; ROUTER_PER_THREAD] {
    let mut count = [[0u32; 8]; ROUTER_PER_THREAD];
    let mut i = 0;
    while i < turns {
        let at = ROUTER_KEY_WORD + 16 * i;
        let w = [smem.ld_v4(at), smem.ld_v4(at + 4), smem.ld_v4(at + 8), smem.ld_v4(at + 12)];
        unroll!(u in [0, 1, 2, 3, 4, 5, 6, 7] {
            let other = w[u / 2][2 * (u % 2)] as u64 | (w[u / 2][2 * (u % 2) + 1] as u64) << 32;
            unroll!(j in [0, 1, 2, 3] {
                if j < S {
                    count[j][u] += (other > key[j]) as u32;
                }
            });
        });
        i += 1;
    }
    count.map(|c| c.iter().sum())
}

crate::entry! {
    /// One block per token (blocks past `tokens`, from a padded grid, return at once).
    ///
    /// # Safety
    /// `logits`: `tokens * n_expert` f32 with `1 <= n_expert <= ROUTER_MAX_EXPERTS`;
    /// `ids`, `weights`: `tokens * k` with `1 <= k <= min(ROUTER_MAX_K, n_expert)`; `table`: null,
    /// or for `tokens == 1` the `moe::table_words(k)` u32 of the window's group table;
    /// `ROUTER_SMEM_WORDS` words of shared memory.
    pub unsafe fn router_topk(logits: *const f32, tokens: u32, n_expert: u32, k: u32, ids: *mut u32, weights: *mut f32, table: *mut u32) {
        crate::arch::sync::chain_grids();
        let t = index::block_idx();
        if t >= tokens {
            return; // the whole block
        }
        let (smem, tid, lane, w) = (Smem::dynamic(), index::thread_idx(), index::lane(), index::warp_in_block());
        let row = logits.add(t as usize * n_expert as usize);
        let expert = |j: usize| tid + ROUTER_THREADS * j as u32;
        let mut l = [0.0f32; ROUTER_PER_THREAD];
        let mut m = f32::NEG_INFINITY;
        unroll!(j in [0, 1, 2, 3] {
            if expert(j) < n_expert {
                l[j] = ld_f32(row, expert(j) as usize);
                m = m.max(l[j]);
            }
        });
        // The row's maximum (exact in any order): the warps' maxima folded.
        let m = warp::warp_max_f32(m);
        if lane == 0 {
            smem.st_u32(ROUTER_MAX_WORD + w, m.to_bits());
        }
        sync::sync_threads();
        crate::trace_mark!(1, "maxed");
        let mut m = f32::NEG_INFINITY;
        unroll!(x in [0, 1, 2, 3] {
            m = m.max(f32::from_bits(smem.ld_u32(ROUTER_MAX_WORD + x as u32)));
        });
        // Every slot's key into shared memory, 0 past `n_expert`.
        let mut key = [0u64; ROUTER_PER_THREAD];
        unroll!(j in [0, 1, 2, 3] {
            if expert(j) < n_expert {
                key[j] = prob_key(top_prob_term(l[j], m), expert(j));
            }
            smem.st_u32(ROUTER_KEY_WORD + 2 * expert(j), key[j] as u32);
            smem.st_u32(ROUTER_KEY_WORD + 2 * expert(j) + 1, (key[j] >> 32) as u32);
        });
        sync::sync_threads();
        crate::trace_mark!(2, "keyed");
        let slots = n_expert.saturating_sub(tid).div_ceil(ROUTER_THREADS);
        let turns = n_expert.div_ceil(8);
        let rank = match slots {
            0 => [u32::MAX; ROUTER_PER_THREAD],
            1 => ranks::<1>(smem, &key, turns),
            2 => ranks::<2>(smem, &key, turns),
            3 => ranks::<3>(smem, &key, turns),
            _ => ranks::<4>(smem, &key, turns),
        };
        unroll!(j in [0, 1, 2, 3] {
            if (j as u32) < slots && rank[j] < k {
                smem.st_u32(ROUTER_PICK_WORD + rank[j], (key[j] >> 32) as u32);
                smem.st_u32(ROUTER_PICK_WORD + ROUTER_MAX_K as u32 + rank[j], expert(j));
            }
        });
        sync::sync_threads();
        crate::trace_mark!(3, "ranked");
        if w != 0 {
            return;
        }
        // Warp 0: the picks' sum in slot order (every lane), lane `r` stores pick `r`.
        let pick = |r: u32| (f32::from_bits(smem.ld_u32(ROUTER_PICK_WORD + r)), smem.ld_u32(ROUTER_PICK_WORD + ROUTER_MAX_K as u32 + r));
        // Every pick's probability loaded before the first add (the loop over a runtime `k` made
        // each load wait on the add before it), then added in slot order.
        let probs: [f32; ROUTER_MAX_K] = core::array::from_fn(|r| if (r as u32) < k { pick(r as u32).0 } else { 0.0 });
        let mut sum = 0.0f32;
        for (r, p) in probs.into_iter().enumerate() {
            if (r as u32) < k {
                sum += p;
            }
        }
        let mine = if lane < k { pick(lane) } else { (0.0, 0) };
        if lane < k {
            let at = t as usize * k as usize + lane as usize;
            *ids.add(at) = mine.1;
            *weights.add(at) = if sum == 0.0 { 0.0 } else { mine.0 / sum };
        }
        if !table.is_null() {
            one_token_table(mine.1, k, table);
        }
    }
}

/// The group table `moe::group` builds for one token's `k` picks, lane `r < k` holding pick `r`
/// (distinct ids below `n_expert`): `k` groups of one entry in increasing id, no errors. Lane
/// `r`'s group is its rank among the picks. The whole warp calls it, converged.
#[inline(always)]
unsafe fn one_token_table(id: u32, k: u32, table: *mut u32) {
    let (lane, n) = (index::lane(), k as usize);
    // Every lane's id shuffled before the counting (`k <= ROUTER_MAX_K`): a loop over a runtime `k`
    // made each shuffle wait on the count before it.
    let ids: [u32; ROUTER_MAX_K] = core::array::from_fn(|r| warp::shfl_u32(id, r as u32));
    let mut rank = 0u32;
    for (r, other) in ids.into_iter().enumerate() {
        rank += ((r as u32) < k && other < id) as u32;
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
