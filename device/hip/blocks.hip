// Block decoding shared by every kernel that reads quantized weights: the HIP twin of
// device/src/kernels/blocks.rs. Each format's load() turns group g of a block into a Group
// (value j = d * f[j / 16] * byte j of w * 2^-SHIFT). Blocks are only 2-byte aligned, so 4-byte
// fields are read as two 2-byte loads. Offsets and codebooks come from the generated prelude.
// The IQ formats read their codebook through a grid: the global copy (GlobalGrid) by default,
// or one the EXPDEC kernels staged in shared memory (StagedGrid), for IQ3_ST the
// codebook repeated once a half-warp lane (STRATA_IQ3_S_LANES).
#include "strata_hip.h"

// 4-bit sign mask (bit i = byte i negative) to 0xff in the negative bytes.
STRATA_FN uint32_t sign_bytes(uint32_t bits) { return (((bits & 15u) * 0x00204081u) & 0x01010101u) * 0xffu; }

// Byte signs applied to four magnitudes (1..127): (m ^ 0xff) + 1 never carries across bytes.
STRATA_FN uint32_t apply_signs(uint32_t mags, uint32_t bits) {
  uint32_t mask = sign_bytes(bits);
  return (mags ^ mask) + (mask & 0x01010101u);
}

// signed_word(i, signs): word i with the sign bits signs & 15 applied.
struct GlobalGrid {
  const uint32_t* words;
  __device__ __forceinline__ uint32_t word(uint32_t i) const { return words[i]; }
  __device__ __forceinline__ uint32_t signed_word(uint32_t i, uint32_t signs) const { return apply_signs(word(i), signs); }
};

// A codebook staged in shared memory: word i at base + i * stride. stride 1 is the codebook
// itself; STRATA_GRID_LANES its repeated copy (lane_grids), base then this lane's copy.
struct StagedGrid {
  uint32_t base;  // first word in the block's dynamic shared memory (this lane's copy)
  uint32_t stride;
  __device__ __forceinline__ uint32_t word(uint32_t i) const { return strata_smem[base + i * stride]; }
  __device__ __forceinline__ uint32_t signed_word(uint32_t i, uint32_t signs) const { return apply_signs(word(i), signs); }
};

struct Group {
  float d;
  uint32_t w[8];
  int32_t f[2];
};

STRATA_FN float block_scale(const uint8_t* p) { return f16_to_f32(ld_nc_u16(p)); }

// 7-bit sign code to 8 signs, bit 7 making the count of negatives even.
STRATA_FN uint32_t ksigns(uint32_t code) { return code | (popc(code) & 1u) << 7; }

// Four codes (one per byte, 0..16) to IQ4_NL levels: two byte permutes and a select on bit 3.
STRATA_FN uint32_t iq4_levels(uint32_t codes) {
  uint32_t sel = (codes & 0x7u) | (codes >> 4 & 0x70u) | (codes >> 8 & 0x700u) | (codes >> 12 & 0x7000u);
  uint32_t low = prmt(STRATA_IQ4_NL_W0, STRATA_IQ4_NL_W1, sel);
  uint32_t high = prmt(STRATA_IQ4_NL_W2, STRATA_IQ4_NL_W3, sel);
  uint32_t upper = ((codes >> 3) & 0x01010101u) * 0xffu;
  return (high & upper) | (low & ~upper);
}

// The 16 nibble bytes as four words to the 8 words of IQ4 levels (low nibbles first, then high).
STRATA_FN void iq4_words_of(const uint32_t* nibbles, uint32_t* w) {
  for (int i = 0; i < 4; i++) {
    w[i] = iq4_levels(nibbles[i] & 0x0f0f0f0fu);
    w[i + 4] = iq4_levels((nibbles[i] >> 4) & 0x0f0f0f0fu);
  }
}

STRATA_FN void iq4_words(const uint8_t* qs, uint32_t* w) {
  uint32_t nib[4];
  for (int i = 0; i < 4; i++) nib[i] = ld_nc_u32_a2(qs + 4 * i);
  iq4_words_of(nib, w);
}

// An 8-magnitude grid entry (two words) with its 8 sign bits.
template <typename G>
STRATA_FN void grid8(G grid, uint32_t entry, uint32_t signs, uint32_t* w) {
  w[0] = grid.signed_word(2 * entry, signs);
  w[1] = grid.signed_word(2 * entry + 1, signs >> 4);
}

struct Q8_0 {
  static constexpr uint32_t BYTES = STRATA_Q8_0_BYTES, GROUPS = 1, SHIFT = 0;
  static constexpr uint32_t GRID_WORDS = 0;
  STRATA_FN const uint32_t* grid() { return nullptr; }
  STRATA_FN Group load(const uint8_t* p, uint32_t gi) { return load_with(p, gi, GlobalGrid{grid()}); }
  template <typename G>
  STRATA_FN Group load_with(const uint8_t* p, uint32_t, G) {
    Group g;
    for (int i = 0; i < 8; i++) g.w[i] = ld_nc_u32_a2(p + STRATA_Q8_0_OFF_Q + 4 * i);
    g.d = block_scale(p + STRATA_Q8_0_OFF_D);
    g.f[0] = g.f[1] = 1;
    return g;
  }
};

// Q8_0 in tiles of 32 blocks (formats::q8_0t): group g is two 16-byte aligned loads and its scale.
struct Q8_0T {
  static constexpr uint32_t BYTES = STRATA_Q8_0T_BYTES, GROUPS = 32, SHIFT = 0;
  static constexpr uint32_t GRID_WORDS = 0;
  STRATA_FN const uint32_t* grid() { return nullptr; }
  STRATA_FN Group load(const uint8_t* p, uint32_t gi) { return load_with(p, gi, GlobalGrid{grid()}); }
  template <typename G>
  STRATA_FN Group load_with(const uint8_t* p, uint32_t gi, G) {
    Group g;
    ld_nc_v4(p + STRATA_Q8_0T_OFF_LO + 16 * gi, g.w);
    ld_nc_v4(p + STRATA_Q8_0T_OFF_HI + 16 * gi, g.w + 4);
    g.d = block_scale(p + STRATA_Q8_0T_OFF_D + 2 * gi);
    g.f[0] = g.f[1] = 1;
    return g;
  }
};

struct Q2_0 {
  static constexpr uint32_t BYTES = STRATA_Q2_0_BYTES, GROUPS = 2, SHIFT = 0;
  static constexpr uint32_t GRID_WORDS = 0;
  STRATA_FN const uint32_t* grid() { return nullptr; }
  STRATA_FN Group load(const uint8_t* p, uint32_t gi) { return load_with(p, gi, GlobalGrid{grid()}); }
  template <typename G>
  STRATA_FN Group load_with(const uint8_t* p, uint32_t gi, G) {
    Group g;
    for (int i = 0; i < 4; i++) {
      uint32_t two = ld_nc_u16(p + STRATA_Q2_0_OFF_QS + 8 * gi + 2 * i);
      for (int h = 0; h < 2; h++) {
        uint32_t b = two >> (8 * h);
        uint32_t sel = (b & 0x3u) | (b & 0xcu) << 2 | (b & 0x30u) << 4 | (b & 0xc0u) << 6;
        g.w[2 * i + h] = prmt(0x020100ffu, 0, sel);  // levels of codes 0..3: -1, 0, 1, 2
      }
    }
    g.d = block_scale(p + STRATA_Q2_0_OFF_D);
    g.f[0] = g.f[1] = 1;
    return g;
  }
};

struct Iq4Nl {
  static constexpr uint32_t BYTES = STRATA_IQ4_NL_BYTES, GROUPS = 1, SHIFT = 0;
  static constexpr uint32_t GRID_WORDS = 0;
  STRATA_FN const uint32_t* grid() { return nullptr; }
  STRATA_FN Group load(const uint8_t* p, uint32_t gi) { return load_with(p, gi, GlobalGrid{grid()}); }
  template <typename G>
  STRATA_FN Group load_with(const uint8_t* p, uint32_t, G) {
    Group g;
    iq4_words(p + STRATA_IQ4_NL_OFF_QS, g.w);
    g.d = block_scale(p + STRATA_IQ4_NL_OFF_D);
    g.f[0] = g.f[1] = 1;
    return g;
  }
};

// IQ4_NL in tiles of 8 blocks (formats::iq4_nlt): group g is one 16-byte aligned load and its scale.
struct Iq4NlT {
  static constexpr uint32_t BYTES = STRATA_IQ4_NLT_BYTES, GROUPS = 8, SHIFT = 0;
  static constexpr uint32_t GRID_WORDS = 0;
  STRATA_FN const uint32_t* grid() { return nullptr; }
  STRATA_FN Group load(const uint8_t* p, uint32_t gi) { return load_with(p, gi, GlobalGrid{grid()}); }
  template <typename G>
  STRATA_FN Group load_with(const uint8_t* p, uint32_t gi, G) {
    Group g;
    uint32_t nib[4];
    ld_nc_v4(p + STRATA_IQ4_NLT_OFF_QS + 16 * gi, nib);
    iq4_words_of(nib, g.w);
    g.d = block_scale(p + STRATA_IQ4_NLT_OFF_D + 2 * gi);
    g.f[0] = g.f[1] = 1;
    return g;
  }
};

struct Iq4Xs {
  static constexpr uint32_t BYTES = STRATA_IQ4_XS_BYTES, GROUPS = 8, SHIFT = 0;
  static constexpr uint32_t GRID_WORDS = 0;
  STRATA_FN const uint32_t* grid() { return nullptr; }
  STRATA_FN Group load(const uint8_t* p, uint32_t gi) { return load_with(p, gi, GlobalGrid{grid()}); }
  template <typename G>
  STRATA_FN Group load_with(const uint8_t* p, uint32_t gi, G) {
    Group g;
    uint32_t lo = ((uint32_t)ld_nc_u8(p + STRATA_IQ4_XS_OFF_SCALES_L + gi / 2) >> (4 * (gi % 2))) & 15u;
    uint32_t hi = ((uint32_t)ld_nc_u16(p + STRATA_IQ4_XS_OFF_SCALES_H) >> (2 * gi)) & 3u;
    iq4_words(p + STRATA_IQ4_XS_OFF_QS + 16 * gi, g.w);
    g.d = block_scale(p + STRATA_IQ4_XS_OFF_D);
    g.f[0] = g.f[1] = (int32_t)(lo | hi << 4) - 32;
    return g;
  }
};

// A Q6_K group from its 32 nibble bytes ql and 32 high-bit bytes qh (quarter q of its half:
// nibble q / 2, bits 2q..2q + 2), its two scale bytes sc and d, the values signed. (The Rust
// twin keeps the bytes unsigned and takes 32 times the q8_1 bytes' sum off in its dp4a chain,
// Block::OFFSET: the same integer dot products.)
STRATA_FN Group q6_group(const uint32_t* ql, const uint32_t* qh, uint32_t q, uint32_t sc, float d) {
  Group g;
  for (int i = 0; i < 8; i++) {
    uint32_t lo = (ql[i] >> (4 * (q / 2))) & 0x0f0f0f0fu;
    uint32_t hi = (qh[i] >> (2 * q)) & 0x03030303u;
    // 6-bit u - 32: flip bit 5, then copy it into bits 6 and 7.
    uint32_t y = (lo | hi << 4) ^ 0x20202020u;
    g.w[i] = y | (y & 0x20202020u) * 6u;
  }
  g.d = d;
  g.f[0] = (int8_t)(uint8_t)sc;
  g.f[1] = (int8_t)(uint8_t)(sc >> 8);
  return g;
}

struct Q6K {
  static constexpr uint32_t BYTES = STRATA_Q6_K_BYTES, GROUPS = 8, SHIFT = 0;
  static constexpr uint32_t GRID_WORDS = 0;
  STRATA_FN const uint32_t* grid() { return nullptr; }
  STRATA_FN Group load(const uint8_t* p, uint32_t gi) { return load_with(p, gi, GlobalGrid{grid()}); }
  template <typename G>
  STRATA_FN Group load_with(const uint8_t* p, uint32_t gi, G) {
    uint32_t h = gi / 4, q = gi % 4;
    const uint8_t* ql = p + STRATA_Q6_K_OFF_QL + 64 * h + 32 * (q % 2);
    const uint8_t* qh = p + STRATA_Q6_K_OFF_QH + 32 * h;
    uint32_t lw[8], hw[8];
    for (int i = 0; i < 8; i++) {
      lw[i] = ld_nc_u32_a2(ql + 4 * i);
      hw[i] = ld_nc_u32_a2(qh + 4 * i);
    }
    uint32_t sc = ld_nc_u16(p + STRATA_Q6_K_OFF_SCALES + 2 * gi);
    return q6_group(lw, hw, q, sc, block_scale(p + STRATA_Q6_K_OFF_D));
  }
};

// Q6_K in tiles of 8 regrouped blocks (formats::q6_kt): group g is a 16-byte load of its
// nibbles, an 8-byte load of its high bits, its two scales and d.
struct Q6KT {
  static constexpr uint32_t BYTES = STRATA_Q6_KT_BYTES, GROUPS = 64, SHIFT = 0;
  static constexpr uint32_t GRID_WORDS = 0;
  STRATA_FN const uint32_t* grid() { return nullptr; }
  STRATA_FN Group load(const uint8_t* p, uint32_t gi) { return load_with(p, gi, GlobalGrid{grid()}); }
  template <typename G>
  STRATA_FN Group load_with(const uint8_t* p, uint32_t gi, G) {
    uint32_t nb[4], hb[2], lw[8], hw[8];
    ld_nc_v4(p + STRATA_Q6_KT_OFF_QL + 16 * gi, nb);
    ld_nc_v2(p + STRATA_Q6_KT_OFF_QH + 8 * gi, hb);
    // Word i's values 4i..: the low nibbles of the first four nibble words, then their high
    // nibbles; bits 2s, 2s + 1 (s = i % 4) of high-bit word i / 4. So quarter 0 of q6_group.
    for (int i = 0; i < 8; i++) {
      lw[i] = nb[i % 4] >> (4 * (i / 4));
      hw[i] = hb[i / 4] >> (2 * (i % 4));
    }
    uint32_t sc = ld_nc_u16(p + STRATA_Q6_KT_OFF_SCALES + 2 * gi);
    return q6_group(lw, hw, 0, sc, block_scale(p + STRATA_Q6_KT_OFF_D + 2 * (gi / 8)));
  }
};

struct Iq2Xxs {
  static constexpr uint32_t BYTES = STRATA_IQ2_XXS_BYTES, GROUPS = 8, SHIFT = 3;
  static constexpr uint32_t GRID_WORDS = sizeof(STRATA_IQ2_XXS_GRID) / 4;
  STRATA_FN const uint32_t* grid() { return STRATA_IQ2_XXS_GRID; }
  STRATA_FN Group load(const uint8_t* p, uint32_t gi) { return load_with(p, gi, GlobalGrid{grid()}); }
  template <typename G>
  STRATA_FN Group load_with(const uint8_t* p, uint32_t gi, G grid) {
    Group g;
    const uint8_t* q = p + STRATA_IQ2_XXS_OFF_QS + 8 * gi;
    uint32_t a0 = ld_nc_u32_a2(q), a1 = ld_nc_u32_a2(q + 4);
    for (int l = 0; l < 4; l++) grid8(grid, a0 >> (8 * l) & 0xffu, ksigns(a1 >> (7 * l) & 127u), g.w + 2 * l);
    g.d = block_scale(p + STRATA_IQ2_XXS_OFF_D);
    g.f[0] = g.f[1] = 2 * (int32_t)(a1 >> 28) + 1;
    return g;
  }
};

struct Iq2Xs {
  static constexpr uint32_t BYTES = STRATA_IQ2_XS_BYTES, GROUPS = 8, SHIFT = 3;
  static constexpr uint32_t GRID_WORDS = sizeof(STRATA_IQ2_XS_GRID) / 4;
  STRATA_FN const uint32_t* grid() { return STRATA_IQ2_XS_GRID; }
  STRATA_FN Group load(const uint8_t* p, uint32_t gi) { return load_with(p, gi, GlobalGrid{grid()}); }
  template <typename G>
  STRATA_FN Group load_with(const uint8_t* p, uint32_t gi, G grid) {
    Group g;
    for (int l = 0; l < 4; l++) {
      uint32_t q = ld_nc_u16(p + STRATA_IQ2_XS_OFF_QS + 2 * (4 * gi + l));
      grid8(grid, q & 511u, ksigns(q >> 9), g.w + 2 * l);
    }
    int32_t s = ld_nc_u8(p + STRATA_IQ2_XS_OFF_SCALES + gi);
    g.d = block_scale(p + STRATA_IQ2_XS_OFF_D);
    g.f[0] = 2 * (s & 15) + 1;
    g.f[1] = 2 * (s >> 4) + 1;
    return g;
  }
};

struct Iq2S {
  static constexpr uint32_t BYTES = STRATA_IQ2_S_BYTES, GROUPS = 8, SHIFT = 3;
  static constexpr uint32_t GRID_WORDS = sizeof(STRATA_IQ2_S_GRID) / 4;
  STRATA_FN const uint32_t* grid() { return STRATA_IQ2_S_GRID; }
  STRATA_FN Group load(const uint8_t* p, uint32_t gi) { return load_with(p, gi, GlobalGrid{grid()}); }
  template <typename G>
  STRATA_FN Group load_with(const uint8_t* p, uint32_t gi, G grid) {
    Group g;
    uint32_t qs = ld_nc_u32_a2(p + STRATA_IQ2_S_OFF_QS + 4 * gi);
    uint32_t signs = ld_nc_u32_a2(p + STRATA_IQ2_S_OFF_SIGNS + 4 * gi);
    uint32_t qh = ld_nc_u8(p + STRATA_IQ2_S_OFF_QH + gi);
    for (int l = 0; l < 4; l++) {
      uint32_t entry = (qs >> (8 * l) & 0xffu) | ((qh >> (2 * l)) & 3u) << 8;
      grid8(grid, entry, signs >> (8 * l) & 0xffu, g.w + 2 * l);
    }
    int32_t s = ld_nc_u8(p + STRATA_IQ2_S_OFF_SCALES + gi);
    g.d = block_scale(p + STRATA_IQ2_S_OFF_D);
    g.f[0] = 2 * (s & 15) + 1;
    g.f[1] = 2 * (s >> 4) + 1;
    return g;
  }
};

struct Iq3Xxs {
  static constexpr uint32_t BYTES = STRATA_IQ3_XXS_BYTES, GROUPS = 8, SHIFT = 2;
  static constexpr uint32_t GRID_WORDS = sizeof(STRATA_IQ3_XXS_GRID) / 4;
  STRATA_FN const uint32_t* grid() { return STRATA_IQ3_XXS_GRID; }
  STRATA_FN Group load(const uint8_t* p, uint32_t gi) { return load_with(p, gi, GlobalGrid{grid()}); }
  template <typename G>
  STRATA_FN Group load_with(const uint8_t* p, uint32_t gi, G grid) {
    Group g;
    const uint8_t* q = p + STRATA_IQ3_XXS_OFF_QS + 8 * gi;
    uint32_t idx[2] = {ld_nc_u32_a2(q), ld_nc_u32_a2(q + 4)};
    uint32_t aux = ld_nc_u32_a2(p + STRATA_IQ3_XXS_OFF_AUX + 4 * gi);
    for (int l = 0; l < 4; l++) {
      uint32_t signs = ksigns(aux >> (7 * l) & 127u);
      for (int half = 0; half < 2; half++) {
        int i = 2 * l + half;
        g.w[i] = grid.signed_word((idx[i / 4] >> (8 * (i % 4))) & 0xffu, signs >> (4 * half));
      }
    }
    g.d = block_scale(p + STRATA_IQ3_XXS_OFF_D);
    g.f[0] = g.f[1] = 2 * (int32_t)(aux >> 28) + 1;
    return g;
  }
};

// An IQ3_S group from its fields: 8 index bytes, the indices' high bits, 32 sign bits (4 a
// word), the 4-bit scale and the block's scale d.
template <typename G>
STRATA_FN Group iq3_s_group(const uint32_t* idx, uint32_t qh, uint32_t signs, uint32_t s, float d, G grid) {
  Group g;
  for (int i = 0; i < 8; i++) {
    uint32_t entry = ((idx[i / 4] >> (8 * (i % 4))) & 0xffu) | ((qh >> i) & 1u) << 8;
    g.w[i] = grid.signed_word(entry, signs >> (4 * i));
  }
  g.d = d;
  g.f[0] = g.f[1] = 1 + 2 * (int32_t)s;
  return g;
}

struct Iq3S {
  static constexpr uint32_t BYTES = STRATA_IQ3_S_BYTES, GROUPS = 8, SHIFT = 0;
  static constexpr uint32_t GRID_WORDS = sizeof(STRATA_IQ3_S_GRID) / 4;
  STRATA_FN const uint32_t* grid() { return STRATA_IQ3_S_GRID; }
  STRATA_FN Group load(const uint8_t* p, uint32_t gi) { return load_with(p, gi, GlobalGrid{grid()}); }
  template <typename G>
  STRATA_FN Group load_with(const uint8_t* p, uint32_t gi, G grid) {
    const uint8_t* q = p + STRATA_IQ3_S_OFF_QS + 8 * gi;
    uint32_t idx[2] = {ld_nc_u32_a2(q), ld_nc_u32_a2(q + 4)};
    uint32_t qh = ld_nc_u8(p + STRATA_IQ3_S_OFF_QH + gi);
    uint32_t signs = ld_nc_u32_a2(p + STRATA_IQ3_S_OFF_SIGNS + 4 * gi);
    uint32_t s = ((uint32_t)ld_nc_u8(p + STRATA_IQ3_S_OFF_SCALES + gi / 2) >> (4 * (gi % 2))) & 15u;
    return iq3_s_group(idx, qh, signs, s, block_scale(p + STRATA_IQ3_S_OFF_D), grid);
  }
};

// IQ3_S in tiles of 8 blocks (formats::iq3_st): group g is an 8-byte load of indices, a 4-byte
// load of signs, its high-bit and scale bytes and its block's scale, all aligned.
// Word i of an IQ3_ST group, signed: byte j is the magnitude's, or the negated magnitudes'
// (0x01010100 - mags: 256 - m a byte, no borrow as no magnitude is 0) where byte j's sign, bit
// 16 (i / 4) + 4 j + i % 4 of the reordered signs, shifted to bit 4 j + 2 of the selector, is set.
STRATA_FN uint32_t iq3_st_signed(uint32_t mags, uint32_t signs, int i) {
  int at = 16 * (i / 4) + i % 4;
  uint32_t bits = at >= 2 ? signs >> (at - 2) : signs << (2 - at);
  return prmt(mags, 0x01010100u - mags, (bits & 0x4444u) | 0x3210u);
}

struct Iq3ST {
  static constexpr uint32_t BYTES = STRATA_IQ3_ST_BYTES, GROUPS = 64, SHIFT = 0;
  static constexpr uint32_t GRID_WORDS = sizeof(STRATA_IQ3_S_GRID) / 4;
  STRATA_FN const uint32_t* grid() { return STRATA_IQ3_S_GRID; }
  STRATA_FN Group load(const uint8_t* p, uint32_t gi) { return load_with(p, gi, GlobalGrid{grid()}); }
  template <typename G>
  STRATA_FN Group load_with(const uint8_t* p, uint32_t gi, G grid) {
    uint32_t idx[2];
    ld_nc_v2(p + STRATA_IQ3_ST_OFF_QS + 8 * gi, idx);
    uint32_t qh = ld_nc_u8(p + STRATA_IQ3_ST_OFF_QH + gi);
    uint32_t signs = ld_nc_u32(p + STRATA_IQ3_ST_OFF_SIGNS + 4 * gi);  // reordered (Regroup::Iq3Signs)
    uint32_t s = ((uint32_t)ld_nc_u8(p + STRATA_IQ3_ST_OFF_SCALES + gi / 2) >> (4 * (gi % 2))) & 15u;
    Group g;
    for (int i = 0; i < 8; i++) {
      uint32_t entry = ((idx[i / 4] >> (8 * (i % 4))) & 0xffu) | ((qh >> i) & 1u) << 8;
      g.w[i] = iq3_st_signed(grid.word(entry), signs, i);
    }
    g.d = block_scale(p + STRATA_IQ3_ST_OFF_D + 2 * (gi / 8));
    g.f[0] = g.f[1] = 1 + 2 * (int32_t)s;
    return g;
  }
};

