//! `router_topk`: the MoE router's softmax, top-k and renormalisation, one block of
//! `ROUTER_THREADS` per token. Spec: `strata_gpu_shared::replica::route`.
//!
//! Thread `i` holds expert `i` and turns it into its [`prob_key`], whose integer order is the
//! spec's [`argmax_better`] order on `(probability, id)`, into shared memory. An expert's
//! selection slot is then its **rank**: how many keys beat its own (a total order, so every
//! expert has its own rank and the `k` of rank below `k` are the spec's picks, slot by slot).
//! The block's `ROUTER_PARTS` parts count that over a range of the keys each: ranker `h` of a
//! part takes experts `h, h + ROUTER_RANKERS, ...`, 8 keys a turn; each expert's counts are then
//! added (integers: any order gives the same rank) and an expert of rank `r < k` writes pick `r`.
//! Warp 0 then adds the picks in slot order and stores them. (One warp taking the `k` picks one
//! after the other, each the warp's maximum key, was ~2,300 dependent instructions of one warp:
//! 5.2 us a launch under ncu on the H200 for 128 experts, k = 8. A block of 128 threads, each
//! counting against every key, had one warp a scheduler to hide its latencies: 1.03 us of
//! ranking on an H100, against 0.85 with the parts.)
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
use strata_gpu_shared::launch::route::{ROUTER_COUNT_WORD, ROUTER_KEY_WORD, ROUTER_MAX_EXPERTS, ROUTER_MAX_K, ROUTER_MAX_WORD, ROUTER_PARTS, ROUTER_PER_RANKER, ROUTER_PICK_WORD, ROUTER_RANKERS, ROUTER_THREADS};
use strata_gpu_shared::moe;
use strata_gpu_shared::order::{prob_key, top_prob_term};

// The `unroll!` lists below name every slot of a ranker, every part, and every 16-byte word of
// the maxima.
const _: () = assert!(ROUTER_PER_RANKER == 4 && ROUTER_PARTS == 4 && ROUTER_THREADS == 512);

/// The key of expert `e` in shared memory.
#[inline(always)]
unsafe fn smem_key(smem: Smem, e: u32) -> u64 {
    smem.ld_u32(ROUTER_KEY_WORD + 2 * e) as u64 | (smem.ld_u32(ROUTER_KEY_WORD + 2 * e + 1) as u64) << 32
}

/// How many of the keys of turns `from..to` (8 keys a turn) in shared memory beat each of
/// ranker `h`'s `S` experts `h, h + ROUTER_RANKERS, ...`. Keys past `n_expert` are 0, below
/// every expert's.
///
/// It counts the keys that do not beat `key`, by the sign of `other + !key` = `other - key - 1`
/// (mod 2^64): every key is below 2^63 (a probability's bits, at most 1.0's `0x3f80_0000`,
/// above 32 bits of id), so that difference is a 64-bit two's complement number, negative
/// exactly when `other <= key`. With `!key` taken once, a key costs an add pair and an add of
/// the sign, where the comparison took a compare pair, an add and a select. Each of a turn's
/// eight keys counts into a counter of its own, summed once at the end (integer adds: any order
/// gives the same count), so the adds are not one chain.
#[inline(always)]
unsafe fn ranks<const S: usize>(smem: Smem, h: u32, from: u32, to: u32) -> [u32; ROUTER_PER_RANKER] {
    let not_key: [u64; ROUTER_PER_RANKER] = core::array::from_fn(|j| if j < S { !smem_key(smem, h + ROUTER_RANKERS * j as u32) } else { 0 });
    let mut below = [[0u32; 8]; ROUTER_PER_RANKER];
    let mut i = from;
    while i < to {
        let at = ROUTER_KEY_WORD + 16 * i;
        let w = [smem.ld_v4(at), smem.ld_v4(at + 4), smem.ld_v4(at + 8), smem.ld_v4(at + 12)];
        unroll!(u in [0, 1, 2, 3, 4, 5, 6, 7] {
            let other = w[u / 2][2 * (u % 2)] as u64 | (w[u / 2][2 * (u % 2) + 1] as u64) << 32;
            unroll!(j in [0, 1, 2, 3] {
                if j < S {
                    below[j][u] += (other.wrapping_add(not_key[j]) >> 63) as u32;
                }
            });
        });
        i += 1;
    }
    below.map(|c| 8 * to.saturating_sub(from) - c.iter().sum::<u32>())
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
        let held = tid < n_expert;
        let l = if held { ld_f32(row, tid as usize) } else { f32::NEG_INFINITY };
        // The row's maximum (maxNum: NaN ignored; exact in any order): the warps' maxima folded.
        let m = warp::warp_max_f32(f32::NEG_INFINITY.max(l));
        if lane == 0 {
            smem.st_u32(ROUTER_MAX_WORD + w, m.to_bits());
        }
        sync::sync_threads();
        crate::trace_mark!(1, "maxed");
        let mut m = f32::NEG_INFINITY;
        unroll!(x in [0, 1, 2, 3] {
            let v = smem.ld_v4(ROUTER_MAX_WORD + 4 * x as u32);
            unroll!(y in [0, 1, 2, 3] {
                m = m.max(f32::from_bits(v[y]));
            });
        });
        // Every expert's key into shared memory, 0 past `n_expert`.
        let key = if held { prob_key(top_prob_term(l, m), tid) } else { 0 };
        smem.st_u32(ROUTER_KEY_WORD + 2 * tid, key as u32);
        smem.st_u32(ROUTER_KEY_WORD + 2 * tid + 1, (key >> 32) as u32);
        sync::sync_threads();
        crate::trace_mark!(2, "keyed");
        // Ranker `h` of part `q` (a warp's threads share `q`): its experts' counts over the
        // part's turns, into shared memory.
        let (h, q) = (tid % ROUTER_RANKERS, tid / ROUTER_RANKERS);
        let turns = n_expert.div_ceil(8);
        let per_part = turns.div_ceil(ROUTER_PARTS);
        let (from, to) = (q * per_part, turns.min((q + 1) * per_part));
        let slots = n_expert.saturating_sub(h).div_ceil(ROUTER_RANKERS);
        let count = match slots {
            0 => [0; ROUTER_PER_RANKER],
            1 => ranks::<1>(smem, h, from, to),
            2 => ranks::<2>(smem, h, from, to),
            3 => ranks::<3>(smem, h, from, to),
            _ => ranks::<4>(smem, h, from, to),
        };
        let part = ROUTER_COUNT_WORD + q * ROUTER_MAX_EXPERTS as u32;
        unroll!(j in [0, 1, 2, 3] {
            if (j as u32) < slots {
                smem.st_u32(part + h + ROUTER_RANKERS * j as u32, count[j]);
            }
        });
        sync::sync_threads();
        // Each expert's rank: its parts' counts added.
        if held {
            let mut rank = 0u32;
            unroll!(p in [0, 1, 2, 3] {
                rank += smem.ld_u32(ROUTER_COUNT_WORD + p as u32 * ROUTER_MAX_EXPERTS as u32 + tid);
            });
            if rank < k {
                smem.st_u32(ROUTER_PICK_WORD + rank, (key >> 32) as u32);
                smem.st_u32(ROUTER_PICK_WORD + ROUTER_MAX_K as u32 + rank, tid);
            }
        }
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
