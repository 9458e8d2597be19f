// The element-wise gates of the qwen35moe step: rms_norm_gated (the GDN output norm, one warp a
// row, rms_norm's geometry), sigmoid_mul (the gated attention output), swiglu_f32 (the shared
// expert's activation), add_gated (the shared expert added to the routed experts) and
// concat_rows (the MTP block's concatenation of the normed embedding and hidden state). Twin of
// device/src/kernels/gate.rs; spec in gpu-shared/src/replica/gate.rs. warp_rms_scale is
// norm.hip's and silu moe.hip's, both earlier in the translation unit.
#include "strata_hip.h"

// Loads of each of x, w and z in flight per lane in rms_norm_gated's output pass: a 128-value
// row (a GDN head) is one memory latency.
#define GATE_NORM_AHEAD 4

STRATA_FN float gate_ld_f32(const float* p, uint64_t i) { return __builtin_bit_cast(float, ld_nc_u32((const uint8_t*)(p + i))); }

// Row r = block * STRATA_NORM_WARPS + warp: out[r * n + j] = ((x[r * n + j] * scale_r) * w[j]) *
// silu(z[r * n + j]), scale_r the row's RMSNorm scale. Plain loads of x and z (activations).
STRATA_KERNEL(rms_norm_gated)(const float* x, const float* w, const float* z, float* out, uint32_t rows, uint32_t n, float eps) {
  uint32_t row = block_idx() * STRATA_NORM_WARPS + warp_in_block();
  if (row >= rows) return;  // whole warp
  const float* xr = x + (uint64_t)row * n;
  const float* zr = z + (uint64_t)row * n;
  float* outr = out + (uint64_t)row * n;
  float scale = warp_rms_scale<STRATA_NORM_AHEAD>(xr, n, eps);
  uint32_t j = lane();
  for (; j + 32 * (GATE_NORM_AHEAD - 1) < n; j += 32 * GATE_NORM_AHEAD) {
    float xv[GATE_NORM_AHEAD], wv[GATE_NORM_AHEAD], zv[GATE_NORM_AHEAD];
#pragma unroll
    for (uint32_t i = 0; i < GATE_NORM_AHEAD; i++) {
      xv[i] = xr[j + 32 * i];
      wv[i] = gate_ld_f32(w, j + 32 * i);
      zv[i] = zr[j + 32 * i];
    }
#pragma unroll
    for (uint32_t i = 0; i < GATE_NORM_AHEAD; i++) outr[j + 32 * i] = ((xv[i] * scale) * wv[i]) * silu(zv[i]);
  }
  for (; j < n; j += 32) outr[j] = ((xr[j] * scale) * gate_ld_f32(w, j)) * silu(zr[j]);
}

// out[i] = a[i] * sigmoid(g[i]); out may be a (thread i alone reads a[i], then writes out[i]).
STRATA_KERNEL(sigmoid_mul)(const float* a, const float* g, float* out, uint32_t n) {
  uint32_t i = block_idx() * STRATA_GATE_THREADS + thread_idx();
  if (i >= n) return;
  float gi = gate_ld_f32(g, i);
  out[i] = a[i] * sigmoid(gi);
}

// out[i] = silu(g[i]) * u[i].
STRATA_KERNEL(swiglu_f32)(const float* g, const float* u, float* out, uint32_t n) {
  uint32_t i = block_idx() * STRATA_GATE_THREADS + thread_idx();
  if (i >= n) return;
  out[i] = silu(gate_ld_f32(g, i)) * gate_ld_f32(u, i);
}

// acc[e] = acc[e] + sigmoid(s[e / n]) * y[e] for the rows * n elements e, in place.
STRATA_KERNEL(add_gated)(float* acc, const float* y, const float* s, uint32_t rows, uint32_t n) {
  uint32_t e = block_idx() * STRATA_GATE_THREADS + thread_idx();
  if ((uint64_t)e >= (uint64_t)rows * n) return;
  float gy = sigmoid(gate_ld_f32(s, e / n)) * gate_ld_f32(y, e);
  acc[e] = acc[e] + gy;
}

// out[e] = a[r * n_a + j] for j < n_a, b[r * n_b + j - n_a] for n_a <= j, e = r * (n_a + n_b) + j:
// row r of a then row r of b, copied (the bits are the inputs').
STRATA_KERNEL(concat_rows)(const float* a, const float* b, float* out, uint32_t rows, uint32_t n_a, uint32_t n_b) {
  uint32_t e = block_idx() * STRATA_GATE_THREADS + thread_idx();
  uint64_t n = (uint64_t)n_a + n_b;
  if ((uint64_t)e >= (uint64_t)rows * n) return;
  // e < rows * n and e < 2^32: a row longer than 2^32 - 1 values is row 0, and otherwise the row
  // and column are 32-bit divisions.
  uint32_t r = 0, j = e;
  if (n <= 0xffffffffull) {
    r = e / (uint32_t)n;
    j = e % (uint32_t)n;
  }
  out[e] = j < n_a ? gate_ld_f32(a, (uint64_t)r * n_a + j) : gate_ld_f32(b, (uint64_t)r * n_b + (j - n_a));
}
