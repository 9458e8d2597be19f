//! GGUF reading and writing: round trips, both directions against the `gguf` Python package,
//! a corpus of broken files that must each be refused with an error naming the file (and the
//! tensor), and seeded random corruption that must never panic.
mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use strata::host::gguf::reader::ErrorKind;
use strata::host::gguf::{GgmlType, GgufError, GgufFile, GgufWriter, Value};
use strata::host::parity::random_weights;
use strata_gpu_shared::formats::WeightFormat;

fn tmp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("strata-gguf-files-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

/// Random bytes of a valid tensor of `ty` with `rows` rows of `k` values (finite scales).
fn tensor_bytes(rng: &mut SmallRng, ty: GgmlType, k: usize, rows: usize) -> Vec<u8> {
    match ty {
        GgmlType::Quant(f) => random_weights(rng, f, rows, k),
        GgmlType::F32 => (0..k * rows).flat_map(|_| rng.random_range(-4.0f32..4.0).to_le_bytes()).collect(),
        // fp16 / bf16 patterns with the exponent below all-ones: finite.
        GgmlType::F16 => (0..k * rows).flat_map(|_| (rng.random::<u16>() & 0x7bff).to_le_bytes()).collect(),
        GgmlType::Bf16 => (0..k * rows).flat_map(|_| (rng.random::<u16>() & 0x7f7f).to_le_bytes()).collect(),
    }
}

/// A small valid file: metadata of every value type, one tensor of every type in `types`.
fn sample_of(rng: &mut SmallRng, types: &[GgmlType]) -> (GgufWriter, Vec<(String, Vec<u64>, GgmlType, Vec<u8>)>) {
    let mut w = GgufWriter::new();
    w.meta("general.architecture", Value::String("strata-test".into()))
        .meta("t.u8", Value::U8(7))
        .meta("t.i8", Value::I8(-7))
        .meta("t.u16", Value::U16(65535))
        .meta("t.i16", Value::I16(-300))
        .meta("t.u32", Value::U32(1 << 31))
        .meta("t.i32", Value::I32(-5))
        .meta("t.f32", Value::F32(1.5))
        .meta("t.bool", Value::Bool(true))
        .meta("t.u64", Value::U64(u64::MAX))
        .meta("t.i64", Value::I64(i64::MIN))
        .meta("t.f64", Value::F64(-0.125))
        .meta("t.strings", Value::Array(vec![Value::String("ab".into()), Value::String(String::new()), Value::String("ü".into())]))
        .meta("t.nested", Value::Array(vec![Value::Array(vec![Value::I32(1), Value::I32(2)]), Value::Array(vec![Value::I32(3)])]));
    let mut tensors = Vec::new();
    for (i, &ty) in types.iter().enumerate() {
        let k = 256 * (1 + i % 2);
        let dims = vec![k as u64, 2, 1 + (i % 3) as u64];
        let rows = (dims[1] * dims[2]) as usize;
        let data = tensor_bytes(rng, ty, k, rows);
        let name = format!("blk.{i}.{}", ty.name().to_lowercase());
        w.tensor(&name, &dims, ty, data.clone()).unwrap();
        tensors.push((name, dims, ty, data));
    }
    (w, tensors)
}

fn sample(rng: &mut SmallRng) -> (GgufWriter, Vec<(String, Vec<u64>, GgmlType, Vec<u8>)>) {
    sample_of(rng, &GgmlType::ALL)
}

#[test]
fn writer_output_reads_back_identically() {
    let seed = common::seed("writer_output_reads_back_identically");
    let mut rng = SmallRng::seed_from_u64(seed);
    let (w, tensors) = sample(&mut rng);
    let path = tmp("roundtrip.gguf");
    w.write(&path).unwrap();
    let f = GgufFile::open(&path).unwrap();
    assert_eq!(f.version, 3);
    assert_eq!(f.get("t.u64"), Some(&Value::U64(u64::MAX)));
    assert_eq!(f.get("t.i64"), Some(&Value::I64(i64::MIN)));
    assert_eq!(f.get("t.f64"), Some(&Value::F64(-0.125)));
    assert_eq!(f.get("t.strings").unwrap().to_string(), r#"[string; 3] ["ab", "", "ü"]"#);
    assert_eq!(f.get("t.nested"), Some(&Value::Array(vec![Value::Array(vec![Value::I32(1), Value::I32(2)]), Value::Array(vec![Value::I32(3)])])));
    assert_eq!(f.tensors.len(), tensors.len());
    for (name, dims, ty, data) in &tensors {
        let t = f.tensor(name).unwrap();
        assert_eq!((&t.dims, t.ty), (dims, *ty), "{name}");
        assert_eq!(t.offset % 32, 0, "{name} unaligned");
        assert_eq!(f.data(t), &data[..], "{name}");
    }
}

fn interop(python: &Path, args: &[&str]) {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("scripts/gguf_interop.py");
    let out = Command::new(python).arg(script).args(args).output().unwrap();
    assert!(out.status.success(), "gguf_interop.py {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

fn f32_file(path: &Path) -> Vec<u32> {
    std::fs::read(path).unwrap().chunks_exact(4).map(|c| u32::from_le_bytes(c.try_into().unwrap())).collect()
}

fn strata_cli(args: &[&str]) -> std::process::Output {
    let bin = std::env::var("STRATA_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_strata").to_string());
    Command::new(bin).args(args).output().unwrap()
}

/// A file the `gguf` package wrote (Strata did not): `strata info` shows it and `strata dump`
/// gives the package's own dequantization of every tensor, bit for bit.
#[test]
fn reads_and_dumps_a_file_the_gguf_package_wrote() {
    let Some(python) = common::venv_python() else {
        return common::skip_or_fail(common::tools_required(), "gguf python package", "no .venv with gguf").unwrap_or(());
    };
    let seed = common::seed("reads_and_dumps_a_file_the_gguf_package_wrote");
    let path = tmp("from-python.gguf");
    interop(&python, &["write", path.to_str().unwrap(), &(seed % 1_000_000).to_string()]);
    let f = GgufFile::open(&path).unwrap();
    assert_eq!(f.get("test.string").and_then(Value::as_str), Some("héllo gguf"));
    assert_eq!(f.get("test.strings").unwrap().to_string(), r#"[string; 4] ["a", "bc", "", "déf"]"#);
    assert_eq!(f.get("test.i64"), Some(&Value::I64(-(1 << 40))));
    let info = strata_cli(&["info", path.to_str().unwrap()]);
    assert!(info.status.success(), "{}", String::from_utf8_lossy(&info.stderr));
    let text = String::from_utf8_lossy(&info.stdout);
    assert!(text.contains("architecture: strata-test"), "{text}");
    for t in &f.tensors {
        assert!(text.contains(&t.name), "info lacks {}", t.name);
        let out = tmp(&format!("{}.dump.f32", t.name));
        let d = strata_cli(&["dump", path.to_str().unwrap(), &t.name, "--out", out.to_str().unwrap()]);
        assert!(d.status.success(), "{}", String::from_utf8_lossy(&d.stderr));
        let want = f32_file(Path::new(&format!("{}.{}.f32", path.display(), t.name)));
        assert_eq!(f32_file(&out), want, "{} ({}) differs from gguf's dequantization", t.name, t.ty.name());
    }
    // --rows takes a slice of rows.
    let t = &f.tensors[3];
    let out = tmp("rows.f32");
    let d = strata_cli(&["dump", path.to_str().unwrap(), &t.name, "--rows", "1..3", "--out", out.to_str().unwrap()]);
    assert!(d.status.success());
    let all = f32_file(Path::new(&format!("{}.{}.f32", path.display(), t.name)));
    assert_eq!(f32_file(&out), all[t.dims[0] as usize..3 * t.dims[0] as usize]);
}

/// A file Strata wrote loads in the `gguf` package with the same metadata, shapes, types and
/// (dequantized) values.
#[test]
fn gguf_package_reads_what_strata_wrote() {
    let Some(python) = common::venv_python() else {
        return common::skip_or_fail(common::tools_required(), "gguf python package", "no .venv with gguf").unwrap_or(());
    };
    let seed = common::seed("gguf_package_reads_what_strata_wrote");
    let mut rng = SmallRng::seed_from_u64(seed);
    // The package has no Q2_0 and refuses a whole file holding one; tests/formats_gguf.rs checks
    // Q2_0 decoding against FORMATS.md instead.
    let types: Vec<GgmlType> = GgmlType::ALL.into_iter().filter(|t| *t != GgmlType::Quant(WeightFormat::Q2_0)).collect();
    let (mut w, tensors) = sample_of(&mut rng, &types);
    w.meta("t.last", Value::String("end".into()));
    let path = tmp("from-strata.gguf");
    w.write(&path).unwrap();
    interop(&python, &["read", path.to_str().unwrap()]);
    let json = std::fs::read_to_string(format!("{}.json", path.display())).unwrap();
    for needle in [r#""t.u64": 18446744073709551615"#, r#""t.strings": ["ab", "", "\u00fc"]"#, r#""t.last": "end""#] {
        assert!(json.contains(needle), "{needle} not in {json}");
    }
    let f = GgufFile::open(&path).unwrap();
    for (name, dims, ty, _) in &tensors {
        let dims_json = format!("\"{name}\": {{\"type\": \"{}\", \"dims\": [{}]", ty.name(), dims.iter().map(u64::to_string).collect::<Vec<_>>().join(", "));
        assert!(json.contains(&dims_json), "{dims_json} not in {json}");
        let t = f.tensor(name).unwrap();
        let out = tmp(&format!("{name}.strata.f32"));
        let d = strata_cli(&["dump", path.to_str().unwrap(), name, "--out", out.to_str().unwrap()]);
        assert!(d.status.success());
        assert_eq!(f32_file(&out), f32_file(Path::new(&format!("{}.{}.f32", path.display(), t.name))), "{name}");
    }
}

/// Byte offsets of the sample's sections, found by parsing it the way the format lays it out.
struct Layout {
    bytes: Vec<u8>,
    /// Start of each metadata key/value and each tensor info, then the data section.
    boundaries: Vec<usize>,
    /// Offset of each tensor info's n_dims, type and offset fields.
    tensor_fields: Vec<(usize, usize, usize)>,
}

fn layout(w: &GgufWriter) -> Layout {
    let bytes = w.to_bytes();
    let f = GgufFile::from_bytes(bytes.clone(), "sample.gguf").unwrap();
    let le64 = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap()) as usize;
    let mut boundaries = vec![0, 4, 8, 16, 24];
    let mut pos = 24;
    for (_, v) in &f.metadata {
        let klen = le64(pos);
        pos += 8 + klen + 4 + value_len(v);
        boundaries.push(pos);
    }
    let mut tensor_fields = Vec::new();
    for t in &f.tensors {
        pos += 8 + t.name.len();
        let nd = pos;
        pos += 4 + 8 * t.dims.len();
        tensor_fields.push((nd, pos, pos + 4));
        pos += 12;
        boundaries.push(pos);
    }
    boundaries.push(f.data_offset as usize);
    Layout { bytes, boundaries, tensor_fields }
}

fn value_len(v: &Value) -> usize {
    match v {
        Value::U8(_) | Value::I8(_) | Value::Bool(_) => 1,
        Value::U16(_) | Value::I16(_) => 2,
        Value::U32(_) | Value::I32(_) | Value::F32(_) => 4,
        Value::U64(_) | Value::I64(_) | Value::F64(_) => 8,
        Value::String(s) => 8 + s.len(),
        Value::Array(items) => 12 + items.iter().map(value_len).sum::<usize>(),
    }
}

fn refuse(bytes: Vec<u8>, what: &str) -> GgufError {
    match GgufFile::from_bytes(bytes, "broken.gguf") {
        Ok(_) => panic!("{what}: accepted"),
        Err(e) => {
            assert!(e.to_string().starts_with("broken.gguf"), "{what}: {e}");
            e
        }
    }
}

#[test]
fn truncation_anywhere_is_refused() {
    let mut rng = SmallRng::seed_from_u64(common::seed("truncation_anywhere_is_refused"));
    let l = layout(&sample(&mut rng).0);
    // Every section boundary, and every byte in between (the file is a few KiB).
    for cut in 0..l.bytes.len() {
        let e = refuse(l.bytes[..cut].to_vec(), &format!("cut at {cut}"));
        if l.boundaries.contains(&cut) {
            assert!(e.to_string().contains("at byte"), "{e}");
        }
    }
}

fn set_u64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

fn set_u32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

/// The hand-made broken files: each refused with the right reason, naming the tensor where one
/// is at fault; the CLI refuses each with that message and a non-zero exit, never a panic.
#[test]
fn broken_corpus_is_refused_with_clear_errors() {
    let mut rng = SmallRng::seed_from_u64(common::seed("broken_corpus_is_refused_with_clear_errors"));
    let l = layout(&sample(&mut rng).0);
    let (nd0, ty0, off0) = l.tensor_fields[0];
    let (_, ty1, off1) = l.tensor_fields[1];
    type Edit = Box<dyn Fn(&mut Vec<u8>)>;
    let cases: Vec<(&str, Edit, fn(&ErrorKind) -> bool, Option<&str>)> = vec![
        ("bad magic", Box::new(|b| b[0] = b'X'), |k| matches!(k, ErrorKind::BadMagic(_)), None),
        ("version 1", Box::new(|b| set_u32(b, 4, 1)), |k| matches!(k, ErrorKind::UnsupportedVersion(1)), None),
        ("huge tensor count", Box::new(|b| set_u64(b, 8, u64::MAX)), |k| matches!(k, ErrorKind::TooLarge { .. }), None),
        ("huge metadata count", Box::new(|b| set_u64(b, 16, 1 << 40)), |k| matches!(k, ErrorKind::TooLarge { .. }), None),
        ("huge key length", Box::new(|b| set_u64(b, 24, u64::MAX - 3)), |k| matches!(k, ErrorKind::TooLarge { .. }), None),
        ("unknown value type", Box::new(|b| set_u32(b, 24 + 8 + 20, 77)), |k| matches!(k, ErrorKind::BadValueType(77)), None),
        ("unknown tensor type", Box::new(move |b| set_u32(b, ty0, 99)), |k| matches!(k, ErrorKind::UnknownType(99)), Some("blk.0.f32")),
        ("unsupported Q4_K", Box::new(move |b| set_u32(b, ty1, 12)), |k| matches!(k, ErrorKind::UnsupportedType(12, "Q4_K")), Some("blk.1.f16")),
        ("five dimensions", Box::new(move |b| set_u32(b, nd0, 5)), |k| matches!(k, ErrorKind::BadDims(_)), Some("blk.0.f32")),
        ("zero dimension", Box::new(move |b| set_u64(b, nd0 + 4 + 8, 0)), |k| matches!(k, ErrorKind::BadDims(_)), Some("blk.0.f32")),
        ("misaligned offset", Box::new(move |b| set_u64(b, off1, 8)), |k| matches!(k, ErrorKind::Misaligned { .. }), Some("blk.1.f16")),
        ("overlapping tensors", Box::new(move |b| set_u64(b, off1, 0)), |k| matches!(k, ErrorKind::Overlap(_)), None),
        ("offset past the end", Box::new(move |b| set_u64(b, off0, 1 << 40)), |k| matches!(k, ErrorKind::OutOfFile { .. }), Some("blk.0.f32")),
        ("offset overflowing u64", Box::new(move |b| set_u64(b, off0, u64::MAX - 31)), |k| matches!(k, ErrorKind::OutOfFile { .. } | ErrorKind::Misaligned { .. }), Some("blk.0.f32")),
    ];
    for (what, edit, kind_ok, tensor) in cases {
        let mut b = l.bytes.clone();
        edit(&mut b);
        let e = refuse(b.clone(), what);
        assert!(kind_ok(&e.kind), "{what}: {e}");
        if let Some(t) = tensor {
            assert_eq!(e.tensor.as_deref(), Some(t), "{what}: {e}");
        }
        let path = tmp(&format!("broken-{}.gguf", what.replace(' ', "-")));
        std::fs::write(&path, &b).unwrap();
        let out = strata_cli(&["info", path.to_str().unwrap()]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{what}: {err}");
        assert!(err.contains(path.to_str().unwrap()) && err.contains(&e.kind.to_string()) && !err.contains("panicked"), "{what}: {err}");
    }
}

#[test]
fn bad_metadata_values_are_refused() {
    let bad_bool = {
        let mut w = GgufWriter::new();
        w.meta("b", Value::Bool(true));
        let mut b = w.to_bytes();
        b[24 + 8 + 1 + 4] = 2; // header, key "b", value type, then the value byte
        b
    };
    assert!(matches!(refuse(bad_bool, "bool 2").kind, ErrorKind::BadBool(2)));
    let mut w = GgufWriter::new();
    w.meta("general.alignment", Value::U32(48));
    assert!(matches!(refuse(w.to_bytes(), "alignment 48").kind, ErrorKind::BadAlignment(_)));
    let mut w = GgufWriter::new();
    w.meta("k", Value::U8(1)).meta("k", Value::U8(2));
    assert!(matches!(refuse(w.to_bytes(), "duplicate key").kind, ErrorKind::DuplicateKey(_)));
    let mut deep = Value::U8(0);
    for _ in 0..12 {
        deep = Value::Array(vec![deep]);
    }
    let mut w = GgufWriter::new();
    w.meta("deep", deep);
    assert!(matches!(refuse(w.to_bytes(), "deep nesting").kind, ErrorKind::NestingTooDeep));
    let mut w = GgufWriter::new();
    w.tensor("a", &[32], GgmlType::F32, vec![0; 128]).unwrap().tensor("a", &[32], GgmlType::F32, vec![0; 128]).unwrap();
    let e = refuse(w.to_bytes(), "duplicate tensor");
    assert!(matches!(e.kind, ErrorKind::DuplicateTensor) && e.tensor.as_deref() == Some("a"), "{e}");
    let mut bad_utf8 = GgufWriter::new();
    bad_utf8.meta("s", Value::String("xy".into()));
    let mut b = bad_utf8.to_bytes();
    b[24 + 8 + 1 + 4 + 8 + 1] = 0xff; // the second byte of the string
    assert!(matches!(refuse(b, "bad utf-8").kind, ErrorKind::BadUtf8(_)));
    // A row that is not a whole number of blocks, written by hand (the writer refuses it).
    let mut w = GgufWriter::new();
    w.tensor("q", &[32], GgmlType::Quant(WeightFormat::Q8_0), vec![0; 34]).unwrap();
    let mut b = w.to_bytes();
    let at = 24 + 8 + 1 + 4;
    set_u64(&mut b, at, 48);
    let e = refuse(b, "row of 48 in Q8_0");
    assert!(matches!(e.kind, ErrorKind::RowNotWhole { row: 48, block: 32 }), "{e}");
}

/// Seeded random corruption (byte flips, cuts, inserted runs) of a valid file: the reader
/// returns a result every time, and an accepted file's tensors all lie inside it.
#[test]
fn random_corruption_never_panics() {
    let seed = common::seed("random_corruption_never_panics");
    let mut rng = SmallRng::seed_from_u64(seed);
    let base = sample(&mut rng).0.to_bytes();
    let header_end = layout(&sample(&mut SmallRng::seed_from_u64(seed)).0).boundaries.last().copied().unwrap();
    for i in 0..20_000 {
        let mut b = base.clone();
        for _ in 0..rng.random_range(1..6) {
            // Mostly in the header, where the structure is.
            let limit = if rng.random_bool(0.9) { header_end.min(b.len()) } else { b.len() };
            let at = rng.random_range(0..limit);
            match rng.random_range(0..4) {
                0 => b[at] ^= 1 << rng.random_range(0..8),
                1 => b[at] = rng.random(),
                2 => b.truncate(at),
                _ => {
                    let run: Vec<u8> = (0..rng.random_range(1..16)).map(|_| if rng.random_bool(0.5) { 0xff } else { rng.random() }).collect();
                    b.splice(at..at, run);
                }
            }
            if b.is_empty() {
                break;
            }
        }
        if let Ok(f) = GgufFile::from_bytes(b.clone(), format!("mutant-{i}.gguf")) {
            for t in &f.tensors {
                assert!(t.offset + t.bytes <= b.len() as u64, "mutant {i}: {} outside the file", t.name);
                assert_eq!(f.data(t).len() as u64, t.bytes);
            }
        }
    }
}
