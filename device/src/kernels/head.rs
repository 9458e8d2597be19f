//! The sampler head: `argmax_rows` (greedy pick) and `row_top_prob` (probability of the maximum,
//! for draft acceptance) over f32 logits, each as a one-block-per-row reference and as a split
//! kernel (one block per `HEAD_CHUNK` elements of a row, then a pass over the chunks). Specs:
//! `strata_gpu_shared::order`. Launch: `HEAD_THREADS` threads and `HEAD_SMEM_WORDS` shared
//! words per block.
use crate::arch::mem::Smem;
use crate::arch::{index, mem, sync, warp};
use strata_gpu_shared::launch::{HEAD_AHEAD, HEAD_CHUNK};
use strata_gpu_shared::order::{argmax_better, top_prob_term, HEAD_THREADS};

const WARPS: u32 = HEAD_THREADS as u32 / 32;
/// Index of a "no element yet" candidate: loses to every real one (a NaN with the largest index).
pub(crate) const NONE: u32 = u32::MAX;

/// The (row, chunk) a split block covers: the row's logits and the chunk's element range, or
/// `None` for a block past the real work (padded grids).
#[inline(always)]
unsafe fn split_block(x: *const f32, n: u32, rows: u32, chunks: u32) -> Option<(u32, *const f32, u32, u32)> {
    let b = index::block_idx();
    if b >= rows * chunks {
        return None;
    }
    let (row, c) = (b / chunks, b % chunks);
    let start = c * HEAD_CHUNK as u32;
    Some((row, x.add(row as usize * n as usize), start, (start + HEAD_CHUNK as u32).min(n)))
}

#[inline(always)]
pub(crate) unsafe fn ld_f32(p: *const f32, i: usize) -> f32 {
    f32::from_bits(mem::ld_nc_u32(p.add(i) as *const u8))
}

/// Folds `(v, i)` into the running best.
#[inline(always)]
pub(crate) fn keep_better(best: &mut (f32, u32), v: f32, i: u32) {
    if argmax_better(v, i, best.0, best.1) {
        *best = (v, i);
    }
}

/// The warp's best candidate, the same in every lane. Every lane of the warp must call it.
#[inline(always)]
fn warp_best(mut best: (f32, u32)) -> (f32, u32) {
    let mut o = 16;
    while o > 0 {
        let v = warp::shfl_xor_f32(best.0, o);
        let i = warp::shfl_xor_u32(best.1, o);
        keep_better(&mut best, v, i);
        o >>= 1;
    }
    best
}

/// The block's best candidate, valid in thread 0. Every thread of the block must call it; it
/// uses shared words `0 .. 2 * WARPS`.
#[inline(always)]
pub(crate) unsafe fn block_best(best: (f32, u32)) -> (f32, u32) {
    let mut best = warp_best(best);
    let smem = Smem::dynamic();
    let w = index::warp_in_block();
    if index::lane() == 0 {
        smem.st_u32(2 * w, best.0.to_bits());
        smem.st_u32(2 * w + 1, best.1);
    }
    sync::sync_threads();
    if index::thread_idx() == 0 {
        for w in 1..WARPS {
            keep_better(&mut best, f32::from_bits(smem.ld_u32(2 * w)), smem.ld_u32(2 * w + 1));
        }
    }
    best
}

/// The best of `x[start..end]` (indices absolute), valid in thread 0.
#[inline(always)]
unsafe fn range_best(x: *const f32, start: u32, end: u32) -> (f32, u32) {
    const T: u32 = HEAD_THREADS as u32;
    let mut best = (f32::NAN, NONE);
    let mut j = start + index::thread_idx();
    // `HEAD_AHEAD` loads in flight, then folded in the order of their indices (any order gives
    // the same best: `argmax_better` is a total order).
    while j < end {
        let v: [f32; HEAD_AHEAD as usize] = core::array::from_fn(|u| {
            let i = j + T * u as u32;
            if i < end { ld_f32(x, i as usize) } else { f32::NAN }
        });
        for (u, v) in v.into_iter().enumerate() {
            let i = j + T * u as u32;
            if i < end {
                keep_better(&mut best, v, i);
            }
        }
        j += T * HEAD_AHEAD;
    }
    block_best(best)
}

crate::entry! {
    /// One block per row (blocks past `rows`, from a padded grid, return at once).
    ///
    /// # Safety
    /// `x`: `rows * n` f32 (`n >= 1`), `idx` and `flag`: `rows` u32.
    pub unsafe fn argmax_rows_ref(x: *const f32, n: u32, rows: u32, idx: *mut u32, flag: *mut u32) {
        crate::arch::sync::chain_grids();
        if index::block_idx() >= rows {
            return; // the whole block
        }
        let row = index::block_idx() as usize;
        let best = range_best(x.add(row * n as usize), 0, n);
        if index::thread_idx() == 0 {
            *idx.add(row) = best.1;
            *flag.add(row) = best.0.is_nan() as u32;
        }
    }
}

crate::entry! {
    /// One block per (row, chunk) of `HEAD_CHUNK` elements: each chunk's best into the scratch.
    ///
    /// # Safety
    /// `x`: `rows * n` f32; `part_val`, `part_idx`: `rows * chunks`; at least `rows * chunks`
    /// blocks, `chunks = ceil(n / HEAD_CHUNK)`.
    pub unsafe fn argmax_rows_split(x: *const f32, n: u32, rows: u32, chunks: u32, part_val: *mut f32, part_idx: *mut u32) {
        crate::arch::sync::chain_grids();
        let Some((_, xr, start, end)) = split_block(x, n, rows, chunks) else { return }; // whole block
        let best = range_best(xr, start, end);
        if index::thread_idx() == 0 {
            *part_val.add(index::block_idx() as usize) = best.0;
            *part_idx.add(index::block_idx() as usize) = best.1;
        }
    }
}

crate::entry! {
    /// One block per row: the best of the row's chunk results.
    ///
    /// # Safety
    /// As `argmax_rows_split`'s scratch; `idx`, `flag`: `rows` u32; at least `rows` blocks.
    pub unsafe fn argmax_rows_final(part_val: *const f32, part_idx: *const u32, rows: u32, chunks: u32, idx: *mut u32, flag: *mut u32) {
        crate::arch::sync::chain_grids();
        let row = index::block_idx();
        if row >= rows {
            return; // the whole block
        }
        let base = (row * chunks) as usize;
        let mut best = (f32::NAN, NONE);
        let mut c = index::thread_idx();
        while c < chunks {
            keep_better(&mut best, ld_f32(part_val, base + c as usize), mem::ld_nc_u32(part_idx.add(base + c as usize) as *const u8));
            c += HEAD_THREADS as u32;
        }
        let best = block_best(best);
        if index::thread_idx() == 0 {
            *idx.add(row as usize) = best.1;
            *flag.add(row as usize) = best.0.is_nan() as u32;
        }
    }
}

/// maxNum of `x[start..end]`, the same in every thread of the block.
#[inline(always)]
unsafe fn range_max(x: *const f32, start: u32, end: u32) -> f32 {
    let mut m = f32::NEG_INFINITY;
    let mut j = start + index::thread_idx();
    while j < end {
        m = m.max(ld_f32(x, j as usize));
        j += HEAD_THREADS as u32;
    }
    m = warp::warp_max_f32(m);
    let smem = Smem::dynamic();
    if index::lane() == 0 {
        smem.st_u32(index::warp_in_block(), m.to_bits());
    }
    sync::sync_threads();
    let mut all = f32::NEG_INFINITY;
    for w in 0..WARPS {
        all = all.max(f32::from_bits(smem.ld_u32(w)));
    }
    sync::sync_threads(); // the words are reused by the caller's next reduction
    all
}

/// The chunk at `x[start..end]`'s term sum in the spec's order, valid in thread 0. Every thread
/// of the block must call it; it leaves the shared words free again.
#[inline(always)]
unsafe fn chunk_sum(x: *const f32, start: u32, end: u32, m: f32) -> f32 {
    let mut s = 0.0f32;
    let mut j = start + index::thread_idx();
    while j < end {
        s += top_prob_term(ld_f32(x, j as usize), m);
        j += HEAD_THREADS as u32;
    }
    s = warp::warp_sum_f32(s);
    let smem = Smem::dynamic();
    if index::lane() == 0 {
        smem.st_u32(index::warp_in_block(), s.to_bits());
    }
    sync::sync_threads();
    let mut total = 0.0f32;
    if index::thread_idx() == 0 {
        for w in 0..WARPS {
            total += f32::from_bits(smem.ld_u32(w));
        }
    }
    sync::sync_threads();
    total
}

#[inline(always)]
fn prob(total: f32) -> f32 {
    if total == 0.0 {
        0.0
    } else {
        1.0 / total
    }
}

crate::entry! {
    /// One block per row, walking the row's chunks in order.
    ///
    /// # Safety
    /// `x`: `rows * n` f32 (`n >= 1`); `p`: `rows` f32; at least `rows` blocks.
    pub unsafe fn row_top_prob_ref(x: *const f32, n: u32, rows: u32, p: *mut f32) {
        crate::arch::sync::chain_grids();
        if index::block_idx() >= rows {
            return; // the whole block
        }
        let row = index::block_idx() as usize;
        let xr = x.add(row * n as usize);
        let m = range_max(xr, 0, n);
        let mut total = 0.0f32;
        let mut start = 0;
        while start < n {
            total += chunk_sum(xr, start, (start + HEAD_CHUNK as u32).min(n), m);
            start += HEAD_CHUNK as u32;
        }
        if index::thread_idx() == 0 {
            *p.add(row) = prob(total);
        }
    }
}

crate::entry! {
    /// Split pass 1, one block per (row, chunk): the chunk's maximum.
    ///
    /// # Safety
    /// `x`: `rows * n` f32; `part_max`: `rows * chunks`; at least `rows * chunks` blocks.
    pub unsafe fn row_top_prob_max(x: *const f32, n: u32, rows: u32, chunks: u32, part_max: *mut f32) {
        crate::arch::sync::chain_grids();
        let Some((_, xr, start, end)) = split_block(x, n, rows, chunks) else { return }; // whole block
        let m = range_max(xr, start, end);
        if index::thread_idx() == 0 {
            *part_max.add(index::block_idx() as usize) = m;
        }
    }
}

crate::entry! {
    /// Split pass 2, one block per (row, chunk): the row maximum from pass 1 (each thread folds
    /// the row's chunk maxima; exact, so all agree), then the chunk's term sum.
    ///
    /// # Safety
    /// As `row_top_prob_max`, plus `part_sum`: `rows * chunks`.
    pub unsafe fn row_top_prob_sum(x: *const f32, n: u32, rows: u32, chunks: u32, part_max: *const f32, part_sum: *mut f32) {
        crate::arch::sync::chain_grids();
        let Some((row, xr, start, end)) = split_block(x, n, rows, chunks) else { return }; // whole block
        let mut m = f32::NEG_INFINITY;
        for i in 0..chunks {
            m = m.max(ld_f32(part_max, (row * chunks + i) as usize));
        }
        let s = chunk_sum(xr, start, end, m);
        if index::thread_idx() == 0 {
            *part_sum.add(index::block_idx() as usize) = s;
        }
    }
}

crate::entry! {
    /// Split pass 3, one block per row: the chunk sums left to right, then `1 / total`.
    ///
    /// # Safety
    /// `part_sum`: `rows * chunks`; `p`: `rows`; at least `rows` blocks.
    pub unsafe fn row_top_prob_final(part_sum: *const f32, rows: u32, chunks: u32, p: *mut f32) {
        crate::arch::sync::chain_grids();
        let row = index::block_idx();
        if row < rows && index::thread_idx() == 0 {
            let mut total = 0.0f32;
            for c in 0..chunks {
                total += ld_f32(part_sum, (row * chunks + c) as usize);
            }
            *p.add(row as usize) = prob(total);
        }
    }
}
