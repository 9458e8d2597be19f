//! Launch bounds and geometry of the router's softmax/top-k and the sampler of the decode step.
use super::Bounds;
use crate::order::HEAD_THREADS;

/// Tokens (one warp each) per `router_topk` block.
pub const ROUTER_WARPS: u32 = 4;
/// The most experts `router_topk` takes: [`ROUTER_PER_LANE`] per lane, held in registers.
pub const ROUTER_MAX_EXPERTS: usize = 512;
/// Experts per lane of a router warp (expert `j` is lane `j % 32`'s slot `j / 32`).
pub const ROUTER_PER_LANE: usize = ROUTER_MAX_EXPERTS / 32;
/// The most experts a token selects: lane `r` of the warp holds selection `r`.
pub const ROUTER_MAX_K: usize = 16;

/// The most candidates `sample_rows` draws from (`top_k`).
pub const SAMPLE_MAX_K: usize = 256;
/// Threads of a `sample_rows` block: the head's, whose block argmax it uses.
pub const SAMPLE_THREADS: usize = HEAD_THREADS;
/// Shared words of a `sample_rows` block: the head's block argmax (a value and an index per
/// warp), then the candidates' indices, then their values (later their weights, then the
/// cumulative sums), in rank order.
pub const SAMPLE_CAND_IDX: usize = 2 * (SAMPLE_THREADS / 32);
pub const SAMPLE_CAND_VAL: usize = SAMPLE_CAND_IDX + SAMPLE_MAX_K;
pub const SAMPLE_SMEM_WORDS: usize = SAMPLE_CAND_VAL + SAMPLE_MAX_K;

/// This family's kernels (joined into [`super::BOUNDS`]). The router launches a block per 4
/// tokens, so occupancy is no concern: 4 blocks per SM leave it 128 registers, where the 16
/// probabilities and 16 expert ids a lane holds fit (at 8 blocks, 64 registers, NVRTC 13.0
/// spilled 76 bytes).
pub const BOUNDS: [Bounds; 2] = [
    Bounds { kernel: "router_topk", threads: 32 * ROUTER_WARPS, min_blocks: 4, smem_bytes: 0 },
    Bounds { kernel: "sample_rows", threads: SAMPLE_THREADS as u32, min_blocks: 4, smem_bytes: 4 * SAMPLE_SMEM_WORDS as u32 },
];

/// Sizes the HIP sources read as `STRATA_<NAME>`.
pub const GEOMETRY: &[(&str, usize)] = &[
    ("ROUTER_WARPS", ROUTER_WARPS as usize),
    ("ROUTER_PER_LANE", ROUTER_PER_LANE),
    ("SAMPLE_THREADS", SAMPLE_THREADS),
    ("SAMPLE_CAND_IDX", SAMPLE_CAND_IDX),
    ("SAMPLE_CAND_VAL", SAMPLE_CAND_VAL),
];
