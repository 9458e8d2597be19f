//! Block layouts and codebooks (see `../shared/docs/FORMATS.md`). All fields little-endian.
//!
//! Kernels read blocks by byte offset with explicit loads, so the layout is given as offsets
//! and sizes here rather than as `#[repr(C)]` structs (a 34-byte Q8_0 block has 2-byte
//! alignment at best; a struct would invite misaligned wide loads).

/// Values per quantization group ("block" of the 32-value formats).
pub const GROUP: usize = 32;

/// q8_1 activation block: fp16 `d`, fp16 `s`, 32 x i8 `q`. Strata's convention (the
/// `quantize_q8_1` spec in [`crate::order`]): `d` = fp16(amax / 127), `q` = round-half-even(x / d),
/// `s` = fp16(d * sum(q)).
pub mod q8_1 {
    pub const BYTES: usize = 36;
    pub const OFF_D: usize = 0;
    pub const OFF_S: usize = 2;
    pub const OFF_Q: usize = 4;
}

/// Q8_0 weight block: fp16 `d`, 32 x i8 `q`; value = d * q.
pub mod q8_0 {
    pub const BYTES: usize = 34;
    pub const OFF_D: usize = 0;
    pub const OFF_Q: usize = 2;
}

/// IQ4_NL weight block: fp16 `d`, 16 bytes of nibbles; value j < 16 is the low nibble of
/// `qs[j]`, value j >= 16 the high nibble of `qs[j - 16]`; value = d * LEVELS[nibble].
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

/// The weight formats the matvec kernels take. The discriminant is the GGUF type id.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum WeightFormat {
    Q8_0 = 8,
    Iq4Nl = 20,
}

impl WeightFormat {
    pub const ALL: [WeightFormat; 2] = [WeightFormat::Q8_0, WeightFormat::Iq4Nl];

    /// Values per block.
    pub const fn block_values(self) -> usize {
        GROUP
    }

    /// Bytes per block.
    pub const fn block_bytes(self) -> usize {
        match self {
            WeightFormat::Q8_0 => q8_0::BYTES,
            WeightFormat::Iq4Nl => iq4_nl::BYTES,
        }
    }

    /// GGUF type name, as ggml spells it.
    pub const fn name(self) -> &'static str {
        match self {
            WeightFormat::Q8_0 => "Q8_0",
            WeightFormat::Iq4Nl => "IQ4_NL",
        }
    }

    /// Name of the `mmvq` kernel entry for this format (same in PTX, HIP and the replica).
    pub const fn mmvq_kernel(self) -> &'static str {
        match self {
            WeightFormat::Q8_0 => "mmvq_q8_0",
            WeightFormat::Iq4Nl => "mmvq_iq4_nl",
        }
    }
}
