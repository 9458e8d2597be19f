// router_topk: the MoE router's softmax, top-k and renormalisation, one warp per token. Twin of
// device/src/kernels/route.rs; spec in gpu-shared/src/replica/route.rs. Uses head.hip's
// top_prob_term and ld_f32 and moe.hip's table offsets (earlier in the translation unit).
//
// Lane l holds experts l, l + 32, ... as prob_keys (order::prob_key: the probability's bits above
// the inverted id, whose integer order is argmax_better's) and keeps the best of them; each of
// the k passes takes the warp's maximum key, the best expert not yet taken (the spec's pick), and
// the lane that held it clears that slot and finds its next best. With table not null (a
// one-token window) it also writes the window's group table: k groups of one pick in increasing
// id, lane r's group its pick's rank among the picks.
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

// The best of a lane's keys (0 when it holds none), as a tree of pairwise maxima (four dependent
// steps, not fifteen).
STRATA_FN uint64_t lane_best(const uint64_t (&key)[STRATA_ROUTER_PER_LANE]) {
  uint64_t m[STRATA_ROUTER_PER_LANE];
#pragma unroll
  for (uint32_t i = 0; i < STRATA_ROUTER_PER_LANE; i++) m[i] = key[i];
#pragma unroll
  for (uint32_t half = STRATA_ROUTER_PER_LANE / 2; half > 0; half /= 2) {
#pragma unroll
    for (uint32_t i = 0; i < half; i++) m[i] = m[i + half] > m[i] ? m[i + half] : m[i];
  }
  return m[0];
}

// moe::group's table of one token's k picks (distinct ids below n_expert), lane r holding pick r.
STRATA_FN void one_token_table(uint32_t id, uint32_t k, uint32_t* table) {
  uint32_t ln = lane(), rank = 0;
  for (uint32_t r = 0; r < k; r++) rank += shfl_u32(id, r) < id ? 1u : 0u;
  if (ln < k) {
    table[MOE_EXPERT(k) + rank] = id;
    table[MOE_START(k) + rank] = rank;
    table[MOE_COUNT(k) + rank] = 1;
    table[MOE_ENTRIES(k) + rank] = ln;
  }
  if (ln == 0) table[0] = k, table[1] = 0;
}

STRATA_KERNEL(router_topk)(const float* logits, uint32_t tokens, uint32_t n_expert, uint32_t k, uint32_t* ids, float* weights,
                           uint32_t* table) {
  uint32_t t = block_idx() * STRATA_ROUTER_WARPS + warp_in_block();
  if (t >= tokens) return;  // padded grid: the whole warp
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
  if (table != nullptr) one_token_table(mine_id, k, table);
}
