//! Barriers and traps.
#[cfg(target_arch = "nvptx64")]
use core::arch::asm;
#[cfg(not(target_arch = "nvptx64"))]
pub use super::sim::{sync_threads, sync_warp, trap};

/// Block-wide barrier for global and shared memory (`__syncthreads`).
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
pub fn sync_threads() {
    // SAFETY: a barrier; every thread of the block must reach it, which callers guarantee by
    // calling it outside divergent control flow.
    unsafe { core::arch::nvptx::_syncthreads() }
}

/// Block-wide barrier that the lanes of a warp may reach at different instructions
/// (`barrier.sync 0`, without `.aligned`). For kernels whose branches before and after a barrier
/// test the same condition: LLVM may then thread the branch through the barrier and duplicate
/// it into both paths, which the aligned `bar.sync` of [`sync_threads`] does not allow (the
/// warp's lanes wait at two `WARPSYNC.ALL`s: `moe_group` by a block hung so on an H100).
#[inline(always)]
pub fn sync_threads_split() {
    // SAFETY: as `sync_threads`, except that the threads need not be converged.
    #[cfg(target_arch = "nvptx64")]
    unsafe {
        asm!("barrier.sync 0;", options(nostack))
    }
    #[cfg(not(target_arch = "nvptx64"))]
    sync_threads();
}

/// Barrier that only orders shared-memory (LDS) traffic. On NVIDIA `bar.sync` already orders
/// shared memory, so this is `bar.sync 0`; the HIP twin must wait for LDS explicitly on AMD
/// (`s_wait_dscnt 0` / `s_waitcnt lgkmcnt(0)`), which is why it is a separate name.
#[inline(always)]
pub fn sync_lds() {
    // SAFETY: as `sync_threads`.
    #[cfg(target_arch = "nvptx64")]
    unsafe {
        asm!("bar.sync 0;", options(nostack))
    }
    #[cfg(not(target_arch = "nvptx64"))]
    sync_threads();
}

/// Warp-wide barrier (`bar.warp.sync`, every lane): orders the memory operations of the warp's
/// lanes before it against theirs after it, shared memory included.
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
pub fn sync_warp() {
    // SAFETY: a barrier of the full mask; every lane of the warp must reach it, which callers
    // guarantee by calling it where the whole warp runs the same code.
    unsafe { asm!("bar.warp.sync 0xffffffff;", options(nostack)) }
}

/// Aborts the kernel (the launch then fails with an error the host reports by kernel name).
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
pub fn trap() -> ! {
    // SAFETY: `trap` ends the thread; nothing after it runs.
    unsafe { asm!("trap;", options(noreturn, nostack)) }
}

/// The first statement of every kernel entry: on sm_90 and later, waits until the grid launched
/// before this one on the stream has completed and its writes are visible
/// (`griddepcontrol.wait`), then lets the grid after this one start launching
/// (`griddepcontrol.launch_dependents`). A no-op where the launch was not chained, and on
/// older targets (whose launches never are). The host chains launches only for images built
/// for sm_90 (`host/src/backends/launch.rs`); build.rs checks every entry of that image has the
/// wait.
#[inline(always)]
pub fn chain_grids() {
    // SAFETY: both instructions only order this grid against its neighbours on the stream; the
    // asm is not `nomem`, so no memory access is moved above the wait.
    #[cfg(target_feature = "sm_90")]
    unsafe {
        asm!("griddepcontrol.wait;", "griddepcontrol.launch_dependents;", options(nostack))
    }
}
