//! Launch bounds and geometry of the router's softmax/top-k and the sampler of the decode step.
use super::Bounds;
use crate::order::HEAD_THREADS;

/// Threads of a `router_topk` block (one block per token): thread `i` holds expert `i`.
pub const ROUTER_THREADS: u32 = 512;
/// The most experts `router_topk` takes: one a thread.
pub const ROUTER_MAX_EXPERTS: usize = ROUTER_THREADS as usize;
/// Threads of a part of the block: while ranking, thread `h` of each part counts, for experts
/// `h, h + ROUTER_RANKERS, ...`, how many of its part's keys beat theirs.
pub const ROUTER_RANKERS: u32 = 128;
/// Parts of the block, each counting over its own range of the keys.
pub const ROUTER_PARTS: u32 = ROUTER_THREADS / ROUTER_RANKERS;
/// Experts a ranker holds (in registers).
pub const ROUTER_PER_RANKER: usize = ROUTER_MAX_EXPERTS / ROUTER_RANKERS as usize;
/// The most experts a token selects.
pub const ROUTER_MAX_K: usize = 16;
/// Shared words of a `router_topk` block: every expert's probability key (two words, low
/// first: `ROUTER_MAX_EXPERTS` keys, 0 past `n_expert`), from word [`ROUTER_KEY_WORD`]; the
/// warps' maxima from [`ROUTER_MAX_WORD`]; the picks' probabilities then ids in selection
/// order from [`ROUTER_PICK_WORD`]; each part's counts, `ROUTER_MAX_EXPERTS` words a part in
/// expert order, from [`ROUTER_COUNT_WORD`].
pub const ROUTER_KEY_WORD: u32 = 0;
pub const ROUTER_MAX_WORD: u32 = ROUTER_KEY_WORD + 2 * ROUTER_MAX_EXPERTS as u32;
pub const ROUTER_PICK_WORD: u32 = ROUTER_MAX_WORD + ROUTER_THREADS / 32;
pub const ROUTER_COUNT_WORD: u32 = ROUTER_PICK_WORD + 2 * ROUTER_MAX_K as u32;
pub const ROUTER_SMEM_WORDS: u32 = ROUTER_COUNT_WORD + ROUTER_PARTS * ROUTER_MAX_EXPERTS as u32;
// The maxima are read as 16-byte words; a turn reads 8 keys.
const _: () = assert!(ROUTER_MAX_WORD % 4 == 0 && ROUTER_THREADS % 128 == 0 && ROUTER_MAX_EXPERTS % 8 == 0);
const _: () = assert!(ROUTER_THREADS % ROUTER_RANKERS == 0 && ROUTER_MAX_EXPERTS % (ROUTER_RANKERS as usize) == 0);

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

/// This family's kernels (joined into [`super::BOUNDS`]). Both launch a block per token or row,
/// so occupancy is no concern: the router's block of 512 threads is given 128 registers, the
/// sampler's 4 blocks per SM too.
pub const BOUNDS: [Bounds; 2] = [
    Bounds { kernel: "router_topk", threads: ROUTER_THREADS, min_blocks: 1, smem_bytes: 4 * ROUTER_SMEM_WORDS },
    Bounds { kernel: "sample_rows", threads: SAMPLE_THREADS as u32, min_blocks: 4, smem_bytes: 4 * SAMPLE_SMEM_WORDS as u32 },
];

/// Sizes the HIP sources read as `STRATA_<NAME>`.
pub const GEOMETRY: &[(&str, usize)] = &[
    ("ROUTER_THREADS", ROUTER_THREADS as usize),
    ("ROUTER_MAX_EXPERTS", ROUTER_MAX_EXPERTS),
    ("ROUTER_RANKERS", ROUTER_RANKERS as usize),
    ("ROUTER_PARTS", ROUTER_PARTS as usize),
    ("ROUTER_PER_RANKER", ROUTER_PER_RANKER),
    ("ROUTER_KEY_WORD", ROUTER_KEY_WORD as usize),
    ("ROUTER_MAX_WORD", ROUTER_MAX_WORD as usize),
    ("ROUTER_PICK_WORD", ROUTER_PICK_WORD as usize),
    ("ROUTER_COUNT_WORD", ROUTER_COUNT_WORD as usize),
    ("ROUTER_MAX_K", ROUTER_MAX_K),
    ("SAMPLE_THREADS", SAMPLE_THREADS),
    ("SAMPLE_CAND_IDX", SAMPLE_CAND_IDX),
    ("SAMPLE_CAND_VAL", SAMPLE_CAND_VAL),
];
