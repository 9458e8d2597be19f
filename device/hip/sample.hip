// sample_rows: top-k / top-p / temperature sampling, one block per row. Twin of
// device/src/kernels/sample.rs; spec in gpu-shared/src/replica/sample.rs. Uses head.hip's Best,
// keep_better, block_best, argmax_better and ld_f32 (earlier in the translation unit).
#include "strata_hip.h"

// replica::sample::uniform: splitmix64 of the position's state, top 24 bits times 2^-24.
STRATA_FN float sample_uniform(uint64_t seed, uint64_t pos) {
  uint64_t z = seed + (pos + 1) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z = z ^ (z >> 31);
  return (float)(uint32_t)(z >> 40) * __builtin_bit_cast(float, 0x33800000u);
}

STRATA_FN float sample_smem_f32(uint32_t word) { return __builtin_bit_cast(float, strata_smem[word]); }

STRATA_KERNEL(sample_rows)(const float* logits, uint32_t rows, uint32_t n, uint32_t top_k, float top_p, float inv_temp,
                           uint32_t seed_lo, uint32_t seed_hi, const uint32_t* pos, uint32_t* ids) {
  uint32_t row = block_idx();
  if (row >= rows) return;  // padded grid: the whole block
  const float* x = logits + (uint64_t)row * n;
  uint32_t tid = thread_idx();
  uint32_t kk = top_k < n ? top_k : n;
  Best prev{__builtin_bit_cast(float, 0x7fc00000u), NONE};
  for (uint32_t r = 0; r < kk; r++) {
    Best best{__builtin_bit_cast(float, 0x7fc00000u), NONE};  // loses to every element
    for (uint32_t j = tid; j < n; j += STRATA_SAMPLE_THREADS) {
      float v = ld_f32(x, j);
      if (r == 0 || argmax_better(prev.v, prev.i, v, j)) keep_better(best, v, j);
    }
    best = block_best(best);
    if (tid == 0) {
      strata_smem[STRATA_SAMPLE_CAND_IDX + r] = best.i;
      strata_smem[STRATA_SAMPLE_CAND_VAL + r] = __builtin_bit_cast(uint32_t, best.v);
    }
    sync_threads();
    prev = Best{sample_smem_f32(STRATA_SAMPLE_CAND_VAL + r), strata_smem[STRATA_SAMPLE_CAND_IDX + r]};
  }
  float l0 = sample_smem_f32(STRATA_SAMPLE_CAND_VAL);
  float p = tid < kk ? exp_neg((sample_smem_f32(STRATA_SAMPLE_CAND_VAL + tid) - l0) * inv_temp) : 0.0f;
  sync_threads();  // every read of the values is done
  if (tid < kk) strata_smem[STRATA_SAMPLE_CAND_VAL + tid] = __builtin_bit_cast(uint32_t, p);
  sync_threads();
  if (tid == 0) {
    float cum = 0.0f;
    for (uint32_t r = 0; r < kk; r++) {
      cum = cum + sample_smem_f32(STRATA_SAMPLE_CAND_VAL + r);
      strata_smem[STRATA_SAMPLE_CAND_VAL + r] = __builtin_bit_cast(uint32_t, cum);
    }
    float threshold = top_p * cum;
    uint32_t keep = 1;
    while (keep < kk && !(sample_smem_f32(STRATA_SAMPLE_CAND_VAL + keep - 1) >= threshold)) keep++;
    uint64_t seed = (uint64_t)seed_hi << 32 | seed_lo;
    float target = sample_uniform(seed, (uint64_t)ld_nc_u32((const uint8_t*)pos) + row) * sample_smem_f32(STRATA_SAMPLE_CAND_VAL + keep - 1);
    uint32_t rank = 0;
    while (rank < keep - 1 && !(sample_smem_f32(STRATA_SAMPLE_CAND_VAL + rank) > target)) rank++;
    ids[row] = strata_smem[STRATA_SAMPLE_CAND_IDX + rank];
  }
}
