// expdec_gu_*: the EXPDEC variant of moe_gu_*, same bits. Twin of
// device/src/kernels/expdec_gu.rs: a block takes rb gate/up rows of one group's expert; the
// group's q8_1 rows are staged EXPDEC_ENTRIES at a time and the codebook (its copy repeated a
// lane where it has one) once per block, first; R weight rows per lane share the staged words; the
// first pass skips its pre-staging barrier.
// Shared words: the stage, H[4][rb], the codebook. down and down_bytes carry the expert's down
// rows, which the sm_90 image's entries ask L2 for (a hint, no value depends on it); these
// entries issue no prefetch.
#include "strata_hip.h"
#include "blocks.hip"
#include "mmvq.hip"
#include "quantize_q8_1.hip"
#include "moe.hip"
#include "stage.hip"

template <typename F, int R, uint32_t THREADS>
static __device__ __forceinline__ void expdec_gu(const uint8_t* gate, const uint8_t* up, uint64_t expert_bytes,
                                                 const uint8_t* xq, const uint32_t* table, uint32_t n, uint32_t k,
                                                 uint32_t groups, uint32_t n_ff, uint32_t rb, uint8_t* hq) {
  const uint32_t warps = THREADS / 32;
  uint32_t h_base = stage_expdec_words(groups);
  StagedGrid grid = stage_grid<F, THREADS>(h_base + STRATA_EXPDEC_ENTRIES * rb);  // ordered by the first pass's barrier
  uint32_t chunks = n_ff / STRATA_MOE_GU_ROWS, per_block = rb / STRATA_MOE_GU_ROWS;
  uint32_t blocks_per_group = (chunks + per_block - 1) / per_block;
  uint32_t b0 = block_idx();
  uint32_t expert, start, count;
  if (!moe_group_of(table, n, b0 / blocks_per_group, expert, start, count)) return;
  uint32_t chunk0 = b0 % blocks_per_group * per_block;
  uint32_t mine = per_block < chunks - chunk0 ? per_block : chunks - chunk0;
  uint64_t row_bytes = (uint64_t)(groups / F::GROUPS) * F::BYTES;
  gate += expert * expert_bytes;
  up += expert * expert_bytes;
  const uint32_t* entries = table + MOE_ENTRIES(n) + start;
  uint32_t warp = warp_in_block(), rows_per_warp = rb / warps, first = warp * rows_per_warp;
  float pow2 = __builtin_bit_cast(float, (127u - F::SHIFT) << 23);
  for (uint32_t pass = 0; pass < count; pass += STRATA_EXPDEC_ENTRIES) {
    if (pass > 0) sync_lds();
    uint32_t m = count - pass < STRATA_EXPDEC_ENTRIES ? count - pass : STRATA_EXPDEC_ENTRIES;
    stage_rows<THREADS>([&](uint32_t r) { return xq + (uint64_t)(ld_u32w(entries, pass + r) / k) * groups * STRATA_Q8_1_BYTES; }, m, groups, STRATA_EXPDEC_ENTRIES);
    sync_lds();
    for (uint32_t j0 = 0; first < mine * STRATA_MOE_GU_ROWS && j0 < rows_per_warp; j0 += R) {
      uint32_t local = first + j0;
      uint64_t row = (uint64_t)chunk0 * STRATA_MOE_GU_ROWS + local;
      float ag[R][4], au[R][4];
#pragma unroll
      for (int j = 0; j < R; j++)
#pragma unroll
        for (int r = 0; r < 4; r++) ag[j][r] = au[j][r] = 0.0f;
      for (uint32_t b = lane(); b < groups; b += 32) {
        Group gw[R], uw[R];
#pragma unroll
        for (int j = 0; j < R; j++) {
          gw[j] = F::load_with(gate + (row + j) * row_bytes + (uint64_t)(b / F::GROUPS) * F::BYTES, b % F::GROUPS, grid);
          uw[j] = F::load_with(up + (row + j) * row_bytes + (uint64_t)(b / F::GROUPS) * F::BYTES, b % F::GROUPS, grid);
        }
#pragma unroll
        for (int r = 0; r < 4; r++) {
          if ((uint32_t)r < m) {
            uint32_t q[8];
            float dx = staged_block(r, b, groups, STRATA_EXPDEC_ENTRIES, q);
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
            if (lane() == 0) strata_smem[h_base + r * rb + local + j] = __builtin_bit_cast(uint32_t, h);
          }
    }
    sync_lds();
    // One warp per (entry, chunk) quantizes that chunk's 32 SwiGLU outputs.
    for (uint32_t i = warp; i < m * mine; i += warps) {
      uint32_t r = i / mine, c = i % mine;
      uint32_t e = ld_u32w(entries, pass + r);
      float v = __builtin_bit_cast(float, strata_smem[h_base + r * rb + c * STRATA_MOE_GU_ROWS + lane()]);
      quantize_group(v, hq + ((uint64_t)e * chunks + chunk0 + c) * STRATA_Q8_1_BYTES);
    }
  }
}

#define EXPDEC_GU_ENTRY(name, F, R, THREADS)                                                               \
  STRATA_KERNEL(name)(const uint8_t* gate, const uint8_t* up, uint64_t expert_bytes, const uint8_t* xq,    \
                      const uint32_t* table, uint32_t n, uint32_t k, uint32_t groups, uint32_t n_ff,      \
                      uint32_t rb, const uint8_t* down, uint64_t down_bytes, uint8_t* hq) {                \
    (void)down, (void)down_bytes;                                                                          \
    expdec_gu<F, R, THREADS>(gate, up, expert_bytes, xq, table, n, k, groups, n_ff, rb, hq);                \
  }
// 4 blocks per SM, and blocks of 16 warps, only with R=1 and an IQ format (launch/mod.rs:
// EXPDEC_MINB4_MAX_R, EXPDEC_GU_MINB4_FORMATS, EXPDEC_W16_THREADS).
#define EXPDEC_GU_FORMAT_M2(tag, F)                                     \
  EXPDEC_GU_ENTRY(expdec_gu_##tag##_r1_m2, F, 1, STRATA_EXPDEC_THREADS) \
  EXPDEC_GU_ENTRY(expdec_gu_##tag##_r2_m2, F, 2, STRATA_EXPDEC_THREADS)
#define EXPDEC_GU_FORMAT(tag, F)                                        \
  EXPDEC_GU_FORMAT_M2(tag, F)                                           \
  EXPDEC_GU_ENTRY(expdec_gu_##tag##_r1_m4, F, 1, STRATA_EXPDEC_THREADS) \
  EXPDEC_GU_ENTRY(expdec_gu_##tag##_r1_w16, F, 1, STRATA_EXPDEC_W16_THREADS)

EXPDEC_GU_FORMAT_M2(q8_0, Q8_0)
EXPDEC_GU_FORMAT(iq2_xxs, Iq2Xxs)
EXPDEC_GU_FORMAT(iq2_xs, Iq2Xs)
EXPDEC_GU_FORMAT(iq2_s, Iq2S)
EXPDEC_GU_FORMAT(iq3_xxs, Iq3Xxs)
EXPDEC_GU_FORMAT(iq3_s, Iq3S)
EXPDEC_GU_FORMAT(iq3_st, Iq3ST)
// The Rust image's expdec_gu_iq3_st_r1_m2w copies each warp's rows to shared memory with
// asynchronous copies (EXPDEC_WARP_ROWS), which AMD lacks before gfx950: here it is the r1_m2
// body under that name, the same loads' bits from device memory.
EXPDEC_GU_ENTRY(expdec_gu_iq3_st_r1_m2w, Iq3ST, 1, STRATA_EXPDEC_THREADS)
