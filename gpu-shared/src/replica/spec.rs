//! `spec_accept`: how much of a speculative verify window is kept.
//!
//! A window has `tokens` rows (`1..=SPEC_MAX_TOKENS`): row 0's input is the last accepted
//! token, rows `1..tokens` are draft tokens `window[i]`, and `next[i]` is the token the model
//! chose after row `i`. Draft `i` is accepted when it is the token the model chose after row
//! `i - 1` and every draft before it was accepted: the accepted count `a` is 1 plus the number
//! of leading `i` in `1..tokens` with `window[i] == next[i - 1]`, stopping at the first
//! mismatch (a later match does not count; `window[0]` is not read). The emitted tokens are
//! `next[0..a]`: the accepted drafts, then the model's own token after the last of them.
//! The kernel then moves the sequence on: `window[0]` becomes `next[a - 1]` (the next window's
//! row 0, the last emitted token) and the position `pos += a`, so that a following step reads
//! its input from the device. Integers only, so there is no order to state.

/// The accepted count `a` in `1..=window.len()`; `next.len() >= window.len() - 1`.
pub fn accept(window: &[u32], next: &[u32]) -> usize {
    1 + window.iter().skip(1).zip(next).take_while(|(w, n)| w == n).count()
}

/// The kernel's output: `out[0] = a`, `out[1 + i] = next[i]` for every `i < tokens`
/// (`tokens = window.len() == next.len()`, `out.len() == tokens + 1`); then `window[0] =
/// next[a - 1]` and `pos += a` (wrapping, as the kernel's u32 add).
pub fn spec_accept(window: &mut [u32], next: &[u32], out: &mut [u32], pos: &mut u32) {
    let a = accept(window, next);
    out[0] = a as u32;
    out[1..].copy_from_slice(next);
    window[0] = next[a - 1];
    *pos = pos.wrapping_add(a as u32);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_the_leading_matches_only() {
        assert_eq!(accept(&[9], &[4]), 1);
        assert_eq!(accept(&[9, 4, 5, 6], &[4, 5, 6, 7]), 4);
        assert_eq!(accept(&[9, 3, 5, 6], &[4, 5, 6, 7]), 1);
        assert_eq!(accept(&[9, 4, 0, 6], &[4, 5, 6, 7]), 2);
        let (mut out, mut window, mut pos) = ([0u32; 4], [9, 4, 0], 10);
        spec_accept(&mut window, &[4, 5, 6], &mut out, &mut pos);
        assert_eq!(out, [2, 4, 5, 6]);
        assert_eq!((window, pos), ([5, 4, 0], 12));
    }
}
