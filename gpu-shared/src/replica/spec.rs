//! `spec_accept`: how much of a speculative verify window is kept.
//!
//! A window has `tokens` rows (`1..=SPEC_MAX_TOKENS`): row 0's input is the last accepted
//! token, rows `1..tokens` are draft tokens `window[i]`, and `next[i]` is the token the model
//! chose after row `i`. Draft `i` is accepted when it is the token the model chose after row
//! `i - 1` and every draft before it was accepted: the accepted count `a` is 1 plus the number
//! of leading `i` in `1..tokens` with `window[i] == next[i - 1]`, stopping at the first
//! mismatch (a later match does not count; `window[0]` is not read). The emitted tokens are
//! `next[0..a]`: the accepted drafts, then the model's own token after the last of them.
//! Integers only, so there is no order to state.

/// The accepted count `a` in `1..=window.len()`; `next.len() >= window.len() - 1`.
pub fn accept(window: &[u32], next: &[u32]) -> usize {
    1 + window.iter().skip(1).zip(next).take_while(|(w, n)| w == n).count()
}

/// The kernel's output: `out[0] = a`, `out[1 + i] = next[i]` for every `i < tokens`
/// (`tokens = window.len() == next.len()`, `out.len() == tokens + 1`).
pub fn spec_accept(window: &[u32], next: &[u32], out: &mut [u32]) {
    out[0] = accept(window, next) as u32;
    out[1..].copy_from_slice(next);
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
        let mut out = [0u32; 4];
        spec_accept(&[9, 4, 0], &[4, 5, 6], &mut out);
        assert_eq!(out, [2, 4, 5, 6]);
    }
}
