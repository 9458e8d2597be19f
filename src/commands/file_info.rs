//! `strata info FILE`: what a GGUF file holds.
use std::collections::BTreeMap;
use std::path::Path;
use std::process::ExitCode;

use strata_host::gguf::{GgufFile, Value};

fn human(bytes: u64) -> String {
    const UNITS: [&str; 4] = ["B", "KiB", "MiB", "GiB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 { format!("{bytes} B") } else { format!("{v:.2} {}", UNITS[u]) }
}

pub fn run(path: &Path) -> anyhow::Result<ExitCode> {
    let file = GgufFile::open(path)?;
    let arch = file.get("general.architecture").and_then(Value::as_str).unwrap_or("(not set)");
    println!("{}: GGUF v{}, {}, alignment {}", path.display(), file.version, human(file.len()), file.alignment);
    println!("architecture: {arch}");
    println!("metadata ({} keys):", file.metadata.len());
    for (k, v) in &file.metadata {
        println!("  {k} = {v}");
    }
    println!("tensors ({}):", file.tensors.len());
    let width = file.tensors.iter().map(|t| t.name.len()).max().unwrap_or(4).max(4);
    println!("  {:<width$} {:<8} {:<24} {:>14} {:>14}", "name", "type", "shape", "bytes", "offset");
    let mut totals: BTreeMap<&str, (usize, u64, u64)> = BTreeMap::new();
    for t in &file.tensors {
        let shape = format!("{:?}", t.dims);
        println!("  {:<width$} {:<8} {:<24} {:>14} {:>14}", t.name, t.ty.name(), shape, t.bytes, t.offset);
        let e = totals.entry(t.ty.name()).or_default();
        *e = (e.0 + 1, e.1 + t.elements(), e.2 + t.bytes);
    }
    println!("totals per type:");
    for (ty, (n, elems, bytes)) in &totals {
        println!("  {ty:<8} {n:>5} tensors {elems:>14} values {:>12} ({:.3} bits/value)", human(*bytes), *bytes as f64 * 8.0 / *elems as f64);
    }
    let all: u64 = totals.values().map(|t| t.2).sum();
    println!("  all      {:>5} tensors {:>14} values {:>12}", file.tensors.len(), totals.values().map(|t| t.1).sum::<u64>(), human(all));
    Ok(ExitCode::SUCCESS)
}
