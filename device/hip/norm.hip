// rms_norm (one warp per row), add_f32 (the residual add, in place allowed) and
// add_rms_norm_q8_1 (add_f32 in place, rms_norm and quantize_q8_1 of a row in one warp). Twin of device/src/kernels/norm.rs;
// specs in gpu-shared/src/replica/norm.rs. warp_rms_scale is the RMSNorm scale of one row as a
// warp computes it; attention's per-head norm calls it too.
#include "strata_hip.h"
#include "quantize_q8_1.hip"

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

// add_f32 (in place) + rms_norm + quantize_q8_1 in one launch, with their bits; one block a row
// (STRATA_ADD_NORM_WARPS warps), n a multiple of 32, 4 bytes of dynamic shared memory. Row r:
//   1. if b is not null, acc[r * n + j] = acc[r * n + j] + b[r * n + j], written back (warp w
//      takes the 32-value groups w, w + STRATA_ADD_NORM_WARPS, ...);
//   2. after a barrier, warp 0 alone: scale = warp_rms_scale of that row of acc (the one-warp
//      order of the spec), passed to the block through shared memory;
//   3. out[r * n + j] = (acc[r * n + j] * scale) * w[j];
//   4. q8_1 block r * n / 32 + g of xq = quantize_group of out[r * n + 32 g + lane] (warp w the
//      groups w, w + STRATA_ADD_NORM_WARPS, ...).
// out and xq overlap nothing; acc and b do not overlap.
STRATA_KERNEL(add_rms_norm_q8_1)(float* acc, const float* b, const float* w, float* out, uint8_t* xq, uint32_t rows,
                                 uint32_t n, float eps) {
  uint32_t row = block_idx();
  if (row >= rows) return;  // the whole block, before any barrier
  float* accr = acc + (uint64_t)row * n;
  float* outr = out + (uint64_t)row * n;
  uint8_t* xqr = xq + (uint64_t)row * (n / STRATA_GROUP) * STRATA_Q8_1_BYTES;
  uint32_t groups = n / STRATA_GROUP, wid = warp_in_block(), l = lane();
  if (b != nullptr) {
    const float* br = b + (uint64_t)row * n;
    for (uint32_t g = wid; g < groups; g += STRATA_ADD_NORM_WARPS) {
      uint32_t j = g * STRATA_GROUP + l;
      float bj = __builtin_bit_cast(float, ld_nc_u32((const uint8_t*)(br + j)));
      accr[j] = accr[j] + bj;
    }
  }
  sync_threads();
  if (wid == 0) {
    float scale = warp_rms_scale<STRATA_NORM_AHEAD>(accr, n, eps);
    if (l == 0) strata_smem[0] = __builtin_bit_cast(uint32_t, scale);
  }
  sync_threads();
  float scale = __builtin_bit_cast(float, strata_smem[0]);
  for (uint32_t g = wid; g < groups; g += STRATA_ADD_NORM_WARPS) {
    uint32_t j = g * STRATA_GROUP + l;
    float wj = __builtin_bit_cast(float, ld_nc_u32((const uint8_t*)(w + j)));
    float o = (accr[j] * scale) * wj;
    outr[j] = o;
    quantize_group(o, xqr + (uint64_t)g * STRATA_Q8_1_BYTES);
  }
}
