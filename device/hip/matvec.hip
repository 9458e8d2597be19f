// matvec_f32 / matvec_bf16 / matvec_f16: float weights times 1..8 f32 activation rows. Twin of
// device/src/kernels/matvec.rs: one warp per weight row and activation row, lane l takes
// elements l, l+32, ... (product rounded, then added), then the warp butterfly; with accumulate
// the sums are added to what y holds.
#include "strata_hip.h"

// Float element types, widened to f32 exactly (also the rows of embed_rows_f32/f16/bf16).
struct F32W {
  static constexpr uint32_t BYTES = 4;
  STRATA_FN float get(const uint8_t* row, uint32_t j) { return __builtin_bit_cast(float, ld_nc_u32(row + 4 * (uint64_t)j)); }
};

struct Bf16W {
  static constexpr uint32_t BYTES = 2;
  STRATA_FN float get(const uint8_t* row, uint32_t j) {
    return __builtin_bit_cast(float, (uint32_t)ld_nc_u16(row + 2 * (uint64_t)j) << 16);
  }
};

struct F16W {
  static constexpr uint32_t BYTES = 2;
  STRATA_FN float get(const uint8_t* row, uint32_t j) { return f16_to_f32(ld_nc_u16(row + 2 * (uint64_t)j)); }
};

// Adds a lane's products w[j] * x[j] for j, j + 32, ... to acc in that order, N elements a step
// (all N weights and activations loaded before they are added) while a whole step fits below
// k; returns the first j not added.
template <typename W, int N>
static __device__ __forceinline__ uint32_t matvec_chunks(const uint8_t* wrow, const float* x, float& acc, uint32_t j,
                                                         uint32_t k) {
  for (; j + 32 * (N - 1) < k; j += 32 * N) {
    float wj[N], xj[N];
#pragma unroll
    for (int i = 0; i < N; i++) wj[i] = W::get(wrow, j + 32 * i);
#pragma unroll
    for (int i = 0; i < N; i++) xj[i] = __builtin_bit_cast(float, ld_nc_u32((const uint8_t*)(x + j + 32 * i)));
#pragma unroll
    for (int i = 0; i < N; i++) acc = acc + wj[i] * xj[i];
  }
  return j;
}

// One warp a weight row and activation row: block b takes activation row b % rows of weight
// block b / rows (STRATA_MATVEC_WARPS weight rows), so the blocks that read the same weights
// run together and all but one find them in L2.
template <typename W>
static __device__ __forceinline__ void matvec(const uint8_t* w, const float* x, float* y, uint32_t m, uint32_t k,
                                              uint32_t rows, uint32_t accumulate) {
  uint32_t b = block_idx();
  uint32_t row = (b / rows) * STRATA_MATVEC_WARPS + warp_in_block();
  if (row >= m) return;
  uint32_t r = b % rows;
  const uint8_t* wrow = w + (uint64_t)row * k * W::BYTES;
  const float* xr = x + (uint64_t)r * k;
  float acc = 0.0f;
  // A lane's elements j = l, l + 32, ... are added in that order, N loaded before any is added:
  // chunks of STRATA_MATVEC_AHEAD, then of STRATA_MATVEC_AHEAD_REST, then one by one. The
  // chunking does not change the order of the sum.
  uint32_t j = lane();
  j = matvec_chunks<W, STRATA_MATVEC_AHEAD>(wrow, xr, acc, j, k);
  j = matvec_chunks<W, STRATA_MATVEC_AHEAD_REST>(wrow, xr, acc, j, k);
  matvec_chunks<W, 1>(wrow, xr, acc, j, k);
  float v = warp_sum_f32(acc);  // the butterfly
  if (lane() == 0) store_f32(y + (uint64_t)r * m + row, v, accumulate != 0);
}

#define MATVEC_ENTRY(name, W)                                                                                  \
  STRATA_KERNEL(name)(const uint8_t* w, const float* x, float* y, uint32_t m, uint32_t k, uint32_t rows,       \
                      uint32_t accumulate) {                                                                   \
    matvec<W>(w, x, y, m, k, rows, accumulate);                                                                \
  }

MATVEC_ENTRY(matvec_f32, F32W)
MATVEC_ENTRY(matvec_bf16, Bf16W)
MATVEC_ENTRY(matvec_f16, F16W)
