//! Launch bounds and geometry of attention of the decode step: per-head norm + RoPE + KV append,
//! chunked attention and its merge.
use super::Bounds;

/// Key positions per `attn_chunk` block. Chunk `c` covers absolute positions
/// `[c * ATTN_CHUNK, (c + 1) * ATTN_CHUNK)`, whatever the window: that is what makes a token's
/// result independent of the other tokens of its window.
pub const ATTN_CHUNK: usize = 256;
/// The most `attn_chunk` blocks per (token, query head). Block `s` of a (token, head) computes
/// chunks `s, s + split, ...` of the token's context, so any split gives the same bits and a
/// grid serves every position up to its size; [`attn_split`] sizes it for a context.
pub const ATTN_MAX_SPLIT: usize = 256;

/// Blocks per (token, query head) for contexts of up to `len` keys: the power of two at or above
/// their chunk count (so each block computes one chunk, and a captured grid serves until the
/// context doubles), at most [`ATTN_MAX_SPLIT`].
pub const fn attn_split(len: usize) -> usize {
    let chunks = attn_chunks(len);
    let pow2 = if chunks <= 1 { 1 } else { chunks.next_power_of_two() };
    if pow2 < ATTN_MAX_SPLIT {
        pow2
    } else {
        ATTN_MAX_SPLIT
    }
}

/// Threads of an `attn_chunk` and an `attn_merge` block (8 warps).
pub const ATTN_THREADS: u32 = 256;
/// Warps (one head row each) per `attn_prep` block.
pub const ATTN_PREP_WARPS: u32 = 4;
/// The longest head `attn_chunk` and `attn_merge` take: one output value per thread, and each
/// lane of `attn_chunk` keeps `hd / 32` query values in registers.
pub const ATTN_MAX_HD: usize = 256;
const _: () = assert!(ATTN_MAX_HD <= ATTN_THREADS as usize && ATTN_CHUNK == ATTN_THREADS as usize);

/// Shared words of an `attn_chunk` block: one score (then softmax term) per key of the chunk,
/// then one running maximum per warp.
pub const ATTN_CHUNK_SMEM_WORDS: u32 = ATTN_CHUNK as u32 + ATTN_THREADS / 32;

/// This family's kernels (joined into [`super::BOUNDS`]).
pub const BOUNDS: [Bounds; 3] = [
    Bounds { kernel: "attn_prep", threads: 32 * ATTN_PREP_WARPS, min_blocks: 8, smem_bytes: 0 },
    Bounds { kernel: "attn_chunk", threads: ATTN_THREADS, min_blocks: 4, smem_bytes: 4 * ATTN_CHUNK_SMEM_WORDS },
    Bounds { kernel: "attn_merge", threads: ATTN_THREADS, min_blocks: 4, smem_bytes: 0 },
];

/// Sizes the HIP sources read as `STRATA_<NAME>`.
pub const GEOMETRY: &[(&str, usize)] = &[
    ("ATTN_CHUNK", ATTN_CHUNK),
    ("ATTN_THREADS", ATTN_THREADS as usize),
    ("ATTN_PREP_WARPS", ATTN_PREP_WARPS as usize),
    ("ATTN_MAX_HD", ATTN_MAX_HD),
];

/// Chunks of `ATTN_CHUNK` positions covering `len` keys.
pub const fn attn_chunks(len: usize) -> usize {
    len.div_ceil(ATTN_CHUNK)
}
