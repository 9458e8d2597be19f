//! The tokenizer on synthetic vocabularies: round trips, streaming decode, refusals, and the same
//! ids as llama.cpp (through scripts/llama_ref.py) on the same file.
mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use strata::host::gguf::{GgmlType, GgufFile, GgufWriter, Value};
use strata::host::model::synth::{build_in_memory, SynthFormats, SynthSpec};
use strata::host::model::vocab;
use strata::host::tokenizer::Tokenizer;

/// The tiny preset: the whole learned vocabulary, no filler.
fn tiny_file() -> GgufFile {
    GgufFile::from_bytes(build_in_memory(&SynthSpec::tiny()), "tiny.gguf").unwrap()
}

/// A one-layer model with Qwen3's 151936 tokens (mostly `[PAD<id>]` fillers), everything else as
/// small as the formats allow: a vocabulary file for llama.cpp.
fn qwen_sized_spec() -> SynthSpec {
    let mut s = SynthSpec::tiny();
    let c = &mut s.config;
    (c.n_layer, c.n_embd, c.n_head, c.n_head_kv, c.head_dim, c.n_expert, c.n_expert_used, c.n_ff_exp, c.n_vocab) =
        (1, 32, 1, 1, 32, 1, 1, 32, 151936);
    let q8 = GgmlType::from_name("Q8_0").unwrap();
    s.formats = SynthFormats { embd: q8, attn: q8, router: GgmlType::F32, gu: q8, down: q8, head: q8, tied_head: true };
    s
}

fn tmp(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("strata-tokenizer-{}-{name}", std::process::id()))
}

/// Strings that exercise every branch of the Qwen2 split and the byte mapping.
fn corpus() -> Vec<String> {
    let fixed = [
        "",
        " ",
        "Hello, world!",
        "The quick brown fox jumps over the lazy dog.",
        "I'm sure they've said we'll go; you're right, it's done, I'd say.",
        "DON'T SHOUT, I'M HERE. You'Re We'LL",
        "'s 't 're 've 'm 'll 'd ' s",
        "我们今天去公园散步。天气很好，阳光明媚。",
        "今日はいい天気ですね。カタカナ",
        "안녕하세요. 감사합니다.",
        "Быстрая коричневая лиса",
        "Größe Straße über Äpfel, très été, ¿Dónde?",
        "مرحبا بالعالم",
        "שלום עולם",
        "สวัสดีครับ",
        "नमस्ते दुनिया",
        "😀 😃 🎉 👍 ❤️ 🚀 ✨",
        "👨‍👩‍👧‍👦 family, 🏳️‍🌈 flag, 👍🏽 thumbs",
        "e\u{301} combining, a\u{308}\u{304} stacked",
        "    four spaces",
        "\t\ttabs\tinside\t",
        "trailing spaces   ",
        "   leading spaces",
        "line one\nline two\n\nline four",
        "crlf\r\nline\r\n\r\n",
        "\n\n\n",
        " \n \n ",
        "mixed \t \n\t  \r\n   x",
        "1234567890",
        "3.14159 2.71828 -273.15 1e-6",
        "1,000,000 and 12:30:45 on 2024-01-15",
        "٣٤٥ ௫ Ⅻ ½ ²³",
        "!!!???...;;;---",
        "«quotes» “curly” ‘single’ — – …",
        "a+b=c, x^2, (a*b)/c % d",
        "fn main() {\n    println!(\"{}\", 1 + 2);\n}\n",
        "def f(x):\n\treturn x ** 2  # square\n",
        "<html><body><p>Hi &amp; bye</p></body></html>",
        "SELECT * FROM t WHERE a = 'x';",
        "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
        "<|endoftext|>",
        "text<|endoftext|>more text<|im_end|>",
        "<|im_start|><|im_end|><|im_start|>",
        "<|im_start partial <| im_end |> <|endoftext",
        "[PAD1300] <|extra_0|> [PAD151935]",
        "\u{a0}nbsp\u{2003}em space\u{3000}ideographic",
        "zero\u{200b}width\u{feff}bom",
        "\u{0}\u{1}\u{7f} controls \u{1b}[0m",
        "∀x ∈ ℝ: x² ≥ 0, ∑ᵢ aᵢ = 1, √2 ≈ 1.414",
        "ǅ ǈ ǋ ǲ titlecase, ß ẞ, ﬁ ligature",
        "\u{10ffff}\u{e000} private use",
        "Ｆｕｌｌｗｉｄｔｈ ＡＢＣ １２３",
        "a'b c'd'e ''' '''s",
        "   \n   ",
        "x \u{2028} y \u{2029} z \u{85} w",
        "it'\u{17f} the long s, 'K kelvin",
        " \u{378} unassigned \u{378}x a\u{378}",
        "\u{e0001}\u{e0067} tags",
    ];
    fixed.iter().map(|s| s.to_string()).collect()
}

/// Random strings drawn from pieces of the corpus and random characters, seeded.
fn random_strings(seed: u64, n: usize) -> Vec<String> {
    let mut rng = SmallRng::seed_from_u64(seed);
    let pool: Vec<char> = corpus().concat().chars().collect();
    (0..n)
        .map(|_| {
            let len = rng.random_range(0..40);
            (0..len)
                .map(|_| match rng.random_range(0..10) {
                    0 => char::from_u32(rng.random_range(0x20..0x3000)).unwrap_or('?'),
                    1 => [' ', '\n', '\t', '\r'][rng.random_range(0..4)],
                    _ => pool[rng.random_range(0..pool.len())],
                })
                .collect()
        })
        .collect()
}

#[test]
fn round_trips() {
    let seed = common::seed("round_trips");
    for file in [tiny_file(), GgufFile::from_bytes(build_in_memory(&qwen_sized_spec()), "qwen-sized.gguf").unwrap()] {
        let tok = Tokenizer::from_gguf(&file).unwrap();
        for text in corpus().into_iter().chain(random_strings(seed, 300)) {
            let ids = tok.encode(&text).unwrap();
            assert_eq!(tok.decode(&ids), text, "ids {ids:?}");
            assert!(ids.iter().all(|&id| (id as usize) < tok.n_vocab()));
        }
    }
}

#[test]
fn specials_are_single_tokens_and_merges_apply() {
    let tok = Tokenizer::from_gguf(&tiny_file()).unwrap();
    let im_start = tok.token("<|im_start|>").unwrap();
    let im_end = tok.token("<|im_end|>").unwrap();
    assert_eq!(tok.encode("<|im_start|><|im_end|>").unwrap(), [im_start, im_end]);
    assert_eq!(tok.encode("<|endoftext|>").unwrap(), [tok.eos()]);
    assert!(tok.is_eog(tok.eos()) && tok.is_eog(im_end) && !tok.is_eog(im_start));
    // Learned merges shorten common text: " the" is one token.
    assert_eq!(tok.encode(" the").unwrap().len(), 1);
    assert!(tok.encode("The quick brown fox jumps over the lazy dog.").unwrap().len() < 20);
    // Fillers are never produced from text and render as nothing.
    let big = Tokenizer::from_gguf(&GgufFile::from_bytes(build_in_memory(&qwen_sized_spec()), "q.gguf").unwrap()).unwrap();
    let filler = big.token("[PAD151935]").unwrap();
    assert_eq!(filler, 151935);
    assert!(!big.encode("[PAD151935]").unwrap().contains(&filler));
    assert_eq!(big.decode(&[filler]), "");
    let wrapped = tok.chat_wrap("hi").unwrap();
    assert_eq!(wrapped, "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
    assert_eq!(tok.encode(&wrapped).unwrap().iter().filter(|&&id| id == im_start).count(), 2);
}

#[test]
fn stream_emits_only_whole_characters() {
    let seed = common::seed("stream_emits_only_whole_characters");
    let tok = Tokenizer::from_gguf(&tiny_file()).unwrap();
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut split_seen = false;
    for text in corpus().into_iter().chain(random_strings(seed ^ 1, 300)) {
        let ids = tok.encode(&text).unwrap();
        let mut s = tok.stream();
        let mut out = String::new();
        for &id in &ids {
            let piece = s.push(id);
            // A token ending inside a character must not emit its first bytes.
            split_seen |= std::str::from_utf8(tok.piece(id)).is_err();
            out.push_str(&piece);
        }
        out.push_str(&s.finish());
        assert_eq!(out, text);
    }
    assert!(split_seen, "the corpus should split some character across tokens");
    // Random ids (any byte sequence): the stream's concatenation is the lossy decoding of the
    // bytes, and nothing is held back at the end unless the bytes end inside a character.
    for _ in 0..500 {
        let ids: Vec<u32> = (0..rng.random_range(0..12)).map(|_| rng.random_range(0..tok.n_vocab() as u32)).collect();
        let bytes: Vec<u8> = ids.iter().flat_map(|&id| tok.piece(id).to_vec()).collect();
        let mut s = tok.stream();
        let mut out: String = ids.iter().map(|&id| s.push(id)).collect();
        out.push_str(&s.finish());
        assert_eq!(out, String::from_utf8_lossy(&bytes), "ids {ids:?}");
        assert_eq!(tok.decode(&ids), out);
    }
}

#[test]
fn files_without_a_usable_vocabulary_are_refused() {
    let refuse = |w: &GgufWriter| Tokenizer::from_gguf(&GgufFile::from_bytes(w.to_bytes(), "v.gguf").unwrap()).err().unwrap();
    let e = refuse(&GgufWriter::new());
    assert!(e.contains("no vocabulary") && e.contains("--prompt-ids"), "{e}");
    let mut none = SynthSpec::tiny();
    none.vocab = false;
    let e = Tokenizer::from_gguf(&GgufFile::from_bytes(build_in_memory(&none), "none.gguf").unwrap()).err().unwrap();
    assert!(e.contains("\"none\"") && e.contains("--prompt-ids"), "{e}");

    let mut w = GgufWriter::new();
    w.meta("tokenizer.ggml.model", Value::String("llama".into()));
    assert!(refuse(&w).contains("\"llama\" is not supported"));
    let v = vocab::synthetic(300);
    let keys = |model: &str, pre: Option<&str>| {
        let mut w = GgufWriter::new();
        w.meta("tokenizer.ggml.model", Value::String(model.into()));
        if let Some(p) = pre {
            w.meta("tokenizer.ggml.pre", Value::String(p.into()));
        }
        w.meta("tokenizer.ggml.tokens", Value::Array(v.tokens.iter().map(|t| Value::String(t.clone())).collect()))
            .meta("tokenizer.ggml.merges", Value::Array(v.merges.iter().map(|t| Value::String(t.clone())).collect()))
            .meta("tokenizer.ggml.eos_token_id", Value::U32(v.eos));
        w
    };
    assert!(refuse(&keys("gpt2", Some("llama3"))).contains("\"llama3\" is not supported"));
    assert!(refuse(&keys("gpt2", None)).contains("pre missing"));
    assert!(Tokenizer::from_gguf(&GgufFile::from_bytes(keys("gpt2", Some("qwen2")).to_bytes(), "ok.gguf").unwrap()).is_ok());
}

/// The venv's python when it has llama_cpp (scripts/setup-llama.sh), else skip or fail.
fn llama_python() -> Option<PathBuf> {
    let why = match common::venv_python() {
        None => "no .venv with the gguf package",
        Some(p) => {
            let ok = Command::new(&p).args(["-c", "import llama_cpp"]).output().is_ok_and(|o| o.status.success());
            if ok {
                return Some(p);
            }
            "the venv has no llama_cpp (scripts/setup-llama.sh)"
        }
    };
    common::skip_or_fail(common::tools_required(), "llama.cpp (llama-cpp-python)", why)
}

/// A JSON string literal, ASCII only (non-ASCII as \u escapes, surrogate pairs above U+FFFF).
fn json_string(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            ' '..='~' => out.push(c),
            _ => {
                let mut units = [0u16; 2];
                for u in c.encode_utf16(&mut units) {
                    out.push_str(&format!("\\u{u:04x}"));
                }
            }
        }
    }
    out.push('"');
    out
}

/// Parses `[[1, 2], [], [3]]`.
fn parse_id_lists(json: &str) -> Vec<Vec<u32>> {
    let inner = json.trim().strip_prefix('[').and_then(|s| s.strip_suffix(']')).expect("a JSON list");
    let mut out = Vec::new();
    let mut rest = inner.trim();
    while let Some(open) = rest.strip_prefix('[') {
        let close = open.find(']').expect("closed list");
        out.push(open[..close].split(',').map(str::trim).filter(|s| !s.is_empty()).map(|s| s.parse().unwrap()).collect());
        rest = open[close + 1..].trim_start().trim_start_matches(',').trim_start();
    }
    assert!(rest.is_empty(), "unparsed: {rest:?}");
    out
}

/// llama.cpp's ids for `texts`, through `scripts/llama_ref.py tokenize`.
fn llama_tokenize(python: &Path, model: &Path, texts: &[String]) -> Vec<Vec<u32>> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/llama_ref.py");
    let mut child = Command::new(python)
        .arg(script)
        .arg("tokenize")
        .arg(model)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let input = format!("[{}]", texts.iter().map(|t| json_string(t)).collect::<Vec<_>>().join(","));
    std::io::Write::write_all(child.stdin.as_mut().unwrap(), input.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "llama_ref.py tokenize failed: {}", String::from_utf8_lossy(&out.stderr));
    parse_id_lists(&String::from_utf8(out.stdout).unwrap())
}

#[test]
fn same_ids_as_llama_cpp() {
    let Some(python) = llama_python() else { return };
    let seed = common::seed("same_ids_as_llama_cpp");
    let texts: Vec<String> = corpus().into_iter().chain(random_strings(seed, 200)).collect();
    for (name, spec) in [("tiny", SynthSpec::tiny()), ("qwen-sized", qwen_sized_spec())] {
        let bytes = build_in_memory(&spec);
        let path = tmp(&format!("{name}.gguf"));
        std::fs::write(&path, &bytes).unwrap();
        let tok = Tokenizer::from_gguf(&GgufFile::from_bytes(bytes, &path).unwrap()).unwrap();
        let theirs = llama_tokenize(&python, &path, &texts);
        std::fs::remove_file(&path).unwrap();
        assert_eq!(theirs.len(), texts.len());
        let mut differ = Vec::new();
        for (text, want) in texts.iter().zip(&theirs) {
            let got = tok.encode(text).unwrap();
            if &got != want {
                let pieces = |ids: &[u32]| ids.iter().map(|&i| String::from_utf8_lossy(tok.piece(i)).into_owned()).collect::<Vec<_>>();
                differ.push(format!("{text:?}\n  strata    {got:?} {:?}\n  llama.cpp {want:?} {:?}", pieces(&got), pieces(want)));
            }
        }
        assert!(differ.is_empty(), "{name}: {} of {} strings tokenize differently:\n{}", differ.len(), texts.len(), differ.join("\n"));
        eprintln!("{name}: {} strings, identical ids", texts.len());
    }
}
