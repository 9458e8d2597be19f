// embed_rows_<tag>: token rows of an embedding table widened to f32. Twin of
// device/src/kernels/embed.rs; spec in gpu-shared/src/replica/embed.rs. One value per thread:
// block b covers values 256 * (b % chunks) .. of token b / chunks; for a quantized table every
// lane decodes its warp's 32-value group (same addresses across the warp) and keeps its value.
#include "strata_hip.h"
#include "blocks.hip"
#include "matvec.hip"

// Value j of a row of quantized blocks F: d * (f * v * 2^-SHIFT), the second factor exact.
template <typename F>
struct QuantRow {
  STRATA_FN float value(const uint8_t* row, uint32_t j) {
    uint32_t b = j / STRATA_GROUP, l = j % STRATA_GROUP;
    Group g = F::load(row + (uint64_t)(b / F::GROUPS) * F::BYTES, b % F::GROUPS);
    // Word l / 4, picked in registers (an indexed read would put the group in local memory).
    uint32_t word = g.w[0];
#pragma unroll
    for (uint32_t i = 1; i < 8; i++)
      if (i == l / 4) word = g.w[i];
    int32_t v = (int8_t)(uint8_t)(word >> (8 * (l % 4)));
    int32_t f = l < 16 ? g.f[0] : g.f[1];
    return g.d * ((float)(f * v) * __builtin_bit_cast(float, (127u - F::SHIFT) << 23));
  }
};

// Value j of a row of float elements W (F32W, F16W, Bf16W from matvec.hip).
template <typename W>
struct FloatRow {
  STRATA_FN float value(const uint8_t* row, uint32_t j) { return W::get(row, j); }
};

template <typename R>
static __device__ __forceinline__ void embed_rows(const uint8_t* table, uint64_t row_bytes, uint32_t n_rows,
                                                  const uint32_t* ids, uint32_t tokens, uint32_t n, float* out) {
  uint32_t chunks = (n + STRATA_EMBED_THREADS - 1) / STRATA_EMBED_THREADS;
  uint32_t t = block_idx() / chunks, j = block_idx() % chunks * STRATA_EMBED_THREADS + thread_idx();
  if (t >= tokens || j >= n) return;  // past the row, or a padded grid's extra block
  uint32_t id = ld_nc_u32((const uint8_t*)(ids + t));
  float v = id < n_rows ? R::value(table + (uint64_t)id * row_bytes, j) : __builtin_bit_cast(float, (uint32_t)STRATA_EMBED_NAN);
  out[(uint64_t)t * n + j] = v;
}

#define EMBED_ENTRY(name, row)                                                                                  \
  STRATA_KERNEL(name)(const uint8_t* table, uint64_t row_bytes, uint32_t n_rows, const uint32_t* ids, uint32_t tokens, \
                      uint32_t n, float* out) {                                                                 \
    embed_rows<row>(table, row_bytes, n_rows, ids, tokens, n, out);                                              \
  }

EMBED_ENTRY(embed_rows_q8_0, QuantRow<Q8_0>)
EMBED_ENTRY(embed_rows_q6_k, QuantRow<Q6K>)
EMBED_ENTRY(embed_rows_iq2_xxs, QuantRow<Iq2Xxs>)
EMBED_ENTRY(embed_rows_iq2_xs, QuantRow<Iq2Xs>)
EMBED_ENTRY(embed_rows_iq2_s, QuantRow<Iq2S>)
EMBED_ENTRY(embed_rows_iq3_xxs, QuantRow<Iq3Xxs>)
EMBED_ENTRY(embed_rows_iq3_s, QuantRow<Iq3S>)
EMBED_ENTRY(embed_rows_iq4_nl, QuantRow<Iq4Nl>)
EMBED_ENTRY(embed_rows_iq4_xs, QuantRow<Iq4Xs>)
EMBED_ENTRY(embed_rows_q2_0, QuantRow<Q2_0>)
EMBED_ENTRY(embed_rows_f32, FloatRow<F32W>)
EMBED_ENTRY(embed_rows_f16, FloatRow<F16W>)
EMBED_ENTRY(embed_rows_bf16, FloatRow<Bf16W>)
