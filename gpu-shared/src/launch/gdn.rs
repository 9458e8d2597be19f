//! Launch bounds and geometry of the Gated DeltaNet layers (`gdn_conv`, `gdn_recur`) and of the
//! element-wise gates of the qwen35moe step (`rms_norm_gated`, `sigmoid_mul`, `swiglu_f32`,
//! `add_gated`, `concat_rows`). The specs are `replica::gdn` and `replica::gate`.
use super::spec::SPEC_MAX_TOKENS;
use super::Bounds;

/// Threads of a `gdn_conv` block, one channel each.
pub const GDN_CONV_THREADS: u32 = 128;
/// The most conv taps (`ssm.conv_kernel`) `gdn_conv` takes.
pub const GDN_MAX_CONV: usize = 16;
/// Warps of a `gdn_recur` block; each computes one state column (one value dimension `j` of one
/// value head) through the window.
pub const GDN_WARPS: u32 = 4;
/// The longest head (`ssm.state_size`) `gdn_recur` takes: a lane keeps `d / 32` values of its
/// state column, `q` and `k` in registers.
pub const GDN_MAX_D: usize = 256;
/// Threads of a `sigmoid_mul`, `swiglu_f32`, `add_gated` and `concat_rows` block, one element
/// each.
pub const GATE_THREADS: u32 = 256;

/// Positions of conv input a layer's ring keeps: input `p` sits in row `p % GDN_CONV_RING`.
/// A window reads the `d_conv - 1` positions before its first, which no row of a previous window
/// (at most [`SPEC_MAX_TOKENS`] positions, starting at least one position earlier: a window
/// accepts one token or more) overwrote.
pub const fn gdn_conv_ring(d_conv: usize) -> usize {
    d_conv - 1 + SPEC_MAX_TOKENS
}

/// Recurrent states a layer keeps: the state after position `p` sits in slot
/// `p % GDN_STATE_SLOTS`, so after a verify window the state of the last accepted position is
/// in place for the next window (the rejected positions' slots are never read).
pub const GDN_STATE_SLOTS: usize = SPEC_MAX_TOKENS + 1;

/// This family's kernels (joined into [`super::BOUNDS`]).
pub const BOUNDS: [Bounds; 7] = [
    Bounds { kernel: "gdn_conv", threads: GDN_CONV_THREADS, min_blocks: 4, smem_bytes: 0 },
    Bounds { kernel: "gdn_recur", threads: 32 * GDN_WARPS, min_blocks: 4, smem_bytes: 0 },
    Bounds { kernel: "rms_norm_gated", threads: 32 * super::norm::NORM_WARPS, min_blocks: 4, smem_bytes: 0 },
    Bounds { kernel: "sigmoid_mul", threads: GATE_THREADS, min_blocks: 4, smem_bytes: 0 },
    Bounds { kernel: "swiglu_f32", threads: GATE_THREADS, min_blocks: 4, smem_bytes: 0 },
    Bounds { kernel: "add_gated", threads: GATE_THREADS, min_blocks: 4, smem_bytes: 0 },
    Bounds { kernel: "concat_rows", threads: GATE_THREADS, min_blocks: 4, smem_bytes: 0 },
];

/// Sizes the HIP sources read as `STRATA_<NAME>`.
pub const GEOMETRY: &[(&str, usize)] = &[
    ("GDN_CONV_THREADS", GDN_CONV_THREADS as usize),
    ("GDN_WARPS", GDN_WARPS as usize),
    ("GDN_MAX_D", GDN_MAX_D),
    ("GDN_STATE_SLOTS", GDN_STATE_SLOTS),
    ("GDN_RING_EXTRA", SPEC_MAX_TOKENS),
    ("GATE_THREADS", GATE_THREADS as usize),
];
