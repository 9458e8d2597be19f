//! Explicit memory operations. Rust pointers carry no alignment the backend can use, so plain
//! dereferences become byte or 4-byte loads; wide loads are spelled out here instead.
//!
//! Global loads use the read-only (non-coherent) path: only for data no thread of the same
//! launch writes.
#[cfg(target_arch = "nvptx64")]
use core::arch::asm;

/// 1-byte read-only global load; otherwise as [`ld_nc_u16`].
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
pub unsafe fn ld_nc_u8(p: *const u8) -> u8 {
    let r: u16;
    asm!("ld.global.nc.u8 {r}, [{p}];", r = out(reg16) r, p = in(reg64) p,
         options(nostack, readonly, pure));
    r as u8
}

/// 2-byte read-only global load. `p` must be 2-byte aligned and point at device memory that
/// stays valid and unwritten for the whole launch (the caller's contract, hence `unsafe`).
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
pub unsafe fn ld_nc_u16(p: *const u8) -> u16 {
    let r: u16;
    asm!("ld.global.nc.u16 {r}, [{p}];", r = out(reg16) r, p = in(reg64) p,
         options(nostack, readonly, pure));
    r
}

/// 4-byte read-only global load; `p` 4-byte aligned, otherwise as [`ld_nc_u16`].
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
pub unsafe fn ld_nc_u32(p: *const u8) -> u32 {
    let r: u32;
    asm!("ld.global.nc.u32 {r}, [{p}];", r = out(reg32) r, p = in(reg64) p,
         options(nostack, readonly, pure));
    r
}

/// 8-byte read-only global load; `p` 8-byte aligned, otherwise as [`ld_nc_u16`].
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
pub unsafe fn ld_nc_v2(p: *const u8) -> [u32; 2] {
    let (a, b): (u32, u32);
    asm!("ld.global.nc.v2.u32 {{{a}, {b}}}, [{p}];", a = out(reg32) a, b = out(reg32) b, p = in(reg64) p,
         options(nostack, readonly, pure));
    [a, b]
}

/// 16-byte read-only global load; `p` 16-byte aligned, otherwise as [`ld_nc_u16`].
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
pub unsafe fn ld_nc_v4(p: *const u8) -> [u32; 4] {
    let (a, b, c, d): (u32, u32, u32, u32);
    asm!("ld.global.nc.v4.u32 {{{a}, {b}, {c}, {d}}}, [{p}];",
         a = out(reg32) a, b = out(reg32) b, c = out(reg32) c, d = out(reg32) d,
         p = in(reg64) p, options(nostack, readonly, pure));
    [a, b, c, d]
}

/// 4-byte global load cached in L2 only (`.cg`), not in the SM's L1: for a kernel that reads,
/// before its grid wait, what an earlier launch wrote (L2 is where every SM's writes meet; an
/// L1 line may be older than that launch). Aligned, otherwise as [`ld_nc_u16`].
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
pub unsafe fn ld_cg_u32(p: *const u8) -> u32 {
    let r: u32;
    asm!("ld.global.cg.u32 {r}, [{p}];", r = out(reg32) r, p = in(reg64) p, options(nostack, readonly));
    r
}

/// Asks L2 to fetch the 128-byte line holding `p` (a hint: it reads nothing into registers,
/// changes no value and does not fault).
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
pub fn prefetch_l2(p: *const u8) {
    // SAFETY: a prefetch writes nothing visible and does not fault.
    unsafe { asm!("prefetch.global.L2 [{p}];", p = in(reg64) p, options(nostack, readonly, preserves_flags)) };
}

/// Asks the SM's L1 to fetch the 128-byte line holding `p` (a hint, as [`prefetch_l2`]).
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
pub fn prefetch_l1(p: *const u8) {
    // SAFETY: a prefetch writes nothing visible and does not fault.
    unsafe { asm!("prefetch.global.L1 [{p}];", p = in(reg64) p, options(nostack, readonly, preserves_flags)) };
}

/// Asks L2 to fetch the 128-byte lines of `bytes` bytes at `start`, spread over the warp's
/// lanes (every lane calls it with the same range). A hint: it reads nothing into registers and
/// changes no value, so a kernel calls it on its constant weights before `sync::chain_grids`,
/// to bring them from DRAM while the grid before it still runs.
#[inline(always)]
pub fn prefetch_l2_warp(start: *const u8, bytes: usize) {
    prefetch_spread(start, bytes, crate::arch::index::lane(), 32, prefetch_l2);
}

/// [`prefetch_l2_warp`] over a block of `THREADS` threads (every thread calls it with the same
/// range).
#[inline(always)]
pub fn prefetch_l2_block<const THREADS: u32>(start: *const u8, bytes: usize) {
    prefetch_spread(start, bytes, crate::arch::index::thread_idx(), THREADS, prefetch_l2);
}

/// Thread `t` of `threads` asks for `start + 128 (t + threads i)`: every 128 bytes from `start`
/// on lie in the next line, so these addresses reach every line of the range; the last is
/// clamped into it.
#[inline(always)]
fn prefetch_spread(start: *const u8, bytes: usize, t: u32, threads: u32, fetch: fn(*const u8)) {
    let mut off = 128 * t as usize;
    while off < bytes + 127 && bytes > 0 {
        fetch(start.wrapping_add(off.min(bytes - 1)));
        off += 128 * threads as usize;
    }
}

/// An asynchronous copy of 8 (`cp_async_8`) or 16 bytes (`cp_async_16`) from global to shared
/// memory (`cp.async`, sm_80 and later): the thread goes on while it runs. [`cp_async_wait_all`]
/// waits for the thread's copies; a block barrier after that makes every thread's copies
/// visible to the block. The 16-byte copy bypasses L1 (`.cg`); the 8-byte one cannot.
///
/// # Safety
/// `dst` is a shared address ([`Smem::addr`]) inside the shared memory the launch asked for and
/// `src` a global address of as many bytes, not written while the kernel runs, both aligned to
/// the size; nothing reads or writes `dst` until the copy has been waited for.
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
pub unsafe fn cp_async_8(dst: u32, src: *const u8) {
    asm!("cp.async.ca.shared.global [{d}], [{s}], 8;", d = in(reg32) dst, s = in(reg64) src, options(nostack));
}

/// As [`cp_async_8`], 16 bytes.
///
/// # Safety
/// As [`cp_async_8`].
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
pub unsafe fn cp_async_16(dst: u32, src: *const u8) {
    asm!("cp.async.cg.shared.global [{d}], [{s}], 16;", d = in(reg32) dst, s = in(reg64) src, options(nostack));
}

/// Waits until every asynchronous copy this thread issued has landed in shared memory.
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
pub fn cp_async_wait_all() {
    // SAFETY: waits on the thread's own copies; not `nomem`, so no shared access moves above it.
    unsafe { asm!("cp.async.wait_all;", options(nostack)) }
}

/// Closes this thread's copies issued since the last commit into one group
/// (`cp.async.commit_group`), which [`cp_async_wait_groups`] can wait for apart from later ones.
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
pub fn cp_async_commit() {
    // SAFETY: only marks a boundary between the thread's own copies.
    unsafe { asm!("cp.async.commit_group;", options(nostack)) }
}

/// Waits until at most `PENDING` of this thread's committed copy groups (the newest) are still
/// in flight: every older group has landed in shared memory. A warp barrier
/// ([`crate::arch::sync::sync_warp`]) after it shows the warp's copies to the whole warp.
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
pub fn cp_async_wait_groups<const PENDING: u32>() {
    // SAFETY: waits on the thread's own copies; not `nomem`, so no shared access moves above it.
    unsafe { asm!("cp.async.wait_group {n};", n = const PENDING, options(nostack)) }
}

/// Coherent global loads (memory the host may write between launches: device-mapped host
/// memory), 1, 4 and 16 bytes, aligned to their size.
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
pub unsafe fn ld_u8(p: *const u8) -> u8 {
    let r: u16;
    asm!("ld.global.u8 {r}, [{p}];", r = out(reg16) r, p = in(reg64) p, options(nostack, readonly));
    r as u8
}

#[cfg(target_arch = "nvptx64")]
#[inline(always)]
pub unsafe fn ld_u32(p: *const u8) -> u32 {
    let r: u32;
    asm!("ld.global.u32 {r}, [{p}];", r = out(reg32) r, p = in(reg64) p, options(nostack, readonly));
    r
}

#[cfg(target_arch = "nvptx64")]
#[inline(always)]
pub unsafe fn ld_v4(p: *const u8) -> [u32; 4] {
    let (a, b, c, d): (u32, u32, u32, u32);
    asm!("ld.global.v4.u32 {{{a}, {b}, {c}, {d}}}, [{p}];",
         a = out(reg32) a, b = out(reg32) b, c = out(reg32) c, d = out(reg32) d,
         p = in(reg64) p, options(nostack, readonly));
    [a, b, c, d]
}

/// Global stores. `p` must be aligned to the stored size and point at device memory this
/// thread alone writes during the launch.
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
pub unsafe fn st_u8(p: *mut u8, v: u8) {
    asm!("st.global.u8 [{p}], {v};", p = in(reg64) p, v = in(reg16) v as u16, options(nostack));
}

#[cfg(target_arch = "nvptx64")]
#[inline(always)]
pub unsafe fn st_u16(p: *mut u8, v: u16) {
    asm!("st.global.u16 [{p}], {v};", p = in(reg64) p, v = in(reg16) v, options(nostack));
}

#[cfg(target_arch = "nvptx64")]
#[inline(always)]
pub unsafe fn st_u32(p: *mut u8, v: u32) {
    asm!("st.global.u32 [{p}], {v};", p = in(reg64) p, v = in(reg32) v, options(nostack));
}

#[cfg(target_arch = "nvptx64")]
#[inline(always)]
pub unsafe fn st_v4(p: *mut u8, v: [u32; 4]) {
    asm!("st.global.v4.u32 [{p}], {{{a}, {b}, {c}, {d}}};", p = in(reg64) p,
         a = in(reg32) v[0], b = in(reg32) v[1], c = in(reg32) v[2], d = in(reg32) v[3], options(nostack));
}

/// `p[i]` through the read-only (non-coherent) path.
///
/// # Safety
/// `p.add(i)` is a valid, 4-byte aligned f32 in device memory that no thread of the launch
/// writes.
#[inline(always)]
pub unsafe fn ld_nc_f32(p: *const f32, i: usize) -> f32 {
    f32::from_bits(ld_nc_u32(p.add(i) as *const u8))
}

/// `p[i]` through the coherent path: memory this launch writes (elsewhere, or this thread
/// earlier).
///
/// # Safety
/// `p.add(i)` is a valid, 4-byte aligned f32 in device memory that no other thread of the
/// launch writes while this thread reads it.
#[inline(always)]
pub unsafe fn ld_f32(p: *const f32, i: usize) -> f32 {
    f32::from_bits(ld_u32(p.add(i) as *const u8))
}

#[cfg(target_arch = "nvptx64")]
#[inline(always)]
pub unsafe fn st_f32(p: *mut f32, v: f32) {
    asm!("st.global.f32 [{p}], {v};", p = in(reg64) p, v = in(reg32) v, options(nostack));
}

/// Stores `v` at `p`, or with `accumulate` the value there plus `v` (`order::stored`: the
/// residual add fused into its producer): `base` when the caller loaded it already (as soon as
/// its grid wait returned, so that the load's latency passes beside its other work), else
/// loaded here.
///
/// # Safety
/// `p` is a valid, 4-byte aligned f32 in device memory that no other thread of the launch
/// touches; `base`, where given, is the value at `p`.
#[inline(always)]
pub unsafe fn st_f32_acc(p: *mut f32, v: f32, accumulate: bool, base: Option<f32>) {
    st_f32(p, if accumulate { base.unwrap_or_else(|| ld_f32(p, 0)) + v } else { v });
}

// The block's dynamic shared memory (size set at launch). One declaration for the module.
#[cfg(target_arch = "nvptx64")]
core::arch::global_asm!(".extern .shared .align 16 .b8 strata_smem[];");

/// Typed view of the dynamic shared memory as `u32` words. Kernels index it in words; the
/// 16-byte operations take an index that is a multiple of 4.
#[derive(Clone, Copy)]
pub struct Smem {
    base: u64,
}

impl Smem {
    /// The block's dynamic shared memory. Indices passed to the accessors must stay below the
    /// `shared_mem_bytes / 4` the launch asked for (the caller's contract).
    #[cfg(target_arch = "nvptx64")]
    #[inline(always)]
    pub fn dynamic() -> Smem {
        let base: u64;
        // SAFETY: takes the address of the module's shared-memory symbol; reads nothing.
        unsafe { asm!("mov.u64 {b}, strata_smem;", b = out(reg64) base, options(nostack, pure, nomem)) };
        Smem { base }
    }

    #[cfg(target_arch = "nvptx64")]
    #[inline(always)]
    pub unsafe fn st_v4(self, word: u32, v: [u32; 4]) {
        asm!("st.shared.v4.u32 [{p}], {{{a}, {b}, {c}, {d}}};",
             p = in(reg64) self.base + 4 * word as u64,
             a = in(reg32) v[0], b = in(reg32) v[1], c = in(reg32) v[2], d = in(reg32) v[3],
             options(nostack));
    }

    #[cfg(target_arch = "nvptx64")]
    #[inline(always)]
    pub unsafe fn ld_v4(self, word: u32) -> [u32; 4] {
        let (a, b, c, d): (u32, u32, u32, u32);
        asm!("ld.shared.v4.u32 {{{a}, {b}, {c}, {d}}}, [{p}];",
             a = out(reg32) a, b = out(reg32) b, c = out(reg32) c, d = out(reg32) d,
             p = in(reg64) self.base + 4 * word as u64, options(nostack, readonly));
        [a, b, c, d]
    }

    /// The same memory from `word` on: accessor indices count from there.
    #[inline(always)]
    pub fn from_word(self, word: u32) -> Smem {
        Smem { base: self.base + 4 * word as u64 }
    }

    /// The 32-bit shared-window address of `word`, for loops that step addresses themselves
    /// ([`Smem::ld_u16_at`] and friends): one 32-bit add an access instead of a widening and a
    /// 64-bit add (the window is below 4 GiB, so the address fits).
    #[inline(always)]
    pub fn addr(self, word: u32) -> u32 {
        self.base as u32 + 4 * word
    }

    /// The byte at shared address `addr` (from [`Smem::addr`]).
    ///
    /// # Safety
    /// `addr` is [`Smem::addr`] of a word (plus a byte offset) inside the shared memory the
    /// launch asked for.
    #[cfg(target_arch = "nvptx64")]
    #[inline(always)]
    pub unsafe fn ld_u8_at(addr: u32) -> u8 {
        let r: u16;
        asm!("ld.shared.u8 {r}, [{p}];", r = out(reg16) r, p = in(reg32) addr, options(nostack, readonly));
        r as u8
    }

    /// The 16-bit value at shared address `addr` (from [`Smem::addr`]).
    ///
    /// # Safety
    /// `addr` is [`Smem::addr`] of a word (plus a byte offset) inside the shared memory the
    /// launch asked for.
    #[cfg(target_arch = "nvptx64")]
    #[inline(always)]
    pub unsafe fn ld_u16_at(addr: u32) -> u16 {
        let r: u16;
        asm!("ld.shared.u16 {r}, [{p}];", r = out(reg16) r, p = in(reg32) addr, options(nostack, readonly));
        r
    }

    /// Stores the half-word `v` at shared address `addr` (from [`Smem::addr`]), 2-byte aligned.
    ///
    /// # Safety
    /// `addr` is [`Smem::addr`] of a word (plus an even byte offset) inside the shared memory the
    /// launch asked for.
    #[cfg(target_arch = "nvptx64")]
    #[inline(always)]
    pub unsafe fn st_u16_at(addr: u32, v: u16) {
        asm!("st.shared.u16 [{p}], {v};", p = in(reg32) addr, v = in(reg16) v, options(nostack));
    }

    /// The word at shared address `addr` (from [`Smem::addr`]).
    ///
    /// # Safety
    /// `addr` is [`Smem::addr`] of a word (plus a byte offset) inside the shared memory the
    /// launch asked for.
    #[cfg(target_arch = "nvptx64")]
    #[inline(always)]
    pub unsafe fn ld_u32_at(addr: u32) -> u32 {
        let r: u32;
        asm!("ld.shared.u32 {r}, [{p}];", r = out(reg32) r, p = in(reg32) addr, options(nostack, readonly));
        r
    }

    /// The two words at shared address `addr` (from [`Smem::addr`]), 8-byte aligned.
    ///
    /// # Safety
    /// `addr` is [`Smem::addr`] of a word (plus a byte offset) inside the shared memory the
    /// launch asked for.
    #[cfg(target_arch = "nvptx64")]
    #[inline(always)]
    pub unsafe fn ld_v2_at(addr: u32) -> [u32; 2] {
        let (a, b): (u32, u32);
        asm!("ld.shared.v2.u32 {{{a}, {b}}}, [{p}];", a = out(reg32) a, b = out(reg32) b, p = in(reg32) addr, options(nostack, readonly));
        [a, b]
    }

    /// The four words at shared address `addr` (from [`Smem::addr`]), 16-byte aligned.
    ///
    /// # Safety
    /// `addr` is [`Smem::addr`] of a word (plus a byte offset) inside the shared memory the
    /// launch asked for.
    #[cfg(target_arch = "nvptx64")]
    #[inline(always)]
    pub unsafe fn ld_v4_at(addr: u32) -> [u32; 4] {
        let (a, b, c, d): (u32, u32, u32, u32);
        asm!("ld.shared.v4.u32 {{{a}, {b}, {c}, {d}}}, [{p}];",
             a = out(reg32) a, b = out(reg32) b, c = out(reg32) c, d = out(reg32) d,
             p = in(reg32) addr, options(nostack, readonly));
        [a, b, c, d]
    }

    #[cfg(target_arch = "nvptx64")]
    #[inline(always)]
    pub unsafe fn st_u32(self, word: u32, v: u32) {
        asm!("st.shared.u32 [{p}], {v};", p = in(reg64) self.base + 4 * word as u64,
             v = in(reg32) v, options(nostack));
    }

    #[cfg(target_arch = "nvptx64")]
    #[inline(always)]
    pub unsafe fn ld_u32(self, word: u32) -> u32 {
        let r: u32;
        asm!("ld.shared.u32 {r}, [{p}];", r = out(reg32) r,
             p = in(reg64) self.base + 4 * word as u64, options(nostack, readonly));
        r
    }
}

// The simulator's (`super::sim`): the same operations as checked host loads and stores, shared
// memory addressed from 0 in the block's own buffer.
#[cfg(not(target_arch = "nvptx64"))]
use super::sim;

#[cfg(not(target_arch = "nvptx64"))]
unsafe fn ld_global<T: Copy>(p: *const u8) -> T {
    sim::load(sim::global(p as *const T, size_of::<T>(), false))
}

#[cfg(not(target_arch = "nvptx64"))]
unsafe fn st_global<T: Copy>(p: *mut u8, v: T) {
    sim::store(sim::global(p as *const T, size_of::<T>(), true) as *mut T, v)
}

#[cfg(not(target_arch = "nvptx64"))]
mod sim_global {
    use super::{ld_global, st_global};

    pub unsafe fn ld_nc_u8(p: *const u8) -> u8 {
        ld_global(p)
    }
    pub unsafe fn ld_nc_u16(p: *const u8) -> u16 {
        ld_global(p)
    }
    pub unsafe fn ld_nc_u32(p: *const u8) -> u32 {
        ld_global(p)
    }
    pub unsafe fn ld_nc_v2(p: *const u8) -> [u32; 2] {
        ld_global(p)
    }
    pub unsafe fn ld_nc_v4(p: *const u8) -> [u32; 4] {
        ld_global(p)
    }
    pub unsafe fn ld_cg_u32(p: *const u8) -> u32 {
        ld_global(p)
    }
    pub unsafe fn ld_u8(p: *const u8) -> u8 {
        ld_global(p)
    }
    pub unsafe fn ld_u32(p: *const u8) -> u32 {
        ld_global(p)
    }
    pub unsafe fn ld_v4(p: *const u8) -> [u32; 4] {
        ld_global(p)
    }
    pub unsafe fn st_u8(p: *mut u8, v: u8) {
        st_global(p, v)
    }
    pub unsafe fn st_u16(p: *mut u8, v: u16) {
        st_global(p, v)
    }
    pub unsafe fn st_u32(p: *mut u8, v: u32) {
        st_global(p, v)
    }
    pub unsafe fn st_v4(p: *mut u8, v: [u32; 4]) {
        st_global(p, v)
    }
    pub unsafe fn st_f32(p: *mut f32, v: f32) {
        st_global(p as *mut u8, v)
    }
}
#[cfg(not(target_arch = "nvptx64"))]
pub use sim_global::*;

#[cfg(not(target_arch = "nvptx64"))]
pub fn prefetch_l2(_: *const u8) {}

#[cfg(not(target_arch = "nvptx64"))]
pub fn prefetch_l1(_: *const u8) {}

#[cfg(not(target_arch = "nvptx64"))]
pub unsafe fn cp_async_8(dst: u32, src: *const u8) {
    sim::cp_async(dst, src, 8)
}

#[cfg(not(target_arch = "nvptx64"))]
pub unsafe fn cp_async_16(dst: u32, src: *const u8) {
    sim::cp_async(dst, src, 16)
}

#[cfg(not(target_arch = "nvptx64"))]
pub fn cp_async_wait_all() {
    sim::cp_async_wait(0, true)
}

#[cfg(not(target_arch = "nvptx64"))]
pub fn cp_async_commit() {
    sim::cp_async_commit()
}

#[cfg(not(target_arch = "nvptx64"))]
pub fn cp_async_wait_groups<const PENDING: u32>() {
    sim::cp_async_wait(PENDING as usize, false)
}

#[cfg(not(target_arch = "nvptx64"))]
impl Smem {
    pub fn dynamic() -> Smem {
        Smem { base: 0 }
    }

    unsafe fn ld_shared<T: Copy>(addr: u64) -> T {
        sim::load(sim::smem(addr, size_of::<T>()) as *const T)
    }

    unsafe fn st_shared<T: Copy>(addr: u64, v: T) {
        sim::store(sim::smem(addr, size_of::<T>()) as *mut T, v)
    }

    pub unsafe fn st_v4(self, word: u32, v: [u32; 4]) {
        Self::st_shared(self.base + 4 * word as u64, v)
    }

    pub unsafe fn ld_v4(self, word: u32) -> [u32; 4] {
        Self::ld_shared(self.base + 4 * word as u64)
    }

    pub unsafe fn ld_u8_at(addr: u32) -> u8 {
        Self::ld_shared(addr as u64)
    }

    pub unsafe fn ld_u16_at(addr: u32) -> u16 {
        Self::ld_shared(addr as u64)
    }

    pub unsafe fn ld_u32_at(addr: u32) -> u32 {
        Self::ld_shared(addr as u64)
    }

    pub unsafe fn st_u16_at(addr: u32, v: u16) {
        Self::st_shared(addr as u64, v)
    }

    pub unsafe fn ld_v2_at(addr: u32) -> [u32; 2] {
        Self::ld_shared(addr as u64)
    }

    pub unsafe fn ld_v4_at(addr: u32) -> [u32; 4] {
        Self::ld_shared(addr as u64)
    }

    pub unsafe fn st_u32(self, word: u32, v: u32) {
        Self::st_shared(self.base + 4 * word as u64, v)
    }

    pub unsafe fn ld_u32(self, word: u32) -> u32 {
        Self::ld_shared(self.base + 4 * word as u64)
    }
}
