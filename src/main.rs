//! `strata`: the command line. Each subcommand lives in `src/commands/`.
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use strata::commands::{info, parity};

#[derive(Parser)]
#[command(name = "strata", version, about = "Decode engine for quantized MoE GGUF models, with Rust GPU kernels proven bit for bit \
against a hand-written HIP port and a CPU replica.")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Show the backends this machine can run: GPU name, compute capability, memory, which PTX
    /// architecture loaded, whether the HIP sources compiled.
    Info(info::Args),
    /// Run the parity suite: every kernel on every available backend, outputs compared byte for
    /// byte, and the CPU replica's NMSE against float64. Exits non-zero on any difference.
    Parity(parity::Args),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Info(a) => info::run(&a),
        Command::Parity(a) => parity::run(&a),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("strata: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
