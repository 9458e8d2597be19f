//! `strata`: the command line. Each subcommand lives in `src/commands/`.
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use strata::commands::{bench, dump, info, parity};

#[derive(Parser)]
#[command(name = "strata", version, about = "Decode engine for quantized MoE GGUF models, with Rust GPU kernels proven bit for bit \
against a hand-written HIP port and a CPU replica.")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Show the backends this machine can run (GPU name, compute capability, memory, which PTX
    /// architecture loaded, whether the HIP sources compiled), or with a FILE what a GGUF file
    /// holds.
    Info(info::Args),
    /// Write one tensor of a GGUF file, dequantized, as little-endian f32.
    Dump(dump::Args),
    /// Run the parity suite: every kernel on every available backend, outputs compared byte for
    /// byte, and the CPU replica's NMSE against float64. Exits non-zero on any difference.
    Parity(parity::Args),
    /// Measure kernel speed on the GPU backends (needs a GPU).
    Bench(bench::Args),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Info(a) => info::run(&a),
        Command::Dump(a) => dump::run(&a),
        Command::Parity(a) => parity::run(&a),
        Command::Bench(a) => bench::run(&a),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("strata: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
