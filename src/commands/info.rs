//! `strata info`: what this machine can run.
use std::process::ExitCode;

use crate::backends::Available;
use strata_host::backends::gpu::GpuBackend;
use strata_host::Error;

#[derive(clap::Args)]
pub struct Args {
    /// A GGUF file: show its architecture, every metadata key and value, its tensor table (name,
    /// type, shape, bytes, offset) and the totals per type. Without it, show the backends.
    pub file: Option<std::path::PathBuf>,
    /// CUDA device ordinal.
    #[arg(long, default_value_t = 0)]
    pub device: usize,
}

fn gpu_line(b: &Result<GpuBackend, Error>) -> String {
    match b {
        Ok(g) => {
            let i = g.info();
            format!(
                "{} (device {}), compute capability {}.{}, {:.1} GiB, {} SMs, L2 {:.0} MiB; kernels from {}, launches {}",
                i.name,
                i.ordinal,
                i.compute_capability.0,
                i.compute_capability.1,
                i.total_mem as f64 / (1u64 << 30) as f64,
                i.sm_count,
                i.l2_bytes as f64 / (1u64 << 20) as f64,
                g.ptx_arch,
                if g.chained() { "chained (programmatic dependent launch)" } else { "in stream order" }
            )
        }
        Err(e) => format!("unavailable: {e}"),
    }
}

pub fn run(args: &Args) -> anyhow::Result<ExitCode> {
    if let Some(path) = &args.file {
        return super::file_info::run(path);
    }
    let found = Available::open(args.device);
    println!("strata {}", env!("CARGO_PKG_VERSION"));
    println!(
        "embedded PTX: {}",
        crate::ptx::IMAGES.iter().map(|i| format!("{} ({} KiB)", i.arch, i.ptx.len() / 1024)).collect::<Vec<_>>().join(", ")
    );
    println!("{:<5} available: CPU replica, {} threads", "cpu", std::thread::available_parallelism().map_or(1, |n| n.get()));
    println!("{:<5} {}", "cuda", gpu_line(&found.cuda));
    println!("{:<5} {}", "hip", gpu_line(&found.hip));
    Ok(ExitCode::SUCCESS)
}
