// Attention of the decode step: attn_prep (per-head RMSNorm + RoPE, KV append as fp16),
// attn_chunk (blocks per token and band of a KV group's query heads walking
// STRATA_ATTN_CHUNK-key chunks) and
// attn_merge (the chunks combined). The window's first position is read from *pos. Twin of
// device/src/kernels/attention.rs; spec in gpu-shared/src/replica/attention.rs. Every name here
// is attn_-prefixed: all .hip sources
// share one translation unit.
#include "strata_hip.h"
#include "quantize_q8_1.hip"

#define ATTN_WARPS (STRATA_ATTN_THREADS / 32)
// Values of a head row a lane holds, d = lane + 32 i for i < ATTN_LANE_VALUES: every hd up to
// STRATA_ATTN_MAX_HD in one round of loads.
#define ATTN_LANE_VALUES (STRATA_ATTN_MAX_HD / 32)

STRATA_FN float attn_ld_f32(const float* p, uint64_t i) { return __builtin_bit_cast(float, ld_nc_u32((const uint8_t*)(p + i))); }
STRATA_FN float attn_ld_f16(const uint16_t* p, uint64_t i) { return f16_to_f32(ld_nc_u16((const uint8_t*)(p + i))); }
STRATA_FN float attn_neg_inf() { return __builtin_bit_cast(float, 0xff800000u); }

// The value output d of a head row is roped with (NEOX pairing, half = n_rot / 2); its (cos, sin)
// pair's index into *pair: d + half and d below half, d - half twice up to n_rot, d itself (pair
// 0, unused) past the rotated values.
STRATA_FN uint32_t attn_rope_partner(uint32_t d, uint32_t half, uint32_t n_rot, uint32_t* pair) {
  if (d < half) {
    *pair = d;
    return d + half;
  }
  *pair = d < n_rot ? d - half : 0;
  return d < n_rot ? d - half : d;
}

// Output d of a normed head row after RoPE (the spec's expressions, each product rounded): y and
// y_partner its value and its partner's after the norm, (c, s) their pair.
STRATA_FN float attn_roped(uint32_t d, uint32_t half, uint32_t n_rot, float y, float y_partner, float c, float s) {
  if (d < half) return y * c - y_partner * s;
  if (d < n_rot) return y_partner * s + y * c;
  return y;
}

// A lane's constants of one normed head row at one position (the Rust twin's RowConsts): the norm
// weights of its values and of their RoPE partners, and their (cos, sin) pairs; zeros where
// unused (attn_no_consts).
struct AttnRowConsts {
  float w[ATTN_LANE_VALUES], w_partner[ATTN_LANE_VALUES], c[ATTN_LANE_VALUES], s[ATTN_LANE_VALUES];
};

STRATA_FN AttnRowConsts attn_no_consts() {
  AttnRowConsts k;
#pragma unroll
  for (uint32_t i = 0; i < ATTN_LANE_VALUES; i++) k.w[i] = k.w_partner[i] = k.c[i] = k.s[i] = 0.0f;
  return k;
}

// The constants of a row normed by norm (hd f32) and roped at the position whose n_rot table
// values start at pos_rope.
STRATA_FN AttnRowConsts attn_row_consts(const float* norm, const float* pos_rope, uint32_t hd, uint32_t n_rot) {
  AttnRowConsts k;
#pragma unroll
  for (uint32_t i = 0; i < ATTN_LANE_VALUES; i++) {
    uint32_t d = lane() + 32 * i, pair;
    uint32_t p = attn_rope_partner(d, n_rot / 2, n_rot, &pair);
    bool own = d < hd, roped = own && d < n_rot;
    k.w[i] = own ? attn_ld_f32(norm, d) : 0.0f;
    k.w_partner[i] = roped ? attn_ld_f32(norm, p) : 0.0f;
    k.c[i] = roped ? attn_ld_f32(pos_rope, 2 * pair) : 0.0f;
    k.s[i] = roped ? attn_ld_f32(pos_rope, 2 * pair + 1) : 0.0f;
  }
  return k;
}

// A lane's values of the head row at src and, where normed, their RoPE partners, in one round of
// loads (zeros where unused).
STRATA_FN void attn_load_row(const float* src, uint32_t hd, uint32_t n_rot, bool normed, float* x, float* x_partner) {
#pragma unroll
  for (uint32_t i = 0; i < ATTN_LANE_VALUES; i++) {
    uint32_t d = lane() + 32 * i, pair;
    uint32_t p = attn_rope_partner(d, n_rot / 2, n_rot, &pair);
    bool own = d < hd;
    x[i] = own ? attn_ld_f32(src, d) : 0.0f;
    x_partner[i] = own && normed && d < n_rot ? attn_ld_f32(src, p) : 0.0f;
  }
}

// The lane's outputs y of a head row (attn_load_row) after the per-head RMSNorm (the norm family's
// order: the lane's squares left to right, then the warp's) and RoPE. The whole warp calls it.
STRATA_FN void attn_norm_rope_row(const float* x, const float* x_partner, const AttnRowConsts& k, uint32_t hd, uint32_t n_rot, float eps, float* y) {
  float partial = 0.0f;
#pragma unroll
  for (uint32_t i = 0; i < ATTN_LANE_VALUES; i++)
    if (lane() + 32 * i < hd) partial = partial + x[i] * x[i];
  float scale = warp_rms_scale_from(partial, hd, eps);
#pragma unroll
  for (uint32_t i = 0; i < ATTN_LANE_VALUES; i++)
    y[i] = attn_roped(lane() + 32 * i, n_rot / 2, n_rot, (x[i] * scale) * k.w[i], (x_partner[i] * scale) * k.w_partner[i], k.c[i], k.s[i]);
}

// The lane's values of a head row rounded to fp16 (a cache row at dst).
STRATA_FN void attn_store_f16_row(uint16_t* dst, uint32_t hd, const float* y) {
#pragma unroll
  for (uint32_t i = 0; i < ATTN_LANE_VALUES; i++)
    if (lane() + 32 * i < hd) dst[lane() + 32 * i] = f32_to_f16(y[i]);
}

// Token t's q rows start at q + t * q_stride, its k and v rows at k, v + t * kv_stride: views
// into one buffer of fused projection rows, or packed rows. A lane holds its values of the row
// and their RoPE partners, loaded in one round before any store (a store may alias the row).
STRATA_KERNEL(attn_prep)(const float* q, const float* k, const float* v, const float* q_norm, const float* k_norm, const float* rope,
                         uint32_t tokens, uint32_t n_q, uint32_t n_kv, uint32_t hd, uint32_t n_rot, uint32_t q_stride, uint32_t kv_stride, const uint32_t* pos,
                         uint32_t n_ctx, float eps, float* q_out, uint16_t* k_cache, uint16_t* v_cache) {
  uint32_t heads = n_q + 2 * n_kv;
  uint32_t r = block_idx() * STRATA_ATTN_PREP_WARPS + warp_in_block();
  if (r >= tokens * heads) return;  // the whole warp (the kernel has no block barrier)
  uint32_t t = r / heads, h = r % heads;
  uint64_t at = (uint64_t)ld_nc_u32((const uint8_t*)pos) + t;
  if (at >= n_ctx) return;  // the whole warp: no room in the cache (the host never asks for this)
  bool normed = h < n_q + n_kv;
  const float* src = h < n_q ? q + (uint64_t)t * q_stride + (uint64_t)h * hd
                             : (normed ? k + (uint64_t)t * kv_stride + (uint64_t)(h - n_q) * hd
                                       : v + (uint64_t)t * kv_stride + (uint64_t)(h - n_q - n_kv) * hd);
  AttnRowConsts consts = normed ? attn_row_consts(h < n_q ? q_norm : k_norm, rope + at * n_rot, hd, n_rot) : attn_no_consts();
  float x[ATTN_LANE_VALUES], x_partner[ATTN_LANE_VALUES], y[ATTN_LANE_VALUES];
  attn_load_row(src, hd, n_rot, normed, x, x_partner);
  if (!normed) {
    attn_store_f16_row(v_cache + (at * n_kv + (h - n_q - n_kv)) * hd, hd, x);
    return;
  }
  attn_norm_rope_row(x, x_partner, consts, hd, n_rot, eps, y);
  // Query rows into q_out, key rows into the cache.
  if (h < n_q) {
#pragma unroll
    for (uint32_t i = 0; i < ATTN_LANE_VALUES; i++)
      if (lane() + 32 * i < hd) q_out[((uint64_t)t * n_q + h) * hd + lane() + 32 * i] = y[i];
  } else {
    attn_store_f16_row(k_cache + (at * n_kv + (h - n_q)) * hd, hd, y);
  }
}

// The keys token t of the window at *pos attends to, *pos + t + 1, at most the caches' n_ctx
// positions.
STRATA_FN uint32_t attn_context_len(const uint32_t* pos, uint32_t t, uint32_t n_ctx) {
  uint64_t len = (uint64_t)ld_nc_u32((const uint8_t*)pos) + t + 1;
  return (uint32_t)(len < n_ctx ? len : n_ctx);
}

STRATA_FN uint32_t attn_n_chunks(uint32_t n_ctx) { return (n_ctx + STRATA_ATTN_CHUNK - 1) / STRATA_ATTN_CHUNK; }

// Shared words of attn_chunk (the Rust twin's layout): the band's queries from ATTN_Q_WORD, value
// d = p + 32 i of head h at h * hd + (hd / 32) p + i; the scores then softmax terms
// S[heads][STRATA_ATTN_CHUNK]; the warps' maxima M[heads][warp]; the two stage buffers,
// STRATA_ATTN_STAGE_WORDS each (attn_key_stage(hd) fp16 rows of hd / 2 + 2 words for keys, hd / 2
// for values).
#define ATTN_Q_WORD 0u
#define ATTN_S_WORD (ATTN_Q_WORD + STRATA_ATTN_Q_WORDS)
#define ATTN_M_WORD (ATTN_S_WORD + STRATA_ATTN_MAX_BAND * STRATA_ATTN_CHUNK)
#define ATTN_K_WORD (ATTN_M_WORD + ATTN_WARPS * STRATA_ATTN_MAX_BAND)
// The most heads of a band one thread sums values for (attn_max_band in gpu-shared).
#define ATTN_SET_HEADS 4
// Value rows an attn_chunk_one thread loads before adding their terms.
#define ATTN_V_AHEAD 8
// Chunks' parts a merge thread loads before folding them.
#define ATTN_MERGE_AHEAD 8

STRATA_FN float attn_smem_f32(uint32_t word) { return __builtin_bit_cast(float, strata_smem[word]); }

STRATA_FN uint32_t attn_q_word(uint32_t h, uint32_t d, uint32_t hd) { return ATTN_Q_WORD + h * hd + hd / 32 * (d % 32) + d / 32; }

// Keys staged (and scored) at a time for heads of hd values (gpu-shared attn_key_stage).
STRATA_FN uint32_t attn_key_stage(uint32_t hd) { return 64 * (hd / 2 + 2) <= STRATA_ATTN_STAGE_WORDS ? 64 : 32; }

// Head h's maximum over the chunk's scores: the warps' maxima folded.
STRATA_FN float attn_head_max(uint32_t h) {
  float m = attn_neg_inf();
  for (uint32_t x = 0; x < ATTN_WARPS; x++) m = max_f32(m, attn_smem_f32(ATTN_M_WORD + h * ATTN_WARPS + x));
  return m;
}

// attn_merge's output value from one part (m, l, o): its fold for a context of one chunk.
STRATA_FN float attn_one_part(float m, float l, float o) {
  float big_m = max_f32(attn_neg_inf(), m);
  float f = exp_neg(m - big_m);
  return (0.0f + o * f) / (0.0f + l * f);
}

// Output value `at` of the attention rows, and with xq its warp's 32 values quantized into q8_1
// block at / 32. The whole warp calls it.
STRATA_FN void attn_store_output(float* out, uint8_t* xq, uint64_t at, float v) {
  out[at] = v;
  if (xq != nullptr) quantize_group(v, xq + at / STRATA_GROUP * STRATA_Q8_1_BYTES);
}

// A chunk's key and value rows of one KV group (n keys, stride values apart).
struct AttnChunkRows {
  const uint16_t* keys;
  const uint16_t* values;
  uint32_t n;
  uint64_t stride;
};

// Chunk c of a token's len keys in KV group g: its rows, asked of L2 at once (the loops then
// wait on L2, not DRAM). The whole block calls it.
STRATA_FN AttnChunkRows attn_chunk_rows(const uint16_t* k_cache, const uint16_t* v_cache, uint32_t n_kv, uint32_t hd, uint64_t g, uint32_t len, uint32_t c) {
  uint32_t start = c * STRATA_ATTN_CHUNK;
  uint32_t n = len - start < STRATA_ATTN_CHUNK ? len - start : STRATA_ATTN_CHUNK;
  uint64_t stride = (uint64_t)n_kv * hd;
  AttnChunkRows rows{k_cache + start * stride + g * hd, v_cache + start * stride + g * hd, n, stride};
  uint32_t row_lines = (hd * 2 + 127) / 128;
  for (uint32_t i = thread_idx(); i < n * row_lines; i += STRATA_ATTN_THREADS) {
    uint64_t at = (uint64_t)(i / row_lines) * stride * 2 + (i % row_lines) * 128;
    prefetch_l2((const uint8_t*)rows.keys + at);
    prefetch_l2((const uint8_t*)rows.values + at);
  }
  return rows;
}

// Value d of query head `head` (band head h) from its sums (l, o) over chunk c: the output (the
// context is this one chunk; with xq also its q8_1 block, so the whole warp calls it) or the
// part slot (d = 0 writes m and l).
STRATA_FN void attn_finish(uint64_t head, uint32_t h, uint32_t hd, uint32_t d, float l, float o, uint32_t c, float* part, uint32_t n_chunks, float* out,
                           uint8_t* xq) {
  if (out != nullptr) {
    attn_store_output(out, xq, head * hd + d, attn_one_part(attn_head_max(h), l, o));
  } else {
    float* pt = part + (head * n_chunks + c) * (hd + 2);
    pt[2 + d] = o;
    if (d == 0) {
      pt[0] = attn_head_max(h);
      pt[1] = l;
    }
  }
}

// A chunk's stages (the Rust twin's Stages): its n keys then its n values, kps rows a stage, stage
// s in buffer s % 2; key rows hd / 2 + 2 words, value rows hd / 2. The Rust kernel copies a stage
// asynchronously (cp.async) while the block works on the one before; here the copy is plain loads
// and stores (AMD has no such copy), with the same buffers and barriers.
struct AttnStages {
  const uint16_t* keys;
  const uint16_t* values;
  uint64_t stride;
  uint32_t n, hd, kps;
};

STRATA_FN uint32_t attn_stage_buffer(uint32_t s) { return ATTN_K_WORD + s % 2 * STRATA_ATTN_STAGE_WORDS; }

// Stage s into its buffer (past the last value stage: nothing). The whole block calls it.
STRATA_FN void attn_stage_copy(const AttnStages& st, uint32_t s) {
  uint32_t key_stages = (st.n + st.kps - 1) / st.kps;
  if (s >= 2 * key_stages) return;
  bool values = s >= key_stages;
  uint32_t base = (values ? s - key_stages : s) * st.kps;
  uint32_t rows = st.n - base < st.kps ? st.n - base : st.kps;
  const uint16_t* src = (values ? st.values : st.keys) + (uint64_t)base * st.stride;
  uint32_t row_words = values ? st.hd / 2 : st.hd / 2 + 2, words = st.hd / 2;
  for (uint32_t i = thread_idx(); i < rows * words; i += STRATA_ATTN_THREADS) {
    uint32_t row = i / words, w = i % words;
    strata_smem[attn_stage_buffer(s) + row * row_words + w] = *(const uint32_t*)(src + (uint64_t)row * st.stride + 2 * w);
  }
}

// Stage s is in (and every thread is done with stage s - 1); then stage s + 1 into the other
// buffer.
STRATA_FN void attn_stage_next(const AttnStages& st, uint32_t s) {
  sync_threads();
  attn_stage_copy(st, s + 1);
}

// On AMD the scoring is a call: its four variants inlined into the chunk spilled SGPRs on
// gfx1201.
#if STRATA_AMD
#define ATTN_SCORE_FN static __device__ __attribute__((noinline))
#else
#define ATTN_SCORE_FN STRATA_FN
#endif

// The scores scale * dot_j of a stage's keys base .. base + rows (in the stage buffer at word
// buffer) for the band's heads into S[h][j]. Thread (slot, r, half) takes key r's lane partials
// p = half (mod 2) for heads slot, slot + tpk, ... (at most HW; tpk = threads / (2 kps)): its lane
// partials (PL = hd / 32 products each, left to right from +0.0) in its half of the butterfly's
// tree ((n8(half) + n8(half + 4)) + (n8(half + 2) + n8(half + 6)): gpu-shared
// order::butterfly_half_tree), then one exchange with its pair and the tree's last addition
// (even + odd, the same bits in both). A warp's 16 keys are scored together (the exchange needs
// the whole warp). EXACT: PL is hd / 32; else hd / 32 <= PL is checked per product.
template <uint32_t HW, uint32_t PL, bool EXACT>
ATTN_SCORE_FN void attn_score(uint32_t buffer, uint32_t base, uint32_t rows, uint32_t hd, uint32_t heads, float scale) {
  uint32_t per_lane = hd / 32, kps = attn_key_stage(hd), tpk = STRATA_ATTN_THREADS / (2 * kps);
  uint32_t tid = thread_idx(), half = tid % 2, r = tid / 2 % kps, slot = tid / (2 * kps);
  if ((r & ~15u) >= rows) return;  // the whole warp
  const uint16_t* halves = (const uint16_t*)strata_smem;
  uint32_t key = 2 * (buffer + r * (hd / 2 + 2));
  auto leaf = [&](uint32_t p, float* acc) {
    float k[PL];
#pragma unroll
    for (uint32_t i = 0; i < PL; i++) k[i] = EXACT || i < per_lane ? f16_to_f32(halves[key + p + 32 * i]) : 0.0f;
#pragma unroll
    for (uint32_t x = 0; x < HW; x++) {
      acc[x] = 0.0f;
      uint32_t h = slot + tpk * x;
      if (h < heads) {
#pragma unroll
        for (uint32_t i = 0; i < PL; i++)
          if (EXACT || i < per_lane) acc[x] = fma_f32(attn_smem_f32(attn_q_word(h, p, hd) + i), k[i], acc[x]);
      }
    }
  };
  // n8(p) = (leaf(p) + leaf(p + 16)) + (leaf(p + 8) + leaf(p + 24)) into v.
  auto n8 = [&](uint32_t p, float* v) {
    float a[HW], b[HW], c[HW], d[HW];
    leaf(p, a);
    leaf(p + 16, b);
    leaf(p + 8, c);
    leaf(p + 24, d);
#pragma unroll
    for (uint32_t x = 0; x < HW; x++) v[x] = (a[x] + b[x]) + (c[x] + d[x]);
  };
  float a[HW], b[HW], c[HW], d[HW];
  n8(half, a);
  n8(half + 4, b);
  n8(half + 2, c);
  n8(half + 6, d);
#pragma unroll
  for (uint32_t x = 0; x < HW; x++) {
    float mine = (a[x] + b[x]) + (c[x] + d[x]);
    float dot = mine + shfl_xor_f32(mine, 1);
    uint32_t h = slot + tpk * x;
    if (half == 0 && r < rows && h < heads) strata_smem[ATTN_S_WORD + h * STRATA_ATTN_CHUNK + base + r] = __builtin_bit_cast(uint32_t, scale * dot);
  }
}

// Thread (set r, value d) of a chunk's value sums over one stage: keys base .. base + rows of the
// chunk, their values in the stage buffer at word buffer, row_words words a row. o[x] = fma(p_j,
// v_j[d], o[x]) (and with L, l[x] += p_j) in key order, for head r + x * sets of the band.
template <uint32_t W, bool L>
STRATA_FN void attn_sum_values(uint32_t buffer, uint32_t base, uint32_t rows, uint32_t row_words, uint32_t d, uint32_t r, uint32_t sets, uint32_t heads, float* l,
                               float* o) {
  const uint16_t* halves = (const uint16_t*)strata_smem;
  for (uint32_t jj = 0; jj < rows; jj++) {
    float v = f16_to_f32(halves[2 * (buffer + jj * row_words) + d]);
#pragma unroll
    for (uint32_t x = 0; x < ATTN_SET_HEADS; x++) {
      uint32_t h = r + x * sets;
      if (x < W && h < heads) {
        float p = attn_smem_f32(ATTN_S_WORD + h * STRATA_ATTN_CHUNK + base + jj);
        if (L) l[x] = l[x] + p;
        o[x] = fma_f32(p, v, o[x]);
      }
    }
  }
}

// Chunk c of token t's len keys for the band's heads h0 .. h0 + heads of KV group g (queries in
// shared memory): the scores (attn_score), each head's maximum (warp w folds keys 32 w ..), thread
// i turns key i's scores into softmax terms, thread d of set r sums p_j * v_j[d] and p_j in key
// order for heads r, r + sets, ... With out not null the context is this one chunk: the heads'
// outputs (and with xq their q8_1 blocks) instead of parts. The whole block calls it.
template <uint32_t W, uint32_t HW>
STRATA_FN void attn_one_chunk(const uint16_t* k_cache, const uint16_t* v_cache, uint32_t t, uint32_t h0, uint32_t heads, uint32_t n_q, uint32_t n_kv,
                              uint32_t hd, uint64_t g, uint32_t len, uint32_t c, float scale, float* part, uint32_t n_chunks,
                              float* out, uint8_t* xq) {
  AttnChunkRows rows = attn_chunk_rows(k_cache, v_cache, n_kv, hd, g, len, c);
  uint32_t n = rows.n, tid = thread_idx();
  AttnStages st{rows.keys, rows.values, rows.stride, n, hd, attn_key_stage(hd)};
  uint32_t key_stages = (n + st.kps - 1) / st.kps;
  attn_stage_copy(st, 0);
  for (uint32_t s = 0; s < key_stages; s++) {
    attn_stage_next(st, s);
    // Heads of more than 128 values come in bands of at most 4 over 4 head slots a key: one
    // head a thread.
    uint32_t base = s * st.kps, buf = attn_stage_buffer(s), srows = n - base < st.kps ? n - base : st.kps;
    if (hd == 128) attn_score<HW, 4, true>(buf, base, srows, hd, heads, scale);
    else if (hd <= 128) attn_score<HW, 4, false>(buf, base, srows, hd, heads, scale);
    else if (hd == 256) attn_score<1, 8, true>(buf, base, srows, hd, heads, scale);
    else attn_score<1, 8, false>(buf, base, srows, hd, heads, scale);
  }
  sync_threads();  // the scores are in
  uint32_t l = lane(), w = warp_in_block();
  for (uint32_t h = 0; h < heads; h++) {
    float s = tid < n ? attn_smem_f32(ATTN_S_WORD + h * STRATA_ATTN_CHUNK + tid) : attn_neg_inf();
    float m = warp_max_f32(s);
    if (l == 0) strata_smem[ATTN_M_WORD + h * ATTN_WARPS + w] = __builtin_bit_cast(uint32_t, m);
  }
  sync_threads();
  if (tid < n) {
    for (uint32_t h = 0; h < heads; h++) {
      uint32_t at = ATTN_S_WORD + h * STRATA_ATTN_CHUNK + tid;
      strata_smem[at] = __builtin_bit_cast(uint32_t, exp_neg(attn_smem_f32(at) - attn_head_max(h)));
    }
  }
  // Thread (set r, value d): heads r, r + sets, ... of the band; a partial set (hd not dividing
  // the block) has none. The values are staged like the keys, unpadded. The sums of the terms
  // are needed where a thread folds its own output (one chunk) or writes a part's l (d = 0):
  // whole warps, as hd is a multiple of 32.
  uint32_t sets = STRATA_ATTN_THREADS / hd, r = tid / hd, d = tid % hd;
  bool active = r < sets && r < heads, with_l = out != nullptr || d < 32;
  float lsum[ATTN_SET_HEADS], o[ATTN_SET_HEADS];
#pragma unroll
  for (uint32_t x = 0; x < ATTN_SET_HEADS; x++) lsum[x] = o[x] = 0.0f;
  for (uint32_t s = key_stages; s < 2 * key_stages; s++) {
    attn_stage_next(st, s);  // also: the softmax terms are in
    if (active) {
      uint32_t base = (s - key_stages) * st.kps, buf = attn_stage_buffer(s), srows = n - base < st.kps ? n - base : st.kps;
      if (with_l) attn_sum_values<W, true>(buf, base, srows, hd / 2, d, r, sets, heads, lsum, o);
      else attn_sum_values<W, false>(buf, base, srows, hd / 2, d, r, sets, heads, lsum, o);
    }
  }
  if (!active) return;
#pragma unroll
  for (uint32_t x = 0; x < ATTN_SET_HEADS; x++) {
    uint32_t h = r + x * sets;
    if (x < W && h < heads) attn_finish((uint64_t)t * n_q + h0 + h, h, hd, d, lsum[x], o[x], c, part, n_chunks, out, xq);
  }
}

// One chunk for a band of one head (attn_chunk_one, for groups with no band above one): warp w
// scores keys w, w + 8, ..., two in flight (lane p sums q[p + 32 i] * k[p + 32 i] over i left to
// right, the warp butterfly the 32 partials); thread i turns key i's score into its softmax term;
// thread d < hd sums p_j * v_j[d] and p_j over the keys in order, ATTN_V_AHEAD values loaded
// before their terms are added. The query is in shared memory as a row (ATTN_Q_WORD + d).
STRATA_FN void attn_one_chunk_one_head(const uint16_t* k_cache, const uint16_t* v_cache, uint32_t t, uint32_t h0, uint32_t n_q, uint32_t n_kv,
                                       uint32_t hd, uint64_t g, uint32_t len, uint32_t c, float scale, float* part, uint32_t n_chunks,
                                       float* out, uint8_t* xq) {
  AttnChunkRows rows = attn_chunk_rows(k_cache, v_cache, n_kv, hd, g, len, c);
  const uint16_t *keys = rows.keys, *values = rows.values;
  uint32_t n = rows.n, l = lane(), w = warp_in_block(), tid = thread_idx(), per_lane = hd / 32;
  uint64_t stride = rows.stride;
  float warp_max = attn_neg_inf();
  for (uint32_t j = w; j < n; j += 2 * ATTN_WARPS) {
    float k[2][STRATA_ATTN_MAX_HD / 32];
#pragma unroll
    for (uint32_t u = 0; u < 2; u++) {
      const uint16_t* key = keys + (uint64_t)(j + u * ATTN_WARPS) * stride;
#pragma unroll
      for (uint32_t i = 0; i < STRATA_ATTN_MAX_HD / 32; i++) k[u][i] = i < per_lane && j + u * ATTN_WARPS < n ? attn_ld_f16(key, l + 32 * i) : 0.0f;
    }
#pragma unroll
    for (uint32_t u = 0; u < 2; u++) {
      uint32_t ju = j + u * ATTN_WARPS;
      if (ju >= n) continue;
      float acc = 0.0f;
#pragma unroll
      for (uint32_t i = 0; i < STRATA_ATTN_MAX_HD / 32; i++)
        if (i < per_lane) acc = fma_f32(attn_smem_f32(ATTN_Q_WORD + l + 32 * i), k[u][i], acc);
      float s = scale * warp_sum_f32(acc);
      if (l == 0) strata_smem[ATTN_S_WORD + ju] = __builtin_bit_cast(uint32_t, s);
      warp_max = max_f32(warp_max, s);
    }
  }
  if (l == 0) strata_smem[ATTN_M_WORD + w] = __builtin_bit_cast(uint32_t, warp_max);
  sync_threads();
  if (tid < n) strata_smem[ATTN_S_WORD + tid] = __builtin_bit_cast(uint32_t, exp_neg(attn_smem_f32(ATTN_S_WORD + tid) - attn_head_max(0)));
  sync_threads();
  if (tid >= hd) return;
  const uint16_t* vd = values + tid;
  float lsum = 0.0f, o = 0.0f;
  auto add = [&](uint32_t j, float v) {
    float p = attn_smem_f32(ATTN_S_WORD + j);
    lsum = lsum + p;
    o = fma_f32(p, v, o);
  };
  uint32_t j = 0;
  for (; j + ATTN_V_AHEAD <= n; j += ATTN_V_AHEAD) {
    float v[ATTN_V_AHEAD];
#pragma unroll
    for (uint32_t u = 0; u < ATTN_V_AHEAD; u++) v[u] = attn_ld_f16(vd, (j + u) * stride);
#pragma unroll
    for (uint32_t u = 0; u < ATTN_V_AHEAD; u++) add(j + u, v[u]);
  }
  for (; j < n; j++) add(j, attn_ld_f16(vd, j * stride));
  attn_finish((uint64_t)t * n_q + h0, 0, hd, tid, lsum, o, c, part, n_chunks, out, xq);
}

// split blocks per (t, band of heads consecutive query heads of one KV group): block
// s * tokens * (n_q / heads) + t * (n_q / heads) + band (chunk-major: the blocks with chunks to
// compute first) computes chunks s, s + split, ... of the token's
// context for each head of the band, each into part (t * n_q + h) * n_chunks + c, n_chunks =
// ceil(n_ctx / STRATA_ATTN_CHUNK). With out not null (the host's choice for contexts of one
// chunk) the outputs directly, and no parts; a longer context traps. HD not 0: compiled for
// heads of HD values only (a launch of another size traps).
template <uint32_t W, uint32_t HW, uint32_t HD>
STRATA_FN void attn_chunk_band(const float* q, const uint16_t* k_cache, const uint16_t* v_cache, uint32_t tokens, uint32_t n_q,
                                                       uint32_t n_kv, uint32_t hd_arg, const uint32_t* pos, float scale, uint32_t n_ctx, uint32_t split,
                                                       uint32_t heads, float* part, float* out, uint8_t* xq) {
  static_assert(2 * HW >= W, "a key's head slots (2 or 4) share the band's heads");
  if (HD != 0 && hd_arg != HD) trap_launch();
  const uint32_t hd = HD != 0 ? HD : hd_arg;
  uint32_t bands = n_q / heads, b = block_idx();
  if (b >= tokens * bands * split) return;  // the whole block
  uint32_t tb = b % (tokens * bands), first = b / (tokens * bands);
  uint32_t t = tb / bands, h0 = tb % bands * heads;
  uint32_t len = attn_context_len(pos, t, n_ctx), n_chunks = attn_n_chunks(n_ctx);
  if (out != nullptr && len > STRATA_ATTN_CHUNK) trap_launch();
  uint64_t g = h0 / (n_q / n_kv);
  const float* rows = q + ((uint64_t)t * n_q + h0) * hd;
  for (uint32_t i = thread_idx(); i < heads * hd; i += STRATA_ATTN_THREADS)
    strata_smem[W == 1 ? ATTN_Q_WORD + i : attn_q_word(i / hd, i % hd, hd)] = ld_nc_u32((const uint8_t*)(rows + i));
  for (uint32_t c = first; c * STRATA_ATTN_CHUNK < len; c += split) {
    sync_threads();  // the queries are in; the previous chunk's readers are done
    if (W == 1) attn_one_chunk_one_head(k_cache, v_cache, t, h0, n_q, n_kv, hd, g, len, c, scale, part, n_chunks, out, xq);
    else attn_one_chunk<W, HW>(k_cache, v_cache, t, h0, heads, n_q, n_kv, hd, g, len, c, scale, part, n_chunks, out, xq);
  }
}

// One entry per widest band w and head size (0: any; attn_chunk_one: one head a block, fewer
// registers).
#define ATTN_CHUNK_ENTRY(name, w, hw, size)                                                                                                   \
  STRATA_KERNEL(name)(const float* q, const uint16_t* k_cache, const uint16_t* v_cache, uint32_t tokens, uint32_t n_q, uint32_t n_kv,     \
                      uint32_t hd_arg, const uint32_t* pos, float scale, uint32_t n_ctx, uint32_t split, uint32_t heads, float* part,    \
                      float* out, uint8_t* xq) {                                                                                          \
    attn_chunk_band<w, hw, size>(q, k_cache, v_cache, tokens, n_q, n_kv, hd_arg, pos, scale, n_ctx, split, heads, part, out, xq);        \
  }
ATTN_CHUNK_ENTRY(attn_chunk, 8, 4, 0)
// The band kernel for heads of 128 values keeps the any-size body here: compiled for the
// constant, NVRTC's ptxas spills 16 bytes of it at the 128 registers of 2 blocks a SM (the Rust
// entry does not spill). Its bits are the same either way.
ATTN_CHUNK_ENTRY(attn_chunk_128, 8, 4, 0)
ATTN_CHUNK_ENTRY(attn_chunk_two, 2, 1, 0)
ATTN_CHUNK_ENTRY(attn_chunk_two_128, 2, 1, 128)
ATTN_CHUNK_ENTRY(attn_chunk_one, 1, 1, 0)

// attn_prep and attn_chunk_band with out for a window of tokens at *pos whose contexts are one
// chunk, in bands of W heads (the Rust twin's attn_prep_chunk_band): block b takes token t and
// query heads h0 .. of KV group g as attn_chunk_band's blocks; warp w < W norms and ropes token
// t's query head h0 + w straight into the band's shared query words, the other warps write the
// group's 2 * tokens new cache rows (warp W + i rows i, i + ATTN_WARPS - W, ...: the tokens' keys,
// normed and roped, then their values, as fp16 at *pos + r). Every block of a group writes all
// of the window's new rows of the group (the same bits from every writer); the block barrier
// before the chunk's first stage copy makes its own writes visible to its copies. A window past
// n_ctx, or a context longer than one chunk, traps.
template <uint32_t W, uint32_t HW, uint32_t HD>
STRATA_FN void attn_prep_chunk_band(const float* q, const float* k, const float* v, const float* q_norm, const float* k_norm, const float* rope,
                                    uint32_t tokens, uint32_t n_q, uint32_t n_kv, uint32_t hd_arg, uint32_t n_rot, uint32_t q_stride,
                                    uint32_t kv_stride, const uint32_t* pos, uint32_t n_ctx, float eps, float scale, uint16_t* k_cache,
                                    uint16_t* v_cache, float* out, uint8_t* xq) {
  static_assert(W >= 2 && W < ATTN_WARPS && 2 * HW >= W, "a band's query words, and warps left for the cache rows");
  if (HD != 0 && hd_arg != HD) trap_launch();
  const uint32_t hd = HD != 0 ? HD : hd_arg;
  uint32_t bands = n_q / W, b = block_idx();
  if (b >= tokens * bands) return;  // the whole block
  uint32_t t = b / bands, h0 = b % bands * W, pos0 = ld_nc_u32((const uint8_t*)pos);
  uint64_t end = (uint64_t)pos0 + tokens;
  if (end > n_ctx || end > STRATA_ATTN_CHUNK || out == nullptr) trap_launch();
  uint64_t g = h0 / (n_q / n_kv);
  uint32_t w = warp_in_block();
  float x[ATTN_LANE_VALUES], x_partner[ATTN_LANE_VALUES], y[ATTN_LANE_VALUES];
  if (w < W) {
    AttnRowConsts consts = attn_row_consts(q_norm, rope + (uint64_t)(pos0 + t) * n_rot, hd, n_rot);
    attn_load_row(q + (uint64_t)t * q_stride + (uint64_t)(h0 + w) * hd, hd, n_rot, true, x, x_partner);
    attn_norm_rope_row(x, x_partner, consts, hd, n_rot, eps, y);
#pragma unroll
    for (uint32_t i = 0; i < ATTN_LANE_VALUES; i++)
      if (lane() + 32 * i < hd) strata_smem[attn_q_word(w, lane() + 32 * i, hd)] = __builtin_bit_cast(uint32_t, y[i]);
  } else {
    for (uint32_t r = w - W; r < 2 * tokens; r += ATTN_WARPS - W) {
      bool key = r < tokens;
      uint32_t tr = key ? r : r - tokens;
      uint64_t at = ((uint64_t)(pos0 + tr) * n_kv + g) * hd;
      attn_load_row((key ? k : v) + (uint64_t)tr * kv_stride + g * hd, hd, n_rot, key, x, x_partner);
      if (key) {
        AttnRowConsts consts = attn_row_consts(k_norm, rope + (uint64_t)(pos0 + tr) * n_rot, hd, n_rot);
        attn_norm_rope_row(x, x_partner, consts, hd, n_rot, eps, y);
        attn_store_f16_row(k_cache + at, hd, y);
      } else {
        attn_store_f16_row(v_cache + at, hd, x);
      }
    }
  }
  sync_threads();  // the queries and the block's cache rows are in
  attn_one_chunk<W, HW>(k_cache, v_cache, t, h0, W, n_q, n_kv, hd, g, pos0 + t + 1, 0, scale, nullptr, 1, out, xq);
}

STRATA_KERNEL(attn_prep_chunk_two_128)(const float* q, const float* k, const float* v, const float* q_norm, const float* k_norm, const float* rope,
                                       uint32_t tokens, uint32_t n_q, uint32_t n_kv, uint32_t hd, uint32_t n_rot, uint32_t q_stride,
                                       uint32_t kv_stride, const uint32_t* pos, uint32_t n_ctx, float eps, float scale, uint16_t* k_cache,
                                       uint16_t* v_cache, float* out, uint8_t* xq) {
  attn_prep_chunk_band<2, 1, 128>(q, k, v, q_norm, k_norm, rope, tokens, n_q, n_kv, hd, n_rot, q_stride, kv_stride, pos, n_ctx, eps, scale,
                                  k_cache, v_cache, out, xq);
}

// Block (t, h), thread d < hd: the token's ceil((*pos + t + 1) / STRATA_ATTN_CHUNK) parts
// combined; every thread folds the maxima and L alike. With xq each warp also quantizes its 32
// outputs into their q8_1 block.
STRATA_KERNEL(attn_merge)(const float* part, uint32_t tokens, uint32_t n_q, uint32_t hd, const uint32_t* pos, uint32_t n_ctx, float* out,
                          uint8_t* xq) {
  uint32_t th = block_idx(), d = thread_idx();
  if (th >= tokens * n_q || d >= hd) return;  // whole warps (hd a multiple of 32); no barrier below
  uint32_t nc = attn_n_chunks(attn_context_len(pos, th / n_q, n_ctx)), n_chunks = attn_n_chunks(n_ctx);
  uint64_t stride = (uint64_t)hd + 2;
  const float* parts = part + (uint64_t)th * n_chunks * stride;
  // ATTN_MERGE_AHEAD chunks' parts are loaded before they are folded, in chunk order.
  float big_m = attn_neg_inf();
  for (uint32_t c = 0; c < nc; c += ATTN_MERGE_AHEAD) {
    float m[ATTN_MERGE_AHEAD];
#pragma unroll
    for (uint32_t i = 0; i < ATTN_MERGE_AHEAD; i++) m[i] = c + i < nc ? attn_ld_f32(parts, (c + i) * stride) : attn_neg_inf();
#pragma unroll
    for (uint32_t i = 0; i < ATTN_MERGE_AHEAD; i++) big_m = max_f32(big_m, m[i]);
  }
  float big_l = 0.0f, big_o = 0.0f;
  for (uint32_t c = 0; c < nc; c += ATTN_MERGE_AHEAD) {
    float m[ATTN_MERGE_AHEAD], lc[ATTN_MERGE_AHEAD], o[ATTN_MERGE_AHEAD];
#pragma unroll
    for (uint32_t i = 0; i < ATTN_MERGE_AHEAD; i++) {
      const float* pc = parts + (c + i) * stride;
      bool in = c + i < nc;
      m[i] = in ? attn_ld_f32(pc, 0) : 0.0f;
      lc[i] = in ? attn_ld_f32(pc, 1) : 0.0f;
      o[i] = in ? attn_ld_f32(pc, 2 + d) : 0.0f;
    }
#pragma unroll
    for (uint32_t i = 0; i < ATTN_MERGE_AHEAD; i++) {
      if (c + i < nc) {
        float f = exp_neg(m[i] - big_m);
        big_l = big_l + lc[i] * f;
        big_o = big_o + o[i] * f;
      }
    }
  }
  attn_store_output(out, xq, (uint64_t)th * hd + d, big_o / big_l);
}
