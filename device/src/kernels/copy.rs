//! `copy_from_mapped_multi`: one launch copies many segments from pinned, device-mapped host
//! memory into device memory. The table holds per segment (source address, destination
//! address, length, first block) as u64 words; block `b` copies bytes
//! `[(b - first) * COPY_CHUNK, ...)` of the segment whose block range holds `b`. Within a block,
//! 16-byte moves where source and destination are both 16-byte aligned at the chunk start,
//! otherwise 4-byte moves (segment offsets are 4-byte aligned), then the last bytes one by one.
use crate::arch::{index, mem};
use strata_gpu_shared::launch::{COPY_CHUNK, COPY_SEGMENT_WORDS};

#[inline(always)]
unsafe fn word(table: *const u64, seg: u32, field: usize) -> u64 {
    let p = table.add(seg as usize * COPY_SEGMENT_WORDS + field) as *const u8;
    mem::ld_nc_u32(p) as u64 | (mem::ld_nc_u32(p.add(4)) as u64) << 32
}

crate::entry! {
    /// Launch: the table's total block count (padded grids return past it), 256 threads.
    ///
    /// # Safety
    /// `table`: `segments * COPY_SEGMENT_WORDS` u64, first blocks increasing from 0, `total` the
    /// last segment's first block plus its block count; each source readable and each destination
    /// writable for its length, 4-byte aligned, destinations not overlapping anything read.
    pub unsafe fn copy_from_mapped_multi(table: *const u64, segments: u32, total: u32) {
        crate::arch::sync::chain_grids();
        let b = index::block_idx();
        if b >= total || segments == 0 {
            return; // the whole block
        }
        // The last segment whose first block is <= b.
        let (mut lo, mut hi) = (0u32, segments);
        while hi - lo > 1 {
            let mid = (lo + hi) / 2;
            if word(table, mid, 3) <= b as u64 {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        let (src, dst, len, first) = (word(table, lo, 0), word(table, lo, 1), word(table, lo, 2), word(table, lo, 3));
        let start = (b as u64 - first) * COPY_CHUNK as u64;
        let end = (start + COPY_CHUNK as u64).min(len);
        let (s, d) = ((src + start) as *const u8, (dst + start) as *mut u8);
        let n = end - start;
        let t = index::thread_idx() as u64;
        let threads = index::block_dim() as u64;
        let wide = (s as u64 | d as u64) % 16 == 0;
        let step = if wide { 16 } else { 4 };
        let whole = n / step * step;
        let mut i = t * step;
        while i < whole {
            if wide {
                mem::st_v4(d.add(i as usize), mem::ld_v4(s.add(i as usize)));
            } else {
                mem::st_u32(d.add(i as usize), mem::ld_u32(s.add(i as usize)));
            }
            i += threads * step;
        }
        let tail = whole + t;
        if tail < n {
            mem::st_u8(d.add(tail as usize), mem::ld_u8(s.add(tail as usize)));
        }
    }
}
