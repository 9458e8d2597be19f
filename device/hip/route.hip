// router_topk: the MoE router's softmax, top-k and renormalisation, one warp per token. Twin of
// device/src/kernels/route.rs; spec in gpu-shared/src/replica/route.rs. Uses head.hip's Best,
// keep_better, warp_best, argmax_better, top_prob_term and ld_f32 (earlier in the translation unit).
#include "strata_hip.h"

STRATA_KERNEL(router_topk)(const float* logits, uint32_t tokens, uint32_t n_expert, uint32_t k, uint32_t* ids, float* weights) {
  uint32_t t = block_idx() * STRATA_ROUTER_WARPS + warp_in_block();
  if (t >= tokens) return;  // padded grid: the whole warp
  const float* row = logits + (uint64_t)t * n_expert;
  uint32_t ln = lane();
  float p[STRATA_ROUTER_PER_LANE];
  float m = __builtin_bit_cast(float, 0xff800000u);
#pragma unroll
  for (uint32_t i = 0; i < STRATA_ROUTER_PER_LANE; i++) {
    p[i] = __builtin_bit_cast(float, 0x7fc00000u);
    if (ln + 32 * i < n_expert) {
      p[i] = ld_f32(row, ln + 32 * i);
      m = max_f32(m, p[i]);
    }
  }
  m = warp_max_f32(m);
#pragma unroll
  for (uint32_t i = 0; i < STRATA_ROUTER_PER_LANE; i++) p[i] = top_prob_term(p[i], m);
  // The pick before slot 0 (replica::route::FIRST): every p is at most 1.
  Best prev{__builtin_bit_cast(float, 0x7f800000u), 0}, mine{0.0f, 0};
  float sum = 0.0f;
  for (uint32_t r = 0; r < k; r++) {
    Best best{-1.0f, NONE};  // loses to every expert
#pragma unroll
    for (uint32_t i = 0; i < STRATA_ROUTER_PER_LANE; i++) {
      uint32_t j = ln + 32 * i;
      if (j < n_expert && argmax_better(prev.v, prev.i, p[i], j)) keep_better(best, p[i], j);
    }
    best = warp_best(best);
    if (ln == r) mine = best;
    sum = sum + best.v;
    prev = best;
  }
  if (ln < k) {
    uint64_t at = (uint64_t)t * k + ln;
    ids[at] = mine.i;
    weights[at] = sum == 0.0f ? 0.0f : mine.v / sum;
  }
}
