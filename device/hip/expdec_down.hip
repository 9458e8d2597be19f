// expdec_down_*: the EXPDEC variant of moe_down_* for down rows of at most 32 groups, same bits.
// Twin of device/src/kernels/expdec_down.rs: the block's threads form EXPDEC_THREADS / G row
// slots of G threads, thread g of a slot taking group g of DR rows against the staged q8_1 rows;
// partials (+0.0 + c_g) go to shared memory P[4][step_rows][G], then one warp per (entry, row)
// runs the butterfly over them (lanes >= G add +0.0).
#include "strata_hip.h"
#include "blocks.hip"
#include "mmvq.hip"
#include "moe.hip"
#include "stage.hip"

STRATA_FN uint32_t expdec_down_step_rows(uint32_t ff_groups, uint32_t dr) { return STRATA_EXPDEC_THREADS / ff_groups * dr; }

template <typename F, int DR>
static __device__ __forceinline__ void expdec_down(const uint8_t* w, uint64_t expert_bytes, const uint8_t* hq,
                                                   const uint32_t* table, uint32_t n, uint32_t ff_groups,
                                                   uint32_t n_embd, uint32_t drb, float* y) {
  const uint32_t warps = STRATA_EXPDEC_THREADS / 32;
  uint32_t row_blocks = (n_embd + drb - 1) / drb;
  uint32_t b0 = block_idx();
  uint32_t expert, start, count;
  if (!moe_group_of(table, n, b0 / row_blocks, expert, start, count)) return;
  uint32_t first_row = b0 % row_blocks * drb;
  uint32_t end_row = first_row + drb < n_embd ? first_row + drb : n_embd;
  uint32_t G = ff_groups;
  w += expert * expert_bytes;
  uint64_t row_bytes = (uint64_t)(G / F::GROUPS) * F::BYTES;
  const uint32_t* entries = table + MOE_ENTRIES(n) + start;
  uint32_t p_base = stage_expdec_words(G);
  uint32_t slots = STRATA_EXPDEC_THREADS / G, step_rows = expdec_down_step_rows(G, DR);
  uint32_t slot = thread_idx() / G, g = thread_idx() % G;
  uint32_t warp = warp_in_block(), ln = lane();
  float pow2 = __builtin_bit_cast(float, (127u - F::SHIFT) << 23);
  // Threads past the last row slot load a slot's weights too (unused): one code path.
  uint32_t wslot = slot < slots ? slot : slots - 1;
  for (uint32_t pass = 0; pass < count; pass += STRATA_EXPDEC_ENTRIES) {
    uint32_t m = count - pass < STRATA_EXPDEC_ENTRIES ? count - pass : STRATA_EXPDEC_ENTRIES;
    for (uint32_t step = first_row; step < end_row; step += step_rows) {
      // Weights first (rows past the end load a valid row, unused): their latency overlaps the
      // staging.
      Group wg[DR];
#pragma unroll
      for (int j = 0; j < DR; j++) {
        uint32_t row = step + j * slots + wslot;
        if (row > end_row - 1) row = end_row - 1;
        wg[j] = F::load(w + (uint64_t)row * row_bytes + (uint64_t)(g / F::GROUPS) * F::BYTES, g % F::GROUPS);
      }
      if (step == first_row) {
        if (pass > 0) sync_lds();  // the previous pass's readers are done with the stage and P
        stage_rows<STRATA_EXPDEC_THREADS>([&](uint32_t r) { return hq + (uint64_t)ld_u32w(entries, pass + r) * G * STRATA_Q8_1_BYTES; }, m, G, STRATA_EXPDEC_ENTRIES);
      }
      sync_lds();  // after the first step: the previous step's partials have been summed
      if (slot < slots) {
#pragma unroll
        for (int r = 0; r < 4; r++) {
          if ((uint32_t)r < m) {
            uint32_t q[8];
            float dx = staged_block(r, g, G, STRATA_EXPDEC_ENTRIES, q);
#pragma unroll
            for (int j = 0; j < DR; j++) {
              uint32_t row = step + j * slots + slot;
              if (row < end_row) {
                float p = 0.0f + contribution_words(wg[j], q, dx, pow2);
                strata_smem[p_base + (r * step_rows + row - step) * G + g] = __builtin_bit_cast(uint32_t, p);
              }
            }
          }
        }
      }
      sync_lds();
      // One warp per (entry, row): lane p holds partial p, then the butterfly.
      for (uint32_t i = warp; i < m * step_rows; i += warps) {
        uint32_t r = i / step_rows, local = i % step_rows;
        if (step + local < end_row) {
          float p = ln < G ? __builtin_bit_cast(float, strata_smem[p_base + i * G + ln]) : 0.0f;
          float sum = warp_sum_f32(p);
          if (ln == 0) y[(uint64_t)ld_u32w(entries, pass + r) * n_embd + step + local] = sum;
        }
      }
    }
  }
}

#define EXPDEC_DOWN_ENTRY(name, F, DR)                                                                      \
  STRATA_KERNEL(name)(const uint8_t* w, uint64_t expert_bytes, const uint8_t* hq, const uint32_t* table,    \
                      uint32_t n, uint32_t ff_groups, uint32_t n_embd, uint32_t drb, float* y) {           \
    expdec_down<F, DR>(w, expert_bytes, hq, table, n, ff_groups, n_embd, drb, y);                           \
  }
// DR=4 only at 2 blocks per SM (launch/mod.rs: EXPDEC_MINB4_MAX_DR).
#define EXPDEC_DOWN_FORMAT(tag, F)                 \
  EXPDEC_DOWN_ENTRY(expdec_down_##tag##_d1_m2, F, 1) \
  EXPDEC_DOWN_ENTRY(expdec_down_##tag##_d1_m4, F, 1) \
  EXPDEC_DOWN_ENTRY(expdec_down_##tag##_d2_m2, F, 2) \
  EXPDEC_DOWN_ENTRY(expdec_down_##tag##_d2_m4, F, 2) \
  EXPDEC_DOWN_ENTRY(expdec_down_##tag##_d4_m2, F, 4)

EXPDEC_DOWN_FORMAT(q2_0, Q2_0)
EXPDEC_DOWN_FORMAT(iq4_nl, Iq4Nl)
EXPDEC_DOWN_FORMAT(iq4_nlt, Iq4NlT)
