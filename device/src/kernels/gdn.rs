//! The Gated DeltaNet layer of qwen35moe: `gdn_conv` (the causal depthwise conv step, one
//! thread per channel) and `gdn_recur` (the gated delta rule, one warp per state column). Both
//! keep their state indexed by absolute position (`*pos + t`, read from device memory so a
//! captured launch serves every step): the conv's input ring and the recurrent state's slots.
//! Spec: `strata_gpu_shared::replica::gdn` (module doc).
use crate::arch::{convert, index, mem, warp};
use strata_gpu_shared::launch::gdn::{gdn_conv_ring, GDN_CONV_THREADS, GDN_MAX_D, GDN_STATE_SLOTS, GDN_WARPS};
use strata_gpu_shared::math::{exp_neg, sigmoid, softplus};
use strata_gpu_shared::moe::silu;

/// Values of a state column (and of q̂, k̂) a lane keeps at most: `i = lane + 32 * s`.
const PER_LANE: usize = GDN_MAX_D / 32;
const _: () = assert!(PER_LANE == 8, "the unroll lists of gdn_recur name 8 slots");

crate::entry! {
    /// Thread `c` of `channels`: for each token `t` of the window, in order, at `p = *pos + t`,
    /// stores `x[t][c]` in ring row `p % R` (`R = gdn_conv_ring(d_conv)`), then writes
    /// `out[t][c] = silu(acc)`, `acc` the left-to-right sum from +0.0 of `w[c][k] * u_k` over
    /// `k < d_conv`, `u_k` the input of position `p - (d_conv - 1) + k` read back from the ring
    /// (+0.0 below position 0). Launch: `ceil(channels / GDN_CONV_THREADS)` blocks of
    /// `GDN_CONV_THREADS` threads.
    ///
    /// # Safety
    /// `x`, `out`: `tokens * channels` f32; `w`: `channels * d_conv` f32; `ring`:
    /// `gdn_conv_ring(d_conv) * channels` f32, its rows of positions `*pos - (d_conv - 1) ..
    /// *pos` holding those positions' inputs (written by earlier windows); `pos`: one u32; all
    /// 4-byte aligned, no two overlapping; `1 <= d_conv <= GDN_MAX_CONV`;
    /// `tokens <= SPEC_MAX_TOKENS`.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn gdn_conv(
        x: *const f32,
        w: *const f32,
        ring: *mut f32,
        out: *mut f32,
        pos: *const u32,
        tokens: u32,
        channels: u32,
        d_conv: u32,
    ) {
        crate::arch::sync::chain_grids();
        let c = index::block_idx() * GDN_CONV_THREADS + index::thread_idx();
        if c >= channels {
            return;
        }
        let (cu, chan) = (c as usize, channels as usize);
        let rows = gdn_conv_ring(d_conv as usize) as u32;
        let last = d_conv - 1;
        let taps = w.add(cu * d_conv as usize);
        let pos0 = mem::ld_nc_u32(pos as *const u8);
        for t in 0..tokens {
            let p = pos0 + t;
            let at = t as usize * chan + cu;
            mem::st_f32(ring.add((p % rows) as usize * chan + cu), mem::ld_nc_f32(x, at));
            let mut acc = 0.0f32;
            for k in 0..d_conv {
                // Position `p - last + k`; the ring is read coherently: the rows of this window's
                // positions were written by this thread earlier in the loop (k = last is the store
                // just above).
                let u = if p + k >= last { mem::ld_f32(ring, ((p + k - last) % rows) as usize * chan + cu) } else { 0.0 };
                // Multiplied even when `u` is the +0.0 of a position below 0, as the spec does (a
                // non-finite tap would give NaN there).
                acc += mem::ld_nc_f32(taps, k as usize) * u;
            }
            mem::st_f32(out.add(at), silu(acc));
        }
    }
}

/// `1 / max(sqrt_rn(sum), eps)`, the max taken as `if s > eps { s } else { eps }` (a NaN norm
/// gives `1 / eps`, as the replica).
#[inline(always)]
fn l2_recip(sum: f32, eps: f32) -> f32 {
    let s = convert::sqrt_rn(sum);
    1.0 / if s > eps { s } else { eps }
}

crate::entry! {
    /// Warp `w = h * d + j` (value head `h`, value dimension `j`): column `j` of head `h`'s state
    /// through the window's tokens. Lane `l` keeps `S[i][j]`, `q̂[i]`, `k̂[i]` for
    /// `i = l, l + 32, ...` in registers. The column starts as slot `(*pos - 1) % GDN_STATE_SLOTS`
    /// (+0.0 when `*pos == 0`); per token `t` at `p = *pos + t`: the L2 norms of key head
    /// `h % n_k`'s q and k, the gates, `S *= decay`, `delta = (v[j] - S.k̂) * b`,
    /// `S += k̂ * delta`, `out[t][h * d + j] = (S.q̂) * scale`, and the column stored to slot
    /// `p % GDN_STATE_SLOTS` (the 32 lanes write consecutive words). Every dot product is a
    /// `lane_sum`. Launch: `ceil(n_v * d / GDN_WARPS)` blocks of `32 * GDN_WARPS` threads.
    ///
    /// # Safety
    /// `conv`: `tokens * (2 * n_k + n_v) * d` f32; `alpha`, `beta`: `tokens * n_v` f32; `dt_bias`,
    /// `a`: `n_v` f32; `state`: `GDN_STATE_SLOTS * n_v * d * d` f32, the slot of position
    /// `*pos - 1` written by an earlier launch when `*pos > 0`; `out`: `tokens * n_v * d` f32;
    /// `pos`: one u32; all 4-byte aligned, no two overlapping; `d` a multiple of 32, at most
    /// `GDN_MAX_D`; `1 <= n_k`; `tokens <= SPEC_MAX_TOKENS` (so no slot this launch writes is the
    /// one it reads).
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn gdn_recur(
        conv: *const f32,
        alpha: *const f32,
        beta: *const f32,
        dt_bias: *const f32,
        a: *const f32,
        state: *mut f32,
        out: *mut f32,
        pos: *const u32,
        tokens: u32,
        n_k: u32,
        n_v: u32,
        d: u32,
        eps: f32,
        scale: f32,
    ) {
        crate::arch::sync::chain_grids();
        let wi = index::block_idx() * GDN_WARPS + index::warp_in_block();
        if wi >= n_v * d {
            return; // the whole warp (the kernel has no block barrier)
        }
        let (h, j) = (wi / d, wi % d);
        let (hu, ju, du, nvu, nku) = (h as usize, j as usize, d as usize, n_v as usize, n_k as usize);
        let kh = (h % n_k) as usize;
        let (lane, per) = (index::lane(), d / 32);
        let row_len = (2 * nku + nvu) * du;
        // Lane's first value of column `j` of head `h` in a slot; its values are 32 words apart.
        let column = |slot: u32| state.add(((slot as usize * nvu + hu) * du + ju) * du + lane as usize);
        let pos0 = mem::ld_nc_u32(pos as *const u8);

        let mut s = [0.0f32; PER_LANE];
        if pos0 > 0 {
            // Coherent: other warps of this launch write other slots of the same buffer.
            let src = column((pos0 - 1) % GDN_STATE_SLOTS as u32);
            crate::unroll!(i in [0, 1, 2, 3, 4, 5, 6, 7] {
                if (i as u32) < per {
                    s[i] = mem::ld_f32(src, 32 * i);
                }
            });
        }
        let (dtb, ah) = (mem::ld_nc_f32(dt_bias, hu), mem::ld_nc_f32(a, hu));

        for t in 0..tokens {
            let p = pos0 + t;
            let row = conv.add(t as usize * row_len);
            let (qp, kp) = (row.add(kh * du + lane as usize), row.add((nku + kh) * du + lane as usize));
            // Step 1: q and k of key head `kh`, their lane sums of squares, then the L2 scales.
            let (mut qh, mut kk) = ([0.0f32; PER_LANE], [0.0f32; PER_LANE]);
            let (mut sq, mut sk) = (0.0f32, 0.0f32);
            crate::unroll!(i in [0, 1, 2, 3, 4, 5, 6, 7] {
                if (i as u32) < per {
                    (qh[i], kk[i]) = (mem::ld_nc_f32(qp, 32 * i), mem::ld_nc_f32(kp, 32 * i));
                    sq += qh[i] * qh[i];
                    sk += kk[i] * kk[i];
                }
            });
            let (rq, rk) = (l2_recip(warp::warp_sum_f32(sq), eps), l2_recip(warp::warp_sum_f32(sk), eps));
            crate::unroll!(i in [0, 1, 2, 3, 4, 5, 6, 7] {
                if (i as u32) < per {
                    (qh[i], kk[i]) = (qh[i] * rq, kk[i] * rk);
                }
            });
            // Step 2: the gates (the same bits in every lane).
            let g = t as usize * nvu + hu;
            let b = sigmoid(mem::ld_nc_f32(beta, g));
            let decay = exp_neg(softplus(mem::ld_nc_f32(alpha, g) + dtb) * ah);
            // Steps 3-4: decay, then `kv` (each value decays on its own, so the lane's sum may run
            // alongside).
            let mut kv = 0.0f32;
            crate::unroll!(i in [0, 1, 2, 3, 4, 5, 6, 7] {
                if (i as u32) < per {
                    s[i] = s[i] * decay;
                    kv += s[i] * kk[i];
                }
            });
            let kv = warp::warp_sum_f32(kv);
            let delta = (mem::ld_nc_f32(row, (2 * nku + hu) * du + ju) - kv) * b;
            // Steps 5-7: the update, the output's lane sum, and the column into this position's
            // slot.
            let dst = column(p % GDN_STATE_SLOTS as u32);
            let mut o = 0.0f32;
            crate::unroll!(i in [0, 1, 2, 3, 4, 5, 6, 7] {
                if (i as u32) < per {
                    s[i] = s[i] + kk[i] * delta;
                    o += s[i] * qh[i];
                    mem::st_f32(dst.add(32 * i), s[i]);
                }
            });
            let o = warp::warp_sum_f32(o) * scale;
            if lane == 0 {
                mem::st_f32(out.add(t as usize * nvu * du + hu * du + ju), o);
            }
        }
    }
}
