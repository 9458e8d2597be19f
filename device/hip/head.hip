// The sampler head: argmax_rows and row_top_prob, one-block references and split kernels. Twin
// of device/src/kernels/head.rs; specs in gpu-shared/src/order.rs.
#include "strata_hip.h"

#define HEAD_WARPS (STRATA_HEAD_THREADS / 32)
#define NONE 0xffffffffu

STRATA_FN bool is_nan(float v) { return v != v; }

// order::argmax_better: a number beats NaN, larger beats smaller, ties go to the lower index.
STRATA_FN bool argmax_better(float va, uint32_t ia, float vb, uint32_t ib) {
  if (is_nan(va) && is_nan(vb)) return ia < ib;
  if (is_nan(va)) return false;
  if (is_nan(vb)) return true;
  return va > vb || (va == vb && ia < ib);
}

struct Best {
  float v;
  uint32_t i;
};

STRATA_FN void keep_better(Best& b, float v, uint32_t i) {
  if (argmax_better(v, i, b.v, b.i)) b = Best{v, i};
}

STRATA_FN float ld_f32(const float* p, uint64_t i) { return __builtin_bit_cast(float, ld_nc_u32((const uint8_t*)(p + i))); }

// The warp's best candidate, the same in every lane.
STRATA_FN Best warp_best(Best b) {
  for (uint32_t o = 16; o > 0; o >>= 1) {
    float v = shfl_xor_f32(b.v, o);
    uint32_t i = shfl_xor_u32(b.i, o);
    keep_better(b, v, i);
  }
  return b;
}

// The block's best candidate, valid in thread 0 (shared words 0 .. 2 * HEAD_WARPS).
STRATA_FN Best block_best(Best b) {
  b = warp_best(b);
  uint32_t w = warp_in_block();
  if (lane() == 0) {
    strata_smem[2 * w] = __builtin_bit_cast(uint32_t, b.v);
    strata_smem[2 * w + 1] = b.i;
  }
  sync_threads();
  if (thread_idx() == 0)
    for (uint32_t k = 1; k < HEAD_WARPS; k++) keep_better(b, __builtin_bit_cast(float, strata_smem[2 * k]), strata_smem[2 * k + 1]);
  return b;
}

STRATA_FN Best range_best(const float* x, uint32_t start, uint32_t end) {
  Best b{__builtin_bit_cast(float, 0x7fc00000u), NONE};
  // STRATA_HEAD_AHEAD loads in flight, then folded in the order of their indices. Offsets from
  // x + j and bounds against end - j are constants a load (indices widened one by one took a
  // register pair each and spilled).
  for (uint32_t j = start + thread_idx(); j < end; j += STRATA_HEAD_THREADS * STRATA_HEAD_AHEAD) {
    const float* xj = x + j;
    uint32_t left = end - j;
    float v[STRATA_HEAD_AHEAD];
#pragma unroll
    for (uint32_t u = 0; u < STRATA_HEAD_AHEAD; u++) {
      v[u] = STRATA_HEAD_THREADS * u < left ? ld_f32(xj, STRATA_HEAD_THREADS * u) : __builtin_bit_cast(float, 0x7fc00000u);
    }
#pragma unroll
    for (uint32_t u = 0; u < STRATA_HEAD_AHEAD; u++) {
      if (STRATA_HEAD_THREADS * u < left) keep_better(b, v[u], j + STRATA_HEAD_THREADS * u);
    }
  }
  return block_best(b);
}

STRATA_KERNEL(argmax_rows_ref)(const float* x, uint32_t n, uint32_t rows, uint32_t* idx, uint32_t* flag) {
  uint32_t row = block_idx();
  if (row >= rows) return;  // padded grid: the whole block
  Best b = range_best(x + (uint64_t)row * n, 0, n);
  if (thread_idx() == 0) {
    idx[row] = b.i;
    flag[row] = is_nan(b.v) ? 1u : 0u;
  }
}

STRATA_KERNEL(argmax_rows_split)(const float* x, uint32_t n, uint32_t rows, uint32_t chunks, float* part_val, uint32_t* part_idx) {
  uint32_t b = block_idx(), row = b / chunks, c = b % chunks;
  if (b >= rows * chunks) return;
  uint32_t start = c * STRATA_HEAD_CHUNK, end = start + STRATA_HEAD_CHUNK < n ? start + STRATA_HEAD_CHUNK : n;
  Best best = range_best(x + (uint64_t)row * n, start, end);
  if (thread_idx() == 0) {
    part_val[b] = best.v;
    part_idx[b] = best.i;
  }
}

STRATA_KERNEL(argmax_rows_final)(const float* part_val, const uint32_t* part_idx, uint32_t rows, uint32_t chunks, uint32_t* idx, uint32_t* flag) {
  uint32_t row = block_idx();
  if (row >= rows) return;
  uint64_t base = (uint64_t)row * chunks;
  Best b{__builtin_bit_cast(float, 0x7fc00000u), NONE};
  for (uint32_t c = thread_idx(); c < chunks; c += STRATA_HEAD_THREADS)
    keep_better(b, ld_f32(part_val, base + c), ld_nc_u32((const uint8_t*)(part_idx + base + c)));
  b = block_best(b);
  if (thread_idx() == 0) {
    idx[row] = b.i;
    flag[row] = is_nan(b.v) ? 1u : 0u;
  }
}

// maxNum of x[start..end], the same in every thread.
STRATA_FN float range_max(const float* x, uint32_t start, uint32_t end) {
  float m = __builtin_bit_cast(float, 0xff800000u);
  for (uint32_t j = start + thread_idx(); j < end; j += STRATA_HEAD_THREADS) m = max_f32(m, ld_f32(x, j));
  m = warp_max_f32(m);
  if (lane() == 0) strata_smem[warp_in_block()] = __builtin_bit_cast(uint32_t, m);
  sync_threads();
  float all = __builtin_bit_cast(float, 0xff800000u);
  for (uint32_t w = 0; w < HEAD_WARPS; w++) all = max_f32(all, __builtin_bit_cast(float, strata_smem[w]));
  sync_threads();
  return all;
}

// order::top_prob_term
STRATA_FN float top_prob_term(float x, float m) {
  if (is_nan(x)) return 0.0f;
  if (x == m) return 1.0f;
  return exp_neg(x - m);
}

// The chunk's term sum in the spec's order, valid in thread 0.
STRATA_FN float chunk_sum(const float* x, uint32_t start, uint32_t end, float m) {
  float s = 0.0f;
  for (uint32_t j = start + thread_idx(); j < end; j += STRATA_HEAD_THREADS) s = s + top_prob_term(ld_f32(x, j), m);
  s = warp_sum_f32(s);
  if (lane() == 0) strata_smem[warp_in_block()] = __builtin_bit_cast(uint32_t, s);
  sync_threads();
  float total = 0.0f;
  if (thread_idx() == 0)
    for (uint32_t w = 0; w < HEAD_WARPS; w++) total = total + __builtin_bit_cast(float, strata_smem[w]);
  sync_threads();
  return total;
}

STRATA_FN float prob(float total) { return total == 0.0f ? 0.0f : 1.0f / total; }

STRATA_KERNEL(row_top_prob_ref)(const float* x, uint32_t n, uint32_t rows, float* p) {
  uint32_t row = block_idx();
  if (row >= rows) return;
  const float* xr = x + (uint64_t)row * n;
  float m = range_max(xr, 0, n);
  float total = 0.0f;
  for (uint32_t start = 0; start < n; start += STRATA_HEAD_CHUNK)
    total = total + chunk_sum(xr, start, start + STRATA_HEAD_CHUNK < n ? start + STRATA_HEAD_CHUNK : n, m);
  if (thread_idx() == 0) p[row] = prob(total);
}

STRATA_KERNEL(row_top_prob_max)(const float* x, uint32_t n, uint32_t rows, uint32_t chunks, float* part_max) {
  uint32_t b = block_idx(), row = b / chunks, c = b % chunks;
  if (b >= rows * chunks) return;
  uint32_t start = c * STRATA_HEAD_CHUNK, end = start + STRATA_HEAD_CHUNK < n ? start + STRATA_HEAD_CHUNK : n;
  float m = range_max(x + (uint64_t)row * n, start, end);
  if (thread_idx() == 0) part_max[b] = m;
}

STRATA_KERNEL(row_top_prob_sum)(const float* x, uint32_t n, uint32_t rows, uint32_t chunks, const float* part_max, float* part_sum) {
  uint32_t b = block_idx(), row = b / chunks, c = b % chunks;
  if (b >= rows * chunks) return;
  float m = __builtin_bit_cast(float, 0xff800000u);
  for (uint32_t i = 0; i < chunks; i++) m = max_f32(m, ld_f32(part_max, (uint64_t)row * chunks + i));
  uint32_t start = c * STRATA_HEAD_CHUNK, end = start + STRATA_HEAD_CHUNK < n ? start + STRATA_HEAD_CHUNK : n;
  float s = chunk_sum(x + (uint64_t)row * n, start, end, m);
  if (thread_idx() == 0) part_sum[b] = s;
}

STRATA_KERNEL(row_top_prob_final)(const float* part_sum, uint32_t rows, uint32_t chunks, float* p) {
  uint32_t row = block_idx();
  if (row < rows && thread_idx() == 0) {
    float total = 0.0f;
    for (uint32_t c = 0; c < chunks; c++) total = total + ld_f32(part_sum, (uint64_t)row * chunks + c);
    p[row] = prob(total);
  }
}
