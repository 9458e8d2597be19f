//! `strata dump FILE TENSOR`: one tensor dequantized to little-endian f32, so anyone can check
//! Strata's decoding with their own tools.
use std::io::{BufWriter, Write};
use std::ops::Range;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context};
use strata_gpu_shared::f16::f16_to_f32;
use strata_host::gguf::{GgmlType, GgufFile};
use strata_host::reference::dequant_row_f32;

#[derive(clap::Args)]
pub struct Args {
    /// The GGUF file.
    pub file: PathBuf,
    /// The tensor's name (see `strata info FILE`).
    pub tensor: String,
    /// Rows to dump, `A..B` (end exclusive), counting rows of the first dimension's length.
    /// Default: every row.
    #[arg(long, value_parser = parse_rows)]
    pub rows: Option<Range<u64>>,
    /// Output file (little-endian f32, row after row).
    #[arg(long)]
    pub out: PathBuf,
}

fn parse_rows(s: &str) -> Result<Range<u64>, String> {
    let (a, b) = s.split_once("..").ok_or_else(|| format!("`{s}` is not A..B"))?;
    let a: u64 = a.trim().parse().map_err(|e| format!("`{a}`: {e}"))?;
    let b: u64 = b.trim().parse().map_err(|e| format!("`{b}`: {e}"))?;
    if a >= b {
        return Err(format!("empty range {a}..{b}"));
    }
    Ok(a..b)
}

/// Appends row `row` (raw bytes of one row of `ty`) to `out` as f32.
fn decode_row(ty: GgmlType, row: &[u8], k: usize, out: &mut Vec<f32>) {
    match ty {
        GgmlType::F32 => out.extend(row.chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().expect("4 bytes")))),
        GgmlType::F16 => out.extend(row.chunks_exact(2).map(|b| f16_to_f32(u16::from_le_bytes([b[0], b[1]])))),
        GgmlType::Bf16 => out.extend(row.chunks_exact(2).map(|b| f32::from_bits((u16::from_le_bytes([b[0], b[1]]) as u32) << 16))),
        GgmlType::Quant(f) => dequant_row_f32(f, row, k, out),
    }
}

pub fn run(args: &Args) -> anyhow::Result<ExitCode> {
    let file = GgufFile::open(&args.file)?;
    let t = file.tensor(&args.tensor)?;
    let rows = args.rows.clone().unwrap_or(0..t.rows());
    if rows.end > t.rows() {
        bail!("{}: tensor {:?} has {} rows; --rows {}..{} is past the end", args.file.display(), t.name, t.rows(), rows.start, rows.end);
    }
    let data = file.data(t);
    let rb = t.row_bytes() as usize;
    let k = t.dims[0] as usize;
    let out = std::fs::File::create(&args.out).with_context(|| format!("cannot create {}", args.out.display()))?;
    let mut out = BufWriter::new(out);
    let mut buf = Vec::with_capacity(k);
    let total = rows.end - rows.start;
    let started = std::time::Instant::now();
    for (n, r) in rows.clone().enumerate() {
        buf.clear();
        decode_row(t.ty, &data[r as usize * rb..(r as usize + 1) * rb], k, &mut buf);
        for v in &buf {
            out.write_all(&v.to_le_bytes())?;
        }
        if total > 1000 && n as u64 % (total / 10) == 0 && started.elapsed().as_secs() >= 1 {
            eprintln!("dump: {n}/{total} rows");
        }
    }
    out.flush().with_context(|| format!("writing {}", args.out.display()))?;
    eprintln!(
        "dump: {} {} {:?}: rows {}..{} ({} values) -> {}",
        t.name,
        t.ty.name(),
        t.dims,
        rows.start,
        rows.end,
        total * k as u64,
        args.out.display()
    );
    Ok(ExitCode::SUCCESS)
}
