//! `strata parity`: the parity suite on the available backends, as a table.
use std::process::ExitCode;
use std::time::Instant;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use crate::backends::Available;
use strata_gpu_shared::formats::{FloatFormat, WeightFormat};
use strata_host::parity::{self, Outcome, NMSE_MAX, TOP_PROB_NMSE_MAX};
use strata_host::ops::{self, attention::AttentionOps, gdn::GdnOps, norm::NormOps, route::RouteOps, spec::SpecOps};
use strata_host::Backend;

#[derive(clap::Args)]
pub struct Args {
    /// CUDA device ordinal.
    #[arg(long, default_value_t = 0)]
    pub device: usize,
    /// Seed of the random inputs (default: from the clock; printed either way).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Random shapes per kernel and format, after the built-in ones.
    #[arg(long, default_value_t = 4)]
    pub random: usize,
    /// Fail when no GPU backend is available (also `STRATA_REQUIRE_GPU=1`).
    #[arg(long)]
    pub require_gpu: bool,
}

/// Built-in `mmvq` shapes (M, K, rows): model-sized matrices (one of 16,385 rows for the
/// one-row entry of heads, two rows a warp and a lone last one), and the small edges (K rounded
/// up to the format's block).
const MMVQ_SHAPES: [(usize, usize, usize); 7] =
    [(2048, 2048, 1), (16385, 2048, 1), (768, 2048, 4), (2048, 768, 8), (4096, 2048, 2), (1, 32, 1), (37, 96, 5)];
/// Built-in float `matvec` shapes (M, K, rows): the routers of 128 and 512 experts, an odd one.
const MATVEC_SHAPES: [(usize, usize, usize); 3] = [(128, 2048, 1), (512, 2560, 4), (37, 33, 8)];
/// Built-in MoE windows: (gate/up, down) formats, n_embd, n_ff, tokens, k (16 experts).
/// (IQ4_NLT, IQ3_ST: the tiles the decode step holds IQ4_NL and IQ3_S experts as.)
const MOE_CASES: [((WeightFormat, WeightFormat), usize, usize, usize, usize); 4] = [
    ((WeightFormat::Iq3Xxs, WeightFormat::Iq4Nl), 2560, 640, 4, 10),
    ((WeightFormat::Iq2S, WeightFormat::Q2_0), 2048, 768, 8, 8),
    ((WeightFormat::Iq3S, WeightFormat::Iq4NlT), 2048, 768, 1, 8),
    ((WeightFormat::Iq3ST, WeightFormat::Iq4NlT), 2048, 768, 4, 8),
];
/// Built-in head shapes (rows, vocabulary).
const HEAD_SHAPES: [(usize, usize); 4] = [(1, 151_936), (4, 248_320), (5, 106_299), (8, 4097)];
/// Built-in `quantize_q8_1` shapes (rows, K).
const QUANTIZE_SHAPES: [(usize, usize); 3] = [(1, 2048), (8, 2048), (3, 32)];

fn print_row(o: &Outcome, secs: f64) {
    let nmse = o.nmse.map_or("-".to_string(), |e| format!("{e:.2e}"));
    println!(
        "{:<20} {:<22} {:<30} {:<9} {:>10} {:>8.2}",
        o.kernel,
        o.shape,
        o.backends.join(","),
        match (o.backends.len(), o.identical()) {
            (1, true) => "-",
            (_, true) => "yes",
            (_, false) => "NO",
        },
        nmse,
        secs
    );
    if !o.passed() {
        println!("    {}", o.explain());
    }
}

pub fn run(args: &Args) -> anyhow::Result<ExitCode> {
    let found = Available::open(args.device);
    let backends: Vec<&dyn Backend> = found.all();
    for (name, b) in [("cuda", &found.cuda), ("hip", &found.hip)] {
        if let Err(e) = b {
            eprintln!("strata parity: {name} skipped: {e}");
        }
    }
    if backends.len() == 1 && (args.require_gpu || Available::gpu_required()) {
        anyhow::bail!("no GPU backend available and a GPU was required");
    }
    let seed = args.seed.unwrap_or_else(parity::seed_from_env);
    println!("strata parity: backends {}, seed {seed} (replay with --seed {seed})", backends.iter().map(|b| b.name()).collect::<Vec<_>>().join(", "));
    println!("{:<20} {:<22} {:<30} {:<9} {:>10} {:>8}", "kernel", "shape", "backends", "identical", "NMSE f64", "seconds");
    let mut rng = SmallRng::seed_from_u64(seed);
    let (mut total, mut failed) = (0, 0);
    let mut record = |o: Outcome, t: Instant| {
        print_row(&o, t.elapsed().as_secs_f64());
        total += 1;
        failed += !o.passed() as usize;
    };
    let quantize: Vec<(usize, usize)> = QUANTIZE_SHAPES
        .into_iter()
        .chain((0..args.random).map(|_| (rng.random_range(1..=8), 32 * rng.random_range(1..=256))))
        .collect();
    for (rows, k) in quantize {
        let t = Instant::now();
        record(parity::quantize_case(&backends, rows, k, rng.random())?, t);
    }
    for format in WeightFormat::MATVEC {
        let shapes: Vec<_> =
            MMVQ_SHAPES.into_iter().map(|(m, k, r)| (m, parity::fit_k(format, k), r))
                .chain((0..args.random).map(|_| parity::random_mmvq_shape(&mut rng, format, 4096, 8192)))
                .collect();
        // Every other shape accumulating into random outputs as well.
        for (i, (m, k, rows)) in shapes.into_iter().enumerate() {
            let t = Instant::now();
            record(parity::mmvq_case(&backends, format, m, k, rows, rng.random(), true, i % 2 == 1)?, t);
        }
    }
    for (rows, n) in HEAD_SHAPES {
        let t = Instant::now();
        record(parity::argmax_case(&backends, rows, n, rng.random())?, t);
        let t = Instant::now();
        record(parity::top_prob_case(&backends, rows, n, rng.random())?, t);
    }
    for per_column in [false, true] {
        let t = Instant::now();
        record(parity::quantize_q8_0_case(&backends, 4, 2048, per_column, rng.random())?, t);
    }
    for (formats, n_embd, n_ff, tokens, k) in MOE_CASES {
        let t = Instant::now();
        let case = parity::MoeCase::random(&mut rng, formats, 16, n_embd, n_ff, tokens, k);
        record(parity::moe_case(&backends, &case, seed)?, t);
    }
    // Groups of 0 to 11 entries (several staging passes per group).
    let t = Instant::now();
    let case = parity::MoeCase::crowded(&mut rng, (WeightFormat::Iq3S, WeightFormat::Q2_0), 2560, 640);
    record(parity::moe_case(&backends, &case, seed)?, t);
    for format in FloatFormat::ALL {
        for (i, (m, k, rows)) in MATVEC_SHAPES.into_iter().enumerate() {
            let t = Instant::now();
            record(parity::matvec_case(&backends, format, m, k, rows, rng.random(), i % 2 == 1)?, t);
        }
    }
    // The decode step's families: each builds its own random cases from the seed.
    let gpus = || [&found.cuda, &found.hip].into_iter().flatten();
    let norm: Vec<&dyn NormOps> = std::iter::once(&found.cpu as &dyn NormOps).chain(gpus().map(|g| g as &dyn NormOps)).collect();
    let attention: Vec<&dyn AttentionOps> = std::iter::once(&found.cpu as &dyn AttentionOps).chain(gpus().map(|g| g as &dyn AttentionOps)).collect();
    let route: Vec<&dyn RouteOps> = std::iter::once(&found.cpu as &dyn RouteOps).chain(gpus().map(|g| g as &dyn RouteOps)).collect();
    let spec: Vec<&dyn SpecOps> = std::iter::once(&found.cpu as &dyn SpecOps).chain(gpus().map(|g| g as &dyn SpecOps)).collect();
    let gdn: Vec<&dyn GdnOps> = std::iter::once(&found.cpu as &dyn GdnOps).chain(gpus().map(|g| g as &dyn GdnOps)).collect();
    let t = Instant::now();
    let cases = [
        ops::norm::parity_cases(&norm, rng.random())?,
        ops::attention::parity_cases(&attention, rng.random())?,
        ops::route::parity_cases(&route, rng.random())?,
        ops::spec::parity_cases(&spec, rng.random())?,
        ops::gdn::parity_cases(&gdn, rng.random())?,
    ];
    let per_case = t.elapsed().as_secs_f64() / cases.iter().map(Vec::len).sum::<usize>().max(1) as f64;
    for o in cases.into_iter().flatten() {
        print_row(&o, per_case);
        total += 1;
        failed += !o.passed() as usize;
    }
    println!("{} passed, {failed} failed (identical bytes across backends; NMSE vs float64 <= {NMSE_MAX:.0e}, row_top_prob <= {TOP_PROB_NMSE_MAX:.0e})", total - failed);
    Ok(if failed == 0 { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}
