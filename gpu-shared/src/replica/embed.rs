//! Replica of `embed_rows_<tag>`: token rows of an embedding table widened to f32.
//!
//! Spec (no reduction; every value is computed on its own):
//! - quantized tables: value `j` of a row is `f16_to_f32(d) * group_scale(f[(j % 32) / 16] *
//!   v[j % 32], shift)` for group `j / 32` decoded by [`super::row_group`]: the scale times the
//!   exact rational `f * v / 2^shift` ([`crate::order::group_scale`]), one rounding. For every
//!   format `|f * v| <= 4096` (12 significant bits) and fp16 `d` has 11, so the exact product
//!   fits f32's 24 and that rounding is exact too: the value is the dequantized weight itself.
//!   The only freedom left is the sign of a zero, here the sign of `d` (`f * v` is an integer 0).
//! - float tables: the element widened exactly (f32 copied, bf16 shifted, f16 as `cvt.f32.f16`).
//! - a token id at or past the table's row count gives a row of quiet NaN
//!   ([`crate::launch::norm::EMBED_NAN`]); the table is never read for it.
use super::row_group;
use crate::f16::f16_to_f32;
use crate::formats::GROUP;
use crate::launch::norm::{EmbedTable, EMBED_NAN};
use crate::order::group_scale;

/// Row `row` (`table.row_bytes(out.len())` bytes) decoded into `out`.
pub fn decode_row(table: EmbedTable, row: &[u8], out: &mut [f32]) {
    match table {
        EmbedTable::Quant(format) => {
            for (b, values) in out.chunks_exact_mut(GROUP).enumerate() {
                let g = row_group(format, row, b);
                let d = f16_to_f32(g.d);
                for (j, v) in values.iter_mut().enumerate() {
                    *v = d * group_scale(g.f[j / 16] * g.v[j] as i32, format.shift());
                }
            }
        }
        EmbedTable::Float(format) => {
            for (j, v) in out.iter_mut().enumerate() {
                *v = format.get(row, j);
            }
        }
    }
}

/// `out[t * n + j]` = value `j` of row `ids[t]` of `data` (rows of `n` values of `table`, as
/// many as `data` holds whole), NaN rows for ids past the table.
pub fn embed_rows(table: EmbedTable, data: &[u8], n: usize, ids: &[u32], out: &mut [f32]) {
    let row_bytes = table.row_bytes(n);
    let n_rows = data.len() / row_bytes;
    for (&id, row) in ids.iter().zip(out.chunks_exact_mut(n)) {
        let id = id as usize;
        if id < n_rows {
            decode_row(table, &data[id * row_bytes..(id + 1) * row_bytes], row);
        } else {
            row.fill(f32::from_bits(EMBED_NAN));
        }
    }
}
