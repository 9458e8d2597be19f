//! `sample_rows`: top-k / top-p / temperature sampling, one block of `SAMPLE_THREADS` per row.
//! Spec: `strata_gpu_shared::replica::sample`.
//!
//! The candidates are found by `K` block-wide argmax passes (the head's), each over the
//! elements strictly worse than the previous pick, and kept in shared memory in rank order
//! (`SAMPLE_SMEM_WORDS` words: see `launch::route`). Thread `r` turns candidate `r`'s value into
//! its weight; thread 0 then forms the cumulative sums and draws.
use crate::arch::mem::Smem;
use crate::arch::{index, sync};
use crate::kernels::head::{block_best, keep_better, ld_f32, NONE};
use strata_gpu_shared::launch::route::{SAMPLE_CAND_IDX, SAMPLE_CAND_VAL, SAMPLE_THREADS};
use strata_gpu_shared::math::exp_neg;
use strata_gpu_shared::order::argmax_better;
use strata_gpu_shared::replica::sample::uniform;

const IDX: u32 = SAMPLE_CAND_IDX as u32;
const VAL: u32 = SAMPLE_CAND_VAL as u32;

#[inline(always)]
unsafe fn ld_smem_f32(smem: Smem, word: u32) -> f32 {
    f32::from_bits(smem.ld_u32(word))
}

crate::entry! {
    /// One block per row (blocks past `rows`, from a padded grid, return at once); row `t` draws
    /// with the uniform number of position `*pos + t`.
    ///
    /// # Safety
    /// `logits`: `rows * n` f32 (`n >= 1`); `pos`: one u32; `ids`: `rows` u32; `1 <= top_k <= SAMPLE_MAX_K`;
    /// `SAMPLE_SMEM_WORDS` words of dynamic shared memory.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn sample_rows(
        logits: *const f32,
        rows: u32,
        n: u32,
        top_k: u32,
        top_p: f32,
        inv_temp: f32,
        seed_lo: u32,
        seed_hi: u32,
        pos: *const u32,
        ids: *mut u32,
    ) {
        crate::arch::sync::chain_grids();
        let row = index::block_idx();
        if row >= rows {
            return; // the whole block
        }
        let x = logits.add(row as usize * n as usize);
        let (smem, tid) = (Smem::dynamic(), index::thread_idx());
        let kk = top_k.min(n);
        let mut prev = (f32::NAN, NONE);
        let mut r = 0;
        while r < kk {
            let mut best = (f32::NAN, NONE); // loses to every element
            let mut j = tid;
            while j < n {
                let v = ld_f32(x, j as usize);
                if r == 0 || argmax_better(prev.0, prev.1, v, j) {
                    keep_better(&mut best, v, j);
                }
                j += SAMPLE_THREADS as u32;
            }
            let best = block_best(best);
            if tid == 0 {
                smem.st_u32(IDX + r, best.1);
                smem.st_u32(VAL + r, best.0.to_bits());
            }
            sync::sync_threads();
            prev = (ld_smem_f32(smem, VAL + r), smem.ld_u32(IDX + r));
            r += 1;
        }
        let l0 = ld_smem_f32(smem, VAL);
        let p = if tid < kk { exp_neg((ld_smem_f32(smem, VAL + tid) - l0) * inv_temp) } else { 0.0 };
        sync::sync_threads(); // every read of the values is done
        if tid < kk {
            smem.st_u32(VAL + tid, p.to_bits());
        }
        sync::sync_threads();
        if tid == 0 {
            let mut cum = 0.0f32;
            for r in 0..kk {
                cum += ld_smem_f32(smem, VAL + r);
                smem.st_u32(VAL + r, cum.to_bits());
            }
            let threshold = top_p * cum;
            let mut keep = 1;
            while keep < kk && !(ld_smem_f32(smem, VAL + keep - 1) >= threshold) {
                keep += 1;
            }
            let seed = (seed_hi as u64) << 32 | seed_lo as u64;
            let target = uniform(seed, crate::arch::mem::ld_nc_u32(pos as *const u8) as u64 + row as u64) * ld_smem_f32(smem, VAL + keep - 1);
            let mut rank = 0;
            while rank < keep - 1 && !(ld_smem_f32(smem, VAL + rank) > target) {
                rank += 1;
            }
            *ids.add(row as usize) = smem.ld_u32(IDX + rank);
        }
    }
}
