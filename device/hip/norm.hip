// rms_norm (one warp per row), add_f32 (the residual add, in place allowed) and rms_norm_q8_1
// (rms_norm then quantize_q8_1 of its output, a row spread over several blocks). Twin of
// device/src/kernels/norm.rs; specs in gpu-shared/src/replica/norm.rs. warp_rms_scale is the
// RMSNorm scale of one row as a warp computes it from global memory. warp_rms_scale_of is its
// order over any loader (rms_norm_q8_1 reads the row from shared memory), warp_rms_scale_from its
// end from a lane's partial (attention's per-head norm holds its row in registers).
#include "strata_hip.h"
#include "quantize_q8_1.hip"

// The end of warp_rms_scale_of for a caller that summed its lane's squares itself (in that
// order): the warp butterfly over the lanes' partials, mean = total / n, 1 / sqrt_rn(mean + eps).
STRATA_FN float warp_rms_scale_from(float partial, uint32_t n, float eps) {
  float mean = warp_sum_f32(partial) / (float)n;
  return 1.0f / sqrt_rn(mean + eps);
}

// 1 / sqrt_rn(mean(x^2) + eps) of the n values x(0), ..., x(n - 1) (replica::norm::rms_scale):
// lane p sums x(j) * x(j) for j = p, p + 32, ... left to right from +0.0, the warp butterfly
// adds the partials, then mean = total / n. The whole warp calls it, converged; every lane
// returns the same bits. x is called with j < n only.
template <uint32_t AHEAD, typename Load>
STRATA_FN float warp_rms_scale_of(Load x, uint32_t n, float eps) {
  float partial = 0.0f;
  // AHEAD loads in flight before their squares are added, in order.
  uint32_t j = lane();
  for (; j + 32 * (AHEAD - 1) < n; j += 32 * AHEAD) {
    float v[AHEAD];
#pragma unroll
    for (uint32_t i = 0; i < AHEAD; i++) v[i] = x(j + 32 * i);
#pragma unroll
    for (uint32_t i = 0; i < AHEAD; i++) partial = partial + v[i] * v[i];
  }
  for (; j < n; j += 32) {
    float v = x(j);
    partial = partial + v * v;
  }
  return warp_rms_scale_from(partial, n, eps);
}

// warp_rms_scale_of the n values at x. Plain (coherent) loads: the caller may have written x
// earlier in the same launch.
template <uint32_t AHEAD>
STRATA_FN float warp_rms_scale(const float* x, uint32_t n, float eps) {
  return warp_rms_scale_of<AHEAD>([=](uint32_t j) { return x[j]; }, n, eps);
}

// out[r * n + j] = (x[r * n + j] * scale_r) * w[j]; out does not overlap x.
STRATA_KERNEL(rms_norm)(const float* x, const float* w, float* out, uint32_t rows, uint32_t n, float eps) {
  uint32_t row = block_idx() * STRATA_NORM_WARPS + warp_in_block();
  if (row >= rows) return;  // whole warp
  const float* xr = x + (uint64_t)row * n;
  float* outr = out + (uint64_t)row * n;
  float scale = warp_rms_scale<STRATA_NORM_AHEAD>(xr, n, eps);
  uint32_t j = lane();
  for (; j + 32 * (STRATA_NORM_AHEAD - 1) < n; j += 32 * STRATA_NORM_AHEAD) {
    float xv[STRATA_NORM_AHEAD], wv[STRATA_NORM_AHEAD];
#pragma unroll
    for (int i = 0; i < STRATA_NORM_AHEAD; i++) {
      xv[i] = xr[j + 32 * i];
      wv[i] = __builtin_bit_cast(float, ld_nc_u32((const uint8_t*)(w + j + 32 * i)));
    }
#pragma unroll
    for (int i = 0; i < STRATA_NORM_AHEAD; i++) outr[j + 32 * i] = (xv[i] * scale) * wv[i];
  }
  for (; j < n; j += 32) {
    float wj = __builtin_bit_cast(float, ld_nc_u32((const uint8_t*)(w + j)));
    outr[j] = (xr[j] * scale) * wj;
  }
}

// out[i] = a[i] + b[i]; out may be a itself (thread i alone reads a[i], then writes out[i]).
STRATA_KERNEL(add_f32)(const float* a, const float* b, float* out, uint32_t n) {
  uint32_t i = block_idx() * STRATA_ADD_THREADS + thread_idx();
  if (i >= n) return;
  float bi = __builtin_bit_cast(float, ld_nc_u32((const uint8_t*)(b + i)));
  out[i] = a[i] + bi;
}

// rms_norm then quantize_q8_1 of its output: out[r * n + j] = (x[r * n + j] * scale_r) * w[j],
// and q8_1 block r * n / 32 + g of xq the quantized group g of row r of out. rows * parts blocks
// (parts = ceil(n / 32 / STRATA_NQ_WARPS)), n * 4 bytes of dynamic shared memory; block b takes
// row b / parts, part b % parts, its warp w the group g = part * STRATA_NQ_WARPS + w. The block
// stages the whole row in shared memory (16-byte loads, STRATA_NQ_AHEAD in flight a thread);
// after one barrier every warp computes the row's scale from there itself (the one-warp order:
// the same bits everywhere), then normalizes, stores and quantizes its group. x 16-byte
// aligned; out and xq overlap nothing. (The Rust entry's L2 prefetch of w before the grid wait
// has no twin here: HIP launches are never chained.)
STRATA_KERNEL(rms_norm_q8_1)(const float* x, const float* w, float* out, uint8_t* xq, uint32_t rows, uint32_t n,
                             float eps) {
  uint32_t groups = n / STRATA_GROUP, parts = (groups + STRATA_NQ_WARPS - 1) / STRATA_NQ_WARPS;
  uint32_t row = block_idx() / parts, part = block_idx() % parts;
  uint32_t g = part * STRATA_NQ_WARPS + warp_in_block();
  if (row >= rows) return;  // the whole block (a padded grid's), before the barrier
  // The lane's norm weight, loaded before the row (the CUDA entry loads it before its grid wait).
  uint32_t j = g * STRATA_GROUP + lane();
  float wj = g < groups ? __builtin_bit_cast(float, ld_nc_u32((const uint8_t*)(w + j))) : 0.0f;
  uint64_t at = (uint64_t)row * n;
  // The row into shared memory: 16-byte chunk c (values 4c .. 4c + 4) by thread c % threads,
  // STRATA_NQ_AHEAD loads in flight before their stores.
  const float* xr = x + at;
  const uint32_t threads = 32 * STRATA_NQ_WARPS, chunks = n / 4;
  for (uint32_t c0 = thread_idx(); c0 < chunks; c0 += threads * STRATA_NQ_AHEAD) {
    uint32_t v[STRATA_NQ_AHEAD][4];
#pragma unroll
    for (uint32_t i = 0; i < STRATA_NQ_AHEAD; i++) {
      if (c0 + threads * i < chunks) ld_v4((const uint8_t*)(xr + 4 * (c0 + threads * i)), v[i]);
    }
#pragma unroll
    for (uint32_t i = 0; i < STRATA_NQ_AHEAD; i++) {
      if (c0 + threads * i < chunks) smem_st_v4(4 * (c0 + threads * i), v[i]);
    }
  }
  sync_threads();
  if (g >= groups) return;  // the whole warp, after the block's only barrier
  auto xs = [](uint32_t j) { return __builtin_bit_cast(float, strata_smem[j]); };
  float scale = warp_rms_scale_of<STRATA_NORM_AHEAD>(xs, n, eps);
  float v = (xs(j) * scale) * wj;
  out[at + j] = v;
  quantize_group(v, xq + (at / STRATA_GROUP + g) * STRATA_Q8_1_BYTES);
}
