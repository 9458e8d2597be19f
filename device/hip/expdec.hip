// expdec_gu_*: the EXPDEC variant of moe_gu_*, same bits. Twin of device/src/kernels/expdec.rs
// (shared layout LO[4][G][4], HI[4][G][4], D[4][G], H[4][32] words; thread pairs stage one q8_1
// block each; R weight rows per lane share the staged words; first pass skips its pre-staging
// barrier).
#include "strata_hip.h"
#include "blocks.hip"
#include "mmvq.hip"
#include "quantize_q8_1.hip"
#include "moe.hip"

STRATA_FN void expdec_stage(const uint8_t* xq, const uint32_t* entries, uint32_t pass, uint32_t m, uint32_t k, uint32_t groups) {
  uint32_t items = 2 * m * groups;
  for (uint32_t i = thread_idx(); i < items; i += 32 * STRATA_MOE_GU_WARPS) {
    uint32_t item = i / 2, h = i % 2, r = item / groups, b = item % groups;
    uint32_t token = ld_u32w(entries, pass + r) / k;
    const uint8_t* block = xq + ((uint64_t)token * groups + b) * STRATA_Q8_1_BYTES;
    uint32_t* dst = strata_smem + 16 * h * groups + 4 * (r * groups + b);
    for (int w = 0; w < 4; w++) dst[w] = ld_nc_u32(block + STRATA_Q8_1_OFF_Q + 16 * h + 4 * w);
    if (h == 0) strata_smem[32 * groups + r * groups + b] = __builtin_bit_cast(uint32_t, f16_to_f32(ld_nc_u16(block + STRATA_Q8_1_OFF_D)));
  }
}

template <typename F, int R>
static __device__ __forceinline__ void expdec_gu(const uint8_t* gate, const uint8_t* up, uint64_t expert_bytes,
                                                 const uint8_t* xq, const uint32_t* table, uint32_t n, uint32_t k,
                                                 uint32_t groups, uint32_t n_ff, uint8_t* hq) {
  uint32_t chunks = n_ff / STRATA_MOE_GU_ROWS;
  uint32_t b0 = block_idx(), g = b0 / chunks, chunk = b0 % chunks;
  uint32_t expert, start, count;
  if (!moe_group_of(table, n, g, expert, start, count)) return;
  uint64_t row_bytes = (uint64_t)(groups / F::GROUPS) * F::BYTES;
  gate += expert * expert_bytes;
  up += expert * expert_bytes;
  const uint32_t* entries = table + MOE_ENTRIES(n) + start;
  uint32_t h_base = 36 * groups, warp = warp_in_block(), rows_per_warp = STRATA_MOE_GU_ROWS / STRATA_MOE_GU_WARPS;
  float pow2 = __builtin_bit_cast(float, (127u - F::SHIFT) << 23);
  for (uint32_t pass = 0; pass < count; pass += STRATA_EXPDEC_ENTRIES) {
    if (pass > 0) sync_lds();
    uint32_t m = count - pass < STRATA_EXPDEC_ENTRIES ? count - pass : STRATA_EXPDEC_ENTRIES;
    expdec_stage(xq, entries, pass, m, k, groups);
    sync_lds();
    for (uint32_t j0 = 0; j0 < rows_per_warp; j0 += R) {
      uint32_t local = warp * rows_per_warp + j0;
      uint64_t row = (uint64_t)chunk * STRATA_MOE_GU_ROWS + local;
      float ag[R][4], au[R][4];
#pragma unroll
      for (int j = 0; j < R; j++)
#pragma unroll
        for (int r = 0; r < 4; r++) ag[j][r] = au[j][r] = 0.0f;
      for (uint32_t b = lane(); b < groups; b += 32) {
        Group gw[R], uw[R];
#pragma unroll
        for (int j = 0; j < R; j++) {
          gw[j] = F::load(gate + (row + j) * row_bytes + (uint64_t)(b / F::GROUPS) * F::BYTES, b % F::GROUPS);
          uw[j] = F::load(up + (row + j) * row_bytes + (uint64_t)(b / F::GROUPS) * F::BYTES, b % F::GROUPS);
        }
#pragma unroll
        for (int r = 0; r < 4; r++) {
          if ((uint32_t)r < m) {
            uint32_t slot = r * groups + b;
            uint32_t q[8];
            for (int w = 0; w < 4; w++) {
              q[w] = strata_smem[4 * slot + w];
              q[4 + w] = strata_smem[16 * groups + 4 * slot + w];
            }
            float dx = __builtin_bit_cast(float, strata_smem[32 * groups + slot]);
#pragma unroll
            for (int j = 0; j < R; j++) {
              ag[j][r] = ag[j][r] + contribution_words(gw[j], q, dx, pow2);
              au[j][r] = au[j][r] + contribution_words(uw[j], q, dx, pow2);
            }
          }
        }
      }
#pragma unroll
      for (int j = 0; j < R; j++)
#pragma unroll
        for (int r = 0; r < 4; r++)
          if ((uint32_t)r < m) {
            float h = silu(warp_sum_f32(ag[j][r])) * warp_sum_f32(au[j][r]);
            if (lane() == 0) strata_smem[h_base + r * STRATA_MOE_GU_ROWS + local + j] = __builtin_bit_cast(uint32_t, h);
          }
    }
    sync_lds();
    if (warp < m) {
      uint32_t e = ld_u32w(entries, pass + warp);
      float v = __builtin_bit_cast(float, strata_smem[h_base + warp * STRATA_MOE_GU_ROWS + lane()]);
      quantize_group(v, hq + ((uint64_t)e * chunks + chunk) * STRATA_Q8_1_BYTES);
    }
  }
}

#define EXPDEC_ENTRY(tag, F)                                                                                   \
  STRATA_KERNEL(expdec_gu_##tag##_r1)(const uint8_t* gate, const uint8_t* up, uint64_t expert_bytes,          \
                                      const uint8_t* xq, const uint32_t* table, uint32_t n, uint32_t k,      \
                                      uint32_t groups, uint32_t n_ff, uint8_t* hq) {                          \
    expdec_gu<F, 1>(gate, up, expert_bytes, xq, table, n, k, groups, n_ff, hq);                               \
  }                                                                                                            \
  STRATA_KERNEL(expdec_gu_##tag##_r2)(const uint8_t* gate, const uint8_t* up, uint64_t expert_bytes,          \
                                      const uint8_t* xq, const uint32_t* table, uint32_t n, uint32_t k,      \
                                      uint32_t groups, uint32_t n_ff, uint8_t* hq) {                          \
    expdec_gu<F, 2>(gate, up, expert_bytes, xq, table, n, k, groups, n_ff, hq);                               \
  }

EXPDEC_ENTRY(q8_0, Q8_0)
EXPDEC_ENTRY(iq2_xxs, Iq2Xxs)
EXPDEC_ENTRY(iq2_xs, Iq2Xs)
EXPDEC_ENTRY(iq2_s, Iq2S)
EXPDEC_ENTRY(iq3_xxs, Iq3Xxs)
EXPDEC_ENTRY(iq3_s, Iq3S)
