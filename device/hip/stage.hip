// Staging q8_1 rows and codebooks in shared memory, for the EXPDEC kernels and mmvqs. Twin of
// device/src/kernels/stage.rs: a pass holds up to `cap` rows (EXPDEC_ENTRIES, or an
// mmvqs launch's rows) of `groups` q8_1 blocks at word 0 as LO[cap][groups][4],
// HI[cap][groups][4] (the two 16-byte halves: a warp's 16-byte loads of consecutive groups are
// conflict-free) and D[cap][groups] (scales as f32); thread pairs stage one block each.
#include "strata_hip.h"
#include "blocks.hip"

STRATA_FN uint32_t stage_expdec_words(uint32_t groups) { return 9 * STRATA_EXPDEC_ENTRIES * groups; }

// Stages rows row(0) .. row(m - 1). Every thread of the block, of THREADS, calls it.
template <uint32_t THREADS, typename Row>
STRATA_FN void stage_rows(Row row, uint32_t m, uint32_t groups, uint32_t cap) {
  uint32_t items = 2 * m * groups;
  for (uint32_t i = thread_idx(); i < items; i += THREADS) {
    uint32_t item = i / 2, h = i % 2, r = item / groups, b = item % groups;
    const uint8_t* block = row(r) + (uint64_t)b * STRATA_Q8_1_BYTES;
    uint32_t* dst = strata_smem + 4 * cap * h * groups + 4 * (r * groups + b);
    // Four 4-byte loads: a 36-byte q8_1 block's halves are only 4-byte aligned.
    for (int w = 0; w < 4; w++) dst[w] = ld_nc_u32(block + STRATA_Q8_1_OFF_Q + 16 * h + 4 * w);
    if (h == 0) strata_smem[8 * cap * groups + r * groups + b] = __builtin_bit_cast(uint32_t, f16_to_f32(ld_nc_u16(block + STRATA_Q8_1_OFF_D)));
  }
}

// Staged block b of row r (of a stage sized for cap rows): its 8 quant words into q, its scale
// returned.
STRATA_FN float staged_block(uint32_t r, uint32_t b, uint32_t groups, uint32_t cap, uint32_t* q) {
  uint32_t slot = r * groups + b;
  for (int w = 0; w < 4; w++) {
    q[w] = strata_smem[4 * slot + w];
    q[4 + w] = strata_smem[4 * cap * groups + 4 * slot + w];
  }
  return __builtin_bit_cast(float, strata_smem[8 * cap * groups + slot]);
}

// What the EXPDEC kernels stage of F's codebook: the codebook, or for the formats of
// WeightFormat::lane_grid its copy repeated STRATA_GRID_LANES times a word (LANES).
template <typename F>
struct StagedCodebook {
  static constexpr uint32_t WORDS = F::GRID_WORDS, LANES = 1;
  STRATA_FN const uint32_t* words() { return F::grid(); }
};
template <>
struct StagedCodebook<Iq3ST> {
  static constexpr uint32_t WORDS = STRATA_GRID_LANES * Iq3ST::GRID_WORDS, LANES = STRATA_GRID_LANES;
  STRATA_FN const uint32_t* words() { return STRATA_IQ3_S_LANES; }
};

// Copies what F stages of its codebook (none for formats without one) to words base.. with the
// block's THREADS threads and returns it as this lane's grid; a barrier must pass before it is
// read. Module constants only: a kernel may stage before it would wait for the previous grid.
template <typename F, uint32_t THREADS>
STRATA_FN StagedGrid stage_grid(uint32_t base) {
  using C = StagedCodebook<F>;
  const uint32_t* words = C::words();
  if (C::LANES != 1) {
    // 16-byte aligned copies of a whole number of 16-byte pieces; base a multiple of 4.
    for (uint32_t i = thread_idx(); 4 * i < C::WORDS; i += THREADS) {
      uint32_t v[4];
      ld_nc_v4((const uint8_t*)(words + 4 * i), v);
      smem_st_v4(base + 4 * i, v);
    }
  } else {
    for (uint32_t i = thread_idx(); i < C::WORDS; i += THREADS) strata_smem[base + i] = ld_nc_u32((const uint8_t*)(words + i));
  }
  return StagedGrid{base + lane() % C::LANES, C::LANES};
}
