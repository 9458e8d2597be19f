// spec_accept: the accepted count of a speculative verify window, and the window's next tokens.
// Twin of device/src/kernels/spec.rs; spec in gpu-shared/src/replica/spec.rs. Thread 0 of block
// 0 walks the rows in order, its flag off from the first rejected draft on, then moves the
// sequence on: the next window starts at *pos + accepted with the last emitted token as row 0.
#include "strata_hip.h"

STRATA_KERNEL(spec_accept)(uint32_t* window, const uint32_t* next, uint32_t tokens, uint32_t* out, uint32_t* pos) {
  if (block_idx() != 0 || thread_idx() != 0) return;
  uint32_t prev = ld_nc_u32((const uint8_t*)next);
  out[1] = prev;
  uint32_t accepted = 1;
  bool matching = true;
  for (uint32_t i = 1; i < tokens; i++) {
    matching = matching && ld_nc_u32((const uint8_t*)(window + i)) == prev;
    accepted += matching ? 1u : 0u;
    prev = ld_nc_u32((const uint8_t*)(next + i));
    out[1 + i] = prev;
  }
  out[0] = accepted;
  window[0] = out[accepted];
  *pos += accepted;
}
