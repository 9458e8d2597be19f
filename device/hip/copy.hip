// copy_from_mapped_multi: many segments from device-mapped host memory into device memory in
// one launch. Twin of device/src/kernels/copy.rs (table layout and block mapping there).
#include "strata_hip.h"

STRATA_FN uint64_t seg_word(const uint64_t* table, uint32_t seg, uint32_t field) {
  const uint8_t* p = (const uint8_t*)(table + (uint64_t)seg * STRATA_COPY_SEGMENT_WORDS + field);
  return (uint64_t)ld_nc_u32(p) | (uint64_t)ld_nc_u32(p + 4) << 32;
}

struct alignas(16) U32x4 {
  uint32_t v[4];
};

STRATA_KERNEL(copy_from_mapped_multi)(const uint64_t* table, uint32_t segments, uint32_t total) {
  uint32_t b = block_idx();
  if (b >= total || segments == 0) return;
  uint32_t lo = 0, hi = segments;
  while (hi - lo > 1) {
    uint32_t mid = (lo + hi) / 2;
    if (seg_word(table, mid, 3) <= b) lo = mid; else hi = mid;
  }
  uint64_t src = seg_word(table, lo, 0), dst = seg_word(table, lo, 1), len = seg_word(table, lo, 2), first = seg_word(table, lo, 3);
  uint64_t start = (b - first) * (uint64_t)STRATA_COPY_CHUNK;
  uint64_t end = start + STRATA_COPY_CHUNK < len ? start + STRATA_COPY_CHUNK : len;
  const volatile uint8_t* s = (const volatile uint8_t*)(src + start);
  uint8_t* d = (uint8_t*)(dst + start);
  uint64_t n = end - start, t = thread_idx(), threads = STRATA_THREADS_copy_from_mapped_multi;
  bool wide = ((src + start) | (dst + start)) % 16 == 0;
  uint64_t step = wide ? 16 : 4, whole = n / step * step;
  for (uint64_t i = t * step; i < whole; i += threads * step) {
    if (wide) *(U32x4*)(d + i) = *(const U32x4*)(const uint8_t*)(s + i);
    else *(uint32_t*)(d + i) = *(const volatile uint32_t*)(s + i);
  }
  if (whole + t < n) d[whole + t] = s[whole + t];
}
