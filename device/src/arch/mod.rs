//! The GPU vocabulary kernels are written in: one small set of operations, each a thin wrapper
//! over one PTX instruction or intrinsic. HIP spells the same operations in
//! `device/hip/strata_hip.h`, under the same names where it can.
//!
//! | module | operations |
//! |---|---|
//! | [`index`] | thread / block / lane / warp indices |
//! | [`sync`] | `sync_threads`, `sync_lds` (LDS-only barrier), `trap` |
//! | [`warp`] | `shfl_xor_*`, `warp_sum_f32` (butterfly), `warp_max_f32`, `warp_sum_i32` |
//! | [`int`] | `dp4a`, `prmt` (byte permute), `opaque` (a value whose bits the optimizer does not know) |
//! | [`mem`] | read-only global loads (2, 4, 16 bytes), stores, typed dynamic shared memory |
//! | [`convert`] | fp16 <-> f32, f32 -> i32 round-to-nearest-even, `sqrt_rn`, `fma_rn` |
//! | [`cluster`] | sm_90 thread-block clusters: `rank`, `sync`, stores to a neighbour block's shared memory |
//! | [`trace`] | `trace_mark!`: a named point of a kernel, stamped in the timeline build only |
//!
//! Outside the PTX build (on the host) each operation has a twin in the same module that the
//! simulator ([`sim`]) runs: kernels' code on CPU threads, for tests without a GPU.

#[cfg(target_feature = "sm_90")]
pub mod cluster;
pub mod convert;
pub mod index;
pub mod int;
pub mod mem;
#[cfg(not(target_arch = "nvptx64"))]
pub mod sim;
pub mod sync;
pub mod trace;
pub mod warp;

pub use sync::trap;

/// Repeats `body` once per listed index, with `$i` a constant in each copy: per-row arrays
/// indexed by it then stay in registers, where a loop the optimizer declines to unroll would
/// put them in local memory.
#[macro_export]
macro_rules! unroll {
    ($i:ident in [$($n:literal),*] $body:block) => {
        $( { let $i: usize = $n; $body } )*
    };
}

/// Threads in a warp. HIP builds for AMD target wave32 (gfx11/gfx12) so the kernels' lane math
/// is the same on both vendors.
pub const WARP: u32 = 32;
