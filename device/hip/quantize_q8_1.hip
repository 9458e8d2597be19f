// quantize_q8_1: f32 activations to q8_1 blocks, one warp per 32-value group, lane j owning
// value j. Twin of device/src/kernels/quantize_q8_1.rs; spec in gpu-shared/src/order.rs.
#include "strata_hip.h"

// One warp quantizes one group, lane j holding value v, into the block at `block`.
STRATA_FN void quantize_group(float v, uint8_t* block) {
  uint32_t l = lane();
  float amax = warp_max_f32(abs_f32(v));
  uint16_t d = f32_to_f16(min_f32(amax / 127.0f, 65504.0f));
  float df = f16_to_f32(d);
  int32_t q = 0;
  if (df != 0.0f) {
    q = f32_to_i32_rne(v / df);
    q = q < -127 ? -127 : (q > 127 ? 127 : q);
  }
  int32_t sum = warp_sum_i32(q);
  block[STRATA_Q8_1_OFF_Q + l] = (uint8_t)(int8_t)q;
  if (l == 0) {
    *(uint16_t*)(block + STRATA_Q8_1_OFF_D) = d;
    *(uint16_t*)(block + STRATA_Q8_1_OFF_S) = f32_to_f16(df * (float)sum);
  }
}

STRATA_KERNEL(quantize_q8_1)(const float* x, uint8_t* out, uint32_t groups) {
  uint32_t g = block_idx() * STRATA_QUANTIZE_WARPS + warp_in_block();
  if (g >= groups) return;
  float v = __builtin_bit_cast(float, ld_nc_u32((const uint8_t*)(x + g * STRATA_GROUP + lane())));
  quantize_group(v, out + (uint64_t)g * STRATA_Q8_1_BYTES);
}
