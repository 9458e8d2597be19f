//! Attention of the decode step (`attn_prep`, `attn_chunk` + `attn_merge`, and the two in one
//! launch for a window of one-chunk contexts): the CPU replica against float64, window
//! invariance, the chunk boundaries, partial RoPE and shape errors; then `cuda` and `hip`
//! against the replica bit for bit and window invariance on each (skipped
//! without a GPU unless `STRATA_REQUIRE_GPU=1`), and the same of the kernels' own code in the
//! simulator (`sim`, every machine).
mod common;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use strata::host::backends::cpu::CpuBackend;
use strata::host::ops::attention::{
    attention_case, attn_part_len, parity_cases, prep_attention_cases, prep_case, rope_table, window_case, AttentionOps, AttnCase, AttnShape, QkvStrides,
    BOUNDARY_WINDOWS,
};
use strata::host::backends::gpu::GpuBackend;
use strata::host::backends::sim::SimBackend;
use strata::host::backends::knobs::KernelKnobs;
use strata::host::parity::Outcome;
use strata::host::Error;
use strata_gpu_shared::launch::attention::{attn_band_fits, attn_chunk_has_lean, attn_max_band};

fn check(o: Outcome) {
    eprintln!("  {} {}: {} passed {} nmse {:?}", o.kernel, o.shape, o.backends.join("="), o.passed(), o.nmse);
    assert!(o.passed(), "{}", o.explain());
}


#[test]
fn cpu_parity_cases_write_everything_and_meet_the_float64_bar() {
    let seed = common::seed("cpu_parity_cases");
    common::check_all(parity_cases(&[&CpuBackend::new()], seed).unwrap());
}

/// Contexts of exactly 1, 256, 257 and 512 keys and windows across a chunk boundary, for every
/// head shape the random cases draw from: float64 agrees, every value written.
#[test]
fn chunk_boundaries_meet_the_float64_bar() {
    let seed = common::seed("chunk_boundaries");
    let mut rng = SmallRng::seed_from_u64(seed);
    let cpu = CpuBackend::new();
    for (tokens, pos0) in BOUNDARY_WINDOWS {
        for _ in 0..4 {
            let s = rng.random();
            let case = AttnCase::random(&mut SmallRng::seed_from_u64(s), tokens, pos0);
            check(attention_case(&[&cpu], &case, s).unwrap());
            check(prep_case(&[&cpu], &case, s).unwrap());
        }
    }
}

/// The merge really combines chunks: at a context of 257 keys, a key at position 256 (alone in
/// the second chunk) that matches the query best takes its softmax weight, as it does at
/// position 0 (the first chunk).
#[test]
fn a_key_alone_in_the_last_chunk_counts_fully() {
    let cpu = CpuBackend::new();
    let (n_q, n_kv, hd, n_ctx) = (2, 1, 64, 257);
    let shape = AttnShape { tokens: 1, n_q, n_kv, hd, n_rot: hd, n_ctx };
    let q: Vec<f32> = (0..n_q * hd).map(|i| if i % hd == 3 { 8.0 } else { 0.0 }).collect();
    let run = |special: usize| {
        let mut k = vec![0u16; n_ctx * hd];
        let mut v = vec![0u16; n_ctx * hd];
        for (p, row) in v.chunks_exact_mut(hd).enumerate() {
            row.fill(strata_gpu_shared::f16::f32_to_f16(if p == special { 1.0 } else { -1.0 }));
        }
        k[special * hd + 3] = strata_gpu_shared::f16::f32_to_f16(2.0);
        let mut out = vec![0f32; n_q * hd];
        cpu.attention(&q, &k, &v, shape, 256, 1.0, &mut out).unwrap();
        out
    };
    let (last, first) = (run(256), run(0));
    // Weight of the special key: e^16 / (e^16 + 256), output 2w - 1. The in-order f32 sums of
    // 256 terms are good to a few 1e-6 (each of the 255 small terms rounds against a sum near 1).
    let w = 16f64.exp() / (16f64.exp() + 256.0);
    for out in [&last, &first] {
        for &a in out {
            assert!((a as f64 - (2.0 * w - 1.0)).abs() < 2e-5, "{a} vs {}", 2.0 * w - 1.0);
        }
    }
}

#[test]
fn window_invariance_in_the_replica() {
    let seed = common::seed("window_invariance_replica");
    let mut rng = SmallRng::seed_from_u64(seed);
    for _ in 0..6 {
        check(window_case(&CpuBackend::new(), rng.random()).unwrap());
    }
}

/// With `n_rot < hd` the values past `n_rot` are the normed input (the output with no RoPE at
/// all), bit for bit, and the roped ones differ from it: `q_out` rows and the window's key rows.
fn partial_rope_keeps_the_tail(b: &dyn AttentionOps, seed: u64) {
    let mut rng = SmallRng::seed_from_u64(seed);
    let case = AttnCase::random(&mut rng, 3, 40);
    let full = AttnShape { n_rot: case.shape.hd, ..case.shape };
    let (hd, window) = (full.hd, case.pos0 * full.n_kv * full.hd..(case.pos0 + 3) * full.n_kv * full.hd);
    // The bits of q_out's rows, then of the window's key rows.
    let prep = |n_rot: usize| -> Vec<u32> {
        let s = AttnShape { n_rot, ..full };
        let mut q_out = vec![0f32; s.q_len()];
        let (mut kc, mut vc) = (case.k_cache.clone(), case.v_cache.clone());
        let rope = rope_table(s.n_ctx, n_rot, case.freq_base);
        b.attn_prep(&case.q, &case.k, &case.v, s.dense(), &case.q_norm, &case.k_norm, &rope, s, case.pos0, case.eps, &mut q_out, &mut kc, &mut vc).unwrap();
        q_out.iter().map(|v| v.to_bits()).chain(kc[window.clone()].iter().map(|&h| h as u32)).collect()
    };
    let plain = prep(0);
    for n_rot in [32, hd / 2] {
        for (r, (a, b)) in prep(n_rot).chunks_exact(hd).zip(plain.chunks_exact(hd)).enumerate() {
            assert_eq!(a[n_rot..], b[n_rot..], "row {r} (q rows first), n_rot {n_rot}: the tail changed");
            assert_ne!(a[..n_rot], b[..n_rot], "row {r} (q rows first), n_rot {n_rot}: nothing rotated");
        }
    }
}

#[test]
fn partial_rope_in_the_replica() {
    partial_rope_keeps_the_tail(&CpuBackend::new(), common::seed("partial_rope_replica"));
}

/// Bad shapes and buffer lengths are `Error::Shape`, never a panic, on every backend.
fn shape_errors_are_errors(b: &dyn AttentionOps) {
    let is_shape = |r: strata::host::Result<()>| matches!(r, Err(Error::Shape { .. }));
    let mut rng = SmallRng::seed_from_u64(7);
    let c = AttnCase::random(&mut rng, 4, 100);
    let s = c.shape;
    let prep_strided = |strides: QkvStrides, s: AttnShape, q: &[f32], k: &[f32], v: &[f32], q_out: &mut [f32]| {
        let (mut kc, mut vc) = (c.k_cache.clone(), c.v_cache.clone());
        b.attn_prep(q, k, v, strides, &c.q_norm, &c.k_norm, &c.rope, s, c.pos0, c.eps, q_out, &mut kc, &mut vc)
    };
    let prep = |s: AttnShape, pos0: usize, q_out: &mut [f32], rope: &[f32]| {
        let (mut kc, mut vc) = (c.k_cache.clone(), c.v_cache.clone());
        b.attn_prep(&c.q, &c.k, &c.v, s.dense(), &c.q_norm, &c.k_norm, rope, s, pos0, c.eps, q_out, &mut kc, &mut vc)
    };
    let mut q_out = vec![0f32; s.q_len()];
    prep(s, c.pos0, &mut q_out, &c.rope).unwrap();
    // Strides below a row or past u32 (the inputs cut to what they span, so only the strides are
    // wrong), and packed inputs too short for fused strides.
    let d = s.dense();
    let cut = |strides: QkvStrides, s: AttnShape, q_out: &mut [f32]| {
        let span = |stride: usize, row: usize| (s.tokens - 1) * stride + row;
        let (kv, q_out_len) = (span(strides.kv, d.kv), s.q_len());
        prep_strided(strides, s, &c.q[..span(strides.q, d.q)], &c.k[..kv], &c.v[..kv], &mut q_out[..q_out_len])
    };
    let one = AttnShape { tokens: 1, ..s };
    cut(d, one, &mut q_out).unwrap();
    assert!(is_shape(cut(QkvStrides { q: d.q - 1, ..d }, s, &mut q_out)));
    assert!(is_shape(cut(QkvStrides { kv: d.kv - 1, ..d }, s, &mut q_out)));
    assert!(is_shape(cut(QkvStrides { q: 1 << 32, ..d }, one, &mut q_out)));
    assert!(is_shape(cut(QkvStrides { kv: 1 << 32, ..d }, one, &mut q_out)));
    assert!(is_shape(prep_strided(s.fused(), s, &c.q, &c.k, &c.v, &mut q_out)));
    assert!(is_shape(prep(s, c.pos0, &mut q_out[1..], &c.rope)));
    assert!(is_shape(prep(s, c.pos0, &mut q_out, &c.rope[1..])));
    assert!(is_shape(prep(s, s.n_ctx - 3, &mut q_out, &c.rope))); // window past the cache
    assert!(is_shape(prep(AttnShape { n_rot: s.n_rot - 1, ..s }, c.pos0, &mut q_out, &c.rope)));
    assert!(is_shape(prep(AttnShape { n_kv: 3, ..s }, c.pos0, &mut q_out, &c.rope)));
    let mut out = vec![0f32; s.q_len()];
    let attend = |s: AttnShape, pos0: usize, q: &[f32], k: &[u16], out: &mut [f32]| b.attention(q, k, &c.v_cache, s, pos0, c.scale, out);
    attend(s, c.pos0, &c.q, &c.k_cache, &mut out).unwrap();
    assert!(is_shape(attend(s, c.pos0, &c.q[1..], &c.k_cache, &mut out)));
    assert!(is_shape(attend(s, c.pos0, &c.q, &c.k_cache[..c.k_cache.len() - 1], &mut out)));
    assert!(is_shape(attend(s, c.pos0, &c.q, &c.k_cache, &mut out[1..])));
    assert!(is_shape(attend(s, usize::MAX - 1, &c.q, &c.k_cache, &mut out)));
    assert!(is_shape(attend(AttnShape { hd: s.hd + 16, ..s }, c.pos0, &c.q, &c.k_cache, &mut out)));
    assert!(is_shape(attend(AttnShape { hd: 288, ..s }, c.pos0, &c.q, &c.k_cache, &mut out)));
    assert!(is_shape(attend(AttnShape { tokens: 0, ..s }, c.pos0, &[], &c.k_cache, &mut [])));
}

#[test]
fn shape_errors_in_the_replica() {
    shape_errors_are_errors(&CpuBackend::new());
}


/// `name` against the replica: the parity suite, window invariance on the GPU itself, partial
/// RoPE and shape errors.
fn gpu_against_cpu(name: &str) {
    let Some(gpu) = common::open_gpu(name) else { return };
    let seed = common::seed(&format!("{name}_vs_cpu"));
    let mut rng = SmallRng::seed_from_u64(seed);
    for _ in 0..2 {
        common::check_all(parity_cases(&[&CpuBackend::new(), &gpu], rng.random()).unwrap());
    }
    for _ in 0..4 {
        check(window_case(&gpu, rng.random()).unwrap());
    }
    partial_rope_keeps_the_tail(&gpu, rng.random());
    shape_errors_are_errors(&gpu);
    common::check_all(prep_attention_cases(&[&CpuBackend::new(), &gpu], rng.random()).unwrap());
    fused_launch_refuses_what_it_does_not_take(&gpu, rng.random());
}

/// The fused prep and attention refuse, as shape errors naming it, the windows it does not
/// take: a context past one chunk (one token, and a window whose last token's is), heads of 64
/// values, a group of one head.
fn fused_launch_refuses_what_it_does_not_take(b: &dyn AttentionOps, seed: u64) {
    let mut rng = SmallRng::seed_from_u64(seed);
    let cases = [(1, 256, (4, 2, 128), "up to 257 keys"), (4, 253, (4, 2, 128), "up to 257 keys"), (1, 10, (4, 2, 64), "64 values"), (3, 10, (4, 4, 128), "bands of 1")];
    for (tokens, pos0, heads, says) in cases {
        let c = AttnCase::random_heads(&mut rng, tokens, pos0, heads);
        let (mut kc, mut vc, mut out) = (c.k_cache.clone(), c.v_cache.clone(), vec![0.0; c.shape.q_len()]);
        let err = b.prep_attention(&c.q, &c.k, &c.v, &c.q_norm, &c.k_norm, &c.rope, c.shape, c.pos0, c.eps, c.scale, &mut kc, &mut vc, &mut out).expect_err("not a fused launch");
        let text = err.to_string();
        assert!(matches!(err, Error::Shape { kernel: "attn_prep_chunk", .. }) && text.contains(says), "{}: {tokens} tokens at {pos0}, heads {heads:?}: {text}", b.name());
    }
}

crate::gpu_parity_suite!(gpu_against_cpu, parity_cases);

/// The kernels' own code in the simulator, launched as the cuda backend launches them on a GPU
/// of 132 SMs: the parity cases against the replica bit for bit, window invariance, partial
/// RoPE and the shape errors.
#[test]
fn sim_against_cpu() {
    let mut rng = SmallRng::seed_from_u64(common::seed("sim_against_cpu"));
    let sim = SimBackend::new(132);
    common::check_all(parity_cases(&[&CpuBackend::new(), &sim], rng.random()).unwrap());
    check(window_case(&sim, rng.random()).unwrap());
    partial_rope_keeps_the_tail(&sim, rng.random());
    shape_errors_are_errors(&sim);
    common::check_all(prep_attention_cases(&[&CpuBackend::new(), &sim], rng.random()).unwrap());
    fused_launch_refuses_what_it_does_not_take(&sim, rng.random());
}

/// Every `attn_chunk` entry in the simulator: each band that fits heads of 128 values (with and
/// without the lean twin) and of 64, at one-chunk contexts (the output written by the chunk
/// kernel) and longer ones (parts and the merge), against the replica bit for bit.
#[test]
fn sim_every_entry_gives_the_replicas_bits() {
    let seed = common::seed("sim_every_entry");
    let mut rng = SmallRng::seed_from_u64(seed);
    let cpu = CpuBackend::new();
    for heads in [(8, 1, 128), (16, 2, 128), (4, 2, 64), (8, 1, 64)] {
        for (tokens, pos0) in [(1, 100), (3, 700), (8, 250)] {
            let s = rng.random();
            let case = AttnCase::random_heads(&mut SmallRng::seed_from_u64(s), tokens, pos0, heads);
            for band in (1..=attn_max_band(heads.2)).filter(|&b| attn_band_fits(heads.0, heads.1, heads.2, b)) {
                for lean in if attn_chunk_has_lean(band, heads.2) { [false, true].as_slice() } else { [false].as_slice() } {
                    let mut sim = SimBackend { attn_band: Some(band), ..SimBackend::new(132) };
                    sim.knobs.attn_minb = if *lean { 4 } else { 2 };
                    let o = attention_case(&[&cpu, &sim], &case, s).unwrap();
                    assert!(o.passed(), "band {band}, lean {lean}: {}", o.explain());
                }
            }
        }
    }
}

/// `run` on `gpu` with `ATTN_MINB` 2 (`attn_chunk_128`) and, for a band of `band` heads of `hd`
/// values that has the lean twin, 4 (`attn_chunk_128_m4`) where the backend has it (cuda on
/// sm_90); on a backend without it, the knob's 4 is refused by name. The knob is restored.
fn blocks_a_sm(gpu: &mut GpuBackend, band: usize, hd: usize, run: &mut dyn FnMut(&GpuBackend) -> Result<(), Error>) {
    let knobs = gpu.kernel_knobs();
    let lean = attn_chunk_has_lean(band, hd);
    for minb in if lean { [2, 4].as_slice() } else { [2].as_slice() } {
        gpu.set_kernel_knobs(KernelKnobs { attn_minb: *minb, ..knobs });
        match run(gpu) {
            Ok(()) => assert!(*minb == 2 || gpu.sm90_entries(), "ATTN_MINB={minb} ran without the lean entry"),
            Err(e) => assert!(*minb == 4 && !gpu.sm90_entries() && e.to_string().contains("ATTN_MINB=4"), "ATTN_MINB={minb}, band {band}: {e}"),
        }
    }
    gpu.set_kernel_knobs(knobs);
}

/// The attention grid is sized for a context bound (the step's graphs are captured per bound)
/// and each block computes a band of a KV group's query heads; every bound and every band gives
/// the replica's bits: one block walking all 37 chunks of a token, blocks walking several, and
/// one block a chunk; one head a block up to the widest band, for groups of 8, 6 and 16 heads
/// of 64, 128 and 256 values, 4 of 192 and 3 of 96 (head sizes whose lane count the scoring
/// checks at run time; 96 leaves a partial thread set). The bands with the lean twin run on it
/// too ([`blocks_a_sm`]).
#[test]
fn every_grid_gives_the_same_bits() {
    for name in ["cuda", "hip"] {
        let Some(mut gpu) = common::open_gpu(name) else { continue };
        let seed = common::seed("every_grid_gives_the_same_bits");
        let mut rng = SmallRng::seed_from_u64(seed);
        for heads in [(32, 4, 128), (12, 2, 64), (16, 1, 256), (8, 2, 192), (12, 4, 96)] {
            let c = AttnCase::random_heads(&mut rng, 3, 36 * 256 + 100, heads);
            let s = c.shape;
            let mut want = vec![0f32; s.q_len()];
            CpuBackend::new().attention(&c.q, &c.k_cache, &c.v_cache, s, c.pos0, c.scale, &mut want).unwrap();
            let (dq, dkc, dvc) = (gpu.upload("attention", &c.q).unwrap(), gpu.upload("attention", &c.k_cache).unwrap(), gpu.upload("attention", &c.v_cache).unwrap());
            let dpos = gpu.upload("attention", &[c.pos0 as u32]).unwrap();
            let bands: Vec<usize> = (1..=attn_max_band(s.hd)).filter(|&b| attn_band_fits(s.n_q, s.n_kv, s.hd, b)).collect();
            assert!(bands.len() > 1, "{heads:?} offers one band only");
            for bound in [1, 256, 3000, 9000, c.pos0 + s.tokens, s.n_ctx] {
                for &band in &bands {
                    blocks_a_sm(&mut gpu, band, s.hd, &mut |gpu| {
                        let mut part = gpu.upload("attention", &vec![0f32; attn_part_len(s)]).unwrap();
                        let mut out = gpu.upload("attention", &vec![f32::NAN; s.q_len()]).unwrap();
                        gpu.attention_queue(&dq, &dkc, &dvc, s, &dpos, bound, bound >= c.pos0 + s.tokens, c.scale, Some(band), &mut part, &mut out, None)?;
                        let mut got = vec![0f32; s.q_len()];
                        gpu.download("attention", &out, &mut got).unwrap();
                        let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                        let minb = gpu.kernel_knobs().attn_minb;
                        assert_eq!(bits(&got), bits(&want), "{name}, seed {seed}, heads {heads:?}: context bound {bound} of {}, band {band}, ATTN_MINB={minb}", c.pos0 + s.tokens);
                        Ok(())
                    });
                }
            }
        }
    }
}

/// The typed launchers refuse device buffers shorter than the shape needs and take longer ones
/// (the step's buffers are sized for its largest window), with the host-slice results.
#[test]
fn launchers_check_device_buffers() {
    let Some(gpu) = common::open_gpu("cuda") else { return };
    let is_shape = |r: strata::host::Result<()>| matches!(r, Err(Error::Shape { .. }));
    let mut rng = SmallRng::seed_from_u64(common::seed("attention_launchers"));
    let c = AttnCase::random(&mut rng, 3, 700);
    let s = c.shape;
    let longer = |x: &[f32]| gpu.upload("attention", &[x, &[0.0; 5]].concat()).unwrap();
    let (dq, dk, dv) = (longer(&c.q), longer(&c.k), longer(&c.v));
    let (dqn, dkn, drope) = (longer(&c.q_norm), longer(&c.k_norm), longer(&c.rope));
    let mut dq_out = gpu.upload("attention", &vec![0f32; s.q_len() + 7]).unwrap();
    let mut dkc = gpu.upload("attention", &c.k_cache).unwrap();
    let mut dvc = gpu.upload("attention", &c.v_cache).unwrap();
    let mut short = gpu.upload("attention", &vec![0f32; s.q_len() - 1]).unwrap();
    let dpos = gpu.upload("attention", &[c.pos0 as u32]).unwrap();
    let prep = |q_out: &mut _, kc: &mut _, vc: &mut _, s: AttnShape, pos: &_| {
        gpu.attn_prep_queue(&dq.as_view(), &dk.as_view(), &dv.as_view(), s.dense(), &dqn, &dkn, &drope, s, pos, c.eps, q_out, kc, vc)
    };
    assert!(is_shape(prep(&mut short, &mut dkc, &mut dvc, s, &dpos)));
    assert!(is_shape(prep(&mut dq_out, &mut dkc, &mut dvc, AttnShape { tokens: 3000, ..s }, &dpos)));

    // A window reaching past the cache (the device position is the host's to keep right): the
    // rows that fit are written, the others nowhere.
    let last = gpu.upload("attention", &[s.n_ctx as u32 - 1]).unwrap();
    let poison = vec![f32::NAN; s.q_len() + 7];
    let mut edge_q = gpu.upload("attention", &poison).unwrap();
    let (mut edge_k, mut edge_v) = (gpu.upload("attention", &c.k_cache).unwrap(), gpu.upload("attention", &c.v_cache).unwrap());
    prep(&mut edge_q, &mut edge_k, &mut edge_v, s, &last).unwrap();
    let mut got_q = vec![0f32; s.q_len() + 7];
    gpu.download("attention", &edge_q, &mut got_q).unwrap();
    let row = s.n_q * s.hd;
    assert!(got_q[..row].iter().all(|v| !v.is_nan()) && got_q[row..].iter().all(|v| v.is_nan()), "rows past the cache were written");
    let mut got_k = vec![0u16; c.k_cache.len()];
    gpu.download("attention", &edge_k, &mut got_k).unwrap();
    let kv_row = s.n_kv * s.hd;
    assert_eq!(got_k[..got_k.len() - kv_row], c.k_cache[..c.k_cache.len() - kv_row], "positions before the last were written");

    prep(&mut dq_out, &mut dkc, &mut dvc, s, &dpos).unwrap();

    let mut part = gpu.upload("attention", &vec![0f32; attn_part_len(s)]).unwrap();
    let mut small_part = gpu.upload("attention", &vec![0f32; 10]).unwrap();
    let mut out = gpu.upload("attention", &vec![0f32; s.q_len() + 3]).unwrap();
    let bound = c.pos0 + s.tokens;
    assert!(is_shape(gpu.attention_queue(&dq_out, &dkc, &dvc, s, &dpos, bound, true, c.scale, None, &mut small_part, &mut out, None)));
    assert!(is_shape(gpu.attention_queue(&dq_out, &dkc, &dvc, s, &dpos, bound, true, c.scale, None, &mut part, &mut short, None)));
    // A band that does not divide the group, or wider than the widest, is a shape error.
    for band in [0, s.n_q / s.n_kv + 1, attn_max_band(s.hd) + 1] {
        assert!(is_shape(gpu.attention_queue(&dq_out, &dkc, &dvc, s, &dpos, bound, true, c.scale, Some(band), &mut part, &mut out, None)), "band {band}");
    }
    gpu.attention_queue(&dq_out, &dkc, &dvc, s, &dpos, bound, true, c.scale, None, &mut part, &mut out, None).unwrap();
    let mut got = vec![0f32; s.q_len() + 3];
    gpu.download("attention", &out, &mut got).unwrap();

    // The same two steps on the replica's host slices.
    let cpu = CpuBackend::new();
    let (mut q_out, mut kc, mut vc) = (vec![0f32; s.q_len()], c.k_cache.clone(), c.v_cache.clone());
    cpu.attn_prep(&c.q, &c.k, &c.v, s.dense(), &c.q_norm, &c.k_norm, &c.rope, s, c.pos0, c.eps, &mut q_out, &mut kc, &mut vc).unwrap();
    let mut want = vec![0f32; s.q_len()];
    cpu.attention(&q_out, &kc, &vc, s, c.pos0, c.scale, &mut want).unwrap();
    let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&got[..s.q_len()]), bits(&want));

    // The step's fused layout: views at q's, k's and v's offsets into one buffer of `[q | k |
    // v]` token rows give the replica's bits.
    let (q_row, kv_row) = (s.n_q * s.hd, s.n_kv * s.hd);
    let rows: Vec<f32> = (0..s.tokens).flat_map(|t| [&c.q[t * q_row..][..q_row], &c.k[t * kv_row..][..kv_row], &c.v[t * kv_row..][..kv_row]].concat()).collect();
    let dqkv = gpu.upload("attention", &rows).unwrap();
    let mut fused_q = gpu.upload("attention", &vec![f32::NAN; s.q_len()]).unwrap();
    let (mut fused_k, mut fused_v) = (gpu.upload("attention", &c.k_cache).unwrap(), gpu.upload("attention", &c.v_cache).unwrap());
    let (q, k, v) = (dqkv.slice(..), dqkv.slice(q_row..), dqkv.slice(q_row + kv_row..));
    gpu.attn_prep_queue(&q, &k, &v, s.fused(), &dqn, &dkn, &drope, s, &dpos, c.eps, &mut fused_q, &mut fused_k, &mut fused_v).unwrap();
    assert!(is_shape(gpu.attn_prep_queue(&q, &k, &dqkv.slice(q_row + kv_row + 1..), s.fused(), &dqn, &dkn, &drope, s, &dpos, c.eps, &mut fused_q, &mut fused_k, &mut fused_v)));
    let mut got_q = vec![0f32; s.q_len()];
    let (mut got_k, mut got_v) = (vec![0u16; kc.len()], vec![0u16; vc.len()]);
    gpu.download("attention", &fused_q, &mut got_q).unwrap();
    gpu.download("attention", &fused_k, &mut got_k).unwrap();
    gpu.download("attention", &fused_v, &mut got_v).unwrap();
    assert_eq!(bits(&got_q), bits(&q_out), "fused layout: q_out");
    assert!(got_k == kc && got_v == vc, "fused layout: the caches");
}

/// Contexts of one chunk: with the bound promised (`bound_holds`) `attn_chunk` writes the
/// outputs itself and no part (the part scratch, poisoned with NaN, is left as it was: the merge
/// did not run), without the promise it writes parts; the outputs are the merge's bits either
/// way, and the q8_1 blocks either kernel writes with `xq` are `quantize_q8_1`'s (the
/// replica's) of those outputs, every byte written (two runs, the blocks poisoned 0x00 and
/// 0xff). Windows of 1..8 tokens ending anywhere up to position 256, every band of the heads,
/// on the lean twin too ([`blocks_a_sm`]).
#[test]
fn one_chunk_contexts_finish_in_the_chunk_kernel() {
    use strata_gpu_shared::formats::q8_1;
    for name in ["cuda", "hip"] {
        let Some(mut gpu) = common::open_gpu(name) else { continue };
        let seed = common::seed("one_chunk_contexts_finish_in_the_chunk_kernel");
        let mut rng = SmallRng::seed_from_u64(seed);
        for case in 0..12 {
            let tokens = rng.random_range(1..=8);
            let pos0 = if case == 0 { 256 - tokens } else { rng.random_range(0..=256 - tokens) };
            let heads = [(32, 4, 128), (12, 2, 64), (16, 1, 256)][case % 3];
            let c = AttnCase::random_heads(&mut rng, tokens, pos0, heads);
            let s = c.shape;
            let (dq, dkc, dvc) = (gpu.upload("attention", &c.q).unwrap(), gpu.upload("attention", &c.k_cache).unwrap(), gpu.upload("attention", &c.v_cache).unwrap());
            let dpos = gpu.upload("attention", &[c.pos0 as u32]).unwrap();
            let bound = c.pos0 + s.tokens;
            let blocks = q8_1::bytes_of(s.q_len());
            let run = |gpu: &GpuBackend, holds: bool, band: usize, poison: u8| -> Result<(Vec<u32>, Vec<u8>, bool), Error> {
                let mut part = gpu.upload("attention", &vec![f32::NAN; attn_part_len(s)]).unwrap();
                let mut out = gpu.upload("attention", &vec![f32::NAN; s.q_len()]).unwrap();
                let mut xq = gpu.upload("attention", &vec![poison; blocks]).unwrap();
                gpu.attention_queue(&dq, &dkc, &dvc, s, &dpos, bound, holds, c.scale, Some(band), &mut part, &mut out, Some(&mut xq))?;
                let (mut got, mut got_q) = (vec![0f32; s.q_len()], vec![0u8; blocks]);
                gpu.download("attention", &out, &mut got).unwrap();
                gpu.download("attention", &xq, &mut got_q).unwrap();
                let mut got_part = vec![0f32; attn_part_len(s)];
                gpu.download("attention", &part, &mut got_part).unwrap();
                let parts_written = got_part.iter().any(|v| v.to_bits() != f32::NAN.to_bits());
                Ok((got.iter().map(|v| v.to_bits()).collect(), got_q, parts_written))
            };
            let (merged, _, _) = run(&gpu, false, 1, 0).unwrap();
            let mut want_q = vec![0u8; blocks];
            strata_gpu_shared::replica::quantize_q8_1::quantize(&merged.iter().map(|&b| f32::from_bits(b)).collect::<Vec<_>>(), &mut want_q);
            for band in (1..=attn_max_band(s.hd)).filter(|&b| attn_band_fits(s.n_q, s.n_kv, s.hd, b)) {
                blocks_a_sm(&mut gpu, band, s.hd, &mut |gpu| {
                    for (holds, poison) in [(true, 0x00), (true, 0xff), (false, 0x00), (false, 0xff)] {
                        let (got, got_q, parts_written) = run(gpu, holds, band, poison)?;
                        let minb = gpu.kernel_knobs().attn_minb;
                        let what = format!("{name}, seed {seed}, case {case}: {tokens} tokens at {pos0}, heads {heads:?}, band {band}, ATTN_MINB={minb}, bound holds {holds}, poison {poison:#x}");
                        assert_eq!(parts_written, !holds, "{what}: parts written (the merge's input) or not");
                        assert_eq!(got, merged, "{what}: outputs differ from the merged ones");
                        assert_eq!(got_q, want_q, "{what}: q8_1 blocks differ from quantize_q8_1 of the outputs (or were not all written)");
                    }
                    Ok(())
                });
            }
        }
    }
}

/// `attn_chunk` computes a chunk's first cache row in 32 bits, so a cache of 2^32 values or
/// more is a shape error naming that bound (on every backend, before any buffer is looked at);
/// one position fewer passes that check and fails only on the buffers' lengths.
#[test]
fn caches_of_2_pow_32_values_are_refused() {
    let (n_kv, hd) = (8, 256);
    let at = |n_ctx: usize| {
        let shape = AttnShape { tokens: 1, n_q: 8, n_kv, hd, n_rot: hd, n_ctx };
        let err = CpuBackend::new().attention(&[], &[], &[], shape, 0, 1.0, &mut []).expect_err("empty buffers");
        assert!(matches!(err, Error::Shape { .. }), "{err}");
        err.to_string()
    };
    let full = (1usize << 32) / (n_kv * hd);
    assert!(at(full).contains("2^32"), "{}", at(full));
    assert!(!at(full - 1).contains("2^32"), "{}", at(full - 1));
}
