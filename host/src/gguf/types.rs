//! The GGML tensor types Strata reads: the float types and the quantized weight formats.
use strata_gpu_shared::formats::WeightFormat;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GgmlType {
    F32,
    F16,
    Bf16,
    Quant(WeightFormat),
}

impl GgmlType {
    pub const ALL: [GgmlType; 13] = [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::Bf16,
        GgmlType::Quant(WeightFormat::Q8_0),
        GgmlType::Quant(WeightFormat::Q6K),
        GgmlType::Quant(WeightFormat::Iq2Xxs),
        GgmlType::Quant(WeightFormat::Iq2Xs),
        GgmlType::Quant(WeightFormat::Iq2S),
        GgmlType::Quant(WeightFormat::Iq3Xxs),
        GgmlType::Quant(WeightFormat::Iq3S),
        GgmlType::Quant(WeightFormat::Iq4Nl),
        GgmlType::Quant(WeightFormat::Iq4Xs),
        GgmlType::Quant(WeightFormat::Q2_0),
    ];

    pub fn from_id(id: u32) -> Option<GgmlType> {
        match id {
            0 => Some(GgmlType::F32),
            1 => Some(GgmlType::F16),
            30 => Some(GgmlType::Bf16),
            _ => WeightFormat::from_gguf_id(id).map(GgmlType::Quant),
        }
    }

    pub fn id(self) -> u32 {
        match self {
            GgmlType::F32 => 0,
            GgmlType::F16 => 1,
            GgmlType::Bf16 => 30,
            GgmlType::Quant(f) => f as u32,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            GgmlType::F32 => "F32",
            GgmlType::F16 => "F16",
            GgmlType::Bf16 => "BF16",
            GgmlType::Quant(f) => f.name(),
        }
    }

    pub fn from_name(name: &str) -> Option<GgmlType> {
        Self::ALL.into_iter().find(|t| t.name().eq_ignore_ascii_case(name))
    }

    /// Values per block (1 for the float types).
    pub fn block_values(self) -> u64 {
        match self {
            GgmlType::F32 | GgmlType::F16 | GgmlType::Bf16 => 1,
            GgmlType::Quant(f) => f.block_values() as u64,
        }
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> u64 {
        match self {
            GgmlType::F32 => 4,
            GgmlType::F16 | GgmlType::Bf16 => 2,
            GgmlType::Quant(f) => f.block_bytes() as u64,
        }
    }
}

/// Names of the ggml types Strata does not read, so a refusal can say what the file held.
pub fn foreign_type_name(id: u32) -> Option<&'static str> {
    const NAMES: [(u32, &str); 17] = [
        (2, "Q4_0"),
        (3, "Q4_1"),
        (6, "Q5_0"),
        (7, "Q5_1"),
        (9, "Q8_1"),
        (10, "Q2_K"),
        (11, "Q3_K"),
        (12, "Q4_K"),
        (13, "Q5_K"),
        (15, "Q8_K"),
        (19, "IQ1_S"),
        (24, "I8"),
        (25, "I16"),
        (26, "I32"),
        (27, "I64"),
        (28, "F64"),
        (29, "IQ1_M"),
    ];
    NAMES.iter().find(|(i, _)| *i == id).map(|(_, n)| *n)
}
