// The Gated DeltaNet kernels of a qwen35moe layer: gdn_conv (the causal depthwise conv step, one
// channel per thread) and gdn_recur (the gated delta rule, one warp per state column). Both keep
// their state indexed by absolute position, the window's first position read from *pos. Twin of
// device/src/kernels/gdn.rs; spec in gpu-shared/src/replica/gdn.rs. silu is moe.hip's (the
// experts' one), earlier in the translation unit. Every name here is gdn_-prefixed: all .hip
// sources share one translation unit.
#include "strata_hip.h"

#define GDN_PER_LANE (STRATA_GDN_MAX_D / 32)

STRATA_FN float gdn_ld_f32(const float* p, uint64_t i) { return __builtin_bit_cast(float, ld_nc_u32((const uint8_t*)(p + i))); }

// Channel c = block * STRATA_GDN_CONV_THREADS + thread. In token order, p = *pos + t: the input
// goes to ring row p % R (R = d_conv - 1 + STRATA_GDN_RING_EXTRA), then acc is the sum from +0.0
// over k = 0 .. d_conv of w[c][k] * u_k (u_k the input of position p - (d_conv - 1) + k from the
// ring, +0.0 below position 0), and out[t][c] = silu(acc). A thread alone reads and writes its
// channel of the ring: plain loads.
STRATA_KERNEL(gdn_conv)(const float* x, const float* w, float* ring, float* out, const uint32_t* pos, uint32_t tokens, uint32_t channels,
                        uint32_t d_conv) {
  uint32_t c = block_idx() * STRATA_GDN_CONV_THREADS + thread_idx();
  if (c >= channels) return;  // no barrier below
  uint32_t rows = d_conv - 1 + STRATA_GDN_RING_EXTRA;
  uint64_t pos0 = ld_nc_u32((const uint8_t*)pos);
  const float* wc = w + (uint64_t)c * d_conv;
  float* ring_c = ring + c;
  uint32_t row = (uint32_t)(pos0 % rows);  // ring row of position p, stepped with t
  for (uint32_t t = 0; t < tokens; t++, row = row + 1 == rows ? 0 : row + 1) {
    uint64_t p = pos0 + t;
    ring_c[(uint64_t)row * channels] = gdn_ld_f32(x, (uint64_t)t * channels + c);
    // Row of position p - (d_conv - 1), stepped with k (rows >= d_conv - 1, so no underflow).
    uint32_t r = row + rows - (d_conv - 1);
    if (r >= rows) r -= rows;
    float acc = 0.0f;
    for (uint32_t k = 0; k < d_conv; k++) {
      float u = p + k >= d_conv - 1 ? ring_c[(uint64_t)r * channels] : 0.0f;
      acc = acc + gdn_ld_f32(wc, k) * u;
      if (++r == rows) r = 0;
    }
    out[(uint64_t)t * channels + c] = silu(acc);
  }
}

// Warp h * d + j (value head h, value dimension j): lane l keeps S[i][j], q^[i] and k^[i] for
// i = l, l + 32, ... in registers; the column is read from slot (*pos - 1) % STRATA_GDN_STATE_SLOTS
// (all +0.0 at position 0), carried through the window's tokens and written to slot
// p % STRATA_GDN_STATE_SLOTS after each token p, S[i][j] of head h at ((slot * n_v + h) * d + j) * d
// + i. Every sum over i is the lane_sum order: the lane's terms left to right from +0.0, then the
// butterfly. The warp alone reads and writes its column: plain loads of the state.
STRATA_KERNEL(gdn_recur)(const float* conv, const float* alpha, const float* beta, const float* dt_bias, const float* a, float* state,
                         float* out, const uint32_t* pos, uint32_t tokens, uint32_t n_k, uint32_t n_v, uint32_t d, float eps,
                         float scale) {
  uint32_t wi = block_idx() * STRATA_GDN_WARPS + warp_in_block();
  if (wi >= n_v * d) return;  // the whole warp (the kernel has no block barrier)
  uint32_t h = wi / d, j = wi % d, kh = h % n_k, l = lane();
  uint64_t pos0 = ld_nc_u32((const uint8_t*)pos);
  uint64_t conv_row = (uint64_t)(2 * n_k + n_v) * d;
  uint64_t dd = (uint64_t)d * d;
  // Offset of column j of head h in slot 0; slot s adds s * n_v * d * d.
  uint64_t column = ((uint64_t)h * d + j) * d;
  uint64_t slot_stride = (uint64_t)n_v * dd;
  float bias = gdn_ld_f32(dt_bias, h), a_h = gdn_ld_f32(a, h);

  float col[GDN_PER_LANE], qh[GDN_PER_LANE], khat[GDN_PER_LANE];
  if (pos0 == 0) {
#pragma unroll
    for (uint32_t r = 0; r < GDN_PER_LANE; r++) col[r] = 0.0f;
  } else {
    const float* src = state + ((pos0 - 1) % STRATA_GDN_STATE_SLOTS) * slot_stride + column;
#pragma unroll
    for (uint32_t r = 0; r < GDN_PER_LANE; r++) col[r] = l + 32 * r < d ? src[l + 32 * r] : 0.0f;
  }

  for (uint32_t t = 0; t < tokens; t++) {
    uint64_t p = pos0 + t;
    const float* row = conv + t * conv_row;
    const float* q = row + (uint64_t)kh * d;
    const float* k = row + (uint64_t)(n_k + kh) * d;
    uint64_t th = (uint64_t)t * n_v + h;
    float v = gdn_ld_f32(row, (uint64_t)(2 * n_k + h) * d + j), al = gdn_ld_f32(alpha, th), be = gdn_ld_f32(beta, th);
    // 1. L2 norms: rq = 1 / max(sqrt_rn(sum q^2), eps), likewise rk.
    float sq = 0.0f, sk = 0.0f;
#pragma unroll
    for (uint32_t r = 0; r < GDN_PER_LANE; r++) {
      uint32_t i = l + 32 * r;
      qh[r] = i < d ? gdn_ld_f32(q, i) : 0.0f;
      khat[r] = i < d ? gdn_ld_f32(k, i) : 0.0f;
    }
#pragma unroll
    for (uint32_t r = 0; r < GDN_PER_LANE; r++) {
      if (l + 32 * r < d) {
        sq = sq + qh[r] * qh[r];
        sk = sk + khat[r] * khat[r];
      }
    }
    float nq = sqrt_rn(warp_sum_f32(sq)), nk = sqrt_rn(warp_sum_f32(sk));
    float rq = 1.0f / (nq > eps ? nq : eps), rk = 1.0f / (nk > eps ? nk : eps);
#pragma unroll
    for (uint32_t r = 0; r < GDN_PER_LANE; r++) {
      qh[r] = qh[r] * rq;
      khat[r] = khat[r] * rk;
    }
    // 2. The gates.
    float b = sigmoid(be);
    float decay = exp_neg(softplus(al + bias) * a_h);
    // 3. Decay; 4. kv and delta.
    float kv = 0.0f;
#pragma unroll
    for (uint32_t r = 0; r < GDN_PER_LANE; r++) {
      col[r] = col[r] * decay;
      if (l + 32 * r < d) kv = kv + col[r] * khat[r];
    }
    kv = warp_sum_f32(kv);
    float delta = (v - kv) * b;
    // 5. The delta-rule update; 6. the output.
    float o = 0.0f;
#pragma unroll
    for (uint32_t r = 0; r < GDN_PER_LANE; r++) {
      col[r] = col[r] + khat[r] * delta;
      if (l + 32 * r < d) o = o + col[r] * qh[r];
    }
    o = warp_sum_f32(o) * scale;
    if (l == 0) out[(uint64_t)t * n_v * d + (uint64_t)h * d + j] = o;
    // 7. The column after position p.
    float* dst = state + (p % STRATA_GDN_STATE_SLOTS) * slot_stride + column;
#pragma unroll
    for (uint32_t r = 0; r < GDN_PER_LANE; r++)
      if (l + 32 * r < d) dst[l + 32 * r] = col[r];
  }
}
