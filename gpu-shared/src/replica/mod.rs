//! CPU replicas of the kernels: the specs of [`crate::order`] run in plain Rust. They are the
//! third backend and the reference the GPU kernels must match bit for bit.

pub mod attention;
pub mod embed;
pub mod gate;
pub mod gdn;
pub mod head;
pub mod matvec;
pub mod mmvq;
pub mod norm;
pub mod quantize_q8_0;
pub mod quantize_q8_1;
pub mod route;
pub mod sample;
pub mod spec;

use crate::codebooks::{IQ2_S_GRID, IQ2_XS_GRID, IQ2_XXS_GRID, IQ3_S_GRID, IQ3_XXS_GRID, KSIGNS};
use crate::formats::*;

/// One weight group decoded to integers: value `j` is exactly
/// `f16(d) * f[j / 16] * v[j] * 2^-shift` (`shift` from [`WeightFormat::shift`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IntGroup {
    pub d: u16,
    pub v: [i8; GROUP],
    pub f: [i32; 2],
}

fn le16(b: &[u8], off: usize) -> u16 {
    u16::from_le_bytes([b[off], b[off + 1]])
}

fn le32(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]])
}

/// Magnitude `i` of a grid entry of `per` magnitudes, packed as in `codebooks`.
fn grid_mag(grid: &[u32], per: usize, entry: usize, i: usize) -> i32 {
    ((grid[entry * per / 4 + i / 4] >> (8 * (i % 4))) & 0xff) as i32
}

/// Fills `v[8l .. 8l + 8]` with grid entry `entry` (8 magnitudes) and sign bits `signs`.
fn put8(v: &mut [i8; GROUP], l: usize, grid: &[u32], entry: usize, signs: u8) {
    for i in 0..8 {
        let m = grid_mag(grid, 8, entry, i);
        v[8 * l + i] = if signs >> i & 1 == 1 { -m } else { m } as i8;
    }
}

/// Fills `v[4l .. 4l + 4]` with a 4-magnitude grid entry and the four sign bits `signs`.
fn put4(v: &mut [i8; GROUP], l: usize, grid: &[u32], entry: usize, signs: u8) {
    for i in 0..4 {
        let m = grid_mag(grid, 4, entry, i);
        v[4 * l + i] = if signs >> i & 1 == 1 { -m } else { m } as i8;
    }
}

/// The largest block of a GGUF weight format (the base of every tiled layout is one).
const MAX_BLOCK_BYTES: usize = {
    let mut max = 0;
    let mut i = 0;
    while i < WeightFormat::ALL.len() {
        let b = WeightFormat::ALL[i].block_bytes();
        max = if b > max { b } else { max };
        i += 1;
    }
    max
};

/// Decodes group `g` (0..`groups_per_block`) of one block of `format` (of a tiled layout: one
/// tile, whose block `g / base groups` is decoded in the base layout).
pub fn decode_group(format: WeightFormat, block: &[u8], g: usize) -> IntGroup {
    if let Some(t) = format.tiling() {
        let gpb = t.base.groups_per_block();
        let mut one = [0u8; MAX_BLOCK_BYTES];
        t.untile_block(block, g / gpb, &mut one);
        return decode_group(t.base, &one[..t.base.block_bytes()], g % gpb);
    }
    let mut v = [0i8; GROUP];
    let d = le16(block, format.off_d());
    let one = |s: i32| [s, s];
    let f = match format {
        WeightFormat::Q8_0 => {
            for (j, x) in v.iter_mut().enumerate() {
                *x = block[q8_0::OFF_Q + j] as i8;
            }
            one(1)
        }
        WeightFormat::Q2_0 => {
            for (j, x) in v.iter_mut().enumerate() {
                let p = 32 * g + j;
                *x = ((block[q2_0::OFF_QS + p / 4] >> (2 * (p % 4))) & 3) as i8 - 1;
            }
            one(1)
        }
        WeightFormat::Iq4Nl | WeightFormat::Iq4Xs => {
            let qs = if format == WeightFormat::Iq4Nl { iq4_nl::OFF_QS } else { iq4_xs::OFF_QS + 16 * g };
            for j in 0..16 {
                let byte = block[qs + j];
                v[j] = iq4_nl::LEVELS[(byte & 15) as usize];
                v[j + 16] = iq4_nl::LEVELS[(byte >> 4) as usize];
            }
            if format == WeightFormat::Iq4Nl {
                one(1)
            } else {
                let lo = (block[iq4_xs::OFF_SCALES_L + g / 2] >> (4 * (g % 2))) & 15;
                let hi = (le16(block, iq4_xs::OFF_SCALES_H) >> (2 * g)) & 3;
                one((lo as u16 | hi << 4) as i32 - 32)
            }
        }
        WeightFormat::Q6K => {
            for (j, x) in v.iter_mut().enumerate() {
                let p = 32 * g + j;
                let (h, r) = (p / 128, p % 128);
                let lo = (block[q6_k::OFF_QL + 64 * h + r % 64] >> (4 * (r / 64))) & 15;
                let hi = (block[q6_k::OFF_QH + 32 * h + r % 32] >> (2 * (r / 32))) & 3;
                *x = (lo | hi << 4) as i8 - 32;
            }
            let sc = |i: usize| block[q6_k::OFF_SCALES + i] as i8 as i32;
            [sc(2 * g), sc(2 * g + 1)]
        }
        WeightFormat::Iq2Xxs => {
            let a0 = le32(block, iq2_xxs::OFF_QS + 8 * g);
            let a1 = le32(block, iq2_xxs::OFF_QS + 8 * g + 4);
            for l in 0..4 {
                let entry = (a0 >> (8 * l) & 0xff) as usize;
                put8(&mut v, l, &IQ2_XXS_GRID, entry, KSIGNS[(a1 >> (7 * l) & 127) as usize]);
            }
            one(2 * (a1 >> 28) as i32 + 1)
        }
        WeightFormat::Iq2Xs => {
            for l in 0..4 {
                let q = le16(block, iq2_xs::OFF_QS + 2 * (4 * g + l));
                put8(&mut v, l, &IQ2_XS_GRID, (q & 511) as usize, KSIGNS[(q >> 9) as usize]);
            }
            let s = block[iq2_xs::OFF_SCALES + g];
            [2 * (s & 15) as i32 + 1, 2 * (s >> 4) as i32 + 1]
        }
        WeightFormat::Iq2S => {
            let qh = block[iq2_s::OFF_QH + g] as usize;
            for l in 0..4 {
                let entry = block[iq2_s::OFF_QS + 4 * g + l] as usize | ((qh >> (2 * l)) & 3) << 8;
                put8(&mut v, l, &IQ2_S_GRID, entry, block[iq2_s::OFF_SIGNS + 4 * g + l]);
            }
            let s = block[iq2_s::OFF_SCALES + g];
            [2 * (s & 15) as i32 + 1, 2 * (s >> 4) as i32 + 1]
        }
        WeightFormat::Iq3Xxs => {
            let aux = le32(block, iq3_xxs::OFF_AUX + 4 * g);
            for l in 0..4 {
                let signs = KSIGNS[(aux >> (7 * l) & 127) as usize];
                for half in 0..2 {
                    let entry = block[iq3_xxs::OFF_QS + 8 * g + 2 * l + half] as usize;
                    put4(&mut v, 2 * l + half, &IQ3_XXS_GRID, entry, signs >> (4 * half));
                }
            }
            one(2 * (aux >> 28) as i32 + 1)
        }
        WeightFormat::Iq3S => {
            for l in 0..4 {
                let signs = block[iq3_s::OFF_SIGNS + 4 * g + l];
                for half in 0..2 {
                    let i = 8 * g + 2 * l + half;
                    let entry = block[iq3_s::OFF_QS + i] as usize | ((block[iq3_s::OFF_QH + i / 8] as usize >> (i % 8)) & 1) << 8;
                    put4(&mut v, 2 * l + half, &IQ3_S_GRID, entry, signs >> (4 * half));
                }
            }
            let s = (block[iq3_s::OFF_SCALES + g / 2] >> (4 * (g % 2))) & 15;
            one(1 + 2 * s as i32)
        }
        WeightFormat::Q8_0T | WeightFormat::Iq4NlT | WeightFormat::Iq3ST | WeightFormat::Q6KT => unreachable!("a tiled layout decodes through its base format above"),
    };
    IntGroup { d, v, f }
}

/// Group `b` of a row of blocks: the block it lies in and its index there.
pub fn row_group(format: WeightFormat, row: &[u8], b: usize) -> IntGroup {
    let gpb = format.groups_per_block();
    let bb = format.block_bytes();
    decode_group(format, &row[b / gpb * bb..(b / gpb + 1) * bb], b % gpb)
}
