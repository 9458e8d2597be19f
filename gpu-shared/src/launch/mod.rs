//! Launch geometry and launch bounds of every kernel: the one table both the PTX post-processing
//! in build.rs (`.maxntid`, `.minnctapersm`) and the HIP header (`__launch_bounds__` on NVIDIA,
//! work-group size and waves per EU on AMD) are generated from, and that the host launches by.
use crate::formats::WeightFormat;

pub mod attention;
pub mod gdn;
pub mod norm;
pub mod route;
pub mod spec;

/// Threads per block and the minimum resident blocks per SM the compiler must allow, and the
/// dynamic shared memory a launch gives the kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bounds {
    pub kernel: &'static str,
    pub threads: u32,
    pub min_blocks: u32,
    pub smem_bytes: u32,
}

/// Warps (one output row each) per `mmvq` block.
pub const MMVQ_WARPS: u32 = 4;
/// q8_1 groups (one warp each) per `quantize_q8_1` block.
pub const QUANTIZE_WARPS: u32 = 4;
/// Elements per block of the split head kernels (`argmax_rows`, `row_top_prob`): a 151,936
/// vocabulary is 38 blocks per row.
pub const HEAD_CHUNK: usize = 4096;
/// Elements a thread of `range_best` (the argmax entries) loads before it folds the first: a
/// `HEAD_CHUNK` block's share in one round, where folding each load before the next was a chain
/// of 16 L2 latencies a thread.
pub const HEAD_AHEAD: u32 = (HEAD_CHUNK / crate::order::HEAD_THREADS) as u32;
/// Slots a `moe_combine` thread loads (weight and row value) before it adds the first, in slot
/// order: one round of L2 latency for the usual top-8, where the compiler's unrolling of a loop
/// over a runtime `k` by four made two.
pub const MOE_COMBINE_AHEAD: u32 = 8;
/// Warps of a `moe_gu_*` block; each computes 4 of the block's 32 `n_ff` rows.
pub const MOE_GU_WARPS: u32 = 8;
/// `n_ff` rows per `moe_gu_*` block: one q8_1 group of the SwiGLU output.
pub const MOE_GU_ROWS: u32 = 32;
/// The most (token, slot) selections of one routed-expert window (8 tokens x up to 32 slots):
/// one `moe_group` thread or more for each.
pub const MOE_MAX_SELECTIONS: usize = 256;
/// Threads of the `moe_group` block.
pub const MOE_GROUP_THREADS: u32 = 256;
const _: () = assert!(MOE_MAX_SELECTIONS as u32 <= MOE_GROUP_THREADS && MOE_GROUP_THREADS % 32 == 0);
/// Threads of `moe_group` that share one selection's scans for `n` selections (`1..=256`): the
/// most, a power of two up to a warp, that still gives every selection its own threads. The
/// threads of a selection are adjacent lanes of one warp, so shuffles join their counts.
pub const fn moe_group_parts(n: u32) -> u32 {
    let mut parts = 32;
    while parts > 1 && n * parts > MOE_GROUP_THREADS {
        parts /= 2;
    }
    parts
}
/// Dynamic shared memory of `moe_group`: the window's ids and their first flags, a word each,
/// and a word of packed counts for each warp.
pub const MOE_GROUP_SMEM: u32 = 4 * (2 * MOE_MAX_SELECTIONS as u32 + MOE_GROUP_THREADS / 32);
/// Consecutive down rows a `moe_down_*` warp takes (`MMVQ_WARPS` warps a block). A group of one
/// entry (every group of a one-token window, most under uniform routing) has each lane load its
/// groups of all the warp's rows before it uses the first, so a warp waits on one memory latency
/// for them where one row a warp waited once a row; larger groups take the rows one by one.
pub const MOE_DOWN_ROWS: u32 = 4;
/// Entries of a group one pass of the expert kernels takes (its activation rows per weight
/// decode); larger groups take several passes.
pub const MOE_ENTRY_PASS: u32 = MMVQ_MAX_ROWS as u32;

/// Entries an EXPDEC pass stages in shared memory.
pub const EXPDEC_ENTRIES: u32 = 4;
/// Threads of every EXPDEC block (`expdec_gu_*` has the `moe_gu` geometry).
pub const EXPDEC_THREADS: u32 = 32 * MOE_GU_WARPS;
/// Weight rows per lane of `expdec_gu_*` (`STRATA_EXPDEC_R`), one compiled entry each.
pub const EXPDEC_R: [u32; 2] = [1, 2];
/// Weight rows per lane of `expdec_down_*` (`STRATA_EXPDEC_DR`), one compiled entry each.
pub const EXPDEC_DR: [u32; 3] = [1, 2, 4];
/// Minimum resident blocks per SM the EXPDEC entries are compiled for (`STRATA_EXPDEC_MINB`),
/// one compiled entry each.
pub const EXPDEC_MINB: [u32; 2] = [2, 4];
/// What is compiled for 4 blocks per SM (64 registers a thread), one rule: gate/up with at most
/// [`EXPDEC_MINB4_MAX_R`] rows per lane and a format of [`EXPDEC_GU_MINB4_FORMATS`], down with at
/// most [`EXPDEC_MINB4_MAX_DR`]. R=2 gate/up and DR=4 down spilled there (220-320 bytes from
/// NVRTC 13.0 on the H200 machine), and so did Q8_0's R=1 gate/up (12 bytes, ptxas 13.0 for
/// sm_90), so those entries exist for 2 blocks per SM only.
pub const EXPDEC_MINB4_MAX_R: u32 = 1;
pub const EXPDEC_MINB4_MAX_DR: u32 = 2;
pub const EXPDEC_GU_MINB4_FORMATS: [WeightFormat; 6] =
    [WeightFormat::Iq2Xxs, WeightFormat::Iq2Xs, WeightFormat::Iq2S, WeightFormat::Iq3Xxs, WeightFormat::Iq3S, WeightFormat::Iq3ST];
/// Threads of the 16-warp gate/up entries (`expdec_gu_<format>_r1_w16`, `STRATA_EXPDEC_WARPS`):
/// 2 blocks per SM (64 registers a thread, as 4 blocks of [`EXPDEC_THREADS`]), R = 1 and the
/// formats of [`EXPDEC_GU_MINB4_FORMATS`]. A window of few selections launches few gate/up
/// blocks (192 for one token of 8 experts at n_ff 768), so their warps are what fills the SMs.
pub const EXPDEC_W16_THREADS: u32 = 2 * EXPDEC_THREADS;
/// Blocks of one thread-block cluster of the pair gate/up entries (`expdec_gu_<format>_r1_p2`,
/// [`CLUSTER_BOUNDS`]): each 32-row chunk of the SwiGLU output is split over them, 16 rows
/// each, and the first quantizes it.
pub const EXPDEC_PAIR: u32 = 2;
/// Rows a warp of the `WARP_ROWS` gate/up entries (`expdec_gu_<format>_r1_m2w`: formats whose
/// rows are whole 16-byte units, `WeightFormat::pair_stages_rows`) holds in shared memory at
/// once: it copies its rows this far ahead of the one it decodes.
pub const EXPDEC_ROW_SLOTS: u32 = 2;
/// Gate/up rows per block of `expdec_gu_*` (`STRATA_EXPDEC_RB`): whole q8_1 groups of the
/// SwiGLU output, 1, 2 or 4 of them. A run-time argument.
pub const EXPDEC_RB: [u32; 3] = [32, 64, 128];
/// Down rows per block of `expdec_down_*` (`STRATA_EXPDEC_DRB`), rounded down to whole steps
/// ([`expdec_down_block_rows`]). A run-time argument.
pub const EXPDEC_DRB: [u32; 5] = [16, 32, 64, 128, 256];
/// The most 32-value groups a down row of `expdec_down_*` may have (`n_ff <= 1024`): each
/// group's partial is then one contribution, and the row's sum is one butterfly over them.
pub const EXPDEC_DOWN_MAX_GROUPS: u32 = 32;

/// Dynamic shared memory of an `expdec_gu_*` launch, in bytes: `EXPDEC_ENTRIES` staged q8_1
/// rows of `n_embd` values (9 words per 32-value group), their SwiGLU outputs (`rb` words each)
/// and the format's codebook (`grid_words`).
pub const fn expdec_gu_smem(n_embd: usize, rb: u32, grid_words: usize) -> u32 {
    (4 * (EXPDEC_ENTRIES as usize * (9 * (n_embd / 32) + rb as usize) + grid_words)) as u32
}

/// Dynamic shared memory of a pair gate/up launch (`expdec_gu_*_p2`), in bytes: as
/// [`expdec_gu_smem`] for a chunk, and where the format stages its rows
/// (`WeightFormat::pair_stages_rows`) the block's gate and up rows, `row_bytes` each.
pub fn expdec_gu_pair_smem(n_embd: usize, format: WeightFormat) -> u32 {
    let rows = if format.pair_stages_rows() { 2 * (MOE_GU_ROWS / EXPDEC_PAIR) as usize * format.row_bytes(n_embd) } else { 0 };
    expdec_gu_smem(n_embd, MOE_GU_ROWS, format.staged_grid().len()) + rows as u32
}

/// Shared memory of the row slots of a `WARP_ROWS` gate/up block (`_m2w`), in bytes:
/// [`EXPDEC_ROW_SLOTS`] gate and up rows a warp, after [`expdec_gu_smem`]'s.
pub fn expdec_gu_ring_bytes(n_embd: usize, format: WeightFormat) -> u32 {
    (EXPDEC_THREADS / 32 * EXPDEC_ROW_SLOTS * 2) * format.row_bytes(n_embd) as u32
}

/// Rows one step of an `expdec_down_*` block computes: the block's threads form
/// `EXPDEC_THREADS / ff_groups` row slots of `ff_groups` threads (one group each), and each slot
/// takes `dr` rows.
pub const fn expdec_down_step_rows(ff_groups: u32, dr: u32) -> u32 {
    EXPDEC_THREADS / ff_groups * dr
}

/// The rows an `expdec_down_*` block takes for `drb` asked: whole steps (a step's partials are
/// summed together), at least one.
pub const fn expdec_down_block_rows(drb: u32, ff_groups: u32, dr: u32) -> u32 {
    let step = expdec_down_step_rows(ff_groups, dr);
    let steps = drb / step;
    (if steps == 0 { 1 } else { steps }) * step
}

/// Dynamic shared memory of an `expdec_down_*` launch, in bytes: `EXPDEC_ENTRIES` staged q8_1
/// rows of `ff_groups` groups (9 words each) and one step's partials (a word per entry, row and
/// group).
pub const fn expdec_down_smem(ff_groups: u32, dr: u32) -> u32 {
    4 * EXPDEC_ENTRIES * (9 * ff_groups + expdec_down_step_rows(ff_groups, dr) * ff_groups)
}

/// The minimum-blocks rule (`STRATA_EXPDEC_MINBLK`): the most rows per block among `choices`
/// (ascending) that still gives at least `min_blocks` blocks for `groups` groups of `rows` rows;
/// the fewest rows per block when none does.
pub fn rows_per_block(choices: &[u32], groups: u32, rows: u32, min_blocks: u32) -> u32 {
    choices.iter().rev().copied().find(|&rb| groups * rows.div_ceil(rb) >= min_blocks).unwrap_or(choices[0])
}

/// Bytes of one segment each block of `copy_from_mapped_multi` copies: one 16-byte move per
/// thread of a 256-thread block. (64 KiB per block was measured 6x slower than one copy per
/// segment at 64 KiB segments: one block's serial reads across PCIe are latency-bound.)
pub const COPY_CHUNK: usize = 4096;
/// u64 words per segment in `copy_from_mapped_multi`'s table: source, destination, length,
/// first block.
pub const COPY_SEGMENT_WORDS: usize = 4;
/// Elements per lane the float `matvec` loads before adding them (in order), to keep loads in
/// flight: each `32 * MATVEC_AHEAD` elements of a row cost one memory latency, so a 2,048-wide
/// F32 router row costs one. (Under ncu on the H200 the router launch took 14 us at 4, sixteen
/// latencies, 6.8 us at 8 and 4.35 at 16.) A row's remainder goes in chunks of
/// [`MATVEC_AHEAD_REST`], then one element at a time.
pub const MATVEC_AHEAD: u32 = 64;
/// The second chunk size of the float `matvec` (a 2,560-wide row: one chunk of 64, one of 16).
pub const MATVEC_AHEAD_REST: u32 = 16;
/// Warps (one weight row each) per float `matvec` block: a 128-expert router is 64 blocks, each
/// SM's share of the rows (and of the activation reads) half what it was at 4 warps.
/// (Twenty-second session, run 1, one-row entries: tg128 465.75 / 465.64 tok/s at 2 against
/// 464.56 / 464.90 at 4 and 464.33 / 464.16 at 1; windows even.)
pub const MATVEC_WARPS: u32 = 2;

/// Blocks of a float `matvec` launch of `m` weight rows and `rows` activation rows (a block a
/// weight block of [`MATVEC_WARPS`] rows and one activation row), or `None` past a grid's
/// 2^31 - 1 blocks.
pub fn matvec_blocks(m: usize, rows: usize) -> Option<u32> {
    m.div_ceil(MATVEC_WARPS as usize).checked_mul(rows).filter(|&b| b <= i32::MAX as usize).map(|b| b as u32)
}
/// Warps (one weight row each) per staged `mmvqs_*` block: the blocks share the activation rows
/// they stage, so more rows a block stage less often (each thread fewer items, every block's
/// copy one more read of the same L2 lines); 16 gives a 2,048-row matrix 128 blocks, one an SM.
pub const MMVQS_WARPS: u32 = 16;
/// The most shared memory an `mmvqs_*` launch stages (48 KiB, what a launch gets without
/// opting in); a launch of more rows x groups runs `mmvq_*`.
pub const MMVQS_SMEM_MAX: u32 = 48 * 1024;

/// One `mmvq` launch: its entry, the weight rows a block takes and its dynamic shared memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MmvqLaunch {
    pub kernel: &'static str,
    pub rows_per_block: u32,
    pub smem: u32,
}

/// The `mmvq` launch for `m` weight rows times `rows` (1..=8) activation rows of `groups` q8_1
/// blocks: for one row, `mmvq1_*` from [`MMVQ1_MIN_ROWS`] rows (two weight rows a warp where
/// [`mmvq1_pairs`]) and below that `mmvq1a_*` from [`MMVQ1A_MIN_GROUPS`] groups, else `mmvq_*`;
/// for 2..8, `mmvqs_*` (the rows staged in shared memory) where their blocks fit
/// [`MMVQS_SMEM_MAX`], else `mmvq_*`.
pub fn mmvq_launch(format: WeightFormat, m: usize, rows: usize, groups: usize) -> MmvqLaunch {
    let bytes = rows.saturating_mul(groups).saturating_mul(crate::formats::q8_1::BYTES);
    let plain = |kernel| MmvqLaunch { kernel, rows_per_block: MMVQ_WARPS, smem: 0 };
    match rows {
        1 if mmvq1_pairs(m, groups) => MmvqLaunch { kernel: format.mmvq1_kernel(), rows_per_block: 2 * MMVQ_WARPS, smem: 0 },
        1 if m >= MMVQ1_MIN_ROWS => plain(format.mmvq1_kernel()),
        1 if groups >= MMVQ1A_MIN_GROUPS => plain(format.mmvq1a_kernel()),
        1 => plain(format.mmvq_kernel()),
        _ if bytes <= MMVQS_SMEM_MAX as usize => MmvqLaunch { kernel: format.mmvqs_kernel(), rows_per_block: MMVQS_WARPS, smem: bytes as u32 },
        _ => plain(format.mmvq_kernel()),
    }
}

/// Activation rows one `mmvq` launch multiplies.
pub const MMVQ_MAX_ROWS: usize = 8;
/// Weight groups a lane of the one-row `mmvq1_*` entries loads before using the first: a row of
/// up to 4,096 values (4 groups a lane) in one memory latency instead of one latency a group.
/// (The 1..8-row entries load one at a time: at their 64 registers two spilled.)
pub const MMVQ1_AHEAD: u32 = 4;

/// Weight rows from which a one-row matvec runs `mmvq1_*` ([`mmvq_launch`]). Its lanes hold
/// `MMVQ1_AHEAD` groups before the grid wait; `mmvq_*` holds one and asks L2 for the rest of
/// its row. With `mmvq1_*` at 64 registers too (seventeenth session), every one-row launch on
/// `mmvq1_*` made the 30b-a3b's tg128 1.7 % slower (397.0 against 403.8 tok/s). At 80
/// registers (sixteenth session), in a
/// chain of launches (`strata bench mmvq`) `mmvq_*` was faster on the
/// matrices of a layer (Q8_0T 5120 x 2048: 3.96 us against 5.08; 2048 x 2048: 2.30 against
/// 2.75; Q6_K, Q6_KT alike; 2048 x 4096 even) and `mmvq1_*` on the head (151,936 rows: Q8_0T
/// 77.2 against 81.0, Q6_KT 90.6 against 97.8); in the decode step one-row matrices under
/// 16,384 rows on `mmvq_*` made tg128 1.1 % faster.
pub const MMVQ1_MIN_ROWS: usize = 16384;

/// Groups a row needs for a one-row matvec under [`MMVQ1_MIN_ROWS`] rows to run `mmvq1a_*`
/// ([`mmvq_launch`]): more than one a lane, where loading each step ahead saves a memory
/// latency or more after the grid wait. (From 65, the 30b-a3b's output projection alone: tg128
/// +0.8 %; from 33, its fused q/k/v projection too: +3.4 %; fifty-third session, H100.)
pub const MMVQ1A_MIN_GROUPS: usize = 33;

/// Whether `mmvq1_*` gives a warp two adjacent weight rows of `m`, each of `groups` groups: rows
/// of 1,024 or 2,048 values (one or two groups a lane, so a pair is at most the `MMVQ1_AHEAD`
/// groups a lane holds in flight anyway, and lane `l`'s groups `l, l + 32, ...` of the pair,
/// one row of twice the groups in memory, are its groups of each row, whose activation blocks
/// it loads once for both) in matrices `mmvq1_*` runs ([`MMVQ1_MIN_ROWS`]). Each row's partials
/// and butterfly are the one-row warp's: same bits.
pub const fn mmvq1_pairs(m: usize, groups: usize) -> bool {
    (groups == 32 || groups == 64) && m >= MMVQ1_MIN_ROWS
}

/// The matvec geometry: one warp per weight row, `MMVQ_WARPS` rows per block.
const fn mmvq(kernel: &'static str) -> Bounds {
    Bounds { kernel, threads: 32 * MMVQ_WARPS, min_blocks: 8, smem_bytes: 0 }
}

/// The float `matvec_*` entries: one warp per weight row and activation row, [`MATVEC_WARPS`]
/// weight rows per block, at 2 blocks per SM: room for a chunk of [`MATVEC_AHEAD`] weights and
/// activations in registers (their launches, router-sized, are a few dozen blocks a row).
const fn matvec(kernel: &'static str) -> Bounds {
    Bounds { kernel, threads: 32 * MATVEC_WARPS, min_blocks: 2, smem_bytes: 0 }
}

/// The staged `mmvqs_*` entries: [`MMVQS_WARPS`] warps at 2 blocks per SM (64 registers, as
/// `mmvq_*`); shared memory given at launch ([`mmvq_launch`]: 9 words a staged q8_1 block).
const fn mmvqs(kernel: &'static str) -> Bounds {
    Bounds { kernel, threads: 32 * MMVQS_WARPS, min_blocks: 2, smem_bytes: 0 }
}

/// The one-row `mmvq1_*` entries: the matvec geometry at 8 blocks per SM (64 registers), room
/// for [`MMVQ1_AHEAD`] decoded groups.
const fn mmvq1(kernel: &'static str) -> Bounds {
    Bounds { kernel, threads: 32 * MMVQ_WARPS, min_blocks: 8, smem_bytes: 0 }
}

/// `mmvq1_q6_k` at 6 blocks per SM (80 registers): its four groups of 34 two-byte loads spill
/// at 64.
const fn mmvq1_wide(kernel: &'static str) -> Bounds {
    Bounds { min_blocks: 6, ..mmvq1(kernel) }
}

/// The matvec families' entries, one a format of [`WeightFormat::MATVEC`] each: `mmvq_*`,
/// `mmvq1_*` (`mmvq1_q6_k` at 6 blocks a SM), `mmvq1a_*` (the `mmvq_*` geometry) and `mmvqs_*`.
const MATVEC_BOUNDS: [Bounds; 4 * WeightFormat::MATVEC.len()] = {
    let n = WeightFormat::MATVEC.len();
    let mut out = [mmvq(""); 4 * WeightFormat::MATVEC.len()];
    let mut i = 0;
    while i < n {
        let f = WeightFormat::MATVEC[i];
        out[i] = mmvq(f.mmvq_kernel());
        out[n + i] = if matches!(f, WeightFormat::Q6K) { mmvq1_wide(f.mmvq1_kernel()) } else { mmvq1(f.mmvq1_kernel()) };
        out[2 * n + i] = mmvq(f.mmvq1a_kernel());
        out[3 * n + i] = mmvqs(f.mmvqs_kernel());
        i += 1;
    }
    out
};

const BASE: [Bounds; 40] = [
    Bounds { kernel: "quantize_q8_1", threads: 32 * QUANTIZE_WARPS, min_blocks: 8, smem_bytes: 0 },
    matvec("matvec_f32"),
    matvec("matvec_bf16"),
    matvec("matvec_f16"),
    head("argmax_rows_ref"),
    head("argmax_rows_split"),
    head("argmax_rows_final"),
    head("row_top_prob_ref"),
    head("row_top_prob_max"),
    head("row_top_prob_sum"),
    head("row_top_prob_final"),
    Bounds { kernel: "copy_from_mapped_multi", threads: 256, min_blocks: 4, smem_bytes: 0 },
    Bounds { kernel: "moe_group", threads: MOE_GROUP_THREADS, min_blocks: 1, smem_bytes: MOE_GROUP_SMEM },
    Bounds { kernel: "moe_combine", threads: 256, min_blocks: 4, smem_bytes: 0 },
    moe_gu("moe_gu_q8_0"),
    moe_gu("moe_gu_q6_k"),
    moe_gu("moe_gu_iq2_xxs"),
    moe_gu("moe_gu_iq2_xs"),
    moe_gu("moe_gu_iq2_s"),
    moe_gu("moe_gu_iq3_xxs"),
    moe_gu("moe_gu_iq3_s"),
    moe_gu("moe_gu_iq3_st"),
    moe_gu("moe_gu_iq4_nl"),
    moe_gu("moe_gu_iq4_nlt"),
    moe_gu("moe_gu_iq4_xs"),
    moe_gu("moe_gu_q2_0"),
    moe_down("moe_down_q8_0"),
    moe_down("moe_down_q6_k"),
    moe_down("moe_down_iq2_xxs"),
    moe_down("moe_down_iq2_xs"),
    moe_down("moe_down_iq2_s"),
    moe_down("moe_down_iq3_xxs"),
    moe_down("moe_down_iq3_s"),
    moe_down("moe_down_iq3_st"),
    moe_down("moe_down_iq4_nl"),
    Bounds { min_blocks: 8, ..moe_down("moe_down_iq4_nlt") },
    moe_down("moe_down_iq4_xs"),
    moe_down("moe_down_q2_0"),
    Bounds { kernel: "quantize_q8_0_scaled", threads: 32 * QUANTIZE_WARPS, min_blocks: 8, smem_bytes: 0 },
    Bounds { kernel: "quantize_q8_0_scaled_ref", threads: 32 * QUANTIZE_WARPS, min_blocks: 8, smem_bytes: 0 },
];

/// The down geometry: `MMVQ_WARPS` warps of [`MOE_DOWN_ROWS`] rows at 5 blocks per SM (up to 102
/// registers: room for a group of each row; at 64 most formats spilled, at 80 IQ4_XS and Q6_K).
const fn moe_down(kernel: &'static str) -> Bounds {
    Bounds { kernel, threads: 32 * MMVQ_WARPS, min_blocks: 5, smem_bytes: 0 }
}

/// The gate/up geometry: `MOE_GU_WARPS` warps, shared words for one pass's SwiGLU outputs.
const fn moe_gu(kernel: &'static str) -> Bounds {
    Bounds { kernel, threads: 32 * MOE_GU_WARPS, min_blocks: 2, smem_bytes: 4 * MOE_ENTRY_PASS * MOE_GU_ROWS }
}

/// An EXPDEC entry: `EXPDEC_THREADS` threads, its compiled minimum blocks per SM; shared memory
/// depends on the shape and is given at launch ([`expdec_gu_smem`], [`expdec_down_smem`]).
const fn expdec(kernel: &'static str, min_blocks: u32) -> Bounds {
    Bounds { kernel, threads: EXPDEC_THREADS, min_blocks, smem_bytes: 0 }
}

/// Every EXPDEC entry: `expdec_gu_<format>_r<R>_m<MINB>` and `expdec_down_<format>_d<DR>_m<MINB>`
/// over [`EXPDEC_R`], [`EXPDEC_DR`] and [`EXPDEC_MINB`] (4 blocks per SM only up to
/// [`EXPDEC_MINB4_MAX_R`] and [`EXPDEC_MINB4_MAX_DR`], and for gate/up only in the `gu` formats,
/// [`EXPDEC_GU_MINB4_FORMATS`], which also have the 16-warp `_r1_w16` gate/up entries; `gu_m2`
/// formats have 2 blocks per SM only).
macro_rules! expdec_bounds {
    (gu_m2: $($g2:literal),*; gu: $($g:literal),*; down: $($d:literal),*) => {[
        $(
            expdec(concat!("expdec_gu_", $g2, "_r1_m2"), 2), expdec(concat!("expdec_gu_", $g2, "_r2_m2"), 2),
        )*
        $(
            expdec(concat!("expdec_gu_", $g, "_r1_m2"), 2), expdec(concat!("expdec_gu_", $g, "_r1_m4"), 4),
            expdec(concat!("expdec_gu_", $g, "_r2_m2"), 2),
            Bounds { kernel: concat!("expdec_gu_", $g, "_r1_w16"), threads: EXPDEC_W16_THREADS, min_blocks: 2, smem_bytes: 0 },
        )*
        $(
            expdec(concat!("expdec_down_", $d, "_d1_m2"), 2), expdec(concat!("expdec_down_", $d, "_d1_m4"), 4),
            expdec(concat!("expdec_down_", $d, "_d2_m2"), 2), expdec(concat!("expdec_down_", $d, "_d2_m4"), 4),
            expdec(concat!("expdec_down_", $d, "_d4_m2"), 2),
        )*
    ]};
}

/// Whether `kernel` is an EXPDEC entry: its shared memory is sized at launch, and the backends
/// let it take more than a launch gets without opting in.
pub fn expdec_entry(kernel: &str) -> bool {
    EXPDEC_BOUNDS.iter().chain(&CLUSTER_BOUNDS).any(|b| b.kernel == kernel)
}

/// The entries that run as thread-block clusters, which only the sm_90 image has (not the
/// sm_80 one, nor the HIP sources): the pair gate/up entries `expdec_gu_<format>_r1_p2` for
/// the formats of [`EXPDEC_GU_MINB4_FORMATS`], blocks of [`EXPDEC_THREADS`] at 4 a SM, in
/// clusters of [`EXPDEC_PAIR`] (build.rs writes `.reqnctapercluster` into their headers).
/// IQ3_ST's at 3 a SM: its staged rows and repeated codebook (69 KiB a block at n_embd 2048)
/// already hold it to 3, and the 80 registers let it walk one-entry passes unrolled without a
/// spill.
pub const CLUSTER_BOUNDS: [Bounds; 6] = [
    expdec("expdec_gu_iq2_xxs_r1_p2", 4),
    expdec("expdec_gu_iq2_xs_r1_p2", 4),
    expdec("expdec_gu_iq2_s_r1_p2", 4),
    expdec("expdec_gu_iq3_xxs_r1_p2", 4),
    expdec("expdec_gu_iq3_s_r1_p2", 4),
    expdec("expdec_gu_iq3_st_r1_p2", 3),
];

/// The entries only the sm_90 image has: the [`CLUSTER_BOUNDS`] ones and the lean attention
/// chunk entry ([`attention::LEAN_BOUNDS`]).
pub const SM90_BOUNDS: [Bounds; CLUSTER_BOUNDS.len() + attention::LEAN_BOUNDS.len()] = join(CLUSTER_BOUNDS, attention::LEAN_BOUNDS);

/// The images (`strata::ptx::IMAGES` architectures) that have the [`SM90_BOUNDS`] entries.
pub const SM90_ARCHS: [&str; 1] = ["sm_90"];

/// The entries of the image built for `arch` (`sm_90`, ...): every [`BOUNDS`] kernel, and the
/// [`SM90_BOUNDS`] ones where `arch` is one of [`SM90_ARCHS`]. What build.rs writes bounds for,
/// what the cuda backend loads, and what the toolchain report checks.
pub fn image_bounds(arch: &str) -> impl Iterator<Item = &'static Bounds> + Clone {
    let sm90: &'static [Bounds] = if SM90_ARCHS.contains(&arch) { &SM90_BOUNDS } else { &[] };
    BOUNDS.iter().chain(sm90)
}

/// Blocks of a cluster of `kernel`: [`EXPDEC_PAIR`] for a [`CLUSTER_BOUNDS`] entry, else 1.
pub fn cluster_blocks(kernel: &str) -> u32 {
    if CLUSTER_BOUNDS.iter().any(|b| b.kernel == kernel) {
        EXPDEC_PAIR
    } else {
        1
    }
}

/// The formats with EXPDEC entries: gate/up, then down.
pub const EXPDEC_GU_FORMATS: [WeightFormat; 7] =
    [WeightFormat::Q8_0, WeightFormat::Iq2Xxs, WeightFormat::Iq2Xs, WeightFormat::Iq2S, WeightFormat::Iq3Xxs, WeightFormat::Iq3S, WeightFormat::Iq3ST];
pub const EXPDEC_DOWN_FORMATS: [WeightFormat; 3] = [WeightFormat::Q2_0, WeightFormat::Iq4Nl, WeightFormat::Iq4NlT];

/// The EXPDEC entries: per format, and the `WARP_ROWS` 8-warp gate/up entry of IQ3_ST
/// (`_r1_m2w`; the HIP source compiles the `_r1_m2` body under its name, AMD having no
/// asynchronous copies).
const EXPDEC_BOUNDS: [Bounds; 42] = join(
    expdec_bounds!(gu_m2: "q8_0"; gu: "iq2_xxs", "iq2_xs", "iq2_s", "iq3_xxs", "iq3_s", "iq3_st"; down: "q2_0", "iq4_nl", "iq4_nlt"),
    [expdec("expdec_gu_iq3_st_r1_m2w", 2)],
);

/// `a` then `b`, in a const context.
const fn join<const A: usize, const B: usize, const N: usize>(a: [Bounds; A], b: [Bounds; B]) -> [Bounds; N] {
    assert!(A + B == N);
    let mut out = [Bounds { kernel: "", threads: 0, min_blocks: 0, smem_bytes: 0 }; N];
    let mut i = 0;
    while i < N {
        out[i] = if i < A { a[i] } else { b[i - A] };
        i += 1;
    }
    out
}

const WITH_MATVEC: [Bounds; MATVEC_BOUNDS.len() + BASE.len()] = join(MATVEC_BOUNDS, BASE);
const KERNELS_BOUNDS: [Bounds; WITH_MATVEC.len() + EXPDEC_BOUNDS.len()] = join(WITH_MATVEC, EXPDEC_BOUNDS);
const WITH_NORM: [Bounds; KERNELS_BOUNDS.len() + norm::BOUNDS.len()] = join(KERNELS_BOUNDS, norm::BOUNDS);
const WITH_ATTENTION: [Bounds; WITH_NORM.len() + attention::BOUNDS.len()] = join(WITH_NORM, attention::BOUNDS);
const WITH_ROUTE: [Bounds; WITH_ATTENTION.len() + route::BOUNDS.len()] = join(WITH_ATTENTION, route::BOUNDS);
const WITH_SPEC: [Bounds; WITH_ROUTE.len() + spec::BOUNDS.len()] = join(WITH_ROUTE, spec::BOUNDS);
const ALL_BOUNDS: [Bounds; WITH_SPEC.len() + gdn::BOUNDS.len()] = join(WITH_SPEC, gdn::BOUNDS);
pub const BOUNDS: &[Bounds] = &ALL_BOUNDS;

/// Sizes the HIP sources need as `STRATA_<NAME>` defines, per step kernel family.
pub const STEP_GEOMETRY: [&[(&str, usize)]; 4] = [norm::GEOMETRY, attention::GEOMETRY, route::GEOMETRY, gdn::GEOMETRY];

/// The head geometry: 256 threads (`order::HEAD_THREADS`), one block per row or per chunk, and
/// [`HEAD_SMEM_WORDS`] words of shared memory for the block reductions.
const fn head(kernel: &'static str) -> Bounds {
    Bounds { kernel, threads: crate::order::HEAD_THREADS as u32, min_blocks: 4, smem_bytes: 4 * HEAD_SMEM_WORDS }
}

/// Shared words of a head block: a value and an index per warp, and one broadcast word.
pub const HEAD_SMEM_WORDS: u32 = 2 * (crate::order::HEAD_THREADS as u32 / 32) + 1;

/// The `expdec_gu_*` entry for `format`, `r` weight rows per lane and `minb` blocks per SM.
pub fn expdec_gu_kernel(format: WeightFormat, r: u32, minb: u32) -> Option<&'static str> {
    named(&["expdec_gu_", format.tag(), "_r", digit(r)?, "_m", digit(minb)?])
}

/// The `WARP_ROWS` 8-warp `expdec_gu_*` entry for `format` (R = 1, 2 blocks per SM), where it
/// has one.
pub fn expdec_gu_warp_rows_kernel(format: WeightFormat) -> Option<&'static str> {
    named(&["expdec_gu_", format.tag(), "_r1_m2w"])
}

/// The 16-warp `expdec_gu_*` entry for `format` (R = 1, 2 blocks per SM), where it has one.
pub fn expdec_gu_w16_kernel(format: WeightFormat) -> Option<&'static str> {
    named(&["expdec_gu_", format.tag(), "_r1_w16"])
}

/// The pair `expdec_gu_*` entry for `format` ([`CLUSTER_BOUNDS`]), where it has one.
pub fn expdec_gu_pair_kernel(format: WeightFormat) -> Option<&'static str> {
    named_in(&CLUSTER_BOUNDS, &["expdec_gu_", format.tag(), "_r1_p2"])
}

/// The `expdec_down_*` entry for `format`, `dr` rows per lane and `minb` blocks per SM.
pub fn expdec_down_kernel(format: WeightFormat, dr: u32, minb: u32) -> Option<&'static str> {
    named(&["expdec_down_", format.tag(), "_d", digit(dr)?, "_m", digit(minb)?])
}

fn digit(v: u32) -> Option<&'static str> {
    ["0", "1", "2", "3", "4", "5", "6", "7", "8", "9"].get(v as usize).copied()
}

/// The table's kernel whose name is `parts` joined.
fn named(parts: &[&str]) -> Option<&'static str> {
    named_in(BOUNDS, parts)
}

/// The kernel of `table` whose name is `parts` joined.
fn named_in(table: &[Bounds], parts: &[&str]) -> Option<&'static str> {
    let is = |name: &str| {
        let mut rest = name;
        for p in parts {
            match rest.strip_prefix(p) {
                Some(r) => rest = r,
                None => return false,
            }
        }
        rest.is_empty()
    };
    table.iter().find(|b| is(b.kernel)).map(|b| b.kernel)
}

/// The bounds of `kernel`, if it is in the table.
pub fn bounds(kernel: &str) -> Option<Bounds> {
    BOUNDS.iter().chain(&CLUSTER_BOUNDS).copied().find(|b| b.kernel == kernel)
}

/// AMD waves per EU (SIMD) for `(threads, min_blocks)` on wave32 parts with 4 SIMDs per WGP:
/// a block of `threads / 32` waves spreads over the 4 SIMDs, so `min_blocks` resident blocks
/// need `ceil(threads / 128) * min_blocks` waves per SIMD (256 threads: `2 x MINB`).
pub const fn amd_waves_per_eu(threads: u32, min_blocks: u32) -> u32 {
    threads.div_ceil(128) * min_blocks
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matvec_grids() {
        // A 128-expert router: 64 weight blocks, times the activation rows.
        assert_eq!((matvec_blocks(128, 1), matvec_blocks(128, 8), matvec_blocks(129, 3)), (Some(64), Some(512), Some(195)));
        assert_eq!(matvec_blocks(1 << 29, 8), None);
        assert_eq!(matvec_blocks((1 << 29) - 2, 8), Some(i32::MAX as u32 - 7));
        assert_eq!(matvec_blocks(u32::MAX as usize, 8), None);
    }

    #[test]
    fn minimum_blocks_rule() {
        // 10 groups of 640 rows: 20, 10, 5 blocks per group at 32, 64, 128 rows per block.
        assert_eq!(rows_per_block(&EXPDEC_RB, 10, 640, 200), 32);
        assert_eq!(rows_per_block(&EXPDEC_RB, 10, 640, 100), 64);
        assert_eq!(rows_per_block(&EXPDEC_RB, 10, 640, 50), 128);
        assert_eq!(rows_per_block(&EXPDEC_RB, 10, 640, 201), 32);
        assert_eq!(rows_per_block(&EXPDEC_DRB, 80, 2560, 1600), 128);
        assert_eq!(rows_per_block(&EXPDEC_DRB, 10, 2560, 1600), 16);
        // 20 groups: 12 row slots; 24 groups: 10.
        assert_eq!((expdec_down_step_rows(20, 2), expdec_down_step_rows(24, 4)), (24, 40));
        assert_eq!(expdec_down_block_rows(64, 20, 2), 48);
        assert_eq!(expdec_down_block_rows(32, 20, 4), 48);
        assert_eq!(expdec_down_block_rows(256, 24, 1), 250);
    }

    #[test]
    fn expdec_names_are_exact() {
        assert_eq!(expdec_gu_kernel(WeightFormat::Iq2Xs, 2, 2), Some("expdec_gu_iq2_xs_r2_m2"));
        assert_eq!(expdec_gu_kernel(WeightFormat::Iq2Xs, 1, 4), Some("expdec_gu_iq2_xs_r1_m4"));
        assert_eq!(expdec_gu_kernel(WeightFormat::Iq2Xs, 2, 4), None);
        assert_eq!(expdec_gu_kernel(WeightFormat::Q8_0, 1, 2), Some("expdec_gu_q8_0_r1_m2"));
        assert_eq!(expdec_gu_kernel(WeightFormat::Q8_0, 1, 4), None);
        assert_eq!(expdec_down_kernel(WeightFormat::Q2_0, 4, 2), Some("expdec_down_q2_0_d4_m2"));
        assert_eq!(expdec_gu_kernel(WeightFormat::Iq4Nl, 1, 2), None);
        assert_eq!(expdec_gu_kernel(WeightFormat::Iq2S, 3, 2), None);
        assert_eq!(expdec_down_kernel(WeightFormat::Q2_0, 1, 3), None);
    }

    #[test]
    fn every_expdec_entry_is_in_the_table() {
        assert!(EXPDEC_GU_MINB4_FORMATS.iter().all(|f| EXPDEC_GU_FORMATS.contains(f)));
        for f in EXPDEC_GU_FORMATS {
            for r in EXPDEC_R {
                for m in EXPDEC_MINB {
                    if m == 4 && (r > EXPDEC_MINB4_MAX_R || !EXPDEC_GU_MINB4_FORMATS.contains(&f)) {
                        assert_eq!(expdec_gu_kernel(f, r, m), None);
                        continue;
                    }
                    let b = bounds(expdec_gu_kernel(f, r, m).unwrap()).unwrap();
                    assert_eq!((b.threads, b.min_blocks), (EXPDEC_THREADS, m));
                    assert!(b.kernel.starts_with("expdec_gu_") && b.kernel.contains(f.tag()), "{}", b.kernel);
                }
            }
            match expdec_gu_w16_kernel(f) {
                Some(k) => {
                    assert!(EXPDEC_GU_MINB4_FORMATS.contains(&f) && k.contains(f.tag()), "{k}");
                    assert_eq!(bounds(k).map(|b| (b.threads, b.min_blocks)), Some((EXPDEC_W16_THREADS, 2)));
                }
                None => assert!(!EXPDEC_GU_MINB4_FORMATS.contains(&f), "{} has no 16-warp gate/up entry", f.name()),
            }
        }
        for f in EXPDEC_DOWN_FORMATS {
            for d in EXPDEC_DR {
                for m in EXPDEC_MINB {
                    if m == 4 && d > EXPDEC_MINB4_MAX_DR {
                        assert_eq!(expdec_down_kernel(f, d, m), None);
                        continue;
                    }
                    assert_eq!(bounds(expdec_down_kernel(f, d, m).unwrap()).unwrap().min_blocks, m);
                }
            }
        }
    }

    #[test]
    fn moe_group_gives_every_selection_its_threads() {
        let parts = [1, 8, 9, 64, 65, 128, 129, 256].map(moe_group_parts);
        assert_eq!(parts, [32, 32, 16, 4, 2, 2, 1, 1]);
        for n in 1..=MOE_MAX_SELECTIONS as u32 {
            let p = moe_group_parts(n);
            // Adjacent lanes of one warp, every selection its own, and no more would fit.
            assert!(p.is_power_of_two() && p <= 32 && n * p <= MOE_GROUP_THREADS, "{n} selections: {p}");
            assert!(p == 32 || 2 * n * p > MOE_GROUP_THREADS, "{n} selections: {p}");
        }
    }

    #[test]
    fn waves_per_eu_rule() {
        assert_eq!(amd_waves_per_eu(256, 4), 8);
        assert_eq!(amd_waves_per_eu(256, 2), 4);
        assert_eq!(amd_waves_per_eu(128, 8), 8);
        assert_eq!(amd_waves_per_eu(32, 3), 3);
    }

    #[test]
    fn every_weight_format_has_an_mmvq_kernel() {
        for f in crate::formats::WeightFormat::MATVEC {
            assert!(bounds(f.mmvq_kernel()).is_some(), "{}", f.mmvq_kernel());
            assert!(bounds(f.mmvq1_kernel()).is_some(), "{}", f.mmvq1_kernel());
            assert!(bounds(f.mmvq1a_kernel()).is_some(), "{}", f.mmvq1a_kernel());
            assert!(bounds(f.mmvqs_kernel()).is_some(), "{}", f.mmvqs_kernel());
            // 2..8 rows staged up to 48 KiB: 8 rows of 170 groups (48,960 bytes), not 171.
            assert_eq!(mmvq_launch(f, 9000, 8, 170), MmvqLaunch { kernel: f.mmvqs_kernel(), rows_per_block: MMVQS_WARPS, smem: 48_960 });
            assert_eq!(mmvq_launch(f, 9000, 8, 171), MmvqLaunch { kernel: f.mmvq_kernel(), rows_per_block: MMVQ_WARPS, smem: 0 });
            // One row: under 16,384 rows the plain entry to 32 groups and mmvq1a_* from 33, then
            // mmvq1_*, two rows a warp for 32 or 64 groups.
            assert_eq!(mmvq_launch(f, 16383, 1, 32), MmvqLaunch { kernel: f.mmvq_kernel(), rows_per_block: MMVQ_WARPS, smem: 0 });
            assert_eq!(mmvq_launch(f, 16383, 1, 33), MmvqLaunch { kernel: f.mmvq1a_kernel(), rows_per_block: MMVQ_WARPS, smem: 0 });
            assert_eq!(mmvq_launch(f, 2048, 2, 128).kernel, f.mmvqs_kernel());
            for (groups, per_warp) in [(64, 2), (32, 2), (65, 1), (48, 1), (128, 1)] {
                assert_eq!(mmvq_launch(f, 16384, 1, groups), MmvqLaunch { kernel: f.mmvq1_kernel(), rows_per_block: per_warp * MMVQ_WARPS, smem: 0 });
            }
            assert_eq!(mmvq_launch(f, 151_936, 1, 1 << 20).kernel, f.mmvq1_kernel());
            assert_eq!(mmvq_launch(f, 9000, 2, 64).smem, 2 * 64 * 36);
        }
    }

    #[test]
    fn table_names_are_unique_and_threads_whole_warps() {
        for (i, a) in BOUNDS.iter().enumerate() {
            assert_eq!(a.threads % 32, 0, "{}", a.kernel);
            assert!(BOUNDS[i + 1..].iter().all(|b| b.kernel != a.kernel), "{}", a.kernel);
        }
    }
}
