// quantize_q8_0_scaled: f32 rows times per-row or per-column scales to Q8_0 blocks, one warp per
// block; quantize_q8_0_scaled_ref: one thread per block. Twin of
// device/src/kernels/quantize_q8_0.rs; spec in gpu-shared/src/order.rs.
#include "strata_hip.h"

STRATA_FN float scaled(const float* x, uint32_t k, const float* scales, uint32_t per_column, uint32_t i) {
  uint32_t s = per_column ? i % k : i / k;
  float xi = __builtin_bit_cast(float, ld_nc_u32((const uint8_t*)(x + i)));
  return xi * __builtin_bit_cast(float, ld_nc_u32((const uint8_t*)(scales + s)));
}

STRATA_FN int32_t quant(float v, float df) {
  if (df == 0.0f) return 0;
  int32_t q = f32_to_i32_rne(v / df);
  return q < -127 ? -127 : (q > 127 ? 127 : q);
}

STRATA_KERNEL(quantize_q8_0_scaled)(const float* x, uint32_t k, const float* scales, uint32_t per_column, uint32_t groups, uint8_t* out) {
  uint32_t g = block_idx() * STRATA_QUANTIZE_WARPS + warp_in_block();
  if (g >= groups) return;
  uint32_t l = lane();
  float v = scaled(x, k, scales, per_column, g * STRATA_GROUP + l);
  uint16_t d = f32_to_f16(min_f32(warp_max_f32(abs_f32(v)) / 127.0f, 65504.0f));
  uint8_t* block = out + (uint64_t)g * STRATA_Q8_0_BYTES;
  block[STRATA_Q8_0_OFF_Q + l] = (uint8_t)(int8_t)quant(v, f16_to_f32(d));
  if (l == 0) *(uint16_t*)(block + STRATA_Q8_0_OFF_D) = d;
}

STRATA_KERNEL(quantize_q8_0_scaled_ref)(const float* x, uint32_t k, const float* scales, uint32_t per_column, uint32_t groups, uint8_t* out) {
  uint32_t g = block_idx() * STRATA_THREADS_quantize_q8_0_scaled_ref + thread_idx();
  if (g >= groups) return;
  uint32_t base = g * STRATA_GROUP;
  float amax = 0.0f;
  for (uint32_t j = 0; j < STRATA_GROUP; j++) amax = max_f32(amax, abs_f32(scaled(x, k, scales, per_column, base + j)));
  uint16_t d = f32_to_f16(min_f32(amax / 127.0f, 65504.0f));
  float df = f16_to_f32(d);
  uint8_t* block = out + (uint64_t)g * STRATA_Q8_0_BYTES;
  for (uint32_t j = 0; j < STRATA_GROUP; j++) block[STRATA_Q8_0_OFF_Q + j] = (uint8_t)(int8_t)quant(scaled(x, k, scales, per_column, base + j), df);
  *(uint16_t*)(block + STRATA_Q8_0_OFF_D) = d;
}
