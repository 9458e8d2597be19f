//! Thread-block clusters (sm_90 and later): blocks the hardware runs at the same time on one
//! GPC, which reach each other's shared memory and meet at one barrier. Only entries compiled
//! for sm_90 call these (their PTX says `.reqnctapercluster`, build.rs); PTX ISA 7.8.
use super::mem::Smem;
use core::arch::asm;

/// This block's rank in its cluster (`%cluster_ctarank`): with 1-D clusters of `n` blocks
/// along a 1-D grid, `block_idx() % n`.
#[inline(always)]
pub fn rank() -> u32 {
    let r: u32;
    // SAFETY: reads a special register; no memory is touched.
    unsafe { asm!("mov.u32 {r}, %cluster_ctarank;", r = out(reg32) r, options(nostack, pure, nomem)) };
    r
}

/// Barrier over every thread of every block of the cluster. Arrive releases and wait acquires
/// (their default semantics), so shared-memory writes before it, to this block's memory or
/// another's, are seen by every thread of the cluster after it.
#[inline(always)]
pub fn sync() {
    arrive();
    wait();
}

/// The first half of [`sync`]: this thread has arrived (its writes before it released). Each
/// thread arrives once, then waits once ([`wait`]) before it arrives again.
#[inline(always)]
pub fn arrive() {
    // SAFETY: a barrier; every thread of every block of the cluster must reach it, which callers
    // guarantee by calling it outside divergent control flow and in blocks that all run it; the
    // matching `wait` comes later in the same threads.
    unsafe { asm!("barrier.cluster.arrive.aligned;", options(nostack)) }
}

/// The second half of [`sync`]: returns once every thread of the cluster has arrived.
#[inline(always)]
pub fn wait() {
    // SAFETY: as `sync`, after this thread's `arrive`.
    unsafe { asm!("barrier.cluster.wait.aligned;", options(nostack)) }
}

impl Smem {
    /// Stores `v` to word `word` of block `rank`'s dynamic shared memory (this block's own
    /// where `rank` is its own).
    ///
    /// # Safety
    /// `word` is inside the shared memory the launch asked for (every block of a launch asks
    /// the same), `rank` is a block of this cluster that has started (a cluster barrier its
    /// threads arrived at came before this store) and has not exited (one after this store
    /// comes before its exit).
    #[inline(always)]
    pub unsafe fn st_u32_cluster(self, rank: u32, word: u32, v: u32) {
        asm!("mapa.shared::cluster.u32 {q}, {p}, {r};", "st.shared::cluster.u32 [{q}], {v};",
             p = in(reg32) self.addr(word), r = in(reg32) rank, q = out(reg32) _, v = in(reg32) v,
             options(nostack));
    }
}
