//! `mmvq`: one quantized weight matrix (M rows of K values) times 1..8 q8_1 activation rows.
//!
//! Geometry: a block holds `MMVQ_WARPS` warps, one weight row each. Lane `l` takes groups
//! `l, l + 32, ...` of its row, decodes each weight group once and dots it with every activation
//! row (exact `dp4a` sums), accumulating `(dw * dx) * S` into one partial per row; the warp
//! butterfly then sums the 32 partials. That is the `mmvq` spec of `strata_gpu_shared::order`
//! exactly: partial `p` = groups `p (mod 32)`, left to right.
use crate::arch::{convert, index, int, mem, warp};
use strata_gpu_shared::formats::{iq4_nl, q8_0, q8_1};
use strata_gpu_shared::launch::{MMVQ_MAX_ROWS, MMVQ_WARPS};

/// A weight format as the kernel sees it: a block's scale and its 32 integer values packed four
/// signed bytes to a word (word `i` = values `4i .. 4i + 4`).
trait WeightBlock {
    const BYTES: usize;
    /// # Safety
    /// `p` points at one whole block in device memory, 2-byte aligned.
    unsafe fn load(p: *const u8) -> (f32, [u32; 8]);
}

struct Q8_0;
impl WeightBlock for Q8_0 {
    const BYTES: usize = q8_0::BYTES;
    #[inline(always)]
    unsafe fn load(p: *const u8) -> (f32, [u32; 8]) {
        let d = convert::f16_to_f32(mem::ld_nc_u16(p.add(q8_0::OFF_D)));
        let mut w = [0u32; 8];
        for (i, word) in w.iter_mut().enumerate() {
            *word = mem::ld_nc_u32_a2(p.add(q8_0::OFF_Q + 4 * i));
        }
        (d, w)
    }
}

struct Iq4Nl;
impl WeightBlock for Iq4Nl {
    const BYTES: usize = iq4_nl::BYTES;
    #[inline(always)]
    unsafe fn load(p: *const u8) -> (f32, [u32; 8]) {
        let d = convert::f16_to_f32(mem::ld_nc_u16(p.add(iq4_nl::OFF_D)));
        let mut w = [0u32; 8];
        for i in 0..4 {
            let nibbles = mem::ld_nc_u32_a2(p.add(iq4_nl::OFF_QS + 4 * i));
            w[i] = iq4_nl_levels(nibbles & 0x0f0f_0f0f);
            w[i + 4] = iq4_nl_levels((nibbles >> 4) & 0x0f0f_0f0f);
        }
        (d, w)
    }
}

/// Maps four codes (one per byte, each 0..16) to their four levels with two byte permutes: the
/// low 3 bits of each code select within levels 0-7 and 8-15, bit 3 chooses between the two.
#[inline(always)]
fn iq4_nl_levels(codes: u32) -> u32 {
    // One selector nibble per result byte.
    let sel = (codes & 0x7) | (codes >> 4 & 0x70) | (codes >> 8 & 0x700) | (codes >> 12 & 0x7000);
    let low = int::prmt(iq4_nl::LEVEL_WORDS[0], iq4_nl::LEVEL_WORDS[1], sel);
    let high = int::prmt(iq4_nl::LEVEL_WORDS[2], iq4_nl::LEVEL_WORDS[3], sel);
    let upper = ((codes >> 3) & 0x0101_0101) * 0xff;
    (high & upper) | (low & !upper)
}

/// The shared body of every `mmvq_*` entry.
///
/// # Safety
/// `w`: `m * groups` blocks of `F`; `x`: `rows * groups` q8_1 blocks, row-major, 4-byte
/// aligned; `y`: `rows * m` f32 (row-major, `y[r * m + i]`), not overlapping the inputs;
/// `1 <= rows <= MMVQ_MAX_ROWS`.
#[inline(always)]
unsafe fn mmvq<F: WeightBlock>(w: *const u8, x: *const u8, y: *mut f32, m: u32, groups: u32, rows: u32) {
    let row = index::block_idx() * MMVQ_WARPS + index::warp_in_block();
    if row >= m {
        return; // whole warp: the butterfly below needs every lane, and gets it
    }
    let lane = index::lane();
    let wrow = w.add(row as usize * groups as usize * F::BYTES);
    let mut acc = [0.0f32; MMVQ_MAX_ROWS];
    let mut b = lane;
    while b < groups {
        let (dw, wq) = F::load(wrow.add(b as usize * F::BYTES));
        // Fixed trip count so `acc` stays in registers; rows past `rows` are skipped.
        for r in 0..MMVQ_MAX_ROWS {
            if r as u32 >= rows {
                continue;
            }
            let xb = x.add((r * groups as usize + b as usize) * q8_1::BYTES);
            let dx = convert::f16_to_f32(mem::ld_nc_u16(xb.add(q8_1::OFF_D)));
            let mut s = 0i32;
            for (i, &wi) in wq.iter().enumerate() {
                s = int::dp4a(wi, mem::ld_nc_u32(xb.add(q8_1::OFF_Q + 4 * i)), s);
            }
            acc[r] += (dw * dx) * s as f32;
        }
        b += 32;
    }
    for (r, &a) in acc.iter().enumerate() {
        if r as u32 >= rows {
            continue;
        }
        let v = warp::warp_sum_f32(a);
        if lane == r as u32 {
            mem::st_f32(y.add(r * m as usize + row as usize), v);
        }
    }
}

/// Q8_0 weights. Launch: `ceil(m / MMVQ_WARPS)` blocks of `32 * MMVQ_WARPS` threads.
///
/// # Safety
/// As [`mmvq`].
#[no_mangle]
pub unsafe extern "ptx-kernel" fn mmvq_q8_0(w: *const u8, x: *const u8, y: *mut f32, m: u32, groups: u32, rows: u32) {
    mmvq::<Q8_0>(w, x, y, m, groups, rows)
}

/// IQ4_NL weights. Launch as [`mmvq_q8_0`].
///
/// # Safety
/// As [`mmvq`].
#[no_mangle]
pub unsafe extern "ptx-kernel" fn mmvq_iq4_nl(w: *const u8, x: *const u8, y: *mut f32, m: u32, groups: u32, rows: u32) {
    mmvq::<Iq4Nl>(w, x, y, m, groups, rows)
}
