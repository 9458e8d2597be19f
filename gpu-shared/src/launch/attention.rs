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

/// The `attn_chunk` entry for a band of `band` heads of `hd` values: `attn_chunk_one` (compiled
/// for one head, so with fewer registers and more blocks per SM), `attn_chunk_two` (compiled for
/// bands of two: a smaller body than the widest bands') or `attn_chunk` (up to
/// [`ATTN_MAX_BAND`]); the bands above one have `_128` twins compiled for heads of 128 values,
/// the qwen3moe files' (without the other sizes' scoring and value bodies: about half the
/// code). `lean`: `attn_chunk_128`'s lean twin `attn_chunk_128_m4` where the band has it
/// ([`attn_chunk_has_lean`]; the sm_90 image only: [`LEAN_BOUNDS`]).
pub const fn attn_chunk_kernel(band: usize, hd: usize, lean: bool) -> &'static str {
    match (band, hd, lean) {
        (1, _, _) => "attn_chunk_one",
        (2, 128, _) => "attn_chunk_two_128",
        (2, _, _) => "attn_chunk_two",
        (_, 128, true) => "attn_chunk_128_m4",
        (_, 128, false) => "attn_chunk_128",
        _ => "attn_chunk",
    }
}

/// The entry that runs `attn_prep` and the chunk kernel of a window in one launch, for a band of
/// `band` heads of `hd` values, where there is one: `attn_prep_chunk_two_128`. The host launches
/// it where the context bound is one chunk (no merge) and [`attn_band`] gives that band.
pub const fn attn_prep_chunk_kernel(band: usize, hd: usize) -> Option<&'static str> {
    match (band, hd) {
        (2, 128) => Some("attn_prep_chunk_two_128"),
        _ => None,
    }
}

/// Whether a band of `band` heads of `hd` values has a lean twin (`attn_chunk_128`'s bands: above
/// two heads, 128 values).
pub const fn attn_chunk_has_lean(band: usize, hd: usize) -> bool {
    band > 2 && hd == 128
}

/// The lean rule: whether an `attn_chunk` launch of `tokens` tokens in bands of `band` of `n_q`
/// heads at `split` ([`attn_split`]) has more than two blocks a SM of `sm_count` working at the
/// shortest context its graph serves (more than `split / 2` chunks, so at least `split / 2 + 1`
/// blocks a band work; one at split 1). There the lean twin's four blocks a SM run more of them
/// at once; where two a SM hold the work, the twin's code at 64 registers is slower (measured on
/// the H100, docs/kernels/attention.md).
pub const fn attn_lean_wanted(tokens: usize, n_q: usize, band: usize, split: usize, sm_count: usize) -> bool {
    tokens * (n_q / band) * (split / 2 + 1) > 2 * sm_count
}

/// The most query heads one `attn_chunk` block computes (a band of one KV group's heads, which
/// read each key and value of the group once).
pub const ATTN_MAX_BAND: usize = 8;

/// The most heads of a band one `attn_chunk` thread sums values for: the block's threads form
/// `ATTN_THREADS / hd` sets, each taking every such head of the band (registers: two
/// accumulators a head).
pub const ATTN_SET_HEADS: usize = 4;

/// The widest band for heads of `hd` values: at most [`ATTN_MAX_BAND`], and at most
/// [`ATTN_SET_HEADS`] heads for each of the block's thread sets.
pub const fn attn_max_band(hd: usize) -> usize {
    let by_sets = ATTN_SET_HEADS * (ATTN_THREADS as usize / hd);
    if by_sets < ATTN_MAX_BAND {
        by_sets
    } else {
        ATTN_MAX_BAND
    }
}

/// Shared words of one of an `attn_chunk` block's two stage buffers (a stage is copied into one
/// while the other is worked on): [`attn_key_stage`] keys of a chunk, each an fp16 row padded to
/// `hd / 2 + 2` words (twice an odd number: 8-byte aligned for the copies, and the 16 rows a warp
/// reads at one offset hit 16 different banks), or as many value rows of `hd / 2` words. 64 keys
/// of 128 values.
pub const ATTN_STAGE_WORDS: u32 = 64 * (128 / 2 + 2);

/// Keys an `attn_chunk` block stages (and scores) at a time for heads of `hd` values: 64 up to
/// 128 values, 32 above (`ATTN_THREADS / stage` threads share a key: two halves of its lane
/// partials for each of the band's head slots).
pub const fn attn_key_stage(hd: usize) -> u32 {
    if 64 * (hd / 2 + 2) <= ATTN_STAGE_WORDS as usize {
        64
    } else {
        32
    }
}
const _: () = assert!(32 * (ATTN_MAX_HD / 2 + 2) <= ATTN_STAGE_WORDS as usize);

/// Shared words of an `attn_chunk` block's queries: a band's `band * hd` values, at most
/// [`ATTN_SET_HEADS`] heads per thread set of `hd` threads ([`attn_max_band`]).
pub const ATTN_Q_WORDS: u32 = ATTN_SET_HEADS as u32 * ATTN_THREADS;

/// Shared words of an `attn_chunk_one` block: the head's query, one score (then softmax term)
/// per key of the chunk, one maximum per warp (laid out as `attn_chunk`'s, which has the same
/// regions for a band).
pub const ATTN_CHUNK_ONE_SMEM_WORDS: u32 = ATTN_Q_WORDS + (ATTN_MAX_BAND * ATTN_CHUNK) as u32 + ATTN_THREADS / 32 * ATTN_MAX_BAND as u32;

/// Shared words of an `attn_chunk` block: the band's queries, one score (then softmax term) per
/// head and key of the chunk, one maximum per warp and head, and the two stage buffers: 45.25
/// KiB, within the 48 KiB a launch gets without asking (and the 64 KiB of an AMD workgroup).
pub const ATTN_CHUNK_SMEM_WORDS: u32 = ATTN_CHUNK_ONE_SMEM_WORDS + 2 * ATTN_STAGE_WORDS;
const _: () = assert!(ATTN_CHUNK_SMEM_WORDS * 4 <= 48 * 1024);

/// Whether `attn_chunk` takes bands of `band` query heads for `n_q` query heads over `n_kv` KV
/// groups of `hd` values: a divisor of the group's `n_q / n_kv`, at most [`attn_max_band`].
pub const fn attn_band_fits(n_q: usize, n_kv: usize, hd: usize, band: usize) -> bool {
    band > 0 && band <= attn_max_band(hd) && (n_q / n_kv) % band == 0
}

/// Query heads per `attn_chunk` block: the widest band above one (a divisor of the group, at
/// most [`attn_max_band`]) whose grid of `tokens * (n_q / band) * split` blocks has at least
/// `min_blocks`, else the narrowest band above one; one head a block (`attn_chunk_one`) only
/// when no band above one fits the group. A wide band reads the keys and values once for all its
/// heads but leaves fewer, longer blocks; a band of one, whose warps score keys and read values
/// straight from memory, was slower than a band of two at every context past 32 keys on the
/// H200 (`strata bench attention --bands 1,2,4,8`, docs/kernels/attention.md). Any band gives
/// the same bits.
pub const fn attn_band(n_q: usize, n_kv: usize, hd: usize, tokens: usize, split: usize, min_blocks: usize) -> usize {
    let group = n_q / n_kv;
    let widest = attn_max_band(hd);
    let mut band = if group < widest { group } else { widest };
    let mut narrowest = 1;
    let mut wide_enough = 0;
    while band > 1 {
        if attn_band_fits(n_q, n_kv, hd, band) {
            if wide_enough == 0 && tokens * (n_q / band) * split >= min_blocks {
                wide_enough = band;
            }
            narrowest = band;
        }
        band -= 1;
    }
    if wide_enough > 0 {
        wide_enough
    } else {
        narrowest
    }
}

/// [`attn_band`]'s `min_blocks` for a device of `sm_count` SMs: a band whose grid has a block for
/// every two SMs is worth its wider reads of each key and value. Measured on the H200 (`strata
/// bench attention --bands 1,2,4,8` across splits 1..32 and windows of 1, 4 and 8 tokens,
/// docs/kernels/attention.md).
pub const fn attn_band_min_blocks(sm_count: usize) -> usize {
    sm_count.div_ceil(2)
}

/// The staged band entries (`attn_chunk`, `attn_chunk_two` and their `_128` twins): 256
/// threads, 2 blocks per SM, the stage buffers' shared memory. A band of up to 8 heads scores a
/// key for 4 of them per thread: 128 registers (at 3 blocks a SM it spills 12 bytes, and measured
/// slower but at depth 32768: docs/kernels/attention.md). Bands of two, the same body without
/// the wider bands' (about half the code, which is what a short context's launch waits on): 123
/// registers, at 3 blocks a SM 4 bytes spilled.
const fn staged_chunk(kernel: &'static str) -> Bounds {
    Bounds { kernel, threads: ATTN_THREADS, min_blocks: 2, smem_bytes: 4 * ATTN_CHUNK_SMEM_WORDS }
}

/// The lean twin of `attn_chunk_128`, for 4 blocks a SM (64 registers without spills, where the
/// entry takes 128 for 2; 45.25 KiB of shared memory a block, so 4 fit sm_90's 228 KiB a SM and
/// not sm_80's 164): the same loops, instruction for instruction, with twice the warps a SM to
/// wait on the staged loads and the barriers behind. Only the sm_90 image has it (joined into
/// [`super::SM90_BOUNDS`]); the HIP source has no twin of it (AMD's register file and LDS
/// differ: a twin there would be measured first). A twin for 3 blocks a SM (80 registers) was
/// slower than this one wherever either beat `attn_chunk_128` (docs/kernels/attention.md).
pub const LEAN_BOUNDS: [Bounds; 1] = [Bounds { kernel: "attn_chunk_128_m4", threads: ATTN_THREADS, min_blocks: 4, smem_bytes: 4 * ATTN_CHUNK_SMEM_WORDS }];

/// This family's kernels (joined into [`super::BOUNDS`]).
pub const BOUNDS: [Bounds; 8] = [
    // attn_prep holds its row, its RoPE partners and their constants in registers: 71 of them at
    // 4 blocks a SM, where 8 would cap a thread at 64 (its grid is a few blocks a token anyway).
    Bounds { kernel: "attn_prep", threads: 32 * ATTN_PREP_WARPS, min_blocks: 4, smem_bytes: 0 },
    staged_chunk("attn_chunk"),
    staged_chunk("attn_chunk_128"),
    staged_chunk("attn_chunk_two"),
    staged_chunk("attn_chunk_two_128"),
    // attn_prep's rows in the prep warps of attn_chunk_two_128's body.
    staged_chunk("attn_prep_chunk_two_128"),
    // One head a block (warps scoring keys): 4 blocks per SM.
    Bounds { kernel: "attn_chunk_one", threads: ATTN_THREADS, min_blocks: 4, smem_bytes: 4 * ATTN_CHUNK_ONE_SMEM_WORDS },
    Bounds { kernel: "attn_merge", threads: ATTN_THREADS, min_blocks: 2, smem_bytes: 0 },
];

/// Sizes the HIP sources read as `STRATA_<NAME>`.
pub const GEOMETRY: &[(&str, usize)] = &[
    ("ATTN_CHUNK", ATTN_CHUNK),
    ("ATTN_THREADS", ATTN_THREADS as usize),
    ("ATTN_PREP_WARPS", ATTN_PREP_WARPS as usize),
    ("ATTN_MAX_HD", ATTN_MAX_HD),
    ("ATTN_MAX_BAND", ATTN_MAX_BAND),
    ("ATTN_STAGE_WORDS", ATTN_STAGE_WORDS as usize),
    ("ATTN_Q_WORDS", ATTN_Q_WORDS as usize),
];

/// Chunks of `ATTN_CHUNK` positions covering `len` keys.
pub const fn attn_chunks(len: usize) -> usize {
    len.div_ceil(ATTN_CHUNK)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn band_is_the_widest_with_enough_blocks_else_the_narrowest_above_one() {
        // 30b-a3b heads (8 a group) on 132 SMs (66 blocks): one token takes the whole group from
        // split 32 (128 blocks), four heads at split 16 (128), two below (16..64 blocks, too few
        // for any band: the narrowest); eight tokens take 2 heads at split 1 (128 blocks), 4 at
        // split 2, 8 from split 4.
        let min = attn_band_min_blocks(132);
        assert_eq!(min, 66);
        for (tokens, split, band) in [(1, 32, 8), (1, 16, 4), (1, 8, 2), (1, 1, 2), (4, 8, 8), (4, 4, 4), (4, 2, 2), (4, 1, 2), (8, 4, 8), (8, 2, 4), (8, 1, 2)] {
            assert_eq!(attn_band(32, 4, 128, tokens, split, min), band, "{tokens} tokens, split {split}");
        }
        // Bands divide the group: 6 heads a group gives 6 with blocks enough and 2 without, 12
        // heads of 256 values (at most 4) give 4 or 2, 7 heads give 7 at 128 values and 1 at 256
        // (no divisor of 7 in 2..=4).
        assert_eq!(attn_band(12, 2, 128, 8, 256, 1), 6);
        assert_eq!(attn_band(12, 2, 128, 1, 1, 66), 2);
        assert_eq!(attn_band(12, 1, 256, 1, 256, 1), 4);
        assert_eq!(attn_band(12, 1, 256, 1, 1, 66), 2);
        assert_eq!(attn_band(7, 1, 128, 1, 256, 1), 7);
        assert_eq!(attn_band(7, 1, 128, 1, 1, 66), 7);
        assert_eq!(attn_band(7, 1, 256, 1, 256, 1), 1);
        // Groups wider than a band: 16 a group gives at most 8, and 4 for 256-value heads.
        assert_eq!(attn_band(16, 1, 128, 1, 256, 1), 8);
        assert_eq!(attn_band(16, 1, 256, 1, 256, 1), 4);
        assert_eq!(attn_max_band(64), 8);
        // One head a group has one band: a head a block.
        assert_eq!(attn_band(4, 4, 128, 1, 256, 1), 1);
        assert_eq!(attn_band(4, 4, 128, 8, 1, 66), 1);
    }

    #[test]
    fn a_band_fits_when_it_divides_the_group_within_the_widest() {
        assert!(attn_band_fits(32, 4, 128, 8) && attn_band_fits(32, 4, 128, 4) && attn_band_fits(32, 4, 128, 1));
        assert!(!attn_band_fits(32, 4, 128, 0) && !attn_band_fits(32, 4, 128, 3) && !attn_band_fits(32, 4, 128, 16));
        assert!(attn_band_fits(16, 1, 256, 4) && !attn_band_fits(16, 1, 256, 8));
        assert!(attn_band_fits(12, 2, 64, 6) && !attn_band_fits(12, 2, 64, 4));
    }

    #[test]
    fn the_lean_rule_wants_more_than_two_working_blocks_a_sm() {
        // 30b-a3b heads on 132 SMs (264 blocks at two a SM), one token in bands of 8 (4 bands):
        // split 256 (contexts of 129..256 chunks, tg128 from depth 32768) works 516 blocks at
        // least, split 128 (16384) 260, split 64 (8192) 132; eight tokens at split 64, 1,056.
        assert!(attn_lean_wanted(1, 32, 8, 256, 132));
        assert!(!attn_lean_wanted(1, 32, 8, 128, 132) && !attn_lean_wanted(1, 32, 8, 64, 132));
        assert!(attn_lean_wanted(8, 32, 8, 64, 132) && attn_lean_wanted(3, 32, 8, 64, 132) && !attn_lean_wanted(2, 32, 8, 64, 132));
        // One chunk (split 1) works one block a band.
        assert!(!attn_lean_wanted(8, 32, 4, 1, 132) && attn_lean_wanted(8, 32, 4, 1, 15));
    }

    #[test]
    fn heads_of_128_values_take_the_entries_compiled_for_them() {
        // Bands above one of 128-value heads on the `_128` entries; other sizes, and one head a
        // block, on the entries that take any size; every name is a kernel with bounds.
        // Lean, the bands above two of them take the twin (4 blocks a SM, in the sm_90 table);
        // the others keep their entry.
        for band in 1..=ATTN_MAX_BAND {
            for hd in [32, 64, 96, 128, 192, 256] {
                let kernel = attn_chunk_kernel(band, hd, false);
                assert_eq!(kernel.ends_with("_128"), band > 1 && hd == 128, "band {band}, hd {hd}: {kernel}");
                assert_eq!(kernel.starts_with("attn_chunk_two"), band == 2, "band {band}, hd {hd}: {kernel}");
                assert_eq!(kernel == "attn_chunk_one", band == 1, "band {band}, hd {hd}: {kernel}");
                assert!(BOUNDS.iter().any(|b| b.kernel == kernel), "{kernel} has no bounds");
                let twin = attn_chunk_kernel(band, hd, true);
                if attn_chunk_has_lean(band, hd) {
                    let b = LEAN_BOUNDS.iter().find(|b| b.kernel == twin).unwrap_or_else(|| panic!("{twin} is not a lean entry"));
                    assert_eq!((twin.strip_suffix("_m4"), b.min_blocks), (Some(kernel), 4), "band {band}, hd {hd}");
                    assert_eq!((b.threads, b.smem_bytes), (ATTN_THREADS, 4 * ATTN_CHUNK_SMEM_WORDS));
                } else {
                    assert_eq!(twin, kernel, "band {band}, hd {hd}");
                }
            }
        }
    }
}
