//! Synthetic models: the tensors and keys of MODELS.md sections 1 and 2, what the `gguf` package and
//! llama.cpp make of them, determinism, the streaming writer, the weights' scales, `strata synth`.
mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use strata::host::gguf::{GgmlType, GgufFile, GgufWriter, TensorDecl, Value};
use strata::host::model::synth::{self, build_in_memory, SynthFormats, SynthSpec};
use strata::host::reference::dequant_row_f32;
use strata::host::tokenizer::Tokenizer;
use strata_gpu_shared::f16::f16_to_f32;
use strata_gpu_shared::formats::WeightFormat;

fn tmp(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("strata-synth-{}-{name}", std::process::id()))
}

fn strata(args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    let bin = std::env::var("STRATA_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_strata").to_string());
    let out = Command::new(&bin).args(args).envs(env.iter().copied()).output().unwrap_or_else(|e| panic!("{bin}: {e}"));
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stdout).into(), String::from_utf8_lossy(&out.stderr).into())
}

fn open(spec: &SynthSpec) -> GgufFile {
    GgufFile::from_bytes(build_in_memory(spec), "synth.gguf").unwrap()
}

/// The tensors MODELS.md section 1 lists for `spec`, written out independently of synth.rs.
fn expected_tensors(spec: &SynthSpec) -> Vec<(String, Vec<u64>, GgmlType)> {
    let (c, f) = (&spec.config, &spec.formats);
    let e = c.n_embd as u64;
    let (q, kv, hd, ff, x) =
        ((c.n_head * c.head_dim) as u64, (c.n_head_kv * c.head_dim) as u64, c.head_dim as u64, c.n_ff_exp as u64, c.n_expert as u64);
    let mut t = vec![("token_embd.weight".to_string(), vec![e, c.n_vocab as u64], f.embd), ("output_norm.weight".into(), vec![e], GgmlType::F32)];
    if !f.tied_head {
        t.push(("output.weight".into(), vec![e, c.n_vocab as u64], f.head));
    }
    for l in 0..c.n_layer {
        let per_layer = [
            ("attn_norm", vec![e], GgmlType::F32),
            ("attn_q", vec![e, q], f.attn),
            ("attn_k", vec![e, kv], f.attn),
            ("attn_v", vec![e, kv], f.attn),
            ("attn_output", vec![q, e], f.attn),
            ("attn_q_norm", vec![hd], GgmlType::F32),
            ("attn_k_norm", vec![hd], GgmlType::F32),
            ("ffn_norm", vec![e], GgmlType::F32),
            ("ffn_gate_inp", vec![e, x], f.router),
            ("ffn_gate_exps", vec![e, ff, x], f.gu),
            ("ffn_up_exps", vec![e, ff, x], f.gu),
            ("ffn_down_exps", vec![ff, e, x], f.down),
        ];
        t.extend(per_layer.into_iter().map(|(n, d, ty)| (format!("blk.{l}.{n}.weight"), d, ty)));
    }
    t.sort_by(|a, b| a.0.cmp(&b.0));
    t
}

fn u32_key(f: &GgufFile, key: &str) -> u64 {
    f.get(key).and_then(Value::as_u64).unwrap_or_else(|| panic!("no {key}"))
}

#[test]
fn files_hold_every_tensor_and_key_of_qwen3moe() {
    let mut tied = SynthSpec::tiny();
    tied.formats.tied_head = true;
    tied.vocab = false;
    tied.config.n_vocab = 100;
    for spec in [SynthSpec::tiny(), tied] {
        let f = open(&spec);
        let mut got: Vec<_> = f.tensors.iter().map(|t| (t.name.clone(), t.dims.clone(), t.ty)).collect();
        got.sort_by(|a, b| a.0.cmp(&b.0));
        assert_eq!(got, expected_tensors(&spec));
        let c = &spec.config;
        assert_eq!(f.get("general.architecture").and_then(Value::as_str), Some("qwen3moe"));
        let keys = [
            ("context_length", c.n_ctx_train),
            ("embedding_length", c.n_embd),
            ("block_count", c.n_layer),
            ("feed_forward_length", c.n_ff_exp * c.n_expert_used),
            ("expert_feed_forward_length", c.n_ff_exp),
            ("expert_count", c.n_expert),
            ("expert_used_count", c.n_expert_used),
            ("attention.head_count", c.n_head),
            ("attention.head_count_kv", c.n_head_kv),
            ("attention.key_length", c.head_dim),
            ("attention.value_length", c.head_dim),
        ];
        for (k, v) in keys {
            assert_eq!(u32_key(&f, &format!("qwen3moe.{k}")), v as u64, "{k}");
        }
        assert_eq!(f.get("qwen3moe.rope.freq_base"), Some(&Value::F32(1e6)));
        assert_eq!(f.get("qwen3moe.attention.layer_norm_rms_epsilon"), Some(&Value::F32(1e-6)));
        if spec.vocab {
            assert_eq!(f.get("tokenizer.ggml.model").and_then(Value::as_str), Some("gpt2"));
            assert_eq!(f.get("tokenizer.ggml.pre").and_then(Value::as_str), Some("qwen2"));
            assert_eq!(f.get("tokenizer.ggml.add_bos_token"), Some(&Value::Bool(false)));
            let tok = Tokenizer::from_gguf(&f).unwrap();
            assert_eq!(tok.n_vocab(), c.n_vocab);
            assert_eq!(u32_key(&f, "tokenizer.ggml.eos_token_id"), tok.token("<|endoftext|>").unwrap() as u64);
            assert_eq!(u32_key(&f, "tokenizer.ggml.padding_token_id"), tok.eos() as u64);
        } else {
            assert_eq!(f.get("tokenizer.ggml.model").and_then(Value::as_str), Some("none"));
            assert_eq!(u32_key(&f, "qwen3moe.vocab_size"), c.n_vocab as u64);
        }
    }
}

/// FNV-1a 64, the checksum the Python side computes too.
fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xCBF2_9CE4_8422_2325u64, |h, &b| (h ^ b as u64).wrapping_mul(0x0100_0000_01B3))
}

/// The names the `gguf` package gives value types.
const VALUE_TYPES: [&str; 13] =
    ["UINT8", "INT8", "UINT16", "INT16", "UINT32", "INT32", "FLOAT32", "BOOL", "STRING", "ARRAY", "UINT64", "INT64", "FLOAT64"];

/// A value as one line of text both sides can write: integers in decimal, floats as their bits,
/// strings and arrays as a checksum.
fn value_line(v: &Value) -> String {
    let ty = VALUE_TYPES[v.type_id() as usize];
    let element = |v: &Value| -> Vec<u8> {
        match v {
            Value::String(s) => s.as_bytes().to_vec(),
            Value::F32(x) => x.to_bits().to_string().into_bytes(),
            Value::Bool(b) => (*b as u8).to_string().into_bytes(),
            other => other.as_u64().map_or_else(|| other.to_string(), |n| n.to_string()).into_bytes(),
        }
    };
    match v {
        Value::Array(items) => {
            let joined: Vec<u8> = items.iter().flat_map(|i| [element(i), vec![0]].concat()).collect();
            let et = items.first().map_or("UINT8", |i| VALUE_TYPES[i.type_id() as usize]);
            format!("ARRAY {et} {} {}", items.len(), fnv(&joined))
        }
        Value::String(s) => format!("{ty} {}", fnv(s.as_bytes())),
        other => format!("{ty} {}", String::from_utf8(element(other)).unwrap()),
    }
}

const GGUF_SUMMARY: &str = r#"
import sys
import numpy as np
from gguf import GGUFReader

def fnv(b):
    h = 0xCBF29CE484222325
    for x in b:
        h = ((h ^ x) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h

def element(kind, part):
    if kind == "STRING":
        return bytes(part)
    if kind == "FLOAT32":
        return str(int(part.view(np.uint32)[0])).encode()
    return str(int(part[0])).encode()

r = GGUFReader(sys.argv[1])
for name, f in r.fields.items():
    if name.startswith("GGUF."):
        continue
    kind = f.types[0].name
    if kind == "ARRAY":
        et = f.types[-1].name
        joined = b"".join(element(et, f.parts[i]) + b"\0" for i in f.data)
        print(f"{name} ARRAY {et} {len(f.data)} {fnv(joined)}")
    elif kind == "STRING":
        print(f"{name} STRING {fnv(bytes(f.parts[f.data[0]]))}")
    else:
        print(f"{name} {kind} {element(kind, f.parts[f.data[0]]).decode()}")
for t in r.tensors:
    print(f"tensor {t.name} {t.tensor_type.name} {','.join(str(int(d)) for d in t.shape)} {int(t.data_offset)}")
"#;

#[test]
fn gguf_package_reads_the_same_keys_and_tensors() {
    let Some(python) = common::venv_python() else {
        return common::skip_or_fail(common::tools_required(), "gguf python package", "no .venv with gguf").unwrap_or(());
    };
    let mut no_vocab = SynthSpec::tiny();
    no_vocab.vocab = false;
    no_vocab.formats.tied_head = true;
    for (name, spec) in [("tiny", SynthSpec::tiny()), ("no-vocab", no_vocab)] {
        let path = tmp(&format!("{name}.gguf"));
        synth::write(&spec, &path, &mut |_| {}).unwrap();
        let out = Command::new(&python).args(["-c", GGUF_SUMMARY]).arg(&path).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let f = GgufFile::open(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        let mut want: Vec<String> = f.metadata.iter().map(|(k, v)| format!("{k} {}", value_line(v))).collect();
        want.extend(f.tensors.iter().map(|t| {
            let dims: Vec<String> = t.dims.iter().map(u64::to_string).collect();
            format!("tensor {} {} {} {}", t.name, t.ty.name(), dims.join(","), t.offset)
        }));
        let got: Vec<String> = String::from_utf8(out.stdout).unwrap().lines().map(str::to_string).collect();
        assert_eq!(got, want, "{name}");
    }
}

#[test]
fn same_seed_same_bytes_other_seed_other_weights() {
    let spec = SynthSpec::tiny();
    let a = build_in_memory(&spec);
    assert_eq!(a, build_in_memory(&spec));
    let mut other = spec.clone();
    other.seed = 2;
    let (fa, fb) = (GgufFile::from_bytes(a, "a").unwrap(), open(&other));
    for (ta, tb) in fa.tensors.iter().zip(&fb.tensors) {
        assert_eq!((&ta.name, &ta.dims, ta.ty), (&tb.name, &tb.dims, tb.ty));
        assert_ne!(fa.data(ta), fb.data(tb), "{} is the same under another seed", ta.name);
    }
}

/// A spec whose expert tensors take several generation chunks (1 MiB each).
fn multi_chunk_spec() -> SynthSpec {
    let mut s = SynthSpec::tiny();
    (s.config.n_layer, s.config.n_embd, s.config.n_expert, s.config.n_ff_exp) = (2, 512, 32, 512);
    s
}

#[test]
fn streamed_files_equal_the_in_memory_build_whatever_the_threads() {
    let spec = multi_chunk_spec();
    let want = build_in_memory(&spec);
    let f = GgufFile::from_bytes(want.clone(), "m").unwrap();
    assert!(f.tensor("blk.0.ffn_gate_exps.weight").unwrap().bytes > 3 << 20, "the test needs several chunks");
    let path = tmp("streamed.gguf");
    let mut progress = 0;
    let n = synth::write(&spec, &path, &mut |b| progress += b).unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), want);
    assert_eq!((n, spec.file_len().unwrap()), (want.len() as u64, want.len() as u64));
    assert_eq!(progress, f.tensors.iter().map(|t| t.bytes).sum::<u64>());
    // The CLI with one thread and with three writes the same bytes.
    let args = ["synth", "--layers", "2", "--embd", "512", "--experts", "32", "--ff", "512", "--out", path.to_str().unwrap()];
    for threads in ["1", "3"] {
        let (code, out, err) = strata(&args, &[("RAYON_NUM_THREADS", threads)]);
        assert_eq!(code, 0, "{out}{err}");
        assert!(std::fs::read(&path).unwrap() == want, "{threads} threads wrote other bytes");
    }
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn streaming_writer_matches_the_in_memory_writer() {
    let seed = common::seed("streaming_writer_matches_the_in_memory_writer");
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut whole = GgufWriter::new();
    let mut streamed = GgufWriter::new();
    for w in [&mut whole, &mut streamed] {
        w.meta("general.alignment", Value::U32(64)).meta("t.name", Value::String("x".into()));
    }
    let mut decls = Vec::new();
    let mut datas = Vec::new();
    for (i, ty) in GgmlType::ALL.into_iter().enumerate() {
        let dims = vec![ty.block_values() * rng.random_range(1..4u64), rng.random_range(1..5)];
        let mut data = vec![0u8; (dims[0] / ty.block_values() * ty.block_bytes() * dims[1]) as usize];
        rng.fill(&mut data[..]);
        whole.tensor(&format!("t{i}"), &dims, ty, data.clone()).unwrap();
        decls.push(TensorDecl { name: format!("t{i}"), dims, ty });
        datas.push(data);
    }
    let mut out = Vec::new();
    let n = streamed.write_streaming(&mut out, &decls, |i, sink| datas[i].chunks(7).try_for_each(|c| sink.write(c))).unwrap();
    assert_eq!(out, whole.to_bytes());
    assert_eq!((n, streamed.streaming_len(&decls).unwrap()), (out.len() as u64, out.len() as u64));
    // A tensor given the wrong number of bytes is refused, naming it.
    let e = streamed.write_streaming(&mut Vec::new(), &decls, |i, sink| sink.write(&datas[i][1..])).unwrap_err();
    assert!(e.to_string().contains("tensor t0"), "{e}");
}

/// Every value of tensor `t` as f32.
fn values(f: &GgufFile, name: &str) -> Vec<f32> {
    let t = f.tensor(name).unwrap();
    let data = f.data(t);
    match t.ty {
        GgmlType::F32 => data.chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect(),
        GgmlType::F16 => data.chunks_exact(2).map(|b| f16_to_f32(u16::from_le_bytes([b[0], b[1]]))).collect(),
        GgmlType::Bf16 => data.chunks_exact(2).map(|b| f32::from_bits((u16::from_le_bytes([b[0], b[1]]) as u32) << 16)).collect(),
        GgmlType::Quant(fmt) => {
            for block in data.chunks_exact(fmt.block_bytes()) {
                let d = f16_to_f32(u16::from_le_bytes([block[fmt.off_d()], block[fmt.off_d() + 1]]));
                assert!(d.is_finite() && d != 0.0, "{name}: block scale {d}");
            }
            let mut out = Vec::new();
            dequant_row_f32(fmt, data, t.elements() as usize, &mut out);
            out
        }
    }
}

/// Mean and standard error of the per-block means of `x` (values of a block share a scale, so
/// blocks, not values, are the independent samples).
fn block_mean(x: &[f64], block: usize) -> (f64, f64) {
    let means: Vec<f64> = x.chunks(block).map(|b| b.iter().sum::<f64>() / b.len() as f64).collect();
    let n = means.len() as f64;
    let mean = means.iter().sum::<f64>() / n;
    let var = means.iter().map(|m| (m - mean).powi(2)).sum::<f64>() / (n - 1.0).max(1.0);
    (mean, (var / n).sqrt())
}

#[test]
fn weights_have_the_documented_scales() {
    for ty in GgmlType::ALL {
        let mut spec = SynthSpec::tiny();
        spec.config.n_ff_exp = 256;
        spec.formats = SynthFormats { embd: ty, attn: ty, router: ty, gu: ty, down: ty, head: ty, tied_head: false };
        let f = open(&spec);
        for t in &f.tensors {
            let v = values(&f, &t.name);
            if t.name.ends_with("norm.weight") {
                assert!(v.iter().all(|x| (0.8..=1.2).contains(x)), "{}", t.name);
                continue;
            }
            let block = t.ty.block_values().max(32) as usize;
            // Unit-variance outputs: k E[w^2] = 1 (the embedding: unit-variance values), within
            // 4 standard errors and 2% (the measured level moment, the fp16 scale).
            let k = if t.name == "token_embd.weight" { 1.0 } else { t.dims[0] as f64 };
            let squares: Vec<f64> = v.iter().map(|&x| x as f64 * x as f64 * k).collect();
            let (moment, se) = block_mean(&squares, block);
            assert!((moment - 1.0).abs() < 4.0 * se + 0.02, "{} {}: k E[w^2] = {moment:.4} (standard error {se:.4})", ty.name(), t.name);
            // Zero mean: random signs per block.
            let (mean, se) = block_mean(&v.iter().map(|&x| x as f64).collect::<Vec<_>>(), block);
            assert!(mean.abs() < 5.0 * se, "{} {}: mean {mean:e} (standard error {se:e})", ty.name(), t.name);
        }
    }
}

/// `scripts/llama_ref.py logits` on `path` for `ids`: one row of n_vocab logits per id.
fn llama_logits(python: &Path, path: &Path, ids: &[u32]) -> Vec<Vec<f32>> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/llama_ref.py");
    let out_file = path.with_extension("logits");
    let ids_arg = ids.iter().map(u32::to_string).collect::<Vec<_>>().join(",");
    let out = Command::new(python).arg(script).args(["logits"]).arg(path).args(["--ids", &ids_arg, "--out"]).arg(&out_file).output().unwrap();
    assert!(out.status.success(), "llama_ref.py logits: {}", String::from_utf8_lossy(&out.stderr));
    let raw = std::fs::read(&out_file).unwrap();
    std::fs::remove_file(&out_file).unwrap();
    let all: Vec<f32> = raw.chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect();
    all.chunks_exact(all.len() / ids.len()).map(<[f32]>::to_vec).collect()
}

/// The venv's python when it imports llama_cpp; otherwise the test skips (or fails with
/// `STRATA_REQUIRE_TOOLS=1`).
fn llama_python() -> Option<PathBuf> {
    let python = common::venv_python().filter(|p| Command::new(p).args(["-c", "import llama_cpp"]).output().is_ok_and(|o| o.status.success()));
    python.or_else(|| common::skip_or_fail(common::tools_required(), "llama.cpp (llama-cpp-python)", "the venv has no llama_cpp (scripts/setup-llama.sh)"))
}

/// Every position's logits finite, with a spread (standard deviation) between 0.5 and 2.
fn assert_finite_unit_spread(name: &str, rows: &[Vec<f32>]) {
    for (j, row) in rows.iter().enumerate() {
        assert!(row.iter().all(|x| x.is_finite()), "{name}: position {j} has non-finite logits");
        let mean = row.iter().map(|&x| x as f64).sum::<f64>() / row.len() as f64;
        let sd = (row.iter().map(|&x| (x as f64 - mean).powi(2)).sum::<f64>() / row.len() as f64).sqrt();
        assert!((0.5..2.0).contains(&sd), "{name}: position {j}: logits spread {sd}");
    }
}

fn correlation(a: &[f32], b: &[f32]) -> f64 {
    let n = a.len() as f64;
    let (ma, mb) = (a.iter().map(|&x| x as f64).sum::<f64>() / n, b.iter().map(|&x| x as f64).sum::<f64>() / n);
    let cov: f64 = a.iter().zip(b).map(|(&x, &y)| (x as f64 - ma) * (y as f64 - mb)).sum();
    let (va, vb): (f64, f64) = (a.iter().map(|&x| (x as f64 - ma).powi(2)).sum(), b.iter().map(|&y| (y as f64 - mb).powi(2)).sum());
    cov / (va * vb).sqrt()
}

/// llama.cpp loads and evaluates the tiny model and a 48-layer one: finite logits of about unit
/// spread at every position (the scales keep the residual stream sane through the layers).
#[test]
fn llama_cpp_evaluates_synthetic_models() {
    let Some(python) = llama_python() else { return };
    let mut deep = SynthSpec::tiny();
    deep.config.n_layer = 48;
    for (name, spec) in [("tiny", SynthSpec::tiny()), ("48 layers", deep)] {
        let path = tmp("eval.gguf");
        synth::write(&spec, &path, &mut |_| {}).unwrap();
        let tok = Tokenizer::from_gguf(&GgufFile::open(&path).unwrap()).unwrap();
        let ids = tok.encode(&tok.chat_wrap("Hello! What is the capital of France? 我们今天去公园散步。").unwrap()).unwrap();
        let rows = llama_logits(&python, &path, &ids);
        std::fs::remove_file(&path).unwrap();
        assert_finite_unit_spread(name, &rows);
        // The logits follow the tokens: what the layers add to the residual stream (partly shared
        // between positions: attention averages them) does not swamp it. Seen: at most 0.52 for
        // the tiny model, 0.87 for 48 layers.
        for w in rows.windows(2) {
            let r = correlation(&w[0], &w[1]);
            assert!(r.abs() < 0.95, "{name}: neighbouring positions' logits correlate {r}");
        }
        eprintln!("{name}: {} positions, finite logits of unit spread", rows.len());
    }
}

#[test]
fn cli_writes_and_says_what() {
    let path = tmp("cli.gguf");
    let p = path.to_str().unwrap();
    let (code, out, err) =
        strata(&["synth", "--out", p, "--layers", "2", "--gu", "iq2_xxs", "--ff", "256", "--down", "Q6_K", "--tied", "--seed", "9"], &[]);
    assert_eq!(code, 0, "{err}");
    let len = std::fs::metadata(&path).unwrap().len();
    for needle in [
        format!("wrote {p}"),
        "2 layers".into(),
        "8 experts (2 used)".into(),
        "gate/up IQ2_XXS".into(),
        "down Q6_K".into(),
        "head tied".into(),
        format!("{len} bytes"),
        "seed 9".into(),
    ] {
        assert!(out.contains(&needle), "`{needle}` not in {out}");
    }
    let f = GgufFile::open(&path).unwrap();
    assert!(f.tensor("output.weight").is_err());
    assert_eq!(f.tensor("blk.1.ffn_up_exps.weight").unwrap().ty, GgmlType::Quant(WeightFormat::Iq2Xxs));
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn cli_refuses_bad_values_with_status_2() {
    let path = tmp("refused.gguf");
    let p = path.to_str().unwrap();
    let cases: [(&[&str], &str); 10] = [
        (&["--gu", "IQ9_Z"], "unknown format `IQ9_Z`"),
        (&["--layers", "0"], "not a whole number between 1"),
        (&["--experts", "many"], "not a whole number"),
        (&["--preset", "huge"], "huge"),
        (&["--heads", "3", "--kv-heads", "2"], "3 heads are not a multiple of 2 kv heads"),
        (&["--embd", "384"], "rows of 384 values are not whole blocks of 256"),
        (&["--ff", "48"], "rows of 48 values are not whole blocks of 32"),
        (&["--used", "9"], "9 experts used of 8"),
        (&["--vocab", "100"], "too small"),
        (&["--head-dim", "63", "--attn", "F32"], "head dimension 63 is odd"),
    ];
    for (args, needle) in cases {
        let all: Vec<&str> = ["synth", "--out", p].iter().chain(args).copied().collect();
        let (code, out, err) = strata(&all, &[]);
        assert_eq!(code, 2, "{args:?}: {out}{err}");
        assert!(err.contains(needle), "{args:?}: `{needle}` not in {err}");
        assert!(!path.exists(), "{args:?} wrote a file");
    }
}

/// The tensors MODELS.md section 2 lists for a qwen35moe `spec`, written out independently of
/// synth_hybrid.rs: per trunk layer the GDN tensors (layer i with `(i + 1) % interval != 0`) or
/// the gated attention ones, the routed and shared experts of every layer, and the MTP block.
fn expected_hybrid_tensors(spec: &SynthSpec) -> Vec<(String, Vec<u64>, GgmlType)> {
    let (c, f, h) = (&spec.config, &spec.formats, spec.hybrid.as_ref().unwrap());
    let e = c.n_embd as u64;
    let (q, kv, hd, ff, x, sh) = ((c.n_head * c.head_dim) as u64, (c.n_head_kv * c.head_dim) as u64, c.head_dim as u64, c.n_ff_exp as u64, c.n_expert as u64, h.n_ff_shexp as u64);
    let (kd, vd, nv) = ((h.d_state * h.n_k_heads) as u64, (h.d_state * h.n_v_heads) as u64, h.n_v_heads as u64);
    let f32_ = GgmlType::F32;
    let mut t = vec![
        ("token_embd.weight".to_string(), vec![e, c.n_vocab as u64], f.embd),
        ("output_norm.weight".into(), vec![e], f32_),
        ("output.weight".into(), vec![e, c.n_vocab as u64], f.head),
    ];
    let attention = [
        ("attn_q.weight", vec![e, 2 * q], f.attn),
        ("attn_k.weight", vec![e, kv], f.attn),
        ("attn_v.weight", vec![e, kv], f.attn),
        ("attn_output.weight", vec![q, e], f.attn),
        ("attn_q_norm.weight", vec![hd], f32_),
        ("attn_k_norm.weight", vec![hd], f32_),
    ];
    let gdn = [
        ("attn_qkv.weight", vec![e, 2 * kd + vd], f.attn),
        ("attn_gate.weight", vec![e, vd], f.attn),
        ("ssm_conv1d.weight", vec![h.d_conv as u64, 2 * kd + vd], f32_),
        ("ssm_dt.bias", vec![nv], f32_),
        ("ssm_a", vec![nv], f32_),
        ("ssm_beta.weight", vec![e, nv], f.router),
        ("ssm_alpha.weight", vec![e, nv], f.router),
        ("ssm_norm.weight", vec![h.d_state as u64], f32_),
        ("ssm_out.weight", vec![vd, e], f.attn),
    ];
    let every = [
        ("attn_norm.weight", vec![e], f32_),
        ("post_attention_norm.weight", vec![e], f32_),
        ("ffn_gate_inp.weight", vec![e, x], f.router),
        ("ffn_gate_exps.weight", vec![e, ff, x], f.gu),
        ("ffn_up_exps.weight", vec![e, ff, x], f.gu),
        ("ffn_down_exps.weight", vec![ff, e, x], f.down),
        ("ffn_gate_inp_shexp.weight", vec![e], f32_),
        ("ffn_gate_shexp.weight", vec![e, sh], f.attn),
        ("ffn_up_shexp.weight", vec![e, sh], f.attn),
        ("ffn_down_shexp.weight", vec![sh, e], f.attn),
    ];
    let mtp = [("nextn.eh_proj.weight", vec![2 * e, e], f.attn), ("nextn.enorm.weight", vec![e], f32_), ("nextn.hnorm.weight", vec![e], f32_)];
    for l in 0..c.n_layer + h.mtp as usize {
        let mixer: &[_] = if l < c.n_layer && (l + 1) % h.full_attention_interval != 0 { &gdn } else { &attention };
        let extra: &[_] = if l == c.n_layer { &mtp } else { &[] };
        for (n, d, ty) in every.iter().chain(mixer).chain(extra) {
            t.push((format!("blk.{l}.{n}"), d.clone(), *ty));
        }
    }
    t.sort_by(|a, b| a.0.cmp(&b.0));
    t
}

#[test]
fn qwen35moe_files_hold_every_tensor_and_key() {
    let mut wide = SynthSpec::qwen35moe_35b_a3b();
    (wide.config.n_layer, wide.config.n_expert, wide.config.n_vocab) = (8, 8, 512);
    for spec in [SynthSpec::qwen35moe_tiny(), wide] {
        let f = open(&spec);
        let mut got: Vec<_> = f.tensors.iter().map(|t| (t.name.clone(), t.dims.clone(), t.ty)).collect();
        got.sort_by(|a, b| a.0.cmp(&b.0));
        assert_eq!(got, expected_hybrid_tensors(&spec));
        let (c, h) = (&spec.config, spec.hybrid.as_ref().unwrap());
        assert_eq!(f.get("general.architecture").and_then(Value::as_str), Some("qwen35moe"));
        let keys = [
            ("block_count", c.n_layer + 1),
            ("nextn_predict_layers", 1),
            ("expert_shared_feed_forward_length", h.n_ff_shexp),
            ("rope.dimension_count", c.n_rot),
            ("ssm.conv_kernel", h.d_conv),
            ("ssm.inner_size", h.d_state * h.n_v_heads),
            ("ssm.state_size", h.d_state),
            ("ssm.time_step_rank", h.n_v_heads),
            ("ssm.group_count", h.n_k_heads),
            ("full_attention_interval", h.full_attention_interval),
            ("vocab_size", c.n_vocab),
        ];
        for (key, want) in keys {
            assert_eq!(u32_key(&f, &format!("qwen35moe.{key}")), want as u64, "{key}");
        }
        let Some(Value::Array(sections)) = f.get("qwen35moe.rope.dimension_sections") else { panic!("no rope sections") };
        let sum: i64 = sections.iter().map(|v| match v {
            Value::I32(s) => *s as i64,
            other => panic!("a section is {other:?}"),
        }).sum();
        assert_eq!((sections.len(), sum), (4, c.n_rot as i64 / 2));
        // The decay's A must be negative, so that g = softplus(..) * A <= 0.
        for l in (0..c.n_layer).filter(|&l| (l + 1) % h.full_attention_interval != 0) {
            let a = values(&f, &format!("blk.{l}.ssm_a"));
            assert!(a.iter().all(|&v| (-1.0..=-0.1).contains(&v)), "blk.{l}.ssm_a: {a:?}");
        }
    }
}

/// llama.cpp loads and evaluates the tiny qwen35moe file (two GDN and two attention layers,
/// value heads tiled over key heads, an MTP block it skips) and a 4-layer file of
/// Qwen3.5-35B-A3B's layer shapes: finite logits of about unit spread at every position.
#[test]
fn llama_cpp_evaluates_qwen35moe_files() {
    let Some(python) = llama_python() else { return };
    let mut wide = SynthSpec::qwen35moe_35b_a3b();
    (wide.config.n_layer, wide.config.n_expert, wide.config.n_vocab) = (4, 16, 2048);
    let seed = common::seed("llama_cpp_evaluates_qwen35moe_files");
    let mut rng = SmallRng::seed_from_u64(seed);
    for (name, spec) in [("tiny", SynthSpec::qwen35moe_tiny()), ("35b-a3b layers", wide)] {
        let path = tmp("eval35.gguf");
        synth::write(&spec, &path, &mut |_| {}).unwrap();
        let ids: Vec<u32> = (0..12).map(|_| rng.random_range(0..spec.config.n_vocab as u32)).collect();
        let rows = llama_logits(&python, &path, &ids);
        std::fs::remove_file(&path).unwrap();
        assert_eq!((rows.len(), rows[0].len()), (ids.len(), spec.config.n_vocab), "{name}");
        assert_finite_unit_spread(name, &rows);
        eprintln!("{name}: {} positions, finite logits of unit spread", rows.len());
    }
}

#[test]
fn qwen35moe_shapes_are_checked() {
    let bad = |edit: fn(&mut SynthSpec), says: &str| {
        let mut s = SynthSpec::qwen35moe_tiny();
        edit(&mut s);
        let e = s.validate().unwrap_err();
        assert!(e.contains(says), "`{e}` does not say `{says}`");
    };
    bad(|s| s.config.n_rot = 15, "rope dimension count 15");
    bad(|s| s.config.n_rot = 128, "rope dimension count 128");
    bad(|s| s.hybrid.as_mut().unwrap().rope_sections = [3, 3, 3, 0], "sum to 9");
    bad(|s| s.hybrid.as_mut().unwrap().n_v_heads = 3, "3 value heads are not a multiple of 2 key heads");
    bad(|s| s.hybrid.as_mut().unwrap().full_attention_interval = 5, "no full-attention layer among 4 layers");
    bad(|s| s.hybrid.as_mut().unwrap().d_conv = 0, "conv kernel must be between 1");
    bad(|s| s.vocab = true, "without a vocabulary");
    let (code, _, err) = strata(&["synth", "--arch", "qwen35moe", "--preset", "30b-a3b", "--out", &tmp("none.gguf").display().to_string()], &[]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("there is no 30b-a3b preset for qwen35moe"), "{err}");
    let path = tmp("q35-cli.gguf");
    let (code, out, err) = strata(&["synth", "--arch", "qwen35moe", "--out", &path.display().to_string()], &[]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("qwen35moe, 4 layers") && out.contains("full attention every 2 layers") && out.contains("an MTP block"), "{out}");
    assert_eq!(std::fs::read(&path).unwrap(), build_in_memory(&SynthSpec::qwen35moe_tiny()));
    std::fs::remove_file(&path).unwrap();
}
