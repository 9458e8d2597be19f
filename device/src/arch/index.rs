//! Thread, block, lane and warp indices (x dimension; Strata's kernels use 1-D launches).
#[cfg(target_arch = "nvptx64")]
use core::arch::nvptx;
#[cfg(not(target_arch = "nvptx64"))]
pub use super::sim::{block_dim, block_idx, thread_idx};

#[cfg(target_arch = "nvptx64")]
#[inline(always)]
pub fn thread_idx() -> u32 {
    // SAFETY: reads a special register; no memory is touched.
    unsafe { nvptx::_thread_idx_x() as u32 }
}

#[cfg(target_arch = "nvptx64")]
#[inline(always)]
pub fn block_idx() -> u32 {
    // SAFETY: as above.
    unsafe { nvptx::_block_idx_x() as u32 }
}

#[cfg(target_arch = "nvptx64")]
#[inline(always)]
pub fn block_dim() -> u32 {
    // SAFETY: as above.
    unsafe { nvptx::_block_dim_x() as u32 }
}

/// Lane within the warp, 0..32.
#[inline(always)]
pub fn lane() -> u32 {
    thread_idx() % super::WARP
}

/// Warp within the block.
#[inline(always)]
pub fn warp_in_block() -> u32 {
    thread_idx() / super::WARP
}
