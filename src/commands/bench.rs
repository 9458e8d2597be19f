//! `strata bench`: kernel speed on the GPU backends, against the device's copy bandwidth.
use std::process::ExitCode;

use anyhow::{bail, Context};
use clap::Subcommand;

use crate::backends::Available;
use strata_gpu_shared::formats::WeightFormat;
use strata_host::bench::{self, MmvqRow};
use strata_host::gpu::GpuBackend;

#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    pub what: What,
}

#[derive(Subcommand)]
pub enum What {
    /// Quantized matvec (`mmvq`) per format, shape and activation rows, on `cuda` and `hip`:
    /// microseconds per call (weights read cold from a pool of at least 4x the L2), achieved
    /// GB/s (weight + activation bytes) and its percentage of the device-to-device copy
    /// bandwidth measured in the same run.
    Mmvq(MmvqArgs),
    /// The sampler head and the small kernels, on `cuda` and `hip`: `argmax_rows` and
    /// `row_top_prob` one block per row against the split kernels (vocabularies 106,299,
    /// 151,936 and 248,320 at 1, 4, 5 and 8 rows), the quantizers, and
    /// `copy_from_mapped_multi` against one copy per segment. Microseconds (medians) and
    /// speed-ups.
    Head(HeadArgs),
}

#[derive(clap::Args)]
pub struct HeadArgs {
    /// Backends, comma-separated (`cuda`, `hip`).
    #[arg(long, default_value = "cuda,hip")]
    pub backends: String,
    /// Timed rounds per configuration; the median is reported.
    #[arg(long, default_value_t = 5)]
    pub rounds: usize,
    /// CUDA device ordinal.
    #[arg(long, default_value_t = 0)]
    pub device: usize,
}

#[derive(clap::Args)]
pub struct MmvqArgs {
    /// Formats, comma-separated (`Q8_0,IQ4_NL`), or `all`.
    #[arg(long, default_value = "all")]
    pub formats: String,
    /// Shapes `MxK` (weight rows x row length), comma-separated. Default: the model's matrices
    /// 2048x2048, 2048x768, 768x2048, 4096x2048, 2560x640 and the head 151936x2048.
    #[arg(long, default_value = "2048x2048,2048x768,768x2048,4096x2048,2560x640,151936x2048")]
    pub shapes: String,
    /// Activation rows per call, comma-separated (1..8).
    #[arg(long, default_value = "1,2,4,8")]
    pub rows: String,
    /// Backends, comma-separated (`cuda`, `hip`).
    #[arg(long, default_value = "cuda,hip")]
    pub backends: String,
    /// Timed rounds per configuration; the median is reported.
    #[arg(long, default_value_t = 5)]
    pub rounds: usize,
    /// Seed of the random weights and activations.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// CUDA device ordinal.
    #[arg(long, default_value_t = 0)]
    pub device: usize,
    /// Print JSON (one object per measurement) instead of the table.
    #[arg(long)]
    pub json: bool,
}

pub(crate) fn list<T>(s: &str, what: &str, parse: impl Fn(&str) -> Option<T>) -> anyhow::Result<Vec<T>> {
    s.split(',').map(str::trim).filter(|x| !x.is_empty()).map(|x| parse(x).with_context(|| format!("bad {what} `{x}`"))).collect()
}

fn parse_shape(s: &str) -> Option<(usize, usize)> {
    let (m, k) = s.split_once('x')?;
    Some((m.parse().ok().filter(|&m| m > 0)?, k.parse().ok().filter(|&k| k > 0)?))
}

pub fn run(args: &Args) -> anyhow::Result<ExitCode> {
    match &args.what {
        What::Mmvq(a) => mmvq(a),
        What::Head(a) => head(a),
    }
}

/// The GPU backends named in `list` (comma-separated), opened on `device`.
fn open_gpus<'a>(found: &'a Available, list: &str) -> anyhow::Result<Vec<&'a GpuBackend>> {
    let wanted = super::bench::list(list, "backend (cuda, hip)", |b| ["cuda", "hip"].into_iter().find(|x| *x == b))?;
    let mut gpus = Vec::new();
    for (name, b) in [("cuda", &found.cuda), ("hip", &found.hip)] {
        if wanted.contains(&name) {
            gpus.push(b.as_ref().map_err(|e| anyhow::anyhow!("{e}"))?);
        }
    }
    if gpus.is_empty() {
        bail!("no backend selected");
    }
    Ok(gpus)
}

fn head(a: &HeadArgs) -> anyhow::Result<ExitCode> {
    if a.rounds == 0 {
        bail!("--rounds must be at least 1");
    }
    let found = Available::open(a.device);
    let gpus = open_gpus(&found, &a.backends)?;
    println!("device: {}", gpus[0].info().name);
    println!("{:<22} {:<16} {:<6} {:>12} {:>12} {:>9}", "kernel", "shape", "backend", "ref us", "fast us", "speed-up");
    let print = |r: &bench::HeadRow| {
        let reference = if r.reference_us > 0.0 { format!("{:.2}", r.reference_us) } else { "-".into() };
        let speedup = if r.reference_us > 0.0 { format!("{:.2}x", r.reference_us / r.fast_us) } else { "-".into() };
        println!("{:<22} {:<16} {:<6} {:>12} {:>12.2} {:>9}", r.what, r.shape, r.backend, reference, r.fast_us, speedup);
    };
    for vocab in [106_299, 151_936, 248_320] {
        for rows in [1, 4, 5, 8] {
            for g in &gpus {
                eprint!("\rbench head: {rows}x{vocab} on {}...      ", g.name_static());
                let rs = bench::head(g, vocab, rows, a.rounds, 1)?;
                eprint!("\r{:50}\r", "");
                rs.iter().for_each(print);
            }
        }
    }
    println!("(quantizers: `ref us` is quantize_q8_0_scaled one thread per block, `fast us` one warp per block)");
    for (rows, k) in [(1, 2048), (8, 2048), (8, 4096)] {
        for g in &gpus {
            bench::quantizers(g, rows, k, a.rounds, 1)?.iter().for_each(print);
        }
    }
    println!("(mapped copies: `ref us` is one cuMemcpyAsync per segment, `fast us` one copy_from_mapped_multi launch)");
    for n in [1, 4, 16, 64] {
        for len in [4 << 10, 64 << 10, 1 << 20, 4 << 20] {
            for g in &gpus {
                print(&bench::mapped_copy(g, n, len, a.rounds)?);
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn mmvq(a: &MmvqArgs) -> anyhow::Result<ExitCode> {
    let formats = if a.formats == "all" {
        WeightFormat::ALL.to_vec()
    } else {
        list(&a.formats, "format", |f| WeightFormat::ALL.into_iter().find(|w| w.name().eq_ignore_ascii_case(f)))?
    };
    let shapes = list(&a.shapes, "shape (MxK)", parse_shape)?;
    let rows = list(&a.rows, "row count (1..8)", |r| r.parse().ok().filter(|r| (1..=8).contains(r)))?;
    if a.rounds == 0 {
        bail!("--rounds must be at least 1");
    }
    let found = Available::open(a.device);
    let gpus = open_gpus(&found, &a.backends)?;
    let first = gpus[0];
    let info = first.info();
    let copy = bench::copy_bandwidth(first, 1 << 30, 5)?;
    if !a.json {
        println!("device: {}, {} SMs, L2 {} MiB", info.name, info.sm_count, info.l2_bytes >> 20);
        println!("device-to-device copy: {copy:.0} GB/s (1 GiB, read + write bytes, median of 5)");
        print!("{:<8} {:<12} {:>4}", "format", "shape", "rows");
        for g in &gpus {
            print!(" | {:>9} {:>7} {:>5}", format!("{} us", g.name_static()), "GB/s", "%copy");
        }
        println!("{}", if gpus.len() == 2 { " | hip/cuda" } else { "" });
    }
    for &format in &formats {
        for &(m, k) in &shapes {
            let k = k.div_ceil(format.block_values()) * format.block_values();
            let mut per: Vec<Vec<MmvqRow>> = Vec::new();
            for g in &gpus {
                eprint!("\rbench mmvq: {} {m}x{k} on {}...        ", format.name(), g.name_static());
                per.push(bench::mmvq(g, format, m, k, &rows, a.rounds, a.seed)?);
            }
            eprint!("\r{:60}\r", "");
            for (i, &r) in rows.iter().enumerate() {
                if a.json {
                    for p in &per {
                        let x = &p[i];
                        println!(
                            "{{\"kernel\":\"{}\",\"backend\":\"{}\",\"format\":\"{}\",\"m\":{m},\"k\":{k},\"rows\":{r},\"us\":{:.3},\"gbps\":{:.1},\"copy_gbps\":{copy:.1},\"pct_copy\":{:.1},\"pool_slots\":{}}}",
                            format.mmvq_kernel(), x.backend, format.name(), x.us, x.gbps, 100.0 * x.gbps / copy, x.slots
                        );
                    }
                    continue;
                }
                print!("{:<8} {:<12} {:>4}", format.name(), format!("{m}x{k}"), r);
                for p in &per {
                    let x = &p[i];
                    print!(" | {:>9.2} {:>7.0} {:>5.1}", x.us, x.gbps, 100.0 * x.gbps / copy);
                }
                if per.len() == 2 {
                    print!(" | {:>8.3}", per[1][i].us / per[0][i].us);
                }
                println!();
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
