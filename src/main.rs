//! `strata`: the command line. Each subcommand lives in `src/commands/`.
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use strata::commands::{bench, decode, dump, info, knobs, parity, synth};
use strata::host::backends::knobs::KernelKnobs;

#[derive(Parser)]
#[command(name = "strata", version, about = "Decode engine for quantized MoE GGUF models, with Rust GPU kernels proven bit for bit \
against a hand-written HIP port and a CPU replica.")]
struct Cli {
    /// Set a kernel knob (routed experts, attention; repeatable; same as STRATA_<NAME>): `strata knobs` lists them.
    #[arg(long = "knob", value_name = "NAME=VALUE", global = true)]
    knobs: Vec<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Decode a qwen3moe GGUF model (or the built-in random one): prefill the prompt, generate,
    /// stream the text, report tokens/s.
    Decode(decode::Args),
    /// Show the backends this machine can run (GPU name, compute capability, memory, which PTX
    /// architecture loaded, whether the HIP sources compiled), or with a FILE what a GGUF file
    /// holds.
    Info(info::Args),
    /// Write one tensor of a GGUF file, dequantized, as little-endian f32.
    Dump(dump::Args),
    /// Run the parity suite: every kernel on every available backend, outputs compared byte for
    /// byte, and the CPU replica's NMSE against float64. Exits non-zero on any difference.
    Parity(parity::Args),
    /// Measure speed: kernels against the copy bandwidth (mmvq, head, experts: GPU), and whole
    /// decode steps like llama-bench (decode: any backend).
    Bench(bench::Args),
    /// Write a random-weight qwen3moe model of any shape and formats as a GGUF file.
    Synth(synth::Args),
    /// List the kernel knobs (routed experts, attention) (`--knob NAME=VALUE`), their values and defaults.
    Knobs(knobs::Args),
}

/// The kernel knobs: the environment's, then `--knob`s; fixed for the process before any
/// backend opens.
fn init_knobs(sets: &[String]) -> anyhow::Result<()> {
    let mut knobs = KernelKnobs::from_env().map_err(anyhow::Error::msg)?;
    for set in sets {
        let (name, value) = set.split_once('=').ok_or_else(|| anyhow::anyhow!("--knob {set:?}: expected NAME=VALUE"))?;
        knobs.set(name, value).map_err(|e| anyhow::anyhow!("--knob {set:?}: {e}"))?;
    }
    knobs.check().map_err(|e| anyhow::anyhow!("--knob: {e}"))?;
    KernelKnobs::init_process(knobs);
    Ok(())
}

/// Writing to a closed pipe (`strata info FILE | head`) ends the process quietly, as Unix tools
/// do, instead of making `println!` panic: Rust's runtime ignores SIGPIPE, so its default action
/// is put back.
#[cfg(unix)]
fn default_sigpipe() {
    extern "C" {
        fn signal(signum: i32, handler: usize) -> usize;
    }
    const SIGPIPE: i32 = 13;
    const SIG_DFL: usize = 0;
    // SAFETY: `signal` is the C library's, called once before any thread starts, with a valid
    // signal number and the default disposition (no handler of ours runs).
    unsafe {
        signal(SIGPIPE, SIG_DFL);
    }
}

fn main() -> ExitCode {
    #[cfg(unix)]
    default_sigpipe();
    let cli = Cli::parse();
    if let Err(e) = init_knobs(&cli.knobs) {
        eprintln!("strata: error: {e:#}");
        return ExitCode::from(2);
    }
    let result = match cli.command {
        Command::Info(a) => info::run(&a),
        Command::Dump(a) => dump::run(&a),
        Command::Parity(a) => parity::run(&a),
        Command::Bench(a) => bench::run(&a),
        Command::Synth(a) => synth::run(&a),
        Command::Decode(a) => Ok(decode::run(&a)),
        Command::Knobs(a) => Ok(knobs::run(&a)),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("strata: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
