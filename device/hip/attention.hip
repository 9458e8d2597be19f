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
#define ATTN_PER_LANE (STRATA_ATTN_MAX_HD / 32)
// Loads in flight per lane in the per-head norm: a 128-value head is one memory latency.
#define ATTN_NORM_AHEAD 4

STRATA_FN float attn_ld_f32(const float* p, uint64_t i) { return __builtin_bit_cast(float, ld_nc_u32((const uint8_t*)(p + i))); }
STRATA_FN float attn_ld_f16(const uint16_t* p, uint64_t i) { return f16_to_f32(ld_nc_u16((const uint8_t*)(p + i))); }
STRATA_FN float attn_neg_inf() { return __builtin_bit_cast(float, 0xff800000u); }

// One head row and its norm weight, with the row's RMSNorm scale.
struct AttnNormed {
  const float* x;
  const float* w;
  float scale;

  // y[j], recomputed wherever a lane needs it (its own value and its RoPE partner).
  __device__ __forceinline__ float y(uint32_t j) const { return (attn_ld_f32(x, j) * scale) * attn_ld_f32(w, j); }

  // Output d after NEOX RoPE over the first n_rot values; rope: the position's (cos, sin) pairs.
  __device__ __forceinline__ float roped(const float* rope, uint32_t n_rot, uint32_t d) const {
    uint32_t half = n_rot / 2;
    if (d < half) {
      float c = attn_ld_f32(rope, 2 * d), s = attn_ld_f32(rope, 2 * d + 1);
      return y(d) * c - y(d + half) * s;
    }
    if (d < n_rot) {
      uint32_t i = d - half;
      float c = attn_ld_f32(rope, 2 * i), s = attn_ld_f32(rope, 2 * i + 1);
      return y(i) * s + y(d) * c;
    }
    return y(d);
  }
};

// The row's RMSNorm scale (warp_rms_scale of norm.hip, the norm family's spec). Every lane of
// the warp must call it.
STRATA_FN AttnNormed attn_normed(const float* x, const float* w, uint32_t hd, float eps) {
  return AttnNormed{x, w, warp_rms_scale<ATTN_NORM_AHEAD>(x, hd, eps)};
}

// Token t's q rows start at q + t * q_stride, its k and v rows at k, v + t * kv_stride: views
// into one buffer of fused projection rows, or packed rows.
STRATA_KERNEL(attn_prep)(const float* q, const float* k, const float* v, const float* q_norm, const float* k_norm, const float* rope,
                         uint32_t tokens, uint32_t n_q, uint32_t n_kv, uint32_t hd, uint32_t n_rot, uint32_t q_stride, uint32_t kv_stride, const uint32_t* pos,
                         uint32_t n_ctx, float eps, float* q_out, uint16_t* k_cache, uint16_t* v_cache) {
  uint32_t heads = n_q + 2 * n_kv;
  uint32_t r = block_idx() * STRATA_ATTN_PREP_WARPS + warp_in_block();
  if (r >= tokens * heads) return;  // the whole warp (the kernel has no block barrier)
  uint32_t t = r / heads, h = r % heads;
  uint64_t at = (uint64_t)ld_nc_u32((const uint8_t*)pos) + t;
  if (at >= n_ctx) return;  // the whole warp: no room in the cache (the host never asks for this)
  if (h >= n_q + n_kv) {
    uint64_t g = h - n_q - n_kv;
    const float* src = v + (uint64_t)t * kv_stride + g * hd;
    uint16_t* dst = v_cache + (at * n_kv + g) * hd;
    for (uint32_t d = lane(); d < hd; d += 32) dst[d] = f32_to_f16(attn_ld_f32(src, d));
    return;
  }
  const float* pos_rope = rope + at * n_rot;
  if (h < n_q) {
    uint64_t row_at = ((uint64_t)t * n_q + h) * hd;
    AttnNormed row = attn_normed(q + (uint64_t)t * q_stride + (uint64_t)h * hd, q_norm, hd, eps);
    for (uint32_t d = lane(); d < hd; d += 32) q_out[row_at + d] = row.roped(pos_rope, n_rot, d);
  } else {
    uint64_t g = h - n_q;
    AttnNormed row = attn_normed(k + (uint64_t)t * kv_stride + g * hd, k_norm, hd, eps);
    uint16_t* dst = k_cache + (at * n_kv + g) * hd;
    for (uint32_t d = lane(); d < hd; d += 32) dst[d] = f32_to_f16(row.roped(pos_rope, n_rot, d));
  }
}

// The keys token t of the window at *pos attends to, *pos + t + 1, at most the caches' n_ctx
// positions.
STRATA_FN uint32_t attn_context_len(const uint32_t* pos, uint32_t t, uint32_t n_ctx) {
  uint64_t len = (uint64_t)ld_nc_u32((const uint8_t*)pos) + t + 1;
  return (uint32_t)(len < n_ctx ? len : n_ctx);
}

STRATA_FN uint32_t attn_n_chunks(uint32_t n_ctx) { return (n_ctx + STRATA_ATTN_CHUNK - 1) / STRATA_ATTN_CHUNK; }

// Shared words of attn_chunk: the band's queries Q[heads][hd], the scores then softmax terms
// S[heads][STRATA_ATTN_CHUNK], the warps' running maxima M[warp][heads].
#define ATTN_Q_WORD 0u
#define ATTN_S_WORD (ATTN_Q_WORD + STRATA_ATTN_MAX_BAND * STRATA_ATTN_MAX_HD)
#define ATTN_M_WORD (ATTN_S_WORD + STRATA_ATTN_MAX_BAND * STRATA_ATTN_CHUNK)
// The most heads of a band one thread sums values for (attn_max_band in gpu-shared).
#define ATTN_SET_HEADS 4
// Value rows a thread loads before adding their terms.
#define ATTN_V_AHEAD 8
// Chunks' parts a merge thread loads before folding them.
#define ATTN_MERGE_AHEAD 8

STRATA_FN float attn_smem_f32(uint32_t word) { return __builtin_bit_cast(float, strata_smem[word]); }

// Head h's maximum over the chunk's keys: the warps' running maxima.
STRATA_FN float attn_head_max(uint32_t h) {
  float m = attn_neg_inf();
  for (uint32_t x = 0; x < ATTN_WARPS; x++) m = max_f32(m, attn_smem_f32(ATTN_M_WORD + x * STRATA_ATTN_MAX_BAND + h));
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

// Chunk c of token t's len keys for the band's heads h0 .. h0 + heads of KV group g (queries in
// shared memory): each head's max, softmax sum and weighted values into its part slot. Warp w
// scores keys w, w + 8, ... for every head; thread i turns key i's scores into softmax terms;
// thread d of set r sums p_j * v_j[d] and p_j in key order for heads r, r + sets, ... With out
// not null the context is this one chunk: the heads' outputs (and with xq their q8_1 blocks)
// instead of parts. The whole block calls it.
template <uint32_t W>
STRATA_FN void attn_one_chunk(const uint16_t* k_cache, const uint16_t* v_cache, uint32_t t, uint32_t h0, uint32_t heads, uint32_t n_q, uint32_t n_kv,
                              uint32_t hd, uint64_t g, uint32_t len, uint32_t c, float scale, float* part, uint32_t n_chunks,
                              float* out, uint8_t* xq) {
  uint32_t start = c * STRATA_ATTN_CHUNK;
  uint32_t n = len - start < STRATA_ATTN_CHUNK ? len - start : STRATA_ATTN_CHUNK;
  uint64_t stride = (uint64_t)n_kv * hd;
  uint32_t l = lane(), w = warp_in_block(), tid = thread_idx(), per_lane = hd / 32;
  const uint16_t* keys = k_cache + start * stride + g * hd;
  const uint16_t* values = v_cache + start * stride + g * hd;
  // The chunk's key and value rows, asked of L2 at once.
  uint32_t row_lines = (hd * 2 + 127) / 128;
  for (uint32_t i = tid; i < n * row_lines; i += STRATA_ATTN_THREADS) {
    uint64_t at = (uint64_t)(i / row_lines) * stride * 2 + (i % row_lines) * 128;
    prefetch_l2((const uint8_t*)keys + at);
    prefetch_l2((const uint8_t*)values + at);
  }
  // Lane h keeps the warp's running maximum of head h.
  float lane_max = attn_neg_inf();
  // Keys j and j + ATTN_WARPS loaded together (two in flight), each scored as alone.
  for (uint32_t j = w; j < n; j += 2 * ATTN_WARPS) {
    float k[2][ATTN_PER_LANE];
#pragma unroll
    for (uint32_t u = 0; u < 2; u++) {
      const uint16_t* key = keys + (uint64_t)(j + u * ATTN_WARPS) * stride;
#pragma unroll
      for (uint32_t i = 0; i < ATTN_PER_LANE; i++) k[u][i] = i < per_lane && j + u * ATTN_WARPS < n ? attn_ld_f16(key, l + 32 * i) : 0.0f;
    }
#pragma unroll
    for (uint32_t u = 0; u < 2; u++) {
      uint32_t ju = j + u * ATTN_WARPS;
      if (ju >= n) continue;
#pragma unroll
      for (uint32_t h = 0; h < STRATA_ATTN_MAX_BAND; h++) {
        if (h < W && h < heads) {
          float acc = 0.0f;
#pragma unroll
          for (uint32_t i = 0; i < ATTN_PER_LANE; i++)
            if (i < per_lane) acc = acc + attn_smem_f32(ATTN_Q_WORD + h * hd + l + 32 * i) * k[u][i];
          float s = scale * warp_sum_f32(acc);
          if (l == 0) strata_smem[ATTN_S_WORD + h * STRATA_ATTN_CHUNK + ju] = __builtin_bit_cast(uint32_t, s);
          if (l == h) lane_max = max_f32(lane_max, s);
        }
      }
    }
  }
  if (l < heads) strata_smem[ATTN_M_WORD + w * STRATA_ATTN_MAX_BAND + l] = __builtin_bit_cast(uint32_t, lane_max);
  sync_threads();
  if (tid < n) {
    for (uint32_t h = 0; h < heads; h++) {
      uint32_t at = ATTN_S_WORD + h * STRATA_ATTN_CHUNK + tid;
      strata_smem[at] = __builtin_bit_cast(uint32_t, exp_neg(attn_smem_f32(at) - attn_head_max(h)));
    }
  }
  sync_threads();
  uint32_t sets = STRATA_ATTN_THREADS / hd, r = tid / hd, d = tid % hd;
  if (r < heads) {
    const uint16_t* vd = values + d;
    float lsum[ATTN_SET_HEADS], o[ATTN_SET_HEADS];
#pragma unroll
    for (uint32_t x = 0; x < ATTN_SET_HEADS; x++) lsum[x] = o[x] = 0.0f;
    // Key j's terms, added in key order; ATTN_V_AHEAD values are loaded before their terms.
    auto add = [&](uint32_t j, float v) {
#pragma unroll
      for (uint32_t x = 0; x < ATTN_SET_HEADS; x++) {
        uint32_t h = r + x * sets;
        if (x < W && h < heads) {
          float p = attn_smem_f32(ATTN_S_WORD + h * STRATA_ATTN_CHUNK + j);
          lsum[x] = lsum[x] + p;
          o[x] = o[x] + p * v;
        }
      }
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
#pragma unroll
    for (uint32_t x = 0; x < ATTN_SET_HEADS; x++) {
      uint32_t h = r + x * sets;
      if (x < W && h < heads) {
        uint64_t head = (uint64_t)t * n_q + h0 + h;
        if (out != nullptr) {
          attn_store_output(out, xq, head * hd + d, attn_one_part(attn_head_max(h), lsum[x], o[x]));
        } else {
          float* pt = part + (head * n_chunks + c) * (hd + 2);
          pt[2 + d] = o[x];
          if (d == 0) {
            pt[0] = attn_head_max(h);
            pt[1] = lsum[x];
          }
        }
      }
    }
  }
}

// split blocks per (t, band of heads consecutive query heads of one KV group): block
// (t * (n_q / heads) + band) * split + s computes chunks s, s + split, ... of the token's
// context for each head of the band, each into part (t * n_q + h) * n_chunks + c, n_chunks =
// ceil(n_ctx / STRATA_ATTN_CHUNK). With out not null (the host's choice for contexts of one
// chunk) the outputs directly, and no parts; a longer context traps.
template <uint32_t W>
STRATA_FN void attn_chunk_band(const float* q, const uint16_t* k_cache, const uint16_t* v_cache, uint32_t tokens, uint32_t n_q,
                                                       uint32_t n_kv, uint32_t hd, const uint32_t* pos, float scale, uint32_t n_ctx, uint32_t split,
                                                       uint32_t heads, float* part, float* out, uint8_t* xq) {
  uint32_t bands = n_q / heads, b = block_idx();
  if (b >= tokens * bands * split) return;  // the whole block
  uint32_t tb = b / split, first = b % split;
  uint32_t t = tb / bands, h0 = tb % bands * heads;
  uint32_t len = attn_context_len(pos, t, n_ctx), n_chunks = attn_n_chunks(n_ctx);
  if (out != nullptr && len > STRATA_ATTN_CHUNK) trap_launch();
  uint64_t g = h0 / (n_q / n_kv);
  const float* rows = q + ((uint64_t)t * n_q + h0) * hd;
  for (uint32_t i = thread_idx(); i < heads * hd; i += STRATA_ATTN_THREADS) strata_smem[ATTN_Q_WORD + i] = ld_nc_u32((const uint8_t*)(rows + i));
  for (uint32_t c = first; c * STRATA_ATTN_CHUNK < len; c += split) {
    sync_threads();  // the queries are in; the previous chunk's readers are done
    attn_one_chunk<W>(k_cache, v_cache, t, h0, heads, n_q, n_kv, hd, g, len, c, scale, part, n_chunks, out, xq);
  }
}

// One entry per widest band W (attn_chunk_one: one head a block, fewer registers).
#define ATTN_CHUNK_ENTRY(name, w)                                                                                                          \
  STRATA_KERNEL(name)(const float* q, const uint16_t* k_cache, const uint16_t* v_cache, uint32_t tokens, uint32_t n_q, uint32_t n_kv,     \
                      uint32_t hd, const uint32_t* pos, float scale, uint32_t n_ctx, uint32_t split, uint32_t heads, float* part,        \
                      float* out, uint8_t* xq) {                                                                                          \
    attn_chunk_band<w>(q, k_cache, v_cache, tokens, n_q, n_kv, hd, pos, scale, n_ctx, split, heads, part, out, xq);                      \
  }
ATTN_CHUNK_ENTRY(attn_chunk, 8)
ATTN_CHUNK_ENTRY(attn_chunk_one, 1)

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
