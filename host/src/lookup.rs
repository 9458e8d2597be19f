//! Prompt-lookup drafts: guess the next tokens by finding the latest earlier place where the
//! last few tokens of the sequence occurred, and proposing what followed them there.

/// Longest n-gram matched (n = `MAX_NGRAM` down to 1: the longest match wins).
pub const MAX_NGRAM: usize = 3;

/// Up to `max` draft tokens for `history` (the prompt and everything generated so far): for n
/// from [`MAX_NGRAM`] down to 1, the most recent earlier occurrence of the last n tokens, and the
/// tokens that followed it (at most `max`, never past the end of the history). Empty when
/// nothing matches.
pub fn draft(history: &[u32], max: usize) -> Vec<u32> {
    if max == 0 {
        return Vec::new();
    }
    for n in (1..=MAX_NGRAM.min(history.len().saturating_sub(1))).rev() {
        let tail = &history[history.len() - n..];
        // Candidate starts, latest first; a match may overlap the tail but not be the tail
        // itself, so at least one token follows it.
        for start in (0..history.len() - n).rev() {
            if &history[start..start + n] == tail {
                let from = start + n;
                let to = (from + max).min(history.len());
                return history[from..to].to_vec();
            }
        }
    }
    Vec::new()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn longest_latest_match_wins() {
        // "1 2 3" occurs at 0 and 5; the tail is "1 2 3" (at 10): the latest earlier one (5)
        // proposes 9 8 ...
        let h = [1, 2, 3, 4, 4, 1, 2, 3, 9, 8, 1, 2, 3];
        assert_eq!(draft(&h, 2), vec![9, 8]);
        assert_eq!(draft(&h, 7), vec![9, 8, 1, 2, 3]);
        // A 1-gram fallback when no longer match exists.
        assert_eq!(draft(&[5, 6, 7, 6], 3), vec![7, 6]);
        // Nothing to match.
        assert!(draft(&[1, 2, 3], 4).is_empty());
        assert!(draft(&[1], 4).is_empty());
        assert!(draft(&[], 4).is_empty());
        assert!(draft(&h, 0).is_empty());
    }

    #[test]
    fn a_longer_match_beats_a_later_shorter_one() {
        // Tail "7 8": the 2-gram at 0 wins over the later 1-gram "8" at 4.
        let h = [7, 8, 1, 5, 8, 2, 7, 8];
        assert_eq!(draft(&h, 1), vec![1]);
    }
}
