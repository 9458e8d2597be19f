//! `spec_accept`: the accepted count of a speculative verify window, and the window's next
//! tokens. Spec: `strata_gpu_shared::replica::spec`.
//!
//! At most 8 rows of integers: thread 0 of block 0 walks them in order, keeping a flag that
//! turns off at the first rejected draft; every other thread returns at once. It then moves the
//! sequence on, on the device: the next window starts at `*pos + accepted` with the last
//! emitted token as its row 0, so a following step can run without the host.
use super::moe::ld;
use crate::arch::index;

crate::entry! {
    /// # Safety
    /// `window`, `next`: `tokens` u32 with `1 <= tokens`; `out`: `tokens + 1` u32; `pos`: one u32;
    /// none overlapping another.
    pub unsafe fn spec_accept(window: *mut u32, next: *const u32, tokens: u32, out: *mut u32, pos: *mut u32) {
        crate::arch::sync::chain_grids();
        if index::block_idx() != 0 || index::thread_idx() != 0 {
            return;
        }
        let mut prev = ld(next, 0);
        *out.add(1) = prev;
        let (mut accepted, mut matching) = (1u32, true);
        for i in 1..tokens as usize {
            matching = matching && ld(window, i) == prev;
            accepted += matching as u32;
            prev = ld(next, i);
            *out.add(1 + i) = prev;
        }
        *out = accepted;
        *window = *out.add(accepted as usize);
        *pos = (*pos).wrapping_add(accepted); // the replica's wrap (a test's positions reach u32::MAX)
    }
}
