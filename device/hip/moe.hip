// Routed experts for a verify window: moe_group, moe_gu_* (gate/up + SwiGLU + q8_1, fused),
// moe_down_*, moe_combine. Twin of device/src/kernels/moe.rs; specs in gpu-shared/src/moe.rs and
// the mmvq order.
#include "strata_hip.h"
#include "blocks.hip"
#include "mmvq.hip"
#include "quantize_q8_1.hip"

// Table layout (gpu-shared/src/moe.rs): [groups, errors, expert[n], start[n], count[n], entries[n]].
#define MOE_EXPERT(n) 2u
#define MOE_START(n) (2u + (n))
#define MOE_COUNT(n) (2u + 2u * (n))
#define MOE_ENTRIES(n) (2u + 3u * (n))

STRATA_FN uint32_t ld_u32w(const uint32_t* p, uint64_t i) { return ld_nc_u32((const uint8_t*)(p + i)); }

// moe::group (groups in increasing expert id, entries in increasing selection index), built by
// one block from the ids staged in shared memory (padded to a multiple of 4 with 0xffffffff, which
// equals and precedes no valid id; the scans read 16 bytes at a time). Selection e has P =
// moe_group_parts(n) (launch::moe_group_parts) adjacent threads, t = e * P + part, each scanning
// the quads part, part + P, ..; shuffles join their counts. (1) whether e is its id's first
// selection, kept beside the ids; (2) for a valid id: the valid selections of smaller ids (the
// group's start), the firsts among them (the group's index), the earlier selections of id (e's
// place in the group) and all of them (the count); (3) the selection's first thread writes its
// entry and, for a first selection, its group; the block's totals (a word a warp) place the rest.
// Every word has one writer. launch::MOE_GROUP_SMEM bytes of shared memory.
STRATA_FN uint32_t moe_group_parts(uint32_t n) {
  uint32_t parts = 32;
  while (parts > 1 && n * parts > STRATA_MOE_GROUP_THREADS) parts /= 2;
  return parts;
}

STRATA_KERNEL(moe_group)(const uint32_t* ids, uint32_t n, uint32_t n_expert, uint32_t* table) {
  if (block_idx() != 0) return;  // the whole block
  const uint32_t t = thread_idx(), padded = (n + 3u) / 4u * 4u, parts = moe_group_parts(n);
  const uint32_t e = t / parts, part = t % parts;
  const uint32_t first_at = STRATA_MOE_MAX_SELECTIONS, counts_at = 2 * STRATA_MOE_MAX_SELECTIONS;
  if (t < padded) {
    strata_smem[t] = t < n ? ld_u32w(ids, t) : 0xffffffffu;
    if (t >= n) strata_smem[first_at + t] = 0;
  }
  sync_threads();
  const bool live = e < n;
  const uint32_t id = live ? strata_smem[e] : 0xffffffffu;
  uint32_t seen[1] = {0};
  for (uint32_t f = 4 * part; f < (live ? e : 0u); f += 4 * parts) {
    uint32_t other[4];
    smem_ld_v4(f, other);
#pragma unroll
    for (uint32_t j = 0; j < 4; j++) seen[0] += (f + j < e && other[j] == id) ? 1u : 0u;
  }
  sum_lanes_u32(seen, parts);
  if (part == 0 && live) strata_smem[first_at + e] = seen[0] == 0 ? 1u : 0u;
  sync_threads();
  // Two counts a word (each at most 256): below | same << 16, distinct_below | before << 16.
  uint32_t below_same = 0, distinct_before = 0;
  if (live && id < n_expert) {
    for (uint32_t f = 4 * part; f < padded; f += 4 * parts) {
      uint32_t other[4], firsts[4];
      smem_ld_v4(f, other);
      smem_ld_v4(first_at + f, firsts);
#pragma unroll
      for (uint32_t j = 0; j < 4; j++) {
        if (other[j] < id) {
          below_same += 1;
          distinct_before += firsts[j];
        } else if (other[j] == id) {
          below_same += 1u << 16;
          distinct_before += (f + j < e ? 1u : 0u) << 16;
        }
      }
    }
  }
  uint32_t counts[2] = {below_same, distinct_before};
  sum_lanes_u32(counts, parts);
  below_same = counts[0], distinct_before = counts[1];
  // Totals packed groups | filled << 10 | errors << 20 (each at most 256).
  uint32_t totals = 0;
  if (part == 0 && live) {
    if (id >= n_expert) {
      totals = 1u << 20;
    } else {
      const uint32_t below = below_same & 0xffffu, same = below_same >> 16;
      const uint32_t distinct_below = distinct_before & 0xffffu, before = distinct_before >> 16;
      table[MOE_ENTRIES(n) + below + before] = e;
      totals = 1u << 10;
      if (before == 0) {
        table[MOE_EXPERT(n) + distinct_below] = id;
        table[MOE_START(n) + distinct_below] = below;
        table[MOE_COUNT(n) + distinct_below] = same;
        totals += 1;
      }
    }
  }
  totals = (uint32_t)warp_sum_i32((int32_t)totals);
  if (lane() == 0) strata_smem[counts_at + warp_in_block()] = totals;
  sync_threads();
  totals = 0;
  for (uint32_t w = 0; w < STRATA_MOE_GROUP_THREADS / 32; w++) totals += strata_smem[counts_at + w];
  const uint32_t groups = totals & 0x3ffu, filled = (totals >> 10) & 0x3ffu, errors = totals >> 20;
  for (uint32_t g = groups + t; g < n; g += STRATA_MOE_GROUP_THREADS) {
    table[MOE_EXPERT(n) + g] = 0;
    table[MOE_START(n) + g] = filled;
    table[MOE_COUNT(n) + g] = 0;
  }
  for (uint32_t i = filled + t; i < n; i += STRATA_MOE_GROUP_THREADS) table[MOE_ENTRIES(n) + i] = 0;
  if (t == 0) {
    table[0] = groups;
    table[1] = errors;
  }
}

// Group g of the table: false past the groups, else its expert, first entry and entry count.
STRATA_FN bool moe_group_of(const uint32_t* table, uint32_t n, uint32_t g, uint32_t& expert, uint32_t& start, uint32_t& count) {
  if (g >= ld_u32w(table, 0)) return false;
  expert = ld_u32w(table, MOE_EXPERT(n) + g);
  start = ld_u32w(table, MOE_START(n) + g);
  count = ld_u32w(table, MOE_COUNT(n) + g);
  return true;
}

// moe::silu and swiglu, from exp_neg.
STRATA_FN float silu(float g) {
  if (g >= 0.0f) return g / (1.0f + exp_neg(-g));
  float e = exp_neg(g);
  return (g * e) / (1.0f + e);
}

template <typename F>
static __device__ __forceinline__ void moe_gu(const uint8_t* gate, const uint8_t* up, uint64_t expert_bytes,
                                              const uint8_t* xq, const uint32_t* table, uint32_t n, uint32_t k,
                                              uint32_t embd_groups, uint32_t n_ff, uint8_t* hq) {
  uint32_t chunks = n_ff / STRATA_MOE_GU_ROWS;
  uint32_t b = block_idx(), g = b / chunks, chunk = b % chunks;
  uint32_t expert, start, count;
  if (!moe_group_of(table, n, g, expert, start, count)) return;
  uint64_t row_bytes = (uint64_t)(embd_groups / F::GROUPS) * F::BYTES;
  gate += expert * expert_bytes;
  up += expert * expert_bytes;
  const uint32_t* entries = table + MOE_ENTRIES(n) + start;
  uint32_t warp = warp_in_block(), rows_per_warp = STRATA_MOE_GU_ROWS / STRATA_MOE_GU_WARPS;
  for (uint32_t pass = 0; pass < count; pass += STRATA_MOE_ENTRY_PASS) {
    uint32_t m = count - pass < STRATA_MOE_ENTRY_PASS ? count - pass : STRATA_MOE_ENTRY_PASS;
    auto act = [&](int r) { return xq + (uint64_t)(ld_u32w(entries, pass + r) / k) * embd_groups * STRATA_Q8_1_BYTES; };
    for (uint32_t j = 0; j < rows_per_warp; j++) {
      uint32_t local = warp * rows_per_warp + j;
      uint64_t row = (uint64_t)chunk * STRATA_MOE_GU_ROWS + local;
      float gs[STRATA_MMVQ_MAX_ROWS], us[STRATA_MMVQ_MAX_ROWS];
      row_partials<F, 1>(gate + row * row_bytes, embd_groups, m, act, gs);
      row_partials<F, 1>(up + row * row_bytes, embd_groups, m, act, us);
#pragma unroll
      for (int r = 0; r < STRATA_MMVQ_MAX_ROWS; r++) {
        if ((uint32_t)r < m) {
          float h = silu(warp_sum_f32(gs[r])) * warp_sum_f32(us[r]);
          if (lane() == 0) strata_smem[r * STRATA_MOE_GU_ROWS + local] = __builtin_bit_cast(uint32_t, h);
        }
      }
    }
    sync_threads();
    if (warp < m) {
      uint32_t e = ld_u32w(entries, pass + warp);
      float v = __builtin_bit_cast(float, strata_smem[warp * STRATA_MOE_GU_ROWS + lane()]);
      quantize_group(v, hq + ((uint64_t)e * chunks + chunk) * STRATA_Q8_1_BYTES);
    }
    sync_threads();
  }
}

// Down of one expert for every entry of its group, STRATA_MOE_DOWN_ROWS consecutive rows a warp:
// for a group of one entry the rows side by side (rows_partials), else row by row
// (device/src/kernels/moe.rs down).
template <typename F>
static __device__ __forceinline__ void moe_down(const uint8_t* w, uint64_t expert_bytes, const uint8_t* hq,
                                                const uint32_t* table, uint32_t n, uint32_t ff_groups, uint32_t n_embd,
                                                float* y) {
  const uint32_t ROWS = STRATA_MOE_DOWN_ROWS;
  uint32_t row_blocks = (n_embd + STRATA_MMVQ_WARPS * ROWS - 1) / (STRATA_MMVQ_WARPS * ROWS);
  uint32_t b = block_idx(), g = b / row_blocks, row0 = ((b % row_blocks) * STRATA_MMVQ_WARPS + warp_in_block()) * ROWS;
  uint32_t expert, start, count;
  if (!moe_group_of(table, n, g, expert, start, count) || row0 >= n_embd) return;
  uint32_t rows = n_embd - row0 < ROWS ? n_embd - row0 : ROWS;
  uint64_t row_bytes = (uint64_t)(ff_groups / F::GROUPS) * F::BYTES;
  // Rows past the end read the last row, unused: one code path.
  auto wrow = [&](int j) { return w + expert * expert_bytes + (uint64_t)(row0 + ((uint32_t)j < rows - 1 ? (uint32_t)j : rows - 1)) * row_bytes; };
  const uint32_t* entries = table + MOE_ENTRIES(n) + start;
  auto entry = [&](uint32_t i) { return (uint64_t)ld_u32w(entries, i); };
  if (count == 1) {
    uint64_t e = entry(0);
    float acc[STRATA_MOE_DOWN_ROWS];
    rows_partials<F, STRATA_MOE_DOWN_ROWS>(wrow, ff_groups, hq + e * ff_groups * STRATA_Q8_1_BYTES, acc);
    store_row_sums(acc, rows, false, [&](int j) { return y + e * n_embd + row0 + j; });
    return;
  }
  for (uint32_t j = 0; j < rows; j++) {
    for (uint32_t pass = 0; pass < count; pass += STRATA_MOE_ENTRY_PASS) {
      uint32_t m = count - pass < STRATA_MOE_ENTRY_PASS ? count - pass : STRATA_MOE_ENTRY_PASS;
      float acc[STRATA_MMVQ_MAX_ROWS];
      row_partials<F, 1>(wrow(j), ff_groups, m, [&](int r) { return hq + entry(pass + r) * ff_groups * STRATA_Q8_1_BYTES; }, acc);
      store_row_sums(acc, m, false, [&](int r) { return y + entry(pass + r) * n_embd + row0 + j; });
    }
  }
}

STRATA_KERNEL(moe_combine)(const float* y, const float* weights, uint32_t tokens, uint32_t k, uint32_t n_embd, float* out,
                           uint32_t accumulate) {
  uint32_t i = block_idx() * STRATA_THREADS_moe_combine + thread_idx();
  if (i >= tokens * n_embd) return;
  uint32_t t = i / n_embd, col = i % n_embd;
  float acc = 0.0f;
  // STRATA_MOE_COMBINE_AHEAD slots' weights and values loaded before the first add, then added in
  // slot order.
  for (uint32_t s0 = 0; s0 < k; s0 += STRATA_MOE_COMBINE_AHEAD) {
    float w[STRATA_MOE_COMBINE_AHEAD], v[STRATA_MOE_COMBINE_AHEAD];
#pragma unroll
    for (uint32_t u = 0; u < STRATA_MOE_COMBINE_AHEAD; u++) {
      uint64_t e = (uint64_t)t * k + s0 + u;
      w[u] = s0 + u < k ? __builtin_bit_cast(float, ld_nc_u32((const uint8_t*)(weights + e))) : 0.0f;
      v[u] = s0 + u < k ? __builtin_bit_cast(float, ld_nc_u32((const uint8_t*)(y + e * n_embd + col))) : 0.0f;
    }
#pragma unroll
    for (uint32_t u = 0; u < STRATA_MOE_COMBINE_AHEAD; u++) {
      if (s0 + u < k) acc = acc + w[u] * v[u];
    }
  }
  store_f32(out + i, acc, accumulate != 0);
}

#define MOE_ENTRY(tag, F)                                                                                          \
  STRATA_KERNEL(moe_gu_##tag)(const uint8_t* gate, const uint8_t* up, uint64_t expert_bytes, const uint8_t* xq,     \
                              const uint32_t* table, uint32_t n, uint32_t k, uint32_t embd_groups, uint32_t n_ff,  \
                              uint8_t* hq) {                                                                       \
    moe_gu<F>(gate, up, expert_bytes, xq, table, n, k, embd_groups, n_ff, hq);                                     \
  }                                                                                                                \
  STRATA_KERNEL(moe_down_##tag)(const uint8_t* w, uint64_t expert_bytes, const uint8_t* hq, const uint32_t* table, \
                                uint32_t n, uint32_t ff_groups, uint32_t n_embd, float* y) {                       \
    moe_down<F>(w, expert_bytes, hq, table, n, ff_groups, n_embd, y);                                              \
  }

MOE_ENTRY(q8_0, Q8_0)
MOE_ENTRY(q6_k, Q6K)
MOE_ENTRY(iq2_xxs, Iq2Xxs)
MOE_ENTRY(iq2_xs, Iq2Xs)
MOE_ENTRY(iq2_s, Iq2S)
MOE_ENTRY(iq3_xxs, Iq3Xxs)
MOE_ENTRY(iq3_s, Iq3S)
MOE_ENTRY(iq3_st, Iq3ST)
MOE_ENTRY(iq4_nl, Iq4Nl)
MOE_ENTRY(iq4_nlt, Iq4NlT)
MOE_ENTRY(iq4_xs, Iq4Xs)
MOE_ENTRY(q2_0, Q2_0)
