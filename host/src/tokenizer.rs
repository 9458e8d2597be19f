//! Text to token ids and back, from the `tokenizer.ggml.*` vocabulary of a GGUF file, giving the
//! ids llama.cpp gives (tests/tokenizer.rs compares them on the same file).
//!
//! Strata reads GPT-2-style byte-level BPE vocabularies (`tokenizer.ggml.model = "gpt2"`) with the
//! Qwen2 pre-tokenizer (`tokenizer.ggml.pre = "qwen2"`): what Qwen3 MoE files and Strata's
//! synthetic models carry. Encoding is the `tokenizers` crate: the Qwen2 split regex, then the
//! byte-to-character mapping of GPT-2, then the BPE merges by rank; control and user-defined tokens
//! are special added tokens, recognised anywhere in the text (as llama.cpp does with
//! `special = true`). Decoding works on bytes: each token's text is mapped back through the inverse
//! byte mapping, so a character split across tokens is joined from its bytes, never from lossy
//! strings ([`TokenStream`]).
use std::collections::HashMap;

use tokenizers::models::bpe::{Vocab as BpeVocab, BPE};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{AddedToken, OffsetReferential, OffsetType, PreTokenizedString, PreTokenizer, PreTokenizerWrapper, SplitDelimiterBehavior};

use crate::gguf::{GgufFile, Value};
use crate::model::vocab::{byte_chars, TOKEN_CONTROL, TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_UNUSED, TOKEN_USER_DEFINED};

/// The Qwen2 pre-tokenizer split, as llama.cpp spells it: the tokenizer.json original has the
/// contractions as `(?i:'s|'t|'re|'ve|'m|'ll|'d)`, whose Unicode case folding would also take
/// `'ſ` (long s) and `'K` (Kelvin sign); llama.cpp folds ASCII only, and so does this.
pub const QWEN2_SPLIT: &str =
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// `tokenizer.ggml.pre` values that mean the Qwen2 split (llama.cpp's LLAMA_VOCAB_PRE_TYPE_QWEN2).
const QWEN2_PRE: [&str; 2] = ["qwen2", "deepseek-r1-qwen"];

/// Token texts llama.cpp treats as end of generation, whatever the file's types say (besides the
/// file's eos): the ones a Qwen vocabulary can hold.
const EOG_TEXTS: [&str; 9] =
    ["<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|eom_id|>", "<|end|>", "<|end_of_text|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>"];

/// The pre-tokenizer: the Qwen2 split, then the bytes of each piece as GPT-2 characters.
pub(crate) fn pre_tokenizer() -> PreTokenizerWrapper {
    let split = Split::new(SplitPattern::Regex(QWEN2_SPLIT.into()), SplitDelimiterBehavior::Isolated, false).expect("the Qwen2 split regex compiles");
    PreTokenizerWrapper::Sequence(Sequence::new(vec![split.into(), ByteLevel::new(false, false, false).into()]))
}

/// The pieces `text` pre-tokenizes into, in GPT-2 characters (what the BPE merges work on).
pub(crate) fn pre_tokenize(pre: &PreTokenizerWrapper, text: &str) -> Vec<String> {
    let mut s = PreTokenizedString::from(text);
    pre.pre_tokenize(&mut s).expect("splitting a str cannot fail");
    s.get_splits(OffsetReferential::Original, OffsetType::Byte).into_iter().map(|(p, _, _)| p.to_string()).collect()
}

/// A GGUF file's vocabulary, ready to encode and decode.
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    /// The bytes each id stands for: the inverse byte mapping of a normal token's characters, a
    /// control or user-defined token's text as it is, nothing for an unused one.
    pieces: Vec<Vec<u8>>,
    texts: HashMap<String, u32>,
    eos: u32,
    eog: Vec<u32>,
    /// The id to put first, when the file says `add_bos_token = true`.
    bos_first: Option<u32>,
}

fn key<'a>(file: &'a GgufFile, name: &str) -> Option<&'a Value> {
    file.get(name)
}

fn strings<'a>(file: &'a GgufFile, name: &str) -> Result<Vec<&'a str>, String> {
    let where_ = file.path.display();
    match key(file, name) {
        Some(Value::Array(items)) => items.iter().map(|v| v.as_str().ok_or_else(|| format!("{where_}: {name} holds a non-string"))).collect(),
        Some(_) => Err(format!("{where_}: {name} is not an array of strings")),
        None => Err(format!("{where_}: the vocabulary has no {name}")),
    }
}

fn token_id(file: &GgufFile, name: &str, n: usize) -> Result<Option<u32>, String> {
    match key(file, name) {
        None => Ok(None),
        Some(v) => match v.as_u64() {
            Some(id) if (id as usize) < n => Ok(Some(id as u32)),
            _ => Err(format!("{}: {name} = {v} is not a token id below {n}", file.path.display())),
        },
    }
}

/// The bytes a normal token's GPT-2 characters stand for (a character outside the mapping, which a
/// foreign vocabulary could hold, stands for its own UTF-8).
fn token_bytes(text: &str, byte_of: &HashMap<char, u8>) -> Vec<u8> {
    let mut out = Vec::with_capacity(text.len());
    for c in text.chars() {
        match byte_of.get(&c) {
            Some(&b) => out.push(b),
            None => out.extend(c.encode_utf8(&mut [0; 4]).as_bytes()),
        }
    }
    out
}

impl Tokenizer {
    /// Reads the file's `tokenizer.ggml.*` keys. A file without a vocabulary (`tokenizer.ggml.model`
    /// missing or `"none"`) and a vocabulary other than gpt2 + qwen2 are refused with a message
    /// that says so.
    pub fn from_gguf(file: &GgufFile) -> Result<Tokenizer, String> {
        let where_ = file.path.display();
        let model = key(file, "tokenizer.ggml.model").and_then(Value::as_str);
        match model {
            None | Some("none") | Some("no_vocab") => {
                let what = model.map_or("no tokenizer.ggml.model".to_string(), |m| format!("tokenizer.ggml.model = {m:?}"));
                return Err(format!("{where_}: the file has no vocabulary ({what}): give the prompt as token ids (--prompt-ids)"));
            }
            Some("gpt2") => {}
            Some(m) => {
                return Err(format!("{where_}: tokenizer.ggml.model = {m:?} is not supported (Strata reads \"gpt2\" byte-level BPE vocabularies)"))
            }
        }
        let pre = key(file, "tokenizer.ggml.pre").and_then(Value::as_str);
        if !pre.is_some_and(|p| QWEN2_PRE.contains(&p)) {
            let what = pre.map_or("missing".to_string(), |p| format!("{p:?}"));
            return Err(format!("{where_}: tokenizer.ggml.pre {what} is not supported (Strata reads the Qwen2 pre-tokenizer, \"qwen2\")"));
        }
        let tokens = strings(file, "tokenizer.ggml.tokens")?;
        let n = tokens.len();
        let types: Vec<i32> = match key(file, "tokenizer.ggml.token_type") {
            None => vec![TOKEN_NORMAL; n],
            Some(Value::Array(items)) if items.len() >= n => items[..n]
                .iter()
                .map(|v| match v {
                    Value::I32(t) => Ok(*t),
                    _ => Err(format!("{where_}: tokenizer.ggml.token_type is not an array of i32")),
                })
                .collect::<Result<_, _>>()?,
            Some(_) => return Err(format!("{where_}: tokenizer.ggml.token_type is not an array of at least {n} i32")),
        };
        let merges = strings(file, "tokenizer.ggml.merges")?
            .into_iter()
            // Split at the first space after the first byte, as llama.cpp does.
            .map(|m| match m.bytes().skip(1).position(|b| b == b' ') {
                Some(at) => Ok((m[..at + 1].to_string(), m[at + 2..].to_string())),
                None => Err(format!("{where_}: merge {m:?} is not two tokens separated by a space")),
            })
            .collect::<Result<Vec<_>, _>>()?;
        let eos = token_id(file, "tokenizer.ggml.eos_token_id", n)?
            .ok_or_else(|| format!("{where_}: the vocabulary has no tokenizer.ggml.eos_token_id"))?;
        let bos = token_id(file, "tokenizer.ggml.bos_token_id", n)?;
        let add_bos = matches!(key(file, "tokenizer.ggml.add_bos_token"), Some(Value::Bool(true)));
        let bos_first = match (add_bos, bos) {
            (false, _) => None,
            (true, Some(b)) => Some(b),
            (true, None) => return Err(format!("{where_}: add_bos_token is true but there is no bos_token_id")),
        };

        let mut texts = HashMap::with_capacity(n);
        for (id, t) in tokens.iter().enumerate() {
            if texts.insert(t.to_string(), id as u32).is_some() {
                return Err(format!("{where_}: token {t:?} appears twice in the vocabulary"));
            }
        }
        let vocab: BpeVocab = texts.iter().map(|(t, &id)| (t.clone(), id)).collect();
        let bpe = BPE::builder().vocab_and_merges(vocab, merges).build().map_err(|e| format!("{where_}: the BPE vocabulary is inconsistent: {e}"))?;
        let mut inner = tokenizers::Tokenizer::new(bpe);
        inner.with_pre_tokenizer(Some(pre_tokenizer()));
        let special = |t: i32| matches!(t, TOKEN_CONTROL | TOKEN_USER_DEFINED | TOKEN_UNKNOWN);
        let added: Vec<AddedToken> =
            tokens.iter().zip(&types).filter(|(_, &t)| special(t)).map(|(s, _)| AddedToken::from(s.to_string(), true)).collect();
        inner.add_special_tokens(&added);

        let byte_of: HashMap<char, u8> = byte_chars().iter().enumerate().map(|(b, &c)| (c, b as u8)).collect();
        let pieces = tokens
            .iter()
            .zip(&types)
            .map(|(t, &ty)| match ty {
                TOKEN_UNUSED => Vec::new(),
                ty if special(ty) => t.as_bytes().to_vec(),
                _ => token_bytes(t, &byte_of),
            })
            .collect();
        let mut eog: Vec<u32> = EOG_TEXTS.iter().filter_map(|t| texts.get(*t).copied()).chain([eos]).collect();
        eog.sort_unstable();
        eog.dedup();
        Ok(Tokenizer { inner, pieces, texts, eos, eog, bos_first })
    }

    /// Token ids of `text`; control tokens written in the text (`<|im_start|>`) are recognised. A
    /// BOS comes first only when the file says `add_bos_token = true`.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, String> {
        let enc = self.inner.encode(text, false).map_err(|e| format!("cannot tokenize: {e}"))?;
        Ok(self.bos_first.into_iter().chain(enc.get_ids().iter().copied()).collect())
    }

    /// The text of `ids` (control tokens as their text, unused tokens as nothing, bytes that are
    /// not UTF-8 as U+FFFD): the concatenation of what a [`TokenStream`] emits.
    pub fn decode(&self, ids: &[u32]) -> String {
        let mut s = self.stream();
        let mut out: String = ids.iter().map(|&id| s.push(id)).collect();
        out.push_str(&s.finish());
        out
    }

    /// The bytes token `id` stands for (empty past the vocabulary).
    pub fn piece(&self, id: u32) -> &[u8] {
        self.pieces.get(id as usize).map_or(&[], Vec::as_slice)
    }

    pub fn n_vocab(&self) -> usize {
        self.pieces.len()
    }

    pub fn eos(&self) -> u32 {
        self.eos
    }

    /// Whether `id` ends generation: the eos, and the tokens llama.cpp takes as end of generation
    /// by their text (`<|im_end|>`, `<|endoftext|>`, ...).
    pub fn is_eog(&self, id: u32) -> bool {
        self.eog.binary_search(&id).is_ok()
    }

    /// The id of the token whose text is `text`.
    pub fn token(&self, text: &str) -> Option<u32> {
        self.texts.get(text).copied()
    }

    /// `prompt` as one ChatML user turn followed by the start of the assistant's, when the
    /// vocabulary has `<|im_start|>` and `<|im_end|>`.
    pub fn chat_wrap(&self, prompt: &str) -> Option<String> {
        (self.token("<|im_start|>").is_some() && self.token("<|im_end|>").is_some())
            .then(|| format!("<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n"))
    }

    /// A decoder fed one id at a time.
    pub fn stream(&self) -> TokenStream<'_> {
        TokenStream { tokenizer: self, pending: Vec::new() }
    }
}

/// Decodes ids one at a time: each [`push`](TokenStream::push) returns the text completed so far,
/// holding back the bytes of a character whose remaining bytes have not arrived yet. Bytes that
/// can never be UTF-8 come out as U+FFFD, exactly as `String::from_utf8_lossy` of the whole.
pub struct TokenStream<'a> {
    tokenizer: &'a Tokenizer,
    pending: Vec<u8>,
}

impl TokenStream<'_> {
    /// Adds token `id`; returns the text it completes (often empty, or more than its own piece).
    pub fn push(&mut self, id: u32) -> String {
        self.pending.extend_from_slice(self.tokenizer.piece(id));
        let mut out = String::new();
        loop {
            match std::str::from_utf8(&self.pending) {
                Ok(s) => {
                    out.push_str(s);
                    self.pending.clear();
                    return out;
                }
                Err(e) => {
                    let valid = e.valid_up_to();
                    out.push_str(std::str::from_utf8(&self.pending[..valid]).expect("checked valid"));
                    match e.error_len() {
                        // An incomplete character at the end: wait for its bytes.
                        None => {
                            self.pending.drain(..valid);
                            return out;
                        }
                        Some(bad) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            self.pending.drain(..valid + bad);
                        }
                    }
                }
            }
        }
    }

    /// What is still held back (an incomplete character at the end of the ids), as U+FFFD.
    pub fn finish(self) -> String {
        String::from_utf8_lossy(&self.pending).into_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qwen2_split_pieces() {
        let pre = pre_tokenizer();
        let split = |t: &str| pre_tokenize(&pre, t);
        // Contractions, letters with one leading non-letter, single digits, punctuation runs with
        // their newlines, whitespace before a word kept apart from the word's own space.
        assert_eq!(split("I'm ok"), ["I", "'m", "Ġok"]);
        assert_eq!(split("x  y"), ["x", "Ġ", "Ġy"]);
        assert_eq!(split("2024!\n\nhi"), ["2", "0", "2", "4", "!ĊĊ", "hi"]);
        assert_eq!(split("a\t\n b"), ["a", "ĉĊ", "Ġb"]);
        assert_eq!(split("end   "), ["end", "ĠĠĠ"]);
        assert_eq!(split("'ſ DON'T"), ["'Å¿", "ĠDON", "'T"]);
    }
}
