// router_topk: the MoE router's softmax, top-k and renormalisation, one block of
// STRATA_ROUTER_THREADS per token. Twin of device/src/kernels/route.rs; spec in
// gpu-shared/src/replica/route.rs. Uses head.hip's top_prob_term and ld_f32 and moe.hip's table
// offsets (earlier in the translation unit).
//
// Thread i holds expert i and stores its prob_key (order::prob_key: the probability's bits above
// the inverted id, whose integer order is argmax_better's) into shared memory, 0 past n_expert. An
// expert's selection slot is its rank, the number of keys that beat its own: the block's
// STRATA_ROUTER_PARTS parts count it over a range of the keys each (ranker h of a part takes
// experts h, h + STRATA_ROUTER_RANKERS, ..., 8 keys a turn), each expert adds its parts' counts,
// and an expert of rank r < k writes pick r. Warp 0 adds the picks in slot order and stores them.
// With table not null (a one-token window) it also writes the window's group table: k groups of
// one pick in increasing id, lane r's group its pick's rank among the picks.
#include "strata_hip.h"

STRATA_FN uint64_t prob_key(float p, uint32_t i) {
  return ((uint64_t)__builtin_bit_cast(uint32_t, p) << 32) | (uint64_t)(~i);
}

STRATA_FN uint64_t router_smem_key(uint32_t e) {
  return (uint64_t)strata_smem[STRATA_ROUTER_KEY_WORD + 2 * e] | (uint64_t)strata_smem[STRATA_ROUTER_KEY_WORD + 2 * e + 1] << 32;
}

// How many of the keys of turns from..to (8 keys a turn) in shared memory beat each of ranker h's S
// experts h, h + STRATA_ROUTER_RANKERS, .... It counts the keys that do not, by the sign of
// other + ~key = other - key - 1 (mod 2^64): every key is below 2^63 (a probability's bits, at most
// 1.0's, above 32 bits of id), so that difference is negative exactly when other <= key. Each of a
// turn's eight keys counts into a counter of its own, summed at the end (integer adds: the same
// count in any order), so the adds are not one chain.
template <uint32_t S>
STRATA_FN void router_ranks(uint32_t h, uint32_t from, uint32_t to, uint32_t (&rank)[STRATA_ROUTER_PER_RANKER]) {
  uint64_t not_key[STRATA_ROUTER_PER_RANKER] = {};
#pragma unroll
  for (uint32_t j = 0; j < S; j++) not_key[j] = ~router_smem_key(h + STRATA_ROUTER_RANKERS * j);
  uint32_t below[STRATA_ROUTER_PER_RANKER][8] = {};
  for (uint32_t i = from; i < to; i++) {
    uint64_t other[8];
#pragma unroll
    for (uint32_t u = 0; u < 8; u++) other[u] = router_smem_key(8 * i + u);
#pragma unroll
    for (uint32_t u = 0; u < 8; u++) {
#pragma unroll
      for (uint32_t j = 0; j < S; j++) below[j][u] += (uint32_t)((other[u] + not_key[j]) >> 63);
    }
  }
#pragma unroll
  for (uint32_t j = 0; j < S; j++) {
    rank[j] = to > from ? 8 * (to - from) : 0;
#pragma unroll
    for (uint32_t u = 0; u < 8; u++) rank[j] -= below[j][u];
  }
}

// moe::group's table of one token's k picks (distinct ids below n_expert), lane r holding pick r.
STRATA_FN void one_token_table(uint32_t id, uint32_t k, uint32_t* table) {
  // Every lane's id shuffled before the counting (k <= STRATA_ROUTER_MAX_K).
  uint32_t ln = lane(), rank = 0, ids[STRATA_ROUTER_MAX_K];
#pragma unroll
  for (uint32_t r = 0; r < STRATA_ROUTER_MAX_K; r++) ids[r] = shfl_u32(id, r);
#pragma unroll
  for (uint32_t r = 0; r < STRATA_ROUTER_MAX_K; r++) rank += r < k && ids[r] < id ? 1u : 0u;
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
  uint32_t t = block_idx();
  if (t >= tokens) return;  // padded grid: the whole block
  const float* row = logits + (uint64_t)t * n_expert;
  uint32_t tid = thread_idx(), ln = lane(), w = warp_in_block();
  bool held = tid < n_expert;
  float l = held ? ld_f32(row, tid) : __builtin_bit_cast(float, 0xff800000u);
  // The row's maximum (maxNum: NaN ignored; exact in any order): the warps' maxima folded.
  float m = warp_max_f32(max_f32(__builtin_bit_cast(float, 0xff800000u), l));
  if (ln == 0) strata_smem[STRATA_ROUTER_MAX_WORD + w] = __builtin_bit_cast(uint32_t, m);
  sync_threads();
  m = __builtin_bit_cast(float, 0xff800000u);
#pragma unroll
  for (uint32_t x = 0; x < STRATA_ROUTER_THREADS / 32; x++) m = max_f32(m, __builtin_bit_cast(float, strata_smem[STRATA_ROUTER_MAX_WORD + x]));
  // Every expert's key into shared memory, 0 past n_expert.
  uint64_t key = held ? prob_key(top_prob_term(l, m), tid) : 0;
  strata_smem[STRATA_ROUTER_KEY_WORD + 2 * tid] = (uint32_t)key;
  strata_smem[STRATA_ROUTER_KEY_WORD + 2 * tid + 1] = (uint32_t)(key >> 32);
  sync_threads();
  // Ranker h of part q: its experts' counts over the part's turns, into shared memory.
  uint32_t h = tid % STRATA_ROUTER_RANKERS, q = tid / STRATA_ROUTER_RANKERS;
  uint32_t turns = (n_expert + 7) / 8, per_part = (turns + STRATA_ROUTER_PARTS - 1) / STRATA_ROUTER_PARTS;
  uint32_t from = q * per_part, to = turns < (q + 1) * per_part ? turns : (q + 1) * per_part;
  uint32_t slots = n_expert > h ? (n_expert - h + STRATA_ROUTER_RANKERS - 1) / STRATA_ROUTER_RANKERS : 0;
  uint32_t count[STRATA_ROUTER_PER_RANKER] = {0, 0, 0, 0};
  if (slots == 1) router_ranks<1>(h, from, to, count);
  else if (slots == 2) router_ranks<2>(h, from, to, count);
  else if (slots == 3) router_ranks<3>(h, from, to, count);
  else if (slots >= 4) router_ranks<4>(h, from, to, count);
#pragma unroll
  for (uint32_t j = 0; j < STRATA_ROUTER_PER_RANKER; j++) {
    if (j < slots) strata_smem[STRATA_ROUTER_COUNT_WORD + q * STRATA_ROUTER_MAX_EXPERTS + h + STRATA_ROUTER_RANKERS * j] = count[j];
  }
  sync_threads();
  // Each expert's rank: its parts' counts added.
  if (held) {
    uint32_t rank = 0;
#pragma unroll
    for (uint32_t p = 0; p < STRATA_ROUTER_PARTS; p++) rank += strata_smem[STRATA_ROUTER_COUNT_WORD + p * STRATA_ROUTER_MAX_EXPERTS + tid];
    if (rank < k) {
      strata_smem[STRATA_ROUTER_PICK_WORD + rank] = (uint32_t)(key >> 32);
      strata_smem[STRATA_ROUTER_PICK_WORD + STRATA_ROUTER_MAX_K + rank] = tid;
    }
  }
  sync_threads();
  if (w != 0) return;
  // Warp 0: the picks' sum in slot order (every lane), lane r stores pick r.
  // Every pick's probability loaded before the first add, then added in slot order.
  float probs[STRATA_ROUTER_MAX_K];
#pragma unroll
  for (uint32_t r = 0; r < STRATA_ROUTER_MAX_K; r++) probs[r] = r < k ? __builtin_bit_cast(float, strata_smem[STRATA_ROUTER_PICK_WORD + r]) : 0.0f;
  float sum = 0.0f;
#pragma unroll
  for (uint32_t r = 0; r < STRATA_ROUTER_MAX_K; r++) if (r < k) sum = sum + probs[r];
  float mine_p = 0.0f;
  uint32_t mine_id = 0;
  if (ln < k) {
    mine_p = __builtin_bit_cast(float, strata_smem[STRATA_ROUTER_PICK_WORD + ln]);
    mine_id = strata_smem[STRATA_ROUTER_PICK_WORD + STRATA_ROUTER_MAX_K + ln];
    uint64_t at = (uint64_t)t * k + ln;
    ids[at] = mine_id;
    weights[at] = sum == 0.0f ? 0.0f : mine_p / sum;
  }
  if (table != nullptr) one_token_table(mine_id, k, table);
}
