// mmvq: a quantized weight matrix (m rows) times 1..8 q8_1 activation rows. Twin of
// device/src/kernels/mmvq.rs: one warp per weight row, lane l takes groups l, l+32, ..., one
// partial per activation row, then the warp butterfly (gpu-shared/src/order.rs, mmvq); with
// accumulate the sums are added to what y holds.
#include "strata_hip.h"
#include "blocks.hip"
#include "stage.hip"

// contribution with the activation block already loaded (its 8 quant words, its scale as f32).
STRATA_FN float contribution_words(const Group& g, const uint32_t* q, float dx, float pow2) {
  int32_t s[2] = {0, 0};
  for (int i = 0; i < 8; i++) s[i / 4] = dp4a(g.w[i], q[i], s[i / 4]);
  int32_t exact = g.f[0] * s[0] + g.f[1] * s[1];
  return (g.d * dx) * ((float)exact * pow2);
}

// The q8_1 block at xb in global memory: its 8 quant words into q, its scale returned.
STRATA_FN float global_block(const uint8_t* xb, uint32_t* q) {
  float dx = f16_to_f32(ld_nc_u16(xb + STRATA_Q8_1_OFF_D));
  for (int i = 0; i < 8; i++) q[i] = ld_nc_u32(xb + STRATA_Q8_1_OFF_Q + 4 * i);
  return dx;
}

// This lane's partials of one weight row against up to 8 q8_1 rows, block b of row r given by
// xb(r, b, q) (its quant words into q, its scale returned): the mmvq spec before its butterfly
// (device/src/kernels/mmvq.rs row_partials_from), AHEAD groups loaded before the first is used.
template <typename F, int AHEAD, typename Xb>
static __device__ __forceinline__ void row_partials_from(const uint8_t* wrow, uint32_t groups, uint32_t rows, Xb xb,
                                                         float* acc) {
  float pow2 = __builtin_bit_cast(float, (127u - F::SHIFT) << 23);
#pragma unroll
  for (int r = 0; r < STRATA_MMVQ_MAX_ROWS; r++) acc[r] = 0.0f;
  for (uint32_t b = lane(); b < groups; b += 32 * AHEAD) {
    Group g[AHEAD];
#pragma unroll
    for (int i = 0; i < AHEAD; i++) {
      uint32_t at = b + 32 * i;
      if (at < groups) g[i] = F::load(wrow + (uint64_t)(at / F::GROUPS) * F::BYTES, at % F::GROUPS);
    }
#pragma unroll
    for (int i = 0; i < AHEAD; i++) {
      uint32_t at = b + 32 * i;
      if (at >= groups) continue;
#pragma unroll
      for (int r = 0; r < STRATA_MMVQ_MAX_ROWS; r++) {
        if ((uint32_t)r < rows) {
          uint32_t q[8];
          float dx = xb(r, at, q);
          acc[r] = acc[r] + contribution_words(g[i], q, dx, pow2);
        }
      }
    }
  }
}

// row_partials_from with row r's blocks at act(r) in global memory.
template <typename F, int AHEAD, typename Act>
static __device__ __forceinline__ void row_partials(const uint8_t* wrow, uint32_t groups, uint32_t rows, Act act,
                                                    float* acc) {
  row_partials_from<F, AHEAD>(
      wrow, groups, rows, [&](int r, uint32_t b, uint32_t* q) { return global_block(act(r) + (uint64_t)b * STRATA_Q8_1_BYTES, q); },
      acc);
}

// This lane's partials of N weight rows (row j at wrow(j)) against one q8_1 row at x: for each
// row, row_partials' partial of one activation row; every row's group asked of L1 first, then
// each loaded, decoded and used in turn (device/src/kernels/mmvq.rs rows_partials: all rows'
// groups decoded at once spilled at the down entries' 64 registers).
template <typename F, int N, typename Wrow>
static __device__ __forceinline__ void rows_partials(Wrow wrow, uint32_t groups, const uint8_t* x, float* acc) {
  float pow2 = __builtin_bit_cast(float, (127u - F::SHIFT) << 23);
#pragma unroll
  for (int j = 0; j < N; j++) acc[j] = 0.0f;
  for (uint32_t b = lane(); b < groups; b += 32) {
    uint32_t q[8];
    float dx = global_block(x + (uint64_t)b * STRATA_Q8_1_BYTES, q);
    int fresh = (int)zero_in(b);
#pragma unroll
    for (int j = 0; j < N; j++) prefetch_l1(wrow(j + fresh) + (uint64_t)(b / F::GROUPS) * F::BYTES);
#pragma unroll
    for (int j = 0; j < N; j++) {
      Group g = F::load(wrow(j + fresh) + (uint64_t)(b / F::GROUPS) * F::BYTES, b % F::GROUPS);
      acc[j] = acc[j] + contribution_words(g, q, dx, pow2);
    }
  }
}

template <typename F, int AHEAD>
static __device__ __forceinline__ void mmvq(const uint8_t* w, const uint8_t* x, float* y, uint32_t m,
                                            uint32_t groups, uint32_t rows, uint32_t accumulate) {
  uint32_t row = block_idx() * STRATA_MMVQ_WARPS + warp_in_block();
  if (row >= m) return;
  const uint8_t* wrow = w + (uint64_t)row * (groups / F::GROUPS) * F::BYTES;
  float acc[STRATA_MMVQ_MAX_ROWS];
  row_partials<F, AHEAD>(wrow, groups, rows, [&](int r) { return x + (uint64_t)r * groups * STRATA_Q8_1_BYTES; }, acc);
  store_row_sums(acc, rows, accumulate != 0, [&](int r) { return y + (uint64_t)r * m + row; });
}

// mmvq of one activation row, each step's weight group and activation block asked for before the
// step before is added: the same contributions in the same order, so the same bits
// (device/src/kernels/mmvq.rs mmvq1a, row_partial_ahead).
template <typename F>
static __device__ __forceinline__ void mmvq1a(const uint8_t* w, const uint8_t* x, float* y, uint32_t m,
                                              uint32_t groups, uint32_t accumulate) {
  uint32_t row = block_idx() * STRATA_MMVQ_WARPS + warp_in_block();
  if (row >= m) return;
  const uint8_t* wrow = w + (uint64_t)row * (groups / F::GROUPS) * F::BYTES;
  float pow2 = __builtin_bit_cast(float, (127u - F::SHIFT) << 23);
  float acc[1] = {0.0f};
  // Step `s`'s weight group and activation block (its scale returned, its words in `q`).
  auto load_step = [&](uint32_t s, Group& g, uint32_t* q) {
    g = F::load(wrow + (uint64_t)(s / F::GROUPS) * F::BYTES, s % F::GROUPS);
    return global_block(x + (uint64_t)s * STRATA_Q8_1_BYTES, q);
  };
  uint32_t b = lane();
  if (b < groups) {
    Group g;
    uint32_t q[8];
    float dx = load_step(b, g, q);
    for (;;) {
      uint32_t next = b + 32;
      Group gn;
      uint32_t qn[8];
      float dxn = 0.0f;
      if (next < groups) dxn = load_step(next, gn, qn);
      acc[0] = acc[0] + contribution_words(g, q, dx, pow2);
      if (next >= groups) break;
      g = gn;
      dx = dxn;
      for (int i = 0; i < 8; i++) q[i] = qn[i];
      b = next;
    }
  }
  store_row_sums(acc, 1, accumulate != 0, [&](int) { return y + row; });
}

// Whether the one-row entries give a warp two adjacent weight rows (gpu-shared launch::mmvq1_pairs):
// rows of 32 or 64 groups in matrices of at least STRATA_MMVQ1_MIN_ROWS rows.
STRATA_FN bool mmvq1_pairs(uint32_t m, uint32_t groups) {
  return (groups == 32 || groups == 64) && m >= STRATA_MMVQ1_MIN_ROWS;
}

// mmvq of one activation row with two adjacent weight rows a warp where mmvq1_pairs: each row the
// one-row warp's partials and butterfly (device/src/kernels/mmvq.rs mmvq1_pair).
template <typename F>
static __device__ __forceinline__ void mmvq1_pair(const uint8_t* w, const uint8_t* x, float* y, uint32_t m,
                                                  uint32_t groups, uint32_t accumulate) {
  for (uint32_t j = 0; j < 2; j++) {
    uint32_t row = (block_idx() * STRATA_MMVQ_WARPS + warp_in_block()) * 2 + j;
    if (row >= m) return;
    const uint8_t* wrow = w + (uint64_t)row * (groups / F::GROUPS) * F::BYTES;
    float acc[STRATA_MMVQ_MAX_ROWS];
    row_partials<F, 2>(wrow, groups, 1, [&](int) { return x; }, acc);
    store_row_sums(acc, 1, accumulate != 0, [&](int) { return y + row; });
  }
}

// mmvqs: 2..8 activation rows staged in shared memory first (stage.hip's layout, `rows`
// rows), STRATA_MMVQS_WARPS weight rows a block (device/src/kernels/mmvq.rs mmvqs).
template <typename F>
static __device__ __forceinline__ void mmvqs(const uint8_t* w, const uint8_t* x, float* y, uint32_t m, uint32_t groups,
                                             uint32_t rows, uint32_t accumulate) {
  stage_rows<32 * STRATA_MMVQS_WARPS>([&](uint32_t r) { return x + (uint64_t)r * groups * STRATA_Q8_1_BYTES; }, rows, groups, rows);
  sync_lds();
  uint32_t row = block_idx() * STRATA_MMVQS_WARPS + warp_in_block();
  if (row >= m) return;  // whole warp, after the block's only barrier
  const uint8_t* wrow = w + (uint64_t)row * (groups / F::GROUPS) * F::BYTES;
  float acc[STRATA_MMVQ_MAX_ROWS];
  row_partials_from<F, 1>(wrow, groups, rows, [&](int r, uint32_t b, uint32_t* q) { return staged_block(r, b, groups, rows, q); }, acc);
  store_row_sums(acc, rows, accumulate != 0, [&](int r) { return y + (uint64_t)r * m + row; });
}

// Per format: the entry for 1..8 activation rows, the one-row entries (mmvq1_*: the row count a
// constant, STRATA_MMVQ1_AHEAD weight groups a lane in flight; mmvq1a_*: each step's loads a step
// ahead) and the staged one (mmvqs_*).
#define MMVQ_ENTRY(name, one, ahead, staged, F)                                                                 \
  STRATA_KERNEL(name)(const uint8_t* w, const uint8_t* x, float* y, uint32_t m, uint32_t groups, uint32_t rows, \
                      uint32_t accumulate) {                                                                    \
    mmvq<F, 1>(w, x, y, m, groups, rows, accumulate);                                                           \
  }                                                                                                             \
  STRATA_KERNEL(one)(const uint8_t* w, const uint8_t* x, float* y, uint32_t m, uint32_t groups, uint32_t,       \
                     uint32_t accumulate) {                                                                     \
    if (mmvq1_pairs(m, groups))                                                                                 \
      mmvq1_pair<F>(w, x, y, m, groups, accumulate);                                                            \
    else                                                                                                        \
      mmvq<F, STRATA_MMVQ1_AHEAD>(w, x, y, m, groups, 1, accumulate);                                           \
  }                                                                                                             \
  STRATA_KERNEL(ahead)(const uint8_t* w, const uint8_t* x, float* y, uint32_t m, uint32_t groups, uint32_t,     \
                       uint32_t accumulate) {                                                                   \
    mmvq1a<F>(w, x, y, m, groups, accumulate);                                                                  \
  }                                                                                                             \
  STRATA_KERNEL(staged)(const uint8_t* w, const uint8_t* x, float* y, uint32_t m, uint32_t groups, uint32_t rows, \
                        uint32_t accumulate) {                                                                  \
    mmvqs<F>(w, x, y, m, groups, rows, accumulate);                                                             \
  }

MMVQ_ENTRY(mmvq_q8_0, mmvq1_q8_0, mmvq1a_q8_0, mmvqs_q8_0, Q8_0)
MMVQ_ENTRY(mmvq_q8_0t, mmvq1_q8_0t, mmvq1a_q8_0t, mmvqs_q8_0t, Q8_0T)
MMVQ_ENTRY(mmvq_q6_k, mmvq1_q6_k, mmvq1a_q6_k, mmvqs_q6_k, Q6K)
MMVQ_ENTRY(mmvq_q6_kt, mmvq1_q6_kt, mmvq1a_q6_kt, mmvqs_q6_kt, Q6KT)
MMVQ_ENTRY(mmvq_iq2_xxs, mmvq1_iq2_xxs, mmvq1a_iq2_xxs, mmvqs_iq2_xxs, Iq2Xxs)
MMVQ_ENTRY(mmvq_iq2_xs, mmvq1_iq2_xs, mmvq1a_iq2_xs, mmvqs_iq2_xs, Iq2Xs)
MMVQ_ENTRY(mmvq_iq2_s, mmvq1_iq2_s, mmvq1a_iq2_s, mmvqs_iq2_s, Iq2S)
MMVQ_ENTRY(mmvq_iq3_xxs, mmvq1_iq3_xxs, mmvq1a_iq3_xxs, mmvqs_iq3_xxs, Iq3Xxs)
MMVQ_ENTRY(mmvq_iq3_s, mmvq1_iq3_s, mmvq1a_iq3_s, mmvqs_iq3_s, Iq3S)
MMVQ_ENTRY(mmvq_iq3_st, mmvq1_iq3_st, mmvq1a_iq3_st, mmvqs_iq3_st, Iq3ST)
MMVQ_ENTRY(mmvq_iq4_nl, mmvq1_iq4_nl, mmvq1a_iq4_nl, mmvqs_iq4_nl, Iq4Nl)
MMVQ_ENTRY(mmvq_iq4_nlt, mmvq1_iq4_nlt, mmvq1a_iq4_nlt, mmvqs_iq4_nlt, Iq4NlT)
MMVQ_ENTRY(mmvq_iq4_xs, mmvq1_iq4_xs, mmvq1a_iq4_xs, mmvqs_iq4_xs, Iq4Xs)
MMVQ_ENTRY(mmvq_q2_0, mmvq1_q2_0, mmvq1a_q2_0, mmvqs_q2_0, Q2_0)
