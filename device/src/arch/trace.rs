//! Marks for the timeline build (`host/src/backends/trace.rs`): a PTX comment naming a point
//! of a kernel, which that build's text pass turns into a stamp of the block's time there
//! (its first thread's). In the default images it stays a comment, which ptxas ignores.
//!
//! The asm touches no memory, but it is a statement the optimizer keeps in place, which can
//! keep it from merging code across it: a mark between `moe_down`'s two early returns changed
//! the PTX, one after them did not. Place a mark where the kernel's PTX, its comment lines
//! aside, stays that of the kernel without it (docs/bench-decode.md says how to check).

/// `crate::trace_mark!(N, "name")`: point `N` (1 to the timeline's `MARKS`, 4) of the kernel,
/// called `name` in the timeline's tables. Every thread of the block may pass it (the stamp is
/// the first thread's); a point a block passes more than once counts each pass.
#[macro_export]
macro_rules! trace_mark {
    ($n:literal, $name:literal) => {
        {
            // SAFETY: a comment; no instruction. (Nothing in the simulator.)
            #[cfg(target_arch = "nvptx64")]
            unsafe {
                core::arch::asm!(concat!("// strata-trace-mark ", $n, " ", $name), options(nomem, nostack, preserves_flags))
            };
        }
    };
}
