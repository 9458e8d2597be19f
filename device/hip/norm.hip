// rms_norm (one warp per row) and add_f32 (the residual add, in place allowed). Twin of
// device/src/kernels/norm.rs; specs in gpu-shared/src/replica/norm.rs. warp_rms_scale is the
// RMSNorm scale of one row as a warp computes it; attention's per-head norm calls it too.
#include "strata_hip.h"

// 1 / sqrt_rn(mean(x^2) + eps) of the n values at x (replica::norm::rms_scale): lane p sums
// x[j] * x[j] for j = p, p + 32, ... left to right from +0.0, the warp butterfly adds the
// partials, then mean = total / n. The whole warp calls it, converged; every lane returns the
// same bits. Plain (coherent) loads: the caller may have written x earlier in the same launch.
template <uint32_t AHEAD>
STRATA_FN float warp_rms_scale(const float* x, uint32_t n, float eps) {
  float partial = 0.0f;
  // AHEAD loads in flight before their squares are added, in order.
  uint32_t j = lane();
  for (; j + 32 * (AHEAD - 1) < n; j += 32 * AHEAD) {
    float v[AHEAD];
#pragma unroll
    for (uint32_t i = 0; i < AHEAD; i++) v[i] = x[j + 32 * i];
#pragma unroll
    for (uint32_t i = 0; i < AHEAD; i++) partial = partial + v[i] * v[i];
  }
  for (; j < n; j += 32) {
    float v = x[j];
    partial = partial + v * v;
  }
  float mean = warp_sum_f32(partial) / (float)n;
  return 1.0f / sqrt_rn(mean + eps);
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
