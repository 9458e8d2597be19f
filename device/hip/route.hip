// router_topk: the MoE router's softmax, top-k and renormalisation, one warp per token, and
// router_topk_group: the same for a window in one block, then the window's group table
// (moe.hip's moe_group_table) in the same launch. Twin of device/src/kernels/route.rs; specs in
// gpu-shared/src/replica/route.rs and gpu-shared/src/moe.rs. Uses head.hip's top_prob_term and
// ld_f32, and moe.hip's moe_group_table (earlier in the translation unit).
//
// Lane l holds experts l, l + 32, ... as prob_keys (order::prob_key: the probability's bits above
// the inverted id, whose integer order is argmax_better's) and keeps the best of them; each of
// the k passes takes the warp's maximum key, the best expert not yet taken (the spec's pick), and
// the lane that held it clears that slot and finds its next best.
#include "strata_hip.h"

STRATA_FN uint64_t prob_key(float p, uint32_t i) {
  return ((uint64_t)__builtin_bit_cast(uint32_t, p) << 32) | (uint64_t)(~i);
}

// The warp's maximum key, in every lane: the high words' maximum, then the low words' among the
// lanes holding it.
STRATA_FN uint64_t warp_max_key(uint64_t v) {
  uint32_t hi = (uint32_t)(v >> 32), lo = (uint32_t)v;
  for (uint32_t o = 16; o > 0; o >>= 1) {
    uint32_t h = shfl_xor_u32(hi, o);
    hi = h > hi ? h : hi;
  }
  lo = (uint32_t)(v >> 32) == hi ? lo : 0u;
  for (uint32_t o = 16; o > 0; o >>= 1) {
    uint32_t x = shfl_xor_u32(lo, o);
    lo = x > lo ? x : lo;
  }
  return ((uint64_t)hi << 32) | lo;
}

STRATA_FN uint64_t lane_best(const uint64_t (&key)[STRATA_ROUTER_PER_LANE]) {
  uint64_t best = 0;
#pragma unroll
  for (uint32_t i = 0; i < STRATA_ROUTER_PER_LANE; i++) best = key[i] > best ? key[i] : best;
  return best;
}

// Routes token t (its k ids and weights from its row of n_expert logits), one warp. Twin of
// route.rs route_token.
STRATA_FN void route_token(const float* logits, uint32_t t, uint32_t n_expert, uint32_t k, uint32_t* ids, float* weights) {
  const float* row = logits + (uint64_t)t * n_expert;
  uint32_t ln = lane();
  float l[STRATA_ROUTER_PER_LANE];
  float m = __builtin_bit_cast(float, 0xff800000u);
#pragma unroll
  for (uint32_t i = 0; i < STRATA_ROUTER_PER_LANE; i++) {
    l[i] = 0.0f;
    if (ln + 32 * i < n_expert) {
      l[i] = ld_f32(row, ln + 32 * i);
      m = max_f32(m, l[i]);
    }
  }
  m = warp_max_f32(m);
  // Slots past n_expert keep key 0, below every expert's.
  uint64_t key[STRATA_ROUTER_PER_LANE];
#pragma unroll
  for (uint32_t i = 0; i < STRATA_ROUTER_PER_LANE; i++)
    key[i] = ln + 32 * i < n_expert ? prob_key(top_prob_term(l[i], m), ln + 32 * i) : 0;
  uint64_t best = lane_best(key);
  float mine_p = 0.0f, sum = 0.0f;
  uint32_t mine_id = 0;
  for (uint32_t r = 0; r < k; r++) {
    uint64_t pick = warp_max_key(best);
    float p = __builtin_bit_cast(float, (uint32_t)(pick >> 32));
    uint32_t id = ~(uint32_t)pick;
    if (ln == r) mine_p = p, mine_id = id;
    sum = sum + p;
    if (id % 32 == ln) {
#pragma unroll
      for (uint32_t i = 0; i < STRATA_ROUTER_PER_LANE; i++)
        if (i == id / 32) key[i] = 0;
      best = lane_best(key);
    }
  }
  if (ln < k) {
    uint64_t at = (uint64_t)t * k + ln;
    ids[at] = mine_id;
    weights[at] = sum == 0.0f ? 0.0f : mine_p / sum;
  }
}

STRATA_KERNEL(router_topk)(const float* logits, uint32_t tokens, uint32_t n_expert, uint32_t k, uint32_t* ids, float* weights) {
  uint32_t t = block_idx() * STRATA_ROUTER_WARPS + warp_in_block();
  if (t >= tokens) return;  // padded grid: the whole warp
  route_token(logits, t, n_expert, k, ids, weights);
}

// router_topk and moe_group in one launch of one block (tokens <= STRATA_ROUTER_GROUP_WARPS):
// warp t routes token t; after the block barrier warp 0 builds the group table of the tokens * k
// selections, reading the ids with plain loads (this grid wrote them: not through ld_nc), and
// the other warps leave. Twin of route.rs router_topk_group.
STRATA_KERNEL(router_topk_group)(const float* logits, uint32_t tokens, uint32_t n_expert, uint32_t k, uint32_t* ids, float* weights, uint32_t* table) {
  if (block_idx() != 0) return;  // padded grid: the whole block
  uint32_t t = warp_in_block();
  if (t < tokens) route_token(logits, t, n_expert, k, ids, weights);
  sync_threads();  // every selection written, and visible to the block
  if (t == 0) moe_group_table(ids, tokens * k, n_expert, table, [](const uint32_t* p, uint32_t i) { return p[i]; });
}
