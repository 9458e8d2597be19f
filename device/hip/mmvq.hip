// mmvq: a quantized weight matrix (m rows) times 1..8 q8_1 activation rows. Twin of
// device/src/kernels/mmvq.rs: one warp per weight row, lane l takes groups l, l+32, ..., one
// partial per activation row, then the warp butterfly (gpu-shared/src/order.rs, mmvq).
#include "strata_hip.h"

// Sizes and the IQ4_NL codebook words (STRATA_*) come from gpu-shared through the generated
// prelude, so the two sides cannot drift apart.

// Q8_0: fp16 d, 32 x i8. Loads the scale and the 8 words of packed values.
struct Q8_0 {
  static constexpr uint32_t BYTES = STRATA_Q8_0_BYTES;
  STRATA_FN float load(const uint8_t* p, uint32_t* w) {
    for (int i = 0; i < 8; i++) w[i] = ld_nc_u32_a2(p + 2 + 4 * i);
    return f16_to_f32(ld_nc_u16(p));
  }
};

// Four codes (one per byte) to their four levels: two byte permutes and a select on bit 3.
STRATA_FN uint32_t iq4_nl_levels(uint32_t codes) {
  uint32_t sel = (codes & 0x7u) | (codes >> 4 & 0x70u) | (codes >> 8 & 0x700u) | (codes >> 12 & 0x7000u);
  uint32_t low = prmt(STRATA_IQ4_NL_W0, STRATA_IQ4_NL_W1, sel);
  uint32_t high = prmt(STRATA_IQ4_NL_W2, STRATA_IQ4_NL_W3, sel);
  uint32_t upper = ((codes >> 3) & 0x01010101u) * 0xffu;
  return (high & upper) | (low & ~upper);
}

// IQ4_NL: fp16 d, 16 bytes of nibbles (values 0-15 low nibbles, 16-31 high nibbles).
struct Iq4Nl {
  static constexpr uint32_t BYTES = STRATA_IQ4_NL_BYTES;
  STRATA_FN float load(const uint8_t* p, uint32_t* w) {
    for (int i = 0; i < 4; i++) {
      uint32_t nibbles = ld_nc_u32_a2(p + 2 + 4 * i);
      w[i] = iq4_nl_levels(nibbles & 0x0f0f0f0fu);
      w[i + 4] = iq4_nl_levels((nibbles >> 4) & 0x0f0f0f0fu);
    }
    return f16_to_f32(ld_nc_u16(p));
  }
};

template <typename F>
static __device__ __forceinline__ void mmvq(const uint8_t* w, const uint8_t* x, float* y, uint32_t m,
                                            uint32_t groups, uint32_t rows) {
  uint32_t row = block_idx() * STRATA_MMVQ_WARPS + warp_in_block();
  if (row >= m) return;
  uint32_t l = lane();
  const uint8_t* wrow = w + (uint64_t)row * groups * F::BYTES;
  float acc[STRATA_MMVQ_MAX_ROWS];
#pragma unroll
  for (int r = 0; r < STRATA_MMVQ_MAX_ROWS; r++) acc[r] = 0.0f;
  for (uint32_t b = l; b < groups; b += 32) {
    uint32_t wq[8];
    float dw = F::load(wrow + (uint64_t)b * F::BYTES, wq);
#pragma unroll
    for (int r = 0; r < STRATA_MMVQ_MAX_ROWS; r++) {
      if ((uint32_t)r >= rows) continue;
      const uint8_t* xb = x + ((uint64_t)r * groups + b) * STRATA_Q8_1_BYTES;
      float dx = f16_to_f32(ld_nc_u16(xb));
      int32_t s = 0;
#pragma unroll
      for (int i = 0; i < 8; i++) s = dp4a(wq[i], ld_nc_u32(xb + 4 + 4 * i), s);
      acc[r] = acc[r] + (dw * dx) * (float)s;
    }
  }
#pragma unroll
  for (int r = 0; r < STRATA_MMVQ_MAX_ROWS; r++) {
    if ((uint32_t)r >= rows) continue;
    float v = warp_sum_f32(acc[r]);
    if (l == (uint32_t)r) y[(uint64_t)r * m + row] = v;
  }
}

STRATA_KERNEL(mmvq_q8_0)(const uint8_t* w, const uint8_t* x, float* y, uint32_t m, uint32_t groups, uint32_t rows) {
  mmvq<Q8_0>(w, x, y, m, groups, rows);
}

STRATA_KERNEL(mmvq_iq4_nl)(const uint8_t* w, const uint8_t* x, float* y, uint32_t m, uint32_t groups, uint32_t rows) {
  mmvq<Iq4Nl>(w, x, y, m, groups, rows);
}
