//! CPU replicas of the kernels: the specs of [`crate::order`] run in plain Rust. They are the
//! third backend and the reference the GPU kernels must match bit for bit.

pub mod mmvq;
pub mod quantize_q8_1;

use crate::formats::{iq4_nl, q8_0, WeightFormat, GROUP};

/// One weight group decoded to its integer values: value `j` is `f16(d) * q[j]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IntGroup {
    pub d: u16,
    pub q: [i8; GROUP],
}

fn le16(b: &[u8], off: usize) -> u16 {
    u16::from_le_bytes([b[off], b[off + 1]])
}

/// Decodes one block of `format` (`block.len() == format.block_bytes()`).
pub fn decode_group(format: WeightFormat, block: &[u8]) -> IntGroup {
    let mut q = [0i8; GROUP];
    match format {
        WeightFormat::Q8_0 => {
            for (j, v) in q.iter_mut().enumerate() {
                *v = block[q8_0::OFF_Q + j] as i8;
            }
            IntGroup { d: le16(block, q8_0::OFF_D), q }
        }
        WeightFormat::Iq4Nl => {
            for j in 0..GROUP / 2 {
                let byte = block[iq4_nl::OFF_QS + j];
                q[j] = iq4_nl::LEVELS[(byte & 15) as usize];
                q[j + 16] = iq4_nl::LEVELS[(byte >> 4) as usize];
            }
            IntGroup { d: le16(block, iq4_nl::OFF_D), q }
        }
    }
}
