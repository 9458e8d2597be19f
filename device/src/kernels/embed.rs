//! `embed_rows_<tag>`: the token rows of an embedding table, widened to f32. Spec:
//! `strata_gpu_shared::replica::embed`.
//!
//! One output value per thread: block `b` covers values `256 * (b % chunks) ..` of token
//! `b / chunks` (`chunks = ceil(n / 256)`). For a quantized table every lane decodes the whole
//! 32-value group its warp lies in (the same addresses across the warp, so the loads broadcast)
//! and keeps its own value; for a float table each thread loads its element.
use super::blocks::{self, Block};
use super::matvec::{Bf16, FloatWeight, F16, F32};
use crate::arch::{index, mem};
use strata_gpu_shared::formats::GROUP;
use strata_gpu_shared::launch::norm::{EMBED_NAN, EMBED_THREADS};
use strata_gpu_shared::order::group_scale;

/// How value `j` of a table row is read.
trait RowValue {
    /// # Safety
    /// `row` points at a whole row of at least `j + 1` values in device memory, aligned to its
    /// element (2 bytes for the quantized blocks).
    unsafe fn value(row: *const u8, j: u32) -> f32;
}

/// A row of quantized blocks `B`.
struct Quant<B>(B);

impl<B: Block> RowValue for Quant<B> {
    #[inline(always)]
    unsafe fn value(row: *const u8, j: u32) -> f32 {
        let (b, l) = (j / GROUP as u32, j % GROUP as u32);
        let g = B::group_at(row, b);
        // Word l / 4 of the group, picked in registers (an indexed load would put the group in
        // local memory).
        let mut word = g.w[0];
        crate::unroll!(i in [1, 2, 3, 4, 5, 6, 7] {
            if i as u32 == l / 4 {
                word = g.w[i];
            }
        });
        let byte = (word >> (8 * (l % 4))) as u8;
        let v = if B::OFFSET == 0 { byte as i8 as i32 } else { byte as i32 - B::OFFSET };
        let f = if l < 16 { g.f[0] } else { g.f[1] };
        g.d * group_scale(f * v, B::SHIFT)
    }
}

/// A row of float elements `W`.
struct Float<W>(W);

impl<W: FloatWeight> RowValue for Float<W> {
    #[inline(always)]
    unsafe fn value(row: *const u8, j: u32) -> f32 {
        W::get(row, j)
    }
}

/// # Safety
/// `table`: `n_rows` rows of `row_bytes` bytes, each `n` values of `R`; `ids`: `tokens` u32;
/// `out`: `tokens * n` f32, not overlapping the inputs; `n >= 1`.
#[inline(always)]
unsafe fn embed_rows<R: RowValue>(table: *const u8, row_bytes: u64, n_rows: u32, ids: *const u32, tokens: u32, n: u32, out: *mut f32) {
    let chunks = n.div_ceil(EMBED_THREADS);
    let (t, j) = (index::block_idx() / chunks, index::block_idx() % chunks * EMBED_THREADS + index::thread_idx());
    if t >= tokens || j >= n {
        return; // past the row, or a padded grid's extra block
    }
    let id = mem::ld_nc_u32(ids.add(t as usize) as *const u8);
    let v = if id < n_rows { R::value(table.add(id as usize * row_bytes as usize), j) } else { f32::from_bits(EMBED_NAN) };
    mem::st_f32(out.add(t as usize * n as usize + j as usize), v);
}

macro_rules! embed_entries {
    ($($name:ident => $row:ty),* $(,)?) => {$(
        $crate::entry! {
            /// Launch: `tokens * ceil(n / EMBED_THREADS)` blocks of `EMBED_THREADS` threads.
            ///
            /// # Safety
            /// As `embed_rows`.
            pub unsafe fn $name(
                table: *const u8, row_bytes: u64, n_rows: u32, ids: *const u32, tokens: u32, n: u32, out: *mut f32,
            ) {
                crate::arch::sync::chain_grids();
                embed_rows::<$row>(table, row_bytes, n_rows, ids, tokens, n, out)
            }
        }
    )*};
}

embed_entries! {
    embed_rows_q8_0 => Quant<blocks::Q8_0>,
    embed_rows_q6_k => Quant<blocks::Q6K>,
    embed_rows_iq2_xxs => Quant<blocks::Iq2Xxs>,
    embed_rows_iq2_xs => Quant<blocks::Iq2Xs>,
    embed_rows_iq2_s => Quant<blocks::Iq2S>,
    embed_rows_iq3_xxs => Quant<blocks::Iq3Xxs>,
    embed_rows_iq3_s => Quant<blocks::Iq3S>,
    embed_rows_iq4_nl => Quant<blocks::Iq4Nl>,
    embed_rows_iq4_xs => Quant<blocks::Iq4Xs>,
    embed_rows_q2_0 => Quant<blocks::Q2_0>,
    embed_rows_f32 => Float<F32>,
    embed_rows_f16 => Float<F16>,
    embed_rows_bf16 => Float<Bf16>,
}
