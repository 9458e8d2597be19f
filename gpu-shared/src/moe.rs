//! The routed-expert window: how a window's (token, slot) expert selections become groups, the
//! layout of the group table every expert kernel reads, and SwiGLU. [`group`] is the spec of the
//! table (the replica runs it; the device's `moe_group` builds the same words with one block).
//!
//! Group table (u32 words), for `n = tokens * k` selections:
//! - word 0: number of groups `G` (distinct experts); word 1: selections whose expert id was out
//!   of range (they join no group; the host reports them as an error);
//! - `expert[n]` at [`EXPERT`], `start[n]` at `START(n)`, `count[n]` at `COUNT(n)`: for group
//!   `g < G`, its expert id and its entries' range in `entries`; groups `G..n` have count 0;
//! - `entries[n]` at `ENTRIES(n)`: selection indices `e = token * k + slot`.
//!
//! Groups are in increasing expert id; a group's entries in increasing `e`, that is by token,
//! then slot. The order depends on nothing but the selections.

use crate::math::exp_neg;

pub const N_GROUPS: usize = 0;
pub const ERRORS: usize = 1;
pub const EXPERT: usize = 2;

/// Offset of `start[]` for `n` selections.
pub const fn start(n: usize) -> usize {
    EXPERT + n
}
/// Offset of `count[]`.
pub const fn count(n: usize) -> usize {
    EXPERT + 2 * n
}
/// Offset of `entries[]`.
pub const fn entries(n: usize) -> usize {
    EXPERT + 3 * n
}
/// Words of a table for `n` selections.
pub const fn table_words(n: usize) -> usize {
    EXPERT + 4 * n
}

/// Fills `table` (at least `table_words(ids.len())` words) from the selections `ids`.
/// `O(n^2)` in one thread: `n` is at most 8 tokens x 10 slots.
pub fn group(ids: &[u32], n_expert: u32, table: &mut [u32]) {
    let n = ids.len();
    let mut groups = 0usize;
    let mut errors = 0u32;
    let mut filled = 0usize;
    // Next expert: the smallest valid id above the previous one.
    let mut prev: Option<u32> = None;
    loop {
        let mut next: Option<u32> = None;
        for &id in ids {
            if id < n_expert && prev.is_none_or(|p| id > p) && next.is_none_or(|m| id < m) {
                next = Some(id);
            }
        }
        let Some(expert) = next else { break };
        table[EXPERT + groups] = expert;
        table[start(n) + groups] = filled as u32;
        for (e, &id) in ids.iter().enumerate() {
            if id == expert {
                table[entries(n) + filled] = e as u32;
                filled += 1;
            }
        }
        table[count(n) + groups] = filled as u32 - table[start(n) + groups];
        groups += 1;
        prev = Some(expert);
    }
    for &id in ids {
        errors += (id >= n_expert) as u32;
    }
    for g in groups..n {
        table[EXPERT + g] = 0;
        table[start(n) + g] = filled as u32;
        table[count(n) + g] = 0;
    }
    for e in filled..n {
        table[entries(n) + e] = 0;
    }
    table[N_GROUPS] = groups as u32;
    table[ERRORS] = errors;
}

/// `silu(g) = g / (1 + e^-g)`, from [`exp_neg`] so every backend computes the same bits:
/// `g / (1 + exp_neg(-g))` for `g >= 0`, `(g * e) / (1 + e)` with `e = exp_neg(g)` for `g < 0`
/// (NaN: the second form, giving NaN).
#[inline(always)]
pub fn silu(g: f32) -> f32 {
    if g >= 0.0 {
        g / (1.0 + exp_neg(-g))
    } else {
        let e = exp_neg(g);
        (g * e) / (1.0 + e)
    }
}

/// The SwiGLU activation: `silu(gate) * up`.
#[inline(always)]
pub fn swiglu(gate: f32, up: f32) -> f32 {
    silu(gate) * up
}

#[cfg(test)]
mod tests {
    use super::*;
    extern crate std;
    use std::vec;

    #[test]
    fn groups_by_expert_then_token_then_slot() {
        // 3 tokens x 2 slots: token 0 -> (5, 1), token 1 -> (1, 9), token 2 -> (5, 70 = bad).
        let ids = [5, 1, 1, 9, 5, 70];
        let n = ids.len();
        let mut t = vec![0xdead_beefu32; table_words(n)];
        group(&ids, 64, &mut t);
        assert_eq!((t[N_GROUPS], t[ERRORS]), (3, 1));
        assert_eq!(&t[EXPERT..EXPERT + 3], &[1, 5, 9]);
        assert_eq!(&t[start(n)..start(n) + 3], &[0, 2, 4]);
        assert_eq!(&t[count(n)..count(n) + 6], &[2, 2, 1, 0, 0, 0]);
        assert_eq!(&t[entries(n)..entries(n) + 5], &[1, 2, 0, 4, 3]);
        assert!(t.iter().all(|&w| w != 0xdead_beef), "every word written");
    }

    #[test]
    fn silu_matches_float64() {
        let mut g = -30.0f32;
        while g < 30.0 {
            let want = g as f64 / (1.0 + (-(g as f64)).exp());
            let got = silu(g) as f64;
            assert!((got - want).abs() <= 1e-6 * want.abs().max(1e-30) + 1e-37, "{g}: {got} vs {want}");
            g += 0.0137;
        }
        assert!(silu(f32::NAN).is_nan());
        assert_eq!(silu(0.0), 0.0);
    }
}
