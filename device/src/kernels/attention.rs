//! Attention of the decode step over a window of tokens at absolute positions `pos0 ..`, where
//! `pos0` is read from device memory (`*pos`) so that a captured launch serves every step:
//! `attn_prep` (per-head RMSNorm + RoPE of q and k, k and v appended to the fp16 cache),
//! `attn_chunk` (blocks per token and band of one KV group's query heads, walking
//! `ATTN_CHUNK`-key chunks: each head's max, softmax sum and weighted values per chunk) and `attn_merge` (one block per token and query head:
//! the chunks combined). Chunks start at absolute multiples of `ATTN_CHUNK` and every sum runs
//! in position order, so a token's result does not depend on its window. Spec:
//! `strata_gpu_shared::replica::attention` (module doc).
use crate::arch::mem::Smem;
use super::quantize_q8_1::quantize_group;
use crate::arch::{convert, index, int, mem, sync, warp};
use strata_gpu_shared::formats::{q8_1, GROUP};
use strata_gpu_shared::launch::attention::{attn_key_stage, ATTN_CHUNK, ATTN_CHUNK_SMEM_WORDS, ATTN_STAGE_WORDS, ATTN_MAX_BAND, ATTN_MAX_HD, ATTN_Q_WORDS, ATTN_PREP_WARPS, ATTN_SET_HEADS, ATTN_THREADS};
use strata_gpu_shared::order;

// The unrolled lists below name every head of a band and of a thread's set.
const _: () = assert!(ATTN_MAX_BAND == 8 && ATTN_SET_HEADS == 4);
use strata_gpu_shared::math::exp_neg;

const WARPS: u32 = ATTN_THREADS / 32;
/// Stages of a chunk whose rows `attn_chunk` asks L2 for ahead of their copies.
const STAGES_ASKED: u32 = 3;
/// Value rows a thread of `attn_chunk_one` loads before adding their terms.
const ATTN_V_AHEAD: u32 = 8;
/// Chunks' values a thread of `attn_merge` loads before folding them, one chunk a lane for
/// their maxima and sums (a warp's 32; the unrolled lists name 32).
const MERGE_AHEAD: u32 = 32;
const _: () = assert!(MERGE_AHEAD == crate::arch::WARP, "a lane a chunk of each turn");
/// Chunks' maxima a lane of `attn_merge` loads before folding them: a warp takes `32 *` that
/// many chunks a memory latency (the unrolled list names 8).
const MERGE_MAX_AHEAD: u32 = 8;
/// Values of a head row a lane holds, `d = lane + 32 i` for `i < LANE_VALUES`: every `hd` up to
/// `ATTN_MAX_HD` in one round of loads.
const LANE_VALUES: usize = ATTN_MAX_HD / 32;
const _: () = assert!(LANE_VALUES == 8, "the unrolled lists of attn_prep name 8 values");

/// The value output `d` of a head row is roped with (NEOX pairing, `half = n_rot / 2`) and the
/// index of their (cos, sin) pair: `d + half` and `d` below `half`, `d - half` twice up to
/// `n_rot`; `d` itself (and pair 0, unused) past the rotated values.
#[inline(always)]
fn rope_partner(d: u32, half: u32, n_rot: u32) -> (u32, u32) {
    if d < half {
        (d + half, d)
    } else if d < n_rot {
        (d - half, d - half)
    } else {
        (d, 0)
    }
}

/// Output `d` of a normed head row after RoPE (the spec's expressions, each product rounded):
/// `y` and `y_partner` its value and its partner's after the norm, `(c, s)` their pair.
#[inline(always)]
fn roped(d: u32, half: u32, n_rot: u32, y: f32, y_partner: f32, (c, s): (f32, f32)) -> f32 {
    if d < half {
        y * c - y_partner * s
    } else if d < n_rot {
        y_partner * s + y * c
    } else {
        y
    }
}

/// `f(i, d)` for each value `d = lane + 32 i` of a head row of `hd` values that the lane holds
/// (`i < LANE_VALUES`, `d < hd`), in order of `i`: the one place the lane's share is stated.
#[inline(always)]
fn lane_values(hd: u32, mut f: impl FnMut(usize, u32)) {
    let lane = index::lane();
    crate::unroll!(i in [0, 1, 2, 3, 4, 5, 6, 7] {
        let d = lane + 32 * i as u32;
        if d < hd {
            f(i, d);
        }
    });
}

/// A lane's constants of one normed head row at one position: the norm weights of its values
/// and of their RoPE partners, and their (cos, sin) pairs (zeros where unused). They depend on
/// no launch before, so kernels load them before their grid wait.
#[derive(Clone, Copy)]
struct RowConsts {
    w: [f32; LANE_VALUES],
    w_partner: [f32; LANE_VALUES],
    pair: [(f32, f32); LANE_VALUES],
}

impl RowConsts {
    const NONE: RowConsts = RowConsts { w: [0.0; LANE_VALUES], w_partner: [0.0; LANE_VALUES], pair: [(0.0, 0.0); LANE_VALUES] };

    /// The constants of a row normed by `norm` (`hd` f32) and roped at the position whose
    /// `n_rot` table values start at `pos_rope`.
    ///
    /// # Safety
    /// `norm` holds `hd` f32 and `pos_rope` `n_rot`; `n_rot` even and at most `hd`.
    #[inline(always)]
    unsafe fn load(norm: *const f32, pos_rope: *const f32, hd: u32, n_rot: u32) -> RowConsts {
        let mut c = RowConsts::NONE;
        lane_values(hd, |i, d| {
            let (p, at) = rope_partner(d, n_rot / 2, n_rot);
            c.w[i] = mem::ld_nc_f32(norm, d as usize);
            if d < n_rot {
                c.w_partner[i] = mem::ld_nc_f32(norm, p as usize);
                c.pair[i] = (mem::ld_nc_f32(pos_rope, 2 * at as usize), mem::ld_nc_f32(pos_rope, 2 * at as usize + 1));
            }
        });
        c
    }
}

/// A lane's values of the head row at `src` and, where `normed`, their RoPE partners, in one
/// round of loads (zeros where unused).
///
/// # Safety
/// `src` holds `hd` f32; `n_rot` at most `hd`.
#[inline(always)]
unsafe fn load_row(src: *const f32, hd: u32, n_rot: u32, normed: bool) -> ([f32; LANE_VALUES], [f32; LANE_VALUES]) {
    let (mut x, mut x_partner) = ([0.0f32; LANE_VALUES], [0.0f32; LANE_VALUES]);
    lane_values(hd, |i, d| {
        x[i] = mem::ld_nc_f32(src, d as usize);
        if normed && d < n_rot {
            x_partner[i] = mem::ld_nc_f32(src, rope_partner(d, n_rot / 2, n_rot).0 as usize);
        }
    });
    (x, x_partner)
}

/// The lane's outputs of a head row ([`load_row`]) after the per-head RMSNorm (the norm
/// family's order: the lane's squares left to right, then the warp's) and RoPE with the row's
/// constants. The whole warp calls it, converged.
#[inline(always)]
fn norm_rope_row((x, x_partner): ([f32; LANE_VALUES], [f32; LANE_VALUES]), c: &RowConsts, hd: u32, n_rot: u32, eps: f32) -> [f32; LANE_VALUES] {
    let mut partial = 0.0f32;
    lane_values(hd, |i, _| partial += x[i] * x[i]);
    let scale = super::norm::warp_rms_scale_from(partial, hd, eps);
    let mut y = [0.0f32; LANE_VALUES];
    lane_values(hd, |i, d| y[i] = roped(d, n_rot / 2, n_rot, (x[i] * scale) * c.w[i], (x_partner[i] * scale) * c.w_partner[i], c.pair[i]));
    y
}

/// Stores the lane's values of a head row rounded to fp16 (a cache row at `dst`).
///
/// # Safety
/// `dst` holds `hd` u16.
#[inline(always)]
unsafe fn store_f16_row(dst: *mut u16, hd: u32, y: &[f32; LANE_VALUES]) {
    lane_values(hd, |i, d| mem::st_u16(dst.add(d as usize) as *mut u8, convert::f32_to_f16(y[i])));
}

crate::entry! {
    /// One warp per head row `r` of the window: `t = r / (n_q + 2 n_kv)`; of each token's rows the
    /// first `n_q` are query heads (`q[t * q_stride + h * hd ..]`: normed, roped, into `q_out`
    /// packed), the next `n_kv` key heads (`k[t * kv_stride + g * hd ..]`: normed, roped, fp16 into
    /// `k_cache` at position `pos0 + t`), the last `n_kv` value heads (`v[t * kv_stride + g * hd
    /// ..]`: fp16 into `v_cache`). The strides let `q`, `k` and `v` be views into one buffer of
    /// fused projection rows. `pos0 = *pos`; rows whose position is at or past `n_ctx` write
    /// nothing.
    ///
    /// # Safety
    /// `q`: `(tokens - 1) * q_stride + n_q * hd` f32, `k`, `v`: `(tokens - 1) * kv_stride + n_kv *
    /// hd` f32 (they may overlap each other: only read); `q_out`: `tokens * n_q * hd` f32; `q_norm`,
    /// `k_norm`: `hd` f32; `rope`: `n_ctx * n_rot` f32; the caches: `n_ctx * n_kv * hd` u16; `pos`:
    /// one u32; `hd` a multiple of 32, `n_rot` even and at most `hd`; outputs do not overlap inputs.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn attn_prep(
        q: *const f32,
        k: *const f32,
        v: *const f32,
        q_norm: *const f32,
        k_norm: *const f32,
        rope: *const f32,
        tokens: u32,
        n_q: u32,
        n_kv: u32,
        hd: u32,
        n_rot: u32,
        q_stride: u32,
        kv_stride: u32,
        pos: *const u32,
        n_ctx: u32,
        eps: f32,
        q_out: *mut f32,
        k_cache: *mut u16,
        v_cache: *mut u16,
    ) {
        let heads = n_q + 2 * n_kv;
        let r = index::block_idx() * ATTN_PREP_WARPS + index::warp_in_block();
        let warp_row = r < tokens * heads;
        let (t, h) = if warp_row { (r / heads, r % heads) } else { (0, 0) };
        let normed = h < n_q + n_kv;
        // Before the wait: the window's position, which a copy or the accept of a step before
        // wrote, launches before this one (read from L2: host/src/backends/launch.rs); then the
        // row's constants into registers.
        let at_pos = if warp_row { mem::ld_cg_u32(pos as *const u8) as u64 + t as u64 } else { u64::MAX };
        let consts = if at_pos < n_ctx as u64 && normed {
            let norm = if h < n_q { q_norm } else { k_norm };
            RowConsts::load(norm, rope.wrapping_add(at_pos as usize * n_rot as usize), hd, n_rot)
        } else {
            RowConsts::NONE
        };
        crate::arch::sync::chain_grids();
        if !warp_row {
            return; // the whole warp (the kernel has no block barrier)
        }
        if at_pos >= n_ctx as u64 {
            return; // the whole warp: no room in the cache (the host never asks for this)
        }
        let pos = at_pos as usize;
        let hdu = hd as usize;
        // The row's values in one round of loads, every store after them: a store may alias the
        // row for all the compiler knows, so a load after it would wait.
        let src = if h < n_q {
            q.add(t as usize * q_stride as usize + h as usize * hdu)
        } else if h < n_q + n_kv {
            k.add(t as usize * kv_stride as usize + (h - n_q) as usize * hdu)
        } else {
            v.add(t as usize * kv_stride as usize + (h - n_q - n_kv) as usize * hdu)
        };
        let row = load_row(src, hd, n_rot, normed);
        if !normed {
            store_f16_row(v_cache.add((pos * n_kv as usize + (h - n_q - n_kv) as usize) * hdu), hd, &row.0);
            return;
        }
        let y = norm_rope_row(row, &consts, hd, n_rot, eps);
        if h < n_q {
            let dst = q_out.add((t as usize * n_q as usize + h as usize) * hdu);
            lane_values(hd, |i, d| mem::st_f32(dst.add(d as usize), y[i]));
        } else {
            store_f16_row(k_cache.add((pos * n_kv as usize + (h - n_q) as usize) * hdu), hd, &y);
        }
    }
}

crate::entry! {
    /// `attn_prep` and `attn_chunk_two_128` of a window whose contexts are one chunk, in one
    /// launch (the host's choice where the step would launch `attn_chunk_two_128` without a
    /// merge: [`attn_prep_chunk_band`]).
    ///
    /// # Safety
    /// As [`attn_prep_chunk_band`] with `W = 2`, `HD = 128`.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn attn_prep_chunk_two_128(
        q: *const f32,
        k: *const f32,
        v: *const f32,
        q_norm: *const f32,
        k_norm: *const f32,
        rope: *const f32,
        tokens: u32,
        n_q: u32,
        n_kv: u32,
        hd: u32,
        n_rot: u32,
        q_stride: u32,
        kv_stride: u32,
        pos: *const u32,
        n_ctx: u32,
        eps: f32,
        scale: f32,
        k_cache: *mut u16,
        v_cache: *mut u16,
        out: *mut f32,
        xq: *mut u8,
    ) {
        attn_prep_chunk_band::<2, 1, 128>(q, k, v, q_norm, k_norm, rope, tokens, n_q, n_kv, hd, n_rot, q_stride, kv_stride, pos, n_ctx, eps, scale, k_cache, v_cache, out, xq)
    }
}

/// `attn_prep` then `attn_chunk_band` with `out` for a window of `tokens` tokens at `pos0 = *pos`
/// whose contexts (up to `pos0 + tokens` keys) are one chunk, in bands of `W` heads: block `b`
/// takes token `t` and query heads `h0 ..` of KV group `g` as `attn_chunk_band`'s blocks (one
/// chunk each). Before the grid wait, as `attn_chunk`, it asks L2 for the chunk's cache rows, and
/// its prep warps load their first rows' norm weights and (cos, sin) pairs. After it, warp
/// `w < W` norms and ropes token `t`'s query head `h0 + w` (`q[t * q_stride + h * hd ..]`)
/// straight into the band's shared query words; the other warps write the group's `2 * tokens`
/// new cache rows, warp `W + i` rows `i, i + WARPS - W, ...` of them (row `r < tokens`: token
/// `r`'s key, `k[r * kv_stride + g * hd ..]`, normed and roped into `k_cache` at `pos0 + r`; then
/// the values, into `v_cache`): each value `attn_prep`'s bits. Every block of a group writes all
/// of the window's new rows of that group (the same bits from every writer), so no block waits
/// for another; its first barrier, before the chunk's first stage copy, makes its own writes
/// visible to its copies. Then the chunk as `attn_chunk_band` computes it, into `out` (and
/// `xq`). A window past `n_ctx`, or a context longer than one chunk, traps.
///
/// # Safety
/// `q`: `(tokens - 1) * q_stride + n_q * hd` f32, `k`, `v`: `(tokens - 1) * kv_stride + n_kv *
/// hd` f32 (they may overlap each other: only read), `q_norm`, `k_norm`: `hd` f32, `rope`: `n_ctx
/// * n_rot` f32; the caches hold `n_ctx` positions (`n_kv * hd` u16 each), those before `*pos`
/// written, 16-byte aligned; `pos`: one u32; `out`: `tokens * n_q * hd` f32; `xq`: null or
/// `tokens * n_q * hd / 32` q8_1 blocks; `hd` a multiple of 32, at most `ATTN_MAX_HD` (and `HD`
/// where that is not 0), `n_rot` even and at most `hd`; `n_q` a multiple of `n_kv`, `W` dividing
/// `n_q / n_kv` and at most `attn_max_band(hd)`; outputs do not overlap inputs;
/// `ATTN_CHUNK_SMEM_WORDS` words of shared memory.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn attn_prep_chunk_band<const W: usize, const HW: usize, const HD: u32>(
    q: *const f32,
    k: *const f32,
    v: *const f32,
    q_norm: *const f32,
    k_norm: *const f32,
    rope: *const f32,
    tokens: u32,
    n_q: u32,
    n_kv: u32,
    hd: u32,
    n_rot: u32,
    q_stride: u32,
    kv_stride: u32,
    pos: *const u32,
    n_ctx: u32,
    eps: f32,
    scale: f32,
    k_cache: *mut u16,
    v_cache: *mut u16,
    out: *mut f32,
    xq: *mut u8,
) {
    // The band's query words are `q_word`'s (a band above one head), and warps are left for the
    // cache rows.
    const { assert!(W >= 2 && W < WARPS as usize && 2 * HW >= W) };
    if HD != 0 && hd != HD {
        sync::trap();
    }
    let hd = if HD != 0 { HD } else { hd };
    let heads = W as u32;
    if index::block_idx() >= tokens * (n_q / heads) {
        return; // the whole block
    }
    ask_l2_one_chunk(k_cache as *const u16, v_cache as *const u16, tokens, n_q, n_kv, hd, pos, n_ctx, 1, heads);
    let (band, _) = Band::of_block(tokens, n_q, n_kv, hd, heads, false);
    let (w, t) = (index::warp_in_block(), band.t);
    let pos0 = mem::ld_cg_u32(pos as *const u8);
    let end = pos0 as u64 + tokens as u64;
    let fits = end <= n_ctx as u64 && end <= ATTN_CHUNK as u64;
    // The warp's rows: query head `h0 + w` (`w < W`), else cache rows `w - W, w - W + step, ...`
    // of the `2 * tokens` (keys first). The first row's constants before the wait.
    let (step, new_rows) = (WARPS - heads, 2 * tokens);
    let rope_at = |p: u32| rope.wrapping_add(p as usize * n_rot as usize);
    let consts = if !fits {
        RowConsts::NONE
    } else if w < heads {
        RowConsts::load(q_norm, rope_at(pos0 + t), hd, n_rot)
    } else if w - heads < tokens {
        RowConsts::load(k_norm, rope_at(pos0 + w - heads), hd, n_rot)
    } else {
        RowConsts::NONE
    };
    // The chunk's first key stage but the window's keys: keys a launch long before wrote (the
    // rule of host/src/backends/launch.rs), copied while the grid before drains; the window's keys
    // in the stage are stored there by the warps that compute them, below.
    let smem = Smem::dynamic();
    let (len, kps) = (context_len(pos0, t, n_ctx), attn_key_stage(hd as usize));
    if fits {
        let ChunkRows { keys, values, n, stride } = band.rows(k_cache as *const u16, v_cache as *const u16, len, 0, false, 0);
        Stages::new(smem, keys, values, stride, n, hd).copy_rows(0, pos0.min(kps));
    }
    crate::arch::sync::chain_grids();
    if !fits || out.is_null() {
        sync::trap(); // the host launches this for windows whose contexts are one chunk
    }
    let hdu = hd as usize;
    if w < heads {
        let row = load_row(q.add(t as usize * q_stride as usize + (band.h0 + w) as usize * hdu), hd, n_rot, true);
        let y = norm_rope_row(row, &consts, hd, n_rot, eps);
        lane_values(hd, |i, d| smem.st_u32(q_word(w, d, hd), y[i].to_bits()));
    } else {
        let mut r = w - heads;
        let mut consts = consts;
        while r < new_rows {
            let key = r < tokens;
            let tr = if key { r } else { r - tokens };
            let src = if key { k } else { v }.add(tr as usize * kv_stride as usize + band.g * hdu);
            // A later row's constants in the same round of loads as the row.
            if r >= step && key {
                consts = RowConsts::load(k_norm, rope_at(pos0 + tr), hd, n_rot);
            }
            let row = load_row(src, hd, n_rot, key);
            let at = ((pos0 + tr) as usize * n_kv as usize + band.g) * hdu;
            if key {
                let h = norm_rope_row(row, &consts, hd, n_rot, eps).map(convert::f32_to_f16);
                lane_values(hd, |i, d| mem::st_u16(k_cache.add(at + d as usize) as *mut u8, h[i]));
                // A key of this block's context in its first stage: there too (the copy left it
                // out), in the stage's padded rows.
                let p = pos0 + tr;
                if p < kps && tr <= t {
                    let row_at = smem.addr(K_WORD) + p * (2 * hd + 8);
                    lane_values(hd, |i, d| Smem::st_u16_at(row_at + 2 * d, h[i]));
                }
            } else {
                store_f16_row(v_cache.add(at), hd, &row.0);
            }
            r += step;
        }
    }
    let dest = Dest { part: core::ptr::null_mut(), n_chunks: 1, out, xq };
    band.walk::<W, HW>(smem, k_cache as *const u16, v_cache as *const u16, len, 0, 1, scale, dest, true);
}

/// `split` blocks per (token `t`, band of `heads` consecutive query heads of one KV group),
/// block index `s * tokens * (n_q / heads) + t * (n_q / heads) + band` (chunk-major: where
/// contexts are shorter than the cache, the blocks with chunks to compute come first in the
/// grid and those without last); block `s` computes chunks `s, s + split, ...` of the token's
/// context for each of its heads, each into part `(t * n_q + h) * n_chunks
/// + c` (which block computes a chunk, and with which heads, does not change its bits). A band
/// reads each key and value of its chunks once for all its heads: with `heads` = the group's
/// query heads, the cache is read once per token instead of once per query head.
///
/// Per chunk, a band of several heads ([`Band::chunk`]): the keys are staged in shared memory
/// and two threads score a key for their share of the band's heads, each half of the lane
/// partials in the butterfly's order, joined by one exchange; each head's maximum from the warps'; thread `i` turns
/// key `i`'s scores into softmax terms; the values are staged too, and thread `d` of set `r`
/// (`ATTN_THREADS / hd` sets) sums `p_j * v_j[d]` (fused multiply-adds) and `p_j` over the chunk's keys in order for
/// heads `r, r + sets, ...` of the band (the thread with `d = 0` writes each head's `m` and `l`).
/// One head ([`Band::chunk_one_head`], `W = 1`): warps score keys with lane partials and the
/// warp butterfly, and the values are read from global memory. Both give the spec's bits.
///
/// With `out` not null (the host's choice where every token's context is one chunk:
/// `split == 1` and a context bound of at most `ATTN_CHUNK` keys) there is nothing to merge:
/// each thread writes its heads' outputs `out[t][h * hd + d]` as `attn_merge` computes them from
/// one part ([`one_part`]), and no parts; a context longer than one chunk then traps. With `xq`
/// not null too, each warp quantizes its 32 outputs into their q8_1 block (`quantize_q8_1`'s
/// bits): the output projection's input, without a launch of its own.
///
/// # Safety
/// `q`: `tokens * n_q * hd` f32; the caches hold `n_ctx` positions (`n_kv * hd` u16 each),
/// those before `*pos + tokens` written; `part`: `tokens * n_q * n_chunks * (hd + 2)` f32 with
/// `n_chunks = ceil(n_ctx / ATTN_CHUNK)`; `split >= 1`; `hd` a multiple of 32, at most
/// `ATTN_MAX_HD` (and `HD` where that is not 0); `n_q` a multiple of `n_kv`, `heads` (at most
/// `ATTN_MAX_BAND`) dividing `n_q / n_kv` and at most `attn_max_band(hd)`; the caches 16-byte
/// aligned; `ATTN_CHUNK_SMEM_WORDS` words of shared memory (`ATTN_CHUNK_ONE_SMEM_WORDS` for `W =
/// 1`). Keys past the caches' positions are never read: a token's context is clamped to them.
/// `out`: null or `tokens * n_q * hd` f32; `xq`: null or `tokens * n_q * hd / 32` q8_1 blocks
/// (only with `out`).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn attn_chunk_band<const W: usize, const HW: usize, const HD: u32, const LEAN: bool>(
    q: *const f32,
    k_cache: *const u16,
    v_cache: *const u16,
    tokens: u32,
    n_q: u32,
    n_kv: u32,
    hd: u32,
    pos: *const u32,
    scale: f32,
    n_ctx: u32,
    split: u32,
    heads: u32,
    part: *mut f32,
    out: *mut f32,
    xq: *mut u8,
) {
    const { assert!(2 * HW >= W) }; // a key's head slots (2 or 4) share the band's heads
    // An entry compiled for one head size (`HD` not 0) holds only that size's scoring and value
    // bodies; a launch of another size is the host's error.
    if HD != 0 && hd != HD {
        sync::trap();
    }
    let hd = if HD != 0 { HD } else { hd };
    if index::block_idx() >= tokens * (n_q / heads) * split {
        return; // the whole block
    }
    let (band, first) = Band::of_block(tokens, n_q, n_kv, hd, heads, LEAN);
    let (t, h0) = (band.t, band.h0);
    let (len, n_chunks) = (context_len(mem::ld_nc_u32(pos as *const u8), t, n_ctx), n_ctx.div_ceil(ATTN_CHUNK as u32));
    if !out.is_null() && len > ATTN_CHUNK as u32 {
        sync::trap(); // one part cannot be the output: the host launched this for short contexts
    }
    // The band's query rows, consecutive in `q`, into shared memory (read by every thread).
    let smem = Smem::dynamic();
    let rows = q.add((t * n_q + h0) as usize * hd as usize);
    let mut i = index::thread_idx();
    while i < heads * hd {
        let word = if W == 1 { Q_WORD + i } else { q_word(i / hd, i % hd, hd) };
        smem.st_u32(word, mem::ld_nc_u32(rows.add(i as usize) as *const u8));
        i += ATTN_THREADS;
    }
    band.walk::<W, HW>(smem, k_cache, v_cache, len, first, split, scale, Dest { part, n_chunks, out, xq }, false);
}

/// Declares the `attn_chunk` entries: one per widest band `W` it takes and head size `HD` it
/// was compiled for (0: any). The narrow ones run less code: one head a block needs fewer
/// registers and so runs more blocks per SM, and bands of two, compiled without the wider
/// bands' bodies, wait less on instruction fetch at short contexts, where a block's chunk is a
/// few stages; so does an entry for one head size, without the other sizes' bodies. The lean
/// entry (`LEAN`: the sm_90 image's `attn_chunk_128_m4`) is `attn_chunk_128` for 4 blocks a SM
/// (64 registers, where it takes 128 for 2): the same loops, with the addresses that do not
/// change from chunk to chunk computed in each ([`Band::fresh`]).
macro_rules! attn_chunk_entries {
    ($($(#[$attr:meta])* $name:ident => $w:literal, $hw:literal, $hd:literal, $lean:literal),* $(,)?) => {$(
        $crate::entry! {
            /// `attn_chunk_band` for bands of at most `W` heads, a scoring thread taking at most
            /// `HW` of them, heads of `HD` values where `HD` is not 0 (launch bounds by name in
            /// gpu-shared).
            ///
            /// # Safety
            /// As `attn_chunk_band`, with `heads <= W`.
            $(#[$attr])*
            #[allow(clippy::too_many_arguments)]
            pub unsafe fn $name(
                q: *const f32,
                k_cache: *const u16,
                v_cache: *const u16,
                tokens: u32,
                n_q: u32,
                n_kv: u32,
                hd: u32,
                pos: *const u32,
                scale: f32,
                n_ctx: u32,
                split: u32,
                heads: u32,
                part: *mut f32,
                out: *mut f32,
                xq: *mut u8,
            ) {
                ask_l2_one_chunk(k_cache, v_cache, tokens, n_q, n_kv, if $hd != 0 { $hd } else { hd }, pos, n_ctx, split, heads);
                crate::arch::sync::chain_grids();
                attn_chunk_band::<$w, $hw, $hd, $lean>(q, k_cache, v_cache, tokens, n_q, n_kv, hd, pos, scale, n_ctx, split, heads, part, out, xq)
            }
        }
    )*};
}

attn_chunk_entries! {
    attn_chunk => 8, 4, 0, false,
    attn_chunk_128 => 8, 4, 128, false,
    #[cfg(any(target_feature = "sm_90", not(target_arch = "nvptx64")))]
    attn_chunk_128_m4 => 8, 4, 128, true,
    attn_chunk_two => 2, 1, 0, false,
    attn_chunk_two_128 => 2, 1, 128, false,
    attn_chunk_one => 1, 1, 0, false,
}

/// Shared words of the `attn_chunk` entries: the band's queries from `Q_WORD`, value `d = p + 32
/// i` of head `h` at `h * hd + (hd / 32) p + i` (a key's lane partial `p` reads its `hd / 32`
/// query values together: one or two 16-byte loads for heads of 128 or 256 values); the scores
/// then softmax terms `S[heads][ATTN_CHUNK]` from `S_WORD`; the warps' maxima `M[heads][warp]`
/// from `M_WORD` (a head's in two 16-byte loads); the two stage buffers from `K_WORD`, `ATTN_STAGE_WORDS` each (`attn_key_stage(hd)`
/// fp16 rows of `hd / 2 + 2` words for keys, `hd / 2` for values).
const Q_WORD: u32 = 0;
const S_WORD: u32 = Q_WORD + ATTN_Q_WORDS;
const M_WORD: u32 = S_WORD + (ATTN_MAX_BAND * ATTN_CHUNK) as u32;
const K_WORD: u32 = M_WORD + WARPS * ATTN_MAX_BAND as u32;
const _: () = assert!(M_WORD % 4 == 0 && WARPS == 8 && K_WORD % 4 == 0 && ATTN_STAGE_WORDS % 4 == 0 && K_WORD + 2 * ATTN_STAGE_WORDS <= ATTN_CHUNK_SMEM_WORDS && ATTN_MAX_HD / 32 <= 8);

/// The query word of value `d` of head `h` for heads of `hd` values (the layout above).
#[inline(always)]
fn q_word(h: u32, d: u32, hd: u32) -> u32 {
    Q_WORD + h * hd + hd / 32 * (d % 32) + d / 32
}

/// The query heads `h0 .. h0 + heads` of token `t`, all of KV group `g`.
struct Band {
    t: u32,
    h0: u32,
    heads: u32,
    g: usize,
    n_q: u32,
    n_kv: u32,
    hd: u32,
    /// The lean entry's code (`LEAN`): addresses that do not change from chunk to chunk are
    /// computed again in each, not held in registers across the chunk's loops ([`Band::fresh`]).
    lean: bool,
}

/// Before an `attn_chunk` entry's grid wait, where the launch's contexts are one chunk (`split`
/// 1): asks L2 for the cache rows of the block's chunk, so that their DRAM latency passes while
/// the grid before still runs. It reads only the window's position, which a copy or the accept of
/// a step before wrote, launches before this one (from L2: host/src/backends/launch.rs); the rows
/// `attn_prep` is about to write are only asked for (a hint), never read.
///
/// Only for one-chunk contexts: the rows asked for are then at most one chunk a KV group, where
/// at depth 32,768 every block of the first wave asking for its chunk (33 MB) made the step 1.5 %
/// slower, likely by queueing the grid before's DRAM reads behind them. And only where grids
/// are chained (sm_90 on): elsewhere nothing runs before the wait (and the one-head entry spilled
/// with it on sm_80).
///
/// # Safety
/// As `attn_chunk_band`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn ask_l2_one_chunk(k_cache: *const u16, v_cache: *const u16, tokens: u32, n_q: u32, n_kv: u32, hd: u32, pos: *const u32, n_ctx: u32, split: u32, heads: u32) {
    if !cfg!(target_feature = "sm_90") || split != 1 || index::block_idx() >= tokens * (n_q / heads) {
        return;
    }
    let (band, _) = Band::of_block(tokens, n_q, n_kv, hd, heads, false);
    let len = context_len(mem::ld_cg_u32(pos as *const u8), band.t, n_ctx);
    band.rows(k_cache, v_cache, len, 0, true, u32::MAX); // asks L2 for them
}

/// Where a chunk's results go: part slots (`part`, `n_chunks` a head), or with `out` the final
/// outputs (the context is that one chunk) and, with `xq`, their q8_1 blocks.
#[derive(Clone, Copy)]
struct Dest {
    part: *mut f32,
    n_chunks: u32,
    out: *mut f32,
    xq: *mut u8,
}

/// A chunk's key and value rows of one KV group (`n` keys, `stride` values apart).
struct ChunkRows {
    keys: *const u16,
    values: *const u16,
    n: u32,
    stride: usize,
}

/// One part `(m, l, o)` folded into `attn_merge`'s sums against the maximum `big_m` of the
/// parts: `f = exp_neg(m - big_m)`, `L += l f`, `O += o f`.
#[inline(always)]
fn fold_part(big_m: f32, (m, l, o): (f32, f32, f32), big_l: &mut f32, big_o: &mut f32) {
    fold_terms(part_terms(big_m, m, l), o, big_l, big_o);
}

/// [`fold_part`]'s sums from the part's terms `(f, l f)` ([`part_terms`]): `L += l f`, `O += o f`.
#[inline(always)]
fn fold_terms((f, lf): (f32, f32), o: f32, big_l: &mut f32, big_o: &mut f32) {
    *big_l += lf;
    *big_o += o * f;
}

/// A part's factor `f = exp_neg(m - big_m)` and weighted sum `l f`: what [`fold_part`] adds to
/// `L`, and multiplies its `o` by.
#[inline(always)]
fn part_terms(big_m: f32, m: f32, l: f32) -> (f32, f32) {
    let f = exp_neg(m - big_m);
    (f, l * f)
}

/// `attn_merge`'s output value from one part `(m, l, o)`: its fold for a context of one chunk
/// (`M = maxNum(-inf, m)`, [`fold_part`] from +0.0, `O / L`).
#[inline(always)]
fn one_part(m: f32, l: f32, o: f32) -> f32 {
    let (mut big_l, mut big_o) = (0.0f32, 0.0f32);
    fold_part(f32::NEG_INFINITY.max(m), (m, l, o), &mut big_l, &mut big_o);
    big_o / big_l
}

/// Stores output value `at` of the attention rows (`[token][n_q * hd]`, row-major) and, with
/// `xq`, quantizes the warp's 32 values (`at` = 32 g + lane) into q8_1 block `g`. The whole warp
/// calls it, converged.
#[inline(always)]
unsafe fn store_output(out: *mut f32, xq: *mut u8, at: usize, v: f32) {
    mem::st_f32(out.add(at), v);
    if !xq.is_null() {
        quantize_group(v, xq.add(at / GROUP * q8_1::BYTES));
    }
}

/// Head `h`'s maximum over the chunk's scores: the warps' maxima folded.
#[inline(always)]
unsafe fn head_max(smem: Smem, h: u32) -> f32 {
    let at = M_WORD + h * WARPS;
    let maxima = [smem.ld_v4(at), smem.ld_v4(at + 4)];
    let mut m = f32::NEG_INFINITY;
    for x in 0..WARPS as usize {
        m = m.max(f32::from_bits(maxima[x / 4][x % 4]));
    }
    m
}

impl Band {
    /// This block's band and first chunk in the grid of `attn_chunk_band` (a block within the
    /// grid's `tokens * (n_q / heads) * split` that work).
    #[inline(always)]
    fn of_block(tokens: u32, n_q: u32, n_kv: u32, hd: u32, heads: u32, lean: bool) -> (Band, u32) {
        let bands = n_q / heads;
        let (tb, first) = (index::block_idx() % (tokens * bands), index::block_idx() / (tokens * bands));
        let (t, h0) = (tb / bands, tb % bands * heads);
        (Band { t, h0, heads, g: (h0 / (n_q / n_kv)) as usize, n_q, n_kv, hd, lean }, first)
    }

    /// Chunks `first, first + split, ...` of the token's `len` keys into `dest`, the band's
    /// queries in shared memory (written by the block before the call). With `staged` (bands
    /// above one head), chunk `first`'s first key stage is in its buffer already: copied by the
    /// block's threads and stored by them before the call. The whole block calls it.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    unsafe fn walk<const W: usize, const HW: usize>(&self, smem: Smem, k_cache: *const u16, v_cache: *const u16, len: u32, first: u32, split: u32, scale: f32, dest: Dest, staged: bool) {
        let mut c = first;
        while c * (ATTN_CHUNK as u32) < len {
            sync::sync_threads(); // the queries are in; the previous chunk's readers are done
            crate::trace_mark!(1, "queries");
            if W == 1 {
                self.chunk_one_head(smem, k_cache, v_cache, len, c, scale, dest);
            } else {
                self.chunk::<W, HW>(smem, k_cache, v_cache, len, c, scale, dest, staged && c == first);
            }
            c += split;
        }
    }

    /// 0, which in the lean entry the optimizer cannot see is the same for every chunk `c`: an
    /// address with it added is computed in chunk `c`'s code, not once before the chunks and
    /// kept. (Hoisted, the KV group's row offset, the L2 requests' first row and the outputs'
    /// addresses made `attn_chunk_128` spill 80 bytes at 80 registers, 3 blocks a SM.)
    #[inline(always)]
    fn fresh(&self, c: u32) -> u32 {
        if self.lean {
            int::zero_in(c)
        } else {
            0
        }
    }

    /// One chunk `c` of the token's `len` keys, each head's max, softmax sum and weighted values
    /// into its part slot (or, with `dest.out`, the head's outputs). The whole block calls it.
    ///
    /// The chunk's keys, then its values, pass through the two stage buffers
    /// `attn_key_stage(hd)` rows at a time: stage `s` is copied into buffer `s % 2`
    /// asynchronously while the block works on stage `s - 1` in the other ([`Stages`]).
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    unsafe fn chunk<const W: usize, const HW: usize>(&self, smem: Smem, k_cache: *const u16, v_cache: *const u16, len: u32, c: u32, scale: f32, dest: Dest, staged: bool) {
        // L2 is asked for the first `STAGES_ASKED` stages' keys here, each later stage's rows as
        // the stage `STAGES_ASKED` before it starts (`Stages::next`).
        let ChunkRows { keys, values, n, stride } = self.rows(k_cache, v_cache, len, c, false, STAGES_ASKED * attn_key_stage(self.hd as usize));
        let (hd, heads, tid) = (self.hd, self.heads, index::thread_idx());
        let stages = Stages::new(smem, keys, values, stride, n, hd);
        let key_stages = stages.key_stages;
        if !staged {
            stages.copy(0);
        }
        for s in 0..key_stages {
            stages.next(s);
            // The scores, with the lane count a constant for the common head sizes. Heads of
            // more than 128 values come in bands of at most 4 (`attn_max_band`) over 4 head
            // slots a key (`attn_key_stage`): one head a thread.
            let (base, rows) = stages.span(s);
            let stage = (stages.buffer(s), base, rows);
            match (hd / 32, hd <= 128) {
                (4, _) => self.score::<HW, 4, true>(smem, stage, scale),
                (_, true) => self.score::<HW, 4, false>(smem, stage, scale),
                (8, _) => self.score::<1, 8, true>(smem, stage, scale),
                _ => self.score::<1, 8, false>(smem, stage, scale),
            }
        }
        sync::sync_threads(); // the scores are in
        crate::trace_mark!(2, "scored");
        // Each head's maximum: warp w folds keys 32 w .. 32 w + 31 (maxima are exact in any order).
        let (lane, w) = (index::lane(), index::warp_in_block());
        for h in 0..heads {
            let s = if tid < n { f32::from_bits(smem.ld_u32(S_WORD + h * ATTN_CHUNK as u32 + tid)) } else { f32::NEG_INFINITY };
            let m = warp::warp_max_f32(s);
            if lane == 0 {
                smem.st_u32(M_WORD + h * WARPS + w, m.to_bits());
            }
        }
        sync::sync_threads();
        // Thread i turns key i's scores into softmax terms.
        if tid < n {
            for h in 0..heads {
                let at = S_WORD + h * ATTN_CHUNK as u32 + tid;
                smem.st_u32(at, exp_neg(f32::from_bits(smem.ld_u32(at)) - head_max(smem, h)).to_bits());
            }
        }
        // Thread (set r, value d): heads r, r + sets, ... of the band. A partial set (`hd` not
        // dividing the block) has no heads. The values are staged like the keys, unpadded.
        let sets = ATTN_THREADS / hd;
        let (r, d) = (tid / hd, tid % hd);
        let active = r < sets && r < heads;
        // The sums of the terms are needed where a thread folds its own output (one chunk) or
        // writes a part's `l` (`d = 0`): whole warps, as `hd` is a multiple of 32.
        let with_l = !dest.out.is_null() || d < 32;
        // Whether all of the thread's `ATTN_SET_HEADS` heads are in the band.
        let full_set = W >= ATTN_SET_HEADS && r + (ATTN_SET_HEADS as u32 - 1) * sets < heads;
        let (mut l, mut o) = ([0.0f32; ATTN_SET_HEADS], [0.0f32; ATTN_SET_HEADS]);
        for s in key_stages..2 * key_stages {
            stages.next(s); // also: the softmax terms are in
            if active {
                let ((base, rows), buffer) = (stages.span(s), stages.buffer(s));
                let sum = ValueSum { smem, buffer, base, rows, row_words: hd / 2, d, r, sets, heads };
                if hd == 128 {
                    sum.add_to::<W, 128>(with_l, full_set, &mut l, &mut o);
                } else {
                    sum.add_to::<W, 0>(with_l, full_set, &mut l, &mut o);
                }
            }
        }
        if !active {
            return;
        }
        crate::unroll!(x in [0, 1, 2, 3] {
            let h = r + x as u32 * sets;
            if x < W && h < heads {
                self.finish(smem, h, d, (l[x], o[x]), c, dest);
            }
        });
    }

    /// The chunk's rows of the band's KV group: `n` keys from position `c * ATTN_CHUNK` of the
    /// token's `len`, asked of L2 at once (the loops then wait on L2, not DRAM). The whole block
    /// calls it.
    #[inline(always)]
    unsafe fn rows(&self, k_cache: *const u16, v_cache: *const u16, len: u32, c: u32, ask_values: bool, ask_keys: u32) -> ChunkRows {
        let start = c * ATTN_CHUNK as u32;
        let n = (len - start).min(ATTN_CHUNK as u32);
        let hd = self.hd as usize;
        let stride = self.n_kv as usize * hd;
        // The chunk's first row in 32 bits (a cache holds fewer than 2^32 values, `AttnShape`'s
        // check): a register less than a 64-bit product, which the lean entry spilled.
        let first = start * (self.n_kv * self.hd) + (self.g as u32 + self.fresh(c)) * self.hd;
        let (keys, values) = (k_cache.add(first as usize), v_cache.add(first as usize));
        let row_lines = (hd * 2).div_ceil(128);
        let mut i = (index::thread_idx() + self.fresh(c)) as usize;
        while i < n.min(ask_keys) as usize * row_lines {
            let at = (i / row_lines) * stride * 2 + (i % row_lines) * 128;
            mem::prefetch_l2((keys as *const u8).wrapping_add(at));
            if ask_values {
                mem::prefetch_l2((values as *const u8).wrapping_add(at));
            }
            i += ATTN_THREADS as usize;
        }
        ChunkRows { keys, values, n, stride }
    }

    /// Value `d` of head `h` of the band from its sums `(l, o)` over chunk `c`: the output (the
    /// context is this one chunk; with `xq` also its q8_1 block, so the whole warp calls it,
    /// converged, for one head) or the part slot (`d = 0` writes `m` and `l`).
    #[inline(always)]
    unsafe fn finish(&self, smem: Smem, h: u32, d: u32, (l, o): (f32, f32), c: u32, dest: Dest) {
        let head = self.t * self.n_q + self.h0 + h + self.fresh(c);
        if !dest.out.is_null() {
            store_output(dest.out, dest.xq, (head * self.hd + d) as usize, one_part(head_max(smem, h), l, o));
        } else {
            let out = dest.part.add(((head * dest.n_chunks + c) * (self.hd + 2)) as usize);
            mem::st_f32(out.add(2 + d as usize), o);
            if d == 0 {
                mem::st_f32(out, head_max(smem, h));
                mem::st_f32(out.add(1), l);
            }
        }
    }

    /// One chunk for a band of one head (`attn_chunk_one`, for groups with no band above one:
    /// docs/kernels/attention.md). Warp `w` scores keys `w, w +
    /// 8, ...`, two in flight: lane `p` takes `acc = fma(q[p + 32 i], k[p + 32 i], acc)` over `i` in turn,
    /// the warp butterfly the 32 partials; thread `i` turns key `i`'s score into its softmax term;
    /// thread `d < hd` sums `p_j * v_j[d]` and `p_j` over the keys in order, loading
    /// `ATTN_V_AHEAD` values before adding their terms. The query is in shared memory as a row
    /// (`Q_WORD + d`).
    #[inline(always)]
    unsafe fn chunk_one_head(&self, smem: Smem, k_cache: *const u16, v_cache: *const u16, len: u32, c: u32, scale: f32, dest: Dest) {
        let ChunkRows { keys, values, n, stride } = self.rows(k_cache, v_cache, len, c, true, u32::MAX);
        let (hd, lane, w, tid) = (self.hd, index::lane(), index::warp_in_block(), index::thread_idx());
        let per_lane = hd / 32;
        let ld_f16 = |p: *const u16, i: usize| convert::f16_to_f32(mem::ld_nc_u16(p.add(i) as *const u8));
        let mut warp_max = f32::NEG_INFINITY;
        let mut j = w;
        while j < n {
            let mut k = [[0.0f32; ATTN_MAX_HD / 32]; 2];
            crate::unroll!(u in [0, 1] {
                let key = keys.add((j + u as u32 * WARPS) as usize * stride);
                crate::unroll!(i in [0, 1, 2, 3, 4, 5, 6, 7] {
                    if (i as u32) < per_lane && j + (u as u32) * WARPS < n {
                        k[u][i] = ld_f16(key, lane as usize + 32 * i);
                    }
                });
            });
            crate::unroll!(u in [0, 1] {
                let ju = j + u as u32 * WARPS;
                if ju < n {
                    let mut acc = 0.0f32;
                    crate::unroll!(i in [0, 1, 2, 3, 4, 5, 6, 7] {
                        if (i as u32) < per_lane {
                            acc = convert::fma_rn(f32::from_bits(smem.ld_u32(Q_WORD + lane + 32 * i as u32)), k[u][i], acc);
                        }
                    });
                    let s = scale * warp::warp_sum_f32(acc);
                    if lane == 0 {
                        smem.st_u32(S_WORD + ju, s.to_bits());
                    }
                    warp_max = warp_max.max(s);
                }
            });
            j += 2 * WARPS;
        }
        if lane == 0 {
            smem.st_u32(M_WORD + w, warp_max.to_bits());
        }
        sync::sync_threads();
        if tid < n {
            smem.st_u32(S_WORD + tid, exp_neg(f32::from_bits(smem.ld_u32(S_WORD + tid)) - head_max(smem, 0)).to_bits());
        }
        sync::sync_threads();
        if tid >= hd {
            return;
        }
        let values = values.add(tid as usize);
        let (mut l, mut o) = (0.0f32, 0.0f32);
        let mut add = |j: u32, v: f32| {
            let p = f32::from_bits(smem.ld_u32(S_WORD + j));
            l += p;
            o = convert::fma_rn(p, v, o);
        };
        let mut j = 0;
        while j + ATTN_V_AHEAD <= n {
            let mut v = [0.0f32; ATTN_V_AHEAD as usize];
            for (u, v) in v.iter_mut().enumerate() {
                *v = ld_f16(values, (j as usize + u) * stride);
            }
            for (u, &v) in v.iter().enumerate() {
                add(j + u as u32, v);
            }
            j += ATTN_V_AHEAD;
        }
        while j < n {
            add(j, ld_f16(values, j as usize * stride));
            j += 1;
        }
        self.finish(smem, 0, tid, (l, o), c, dest);
    }

    /// The scores `scale * dot_j` of a stage's keys (`(buffer, base, rows)`: keys `base .. base
    /// + rows` of the chunk in the stage buffer at word `buffer`) for every head of the band into
    /// `S[h][j]`. Thread (`slot`, `r`, `half`) of the stage takes key `r`'s lane partials `p =
    /// half (mod 2)` for heads `slot, slot + tpk, ...` of the band (`tpk = ATTN_THREADS / (2
    /// kps)` head slots, at most `HW` heads); the body is compiled for the thread's count of
    /// heads (a warp's threads share a slot, so a warp takes one body), with no per-head checks.
    #[inline(always)]
    unsafe fn score<const HW: usize, const PL: usize, const EXACT: bool>(&self, smem: Smem, stage: (u32, u32, u32), scale: f32) {
        let kps = attn_key_stage(self.hd as usize);
        let (tpk, slot) = (ATTN_THREADS / (2 * kps), index::thread_idx() / (2 * kps));
        let nh = if slot < self.heads { (self.heads - slot).div_ceil(tpk).min(HW as u32) } else { 0 };
        match nh {
            4 if HW >= 4 => self.score_heads::<4, PL, EXACT>(smem, stage, scale),
            3 if HW >= 3 => self.score_heads::<3, PL, EXACT>(smem, stage, scale),
            2 if HW >= 2 => self.score_heads::<2, PL, EXACT>(smem, stage, scale),
            1 => self.score_heads::<1, PL, EXACT>(smem, stage, scale),
            _ => {}
        }
    }

    /// [`Band::score`] for a thread of `NH` heads. Two threads compute a key's dot product for
    /// a head: each its half of the lane partials (`PL = hd / 32` fused multiply-adds each, in
    /// turn from +0.0) in its half of the butterfly's tree ([`order::butterfly_half_tree`],
    /// written out: each leaf's shared loads at constant offsets), then one exchange and the
    /// tree's last addition (`even + odd`, the same bits in both threads). `EXACT`: `PL` is `hd
    /// / 32`; else `hd / 32 <= PL` is checked per product. A warp's 16 keys are scored together
    /// (the exchange needs the whole warp): a warp whose first key is in the stage scores all
    /// 16, and stores only those in it.
    #[inline(always)]
    unsafe fn score_heads<const NH: usize, const PL: usize, const EXACT: bool>(&self, smem: Smem, (buffer, base, rows): (u32, u32, u32), scale: f32) {
        // With `EXACT`, `hd` is a constant, and so are the query heads' distances.
        let hd = if EXACT { 32 * PL as u32 } else { self.hd };
        let per_lane = hd / 32;
        let kps = attn_key_stage(hd as usize);
        let tpk = ATTN_THREADS / (2 * kps);
        let tid = index::thread_idx();
        let (half, r, slot) = (tid % 2, tid / 2 % kps, tid / (2 * kps));
        if r & !15 >= rows {
            return; // the whole warp
        }
        let used = |i: usize| i < PL && (EXACT || (i as u32) < per_lane);
        // Shared addresses in 32 bits: the key's row, each head's query.
        let key = smem.addr(buffer + r * (hd / 2 + 2));
        let mut query = [0u32; NH];
        crate::unroll!(x in [0, 1, 2, 3] {
            if x < NH {
                query[x] = smem.addr(q_word(slot + tpk * x as u32, 0, hd));
            }
        });
        // Leaf `p = first + off`: the turn's addresses from `first`, the leaf's at constant
        // offsets `off` from them.
        let mine = order::butterfly_half_tree::<NH>(half, &|first, off| {
            let first = int::opaque(first);
            let mut k = [0.0f32; 8];
            crate::unroll!(i in [0, 1, 2, 3, 4, 5, 6, 7] {
                if used(i) {
                    k[i] = convert::f16_to_f32(Smem::ld_u16_at(key + 2 * first + 2 * off + 64 * i as u32));
                }
            });
            let mut acc = [0.0f32; NH];
            crate::unroll!(x in [0, 1, 2, 3] {
                if x < NH {
                    // Lane partial p's query values (16-byte aligned where the lane count is
                    // exactly 4 or 8).
                    let lane_bytes = 4 * if EXACT { PL as u32 } else { per_lane };
                    let at = query[x] + lane_bytes * first + lane_bytes * off;
                    let mut qv = [[0u32; 4]; 2];
                    if EXACT {
                        qv[0] = Smem::ld_v4_at(at);
                        if PL > 4 {
                            qv[1] = Smem::ld_v4_at(at + 16);
                        }
                    }
                    crate::unroll!(i in [0, 1, 2, 3, 4, 5, 6, 7] {
                        if used(i) {
                            let qv = if EXACT { qv[i / 4][i % 4] } else { Smem::ld_u32_at(at + 4 * i as u32) };
                            acc[x] = convert::fma_rn(f32::from_bits(qv), k[i], acc[x]);
                        }
                    });
                }
            });
            acc
        });
        crate::unroll!(x in [0, 1, 2, 3] {
            if x < NH {
                let dot = mine[x] + warp::shfl_xor_f32(mine[x], 1);
                if half == 0 && r < rows {
                    let h = slot + tpk * x as u32;
                    smem.st_u32(S_WORD + h * ATTN_CHUNK as u32 + base + r, (scale * dot).to_bits());
                }
            }
        });
    }
}

/// A chunk's stages: its `n` keys then its `n` values, `kps` rows a stage (stage `s < key
/// stages` holds keys `s kps ..`, the next ones the values from 0 on), copied by
/// `cp.async` into the two stage buffers in turn. Keys rows are `hd / 2 + 2` words (8-byte
/// copies), value rows `hd / 2` (16-byte copies).
struct Stages {
    smem: Smem,
    keys: *const u16,
    values: *const u16,
    stride: usize,
    n: u32,
    hd: u32,
    kps: u32,
    key_stages: u32,
}

impl Stages {
    #[inline(always)]
    fn new(smem: Smem, keys: *const u16, values: *const u16, stride: usize, n: u32, hd: u32) -> Self {
        let kps = attn_key_stage(hd as usize);
        Self { smem, keys, values, stride, n, hd, kps, key_stages: n.div_ceil(kps) }
    }

    /// Stage `s`'s first row (of the keys, or from `key_stages` on of the values) and its rows.
    #[inline(always)]
    fn span(&self, s: u32) -> (u32, u32) {
        let base = (if s >= self.key_stages { s - self.key_stages } else { s }) * self.kps;
        (base, (self.n - base).min(self.kps))
    }

    /// The word of stage `s`'s buffer.
    #[inline(always)]
    fn buffer(&self, s: u32) -> u32 {
        K_WORD + s % 2 * ATTN_STAGE_WORDS
    }

    /// Starts the copy of stage `s` (past the last value stage: nothing). The whole block calls
    /// it; nothing reads the stage's buffer until [`Stages::next`] for it.
    #[inline(always)]
    unsafe fn copy(&self, s: u32) {
        self.copy_rows(s, u32::MAX);
    }

    /// [`Stages::copy`] of stage `s`'s first `limit` rows only.
    #[inline(always)]
    unsafe fn copy_rows(&self, s: u32, limit: u32) {
        if s >= 2 * self.key_stages {
            return;
        }
        let values = s >= self.key_stages;
        let (base, rows) = self.span(s);
        let rows = rows.min(limit);
        let src = if values { self.values } else { self.keys }.add((base * self.stride as u32) as usize);
        let dst = self.smem.addr(self.buffer(s));
        // 8-byte pieces of the keys' padded rows, 16-byte pieces of the values'.
        let (piece_halves, row_bytes) = if values { (8, 2 * self.hd) } else { (4, 2 * self.hd + 8) };
        let (pieces, piece_bytes) = (self.hd / piece_halves, 2 * piece_halves);
        // The thread's pieces are `tid, tid + ATTN_THREADS, ...` of the stage's `rows * pieces`,
        // walked with the piece's row and both addresses stepped, not divided out (a divide by
        // the run-time `pieces` and the addresses from it were 29 instructions a piece).
        // (`zero_in(s)`: the thread's first row offset is computed here each stage, not hoisted
        // out of the chunk's loops into registers they need.)
        let stride_bytes = 2 * self.stride + int::zero_in(s) as usize;
        let tid = index::thread_idx();
        let (mut row, mut piece) = (tid / pieces, tid % pieces);
        let (row_step, piece_step) = (ATTN_THREADS / pieces, ATTN_THREADS % pieces);
        let mut from = (src as *const u8).add(row as usize * stride_bytes + (piece * piece_bytes) as usize);
        let mut to = dst + row * row_bytes + piece * piece_bytes;
        let from_step = row_step as usize * stride_bytes + (piece_step * piece_bytes) as usize;
        let to_step = row_step * row_bytes + piece_step * piece_bytes;
        // Into the next row: a row further on, `pieces` pieces back.
        let (from_wrap, to_wrap) = (stride_bytes - (pieces * piece_bytes) as usize, row_bytes - pieces * piece_bytes);
        while row < rows {
            if values {
                mem::cp_async_16(to, from);
            } else {
                mem::cp_async_8(to, from);
            }
            (row, piece, from, to) = (row + row_step, piece + piece_step, from.wrapping_add(from_step), to + to_step);
            if piece >= pieces {
                (row, piece, from, to) = (row + 1, piece - pieces, from.wrapping_add(from_wrap), to + to_wrap);
            }
        }
    }

    /// Waits for stage `s`'s copy (every thread its own, then the block barrier: every thread
    /// is also done with stage `s - 1`), then starts stage `s + 1`'s into the other buffer.
    #[inline(always)]
    unsafe fn next(&self, s: u32) {
        mem::cp_async_wait_all();
        sync::sync_threads();
        self.copy(s + 1);
        self.ask_l2(s + STAGES_ASKED);
    }

    /// Asks L2 for stage `s`'s rows (past the last value stage: nothing), a line a thread.
    #[inline(always)]
    unsafe fn ask_l2(&self, s: u32) {
        if s >= 2 * self.key_stages {
            return;
        }
        let (base, rows) = self.span(s);
        let stride = self.stride;
        let src = if s >= self.key_stages { self.values } else { self.keys }.add((base * stride as u32) as usize);
        let row_lines = (2 * self.hd).div_ceil(128);
        let i = index::thread_idx();
        if i < rows * row_lines {
            mem::prefetch_l2((src as *const u8).wrapping_add((i / row_lines) as usize * stride * 2 + (i % row_lines) as usize * 128));
        }
    }
}

/// Thread (set `r`, value `d`) of a chunk's value sums over one stage: keys `base .. base + rows`
/// of the chunk, their values staged `row_words` words a row.
struct ValueSum {
    smem: Smem,
    buffer: u32,
    base: u32,
    rows: u32,
    row_words: u32,
    d: u32,
    r: u32,
    sets: u32,
    heads: u32,
}

impl ValueSum {
    /// [`ValueSum::add`] for the thread's sums: `with_l`, also the terms' sum; `full_set`, all
    /// `ATTN_SET_HEADS` heads of the thread's set in the band. `HD`: the heads' values where a
    /// constant (0: `hd` read at run time).
    #[inline(always)]
    unsafe fn add_to<const W: usize, const HD: u32>(&self, with_l: bool, full_set: bool, l: &mut [f32; ATTN_SET_HEADS], o: &mut [f32; ATTN_SET_HEADS]) {
        match (with_l, full_set) {
            (true, true) => self.add::<W, true, true, HD>(l, o),
            (true, false) => self.add::<W, true, false, HD>(l, o),
            (false, true) => self.add::<W, false, true, HD>(l, o),
            (false, false) => self.add::<W, false, false, HD>(l, o),
        }
    }

    /// `o[x] = fma(p_j, v_j[d], o[x])` (and with `L`, `l[x] += p_j`) over the stage's keys in order, for
    /// head `r + x * sets` of the band (`FULL`: all `ATTN_SET_HEADS` of them, unchecked); each
    /// head's terms of 4 keys come in one 16-byte load (`base` is a multiple of 4). The shared
    /// addresses are stepped, 8 keys a turn: with `HD` a constant, every load of a turn is at a
    /// constant offset from one value address and one terms address.
    #[inline(always)]
    unsafe fn add<const W: usize, const L: bool, const FULL: bool, const HD: u32>(&self, l: &mut [f32; ATTN_SET_HEADS], o: &mut [f32; ATTN_SET_HEADS]) {
        // The run-time set count, even where `sets` is a constant: with the constant, LLVM
        // specialized the head checks further (8,392 SASS instructions in `attn_chunk` against
        // 8,264; twenty-first session).
        let has = |x: usize| x < W && (FULL || self.r + x as u32 * self.sets < self.heads);
        let (row_bytes, sets) = if HD > 0 { (2 * HD, ATTN_THREADS / HD) } else { (4 * self.row_words, self.sets) };
        // Value d of key jj, and head x's terms from key jj (`ATTN_CHUNK` words a head).
        let mut value = self.smem.addr(self.buffer) + 2 * self.d;
        let mut terms = self.smem.addr(S_WORD + self.r * ATTN_CHUNK as u32 + self.base);
        let head_bytes = 4 * sets * ATTN_CHUNK as u32;
        let mut add_key = |x: usize, p: u32, v: f32| {
            let p = f32::from_bits(p);
            if L {
                l[x] += p;
            }
            o[x] = convert::fma_rn(p, v, o[x]);
        };
        let mut jj = 0;
        while jj + 8 <= self.rows {
            let mut v = [0.0f32; 8];
            crate::unroll!(u in [0, 1, 2, 3, 4, 5, 6, 7] {
                v[u] = convert::f16_to_f32(Smem::ld_u16_at(value + u as u32 * row_bytes));
            });
            crate::unroll!(x in [0, 1, 2, 3] {
                if has(x) {
                    crate::unroll!(quad in [0, 1] {
                        let p = Smem::ld_v4_at(terms + x as u32 * head_bytes + 16 * quad as u32);
                        crate::unroll!(u in [0, 1, 2, 3] {
                            add_key(x, p[u], v[4 * quad + u]);
                        });
                    });
                }
            });
            (jj, value, terms) = (jj + 8, value + 8 * row_bytes, terms + 32);
        }
        while jj < self.rows {
            let v = convert::f16_to_f32(Smem::ld_u16_at(value));
            crate::unroll!(x in [0, 1, 2, 3] {
                if has(x) {
                    add_key(x, Smem::ld_u32_at(terms + x as u32 * head_bytes), v);
                }
            });
            (jj, value, terms) = (jj + 1, value + row_bytes, terms + 4);
        }
    }
}

/// The keys token `t` of the window at `pos0` attends to, `pos0 + t + 1`, at most the caches'
/// `n_ctx` positions.
#[inline(always)]
fn context_len(pos0: u32, t: u32, n_ctx: u32) -> u32 {
    let len = pos0 as u64 + t as u64 + 1;
    len.min(n_ctx as u64) as u32
}

crate::entry! {
    /// One block per (token `t`, query head `h`), thread `d < hd`: the token's
    /// `ceil((*pos + t + 1) / ATTN_CHUNK)` parts combined (every thread folds the maxima and `L`
    /// alike), `out[t][h * hd + d] = O / L`; with `xq` not null each warp also quantizes its 32
    /// outputs into their q8_1 block (`quantize_q8_1`'s bits).
    ///
    /// # Safety
    /// `part` as `attn_chunk` wrote it for the same `tokens, n_q, hd, pos, n_ctx`; `out`:
    /// `tokens * n_q * hd` f32; `xq`: null or `tokens * n_q * hd / 32` q8_1 blocks; `hd <=
    /// ATTN_THREADS`, a multiple of 32.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn attn_merge(part: *const f32, tokens: u32, n_q: u32, hd: u32, pos: *const u32, n_ctx: u32, out: *mut f32, xq: *mut u8) {
        crate::arch::sync::chain_grids();
        let th = index::block_idx();
        let d = index::thread_idx();
        if th >= tokens * n_q || d >= hd {
            return; // whole warps (`hd` a multiple of 32), and no barrier below
        }
        let nc = context_len(mem::ld_nc_u32(pos as *const u8), th / n_q, n_ctx).div_ceil(ATTN_CHUNK as u32);
        let n_chunks = n_ctx.div_ceil(ATTN_CHUNK as u32);
        let stride = hd as usize + 2;
        let parts = part.add(th as usize * n_chunks as usize * stride);
        let part_of = |c: u32, i: usize| mem::ld_nc_f32(parts, c as usize * stride + i);
        // A turn of the sums: lane j loads chunk c + j's maximum and sum, every thread the 32
        // chunks' values at `d` (loads only: the terms need the maximum of all parts).
        let turn = |c: u32| {
            let mine = c + index::lane();
            let ml = if mine < nc { (part_of(mine, 0), part_of(mine, 1)) } else { (0.0, 0.0) };
            let mut o = [0.0f32; MERGE_AHEAD as usize];
            crate::unroll!(i in [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31] {
                if c + (i as u32) < nc {
                    o[i] = part_of(c + i as u32, 2 + d as usize);
                }
            });
            (ml, o)
        };
        // The first turn's loads go out before the maxima's, so that their latencies overlap.
        let first = turn(0);
        // The maxima: lane j takes chunks j, j + 32, ..., `MERGE_MAX_AHEAD` loads in flight, then
        // the warp's maximum (maxima are exact, so their order is free): a context of up to 256
        // chunks is one memory latency.
        let mut big_m = f32::NEG_INFINITY;
        let mut c = index::lane();
        while c < nc {
            let mut m = [f32::NEG_INFINITY; MERGE_MAX_AHEAD as usize];
            crate::unroll!(k in [0, 1, 2, 3, 4, 5, 6, 7] {
                if c + 32 * (k as u32) < nc {
                    m[k] = part_of(c + 32 * k as u32, 0);
                }
            });
            crate::unroll!(k in [0, 1, 2, 3, 4, 5, 6, 7] {
                big_m = big_m.max(m[k]);
            });
            c += 32 * MERGE_MAX_AHEAD;
        }
        let big_m = warp::warp_max_f32(big_m);
        // The sums, in chunk order, 32 chunks a turn: lane j computes chunk c + j's terms
        // (`part_terms`) and the shuffles pass them to the warp, so the warp computes each factor
        // once instead of every lane all 32. A long context is one memory latency per 32 chunks.
        let (mut big_l, mut big_o) = (0.0f32, 0.0f32);
        let mut fold = |c: u32, ((ml, ll), o): ((f32, f32), [f32; MERGE_AHEAD as usize])| {
            let (fl, lfl) = part_terms(big_m, ml, ll);
            crate::unroll!(i in [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31] {
                if c + (i as u32) < nc {
                    // (`c + i < nc` is the warp's, so every lane takes part in the exchange.)
                    // `fold_part`'s sums, its terms from chunk c + i's lane.
                    let terms = (f32::from_bits(warp::shfl_u32(fl.to_bits(), i as u32)), f32::from_bits(warp::shfl_u32(lfl.to_bits(), i as u32)));
                    fold_terms(terms, o[i], &mut big_l, &mut big_o);
                }
            });
        };
        fold(0, first);
        let mut c = MERGE_AHEAD;
        while c < nc {
            fold(c, turn(c));
            c += MERGE_AHEAD;
        }
        store_output(out, xq, th as usize * hd as usize + d as usize, big_o / big_l);
    }
}
