//! `strata knobs`: the kernel knobs (routed experts, attention), their values, defaults and what they do.
use std::process::ExitCode;

use strata_host::backends::knobs::{KernelKnobs, KNOBS};

#[derive(clap::Args)]
pub struct Args {}

pub fn run(_: &Args) -> ExitCode {
    println!("Kernel knobs (routed experts, attention): set with `strata --knob NAME=VALUE <command>` or the STRATA_<NAME> environment variable.");
    println!("They change which kernel variant runs, or what it asks the caches for ahead, never the bits (each value is tested against the CPU replica).");
    println!("Defaults and the H200 measurements behind them: docs/kernels/moe.md, docs/kernels/attention.md\n");
    let width = KNOBS.iter().map(|k| k.name.len() + k.values.len() + 1).max().unwrap_or(0);
    for k in &KNOBS {
        println!("  {:<width$}  {}", format!("{}={}", k.name, k.values), k.what);
    }
    println!("\nIn force now (environment and --knob): {}", KernelKnobs::process().map(|k| k.describe()).unwrap_or_else(|e| e));
    ExitCode::SUCCESS
}
