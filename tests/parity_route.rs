//! The router (`router_topk`) and the sampler (`sample_rows`): the CPU replica against float64
//! and the sampling distribution, the counter-based draw's invariances, shape and parameter
//! errors; then `cuda` and `hip` against the replica bit for bit (skipped without a GPU unless
//! `STRATA_REQUIRE_GPU=1`).
mod common;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use strata::host::backends::cpu::CpuBackend;
use strata::host::ops::route::{parity_cases, router_f64, router_logits, RouteOps, SampleParams};
use strata::host::parity::random_logits;
use strata::host::Error;
use strata_gpu_shared::replica::head::argmax_row;
use strata_gpu_shared::replica::sample::splitmix64;


fn params(temperature: f32, top_k: usize, top_p: f32, seed: u64) -> SampleParams {
    SampleParams { temperature, top_k, top_p, seed }
}

fn sample(b: &dyn RouteOps, logits: &[f32], n: usize, p: SampleParams, pos0: usize) -> Vec<u32> {
    let mut ids = vec![u32::MAX; logits.len() / n];
    b.sample_rows(logits, n, p, pos0, &mut ids).unwrap();
    ids
}

#[test]
fn cpu_parity_cases_write_everything_and_meet_the_float64_bar() {
    let seed = common::seed("cpu_parity_cases");
    common::check_all(parity_cases(&[&CpuBackend::new()], seed).unwrap());
}

/// Where the float64 probabilities have no near-tie among the first `k + 1` ranks the ids are
/// float64's, and the weights are within a few f32 roundings of float64's.
#[test]
fn router_matches_float64() {
    let seed = common::seed("router_matches_float64");
    let mut rng = SmallRng::seed_from_u64(seed);
    let cpu = CpuBackend::new();
    let (mut compared, mut worst) = (0, 0.0f64);
    for _ in 0..400 {
        let n_expert = [8, 32, 128, 256, 512][rng.random_range(0..5)];
        let k = rng.random_range(1..=16.min(n_expert));
        let scale = [0.5f32, 3.0, 20.0][rng.random_range(0..3)];
        let logits: Vec<f32> = (0..n_expert).map(|_| rng.random_range(-scale..scale)).collect();
        let (mut ids, mut w) = (vec![0u32; k], vec![0f32; k]);
        cpu.router_topk(&logits, n_expert, k, &mut ids, &mut w).unwrap();
        let (want_ids, want_w) = router_f64(&logits, n_expert, k);
        for (r, (&got, &want)) in w.iter().zip(&want_w).enumerate() {
            let err = (got as f64 - want).abs();
            worst = worst.max(err);
            assert!(err <= 2e-6, "seed {seed}: {n_expert} experts k {k} slot {r}: weight {got:e} vs {want:e}");
        }
        let sum: f64 = w.iter().map(|&v| v as f64).sum();
        assert!((sum - 1.0).abs() < 4e-6, "seed {seed}: weights sum to {sum}");
        let mut sorted: Vec<f64> = logits.iter().map(|&l| l as f64).collect();
        sorted.sort_by(|a, b| b.total_cmp(a));
        let gaps_clear = sorted.windows(2).take(k).all(|w| w[0] - w[1] > 1e-5);
        if gaps_clear {
            assert_eq!(ids, want_ids, "seed {seed}: {n_expert} experts k {k}");
            compared += 1;
        }
    }
    eprintln!("router: ids compared on {compared} of 400 rows, worst weight error {worst:e}");
    assert!(compared > 300);
}

#[test]
fn router_ties_nan_and_infinities() {
    let cpu = CpuBackend::new();
    let route = |logits: &[f32], k: usize| {
        let (mut ids, mut w) = (vec![0u32; k], vec![0f32; k]);
        cpu.router_topk(logits, logits.len(), k, &mut ids, &mut w).unwrap();
        (ids, w)
    };
    // Exact ties: the lower id first, equal weights.
    let (ids, w) = route(&[0.5, 2.0, 1.0, 2.0, 2.0, f32::NAN], 4);
    assert_eq!(ids, [1, 3, 4, 2]);
    assert!(w[0] == w[1] && w[1] == w[2] && w[2] > w[3]);
    // NaN logits have probability 0: after every number, by id.
    let (ids, w) = route(&[f32::NAN, -50.0, f32::NAN, 1.0], 4);
    assert_eq!(ids, [3, 1, 0, 2]);
    assert_eq!((w[2], w[3]), (0.0, 0.0));
    // k = n_expert takes every expert; the weights sum to 1 within rounding.
    let (ids, w) = route(&[3.0, 1.0, 2.0], 3);
    assert_eq!(ids, [0, 2, 1]);
    assert!((w.iter().sum::<f32>() - 1.0).abs() < 1e-6);
    // +inf takes all the weight; all NaN gives weights 0 (not 0/0).
    assert_eq!(route(&[1.0, f32::INFINITY, 2.0], 2), (vec![1, 0], vec![1.0, 0.0]));
    assert_eq!(route(&[f32::NAN; 4], 2), (vec![0, 1], vec![0.0, 0.0]));
    // Tokens are independent: a window routes each row as alone.
    let mut rng = SmallRng::seed_from_u64(7);
    let logits = router_logits(&mut rng, 6, 64);
    let (mut ids, mut w) = (vec![0u32; 6 * 8], vec![0f32; 6 * 8]);
    cpu.router_topk(&logits, 64, 8, &mut ids, &mut w).unwrap();
    for t in 0..6 {
        let (i1, w1) = route(&logits[t * 64..(t + 1) * 64], 8);
        assert_eq!(i1, ids[t * 8..(t + 1) * 8]);
        assert_eq!(w1.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), w[t * 8..(t + 1) * 8].iter().map(|v| v.to_bits()).collect::<Vec<_>>());
    }
}

/// The float64 sampling distribution over a row's indices: top-k by value (ties to the lower
/// index), `exp((l - l_0) / T)`, the shortest prefix whose mass reaches `top_p`, renormalised.
/// Also the margin between that prefix's mass and `top_p` (the test needs it clear of rounding).
fn distribution_f64(row: &[f32], p: SampleParams) -> (Vec<f64>, f64) {
    let mut order: Vec<usize> = (0..row.len()).collect();
    let key = |i: usize| if row[i].is_nan() { f64::NEG_INFINITY } else { row[i] as f64 };
    order.sort_by(|&a, &b| row[a].is_nan().cmp(&row[b].is_nan()).then(key(b).total_cmp(&key(a))).then(a.cmp(&b)));
    order.truncate(p.top_k);
    let l0 = row[order[0]] as f64;
    let w: Vec<f64> = order.iter().map(|&i| if row[i].is_nan() { 0.0 } else { ((row[i] as f64 - l0) / p.temperature as f64).exp() }).collect();
    let total: f64 = w.iter().sum();
    let (mut cum, mut keep, mut margin) = (0.0, w.len(), f64::INFINITY);
    for (r, &x) in w.iter().enumerate() {
        cum += x / total;
        margin = margin.min((cum - p.top_p as f64).abs());
        if cum >= p.top_p as f64 {
            keep = r + 1;
            break;
        }
    }
    let kept: f64 = w[..keep].iter().sum();
    let mut dist = vec![0.0; row.len()];
    for (r, &i) in order[..keep].iter().enumerate() {
        dist[i] = w[r] / kept;
    }
    (dist, if p.top_p >= 1.0 { f64::INFINITY } else { margin })
}

/// The chi-square bound exceeded with probability about 1e-6 for `df` degrees of freedom
/// (Wilson-Hilferty, z = 4.75).
fn chi2_bound(df: usize) -> f64 {
    let d = df as f64;
    let h = 2.0 / (9.0 * d);
    d * (1.0 - h + 4.75 * h.sqrt()).powi(3)
}

/// Many positions' draws from one fixed row follow the float64 distribution (chi-square over
/// the drawn indices), and nothing outside the top-k / top-p set is ever drawn.
#[test]
fn sampler_draws_follow_the_float64_distribution() {
    let seed = common::seed("sampler_distribution");
    let cpu = CpuBackend::new();
    // Ties (indices 2 and 5), a NaN, a -inf and a long tail.
    let row = [0.3f32, -1.0, 2.0, 0.0, f32::NAN, 2.0, 1.1, -2.5, f32::NEG_INFINITY, 0.9, 1.7, -0.4, 0.6, -3.0];
    let draws = 200_000;
    let logits: Vec<f32> = row.iter().copied().cycle().take(row.len() * draws).collect();
    let mut rng = SmallRng::seed_from_u64(seed);
    for (temperature, top_k, top_p) in [(1.0, 256, 1.0), (0.7, 8, 0.9), (1.6, 5, 1.0), (0.5, 256, 0.6), (1.0, 3, 0.999)] {
        let p = params(temperature, top_k, top_p, rng.random());
        let (dist, margin) = distribution_f64(&row, p);
        assert!(margin > 1e-4, "test setup: top_p {top_p} within {margin:e} of a cumulative mass");
        let ids = sample(&cpu, &logits, row.len(), p, rng.random_range(0..1 << 30));
        let mut counts = vec![0usize; row.len()];
        ids.iter().for_each(|&i| counts[i as usize] += 1);
        let mut chi2 = 0.0;
        let mut df = 0;
        for (i, (&c, &q)) in counts.iter().zip(&dist).enumerate() {
            if q == 0.0 {
                assert_eq!(c, 0, "{p:?}: index {i} has probability 0 but was drawn {c} times");
                continue;
            }
            let e = q * draws as f64;
            chi2 += (c as f64 - e).powi(2) / e;
            df += 1;
        }
        let bound = if df > 1 { chi2_bound(df - 1) } else { 0.0 };
        eprintln!("{p:?}: {df} indices, chi-square {chi2:.2} (bound {bound:.2}), counts {counts:?}");
        assert!(chi2 <= bound, "{p:?}: chi-square {chi2:.2} over {bound:.2} with {} degrees of freedom", df - 1);
    }
}

/// `top_k = 1`, or a `top_p` so small only rank 0 is kept, always draws the argmax.
#[test]
fn top_k_one_and_tiny_top_p_draw_the_argmax() {
    let seed = common::seed("sampler_argmax");
    let mut rng = SmallRng::seed_from_u64(seed);
    let cpu = CpuBackend::new();
    for _ in 0..60 {
        let (rows, n) = (rng.random_range(1..=6), rng.random_range(1..=3000));
        let logits = random_logits(&mut rng, rows, n);
        let want: Vec<u32> = logits.chunks(n).map(|r| argmax_row(r).0).collect();
        let t = rng.random_range(0.05f32..4.0);
        assert_eq!(sample(&cpu, &logits, n, params(t, 1, rng.random_range(0.01f32..=1.0), rng.random()), 0), want, "top_k 1");
        let tiny = params(t, rng.random_range(1..=256), f32::MIN_POSITIVE, rng.random());
        assert_eq!(sample(&cpu, &logits, n, tiny, rng.random_range(0..1000)), want, "{tiny:?}");
    }
}

/// A row's draw depends on (seed, position) alone: the same row drawn alone at its position,
/// in shifted windows, or in a reordered window whose `pos0` puts it at the same position,
/// gives the same token; other seeds and positions give other tokens.
#[test]
fn draws_depend_on_seed_and_position_only() {
    let seed = common::seed("sampler_positions");
    let mut rng = SmallRng::seed_from_u64(seed);
    let cpu = CpuBackend::new();
    let (rows, n) = (24, 500);
    let logits = random_logits(&mut rng, rows, n);
    let p = params(1.2, 200, 0.97, rng.random());
    let pos0 = rng.random_range(0..1_000_000);
    let window = sample(&cpu, &logits, n, p, pos0);
    for t in 0..rows {
        assert_eq!(sample(&cpu, &logits[t * n..(t + 1) * n], n, p, pos0 + t)[0], window[t], "row {t} alone");
    }
    let (a, b) = (sample(&cpu, &logits[..7 * n], n, p, pos0), sample(&cpu, &logits[7 * n..], n, p, pos0 + 7));
    assert_eq!([a, b].concat(), window, "split windows");
    // Rotated by `s`: window row `j` is row `j + s`; at `pos0 + s` the first `rows - s` keep
    // their positions.
    let s = 5;
    let rotated = [&logits[s * n..], &logits[..s * n]].concat();
    assert_eq!(sample(&cpu, &rotated, n, p, pos0 + s)[..rows - s], window[s..], "rotated window");
    // A flat row (about 190 kept candidates of nearly equal weight): the draws vary over
    // positions and between seeds.
    let flat: Vec<f32> = (0..64 * n).map(|i| (i % n % 7) as f32 * 1e-3).collect();
    let s1 = sample(&cpu, &flat, n, p, pos0);
    let s2 = sample(&cpu, &flat, n, SampleParams { seed: p.seed ^ 0x5555_0000_0000_0001, ..p }, pos0);
    let differ = s1.iter().zip(&s2).filter(|(a, b)| a != b).count();
    let distinct = s1.iter().collect::<std::collections::HashSet<_>>().len();
    eprintln!("seeds differ on {differ} of 64 draws; {distinct} distinct tokens over 64 positions");
    assert!(differ >= 48 && distinct >= 40);
}

/// The uniform numbers are splitmix64's sequence: position `i` of seed `s` is the `i`-th output
/// of the sequential generator started at `s`.
#[test]
fn positions_follow_the_sequential_splitmix64() {
    let mut state = 0x0123_4567_89ab_cdefu64;
    let start = state;
    for i in 0..1000 {
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        assert_eq!(splitmix64(start, i), z ^ (z >> 31));
    }
}

#[test]
fn shape_and_parameter_errors_are_errors() {
    let cpu = CpuBackend::new();
    let is_shape = |r: strata::host::Result<()>| matches!(r, Err(Error::Shape { .. }));
    let x = vec![0.5f32; 64];
    let good = params(1.0, 40, 0.9, 1);
    let mut ids = vec![0u32; 4];
    assert!(cpu.sample_rows(&x, 16, good, 0, &mut ids).is_ok());
    assert!(is_shape(cpu.sample_rows(&x, 0, good, 0, &mut ids)));
    assert!(is_shape(cpu.sample_rows(&x, 15, good, 0, &mut ids)));
    assert!(is_shape(cpu.sample_rows(&[], 16, good, 0, &mut [])));
    assert!(is_shape(cpu.sample_rows(&x, 16, good, 0, &mut ids[..3])));
    assert!(is_shape(cpu.sample_rows(&x, 16, good, u32::MAX as usize + 1, &mut ids)));
    for bad in [
        SampleParams { top_k: 0, ..good },
        SampleParams { top_k: 257, ..good },
        SampleParams { top_p: 0.0, ..good },
        SampleParams { top_p: 1.5, ..good },
        SampleParams { top_p: f32::NAN, ..good },
        SampleParams { temperature: 0.0, ..good },
        SampleParams { temperature: -1.0, ..good },
        SampleParams { temperature: f32::INFINITY, ..good },
        SampleParams { temperature: f32::NAN, ..good },
    ] {
        assert!(bad.check().is_err(), "{bad:?}");
        assert!(is_shape(cpu.sample_rows(&x, 16, bad, 0, &mut ids)), "{bad:?}");
    }
    let (mut ids, mut w) = (vec![0u32; 8], vec![0f32; 8]);
    assert!(cpu.router_topk(&x, 16, 2, &mut ids, &mut w).is_ok());
    assert!(is_shape(cpu.router_topk(&x, 0, 2, &mut ids, &mut w)));
    assert!(is_shape(cpu.router_topk(&x, 16, 0, &mut [], &mut [])));
    assert!(is_shape(cpu.router_topk(&x, 16, 3, &mut ids, &mut w)));
    assert!(is_shape(cpu.router_topk(&x, 16, 2, &mut ids[..7], &mut w)));
    assert!(is_shape(cpu.router_topk(&x, 16, 2, &mut ids, &mut w[..7])));
    assert!(is_shape(cpu.router_topk(&x, 2, 3, &mut vec![0; 96], &mut vec![0.0; 96]))); // k > n_expert
    assert!(is_shape(cpu.router_topk(&x, 32, 17, &mut vec![0; 34], &mut vec![0.0; 34]))); // k > 16
    let big = vec![0f32; 1026];
    assert!(is_shape(cpu.router_topk(&big, 513, 2, &mut vec![0; 4], &mut vec![0.0; 4])));
}


crate::gpu_parity_suite!(cases: parity_cases);

/// The typed launchers refuse device buffers shorter than the shape needs, and take longer ones.
#[test]
fn launchers_check_device_buffers() {
    let Some(gpu) = common::open_gpu("cuda") else { return };
    let is_shape = |r: strata::host::Result<()>| matches!(r, Err(Error::Shape { .. }));
    let mut rng = SmallRng::seed_from_u64(common::seed("launchers_check_device_buffers"));
    let (tokens, n_expert, k) = (5, 128, 8);
    let logits = router_logits(&mut rng, tokens, n_expert);
    let dl = gpu.upload("router_topk", &logits).unwrap();
    let (mut ids, mut w) = (gpu.upload("router_topk", &vec![0u32; tokens * k + 3]).unwrap(), gpu.upload("router_topk", &vec![0f32; tokens * k]).unwrap());
    let mut short = gpu.upload("router_topk", &vec![0f32; tokens * k - 1]).unwrap();
    assert!(is_shape(gpu.router_topk_queue(&dl, tokens, n_expert, k, &mut ids, &mut short, None)));
    assert!(is_shape(gpu.router_topk_queue(&dl, tokens + 1, n_expert, k, &mut ids, &mut w, None)));
    gpu.router_topk_queue(&dl, tokens, n_expert, k, &mut ids, &mut w, None).unwrap();
    let mut got = vec![0u32; tokens * k + 3];
    gpu.download("router_topk", &ids, &mut got).unwrap();
    let (mut want, mut want_w) = (vec![0u32; tokens * k], vec![0f32; tokens * k]);
    CpuBackend::new().router_topk(&logits, n_expert, k, &mut want, &mut want_w).unwrap();
    assert_eq!(got[..tokens * k], want);

    let (rows, n) = (3, 5000);
    let x = random_logits(&mut rng, rows, n);
    let dx = gpu.upload("argmax_rows", &x).unwrap();
    let mut scratch = gpu.argmax_scratch(rows, n).unwrap();
    let (mut idx, mut flags) = (gpu.upload("argmax_rows", &[0u32; 4]).unwrap(), gpu.upload("argmax_rows", &[0u32; 4]).unwrap());
    let mut small = gpu.argmax_scratch(1, n).unwrap();
    assert!(is_shape(gpu.argmax_rows_queue(&dx, rows, n, &mut small, &mut idx, &mut flags)));
    gpu.argmax_rows_queue(&dx, rows, n, &mut scratch, &mut idx, &mut flags).unwrap();
    let mut got = [0u32; 4];
    gpu.download("argmax_rows", &idx, &mut got).unwrap();
    let want: Vec<u32> = x.chunks(n).map(|r| argmax_row(r).0).collect();
    assert_eq!(got[..rows], want);

    let mut sid = gpu.upload("sample_rows", &[0u32; 2]).unwrap();
    let (zero, at77) = (gpu.upload("sample_rows", &[0u32]).unwrap(), gpu.upload("sample_rows", &[77u32]).unwrap());
    assert!(is_shape(gpu.sample_rows_queue(&dx, rows, n, params(1.0, 10, 0.9, 3), &zero, &mut sid)));
    assert!(is_shape(gpu.sample_rows_queue(&dx, 2, n, params(1.0, 300, 0.9, 3), &zero, &mut sid)));
    let mut sid = gpu.upload("sample_rows", &[0u32; 5]).unwrap();
    let p = params(0.8, 50, 0.9, rng.random());
    gpu.sample_rows_queue(&dx, rows, n, p, &at77, &mut sid).unwrap();
    let mut got = [0u32; 5];
    gpu.download("sample_rows", &sid, &mut got).unwrap();
    assert_eq!(got[..rows], sample(&CpuBackend::new(), &x, n, p, 77));
}

/// The parity suite on the kernels' own code in the simulator, against the replica bit for bit.
#[test]
fn sim_matches_cpu() {
    let seed = common::seed("sim_matches_cpu");
    common::check_all(parity_cases(&[&CpuBackend::new(), &strata::host::backends::sim::SimBackend::new(132)], seed).unwrap());
}
