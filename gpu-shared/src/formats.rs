//! Block layouts and codebooks (see `../shared/docs/FORMATS.md`). All fields little-endian.
//!
//! Kernels read blocks by byte offset with explicit loads, so each layout is given as offsets
//! and sizes rather than as a `#[repr(C)]` struct (a 34-byte Q8_0 block has 2-byte alignment at
//! best; a struct would invite misaligned wide loads).
//!
//! Every quantized weight format decodes, per 32-value group, to the same shape (see
//! [`crate::replica::decode_group`]): an fp16 scale `d`, 32 signed 8-bit integer values `v`,
//! two integer factors (`f[0]` for values 0..16, `f[1]` for 16..32) and a power-of-two shift
//! `k`, with `value_j = d * f[j / 16] * v_j * 2^-k` exactly.

/// Values per quantization group: the unit of every exact integer dot product.
pub const GROUP: usize = 32;
/// Values per super-block of the K-quant and IQ formats.
pub const QK_K: usize = 256;

/// q8_1 activation block: fp16 `d`, fp16 `s`, 32 x i8 `q`. Strata's convention (the
/// `quantize_q8_1` spec in [`crate::order`]): `d` = fp16(amax / 127), `q` = round-half-even(x / d),
/// `s` = fp16(d * sum(q)).
pub mod q8_1 {
    pub const BYTES: usize = 36;
    pub const OFF_D: usize = 0;
    pub const OFF_S: usize = 2;
    pub const OFF_Q: usize = 4;

    /// Bytes of the q8_1 blocks of `values` values (a multiple of the group).
    pub const fn bytes_of(values: usize) -> usize {
        values / super::GROUP * BYTES
    }
}

/// Q8_0: fp16 `d`, 32 x i8 `q`; value = d * q.
pub mod q8_0 {
    pub const BYTES: usize = 34;
    pub const OFF_D: usize = 0;
    pub const OFF_Q: usize = 2;
}

/// Tiled device layouts of GGUF formats (not GGUF types): a tile holds `blocks` consecutive
/// blocks of the base format field by field (field 0 of every block, then field 1, ...), so
/// that lane g of a warp reading group g of a tile finds each field next to lane g+1's, at
/// offsets aligned to the field's size: one coalesced load a field where the base format's
/// 2-byte-aligned blocks cost a lane many 2-byte loads. The values, so every bit of a product,
/// are the base format's; a block's bytes are the base block's, or where the tiling names a
/// [`Regroup`], those bytes with a group's bits brought together. The host tiles what the
/// kernels read that way ([`Tiling::tile`]).
pub mod tiles {
    use super::{iq3_s, q6_k, WeightFormat};

    /// The largest base block a tiling regroups (Q6_K's).
    const MAX_BASE_BYTES: usize = q6_k::BYTES;
    const _: () = {
        let mut i = 0;
        while i < WeightFormat::TILED.len() {
            assert!(WeightFormat::TILED[i].base().block_bytes() <= MAX_BASE_BYTES);
            i += 1;
        }
    };

    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub struct Tiling {
        pub base: WeightFormat,
        /// Base blocks per tile.
        pub blocks: usize,
        /// The base block's fields in tile order: (byte offset in the block, length). Together
        /// they cover the block once.
        pub fields: &'static [(usize, usize)],
        /// A permutation of a base block's bits applied before its fields are placed.
        pub regroup: Regroup,
    }

    /// A permutation of the bits of a base block (the same length, the same fields), so that
    /// the bits of one 32-value group lie together.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum Regroup {
        /// The bytes as they are.
        None,
        /// Q6_K's 128 nibble bytes and 64 high-bit bytes, where a group's 32 nibbles are spread
        /// over 32 bytes and its 2-bit highs over 32 more, to 16 nibble bytes and 8 high-bit
        /// bytes a group (`q6_fields`): group k (half `k / 4`, quarter `k % 4`) at nibble
        /// byte `16 k`, byte j holding value j's nibble low and value j + 16's high, and at
        /// high-bit byte `128 + 8 k`, byte `4 u + c` holding in bits `2 s, 2 s + 1` the high
        /// bits of value `4 (4 u + s) + c`. Scales and `d` stay.
        Q6Groups,
        /// IQ3_S's 32 sign bits of a group (bit v of its 4 sign bytes, little-endian: value v
        /// negative), reordered so that a decoded word's four signs are one bit of each nibble
        /// of a 16-bit half (`iq3_sign_bit`): the sign of byte j of word i (value `4 i + j`) at
        /// bit `16 (i / 4) + 4 j + i % 4`. Shifted so that word i's bits sit at bits `4 j + 2`,
        /// the group's sign word is then the byte permute's selector that picks, byte by byte,
        /// a magnitude or its negation (`Iq3ST` in device/src/kernels/blocks.rs). The rest stays.
        Iq3Signs,
    }

    /// Where bit `v` (value v's sign) of an IQ3_S group's 32 sign bits goes in [`Regroup::Iq3Signs`].
    pub const fn iq3_sign_bit(v: usize) -> usize {
        let (i, j) = (v / 4, v % 4);
        16 * (i / 4) + 4 * j + i % 4
    }

    /// Where value `i` of group `k` of a Q6_K block keeps its nibble and its two high bits:
    /// for each, (byte, shift) in the Q6_K block, (byte, shift) regrouped, and its mask.
    fn q6_fields(k: usize, i: usize) -> [((usize, usize), (usize, usize), u8); 2] {
        let (h, q) = (k / 4, k % 4);
        let (u, s, c) = (i / 16, i / 4 % 4, i % 4);
        [
            ((q6_k::OFF_QL + 64 * h + 32 * (q % 2) + i, 4 * (q / 2)), (q6_k::OFF_QL + 16 * k + i % 16, 4 * (i / 16)), 15),
            ((q6_k::OFF_QH + 32 * h + i, 2 * q), (q6_k::OFF_QH + 8 * k + 4 * u + c, 2 * s), 3),
        ]
    }

    impl Regroup {
        /// `block` (a base block) regrouped into `out` (as long).
        pub fn apply(self, block: &[u8], out: &mut [u8]) {
            self.move_bits(block, out, true);
        }

        /// The inverse of [`Regroup::apply`]: a regrouped block back to the base block.
        pub fn invert(self, regrouped: &[u8], out: &mut [u8]) {
            self.move_bits(regrouped, out, false);
        }

        /// `from` into `out` with every field of the permutation moved from its base place to
        /// its regrouped one (`forward`) or back.
        fn move_bits(self, from: &[u8], out: &mut [u8], forward: bool) {
            out.copy_from_slice(from);
            if self == Regroup::Iq3Signs {
                out[iq3_s::OFF_SIGNS..iq3_s::OFF_SIGNS + 32].fill(0);
                for k in 0..8 {
                    for v in 0..32 {
                        let (base, regrouped) = (v, iq3_sign_bit(v));
                        let (sb, db) = if forward { (base, regrouped) } else { (regrouped, base) };
                        let at = iq3_s::OFF_SIGNS + 4 * k;
                        out[at + db / 8] |= (from[at + sb / 8] >> (sb % 8) & 1) << (db % 8);
                    }
                }
            }
            if self == Regroup::Q6Groups {
                out[q6_k::OFF_QL..q6_k::OFF_QH + 64].fill(0);
                for k in 0..8 {
                    for i in 0..32 {
                        for (base, regrouped, mask) in q6_fields(k, i) {
                            let ((sb, ss), (db, ds)) = if forward { (base, regrouped) } else { (regrouped, base) };
                            out[db] |= (from[sb] >> ss & mask) << ds;
                        }
                    }
                }
            }
        }
    }

    impl Tiling {
        /// Bytes of a tile: those of its blocks (the fields cover a block).
        pub const fn bytes(&self) -> usize {
            self.field(self.fields.len())
        }

        /// Offset in the tile of field `i` of its block 0 (block b's is `+ b * len`).
        pub const fn field(&self, i: usize) -> usize {
            let mut off = 0;
            let mut j = 0;
            while j < i {
                off += self.blocks * self.fields[j].1;
                j += 1;
            }
            off
        }

        /// Base blocks (a whole number of tiles) to tiles in `out`, of the same length.
        pub fn tile(&self, blocks: &[u8], out: &mut [u8]) {
            let (bb, tb) = (self.base.block_bytes(), self.bytes());
            assert!(tb == self.blocks * bb, "the fields of a tile cover its blocks");
            assert!(blocks.len() % tb == 0 && out.len() == blocks.len(), "{} tiles {} whole {} blocks", self.base.name(), self.blocks, self.base.name());
            let mut regrouped = [0u8; MAX_BASE_BYTES];
            for (tile, src) in out.chunks_exact_mut(tb).zip(blocks.chunks_exact(tb)) {
                for (b, block) in src.chunks_exact(bb).enumerate() {
                    self.regroup.apply(block, &mut regrouped[..bb]);
                    for (i, &(off, len)) in self.fields.iter().enumerate() {
                        let at = self.field(i) + b * len;
                        tile[at..at + len].copy_from_slice(&regrouped[off..off + len]);
                    }
                }
            }
        }

        /// Block `b` of `tile` back in the base layout, into `out[..base block bytes]`.
        pub fn untile_block(&self, tile: &[u8], b: usize, out: &mut [u8]) {
            let bb = self.base.block_bytes();
            let mut regrouped = [0u8; MAX_BASE_BYTES];
            for (i, &(off, len)) in self.fields.iter().enumerate() {
                let at = self.field(i) + b * len;
                regrouped[off..off + len].copy_from_slice(&tile[at..at + len]);
            }
            self.regroup.invert(&regrouped[..bb], &mut out[..bb]);
        }
    }
}

/// Q8_0T: tiles of 32 Q8_0 blocks (1,024 values, 1,088 bytes): the blocks' first 16 quant
/// bytes, then their last 16, then their fp16 scales. Group g of a tile (Q8_0 block g) is two
/// 16-byte aligned loads and `d[g]`, where a Q8_0 block is seventeen 2-byte loads.
pub mod q8_0t {
    use super::{q8_0, tiles::{Regroup, Tiling}, WeightFormat};

    pub const TILING: Tiling = Tiling { base: WeightFormat::Q8_0, blocks: 32, fields: &[(q8_0::OFF_Q, 16), (q8_0::OFF_Q + 16, 16), (q8_0::OFF_D, 2)], regroup: Regroup::None };
    pub const BLOCKS: usize = TILING.blocks;
    pub const BYTES: usize = TILING.bytes();
    pub const OFF_LO: usize = TILING.field(0);
    pub const OFF_HI: usize = TILING.field(1);
    pub const OFF_D: usize = TILING.field(2);
}

/// IQ4_NLT: tiles of 8 IQ4_NL blocks (256 values, 144 bytes: 16-byte aligned in rows of whole
/// tiles): the blocks' 16 nibble bytes, then their fp16 scales. Group g of a tile (IQ4_NL block
/// g) is one 16-byte load and `d[g]`, where an IQ4_NL block is nine 2-byte loads.
pub mod iq4_nlt {
    use super::{iq4_nl, tiles::{Regroup, Tiling}, WeightFormat};

    pub const TILING: Tiling = Tiling { base: WeightFormat::Iq4Nl, blocks: 8, fields: &[(iq4_nl::OFF_QS, 16), (iq4_nl::OFF_D, 2)], regroup: Regroup::None };
    pub const BLOCKS: usize = TILING.blocks;
    pub const BYTES: usize = TILING.bytes();
    pub const OFF_QS: usize = TILING.field(0);
    pub const OFF_D: usize = TILING.field(1);
}

/// IQ3_ST: tiles of 8 IQ3_S blocks (2,048 values, 880 bytes: 16-byte aligned in rows of whole
/// tiles): the blocks' 64 grid-index bytes, then their 32 sign bytes (each group's 32 bits
/// reordered, [`tiles::Regroup::Iq3Signs`]), 8 high-bit bytes, 4 scale bytes and fp16 scales.
/// Group g of a tile (group g % 8 of block g / 8) is an 8-byte load of indices at `OFF_QS + 8
/// g`, a 4-byte load of signs at `OFF_SIGNS + 4 g`, its high-bit byte at `OFF_QH + g`, scale
/// nibble in byte `OFF_SCALES + g / 2` and `d` at `OFF_D + 2 (g / 8)`: five aligned loads where
/// an IQ3_S group is nine 1- and 2-byte loads.
pub mod iq3_st {
    use super::{iq3_s, tiles::{Regroup, Tiling}, WeightFormat};

    pub const TILING: Tiling = Tiling {
        base: WeightFormat::Iq3S,
        blocks: 8,
        fields: &[(iq3_s::OFF_QS, 64), (iq3_s::OFF_SIGNS, 32), (iq3_s::OFF_QH, 8), (iq3_s::OFF_SCALES, 4), (iq3_s::OFF_D, 2)],
        regroup: Regroup::Iq3Signs,
    };
    pub const BLOCKS: usize = TILING.blocks;
    pub const BYTES: usize = TILING.bytes();
    pub const OFF_QS: usize = TILING.field(0);
    pub const OFF_SIGNS: usize = TILING.field(1);
    pub const OFF_QH: usize = TILING.field(2);
    pub const OFF_SCALES: usize = TILING.field(3);
    pub const OFF_D: usize = TILING.field(4);
    const _: () = assert!(BYTES % 16 == 0 && OFF_QS % 8 == 0 && OFF_SIGNS % 4 == 0 && OFF_D % 2 == 0);
}

/// Q6_KT: tiles of 8 Q6_K blocks (2,048 values, 1,680 bytes: 16-byte aligned in rows of whole
/// tiles), each block regrouped ([`tiles::Regroup::Q6Groups`]): the blocks' 128 nibble bytes,
/// then their 64 high-bit bytes, 16 scales and fp16 scales. Group g of a tile (group g % 8 of
/// block g / 8) is one 16-byte load of its nibbles at `OFF_QL + 16 g`, one 8-byte load of its
/// high bits at `OFF_QH + 8 g`, its two scales at `OFF_SCALES + 2 g` and `d` at `OFF_D + 2 (g /
/// 8)`: four aligned loads of 28 bytes, where a Q6_K group is thirty-four 2-byte loads (and
/// Q6_K's own bytes tiled, 64 bytes in four 16-byte loads).
pub mod q6_kt {
    use super::{q6_k, tiles::{Regroup, Tiling}, WeightFormat};

    pub const TILING: Tiling = Tiling {
        base: WeightFormat::Q6K,
        blocks: 8,
        fields: &[(q6_k::OFF_QL, 128), (q6_k::OFF_QH, 64), (q6_k::OFF_SCALES, 16), (q6_k::OFF_D, 2)],
        regroup: Regroup::Q6Groups,
    };
    pub const BLOCKS: usize = TILING.blocks;
    pub const BYTES: usize = TILING.bytes();
    pub const OFF_QL: usize = TILING.field(0);
    pub const OFF_QH: usize = TILING.field(1);
    pub const OFF_SCALES: usize = TILING.field(2);
    pub const OFF_D: usize = TILING.field(3);
    const _: () = assert!(BYTES % 16 == 0 && OFF_QL % 16 == 0 && OFF_QH % 16 == 0 && OFF_SCALES % 2 == 0 && OFF_D % 2 == 0);
}

/// Q2_0 (64 values): fp16 `d`, 16 bytes of 2-bit codes, four per byte, least significant
/// first; value = d * (code - 1).
pub mod q2_0 {
    pub const VALUES: usize = 64;
    pub const BYTES: usize = 18;
    pub const OFF_D: usize = 0;
    pub const OFF_QS: usize = 2;
}

/// IQ4_NL: fp16 `d`, 16 bytes of nibbles; value j < 16 is the low nibble of `qs[j]`, value
/// j >= 16 the high nibble of `qs[j - 16]`; value = d * LEVELS[nibble].
pub mod iq4_nl {
    pub const BYTES: usize = 18;
    pub const OFF_D: usize = 0;
    pub const OFF_QS: usize = 2;
    pub const LEVELS: [i8; 16] =
        [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113];

    /// The levels as four little-endian words of signed bytes (levels 0-3, 4-7, 8-11, 12-15):
    /// the operands of the kernels' byte-permute lookup.
    pub const LEVEL_WORDS: [u32; 4] = {
        let mut w = [0u32; 4];
        let mut i = 0;
        while i < 16 {
            w[i / 4] |= (LEVELS[i] as u8 as u32) << (8 * (i % 4));
            i += 1;
        }
        w
    };
}

/// IQ4_XS (256 values): fp16 `d`, u16 `scales_h`, u8 `scales_l[4]`, u8 `qs[128]`. Group g's
/// 6-bit scale `ls` = nibble g%2 of `scales_l[g/2]` | bits 2g..2g+2 of `scales_h` << 4; value =
/// d * (ls - 32) * LEVELS[nibble], nibbles of `qs[16g..16g+16]` as in IQ4_NL.
pub mod iq4_xs {
    pub const BYTES: usize = 136;
    pub const OFF_D: usize = 0;
    pub const OFF_SCALES_H: usize = 2;
    pub const OFF_SCALES_L: usize = 4;
    pub const OFF_QS: usize = 8;
}

/// Q6_K (256 values): u8 `ql[128]`, u8 `qh[64]`, i8 `scales[16]`, fp16 `d` (last). Value p:
/// h = p / 128, r = p % 128; low nibble from `ql[64h + r % 64]` (high nibble when r >= 64), two
/// high bits from `qh[32h + r % 32]` at bit 2 * (r / 32); q = that 6-bit value - 32; value =
/// d * scales[p / 16] * q.
pub mod q6_k {
    pub const BYTES: usize = 210;
    pub const OFF_QL: usize = 0;
    pub const OFF_QH: usize = 128;
    pub const OFF_SCALES: usize = 192;
    pub const OFF_D: usize = 208;
}

/// IQ2_XXS (256 values): fp16 `d`, u16 `qs[32]`. Group g reads two u32 at byte 2 + 8g: byte l
/// of the first indexes the 256-entry grid (8 magnitudes), 7-bit sign code l of the second is
/// `(a1 >> 7l) & 127`, its top nibble the scale s: value = d * (2s + 1) / 8 * magnitude * sign.
pub mod iq2_xxs {
    pub const BYTES: usize = 66;
    pub const OFF_D: usize = 0;
    pub const OFF_QS: usize = 2;
}

/// IQ2_XS (256 values): fp16 `d`, u16 `qs[32]`, u8 `scales[8]`. `qs[4g + l]`: 9-bit grid index
/// (512 entries) and a 7-bit sign code; scale nibble low (l < 2) or high (l >= 2) of
/// `scales[g]`: value = d * (2s + 1) / 8 * magnitude * sign.
pub mod iq2_xs {
    pub const BYTES: usize = 74;
    pub const OFF_D: usize = 0;
    pub const OFF_QS: usize = 2;
    pub const OFF_SCALES: usize = 66;
}

/// IQ2_S (256 values): fp16 `d`, u8 `qs[32]`, u8 `signs[32]`, u8 `qh[8]`, u8 `scales[8]`.
/// 10-bit index = `qs[4g + l] | ((qh[g] >> 2l) & 3) << 8` (1024 entries); sign byte
/// `signs[4g + l]`; scales as IQ2_XS.
pub mod iq2_s {
    pub const BYTES: usize = 82;
    pub const OFF_D: usize = 0;
    pub const OFF_QS: usize = 2;
    pub const OFF_SIGNS: usize = 34;
    pub const OFF_QH: usize = 66;
    pub const OFF_SCALES: usize = 74;
}

/// IQ3_XXS (256 values): fp16 `d`, u8 `qs[64]` (grid indices, 4 magnitudes each), u32
/// `aux[8]` at byte 66: for group g, sign codes `(aux[g] >> 7l) & 127` (l = 0..4, 8 values
/// each), scale s = `aux[g] >> 28`: value = d * (2s + 1) / 4 * magnitude * sign.
pub mod iq3_xxs {
    pub const BYTES: usize = 98;
    pub const OFF_D: usize = 0;
    pub const OFF_QS: usize = 2;
    pub const OFF_AUX: usize = 66;
}

/// IQ3_S (256 values): fp16 `d`, u8 `qs[64]`, u8 `qh[8]`, u8 `signs[32]`, u8 `scales[4]`.
/// Index i (0..64) = `qs[i] | ((qh[i / 8] >> (i % 8)) & 1) << 8` (512 entries, 4 magnitudes);
/// sign byte `signs[4g + l]`; scale s = nibble g % 2 of `scales[g / 2]`: value =
/// d * (1 + 2s) * magnitude * sign.
pub mod iq3_s {
    pub const BYTES: usize = 110;
    pub const OFF_D: usize = 0;
    pub const OFF_QS: usize = 2;
    pub const OFF_QH: usize = 66;
    pub const OFF_SIGNS: usize = 74;
    pub const OFF_SCALES: usize = 106;
}

/// The quantized weight formats the matvec kernels take. The discriminant is the GGUF type id.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum WeightFormat {
    Q8_0 = 8,
    Q6K = 14,
    Iq2Xxs = 16,
    Iq2Xs = 17,
    Iq3Xxs = 18,
    Iq4Nl = 20,
    Iq3S = 21,
    Iq2S = 22,
    Iq4Xs = 23,
    Q2_0 = 42,
    /// Not a GGUF type: the device layout [`q8_0t`] of Q8_0 (its id is outside ggml's).
    Q8_0T = 0x1008,
    /// Not a GGUF type: the device layout [`iq4_nlt`] of IQ4_NL.
    Iq4NlT = 0x1014,
    /// Not a GGUF type: the device layout [`iq3_st`] of IQ3_S.
    Iq3ST = 0x1015,
    /// Not a GGUF type: the device layout [`q6_kt`] of Q6_K.
    Q6KT = 0x100e,
}

/// A per-format kernel entry's name: `prefix` and the format's lower-case tag (`mmvq_` and
/// `q8_0t` make `mmvq_q8_0t`), the same in PTX, HIP and the replica.
macro_rules! format_entry {
    ($format:expr, $prefix:literal) => {
        match $format {
            WeightFormat::Q8_0 => concat!($prefix, "q8_0"),
            WeightFormat::Q6K => concat!($prefix, "q6_k"),
            WeightFormat::Iq2Xxs => concat!($prefix, "iq2_xxs"),
            WeightFormat::Iq2Xs => concat!($prefix, "iq2_xs"),
            WeightFormat::Iq2S => concat!($prefix, "iq2_s"),
            WeightFormat::Iq3Xxs => concat!($prefix, "iq3_xxs"),
            WeightFormat::Iq3S => concat!($prefix, "iq3_s"),
            WeightFormat::Iq4Nl => concat!($prefix, "iq4_nl"),
            WeightFormat::Iq4Xs => concat!($prefix, "iq4_xs"),
            WeightFormat::Q2_0 => concat!($prefix, "q2_0"),
            WeightFormat::Q8_0T => concat!($prefix, "q8_0t"),
            WeightFormat::Iq4NlT => concat!($prefix, "iq4_nlt"),
            WeightFormat::Iq3ST => concat!($prefix, "iq3_st"),
            WeightFormat::Q6KT => concat!($prefix, "q6_kt"),
        }
    };
}

impl WeightFormat {
    pub const ALL: [WeightFormat; 10] = [
        WeightFormat::Q8_0,
        WeightFormat::Q6K,
        WeightFormat::Iq2Xxs,
        WeightFormat::Iq2Xs,
        WeightFormat::Iq2S,
        WeightFormat::Iq3Xxs,
        WeightFormat::Iq3S,
        WeightFormat::Iq4Nl,
        WeightFormat::Iq4Xs,
        WeightFormat::Q2_0,
    ];

    /// The tiled device layouts ([`tiles`]).
    pub const TILED: [WeightFormat; 4] = [WeightFormat::Q8_0T, WeightFormat::Iq4NlT, WeightFormat::Iq3ST, WeightFormat::Q6KT];

    /// Every format the matvec kernels take: the GGUF formats of [`Self::ALL`] and the tiled
    /// layouts of [`Self::TILED`].
    pub const MATVEC: [WeightFormat; 14] = {
        let mut all = [WeightFormat::Q8_0T; 14];
        let mut i = 0;
        while i < all.len() {
            all[i] = if i < Self::ALL.len() { Self::ALL[i] } else { Self::TILED[i - Self::ALL.len()] };
            i += 1;
        }
        all
    };

    /// The layout of a tiled format ([`Self::TILED`]), `None` for a GGUF format.
    pub const fn tiling(self) -> Option<tiles::Tiling> {
        match self {
            WeightFormat::Q8_0T => Some(q8_0t::TILING),
            WeightFormat::Iq4NlT => Some(iq4_nlt::TILING),
            WeightFormat::Iq3ST => Some(iq3_st::TILING),
            WeightFormat::Q6KT => Some(q6_kt::TILING),
            _ => None,
        }
    }

    /// The tiled layout of a GGUF format that has one.
    pub const fn tiled(self) -> Option<WeightFormat> {
        match self {
            WeightFormat::Q8_0 => Some(WeightFormat::Q8_0T),
            WeightFormat::Iq4Nl => Some(WeightFormat::Iq4NlT),
            WeightFormat::Iq3S => Some(WeightFormat::Iq3ST),
            WeightFormat::Q6K => Some(WeightFormat::Q6KT),
            _ => None,
        }
    }

    /// The format whose blocks this one holds: the base of a tiled layout, else itself.
    pub const fn base(self) -> WeightFormat {
        match self.tiling() {
            Some(t) => t.base,
            None => self,
        }
    }

    /// The format with GGUF type id `id`, if it is a quantized weight format.
    pub fn from_gguf_id(id: u32) -> Option<WeightFormat> {
        Self::ALL.into_iter().find(|f| *f as u32 == id)
    }

    /// Values per block.
    pub const fn block_values(self) -> usize {
        match self {
            WeightFormat::Q8_0 | WeightFormat::Iq4Nl => GROUP,
            WeightFormat::Q2_0 => q2_0::VALUES,
            WeightFormat::Q8_0T => q8_0t::BLOCKS * GROUP,
            WeightFormat::Iq4NlT => iq4_nlt::BLOCKS * GROUP,
            WeightFormat::Iq3ST => iq3_st::BLOCKS * QK_K,
            WeightFormat::Q6KT => q6_kt::BLOCKS * QK_K,
            _ => QK_K,
        }
    }

    /// Bytes per block.
    pub const fn block_bytes(self) -> usize {
        match self {
            WeightFormat::Q8_0 => q8_0::BYTES,
            WeightFormat::Q6K => q6_k::BYTES,
            WeightFormat::Iq2Xxs => iq2_xxs::BYTES,
            WeightFormat::Iq2Xs => iq2_xs::BYTES,
            WeightFormat::Iq2S => iq2_s::BYTES,
            WeightFormat::Iq3Xxs => iq3_xxs::BYTES,
            WeightFormat::Iq3S => iq3_s::BYTES,
            WeightFormat::Iq4Nl => iq4_nl::BYTES,
            WeightFormat::Iq4Xs => iq4_xs::BYTES,
            WeightFormat::Q2_0 => q2_0::BYTES,
            WeightFormat::Q8_0T => q8_0t::BYTES,
            WeightFormat::Iq4NlT => iq4_nlt::BYTES,
            WeightFormat::Iq3ST => iq3_st::BYTES,
            WeightFormat::Q6KT => q6_kt::BYTES,
        }
    }

    /// Bytes of one row of `k` values (`k` a multiple of the block).
    pub const fn row_bytes(self, k: usize) -> usize {
        k / self.block_values() * self.block_bytes()
    }

    /// Groups of 32 values per block.
    pub const fn groups_per_block(self) -> usize {
        self.block_values() / GROUP
    }

    /// The `k` of `value = d * f * v * 2^-k`.
    pub const fn shift(self) -> u32 {
        match self {
            WeightFormat::Iq2Xxs | WeightFormat::Iq2Xs | WeightFormat::Iq2S => 3,
            WeightFormat::Iq3Xxs => 2,
            _ => 0,
        }
    }

    /// The format's codebook words (`codebooks`), empty for the formats without one.
    pub fn grid(self) -> &'static [u32] {
        use crate::codebooks::*;
        match self {
            WeightFormat::Iq2Xxs => &IQ2_XXS_GRID,
            WeightFormat::Iq2Xs => &IQ2_XS_GRID,
            WeightFormat::Iq2S => &IQ2_S_GRID,
            WeightFormat::Iq3Xxs => &IQ3_XXS_GRID,
            WeightFormat::Iq3S | WeightFormat::Iq3ST => &IQ3_S_GRID,
            _ => &[],
        }
    }

    /// Whether the EXPDEC gate/up kernels stage this format's codebook repeated once a lane
    /// ([`crate::lane_grids`]) and gather its words without bank conflicts past two passes:
    /// IQ3_ST only, the format whose gathers the one-token and window gate/up launches are
    /// bound by (docs/kernels/moe.md).
    pub const fn lane_grid(self) -> bool {
        matches!(self, WeightFormat::Iq3ST)
    }

    /// Whether the pair gate/up entries (`expdec_gu_*_p2`) copy a block's rows of this format to
    /// shared memory (16-byte `cp.async` copies, all in flight at once) and decode them there:
    /// the tiled layouts, whose rows are whole 16-byte units from 16-byte aligned starts.
    pub const fn pair_stages_rows(self) -> bool {
        self.tiling().is_some()
    }

    /// The codebook words the EXPDEC gate/up kernels stage in shared memory: the repeated copy
    /// where [`Self::lane_grid`], else [`Self::grid`].
    pub fn staged_grid(self) -> &'static [u32] {
        use crate::lane_grids::*;
        match self {
            WeightFormat::Iq3ST => &IQ3_S_LANES.0,
            f => f.grid(),
        }
    }

    /// GGUF type name, as ggml spells it.
    pub const fn name(self) -> &'static str {
        match self {
            WeightFormat::Q8_0 => "Q8_0",
            WeightFormat::Q6K => "Q6_K",
            WeightFormat::Iq2Xxs => "IQ2_XXS",
            WeightFormat::Iq2Xs => "IQ2_XS",
            WeightFormat::Iq2S => "IQ2_S",
            WeightFormat::Iq3Xxs => "IQ3_XXS",
            WeightFormat::Iq3S => "IQ3_S",
            WeightFormat::Iq4Nl => "IQ4_NL",
            WeightFormat::Iq4Xs => "IQ4_XS",
            WeightFormat::Q2_0 => "Q2_0",
            WeightFormat::Q8_0T => "Q8_0T",
            WeightFormat::Iq4NlT => "IQ4_NLT",
            WeightFormat::Iq3ST => "IQ3_ST",
            WeightFormat::Q6KT => "Q6_KT",
        }
    }

    /// The lower-case tag of the format in kernel names (`q8_0`, `iq2_xxs`).
    pub const fn tag(self) -> &'static str {
        format_entry!(self, "")
    }

    /// Name of the `mmvq` kernel entry for this format (same in PTX, HIP and the replica).
    pub const fn mmvq_kernel(self) -> &'static str {
        format_entry!(self, "mmvq_")
    }

    /// The `mmvq` entry for one activation row (the 1..8-row entry's body with the row count a
    /// constant and more weight loads in flight).
    pub const fn mmvq1_kernel(self) -> &'static str {
        format_entry!(self, "mmvq1_")
    }

    /// The `mmvq` entry for one activation row whose lanes load each step's weight group and
    /// activation block a step ahead.
    pub const fn mmvq1a_kernel(self) -> &'static str {
        format_entry!(self, "mmvq1a_")
    }

    /// The staged `mmvq` entry for 2..8 activation rows (the rows in shared memory first).
    pub const fn mmvqs_kernel(self) -> &'static str {
        format_entry!(self, "mmvqs_")
    }

    /// Byte offset of the fp16 scale `d` in a block (a tiled layout: of its first block's; it
    /// holds one a block, see [`tiles`]).
    pub const fn off_d(self) -> usize {
        match self {
            WeightFormat::Q6K => q6_k::OFF_D,
            WeightFormat::Q8_0T => q8_0t::OFF_D,
            WeightFormat::Iq4NlT => iq4_nlt::OFF_D,
            WeightFormat::Iq3ST => iq3_st::OFF_D,
            WeightFormat::Q6KT => q6_kt::OFF_D,
            _ => 0,
        }
    }
}

/// Every layout constant above by name, for the generated HIP prelude (`STRATA_<name>`), so the
/// hand-written HIP reads the same offsets as the Rust kernels and the replica.
pub const LAYOUT_CONSTANTS: &[(&str, usize)] = &[
    ("GROUP", GROUP),
    ("Q8_1_BYTES", q8_1::BYTES),
    ("Q8_1_OFF_D", q8_1::OFF_D),
    ("Q8_1_OFF_S", q8_1::OFF_S),
    ("Q8_1_OFF_Q", q8_1::OFF_Q),
    ("Q8_0_BYTES", q8_0::BYTES),
    ("Q8_0_OFF_D", q8_0::OFF_D),
    ("Q8_0_OFF_Q", q8_0::OFF_Q),
    ("Q8_0T_BYTES", q8_0t::BYTES),
    ("Q8_0T_OFF_LO", q8_0t::OFF_LO),
    ("Q8_0T_OFF_HI", q8_0t::OFF_HI),
    ("Q8_0T_OFF_D", q8_0t::OFF_D),
    ("IQ4_NLT_BYTES", iq4_nlt::BYTES),
    ("IQ4_NLT_OFF_QS", iq4_nlt::OFF_QS),
    ("IQ4_NLT_OFF_D", iq4_nlt::OFF_D),
    ("IQ3_ST_BYTES", iq3_st::BYTES),
    ("IQ3_ST_OFF_QS", iq3_st::OFF_QS),
    ("IQ3_ST_OFF_SIGNS", iq3_st::OFF_SIGNS),
    ("IQ3_ST_OFF_QH", iq3_st::OFF_QH),
    ("IQ3_ST_OFF_SCALES", iq3_st::OFF_SCALES),
    ("IQ3_ST_OFF_D", iq3_st::OFF_D),
    ("Q6_KT_BYTES", q6_kt::BYTES),
    ("Q6_KT_OFF_QL", q6_kt::OFF_QL),
    ("Q6_KT_OFF_QH", q6_kt::OFF_QH),
    ("Q6_KT_OFF_SCALES", q6_kt::OFF_SCALES),
    ("Q6_KT_OFF_D", q6_kt::OFF_D),
    ("Q2_0_BYTES", q2_0::BYTES),
    ("Q2_0_OFF_D", q2_0::OFF_D),
    ("Q2_0_OFF_QS", q2_0::OFF_QS),
    ("IQ4_NL_BYTES", iq4_nl::BYTES),
    ("IQ4_NL_OFF_D", iq4_nl::OFF_D),
    ("IQ4_NL_OFF_QS", iq4_nl::OFF_QS),
    ("IQ4_XS_BYTES", iq4_xs::BYTES),
    ("IQ4_XS_OFF_D", iq4_xs::OFF_D),
    ("IQ4_XS_OFF_SCALES_H", iq4_xs::OFF_SCALES_H),
    ("IQ4_XS_OFF_SCALES_L", iq4_xs::OFF_SCALES_L),
    ("IQ4_XS_OFF_QS", iq4_xs::OFF_QS),
    ("Q6_K_BYTES", q6_k::BYTES),
    ("Q6_K_OFF_QL", q6_k::OFF_QL),
    ("Q6_K_OFF_QH", q6_k::OFF_QH),
    ("Q6_K_OFF_SCALES", q6_k::OFF_SCALES),
    ("Q6_K_OFF_D", q6_k::OFF_D),
    ("IQ2_XXS_BYTES", iq2_xxs::BYTES),
    ("IQ2_XXS_OFF_D", iq2_xxs::OFF_D),
    ("IQ2_XXS_OFF_QS", iq2_xxs::OFF_QS),
    ("IQ2_XS_BYTES", iq2_xs::BYTES),
    ("IQ2_XS_OFF_D", iq2_xs::OFF_D),
    ("IQ2_XS_OFF_QS", iq2_xs::OFF_QS),
    ("IQ2_XS_OFF_SCALES", iq2_xs::OFF_SCALES),
    ("IQ2_S_BYTES", iq2_s::BYTES),
    ("IQ2_S_OFF_D", iq2_s::OFF_D),
    ("IQ2_S_OFF_QS", iq2_s::OFF_QS),
    ("IQ2_S_OFF_SIGNS", iq2_s::OFF_SIGNS),
    ("IQ2_S_OFF_QH", iq2_s::OFF_QH),
    ("IQ2_S_OFF_SCALES", iq2_s::OFF_SCALES),
    ("IQ3_XXS_BYTES", iq3_xxs::BYTES),
    ("IQ3_XXS_OFF_D", iq3_xxs::OFF_D),
    ("IQ3_XXS_OFF_QS", iq3_xxs::OFF_QS),
    ("IQ3_XXS_OFF_AUX", iq3_xxs::OFF_AUX),
    ("IQ3_S_BYTES", iq3_s::BYTES),
    ("IQ3_S_OFF_D", iq3_s::OFF_D),
    ("IQ3_S_OFF_QS", iq3_s::OFF_QS),
    ("IQ3_S_OFF_QH", iq3_s::OFF_QH),
    ("IQ3_S_OFF_SIGNS", iq3_s::OFF_SIGNS),
    ("IQ3_S_OFF_SCALES", iq3_s::OFF_SCALES),
];

/// Float weight formats of the float matvec (router-sized matrices stay in float) and of float
/// embedding tables.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FloatFormat {
    F32,
    Bf16,
    F16,
}

impl FloatFormat {
    pub const ALL: [FloatFormat; 3] = [FloatFormat::F32, FloatFormat::Bf16, FloatFormat::F16];

    pub const fn bytes(self) -> usize {
        match self {
            FloatFormat::F32 => 4,
            FloatFormat::Bf16 | FloatFormat::F16 => 2,
        }
    }

    pub const fn name(self) -> &'static str {
        match self {
            FloatFormat::F32 => "F32",
            FloatFormat::Bf16 => "BF16",
            FloatFormat::F16 => "F16",
        }
    }

    /// The `matvec` entry for this weight type (every row count: a block a weight block and
    /// activation row).
    pub const fn matvec_kernel(self) -> &'static str {
        match self {
            FloatFormat::F32 => "matvec_f32",
            FloatFormat::Bf16 => "matvec_bf16",
            FloatFormat::F16 => "matvec_f16",
        }
    }

    /// Element `j` of a row of this format, widened to f32 (exact).
    pub fn get(self, row: &[u8], j: usize) -> f32 {
        match self {
            FloatFormat::F32 => f32::from_le_bytes([row[4 * j], row[4 * j + 1], row[4 * j + 2], row[4 * j + 3]]),
            FloatFormat::Bf16 => f32::from_bits((u16::from_le_bytes([row[2 * j], row[2 * j + 1]]) as u32) << 16),
            FloatFormat::F16 => crate::f16::f16_to_f32(u16::from_le_bytes([row[2 * j], row[2 * j + 1]])),
        }
    }
}
