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
use crate::arch::{convert, index, mem, sync, warp};
use strata_gpu_shared::formats::{q8_1, GROUP};
use strata_gpu_shared::launch::attention::{ATTN_CHUNK, ATTN_CHUNK_SMEM_WORDS, ATTN_MAX_BAND, ATTN_MAX_HD, ATTN_PREP_WARPS, ATTN_SET_HEADS, ATTN_THREADS};

// The unrolled lists below name every head of a band and of a thread's set.
const _: () = assert!(ATTN_MAX_BAND == 8 && ATTN_SET_HEADS == 4);
use strata_gpu_shared::math::exp_neg;

const WARPS: u32 = ATTN_THREADS / 32;
/// Value rows a thread of `attn_chunk` loads before adding their terms.
const ATTN_V_AHEAD: u32 = 8;
/// Chunks' parts a thread of `attn_merge` loads before folding them (the unrolled lists name 8).
const MERGE_AHEAD: u32 = 8;
/// Loads in flight per lane in the per-head norm: a 128-value head is one memory latency.
const ATTN_NORM_AHEAD: usize = 4;

#[inline(always)]
unsafe fn ld_f16(p: *const u16, i: usize) -> f32 {
    convert::f16_to_f32(mem::ld_nc_u16(p.add(i) as *const u8))
}

/// One head row and its norm weight, with the row's RMSNorm scale.
#[derive(Clone, Copy)]
struct Normed {
    x: *const f32,
    w: *const f32,
    scale: f32,
}

impl Normed {
    /// The row's RMSNorm scale (`norm::warp_rms_scale`, the norm family's spec). Every lane of
    /// the warp must call it.
    #[inline(always)]
    unsafe fn new(x: *const f32, w: *const f32, hd: u32, eps: f32) -> Normed {
        Normed { x, w, scale: super::norm::warp_rms_scale::<ATTN_NORM_AHEAD>(x, hd, eps) }
    }

    /// `y[j]`: recomputed wherever a lane needs it (its own value and its RoPE partner), the
    /// same bits each time, so no lane has to hand values to another.
    #[inline(always)]
    unsafe fn y(self, j: u32) -> f32 {
        (mem::ld_nc_f32(self.x, j as usize) * self.scale) * mem::ld_nc_f32(self.w, j as usize)
    }

    /// Output `d` after NEOX RoPE over the first `n_rot` values; `rope` is the position's
    /// (cos, sin) pairs.
    #[inline(always)]
    unsafe fn roped(self, rope: *const f32, n_rot: u32, d: u32) -> f32 {
        let half = n_rot / 2;
        if d < half {
            let (c, s) = (mem::ld_nc_f32(rope, 2 * d as usize), mem::ld_nc_f32(rope, 2 * d as usize + 1));
            self.y(d) * c - self.y(d + half) * s
        } else if d < n_rot {
            let i = d - half;
            let (c, s) = (mem::ld_nc_f32(rope, 2 * i as usize), mem::ld_nc_f32(rope, 2 * i as usize + 1));
            self.y(i) * s + self.y(d) * c
        } else {
            self.y(d)
        }
    }
}

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
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "ptx-kernel" fn attn_prep(
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
    crate::arch::sync::chain_grids();
    let heads = n_q + 2 * n_kv;
    let r = index::block_idx() * ATTN_PREP_WARPS + index::warp_in_block();
    if r >= tokens * heads {
        return; // the whole warp (the kernel has no block barrier)
    }
    let (t, h) = (r / heads, r % heads);
    let at_pos = mem::ld_nc_u32(pos as *const u8) as u64 + t as u64;
    if at_pos >= n_ctx as u64 {
        return; // the whole warp: no room in the cache (the host never asks for this)
    }
    let pos = at_pos as usize;
    let (hdu, lane) = (hd as usize, index::lane());
    if h >= n_q + n_kv {
        let g = (h - n_q - n_kv) as usize;
        let (src, dst) = (v.add(t as usize * kv_stride as usize + g * hdu), v_cache.add((pos * n_kv as usize + g) * hdu));
        let mut d = lane;
        while d < hd {
            mem::st_u16(dst.add(d as usize) as *mut u8, convert::f32_to_f16(mem::ld_nc_f32(src, d as usize)));
            d += 32;
        }
        return;
    }
    let pos_rope = rope.add(pos * n_rot as usize);
    if h < n_q {
        let at = (t as usize * n_q as usize + h as usize) * hdu;
        let row = Normed::new(q.add(t as usize * q_stride as usize + h as usize * hdu), q_norm, hd, eps);
        let mut d = lane;
        while d < hd {
            mem::st_f32(q_out.add(at + d as usize), row.roped(pos_rope, n_rot, d));
            d += 32;
        }
    } else {
        let g = (h - n_q) as usize;
        let row = Normed::new(k.add(t as usize * kv_stride as usize + g * hdu), k_norm, hd, eps);
        let dst = k_cache.add((pos * n_kv as usize + g) * hdu);
        let mut d = lane;
        while d < hd {
            mem::st_u16(dst.add(d as usize) as *mut u8, convert::f32_to_f16(row.roped(pos_rope, n_rot, d)));
            d += 32;
        }
    }
}

/// `split` blocks per (token `t`, band of `heads` consecutive query heads of one KV group),
/// block index `(t * (n_q / heads) + band) * split + s`; block `s` computes chunks `s, s + split,
/// ...` of the token's context for each of its heads, each into part `(t * n_q + h) * n_chunks
/// + c` (which block computes a chunk, and with which heads, does not change its bits). A band
/// reads each key and value of its chunks once for all its heads: with `heads` = the group's
/// query heads, the cache is read once per token instead of once per query head.
///
/// Per chunk: warp `w` scores keys `w, w + 8, ...` of the chunk for every head of the band (lane
/// `p` sums `q[p + 32 i] * k[p + 32 i]` over `i` left to right; the butterfly sums the 32
/// partials) into shared memory; each head's maximum from the warps' running maxima; thread `i`
/// turns key `i`'s scores into softmax terms; then thread `d` of set `r` (`ATTN_THREADS / hd`
/// sets) sums `p_j * v_j[d]` and `p_j` over the chunk's keys in order for heads `r, r + sets,
/// ...` of the band (the thread with `d = 0` writes each head's `m` and `l`).
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
/// `ATTN_MAX_HD`; `n_q` a multiple of `n_kv`, `heads` (at most `ATTN_MAX_BAND`) dividing
/// `n_q / n_kv` and at most `attn_max_band(hd)`; `ATTN_CHUNK_SMEM_WORDS` words of shared memory. Keys past the caches'
/// positions are never read: a token's context is clamped to them. `out`: null or `tokens *
/// n_q * hd` f32; `xq`: null or `tokens * n_q * hd / 32` q8_1 blocks (only with `out`).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn attn_chunk_band<const W: usize>(
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
    let bands = n_q / heads;
    let b = index::block_idx();
    if b >= tokens * bands * split {
        return; // the whole block
    }
    let (tb, first) = (b / split, b % split);
    let (t, h0) = (tb / bands, tb % bands * heads);
    let band = Band { t, h0, heads, g: (h0 / (n_q / n_kv)) as usize, n_q, n_kv, hd };
    let (len, n_chunks) = (context_len(pos, t, n_ctx), n_ctx.div_ceil(ATTN_CHUNK as u32));
    if !out.is_null() && len > ATTN_CHUNK as u32 {
        sync::trap(); // one part cannot be the output: the host launched this for short contexts
    }
    // The band's query rows, consecutive in `q`, into shared memory (read by every warp).
    let smem = Smem::dynamic();
    let rows = q.add((t * n_q + h0) as usize * hd as usize);
    let mut i = index::thread_idx();
    while i < heads * hd {
        smem.st_u32(Q_WORD + i, mem::ld_nc_u32(rows.add(i as usize) as *const u8));
        i += ATTN_THREADS;
    }
    let mut c = first;
    while c * (ATTN_CHUNK as u32) < len {
        sync::sync_threads(); // the queries are in; the previous chunk's readers are done
        band.chunk::<W>(smem, k_cache, v_cache, len, c, scale, Dest { part, n_chunks, out, xq });
        c += split;
    }
}

/// Declares the `attn_chunk` entries: one per widest band `W` it takes (the narrow one, for
/// one head a block, needs fewer registers and so runs more blocks per SM).
macro_rules! attn_chunk_entries {
    ($($name:ident => $w:literal),* $(,)?) => {$(
        /// `attn_chunk_band` for bands of at most `W` heads (launch bounds by name in gpu-shared).
        ///
        /// # Safety
        /// As `attn_chunk_band`, with `heads <= W`.
        #[no_mangle]
        #[allow(clippy::too_many_arguments)]
        pub unsafe extern "ptx-kernel" fn $name(
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
            crate::arch::sync::chain_grids();
            attn_chunk_band::<$w>(q, k_cache, v_cache, tokens, n_q, n_kv, hd, pos, scale, n_ctx, split, heads, part, out, xq)
        }
    )*};
}

attn_chunk_entries! { attn_chunk => 8, attn_chunk_one => 1 }

/// Shared words of the `attn_chunk` entries: the band's queries `Q[heads][hd]` from `Q_WORD`, the scores
/// then softmax terms `S[heads][ATTN_CHUNK]` from `S_WORD`, the warps' running maxima
/// `M[warp][heads]` from `M_WORD`.
const Q_WORD: u32 = 0;
const S_WORD: u32 = Q_WORD + (ATTN_MAX_BAND * ATTN_MAX_HD) as u32;
const M_WORD: u32 = S_WORD + (ATTN_MAX_BAND * ATTN_CHUNK) as u32;
const _: () = assert!(M_WORD + WARPS * ATTN_MAX_BAND as u32 <= ATTN_CHUNK_SMEM_WORDS);

/// The query heads `h0 .. h0 + heads` of token `t`, all of KV group `g`.
struct Band {
    t: u32,
    h0: u32,
    heads: u32,
    g: usize,
    n_q: u32,
    n_kv: u32,
    hd: u32,
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

/// One part `(m, l, o)` folded into `attn_merge`'s sums against the maximum `big_m` of the
/// parts: `f = exp_neg(m - big_m)`, `L += l f`, `O += o f`.
#[inline(always)]
fn fold_part(big_m: f32, (m, l, o): (f32, f32, f32), big_l: &mut f32, big_o: &mut f32) {
    let f = exp_neg(m - big_m);
    *big_l += l * f;
    *big_o += o * f;
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

impl Band {
    /// One chunk `c` of the token's `len` keys, each head's max, softmax sum and weighted values
    /// into its part slot (or, with `dest.out`, the head's outputs). The whole block calls it.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    unsafe fn chunk<const W: usize>(&self, smem: Smem, k_cache: *const u16, v_cache: *const u16, len: u32, c: u32, scale: f32, dest: Dest) {
        let start = c * ATTN_CHUNK as u32;
        let n = (len - start).min(ATTN_CHUNK as u32);
        let (hd, heads) = (self.hd, self.heads);
        let stride = self.n_kv as usize * hd as usize;
        let (lane, w, tid) = (index::lane(), index::warp_in_block(), index::thread_idx());
        let per_lane = hd / 32;
        let keys = k_cache.add(start as usize * stride + self.g * hd as usize);
        let values = v_cache.add(start as usize * stride + self.g * hd as usize);
        // The chunk's key and value rows, asked of L2 at once: the loops below then wait on L2,
        // not DRAM, for each key and value they load.
        let row_lines = (hd as usize * 2).div_ceil(128);
        let mut i = tid as usize;
        while i < n as usize * row_lines {
            let at = (i / row_lines) * stride * 2 + (i % row_lines) * 128;
            mem::prefetch_l2((keys as *const u8).wrapping_add(at));
            mem::prefetch_l2((values as *const u8).wrapping_add(at));
            i += ATTN_THREADS as usize;
        }
        // Lane h keeps the warp's running maximum of head h (one register, not one a head).
        let mut lane_max = f32::NEG_INFINITY;
        // Keys j and j + WARPS loaded together (two in flight), each scored as alone.
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
                    crate::unroll!(h in [0, 1, 2, 3, 4, 5, 6, 7] {
                        if h < W && (h as u32) < heads {
                            let mut acc = 0.0f32;
                            crate::unroll!(i in [0, 1, 2, 3, 4, 5, 6, 7] {
                                if (i as u32) < per_lane {
                                    let qv = f32::from_bits(smem.ld_u32(Q_WORD + h as u32 * hd + lane + 32 * i as u32));
                                    acc += qv * k[u][i];
                                }
                            });
                            let s = scale * warp::warp_sum_f32(acc);
                            if lane == 0 {
                                smem.st_u32(S_WORD + h as u32 * ATTN_CHUNK as u32 + ju, s.to_bits());
                            }
                            if lane == h as u32 {
                                lane_max = lane_max.max(s);
                            }
                        }
                    });
                }
            });
            j += 2 * WARPS;
        }
        if lane < heads {
            smem.st_u32(M_WORD + w * ATTN_MAX_BAND as u32 + lane, lane_max.to_bits());
        }
        sync::sync_threads();
        if tid < n {
            for h in 0..heads {
                let mut m = f32::NEG_INFINITY;
                for x in 0..WARPS {
                    m = m.max(f32::from_bits(smem.ld_u32(M_WORD + x * ATTN_MAX_BAND as u32 + h)));
                }
                let at = S_WORD + h * ATTN_CHUNK as u32 + tid;
                smem.st_u32(at, exp_neg(f32::from_bits(smem.ld_u32(at)) - m).to_bits());
            }
        }
        sync::sync_threads();
        // Thread (set r, value d): heads r, r + sets, ... of the band.
        let sets = ATTN_THREADS / hd;
        let (r, d) = (tid / hd, tid % hd);
        if r < heads {
            let values = values.add(d as usize);
            let (mut l, mut o) = ([0.0f32; ATTN_SET_HEADS], [0.0f32; ATTN_SET_HEADS]);
            // Key j's terms, added in key order; `ATTN_V_AHEAD` values loaded before their
            // terms are added keep that many loads in flight.
            let mut add = |j: u32, v: f32| {
                crate::unroll!(x in [0, 1, 2, 3] {
                    let h = r + x as u32 * sets;
                    if x < W && h < heads {
                        let p = f32::from_bits(smem.ld_u32(S_WORD + h * ATTN_CHUNK as u32 + j));
                        l[x] += p;
                        o[x] += p * v;
                    }
                });
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
            let band_max = |h: u32| {
                let mut m = f32::NEG_INFINITY;
                for x in 0..WARPS {
                    m = m.max(f32::from_bits(smem.ld_u32(M_WORD + x * ATTN_MAX_BAND as u32 + h)));
                }
                m
            };
            // Per warp: `r` and so each `h` are the warp's alone (`hd` a multiple of 32), so a
            // warp quantizes whole groups, converged.
            crate::unroll!(x in [0, 1, 2, 3] {
                let h = r + x as u32 * sets;
                if x < W && h < heads {
                    let head = self.t * self.n_q + self.h0 + h;
                    if !dest.out.is_null() {
                        let at = (head * hd + d) as usize;
                        store_output(dest.out, dest.xq, at, one_part(band_max(h), l[x], o[x]));
                    } else {
                        let out = dest.part.add(((head * dest.n_chunks + c) * (hd + 2)) as usize);
                        mem::st_f32(out.add(2 + d as usize), o[x]);
                        if d == 0 {
                            mem::st_f32(out, band_max(h));
                            mem::st_f32(out.add(1), l[x]);
                        }
                    }
                }
            });
        }
    }
}

/// The keys token `t` of the window at `*pos` attends to, `*pos + t + 1`, at most the caches'
/// `n_ctx` positions.
#[inline(always)]
unsafe fn context_len(pos: *const u32, t: u32, n_ctx: u32) -> u32 {
    let len = mem::ld_nc_u32(pos as *const u8) as u64 + t as u64 + 1;
    len.min(n_ctx as u64) as u32
}

/// One block per (token `t`, query head `h`), thread `d < hd`: the token's
/// `ceil((*pos + t + 1) / ATTN_CHUNK)` parts combined (every thread folds the maxima and `L`
/// alike), `out[t][h * hd + d] = O / L`; with `xq` not null each warp also quantizes its 32
/// outputs into their q8_1 block (`quantize_q8_1`'s bits).
///
/// # Safety
/// `part` as `attn_chunk` wrote it for the same `tokens, n_q, hd, pos, n_ctx`; `out`:
/// `tokens * n_q * hd` f32; `xq`: null or `tokens * n_q * hd / 32` q8_1 blocks; `hd <=
/// ATTN_THREADS`, a multiple of 32.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "ptx-kernel" fn attn_merge(part: *const f32, tokens: u32, n_q: u32, hd: u32, pos: *const u32, n_ctx: u32, out: *mut f32, xq: *mut u8) {
    crate::arch::sync::chain_grids();
    let th = index::block_idx();
    let d = index::thread_idx();
    if th >= tokens * n_q || d >= hd {
        return; // whole warps (`hd` a multiple of 32), and no barrier below
    }
    let nc = context_len(pos, th / n_q, n_ctx).div_ceil(ATTN_CHUNK as u32);
    let n_chunks = n_ctx.div_ceil(ATTN_CHUNK as u32);
    let stride = hd as usize + 2;
    let parts = part.add(th as usize * n_chunks as usize * stride);
    // `MERGE_AHEAD` chunks' parts are loaded before they are folded, in chunk order: a long
    // context is one memory latency per that many chunks, not per chunk.
    let part_of = |c: u32, i: usize| mem::ld_nc_f32(parts, c as usize * stride + i);
    let mut big_m = f32::NEG_INFINITY;
    let mut c = 0;
    while c < nc {
        let mut m = [f32::NEG_INFINITY; MERGE_AHEAD as usize];
        crate::unroll!(i in [0, 1, 2, 3, 4, 5, 6, 7] {
            if c + (i as u32) < nc {
                m[i] = part_of(c + i as u32, 0);
            }
        });
        crate::unroll!(i in [0, 1, 2, 3, 4, 5, 6, 7] {
            big_m = big_m.max(m[i]);
        });
        c += MERGE_AHEAD;
    }
    let (mut big_l, mut big_o) = (0.0f32, 0.0f32);
    let mut c = 0;
    while c < nc {
        let (mut m, mut l, mut o) = ([0.0f32; MERGE_AHEAD as usize], [0.0f32; MERGE_AHEAD as usize], [0.0f32; MERGE_AHEAD as usize]);
        crate::unroll!(i in [0, 1, 2, 3, 4, 5, 6, 7] {
            if c + (i as u32) < nc {
                (m[i], l[i], o[i]) = (part_of(c + i as u32, 0), part_of(c + i as u32, 1), part_of(c + i as u32, 2 + d as usize));
            }
        });
        crate::unroll!(i in [0, 1, 2, 3, 4, 5, 6, 7] {
            if c + (i as u32) < nc {
                fold_part(big_m, (m[i], l[i], o[i]), &mut big_l, &mut big_o);
            }
        });
        c += MERGE_AHEAD;
    }
    store_output(out, xq, th as usize * hd as usize + d as usize, big_o / big_l);
}
