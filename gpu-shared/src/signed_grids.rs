//! Codebooks expanded over the 16 sign patterns of a word, for formats whose codebook words take
//! their signs four at a time (`WeightFormat::signed_grid`: IQ3_S held as IQ3_ST): word `w` of the codebook with sign
//! pattern `s` (bit i set = byte i negated) is word `w + s * len` of the expansion, where `len`
//! is the codebook's length. A kernel that stages the expansion (`expdec_gu_*`) reads a signed
//! word with one shared load where it would apply the signs with five or six integer
//! instructions: the same bytes, so the same bits.
use crate::codebooks::IQ3_S_GRID;

/// An expanded codebook, 16-byte aligned so that kernels stage it with 16-byte loads.
#[repr(C, align(16))]
pub struct SignedGrid<const N: usize>(pub [u32; N]);

/// The expansion of `grid` (`N` = 16 x its length): each byte of the word negated (two's
/// complement) where the pattern's bit for it is set.
const fn expand<const N: usize>(grid: &[u32]) -> SignedGrid<N> {
    assert!(N == 16 * grid.len());
    let mut out = [0u32; N];
    let mut s = 0;
    while s < 16 {
        let mut w = 0;
        while w < grid.len() {
            let mut word = 0u32;
            let mut i = 0;
            while i < 4 {
                let m = (grid[w] >> (8 * i)) as u8;
                let b = if s >> i & 1 == 1 { m.wrapping_neg() } else { m };
                word |= (b as u32) << (8 * i);
                i += 1;
            }
            out[w + s * grid.len()] = word;
            w += 1;
        }
        s += 1;
    }
    SignedGrid(out)
}

pub static IQ3_S_SIGNED: SignedGrid<{ 16 * 512 }> = expand(&IQ3_S_GRID);
