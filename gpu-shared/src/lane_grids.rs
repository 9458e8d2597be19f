//! Codebooks repeated once for every lane of a half-warp, for the formats whose EXPDEC gate/up
//! kernels gather codebook words from shared memory (`WeightFormat::lane_grid`: IQ3_S held as
//! IQ3_ST): word `w` of the codebook is words `w * GRID_LANES .. (w + 1) * GRID_LANES` of the
//! copy, and lane `l` reads word `w * GRID_LANES + l % GRID_LANES`. That word's bank is `l % 16`
//! plus 16 times the parity of `w`, so a warp's 32 gathers of random codebook words take at
//! most two passes through the 32 banks, where one copy of the codebook takes about 3.5 (the
//! most of 32 random words that share a bank). The same words, so the same bits.
use crate::codebooks::IQ3_S_GRID;

/// Copies of each codebook word: a lane and the lane 16 after it share a copy.
pub const GRID_LANES: usize = 16;

/// A repeated codebook, 16-byte aligned so that kernels stage it with 16-byte loads.
#[repr(C, align(16))]
pub struct LaneGrid<const N: usize>(pub [u32; N]);

/// `grid` with each word repeated `GRID_LANES` times (`N` = `GRID_LANES` x its length).
const fn repeat<const N: usize>(grid: &[u32]) -> LaneGrid<N> {
    assert!(N == GRID_LANES * grid.len());
    let mut out = [0u32; N];
    let mut i = 0;
    while i < N {
        out[i] = grid[i / GRID_LANES];
        i += 1;
    }
    LaneGrid(out)
}

pub static IQ3_S_LANES: LaneGrid<{ GRID_LANES * 512 }> = repeat(&IQ3_S_GRID);
