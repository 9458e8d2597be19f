//! `expdec_gu_*`: the EXPDEC variant of `moe_gu_*`, same bits. A block takes `rb` gate/up rows
//! (`rb / 32` q8_1 groups of the SwiGLU output) of one group's expert. The group's q8_1
//! activation rows are staged in shared memory `EXPDEC_ENTRIES` entries at a time
//! (`stage`), and the format's codebook (its copy repeated a lane where it has one) once per block,
//! before the block waits for the previous grid. A lane computes `R` weight rows (1 or 2) of gate
//! and of up against the staged words, which it loads once per group and entry for all `2R`
//! rows. The first pass skips its pre-staging barrier.
//!
//! Once a block knows its expert it asks L2 for all its gate/up rows at once (a row's later
//! groups then wait on L2, not DRAM) and for its share of the expert's down rows, which the
//! next launch reads: hints, which change no value.
//!
//! A **pair** entry (`_p2`, sm_90 only) splits each 32-row chunk over the two blocks of a
//! thread-block cluster, 16 rows each: the odd block stores its SwiGLU outputs into the even
//! block's `H` (distributed shared memory), one cluster barrier, and the even block quantizes
//! the chunk. A one-token window's 192 chunks (8 experts at n_ff 768) are then 384 blocks of 8
//! warps that every SM holds two or three of, where 192 blocks of 16 warps left 72 SMs one and
//! 60 two. Each row is still one warp's, in the same order: the same bits.
//!
//! A pair block of a format with 16-byte rows (`Block::STAGED_ROWS`: IQ3_ST) copies its 16 gate
//! and 16 up rows to shared memory once it knows its expert (`cp.async`, every copy in flight at
//! once) and decodes them there, where a warp's rows otherwise wait on L2 a group of a lane at a
//! time; it asks L2 for its share of the down rows only once its own rows are in (both halves,
//! below), so that those requests do not queue ahead of its rows.
//!
//! The `WARP_ROWS` entry of such a format (the 8-warp `_m2w`, knob `EXPDEC_WARP_ROWS`, on by
//! default) copies rows warp by warp, where the other 8-warp entries load them group by group
//! from L2: each warp copies its own 4 to 16 rows through its ring of `EXPDEC_ROW_SLOTS` slots,
//! one commit group a row, and decodes a row once its group has landed while the next is still
//! in flight, then starts the row two ahead into the slot (`WarpRows`). The same loads of the
//! same bytes in the same order: the same bits. (A pair entry copying its rows that way,
//! `_p2w`, was slower than the pair's block copy and was removed: docs/kernels/moe.md.)
//!
//! Shared words, for `G = n_embd / 32`: the stage (`36 G`), the SwiGLU outputs `H[4][rb]`, the
//! codebook and a pair block's staged rows (`launch::expdec_gu_smem`, `expdec_gu_pair_smem`,
//! given at launch). A repeated codebook comes first instead (where the signed expansion it
//! replaced saved an add a word at word 0; docs/kernels/moe.md); other codebooks follow H
//! (moved first, three of their 64-register entries spilled), and the staged rows come last.
use super::blocks::{self, Block, Bytes, Shared};
use super::stage;
use super::mmvq::contribution_words;
use super::moe::{group_of, ld};
use super::quantize_q8_1::quantize_group;
use crate::arch::mem::Smem;
use crate::arch::{index, mem, sync, warp};
#[cfg(target_feature = "sm_90")]
use crate::arch::cluster;
use strata_gpu_shared::formats::q8_1;
use strata_gpu_shared::launch::{EXPDEC_ENTRIES, EXPDEC_PAIR, EXPDEC_RB, EXPDEC_ROW_SLOTS, EXPDEC_THREADS, EXPDEC_W16_THREADS, MOE_GU_ROWS};
use strata_gpu_shared::moe;

/// A warp's own gate and up rows, copied to its ring of `EXPDEC_ROW_SLOTS` slots in shared
/// memory (a slot: the gate row, then the up row) by the warp's lanes, `EXPDEC_ROW_SLOTS` rows
/// ahead of the row the warp decodes: one commit group a row, so the warp waits for one row
/// while the next is still in flight. Only the warp reads and writes its slots, so warp
/// barriers order them.
struct WarpRows {
    /// Shared address of the warp's first slot (16-byte aligned).
    slots: u32,
    /// The warp's first gate and up rows.
    gate: *const u8,
    up: *const u8,
    /// Bytes of a row (a multiple of 16: whole 16-byte units of a `STAGED_ROWS` format).
    row_bytes: usize,
    /// The warp's rows.
    rows: u32,
}

impl WarpRows {
    /// Starts the copies of the first `EXPDEC_ROW_SLOTS` rows.
    #[inline(always)]
    unsafe fn start(&self) {
        let mut j = 0;
        while j < EXPDEC_ROW_SLOTS {
            self.copy(j);
            j += 1;
        }
    }

    /// Waits for the oldest row not yet waited for (the one a slot ahead may still be in
    /// flight) and shows every lane's copies of it to the warp.
    #[inline(always)]
    fn wait(&self) {
        mem::cp_async_wait_groups::<{ EXPDEC_ROW_SLOTS - 1 }>();
        sync::sync_warp();
    }

    /// Once every lane has read row `j`'s slot: row `j + EXPDEC_ROW_SLOTS` into it.
    #[inline(always)]
    unsafe fn next(&self, j: u32) {
        sync::sync_warp();
        self.copy(j + EXPDEC_ROW_SLOTS);
    }

    /// The shared address of row `j`'s slot.
    #[inline(always)]
    fn slot(&self, j: u32) -> u32 {
        self.slots + j % EXPDEC_ROW_SLOTS * 2 * self.row_bytes as u32
    }

    /// Row `j`'s copies, 16 bytes a lane at a time (none past the warp's rows), then a commit:
    /// one group a row, empty past the last, so `wait` always leaves the newest in flight.
    #[inline(always)]
    unsafe fn copy(&self, j: u32) {
        if j < self.rows {
            let (to, from) = (self.slot(j), j as usize * self.row_bytes);
            let mut i = 16 * index::lane() as usize;
            while i < self.row_bytes {
                // SAFETY: `to + i` is inside the warp's slots (`launch::expdec_gu_ring_bytes`
                // a block), `from + i` inside the warp's rows; both 16-byte aligned (rows of whole
                // 16-byte units); the slot's previous row was read before `next`'s barrier.
                mem::cp_async_16(to + i as u32, self.gate.add(from + i));
                mem::cp_async_16(to + (self.row_bytes + i) as u32, self.up.add(from + i));
                i += 16 * 32;
            }
        }
        mem::cp_async_commit();
    }
}

/// `R` gate rows and `R` up rows starting at `row` against the `m` staged entries: this lane's
/// partials `[row][entry]` for gate and up (the mmvq spec: groups `lane, lane + 32, ...`, left
/// to right from +0.0).
///
/// Where `F`'s blocks have a multiple of 32 groups, the walk goes a block at a time with the
/// lane's `GROUPS / 32` groups in it unrolled, so that their fields' offsets are constants of
/// the loop (about 6 % fewer instructions a group of IQ3_ST's gate and up), where the entry
/// asks for it (`UNROLL`: `R = 1` in 128 registers, or in a pair entry's 80 with `m` the
/// constant 1; a 64-register one spills with it).
#[inline(always)]
unsafe fn staged_partials<F: Block, S: Bytes, const R: usize, const UNROLL: bool>(
    smem: Smem,
    grid: blocks::Staged,
    gate: S,
    up: S,
    row_bytes: usize,
    row: usize,
    m: u32,
    groups: u32,
) -> ([[f32; 4]; R], [[f32; 4]; R]) {
    let pow2 = f32::from_bits((127 - F::SHIFT) << 23);
    let (mut ag, mut au) = ([[0.0f32; 4]; R], [[0.0f32; 4]; R]);
    // Group `b` of the rows, group `g` of the block `block` bytes into each row. (A macro, not a
    // closure: the 64-register entries spilled with the closure's code.)
    macro_rules! add_group {
        ($block:expr, $g:expr, $b:expr) => {{
            let (block, g, b) = ($block, $g, $b);
            let at = |base: S, j: usize| base.at((row + j) * row_bytes + block);
            let gw: [blocks::Group; R] = core::array::from_fn(|j| F::load_with(at(gate, j), g, grid));
            let uw: [blocks::Group; R] = core::array::from_fn(|j| F::load_with(at(up, j), g, grid));
            crate::unroll!(r in [0, 1, 2, 3] {
                if (r as u32) < m {
                    let (q, dx) = stage::block(smem, r as u32, b, groups, EXPDEC_ENTRIES);
                    crate::unroll!(j in [0, 1] {
                        if j < R {
                            ag[j][r] += contribution_words::<F>(&gw[j], &q, dx, pow2);
                            au[j][r] += contribution_words::<F>(&uw[j], &q, dx, pow2);
                        }
                    });
                }
            });
        }};
    }
    const { assert!(!UNROLL || R == 1) }; // (two rows a lane unrolled would not fit)
    let lane = index::lane();
    if F::GROUPS % 32 == 0 && UNROLL {
        const { assert!(!UNROLL || F::GROUPS % 32 != 0 || F::GROUPS <= 64) }; // (the unrolled list)
        let mut start = 0; // the block's first group
        while start < groups {
            let block = F::block_offset(start);
            crate::unroll!(k in [0, 1] {
                if (k as u32) < F::GROUPS / 32 {
                    let g = lane + 32 * k as u32;
                    add_group!(block, g, start + g);
                }
            });
            start += F::GROUPS;
        }
    } else {
        let mut b = lane;
        while b < groups {
            add_group!(F::block_offset(b), b % F::GROUPS, b);
            b += 32;
        }
    }
    (ag, au)
}

/// Who computes a 32-row q8_1 chunk of the SwiGLU output: one block ([`Whole`]) or the two
/// blocks of a cluster, 16 rows each ([`Pair`]).
trait Chunk {
    /// Blocks a chunk is split over.
    const BLOCKS: u32;
    /// This block's part of its chunk, `0..BLOCKS`.
    fn part() -> u32;
    /// Orders the `H` stores of every part before the quantizing part reads them (and its
    /// reads before the next pass's stores).
    fn sync();
    /// [`Self::sync`] in two halves, at the start and before the first `H` store: a block may
    /// write its partner's shared memory only once the partner has started.
    fn arrive();
    fn wait();
    /// Stores SwiGLU output `v` at word `word` of the quantizing part's `H` (part 0's).
    unsafe fn store_h(smem: Smem, word: u32, v: u32);
}

struct Whole;
impl Chunk for Whole {
    const BLOCKS: u32 = 1;
    #[inline(always)]
    fn part() -> u32 {
        0
    }
    #[inline(always)]
    fn sync() {
        sync::sync_lds();
    }
    #[inline(always)]
    fn arrive() {}
    #[inline(always)]
    fn wait() {}
    #[inline(always)]
    unsafe fn store_h(smem: Smem, word: u32, v: u32) {
        smem.st_u32(word, v);
    }
}

#[cfg(target_feature = "sm_90")]
struct Pair;
#[cfg(target_feature = "sm_90")]
impl Chunk for Pair {
    const BLOCKS: u32 = EXPDEC_PAIR;
    #[inline(always)]
    fn part() -> u32 {
        cluster::rank()
    }
    #[inline(always)]
    fn sync() {
        cluster::sync();
    }
    #[inline(always)]
    fn arrive() {
        cluster::arrive();
    }
    #[inline(always)]
    fn wait() {
        cluster::wait();
    }
    #[inline(always)]
    unsafe fn store_h(smem: Smem, word: u32, v: u32) {
        smem.st_u32_cluster(0, word, v);
    }
}

/// Asks for half `h` of a pair block's `rows` gate rows (from `gate`) and up rows (from `up`):
/// every second row from row `h`, as 16-byte copies spread over the block's threads, each row
/// to its place in shared memory at `at` (the gate rows, then the up rows).
///
/// # Safety
/// As [`mem::cp_async_16`] for every copy: `rows` rows of `row_bytes` (a multiple of 16) from
/// `gate` and `up`, 16-byte aligned, `2 * rows * row_bytes` bytes of shared memory from `at`.
#[inline(always)]
unsafe fn copy_half_rows<const THREADS: u32>(at: u32, gate: *const u8, up: *const u8, row_bytes: usize, rows: u32, h: u32) {
    let units = row_bytes / 16; // a row's 16-byte copies
    let part_bytes = rows as usize * row_bytes;
    let mut u = index::thread_idx() as usize;
    while u < rows.div_ceil(2) as usize * units {
        let i = (2 * (u / units) + h as usize) * row_bytes + 16 * (u % units);
        if i < part_bytes {
            mem::cp_async_16(at + i as u32, gate.add(i));
            mem::cp_async_16(at + (part_bytes + i) as u32, up.add(i));
        }
        u += THREADS as usize;
    }
}

/// The body of every `expdec_gu_*` entry: `moe_gu`'s contract and output, with `rb` rows per
/// block (a multiple of `MOE_GU_ROWS`, at most `4 * MOE_GU_ROWS`; for a pair, `MOE_GU_ROWS`
/// per cluster) and `THREADS` threads a block, each warp taking `rb / C::BLOCKS / (THREADS /
/// 32)` rows. `down`, `down_bytes`: the layer's down matrices and the bytes of one expert's
/// (prefetched only).
#[inline(always)]
unsafe fn expdec_gu<F: Block, C: Chunk, const R: usize, const THREADS: u32, const WARP_ROWS: bool, const SPREAD: bool, const UNROLL: bool>(
    gate: *const u8,
    up: *const u8,
    expert_bytes: u64,
    xq: *const u8,
    table: *const u32,
    n: u32,
    k: u32,
    groups: u32,
    n_ff: u32,
    rb: u32,
    down: *const u8,
    down_bytes: u64,
    hq: *mut u8,
) {
    // This block has started: its partner may write its H once it waited. First, so that the
    // arrive's release has no memory operation before it to wait for. (A pair's blocks leave
    // early together or not at all: no thread waits for a block that left.)
    C::arrive();
    // A pair's rows are one chunk (its launch passes that too): a constant frees a register.
    let rb = if C::BLOCKS > 1 { MOE_GU_ROWS } else { rb };
    // The codebook is a module constant: staged while the previous grid drains, before the
    // wait; the first pass's post-staging barrier orders it before its readers.
    let h_base = stage::expdec_words(groups);
    let h_end = h_base + EXPDEC_ENTRIES * rb;
    let (grid, smem) = if F::LANE_GRID {
        (stage::grid::<F, THREADS, SPREAD>(Smem::dynamic(), 0), Smem::dynamic().from_word(stage::grid_words::<F>()))
    } else {
        (stage::grid::<F, THREADS, SPREAD>(Smem::dynamic(), h_end), Smem::dynamic())
    };
    sync::chain_grids();
    let chunks = n_ff / MOE_GU_ROWS;
    let per_block = rb / MOE_GU_ROWS;
    let blocks_per_group = chunks.div_ceil(per_block);
    // `b` counts chunks of `rb` rows; a pair's two blocks share one (clusters tile the grid in
    // order, so the part is also `block_idx() % 2`).
    let (b, part) = (index::block_idx() / C::BLOCKS, C::part());
    let Some((expert, start, count)) = group_of(table, n, b / blocks_per_group) else { return }; // whole block (a pair's both)
    crate::trace_mark!(1, "expert");
    let chunk0 = b % blocks_per_group * per_block;
    let mine = per_block.min(chunks - chunk0);
    // This block's rows of its `mine` chunks: all of them, or its part's half.
    let part_rows = mine * MOE_GU_ROWS / C::BLOCKS;
    let row_bytes = F::row_bytes(groups);
    let (gate, up) = (gate.add(expert as usize * expert_bytes as usize), up.add(expert as usize * expert_bytes as usize));
    let rows = (chunk0 * MOE_GU_ROWS + part * part_rows) as usize * row_bytes;
    let part_bytes = part_rows as usize * row_bytes;
    let warp = index::warp_in_block();
    let warps = THREADS / 32;
    let rows_per_warp = rb / C::BLOCKS / warps;
    let first = warp * rows_per_warp; // this warp's first row in the block's part, inside one chunk
    // A pair block of a format with 16-byte rows copies its gate and up rows to shared memory
    // in two halves, each a row of every warp, and decodes them there; other blocks ask L2 for
    // theirs.
    // With `WARP_ROWS` (such a format, an 8-warp block) each warp copies its own rows instead,
    // two ahead, and starts on a row as soon as it has landed (`WarpRows`).
    // (`launch::expdec_gu_ring_bytes` sizes the slots for blocks of `EXPDEC_THREADS`.)
    const { assert!(!WARP_ROWS || F::STAGED_ROWS && R == 1 && THREADS == EXPDEC_THREADS && C::BLOCKS == 1) };
    let block_copy = C::BLOCKS > 1 && F::STAGED_ROWS; // (never with `WARP_ROWS`: asserted above)
    let rows_at = smem.addr(h_end + if F::LANE_GRID { 0 } else { stage::grid_words::<F>() });
    let ring = WarpRows {
        slots: rows_at + warp * EXPDEC_ROW_SLOTS * 2 * row_bytes as u32,
        gate: gate.wrapping_add(rows + first as usize * row_bytes),
        up: up.wrapping_add(rows + first as usize * row_bytes),
        row_bytes,
        rows: if first < part_rows { rows_per_warp } else { 0 },
    };
    if WARP_ROWS {
        ring.start();
    }
    if block_copy {
        // Whole 16-byte copies: a STAGED_ROWS format's blocks are whole 16-byte units from
        // 16-byte aligned rows, so the part's rows are too, inside the expert's matrix; the
        // shared area is 16-byte aligned (the stage, H and the codebook are multiples of 4
        // words) and `expdec_gu_pair_smem` bytes long, and nothing reads it before the wait below.
        // The first half's rows now, the second's once the first has landed (below): the
        // memory system then serves every block's first half first, and the warps decode
        // their first rows while the second half lands.
        const { assert!(!F::STAGED_ROWS || F::BYTES % 16 == 0) };
        const { assert!(C::BLOCKS == 1 || !F::STAGED_ROWS || R == 1 && MOE_GU_ROWS / C::BLOCKS / (THREADS / 32) == 2) };
        copy_half_rows::<THREADS>(rows_at, gate.add(rows), up.add(rows), row_bytes, part_rows, 0);
    } else {
        mem::prefetch_l2_block::<THREADS>(gate.wrapping_add(rows), part_bytes);
        mem::prefetch_l2_block::<THREADS>(up.wrapping_add(rows), part_bytes);
    }
    // (In 32 bits: one expert's down rows are far below 4 GiB, and a 64-bit division is a
    // subroutine whose registers made other entries spill.)
    let down_bytes = down_bytes as u32;
    let share = down_bytes.div_ceil(blocks_per_group * C::BLOCKS);
    let first_down = ((b % blocks_per_group * C::BLOCKS + part) * share).min(down_bytes);
    let down = down.wrapping_add(expert as usize * down_bytes as usize + first_down as usize);
    let down_share = share.min(down_bytes - first_down) as usize;
    if !block_copy {
        mem::prefetch_l2_block::<THREADS>(down, down_share);
    }
    let entries = table.add(moe::entries(n as usize) + start as usize);
    let mut pass = 0;
    while pass < count {
        if pass > 0 {
            C::sync(); // the previous pass's readers are done with the stage and H
            if WARP_ROWS {
                ring.start(); // the rows again, for this pass's entries
            }
        }
        let m = (count - pass).min(EXPDEC_ENTRIES);
        stage::rows::<THREADS>(smem, |r| xq.add((ld(entries, (pass + r) as usize) / k) as usize * groups as usize * q8_1::BYTES), m, groups, EXPDEC_ENTRIES);
        if block_copy {
            mem::cp_async_wait_all(); // the rows, before the barrier that shows them to the block
        }
        sync::sync_lds();
        crate::trace_mark!(2, "staged");
        if block_copy && pass == 0 {
            copy_half_rows::<THREADS>(rows_at, gate.add(rows), up.add(rows), row_bytes, part_rows, 1);
        }
        if pass == 0 {
            C::wait(); // the partner has started (it arrived long before; no wait in practice)
        }
        let mut j0 = 0;
        while first < part_rows && j0 < rows_per_warp {
            let local = part * part_rows + first + j0; // the row in the block's chunks
            if block_copy && pass == 0 && j0 == 1 {
                // The second half: every thread's copies, then the barrier that shows them to
                // the block (every warp of a copying block has its two rows: asserted above).
                mem::cp_async_wait_all();
                sync::sync_lds();
                // The down rows once the block's own rows are all in, so that those requests
                // do not share the memory system with the second half's (tg128 +1.3 % on an
                // H100 against asking with the second half; never asking, -1.4 %).
                mem::prefetch_l2_block::<THREADS>(down, down_share);
            }
            if WARP_ROWS {
                ring.wait();
            }
            // An `UNROLL` entry walks a pass of one entry (every pass of a one-token window, most
            // of a window's) with that entry a constant; a pair entry walks its other passes
            // plainly (unrolled, they spilled).
            macro_rules! partials {
                ($gate:expr, $up:expr, $row:expr) => {
                    if UNROLL && m == 1 {
                        staged_partials::<F, _, R, UNROLL>(smem, grid, $gate, $up, row_bytes, $row, 1, groups)
                    } else if C::BLOCKS == 1 {
                        staged_partials::<F, _, R, UNROLL>(smem, grid, $gate, $up, row_bytes, $row, m, groups)
                    } else {
                        staged_partials::<F, _, R, false>(smem, grid, $gate, $up, row_bytes, $row, m, groups)
                    }
                };
            }
            let (ag, au) = if WARP_ROWS {
                let slot = ring.slot(j0);
                partials!(Shared(slot), Shared(slot + row_bytes as u32), 0)
            } else if block_copy {
                let row = (first + j0) as usize; // the row in the copy of the part's rows
                partials!(Shared(rows_at), Shared(rows_at + part_bytes as u32), row)
            } else {
                partials!(gate, up, (chunk0 * MOE_GU_ROWS + local) as usize)
            };
            if WARP_ROWS {
                ring.next(j0); // the warp has read this row's slot: the row two ahead goes there
            }
            crate::unroll!(j in [0, 1] {
                if j < R {
                    crate::unroll!(r in [0, 1, 2, 3] {
                        if (r as u32) < m {
                            let h = moe::swiglu(warp::warp_sum_f32(ag[j][r]), warp::warp_sum_f32(au[j][r]));
                            if index::lane() == 0 {
                                C::store_h(smem, h_base + r as u32 * rb + local + j as u32, h.to_bits());
                            }
                        }
                    });
                }
            });
            j0 += R as u32;
        }
        crate::trace_mark!(3, "decoded");
        C::sync();
        crate::trace_mark!(4, "paired");
        // One warp per (entry, chunk) of part 0 quantizes that chunk's 32 SwiGLU outputs.
        let mut i = if part == 0 { warp } else { m * mine };
        while i < m * mine {
            let (r, c) = (i / mine, i % mine);
            let e = ld(entries, (pass + r) as usize);
            let v = f32::from_bits(smem.ld_u32(h_base + r * rb + c * MOE_GU_ROWS + index::lane()));
            quantize_group(v, hq.add((e as usize * chunks as usize + (chunk0 + c) as usize) * q8_1::BYTES));
            i += warps;
        }
        pass += EXPDEC_ENTRIES;
    }
}

/// One entry per format, rows per lane, warps a block and minimum blocks per SM (the launch
/// bounds come from the gpu-shared table by name: `_m<MINB>` entries are blocks of
/// `EXPDEC_THREADS`, 4 blocks per SM only with R=1 and an IQ format, `EXPDEC_MINB4_MAX_R` and
/// `EXPDEC_GU_MINB4_FORMATS`; `_w16` entries blocks of 16 warps at 2 blocks per SM, R=1 and the
/// same formats: `EXPDEC_W16_THREADS`).
macro_rules! expdec_gu_entries {
    ($($name:ident => $block:ty, $r:literal, $threads:expr $(, warp_rows = $warp_rows:literal)? $(, spread = $spread:literal)?$(, unroll = $unroll:literal)?;)*) => {$(
        $crate::entry! {
            /// EXPDEC gate/up. Launch as `moe_gu_*` but with `n * ceil(n_ff / rb)` blocks of the
            /// entry's threads and `launch::expdec_gu_smem` bytes of shared memory.
            ///
            /// # Safety
            /// As `moe_gu_*`; `rb` is one of `launch::EXPDEC_RB`; blocks of the entry's threads;
            /// `down`: `n_expert` matrices of `down_bytes` each (only prefetched, never loaded).
            pub unsafe fn $name(gate: *const u8, up: *const u8, expert_bytes: u64, xq: *const u8, table: *const u32, n: u32, k: u32, groups: u32, n_ff: u32, rb: u32, down: *const u8, down_bytes: u64, hq: *mut u8) {
                expdec_gu::<$block, Whole, $r, { $threads }, { false $(|| $warp_rows)? }, { true $(&& $spread)? }, { false $(|| $unroll)? }>(gate, up, expert_bytes, xq, table, n, k, groups, n_ff, rb, down, down_bytes, hq)
            }
        }
    )*};
}

/// The pair entries (sm_90: `launch::CLUSTER_BOUNDS`, clusters of `EXPDEC_PAIR` blocks of
/// `EXPDEC_THREADS`, R = 1, 4 blocks per SM, IQ3_ST's 3), one per format of
/// `EXPDEC_GU_MINB4_FORMATS`. IQ3_ST's walks its passes of one entry (every pass of a one-token
/// window) with the entry count a constant (`unroll = true`: one entry's loads and sums, the
/// lane's groups unrolled); the others, at 64 registers, spilled with that in the timeline build.
macro_rules! expdec_gu_pair_entries {
    ($($name:ident => $block:ty $(, unroll = $unroll:literal)?;)*) => {$(
        $crate::entry! {
            /// EXPDEC gate/up, each 32-row chunk split over a cluster's two blocks. Launch as the
            /// other entries with `rb` = `MOE_GU_ROWS` and `EXPDEC_PAIR` blocks a chunk:
            /// `2 n (n_ff / 32)` blocks of `EXPDEC_THREADS`.
            ///
            /// # Safety
            /// As the other `expdec_gu_*` entries, with `rb` = `MOE_GU_ROWS`; launched as clusters
            /// of `EXPDEC_PAIR` blocks along x (the PTX header asks for them), so every block's
            /// partner runs and the grid is a whole number of pairs.
            #[cfg(target_feature = "sm_90")]
            pub unsafe fn $name(gate: *const u8, up: *const u8, expert_bytes: u64, xq: *const u8, table: *const u32, n: u32, k: u32, groups: u32, n_ff: u32, rb: u32, down: *const u8, down_bytes: u64, hq: *mut u8) {
                expdec_gu::<$block, Pair, 1, EXPDEC_THREADS, false, true, { false $(|| $unroll)? }>(gate, up, expert_bytes, xq, table, n, k, groups, n_ff, rb, down, down_bytes, hq)
            }
        }
    )*};
}

expdec_gu_entries! {
    expdec_gu_q8_0_r1_m2 => blocks::Q8_0, 1, EXPDEC_THREADS; expdec_gu_q8_0_r2_m2 => blocks::Q8_0, 2, EXPDEC_THREADS;
    expdec_gu_iq2_xxs_r1_m2 => blocks::Iq2Xxs, 1, EXPDEC_THREADS; expdec_gu_iq2_xxs_r1_m4 => blocks::Iq2Xxs, 1, EXPDEC_THREADS;
    expdec_gu_iq2_xxs_r2_m2 => blocks::Iq2Xxs, 2, EXPDEC_THREADS; expdec_gu_iq2_xxs_r1_w16 => blocks::Iq2Xxs, 1, EXPDEC_W16_THREADS;
    expdec_gu_iq2_xs_r1_m2 => blocks::Iq2Xs, 1, EXPDEC_THREADS; expdec_gu_iq2_xs_r1_m4 => blocks::Iq2Xs, 1, EXPDEC_THREADS;
    expdec_gu_iq2_xs_r2_m2 => blocks::Iq2Xs, 2, EXPDEC_THREADS; expdec_gu_iq2_xs_r1_w16 => blocks::Iq2Xs, 1, EXPDEC_W16_THREADS;
    expdec_gu_iq2_s_r1_m2 => blocks::Iq2S, 1, EXPDEC_THREADS; expdec_gu_iq2_s_r1_m4 => blocks::Iq2S, 1, EXPDEC_THREADS;
    expdec_gu_iq2_s_r2_m2 => blocks::Iq2S, 2, EXPDEC_THREADS; expdec_gu_iq2_s_r1_w16 => blocks::Iq2S, 1, EXPDEC_W16_THREADS;
    expdec_gu_iq3_xxs_r1_m2 => blocks::Iq3Xxs, 1, EXPDEC_THREADS; expdec_gu_iq3_xxs_r1_m4 => blocks::Iq3Xxs, 1, EXPDEC_THREADS;
    expdec_gu_iq3_xxs_r2_m2 => blocks::Iq3Xxs, 2, EXPDEC_THREADS; expdec_gu_iq3_xxs_r1_w16 => blocks::Iq3Xxs, 1, EXPDEC_W16_THREADS;
    expdec_gu_iq3_s_r1_m2 => blocks::Iq3S, 1, EXPDEC_THREADS; expdec_gu_iq3_s_r1_m4 => blocks::Iq3S, 1, EXPDEC_THREADS;
    expdec_gu_iq3_s_r2_m2 => blocks::Iq3S, 2, EXPDEC_THREADS; expdec_gu_iq3_s_r1_w16 => blocks::Iq3S, 1, EXPDEC_W16_THREADS;
    // The 64-register IQ3_ST entries read the first copy of the repeated codebook: each lane's
    // offset in a register made them spill on sm_80 (`stage::grid`). The 128-register ones walk a
    // lane's two groups of a tile unrolled, and passes of one entry with the entry a constant
    // (`UNROLL`; the others spill with it).
    expdec_gu_iq3_st_r1_m2 => blocks::Iq3ST, 1, EXPDEC_THREADS, unroll = true; expdec_gu_iq3_st_r1_m4 => blocks::Iq3ST, 1, EXPDEC_THREADS, spread = false;
    expdec_gu_iq3_st_r2_m2 => blocks::Iq3ST, 2, EXPDEC_THREADS; expdec_gu_iq3_st_r1_w16 => blocks::Iq3ST, 1, EXPDEC_W16_THREADS, spread = false;
    // Each warp copying its own rows (`EXPDEC_WARP_ROWS`): formats whose rows are staged only.
    expdec_gu_iq3_st_r1_m2w => blocks::Iq3ST, 1, EXPDEC_THREADS, warp_rows = true, unroll = true;
}

expdec_gu_pair_entries! {
    expdec_gu_iq2_xxs_r1_p2 => blocks::Iq2Xxs; expdec_gu_iq2_xs_r1_p2 => blocks::Iq2Xs; expdec_gu_iq2_s_r1_p2 => blocks::Iq2S;
    expdec_gu_iq3_xxs_r1_p2 => blocks::Iq3Xxs; expdec_gu_iq3_s_r1_p2 => blocks::Iq3S; expdec_gu_iq3_st_r1_p2 => blocks::Iq3ST, unroll = true;
}

// Four staged entries and R <= 2 (the unrolled loops list them); every `rb` splits into whole
// R steps per warp (R = 2 at 8 warps, R = 1 at 16), and a warp's rows stay inside one q8_1 chunk.
const _: () = {
    let (w8, w16) = (EXPDEC_THREADS / 32, EXPDEC_W16_THREADS / 32);
    assert!(EXPDEC_ENTRIES == 4 && w8 == 8 && w16 == 16);
    assert!(EXPDEC_RB[0] / w8 % 2 == 0 && MOE_GU_ROWS % (EXPDEC_RB[2] / w8) == 0 && MOE_GU_ROWS % (EXPDEC_RB[2] / w16) == 0);
    // A pair's block takes half a chunk, whole rows a warp.
    assert!(MOE_GU_ROWS % (EXPDEC_PAIR * w8) == 0);
};
