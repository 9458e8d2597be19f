//! The synthetic vocabulary synthetic models carry: GPT-2-style byte-level BPE with the Qwen2
//! pre-tokenizer, which llama.cpp and the `gguf` package load like a Qwen3 file's.
//!
//! Ids, in the order Qwen's vocabulary has them:
//! - `0..256`: the 256 bytes as GPT-2's `bytes_to_unicode` characters, in its order (printable
//!   ASCII, then Latin-1 printables, then the other bytes mapped to U+0100..);
//! - then the tokens learned by a small BPE trainer over a built-in multilingual text
//!   (`vocab_corpus.txt`: English, code, French, German, Spanish, Russian, Greek, Chinese,
//!   Japanese, Korean, digits, punctuation, emoji, whitespace runs, ChatML): each merge joins the
//!   most frequent adjacent pair (ties: the lowest ids), until the vocabulary is full or no pair
//!   occurs twice;
//! - `<|endoftext|>` (eos, bos and padding, as in Qwen3 files), `<|im_start|>`, `<|im_end|>`, of
//!   type CONTROL;
//! - filler tokens `[PAD<id>]` of type UNUSED up to the requested size, as llama.cpp's converter
//!   pads Qwen vocabularies: llama.cpp loads them, never produces them from text and renders them
//!   as nothing. They let a model have Qwen3's 151936 rows without learning 150k merges.
use std::collections::{BTreeMap, HashMap};
use std::sync::OnceLock;

use crate::gguf::{GgufWriter, Value};

/// llama.cpp's token types (`tokenizer.ggml.token_type`).
pub const TOKEN_NORMAL: i32 = 1;
pub const TOKEN_UNKNOWN: i32 = 2;
pub const TOKEN_CONTROL: i32 = 3;
pub const TOKEN_USER_DEFINED: i32 = 4;
pub const TOKEN_UNUSED: i32 = 5;

/// The control tokens, in id order after the learned ones.
pub const SPECIALS: [&str; 3] = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"];

/// The smallest vocabulary: the bytes and the control tokens.
pub const MIN_VOCAB: usize = 256 + SPECIALS.len();

const CORPUS: &str = include_str!("vocab_corpus.txt");
/// Whitespace a text file does not keep reliably: carriage returns, tabs, form feeds.
const CORPUS_CONTROLS: &str = "Windows line endings\r\nare two bytes\r\n\r\nand a tab\there\r\n\tand\ta\tform\x0cfeed\r\n";

/// A vocabulary as the GGUF keys hold it.
#[derive(Clone, Debug, PartialEq)]
pub struct Vocab {
    pub tokens: Vec<String>,
    pub token_types: Vec<i32>,
    /// `"left right"`, by rank.
    pub merges: Vec<String>,
    pub bos: u32,
    pub eos: u32,
    pub pad: u32,
}

/// GPT-2's `bytes_to_unicode` in vocabulary order: the bytes that are printable characters stand
/// for themselves, the others for U+0100 onwards in byte order. Returns (byte, character) pairs.
fn byte_order() -> Vec<(u8, char)> {
    let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    let mut out: Vec<(u8, char)> = (0..=255u8).filter(|&b| printable(b)).map(|b| (b, char::from(b))).collect();
    let others = (0..=255u8).filter(|&b| !printable(b));
    out.extend(others.enumerate().map(|(n, b)| (b, char::from_u32(256 + n as u32).expect("U+0100.. are chars"))));
    out
}

/// The 256 byte tokens, in id order.
fn byte_tokens() -> Vec<String> {
    byte_order().into_iter().map(|(_, c)| c.to_string()).collect()
}

/// The character GPT-2's byte-level BPE writes for each byte.
pub fn byte_chars() -> [char; 256] {
    let mut chars = ['\0'; 256];
    for (b, c) in byte_order() {
        chars[b as usize] = c;
    }
    chars
}

/// Everything the built-in text teaches, by rank: the new tokens, and each merge with whether it
/// made a new token (two pairs can spell the same text).
struct Learned {
    tokens: Vec<String>,
    merges: Vec<(String, bool)>,
}

/// Trains on the built-in text until no pair occurs twice; once per process. A smaller vocabulary
/// takes a prefix: what training with that budget would stop at.
fn learned() -> &'static Learned {
    static LEARNED: OnceLock<Learned> = OnceLock::new();
    LEARNED.get_or_init(|| train(&byte_tokens()))
}

/// Up to `budget` new tokens and the merges that make them, by rank.
fn learn(budget: usize) -> (Vec<String>, Vec<String>) {
    let all = learned();
    let (mut new, mut merges) = (0, Vec::new());
    for (m, makes_token) in &all.merges {
        if new == budget {
            break;
        }
        merges.push(m.clone());
        new += *makes_token as usize;
    }
    (all.tokens[..new].to_vec(), merges)
}

/// BPE training on the built-in text, split as the Qwen2 pre-tokenizer splits, from the byte tokens.
fn train(byte_tokens: &[String]) -> Learned {
    let pre = crate::tokenizer::pre_tokenizer();
    let mut counts: BTreeMap<String, u64> = BTreeMap::new();
    for piece in [CORPUS, CORPUS_CONTROLS].iter().flat_map(|t| crate::tokenizer::pre_tokenize(&pre, t)) {
        *counts.entry(piece).or_default() += 1;
    }
    let mut tokens = byte_tokens.to_vec();
    let mut ids: HashMap<String, u32> = tokens.iter().enumerate().map(|(i, t)| (t.clone(), i as u32)).collect();
    let mut words: Vec<(Vec<u32>, u64)> = counts.into_iter().map(|(w, n)| (w.chars().map(|c| ids[&c.to_string()]).collect(), n)).collect();
    let mut merges = Vec::new();
    loop {
        let mut pairs: HashMap<(u32, u32), u64> = HashMap::new();
        for (w, n) in &words {
            for p in w.windows(2) {
                *pairs.entry((p[0], p[1])).or_default() += n;
            }
        }
        // Most frequent, then lowest ids: a total order, so the result does not depend on the
        // map's iteration order.
        let Some((&(a, b), &n)) = pairs.iter().max_by_key(|(&(a, b), &n)| (n, std::cmp::Reverse((a, b)))) else { break };
        if n < 2 {
            break;
        }
        let joined = format!("{}{}", tokens[a as usize], tokens[b as usize]);
        let merge = format!("{} {}", tokens[a as usize], tokens[b as usize]);
        // Two pairs can spell the same text: the token exists once, both merges make it.
        let known = ids.len();
        let id = *ids.entry(joined.clone()).or_insert_with(|| {
            tokens.push(joined);
            tokens.len() as u32 - 1
        });
        merges.push((merge, ids.len() > known));
        for (w, _) in &mut words {
            let mut out = Vec::with_capacity(w.len());
            let mut i = 0;
            while i < w.len() {
                if i + 1 < w.len() && (w[i], w[i + 1]) == (a, b) {
                    out.push(id);
                    i += 2;
                } else {
                    out.push(w[i]);
                    i += 1;
                }
            }
            *w = out;
        }
    }
    Learned { tokens: tokens.split_off(byte_tokens.len()), merges }
}

/// The synthetic vocabulary of `n_vocab` tokens (at least [`MIN_VOCAB`]; panics below).
/// Deterministic: the same size gives the same vocabulary.
pub fn synthetic(n_vocab: usize) -> Vocab {
    assert!(n_vocab >= MIN_VOCAB, "a synthetic vocabulary needs at least {MIN_VOCAB} tokens, {n_vocab} asked");
    let mut tokens = byte_tokens();
    let (new, merges) = learn(n_vocab - MIN_VOCAB);
    tokens.extend(new);
    let mut token_types = vec![TOKEN_NORMAL; tokens.len()];
    let eos = tokens.len() as u32;
    tokens.extend(SPECIALS.iter().map(|s| s.to_string()));
    token_types.extend([TOKEN_CONTROL; SPECIALS.len()]);
    tokens.extend((tokens.len()..n_vocab).map(|id| format!("[PAD{id}]")));
    token_types.resize(n_vocab, TOKEN_UNUSED);
    Vocab { tokens, token_types, merges, bos: eos, eos, pad: eos }
}

impl Vocab {
    /// Tokens learned by merges (neither bytes, control tokens nor fillers).
    pub fn learned(&self) -> usize {
        self.token_types.iter().filter(|&&t| t == TOKEN_NORMAL).count() - 256
    }

    /// The `tokenizer.ggml.*` keys, as a Qwen3 file has them (no BOS added).
    pub fn write_keys(&self, w: &mut GgufWriter) {
        let strings = |v: &[String]| Value::Array(v.iter().map(|s| Value::String(s.clone())).collect());
        w.meta("tokenizer.ggml.model", Value::String("gpt2".into()))
            .meta("tokenizer.ggml.pre", Value::String("qwen2".into()))
            .meta("tokenizer.ggml.tokens", strings(&self.tokens))
            .meta("tokenizer.ggml.token_type", Value::Array(self.token_types.iter().map(|&t| Value::I32(t)).collect()))
            .meta("tokenizer.ggml.merges", strings(&self.merges))
            .meta("tokenizer.ggml.bos_token_id", Value::U32(self.bos))
            .meta("tokenizer.ggml.eos_token_id", Value::U32(self.eos))
            .meta("tokenizer.ggml.padding_token_id", Value::U32(self.pad))
            .meta("tokenizer.ggml.add_bos_token", Value::Bool(false));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_map_to_distinct_chars() {
        let chars = byte_chars();
        let mut sorted = chars.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), 256);
        assert_eq!((chars[b'a' as usize], chars[b' ' as usize], chars[b'\n' as usize]), ('a', 'Ġ', 'Ċ'));
    }

    #[test]
    fn sizes_types_and_unique_texts() {
        for n in [MIN_VOCAB, 300, 1024, 5000] {
            let v = synthetic(n);
            assert_eq!((v.tokens.len(), v.token_types.len()), (n, n));
            let mut texts = v.tokens.clone();
            texts.sort_unstable();
            texts.dedup();
            assert_eq!(texts.len(), n, "token texts must be unique (llama.cpp asserts it)");
            assert_eq!(v.tokens[v.eos as usize], "<|endoftext|>");
            assert_eq!(v.token_types[v.eos as usize], TOKEN_CONTROL);
            assert!(v.merges.len() >= v.learned());
        }
        assert_eq!(synthetic(1024), synthetic(1024));
    }
}
