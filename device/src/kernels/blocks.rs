//! Block decoding shared by every kernel that reads quantized weights: each format's group
//! loader turns group `g` of a block into the shape of `strata_gpu_shared::replica::decode_group`
//! (scale, 32 int8 values packed four to a word, two integer factors; the shift is a constant).
//!
//! Blocks are only 2-byte aligned (most sizes are even but not multiples of 4), so 4-byte
//! fields are read as two 2-byte loads.
//!
//! The IQ formats look their magnitudes up in a codebook ([`Grid`]): the module's global copy
//! by default, or a copy the EXPDEC kernels staged in shared memory, which for the formats of
//! `WeightFormat::lane_grid` (IQ3_ST) is the codebook repeated once a half-warp lane
//! (`lane_grids`), so that a warp's gathers conflict at most two-way.
use crate::arch::mem::Smem;
use crate::arch::{convert, int, mem};
use strata_gpu_shared::codebooks::{IQ2_S_GRID, IQ2_XS_GRID, IQ2_XXS_GRID, IQ3_S_GRID, IQ3_XXS_GRID};
use strata_gpu_shared::formats::*;
use strata_gpu_shared::lane_grids::{GRID_LANES, IQ3_S_LANES};

/// One decoded group: value j = `d * f[j / 16] * v_j * 2^-SHIFT`, `v_j` byte j of w: signed, or
/// for a format with an [`Block::OFFSET`] unsigned minus the offset.
pub struct Group {
    pub d: f32,
    pub w: [u32; 8],
    pub f: [i32; 2],
}

impl Group {
    /// A placeholder for a group slot that holds none.
    pub const ZERO: Group = Group { d: 0.0, w: [0; 8], f: [0; 2] };
}

/// Where a format's codebook words are read from.
pub trait Grid: Copy {
    /// Word `i` of the codebook.
    ///
    /// # Safety
    /// `i` is below the codebook's length.
    unsafe fn word(self, i: usize) -> u32;
    /// Word `i` of the codebook with the sign bits `signs & 15` applied (byte j negated where
    /// bit j is set).
    ///
    /// # Safety
    /// As [`Self::word`].
    #[inline(always)]
    unsafe fn signed_word(self, i: usize, signs: u32) -> u32 {
        signed(self.word(i), signs)
    }
    /// The 8 signed words of an IQ3_S group: word i is codebook entry `idx byte i | qh bit i <<
    /// 8` with the sign bits `signs >> 4i`.
    ///
    /// # Safety
    /// The grid is IQ3_S's (512 words).
    #[inline(always)]
    unsafe fn iq3_s_words(self, idx: [u32; 2], qh: u32, signs: u32) -> [u32; 8] {
        iq3_s_words_each(self, idx, qh, signs)
    }
    /// The 8 signed words of an IQ3_ST group: as [`Self::iq3_s_words`] with the group's sign
    /// bits reordered (`Regroup::Iq3Signs`), applied by [`iq3_st_signed`].
    ///
    /// # Safety
    /// As [`Self::iq3_s_words`].
    #[inline(always)]
    unsafe fn iq3_st_words(self, idx: [u32; 2], qh: u32, signs: u32) -> [u32; 8] {
        iq3_st_words_each(self, idx, qh, signs)
    }
}

/// [`Grid::iq3_st_words`] a word at a time: its entry from the fields, its magnitudes from
/// [`Grid::word`], then [`iq3_st_signed`].
///
/// # Safety
/// As [`Grid::iq3_s_words`].
#[inline(always)]
unsafe fn iq3_st_words_each<G: Grid>(grid: G, idx: [u32; 2], qh: u32, signs: u32) -> [u32; 8] {
    core::array::from_fn(|i| {
        let entry = ((idx[i / 4] >> (8 * (i % 4))) & 0xff) | ((qh >> i) & 1) << 8;
        iq3_st_signed(grid.word(entry as usize), signs, i)
    })
}

/// Word `i` of an IQ3_ST group, signed: its magnitudes `mags` (each 1..127) and, byte by byte,
/// the negated ones (`0x01010100 - mags` is `256 - m` in every byte: nothing borrows, no
/// magnitude being 0), picked by the byte permute with the selector `0x3210` plus bit `4 j +
/// 2` set where byte j is negative: the group's reordered signs (`Regroup::Iq3Signs`, byte j's
/// at bit `tiles::iq3_sign_bit(4 i + j)`, `4 j` past byte 0's) shifted into those bits. A shift,
/// a logic op ([`int::and_or`]), a subtract and the permute.
#[inline(always)]
fn iq3_st_signed(mags: u32, signs: u32, i: usize) -> u32 {
    let at = tiles::iq3_sign_bit(4 * i); // the bit of byte 0's sign
    let bits = if at >= 2 { signs >> (at - 2) } else { signs << (2 - at) };
    int::prmt(mags, 0x0101_0100u32.wrapping_sub(mags), int::and_or(bits, 0x4444, 0x3210))
}

/// [`Grid::iq3_s_words`] a word at a time: its entry from the fields, then
/// [`Grid::signed_word`].
///
/// # Safety
/// As [`Grid::iq3_s_words`].
#[inline(always)]
unsafe fn iq3_s_words_each<G: Grid>(grid: G, idx: [u32; 2], qh: u32, signs: u32) -> [u32; 8] {
    core::array::from_fn(|i| {
        let entry = ((idx[i / 4] >> (8 * (i % 4))) & 0xff) | ((qh >> i) & 1) << 8;
        grid.signed_word(entry as usize, signs >> (4 * i))
    })
}

/// The codebook's static copy in global memory.
#[derive(Clone, Copy)]
pub struct Global(pub &'static [u32]);

impl Grid for Global {
    #[inline(always)]
    unsafe fn word(self, i: usize) -> u32 {
        // SAFETY: the caller keeps `i` below the length; the loaders index with masked bits.
        *self.0.get_unchecked(i)
    }
}

/// A codebook staged in shared memory: word `i` at word `base + i * stride` of the block's
/// dynamic shared memory. `stride` 1 is the codebook itself; `GRID_LANES` its repeated copy
/// (`lane_grids`), `base` then this lane's copy (`lane % GRID_LANES` words past the copy's
/// start).
#[derive(Clone, Copy)]
pub struct Staged {
    pub smem: Smem,
    pub base: u32,
    pub stride: u32,
}

impl Grid for Staged {
    #[inline(always)]
    unsafe fn word(self, i: usize) -> u32 {
        self.smem.ld_u32(self.base + i as u32 * self.stride)
    }
    /// In the repeated copy of IQ3_S's 512 words, word i's entry `idx_i | qh_i << 8` is two
    /// bytes: the index byte and the high bit. The high bits are spread a byte a word over two
    /// registers (the `sign_bytes` multiply: 4 instructions a half), then a word is a byte
    /// permute, a multiply-add to its lane's address, the load and [`iq3_st_signed`].
    #[inline(always)]
    unsafe fn iq3_st_words(self, idx: [u32; 2], qh: u32, signs: u32) -> [u32; 8] {
        if self.stride == 1 {
            return iq3_st_words_each(self, idx, qh, signs);
        }
        let high = |h: u32| ((qh >> (4 * h)) & 15).wrapping_mul(0x0020_4081) & 0x0101_0101;
        let hi = [high(0), high(1)];
        let at = self.smem.addr(self.base);
        core::array::from_fn(|i| {
            // Byte 0: index byte i % 4; byte 1: high byte i % 4; bytes 2 and 3: the sign of a
            // high byte (selector bit 3), which is 0.
            let b = (i % 4) as u32;
            let entry = int::prmt(idx[i / 4], hi[i / 4], b | (4 + b) << 4 | (12 + b) << 8 | (12 + b) << 12);
            iq3_st_signed(Smem::ld_u32_at(at + 4 * GRID_LANES as u32 * entry), signs, i)
        })
    }
}

/// Where a block's bytes are read from: device memory through the read-only path (a pointer),
/// or a copy in shared memory ([`Shared`]). Offsets are bytes from the block's start; a load's
/// alignment is its size, but for [`Bytes::u32_a2`].
pub trait Bytes: Copy {
    /// The bytes from `off` on.
    ///
    /// # Safety
    /// `off` stays inside the memory `self` points into.
    unsafe fn at(self, off: usize) -> Self;
    /// # Safety
    /// The bytes read are inside the memory `self` points into, aligned as the load says.
    unsafe fn u8(self, off: usize) -> u8;
    /// # Safety
    /// As [`Bytes::u8`].
    unsafe fn u16(self, off: usize) -> u16;
    /// # Safety
    /// As [`Bytes::u8`].
    unsafe fn u32(self, off: usize) -> u32;
    /// A word only 2-byte aligned, as two 2-byte loads joined little-endian (Q8_0 and IQ4_NL
    /// quants sit after a 2-byte scale).
    ///
    /// # Safety
    /// As [`Bytes::u8`].
    #[inline(always)]
    unsafe fn u32_a2(self, off: usize) -> u32 {
        self.u16(off) as u32 | (self.u16(off + 2) as u32) << 16
    }
    /// # Safety
    /// As [`Bytes::u8`].
    unsafe fn v2(self, off: usize) -> [u32; 2];
    /// # Safety
    /// As [`Bytes::u8`].
    unsafe fn v4(self, off: usize) -> [u32; 4];
}

impl Bytes for *const u8 {
    #[inline(always)]
    unsafe fn at(self, off: usize) -> Self {
        self.add(off)
    }
    #[inline(always)]
    unsafe fn u8(self, off: usize) -> u8 {
        mem::ld_nc_u8(self.add(off))
    }
    #[inline(always)]
    unsafe fn u16(self, off: usize) -> u16 {
        mem::ld_nc_u16(self.add(off))
    }
    #[inline(always)]
    unsafe fn u32(self, off: usize) -> u32 {
        mem::ld_nc_u32(self.add(off))
    }
    #[inline(always)]
    unsafe fn v2(self, off: usize) -> [u32; 2] {
        mem::ld_nc_v2(self.add(off))
    }
    #[inline(always)]
    unsafe fn v4(self, off: usize) -> [u32; 4] {
        mem::ld_nc_v4(self.add(off))
    }
}

/// Bytes copied to shared memory, at a shared address ([`Smem::addr`]); the copy keeps the
/// alignment of the device bytes it came from (to 16 bytes).
#[derive(Clone, Copy)]
pub struct Shared(pub u32);

impl Bytes for Shared {
    #[inline(always)]
    unsafe fn at(self, off: usize) -> Self {
        Shared(self.0 + off as u32)
    }
    #[inline(always)]
    unsafe fn u8(self, off: usize) -> u8 {
        Smem::ld_u8_at(self.0 + off as u32)
    }
    #[inline(always)]
    unsafe fn u16(self, off: usize) -> u16 {
        Smem::ld_u16_at(self.0 + off as u32)
    }
    #[inline(always)]
    unsafe fn u32(self, off: usize) -> u32 {
        Smem::ld_u32_at(self.0 + off as u32)
    }
    #[inline(always)]
    unsafe fn v2(self, off: usize) -> [u32; 2] {
        Smem::ld_v2_at(self.0 + off as u32)
    }
    #[inline(always)]
    unsafe fn v4(self, off: usize) -> [u32; 4] {
        Smem::ld_v4_at(self.0 + off as u32)
    }
}

pub trait Block {
    const BYTES: usize;
    /// Groups of 32 values per block.
    const GROUPS: u32;
    /// The `k` of `2^-k` (`WeightFormat::shift`).
    const SHIFT: u32;
    /// The format's codebook (`WeightFormat::grid`), empty when it has none.
    fn grid() -> &'static [u32] {
        &[]
    }
    /// What the EXPDEC kernels stage ([`Staged`]): the codebook repeated once a lane where
    /// `WeightFormat::lane_grid`, else the codebook.
    fn staged_grid() -> &'static [u32] {
        Self::grid()
    }
    /// Whether [`Self::staged_grid`] is the repeated copy.
    const LANE_GRID: bool = false;
    /// 0: a group's bytes are its signed values. Else they are unsigned, each its value plus
    /// `OFFSET` (Q6_K's 6-bit values, 32): a dot product with q8_1 bytes is then the unsigned
    /// by signed `dp4a` less `OFFSET` times the q8_1 bytes' sum, the same integer with the
    /// sign extension left out ([`super::mmvq::contribution_words`]).
    const OFFSET: i32 = 0;
    /// Bytes from a row's start to the block holding its group `g`.
    #[inline(always)]
    fn block_offset(g: u32) -> usize {
        (g / Self::GROUPS) as usize * Self::BYTES
    }
    /// Bytes of a row of `groups` groups (whole blocks).
    #[inline(always)]
    fn row_bytes(groups: u32) -> usize {
        Self::block_offset(groups)
    }
    /// Whether the pair gate/up entries copy their rows to shared memory and read them there
    /// (`WeightFormat::pair_stages_rows`).
    const STAGED_ROWS: bool = false;
    /// Group `g` of the block at `p` (device memory, or a copy in shared memory), its codebook
    /// words read from `grid`.
    ///
    /// # Safety
    /// `p` points at one whole block, 2-byte aligned; `g < GROUPS`; `grid` holds
    /// `Self::grid()`'s words.
    unsafe fn load_with<G: Grid, S: Bytes>(p: S, g: u32, grid: G) -> Group;
    /// Group `g` of the block at `p`, codebook from global memory.
    ///
    /// # Safety
    /// As [`Self::load_with`].
    #[inline(always)]
    unsafe fn load(p: *const u8, g: u32) -> Group {
        Self::load_with(p, g, Global(Self::grid()))
    }
    /// Group `g` of the row at `row` (device memory): [`Self::load`] of the block holding it.
    ///
    /// # Safety
    /// `row` points at a row of more than `g` groups, 2-byte aligned.
    #[inline(always)]
    unsafe fn group_at(row: *const u8, g: u32) -> Group {
        Self::load(row.add(Self::block_offset(g)), g % Self::GROUPS)
    }
}

#[inline(always)]
unsafe fn scale<S: Bytes>(p: S, off: usize) -> f32 {
    convert::f16_to_f32(p.u16(off))
}

/// 4-bit sign mask (bit i = byte i negative) to a byte mask (0xff in negative bytes).
#[inline(always)]
fn sign_bytes(bits: u32) -> u32 {
    ((bits & 15).wrapping_mul(0x0020_4081) & 0x0101_0101) * 0xff
}

/// Applies byte signs to four magnitudes (each 1..127): negative bytes become `-m`. With
/// nonzero magnitudes `(m ^ 0xff) + 1` never carries into the next byte.
#[inline(always)]
fn signed(mags: u32, bits: u32) -> u32 {
    let mask = sign_bytes(bits);
    (mags ^ mask).wrapping_add(mask & 0x0101_0101)
}

/// The 7-bit sign code's 8 signs: bit 7 makes the count of negatives even (`codebooks::KSIGNS`).
#[inline(always)]
fn ksigns(code: u32) -> u32 {
    code | (code.count_ones() & 1) << 7
}

/// Four nibble bytes (byte j: value j's code in its low nibble, value j + 16's in its high) to
/// their IQ4_NL levels: the low nibbles' word and the high nibbles'. The word's own nibbles are
/// the byte permutes' selectors (one selector nibble an output byte, the low 16 bits read), so
/// a permute gives the levels of two bytes' nibbles interleaved, low then high; bit 3 of a code
/// would be `prmt`'s sign mode, so the permutes see `code & 7` over the levels 0-7 and 8-15, a
/// third picks each byte's by bit 3, and two more put the low and the high nibbles' levels in
/// words of their own: about 13 instructions for 8 values, where packing the selectors of 4
/// codes took about 12 for 4 (the same levels, so the same bits).
#[inline(always)]
fn iq4_levels(nibbles: u32) -> (u32, u32) {
    let [l0, l1, l2, l3] = iq4_nl::LEVEL_WORDS;
    let sel = nibbles & 0x7777_7777;
    // Byte n from the levels 0-7 (bytes 0-3) or 8-15 (bytes 4-7) by bit 3 of code n.
    let pick = 0x3210_3210 | (nibbles >> 1 & 0x4444_4444);
    let levels = |sel: u32, pick: u32| int::prmt(int::prmt(l0, l1, sel), int::prmt(l2, l3, sel), pick);
    let (bytes01, bytes23) = (levels(sel, pick), levels(sel >> 16, pick >> 16));
    (int::prmt(bytes01, bytes23, 0x6420), int::prmt(bytes01, bytes23, 0x7531))
}

/// 16 nibble bytes at `qs` to the 8 words of IQ4 levels (low nibbles first, then high).
#[inline(always)]
unsafe fn iq4_words<S: Bytes>(p: S, qs: usize) -> [u32; 8] {
    iq4_words_of(core::array::from_fn(|i| p.u32_a2(qs + 4 * i)))
}

/// The 16 nibble bytes as four words to the 8 words of IQ4 levels.
#[inline(always)]
fn iq4_words_of(nibbles: [u32; 4]) -> [u32; 8] {
    let mut w = [0u32; 8];
    for (i, nib) in nibbles.into_iter().enumerate() {
        (w[i], w[i + 4]) = iq4_levels(nib);
    }
    w
}

pub struct Q8_0;
impl Block for Q8_0 {
    const BYTES: usize = q8_0::BYTES;
    const GROUPS: u32 = 1;
    const SHIFT: u32 = 0;
    #[inline(always)]
    unsafe fn load_with<G: Grid, S: Bytes>(p: S, _g: u32, _grid: G) -> Group {
        let mut w = [0u32; 8];
        for (i, word) in w.iter_mut().enumerate() {
            *word = p.u32_a2(q8_0::OFF_Q + 4 * i);
        }
        Group { d: scale(p, q8_0::OFF_D), w, f: [1, 1] }
    }
}

/// Q8_0 in tiles of 32 blocks (`formats::q8_0t`): group `g` of a tile is two 16-byte aligned
/// loads and its scale, where a Q8_0 block is seventeen 2-byte loads.
pub struct Q8_0T;
impl Block for Q8_0T {
    const BYTES: usize = q8_0t::BYTES;
    const GROUPS: u32 = q8_0t::BLOCKS as u32;
    const SHIFT: u32 = 0;
    #[inline(always)]
    unsafe fn load_with<G: Grid, S: Bytes>(p: S, g: u32, _grid: G) -> Group {
        // Tiles start 16-byte aligned: rows are whole tiles of 1,088 bytes (68 x 16) from an
        // aligned allocation.
        let lo = p.v4(q8_0t::OFF_LO + 16 * g as usize);
        let hi = p.v4(q8_0t::OFF_HI + 16 * g as usize);
        let w = [lo[0], lo[1], lo[2], lo[3], hi[0], hi[1], hi[2], hi[3]];
        Group { d: scale(p, q8_0t::OFF_D + 2 * g as usize), w, f: [1, 1] }
    }
}

pub struct Q2_0;
impl Block for Q2_0 {
    const BYTES: usize = q2_0::BYTES;
    const GROUPS: u32 = 2;
    const SHIFT: u32 = 0;
    #[inline(always)]
    unsafe fn load_with<G: Grid, S: Bytes>(p: S, g: u32, _grid: G) -> Group {
        // Levels of codes 0..3 = -1, 0, 1, 2, as one word for `prmt`.
        const LEVELS: u32 = 0x0201_00ff;
        let mut w = [0u32; 8];
        for i in 0..4 {
            let two = p.u16(q2_0::OFF_QS + 8 * g as usize + 2 * i) as u32;
            for h in 0..2 {
                let b = two >> (8 * h);
                let sel = (b & 0x3) | (b & 0xc) << 2 | (b & 0x30) << 4 | (b & 0xc0) << 6;
                w[2 * i + h] = int::prmt(LEVELS, 0, sel);
            }
        }
        Group { d: scale(p, q2_0::OFF_D), w, f: [1, 1] }
    }
}

pub struct Iq4Nl;
impl Block for Iq4Nl {
    const BYTES: usize = iq4_nl::BYTES;
    const GROUPS: u32 = 1;
    const SHIFT: u32 = 0;
    #[inline(always)]
    unsafe fn load_with<G: Grid, S: Bytes>(p: S, _g: u32, _grid: G) -> Group {
        Group { d: scale(p, iq4_nl::OFF_D), w: iq4_words(p, iq4_nl::OFF_QS), f: [1, 1] }
    }
}

/// IQ4_NL in tiles of 8 blocks (`formats::iq4_nlt`): group g of a tile is one 16-byte aligned
/// load and its scale, where an IQ4_NL block is nine 2-byte loads.
pub struct Iq4NlT;
impl Block for Iq4NlT {
    const BYTES: usize = iq4_nlt::BYTES;
    const GROUPS: u32 = iq4_nlt::BLOCKS as u32;
    const SHIFT: u32 = 0;
    #[inline(always)]
    unsafe fn load_with<G: Grid, S: Bytes>(p: S, g: u32, _grid: G) -> Group {
        // Tiles are 144 bytes (9 x 16) in rows of whole tiles from a 16-byte aligned allocation.
        let w = iq4_words_of(p.v4(iq4_nlt::OFF_QS + 16 * g as usize));
        Group { d: scale(p, iq4_nlt::OFF_D + 2 * g as usize), w, f: [1, 1] }
    }
}

pub struct Iq4Xs;
impl Block for Iq4Xs {
    const BYTES: usize = iq4_xs::BYTES;
    const GROUPS: u32 = 8;
    const SHIFT: u32 = 0;
    #[inline(always)]
    unsafe fn load_with<G: Grid, S: Bytes>(p: S, g: u32, _grid: G) -> Group {
        let lo = (p.u8(iq4_xs::OFF_SCALES_L + g as usize / 2) as u32 >> (4 * (g % 2))) & 15;
        let hi = (p.u16(iq4_xs::OFF_SCALES_H) as u32 >> (2 * g)) & 3;
        let f = (lo | hi << 4) as i32 - 32;
        Group { d: scale(p, iq4_xs::OFF_D), w: iq4_words(p, iq4_xs::OFF_QS + 16 * g as usize), f: [f, f] }
    }
}

pub struct Q6K;
impl Block for Q6K {
    const BYTES: usize = q6_k::BYTES;
    const GROUPS: u32 = 8;
    const SHIFT: u32 = 0;
    const OFFSET: i32 = 32;
    #[inline(always)]
    unsafe fn load_with<G: Grid, S: Bytes>(p: S, g: u32, _grid: G) -> Group {
        let (h, q) = (g as usize / 4, g % 4);
        let (ql, qh) = (q6_k::OFF_QL + 64 * h + 32 * (q as usize % 2), q6_k::OFF_QH + 32 * h);
        let ql: [u32; 8] = core::array::from_fn(|i| p.u32_a2(ql + 4 * i));
        let qh: [u32; 8] = core::array::from_fn(|i| p.u32_a2(qh + 4 * i));
        let sc = p.u16(q6_k::OFF_SCALES + 2 * g as usize);
        q6_group(ql, qh, q, sc, scale(p, q6_k::OFF_D))
    }
}

/// Q6_K in tiles of 8 regrouped blocks (`formats::q6_kt`): group g of a tile is one 16-byte
/// load of its nibbles, one 8-byte load of its high bits, its two scales and `d`, where a Q6_K
/// group is thirty-four 2-byte loads.
pub struct Q6KT;
impl Block for Q6KT {
    const BYTES: usize = q6_kt::BYTES;
    const GROUPS: u32 = 8 * q6_kt::BLOCKS as u32;
    const SHIFT: u32 = 0;
    const OFFSET: i32 = 32;
    #[inline(always)]
    unsafe fn load_with<G: Grid, S: Bytes>(p: S, g: u32, _grid: G) -> Group {
        // Tiles are 1,680 bytes (105 x 16) in rows of whole tiles from a 16-byte aligned
        // allocation: a group's nibbles are 16-byte aligned, its high bits 8-byte aligned.
        let nb = p.v4(q6_kt::OFF_QL + 16 * g as usize);
        let hb = p.v2(q6_kt::OFF_QH + 8 * g as usize);
        let sc = p.u16(q6_kt::OFF_SCALES + 2 * g as usize);
        // Word i: the low nibbles of the first four nibble words, then their high nibbles;
        // bits 2s, 2s + 1 (s = i % 4) of high-bit word i / 4.
        let w = core::array::from_fn(|i| q6_word(nb[i % 4], i as u32 / 4, hb[i / 4], i as u32 % 4));
        Group { d: scale(p, q6_kt::OFF_D + 2 * (g as usize / 8)), w, f: q6_factors(sc) }
    }
}

/// A Q6_K group from its 32 nibble bytes `ql` and 32 high-bit bytes `qh` (quarter `q` of its
/// half: nibble `q / 2`, bits `2q..2q + 2`), its two scale bytes `sc` and `d`: the 6-bit values
/// unsigned (`Block::OFFSET` 32).
#[inline(always)]
fn q6_group(ql: [u32; 8], qh: [u32; 8], q: u32, sc: u16, d: f32) -> Group {
    Group { d, w: core::array::from_fn(|i| q6_word(ql[i], q / 2, qh[i], q)), f: q6_factors(sc) }
}

/// Four unsigned 6-bit values: in every byte, nibble `n` of `nibbles` and bits `2s, 2s + 1` of
/// `highs`, the latter moved to bits 4, 5 by one rotation (left by `4 - 2s`, right by 2 for `s =
/// 3`); what wraps around lands outside the mask.
#[inline(always)]
fn q6_word(nibbles: u32, n: u32, highs: u32, s: u32) -> u32 {
    let rot = (4 + 32 - 2 * s) % 32;
    (nibbles >> (4 * n)) & 0x0f0f_0f0f | highs.rotate_left(rot) & 0x3030_3030
}

/// A Q6_K group's two signed scales (values 0..16 and 16..32) from their two bytes.
#[inline(always)]
fn q6_factors(sc: u16) -> [i32; 2] {
    [sc as u8 as i8 as i32, (sc >> 8) as u8 as i8 as i32]
}

/// An 8-magnitude grid entry with its 8 sign bits, as two words.
///
/// # Safety
/// `2 * entry + 1` is below the codebook's length.
#[inline(always)]
unsafe fn grid8<G: Grid>(grid: G, entry: usize, signs: u32) -> (u32, u32) {
    (grid.signed_word(2 * entry, signs), grid.signed_word(2 * entry + 1, signs >> 4))
}

pub struct Iq2Xxs;
impl Block for Iq2Xxs {
    const BYTES: usize = iq2_xxs::BYTES;
    const GROUPS: u32 = 8;
    const SHIFT: u32 = 3;
    fn grid() -> &'static [u32] {
        &IQ2_XXS_GRID
    }
    #[inline(always)]
    unsafe fn load_with<G: Grid, S: Bytes>(p: S, g: u32, grid: G) -> Group {
        let q = iq2_xxs::OFF_QS + 8 * g as usize;
        let (a0, a1) = (p.u32_a2(q), p.u32_a2(q + 4));
        let mut w = [0u32; 8];
        for l in 0..4 {
            (w[2 * l], w[2 * l + 1]) = grid8(grid, (a0 >> (8 * l) & 0xff) as usize, ksigns(a1 >> (7 * l) & 127));
        }
        let f = 2 * (a1 >> 28) as i32 + 1;
        Group { d: scale(p, iq2_xxs::OFF_D), w, f: [f, f] }
    }
}

pub struct Iq2Xs;
impl Block for Iq2Xs {
    const BYTES: usize = iq2_xs::BYTES;
    const GROUPS: u32 = 8;
    const SHIFT: u32 = 3;
    fn grid() -> &'static [u32] {
        &IQ2_XS_GRID
    }
    #[inline(always)]
    unsafe fn load_with<G: Grid, S: Bytes>(p: S, g: u32, grid: G) -> Group {
        let mut w = [0u32; 8];
        for l in 0..4 {
            let q = p.u16(iq2_xs::OFF_QS + 2 * (4 * g as usize + l)) as u32;
            (w[2 * l], w[2 * l + 1]) = grid8(grid, (q & 511) as usize, ksigns(q >> 9));
        }
        let s = p.u8(iq2_xs::OFF_SCALES + g as usize) as i32;
        Group { d: scale(p, iq2_xs::OFF_D), w, f: [2 * (s & 15) + 1, 2 * (s >> 4) + 1] }
    }
}

pub struct Iq2S;
impl Block for Iq2S {
    const BYTES: usize = iq2_s::BYTES;
    const GROUPS: u32 = 8;
    const SHIFT: u32 = 3;
    fn grid() -> &'static [u32] {
        &IQ2_S_GRID
    }
    #[inline(always)]
    unsafe fn load_with<G: Grid, S: Bytes>(p: S, g: u32, grid: G) -> Group {
        let qs = p.u32_a2(iq2_s::OFF_QS + 4 * g as usize);
        let signs = p.u32_a2(iq2_s::OFF_SIGNS + 4 * g as usize);
        let qh = p.u8(iq2_s::OFF_QH + g as usize) as u32;
        let mut w = [0u32; 8];
        for l in 0..4 {
            let entry = (qs >> (8 * l) & 0xff) | ((qh >> (2 * l)) & 3) << 8;
            (w[2 * l], w[2 * l + 1]) = grid8(grid, entry as usize, signs >> (8 * l) & 0xff);
        }
        let s = p.u8(iq2_s::OFF_SCALES + g as usize) as i32;
        Group { d: scale(p, iq2_s::OFF_D), w, f: [2 * (s & 15) + 1, 2 * (s >> 4) + 1] }
    }
}

pub struct Iq3Xxs;
impl Block for Iq3Xxs {
    const BYTES: usize = iq3_xxs::BYTES;
    const GROUPS: u32 = 8;
    const SHIFT: u32 = 2;
    fn grid() -> &'static [u32] {
        &IQ3_XXS_GRID
    }
    #[inline(always)]
    unsafe fn load_with<G: Grid, S: Bytes>(p: S, g: u32, grid: G) -> Group {
        let q = iq3_xxs::OFF_QS + 8 * g as usize;
        let idx = [p.u32_a2(q), p.u32_a2(q + 4)];
        let aux = p.u32_a2(iq3_xxs::OFF_AUX + 4 * g as usize);
        let mut w = [0u32; 8];
        for l in 0..4 {
            let signs = ksigns(aux >> (7 * l) & 127);
            for half in 0..2 {
                let i = 2 * l + half;
                let entry = (idx[i / 4] >> (8 * (i % 4))) & 0xff;
                w[i] = grid.signed_word(entry as usize, signs >> (4 * half));
            }
        }
        let f = 2 * (aux >> 28) as i32 + 1;
        Group { d: scale(p, iq3_xxs::OFF_D), w, f: [f, f] }
    }
}

pub struct Iq3S;
impl Block for Iq3S {
    const BYTES: usize = iq3_s::BYTES;
    const GROUPS: u32 = 8;
    const SHIFT: u32 = 0;
    fn grid() -> &'static [u32] {
        &IQ3_S_GRID
    }
    #[inline(always)]
    unsafe fn load_with<G: Grid, S: Bytes>(p: S, g: u32, grid: G) -> Group {
        let q = iq3_s::OFF_QS + 8 * g as usize;
        let idx = [p.u32_a2(q), p.u32_a2(q + 4)];
        let qh = p.u8(iq3_s::OFF_QH + g as usize) as u32;
        let signs = p.u32_a2(iq3_s::OFF_SIGNS + 4 * g as usize);
        let s = (p.u8(iq3_s::OFF_SCALES + g as usize / 2) as u32 >> (4 * (g % 2))) & 15;
        iq3_s_group(idx, qh, signs, s, scale(p, iq3_s::OFF_D), grid)
    }
}

/// IQ3_S in tiles of 8 blocks (`formats::iq3_st`): group g of a tile is an 8-byte load of grid
/// indices, a 4-byte load of signs, its high-bit and scale bytes and its block's scale, all
/// aligned, where an IQ3_S group is nine 1- and 2-byte loads.
pub struct Iq3ST;
impl Block for Iq3ST {
    const BYTES: usize = iq3_st::BYTES;
    const GROUPS: u32 = 8 * iq3_st::BLOCKS as u32;
    const SHIFT: u32 = 0;
    fn grid() -> &'static [u32] {
        &IQ3_S_GRID
    }
    fn staged_grid() -> &'static [u32] {
        &IQ3_S_LANES.0
    }
    const LANE_GRID: bool = WeightFormat::Iq3ST.lane_grid();
    const STAGED_ROWS: bool = WeightFormat::Iq3ST.pair_stages_rows();
    #[inline(always)]
    unsafe fn load_with<G: Grid, S: Bytes>(p: S, g: u32, grid: G) -> Group {
        // Tiles are 880 bytes (55 x 16) in rows of whole tiles from a 16-byte aligned allocation.
        let idx = p.v2(iq3_st::OFF_QS + 8 * g as usize);
        let qh = p.u8(iq3_st::OFF_QH + g as usize) as u32;
        let signs = p.u32(iq3_st::OFF_SIGNS + 4 * g as usize); // reordered: `Regroup::Iq3Signs`
        let s = (p.u8(iq3_st::OFF_SCALES + g as usize / 2) as u32 >> (4 * (g % 2))) & 15;
        let f = 1 + 2 * s as i32;
        Group { d: scale(p, iq3_st::OFF_D + 2 * (g / 8) as usize), w: grid.iq3_st_words(idx, qh, signs), f: [f, f] }
    }
}

/// An IQ3_S group from its fields: 8 index bytes, the high bits of the 8 indices, 32 sign bits
/// (4 a word), the 4-bit scale and the block's scale `d`.
#[inline(always)]
unsafe fn iq3_s_group<G: Grid>(idx: [u32; 2], qh: u32, signs: u32, s: u32, d: f32, grid: G) -> Group {
    let f = 1 + 2 * s as i32;
    Group { d, w: grid.iq3_s_words(idx, qh, signs), f: [f, f] }
}
