//! The Gated DeltaNet family (`gdn_conv`, `gdn_recur`) and the gates of the qwen35moe step
//! (`rms_norm_gated`, `sigmoid_mul`, `swiglu_f32`, `add_gated`, `concat_rows`): the CPU parity cases against
//! float64, the replicas against their written spec spelled out again here, window invariance
//! and the verify-window rollback of the position-indexed state, shape errors, and a broken
//! backend caught; then `cuda` and `hip` against the replica bit for bit, with and without
//! padded grids (skipped without a GPU unless `STRATA_REQUIRE_GPU=1`).
mod common;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use strata::host::backends::cpu::CpuBackend;
use strata::host::ops::gdn::{concat_case, conv_case, parity_cases, recur_case, GdnOps, RecurCase};
use strata::host::Error;
use strata_gpu_shared::launch::gdn::{gdn_conv_ring, GDN_MAX_CONV, GDN_MAX_D, GDN_STATE_SLOTS};
use strata_gpu_shared::launch::norm::NORM_MAX_N;
use strata_gpu_shared::launch::spec::SPEC_MAX_TOKENS;
use strata_gpu_shared::math::{exp_neg, sigmoid, softplus};
use strata_gpu_shared::moe::silu;
use strata_gpu_shared::replica;
use strata_gpu_shared::replica::gdn::RecurShape;

const POISON: f32 = f32::from_bits(0x7fc0_5eed);

fn uniform(rng: &mut SmallRng, n: usize, mag: f32) -> Vec<f32> {
    (0..n).map(|_| rng.random_range(-1.0f32..1.0) * mag).collect()
}

/// Position 0, a small position (some below `d_conv - 1`) or a large one.
fn some_pos(rng: &mut SmallRng) -> u32 {
    match rng.random_range(0..3) {
        0 => 0,
        1 => rng.random_range(1..=10),
        _ => rng.random_range(100_000..3_000_000_000),
    }
}

/// Panics at the first word where `got` and `want` differ.
#[track_caller]
fn same_bits(got: &[f32], want: &[f32], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    if let Some(i) = got.iter().zip(want).position(|(a, b)| a.to_bits() != b.to_bits()) {
        panic!("{what}: first difference at {i}: {:e} ({:#010x}) vs {:e} ({:#010x})", got[i], got[i].to_bits(), want[i], want[i].to_bits());
    }
}

// ---------------------------------------------------------------------------------------------
// The written specs, spelled out again with other means: position-indexed histories instead of
// ring arithmetic, the state held as `S[i][j]` matrices, the warp sum as lane partials then
// recursive halving, sqrt through float64 (which rounds correctly for f32 inputs).

fn halving(v: &[f32]) -> f32 {
    if v.len() == 1 {
        return v[0];
    }
    let h = v.len() / 2;
    halving(&(0..h).map(|i| v[i] + v[i + h]).collect::<Vec<_>>())
}

/// A warp's sum of `terms`: lane `l` adds terms `l, l + 32, ...` left to right from +0.0.
fn warp_sum(terms: impl Iterator<Item = f32>) -> f32 {
    let mut partials = [0f32; 32];
    for (i, t) in terms.enumerate() {
        partials[i % 32] += t;
    }
    halving(&partials)
}

fn sqrt_f32(x: f32) -> f32 {
    (x as f64).sqrt() as f32
}

/// `gdn_conv` as the spec says it: returns the outputs and the ring after.
fn conv_spec(x: &[f32], w: &[f32], ring: &[f32], pos: u32, channels: usize, d_conv: usize) -> (Vec<f32>, Vec<f32>) {
    let rows = d_conv - 1 + SPEC_MAX_TOKENS;
    let tokens = x.len() / channels;
    let pos = pos as i64;
    let input = |q: i64, c: usize| -> f32 {
        if q >= pos {
            x[(q - pos) as usize * channels + c]
        } else if q < 0 {
            0.0
        } else {
            ring[(q as usize % rows) * channels + c]
        }
    };
    let mut out = Vec::new();
    for t in 0..tokens as i64 {
        for c in 0..channels {
            let mut acc = 0.0f32;
            for k in 0..d_conv as i64 {
                acc += w[c * d_conv + k as usize] * input(pos + t - (d_conv as i64 - 1) + k, c);
            }
            out.push(silu(acc));
        }
    }
    let mut after = ring.to_vec();
    for t in 0..tokens {
        let r = (pos as usize + t) % rows;
        after[r * channels..(r + 1) * channels].copy_from_slice(&x[t * channels..(t + 1) * channels]);
    }
    (out, after)
}

/// `gdn_recur` as the spec says it for `case`: returns the outputs and the state after.
fn recur_spec(case: &RecurCase) -> (Vec<f32>, Vec<f32>) {
    let RecurShape { tokens, n_k, n_v, d } = case.shape;
    let slots = SPEC_MAX_TOKENS + 1;
    let at = |slot: usize, h: usize, i: usize, j: usize| ((slot * n_v + h) * d + j) * d + i;
    let mut state = case.state.clone();
    // S[h][i][j], row-major.
    let mut s = vec![0f32; n_v * d * d];
    if case.pos > 0 {
        let prev = (case.pos as usize - 1) % slots;
        for h in 0..n_v {
            for i in 0..d {
                for j in 0..d {
                    s[(h * d + i) * d + j] = state[at(prev, h, i, j)];
                }
            }
        }
    }
    let l2 = |x: &[f32]| -> f32 {
        let n = sqrt_f32(warp_sum(x.iter().map(|v| v * v)));
        1.0 / if n > case.eps { n } else { case.eps }
    };
    let row_len = (2 * n_k + n_v) * d;
    let mut out = vec![0f32; tokens * n_v * d];
    for t in 0..tokens {
        let p = case.pos as usize + t;
        let row = &case.conv[t * row_len..(t + 1) * row_len];
        for h in 0..n_v {
            let kh = h % n_k;
            let (q, k, v) = (&row[kh * d..(kh + 1) * d], &row[(n_k + kh) * d..(n_k + kh + 1) * d], &row[(2 * n_k + h) * d..(2 * n_k + h + 1) * d]);
            let (rq, rk) = (l2(q), l2(k));
            let qh: Vec<f32> = q.iter().map(|x| x * rq).collect();
            let khat: Vec<f32> = k.iter().map(|x| x * rk).collect();
            let b = sigmoid(case.beta[t * n_v + h]);
            let decay = exp_neg(softplus(case.alpha[t * n_v + h] + case.dt_bias[h]) * case.a[h]);
            let sh = &mut s[h * d * d..(h + 1) * d * d];
            for j in 0..d {
                for i in 0..d {
                    sh[i * d + j] *= decay;
                }
                let kv = warp_sum((0..d).map(|i| sh[i * d + j] * khat[i]));
                let delta = (v[j] - kv) * b;
                for i in 0..d {
                    let upd = khat[i] * delta;
                    sh[i * d + j] += upd;
                }
                out[(t * n_v + h) * d + j] = warp_sum((0..d).map(|i| sh[i * d + j] * qh[i])) * case.scale;
            }
            for i in 0..d {
                for j in 0..d {
                    state[at(p % slots, h, i, j)] = sh[i * d + j];
                }
            }
        }
    }
    (out, state)
}

/// `rms_norm_gated` of one row as the spec says it.
fn norm_gated_spec(x: &[f32], w: &[f32], z: &[f32], eps: f32) -> Vec<f32> {
    let mean = warp_sum(x.iter().map(|v| v * v)) / x.len() as f32;
    let scale = 1.0 / sqrt_f32(mean + eps);
    (0..x.len()).map(|j| ((x[j] * scale) * w[j]) * silu(z[j])).collect()
}

#[test]
fn cpu_parity_cases_write_everything_and_meet_the_float64_bar() {
    let seed = common::seed("cpu_parity_cases");
    common::check_all(parity_cases(&[&CpuBackend::new()], seed).unwrap());
}

/// The spec's state layout and ring size are the geometry's (the spec helpers above hard-code
/// them from the module docs).
#[test]
fn geometry_is_the_documented_one() {
    assert_eq!(GDN_STATE_SLOTS, SPEC_MAX_TOKENS + 1);
    for d_conv in 1..=GDN_MAX_CONV {
        assert_eq!(gdn_conv_ring(d_conv), d_conv - 1 + SPEC_MAX_TOKENS);
    }
    let s = RecurShape { tokens: 3, n_k: 2, n_v: 4, d: 32 };
    assert_eq!(s.conv_row(), 8 * 32);
    assert_eq!(s.state_len(), GDN_STATE_SLOTS * 4 * 32 * 32);
}

/// `gdn_conv` on the CPU backend and the replica itself against the spec written out here, bit
/// for bit: outputs and the whole ring (the window's rows replaced, every other row untouched),
/// random earlier positions in the ring, windows at 0, small and large positions.
#[test]
fn conv_replica_follows_its_written_spec() {
    let seed = common::seed("conv_replica_follows_its_written_spec");
    let mut rng = SmallRng::seed_from_u64(seed);
    let cpu = CpuBackend::new();
    for _ in 0..200 {
        let (d_conv, channels, tokens) = (rng.random_range(1..=GDN_MAX_CONV.min(6)), rng.random_range(1..=40), rng.random_range(1..=SPEC_MAX_TOKENS));
        let pos = some_pos(&mut rng);
        let x = uniform(&mut rng, tokens * channels, 4.0);
        let w = uniform(&mut rng, channels * d_conv, 1.0);
        let ring = uniform(&mut rng, gdn_conv_ring(d_conv) * channels, 3.0);
        let (want_out, want_ring) = conv_spec(&x, &w, &ring, pos, channels, d_conv);
        let what = format!("seed {seed}: T{tokens} c{channels} k{d_conv} pos {pos}");
        let (mut r, mut out) = (ring.clone(), vec![POISON; x.len()]);
        cpu.gdn_conv(&x, &w, &mut r, &mut out, pos, channels, d_conv).unwrap();
        same_bits(&out, &want_out, &format!("{what}: cpu output"));
        same_bits(&r, &want_ring, &format!("{what}: cpu ring"));
        let (mut r, mut out) = (ring.clone(), vec![POISON; x.len()]);
        replica::gdn::gdn_conv(&x, &w, &mut r, &mut out, pos, channels, d_conv);
        same_bits(&out, &want_out, &format!("{what}: replica output"));
        same_bits(&r, &want_ring, &format!("{what}: replica ring"));
    }
}

/// A window whose gate is about `exp(-256)` (alpha 38.6, `a` -6.8) with a zero key: the float64
/// state and outputs fall to 1e-93 and below, under f32's smallest value, so f32's zeros are the
/// exact answer and the float64 bar passes. (This case, from a `cpu_parity_cases` run, once
/// counted the zeros as a total error, NMSE 1.)
#[test]
fn recur_below_f32_range_meets_the_float64_bar() {
    let shape = RecurShape { tokens: 1, n_k: 1, n_v: 2, d: 64 };
    let seed = 587319335022956964;
    let case = RecurCase::random(&mut SmallRng::seed_from_u64(seed), shape, 670383);
    assert!(case.alpha.iter().all(|&a| a > 25.0) && case.conv[64..128].iter().all(|&k| k == 0.0), "the case is no longer the underflowing one");
    let o = recur_case(&[&CpuBackend::new()], &case, seed).unwrap();
    assert!(o.passed(), "{}", o.explain());
    let (out, _) = case.run(&CpuBackend::new()).unwrap();
    assert!(out.iter().all(|&v| v == 0.0), "the outputs underflow to zero");
}

/// `gdn_recur` on the CPU backend (split over heads) and the replica itself against the spec
/// written out here, bit for bit: outputs and the whole state.
#[test]
fn recur_replica_follows_its_written_spec() {
    let seed = common::seed("recur_replica_follows_its_written_spec");
    let mut rng = SmallRng::seed_from_u64(seed);
    let cpu = CpuBackend::new();
    for _ in 0..40 {
        let d = [32, 64, 128][rng.random_range(0..3)];
        let n_k = rng.random_range(1..=2);
        let n_v = n_k * [1, 2, 4][rng.random_range(0..3)];
        let shape = RecurShape { tokens: rng.random_range(1..=SPEC_MAX_TOKENS), n_k, n_v, d };
        let pos = some_pos(&mut rng);
        let case = RecurCase::random(&mut rng, shape, pos);
        let (want_out, want_state) = recur_spec(&case);
        let what = format!("seed {seed}: {}", case.describe());
        let (out, state) = case.run(&cpu).unwrap();
        same_bits(&out, &want_out, &format!("{what}: cpu output"));
        same_bits(&state, &want_state, &format!("{what}: cpu state"));
        let (mut state, mut out) = (case.state.clone(), vec![POISON; want_out.len()]);
        replica::gdn::gdn_recur(&case.conv, &case.alpha, &case.beta, &case.dt_bias, &case.a, &mut state, &mut out, case.pos, shape, case.eps, case.scale);
        same_bits(&out, &want_out, &format!("{what}: replica output"));
        same_bits(&state, &want_state, &format!("{what}: replica state"));
    }
}

/// The gates on the CPU backend against their spec written out here, bit for bit.
#[test]
fn gate_replicas_follow_their_written_spec() {
    let seed = common::seed("gate_replicas_follow_their_written_spec");
    let mut rng = SmallRng::seed_from_u64(seed);
    let cpu = CpuBackend::new();
    for _ in 0..100 {
        let (rows, n) = (rng.random_range(1..=12), 32 * rng.random_range(1..=64));
        let scale = 10f32.powf(rng.random_range(-4.0..4.0));
        let x = uniform(&mut rng, rows * n, scale);
        let (w, z) = (uniform(&mut rng, n, 2.0), uniform(&mut rng, rows * n, 30.0));
        let eps = rng.random_range(1e-7f32..1e-4);
        let mut out = vec![POISON; rows * n];
        cpu.rms_norm_gated(&x, &w, &z, n, eps, &mut out).unwrap();
        let want: Vec<f32> = (0..rows).flat_map(|r| norm_gated_spec(&x[r * n..(r + 1) * n], &w, &z[r * n..(r + 1) * n], eps)).collect();
        same_bits(&out, &want, &format!("seed {seed}: rms_norm_gated {rows}x{n}"));

        let len = rng.random_range(1..3000);
        let (a, g) = (uniform(&mut rng, len, 10.0), uniform(&mut rng, len, 40.0));
        let mut out = vec![POISON; len];
        cpu.sigmoid_mul(&a, &g, &mut out).unwrap();
        let want: Vec<f32> = a.iter().zip(&g).map(|(&a, &g)| a * sigmoid(g)).collect();
        same_bits(&out, &want, &format!("seed {seed}: sigmoid_mul {len}"));

        cpu.swiglu(&g, &a, &mut out).unwrap();
        let want: Vec<f32> = g.iter().zip(&a).map(|(&g, &u)| silu(g) * u).collect();
        same_bits(&out, &want, &format!("seed {seed}: swiglu {len}"));

        let (rows, n) = (rng.random_range(1..=8), rng.random_range(1..=600));
        let (acc, y, s) = (uniform(&mut rng, rows * n, 5.0), uniform(&mut rng, rows * n, 5.0), uniform(&mut rng, rows, 30.0));
        let mut out = vec![POISON; rows * n];
        cpu.add_gated(&acc, &y, &s, n, &mut out).unwrap();
        let want: Vec<f32> = (0..rows * n).map(|i| acc[i] + sigmoid(s[i / n]) * y[i]).collect();
        same_bits(&out, &want, &format!("seed {seed}: add_gated {rows}x{n}"));

        // concat_rows, element by element from the index formula; inputs with NaN payloads,
        // signed zeros and subnormals, which a copy keeps.
        let (rows, n_a, n_b) = (rng.random_range(1..=8), rng.random_range(1..=700), rng.random_range(1..=700));
        let bits = |rng: &mut SmallRng, len: usize| -> Vec<f32> {
            (0..len)
                .map(|_| match rng.random_range(0..8) {
                    0 => f32::from_bits(rng.random::<u32>() | 0x7f80_0001), // NaN, any payload and sign
                    1 => f32::from_bits(rng.random::<u32>() & 0x807f_ffff), // subnormal or signed zero
                    _ => rng.random_range(-1e4f32..1e4),
                })
                .collect()
        };
        let (a, b) = (bits(&mut rng, rows * n_a), bits(&mut rng, rows * n_b));
        let n = n_a + n_b;
        let want: Vec<f32> = (0..rows * n).map(|e| if e % n < n_a { a[e / n * n_a + e % n] } else { b[e / n * n_b + e % n - n_a] }).collect();
        let what = format!("seed {seed}: concat_rows {rows}x({n_a}+{n_b})");
        let mut out = vec![POISON; rows * n];
        cpu.concat_rows(&a, &b, n_a, n_b, &mut out).unwrap();
        same_bits(&out, &want, &format!("{what}: cpu"));
        let mut out = vec![POISON; rows * n];
        replica::gate::concat_rows(&a, &b, n_a, n_b, &mut out);
        same_bits(&out, &want, &format!("{what}: replica"));
    }
}

// ---------------------------------------------------------------------------------------------
// Window invariance and the verify-window rollback, on any backend.

/// `gdn_conv` of `x` (whole tokens of `channels`) at `pos` on `b` into a poisoned output.
fn conv_run(b: &dyn GdnOps, x: &[f32], w: &[f32], ring: &mut [f32], pos: u32, channels: usize, d_conv: usize) -> Vec<f32> {
    let mut out = vec![POISON; x.len()];
    b.gdn_conv(x, w, ring, &mut out, pos, channels, d_conv).unwrap();
    out
}

/// `gdn_recur` of tokens `first .. first + tokens` of `case` at `pos` on `b` into a poisoned
/// output.
fn recur_run(b: &dyn GdnOps, case: &RecurCase, first: usize, tokens: usize, state: &mut [f32], pos: u32) -> Vec<f32> {
    let s = RecurShape { tokens, ..case.shape };
    let (row, nv) = (s.conv_row(), s.n_v);
    let mut out = vec![POISON; tokens * nv * s.d];
    let (conv, alpha, beta) = (&case.conv[first * row..(first + tokens) * row], &case.alpha[first * nv..(first + tokens) * nv], &case.beta[first * nv..(first + tokens) * nv]);
    b.gdn_recur(conv, alpha, beta, &case.dt_bias, &case.a, state, &mut out, pos, s, case.eps, case.scale).unwrap();
    out
}

fn random_recur_shape(rng: &mut SmallRng, tokens: usize) -> RecurShape {
    let n_k = rng.random_range(1..=2);
    RecurShape { tokens, n_k, n_v: n_k * [1, 2, 4][rng.random_range(0..3)], d: [32, 64, 128][rng.random_range(0..3)] }
}

/// WINDOW INVARIANCE of `gdn_conv` on `b`: a window of T = 1..=8 tokens gives the outputs and
/// the ring that T windows of one token give, bit for bit.
fn conv_window_invariance(b: &dyn GdnOps, seed: u64) {
    let mut rng = SmallRng::seed_from_u64(seed);
    for tokens in 1..=SPEC_MAX_TOKENS {
        let (d_conv, channels, pos0) = (rng.random_range(1..=5), rng.random_range(1..=300), some_pos(&mut rng));
        let x = uniform(&mut rng, tokens * channels, 4.0);
        let w = uniform(&mut rng, channels * d_conv, 1.0);
        let ring0 = uniform(&mut rng, gdn_conv_ring(d_conv) * channels, 3.0);
        let mut ring = ring0.clone();
        let window = conv_run(b, &x, &w, &mut ring, pos0, channels, d_conv);
        let mut ring1 = ring0.clone();
        let alone: Vec<f32> = (0..tokens).flat_map(|t| conv_run(b, &x[t * channels..(t + 1) * channels], &w, &mut ring1, pos0 + t as u32, channels, d_conv)).collect();
        let what = format!("{} seed {seed}: gdn_conv T{tokens} c{channels} k{d_conv} pos {pos0}", b.name());
        same_bits(&window, &alone, &format!("{what}: outputs, window vs one token at a time"));
        same_bits(&ring, &ring1, &format!("{what}: ring, window vs one token at a time"));
    }
}

/// WINDOW INVARIANCE of `gdn_recur` on `b`: a window of T = 1..=8 tokens gives the outputs and
/// the state (the last position's slot and every other) that T windows of one token give.
fn recur_window_invariance(b: &dyn GdnOps, seed: u64) {
    let mut rng = SmallRng::seed_from_u64(seed);
    for tokens in 1..=SPEC_MAX_TOKENS {
        let shape = random_recur_shape(&mut rng, tokens);
        let pos = some_pos(&mut rng);
        let case = RecurCase::random(&mut rng, shape, pos);
        let what = format!("{} seed {seed}: gdn_recur {}", b.name(), case.describe());
        let (window, state) = case.run(b).unwrap();
        let mut state1 = case.state.clone();
        let alone: Vec<f32> = (0..tokens).flat_map(|t| recur_run(b, &case, t, 1, &mut state1, case.pos + t as u32)).collect();
        same_bits(&window, &alone, &format!("{what}: outputs, window vs one token at a time"));
        let head = shape.n_v * shape.d * shape.d;
        let last = (case.pos as usize + tokens - 1) % GDN_STATE_SLOTS * head;
        same_bits(&state[last..last + head], &state1[last..last + head], &format!("{what}: the last position's slot"));
        same_bits(&state, &state1, &format!("{what}: state, window vs one token at a time"));
    }
}

/// VERIFY-WINDOW ROLLBACK of `gdn_conv` on `b`: a window of 5 at `pos0`, then (2 accepted) a
/// window of T2 at `pos0 + 2` and one of T3 after it, against 2 single tokens from the same
/// starting ring then the same two windows: identical outputs, and identical ring rows for the
/// `d_conv - 1` positions the next window would read.
fn conv_rollback(b: &dyn GdnOps, seed: u64) {
    let mut rng = SmallRng::seed_from_u64(seed);
    for _ in 0..12 {
        let (d_conv, channels, pos0) = (rng.random_range(1..=5), rng.random_range(1..=200), some_pos(&mut rng));
        let (t2, t3) = (rng.random_range(1..=SPEC_MAX_TOKENS), rng.random_range(1..=SPEC_MAX_TOKENS));
        let w = uniform(&mut rng, channels * d_conv, 1.0);
        let ring0 = uniform(&mut rng, gdn_conv_ring(d_conv) * channels, 3.0);
        let (x1, x2, x3) = (uniform(&mut rng, 5 * channels, 4.0), uniform(&mut rng, t2 * channels, 4.0), uniform(&mut rng, t3 * channels, 4.0));
        let (p2, p3) = (pos0 + 2, pos0 + 2 + t2 as u32);
        let mut ra = ring0.clone();
        conv_run(b, &x1, &w, &mut ra, pos0, channels, d_conv);
        let a2 = conv_run(b, &x2, &w, &mut ra, p2, channels, d_conv);
        let a3 = conv_run(b, &x3, &w, &mut ra, p3, channels, d_conv);
        let mut rb = ring0.clone();
        conv_run(b, &x1[..channels], &w, &mut rb, pos0, channels, d_conv);
        conv_run(b, &x1[channels..2 * channels], &w, &mut rb, pos0 + 1, channels, d_conv);
        let b2 = conv_run(b, &x2, &w, &mut rb, p2, channels, d_conv);
        let b3 = conv_run(b, &x3, &w, &mut rb, p3, channels, d_conv);
        let what = format!("{} seed {seed}: gdn_conv c{channels} k{d_conv} pos0 {pos0}, 5 then 2 accepted, then T{t2} and T{t3}", b.name());
        same_bits(&a2, &b2, &format!("{what}: the window after the rollback"));
        same_bits(&a3, &b3, &format!("{what}: the window after that"));
        let (rows, end) = (gdn_conv_ring(d_conv), p3 as usize + t3);
        for p in end.saturating_sub(d_conv - 1)..end {
            let r = p % rows * channels;
            same_bits(&ra[r..r + channels], &rb[r..r + channels], &format!("{what}: ring row of position {p}"));
        }
    }
}

/// VERIFY-WINDOW ROLLBACK of `gdn_recur` on `b`: a window of 5 at `pos0`, then (2 accepted) a
/// window of T2 at `pos0 + 2` and one of T3 after it, against 2 single tokens from the same
/// starting state then the same two windows: identical outputs and identical slots of the
/// windows' last positions.
fn recur_rollback(b: &dyn GdnOps, seed: u64) {
    let mut rng = SmallRng::seed_from_u64(seed);
    for _ in 0..6 {
        let shape = random_recur_shape(&mut rng, 5);
        let pos0 = some_pos(&mut rng);
        let c1 = RecurCase::random(&mut rng, shape, pos0);
        let (t2, t3) = (rng.random_range(1..=SPEC_MAX_TOKENS), rng.random_range(1..=SPEC_MAX_TOKENS));
        let (p2, p3) = (pos0 + 2, pos0 + 2 + t2 as u32);
        // Later windows of the same layer: their own inputs, the layer's dt_bias and a.
        let later = |rng: &mut SmallRng, tokens: usize, pos: u32| RecurCase { dt_bias: c1.dt_bias.clone(), a: c1.a.clone(), ..RecurCase::random(rng, RecurShape { tokens, ..shape }, pos) };
        let (c2, c3) = (later(&mut rng, t2, p2), later(&mut rng, t3, p3));
        let mut sa = c1.state.clone();
        recur_run(b, &c1, 0, 5, &mut sa, pos0);
        let a2 = recur_run(b, &c2, 0, t2, &mut sa, p2);
        let a3 = recur_run(b, &c3, 0, t3, &mut sa, p3);
        let mut sb = c1.state.clone();
        recur_run(b, &c1, 0, 1, &mut sb, pos0);
        recur_run(b, &c1, 1, 1, &mut sb, pos0 + 1);
        let b2 = recur_run(b, &c2, 0, t2, &mut sb, p2);
        let b3 = recur_run(b, &c3, 0, t3, &mut sb, p3);
        let what = format!("{} seed {seed}: gdn_recur {}, 5 then 2 accepted, then T{t2} and T{t3}", b.name(), c1.describe());
        same_bits(&a2, &b2, &format!("{what}: the window after the rollback"));
        same_bits(&a3, &b3, &format!("{what}: the window after that"));
        let head = shape.n_v * shape.d * shape.d;
        for p in [p3 as usize - 1, p3 as usize + t3 - 1] {
            let at = p % GDN_STATE_SLOTS * head;
            same_bits(&sa[at..at + head], &sb[at..at + head], &format!("{what}: the slot of position {p}"));
        }
    }
}

#[test]
fn conv_is_window_invariant() {
    conv_window_invariance(&CpuBackend::new(), common::seed("conv_is_window_invariant"));
}

#[test]
fn recur_is_window_invariant() {
    recur_window_invariance(&CpuBackend::new(), common::seed("recur_is_window_invariant"));
}

#[test]
fn conv_rolls_back_after_a_verify_window() {
    conv_rollback(&CpuBackend::new(), common::seed("conv_rolls_back_after_a_verify_window"));
}

#[test]
fn recur_rolls_back_after_a_verify_window() {
    recur_rollback(&CpuBackend::new(), common::seed("recur_rolls_back_after_a_verify_window"));
}

/// The CPU backend, with one kernel's result spoiled, to show the parity cases fail then.
struct Spoiled {
    cpu: CpuBackend,
    /// Which: 0 flips one output bit of `gdn_conv`, 1 leaves the last written slot of
    /// `gdn_recur` as it was, 2 reads a zero state at every position, 3 leaves the last value
    /// of `concat_rows` unwritten, 4 flips one bit of its last row's first `b` value.
    how: usize,
}

impl GdnOps for Spoiled {
    fn name(&self) -> &'static str {
        "spoiled"
    }

    fn gdn_conv(&self, x: &[f32], w: &[f32], ring: &mut [f32], out: &mut [f32], pos: u32, channels: usize, d_conv: usize) -> strata::host::Result<()> {
        self.cpu.gdn_conv(x, w, ring, out, pos, channels, d_conv)?;
        if self.how == 0 {
            let last = out.len() - 1;
            out[last] = f32::from_bits(out[last].to_bits() ^ 1);
        }
        Ok(())
    }

    fn gdn_recur(
        &self,
        conv: &[f32],
        alpha: &[f32],
        beta: &[f32],
        dt_bias: &[f32],
        a: &[f32],
        state: &mut [f32],
        out: &mut [f32],
        pos: u32,
        shape: RecurShape,
        eps: f32,
        scale: f32,
    ) -> strata::host::Result<()> {
        let before = state.to_vec();
        if self.how == 2 {
            state.fill(0.0);
        }
        self.cpu.gdn_recur(conv, alpha, beta, dt_bias, a, state, out, pos, shape, eps, scale)?;
        let head = shape.n_v * shape.d * shape.d;
        let last = (pos as usize + shape.tokens - 1) % GDN_STATE_SLOTS * head;
        if self.how == 1 {
            state[last..last + head].copy_from_slice(&before[last..last + head]);
        }
        Ok(())
    }

    fn rms_norm_gated(&self, x: &[f32], w: &[f32], z: &[f32], n: usize, eps: f32, out: &mut [f32]) -> strata::host::Result<()> {
        self.cpu.rms_norm_gated(x, w, z, n, eps, out)
    }

    fn sigmoid_mul(&self, a: &[f32], g: &[f32], out: &mut [f32]) -> strata::host::Result<()> {
        self.cpu.sigmoid_mul(a, g, out)
    }

    fn swiglu(&self, g: &[f32], u: &[f32], out: &mut [f32]) -> strata::host::Result<()> {
        self.cpu.swiglu(g, u, out)
    }

    fn add_gated(&self, acc: &[f32], y: &[f32], s: &[f32], n: usize, out: &mut [f32]) -> strata::host::Result<()> {
        self.cpu.add_gated(acc, y, s, n, out)
    }

    fn concat_rows(&self, a: &[f32], b: &[f32], n_a: usize, n_b: usize, out: &mut [f32]) -> strata::host::Result<()> {
        let last = out.last().copied();
        self.cpu.concat_rows(a, b, n_a, n_b, out)?;
        let (rows, len) = (a.len() / n_a, out.len());
        match self.how {
            3 => out[len - 1] = last.unwrap(),
            4 => {
                let at = (rows - 1) * (n_a + n_b) + n_a;
                out[at] = f32::from_bits(out[at].to_bits() ^ 1);
            }
            _ => {}
        }
        Ok(())
    }
}

/// The parity cases can fail: a flipped output bit is a mismatch, a slot left unwritten is
/// counted, a state read from the wrong place is a mismatch (and, as the reference, misses the
/// float64 bar).
#[test]
fn parity_cases_catch_a_spoiled_backend() {
    let seed = common::seed("parity_cases_catch_a_spoiled_backend");
    let mut rng = SmallRng::seed_from_u64(seed);
    let cpu = CpuBackend::new();
    let spoiled = |how| Spoiled { cpu: CpuBackend::new(), how };
    let o = conv_case(&[&cpu, &spoiled(0)], 4, 129, 3, 7, rng.random()).unwrap();
    assert!(o.mismatch.is_some() && o.unwritten.is_empty() && !o.passed(), "{}", o.explain());
    let mut case = RecurCase::random(&mut rng, RecurShape { tokens: 3, n_k: 1, n_v: 2, d: 32 }, 11);
    // Decays near 0.5, so the starting state shows in every output and slot.
    case.alpha.fill(0.0);
    case.a.fill(-0.5);
    let o = recur_case(&[&cpu, &spoiled(1)], &case, seed).unwrap();
    assert!(!o.unwritten.is_empty() && !o.passed(), "{}", o.explain());
    let o = recur_case(&[&cpu, &spoiled(2)], &case, seed).unwrap();
    assert!(o.mismatch.is_some() && !o.passed(), "{}", o.explain());
    let o = recur_case(&[&spoiled(2)], &case, seed).unwrap();
    assert!(o.nmse.is_some_and(|e| e > 1e-3), "a zero starting state passed the float64 bar: {}", o.explain());
    for (rows, n_a, n_b) in [(1, 1, 1), (3, 2048, 2048), (5, 257, 3)] {
        let o = concat_case(&[&cpu, &spoiled(3)], rows, n_a, n_b, rng.random()).unwrap();
        assert!(o.mismatch.is_some() && !o.unwritten.is_empty() && !o.passed(), "{}", o.explain());
        let o = concat_case(&[&spoiled(3)], rows, n_a, n_b, rng.random()).unwrap();
        assert!(!o.unwritten.is_empty() && !o.passed(), "an unwritten value passed as the reference: {}", o.explain());
        let o = concat_case(&[&cpu, &spoiled(4)], rows, n_a, n_b, rng.random()).unwrap();
        assert!(o.mismatch.is_some() && o.unwritten.is_empty() && !o.passed(), "{}", o.explain());
    }
}

#[test]
fn shape_errors_are_errors() {
    #[track_caller]
    fn shape_err(r: strata::host::Result<()>, what: &str) {
        assert!(matches!(r, Err(Error::Shape { .. })), "{what}: {r:?}");
    }
    let cpu = CpuBackend::new();
    let (c, k) = (64, 4);
    let rows = gdn_conv_ring(k);
    let x = vec![0.5f32; 9 * c];
    let w = vec![0.5f32; c * GDN_MAX_CONV];
    let mut ring = vec![0f32; gdn_conv_ring(GDN_MAX_CONV) * c];
    let mut out = vec![0f32; 9 * c];
    assert!(cpu.gdn_conv(&x[..2 * c], &w[..c * k], &mut ring[..rows * c], &mut out[..2 * c], 5, c, k).is_ok());
    shape_err(cpu.gdn_conv(&[], &w[..c * k], &mut ring[..rows * c], &mut [], 5, c, k), "a window of 0 tokens");
    shape_err(cpu.gdn_conv(&x, &w[..c * k], &mut ring[..rows * c], &mut out, 5, c, k), "a window of 9 tokens");
    shape_err(cpu.gdn_conv(&x[..2 * c], &w[..c * k], &mut ring[..rows * c], &mut out[..2 * c], 5, 0, k), "0 channels");
    shape_err(cpu.gdn_conv(&x[..2 * c - 1], &w[..c * k], &mut ring[..rows * c], &mut out[..2 * c - 1], 5, c, k), "not whole rows");
    shape_err(cpu.gdn_conv(&x[..2 * c], &[], &mut ring[..gdn_conv_ring(1) * c], &mut out[..2 * c], 5, c, 0), "0 taps");
    let big = GDN_MAX_CONV + 1;
    let mut big_ring = vec![0f32; gdn_conv_ring(big) * c];
    shape_err(cpu.gdn_conv(&x[..2 * c], &vec![0.5; c * big], &mut big_ring, &mut out[..2 * c], 5, c, big), "taps past GDN_MAX_CONV");
    shape_err(cpu.gdn_conv(&x[..2 * c], &w[..c * k - 1], &mut ring[..rows * c], &mut out[..2 * c], 5, c, k), "taps one short");
    shape_err(cpu.gdn_conv(&x[..2 * c], &w[..c * k], &mut ring[..rows * c - 1], &mut out[..2 * c], 5, c, k), "ring one short");
    shape_err(cpu.gdn_conv(&x[..2 * c], &w[..c * k], &mut ring[..rows * c + c], &mut out[..2 * c], 5, c, k), "ring a row long");
    shape_err(cpu.gdn_conv(&x[..2 * c], &w[..c * k], &mut ring[..rows * c], &mut out[..2 * c + 1], 5, c, k), "output one long");
    shape_err(cpu.gdn_conv(&x[..2 * c], &w[..c * k], &mut ring[..rows * c], &mut out[..2 * c], u32::MAX, c, k), "a window past u32::MAX");
    assert!(cpu.gdn_conv(&x[..c], &w[..c * k], &mut ring[..rows * c], &mut out[..c], u32::MAX, c, k).is_ok());

    let good = RecurShape { tokens: 2, n_k: 2, n_v: 4, d: 32 };
    let case = RecurCase::random(&mut SmallRng::seed_from_u64(1), good, 3);
    let run = |s: RecurShape, trim: usize| -> strata::host::Result<()> {
        // `trim`: which buffer is one short (0 none; 1 conv .. 7 out).
        let len = |i: usize, n: usize| if trim == i { n - 1 } else { n };
        let (conv, alpha, beta) = (vec![0.5f32; len(1, s.tokens * s.conv_row())], vec![0.5f32; len(2, s.tokens * s.n_v)], vec![0.5f32; len(3, s.tokens * s.n_v)]);
        let (dt, a) = (vec![0.5f32; len(4, s.n_v)], vec![-0.5f32; len(5, s.n_v)]);
        let (mut state, mut out) = (vec![0f32; len(6, s.state_len())], vec![0f32; len(7, s.tokens * s.n_v * s.d)]);
        cpu.gdn_recur(&conv, &alpha, &beta, &dt, &a, &mut state, &mut out, 3, s, 1e-6, 0.17)
    };
    assert!(case.run(&cpu).is_ok());
    assert!(run(good, 0).is_ok());
    for trim in 1..=7 {
        shape_err(run(good, trim), &format!("buffer {trim} one short"));
    }
    shape_err(run(RecurShape { tokens: 0, ..good }, 0), "a window of 0 tokens");
    shape_err(run(RecurShape { tokens: SPEC_MAX_TOKENS + 1, ..good }, 0), "a window past SPEC_MAX_TOKENS");
    shape_err(run(RecurShape { d: 48, ..good }, 0), "d not a multiple of 32");
    shape_err(run(RecurShape { d: GDN_MAX_D + 32, ..good }, 0), "d past GDN_MAX_D");
    shape_err(run(RecurShape { n_k: 0, ..good }, 0), "no key heads");
    shape_err(run(RecurShape { n_v: 3, ..good }, 0), "value heads not whole groups");
    assert!(run(RecurShape { d: GDN_MAX_D, n_k: 1, n_v: 1, tokens: 1 }, 0).is_ok());
    let (mut st, mut o) = (vec![0f32; 4], vec![0f32; 4]);
    let huge = RecurShape { tokens: 1, n_k: 1, n_v: usize::MAX / 4, d: 64 };
    shape_err(cpu.gdn_recur(&[], &[], &[], &[], &[], &mut st, &mut o, 0, huge, 1e-6, 0.1), "a shape whose sizes overflow");
    let mut state = case.state.clone();
    let mut out = vec![0f32; good.tokens * good.n_v * good.d];
    let r = cpu.gdn_recur(&case.conv, &case.alpha, &case.beta, &case.dt_bias, &case.a, &mut state, &mut out, u32::MAX, good, 1e-6, 0.1);
    shape_err(r, "a window past u32::MAX");

    let x = vec![1f32; 4 * 64];
    let w = vec![1f32; 64];
    let mut y = vec![0f32; 4 * 64];
    assert!(cpu.rms_norm_gated(&x, &w, &x, 64, 1e-6, &mut y).is_ok());
    shape_err(cpu.rms_norm_gated(&x[..96], &w[..48], &x[..96], 48, 1e-6, &mut y[..96]), "row not whole warps");
    shape_err(cpu.rms_norm_gated(&x[..224], &w, &x[..224], 64, 1e-6, &mut y[..224]), "not whole rows");
    shape_err(cpu.rms_norm_gated(&x, &w, &x, 0, 1e-6, &mut y), "empty rows");
    shape_err(cpu.rms_norm_gated(&x, &w[..32], &x, 64, 1e-6, &mut y), "weights of another length");
    shape_err(cpu.rms_norm_gated(&x, &w, &x[1..], 64, 1e-6, &mut y), "gate one short");
    shape_err(cpu.rms_norm_gated(&x, &w, &x, 64, 1e-6, &mut y[1..]), "output one short");
    let big = vec![1f32; NORM_MAX_N + 32];
    let mut big_out = big.clone();
    shape_err(cpu.rms_norm_gated(&big, &big, &big, NORM_MAX_N + 32, 1e-6, &mut big_out), "row past NORM_MAX_N");

    shape_err(cpu.sigmoid_mul(&x, &x[1..], &mut y), "gate one short");
    shape_err(cpu.sigmoid_mul(&x[1..], &x[1..], &mut y), "output one long");
    shape_err(cpu.swiglu(&x, &x[1..], &mut y), "up one short");
    shape_err(cpu.swiglu(&x, &x, &mut y[1..]), "output one short");
    assert!(cpu.sigmoid_mul(&[], &[], &mut []).is_ok() && cpu.swiglu(&[], &[], &mut []).is_ok());

    assert!(cpu.add_gated(&x, &x, &[0.0; 4], 64, &mut y).is_ok());
    shape_err(cpu.add_gated(&x, &x, &[0.0; 4], 0, &mut y), "rows of 0");
    shape_err(cpu.add_gated(&x[..200], &x[..200], &[0.0; 4], 64, &mut y[..200]), "not whole rows");
    shape_err(cpu.add_gated(&x, &x[1..], &[0.0; 4], 64, &mut y), "y one short");
    shape_err(cpu.add_gated(&x, &x, &[0.0; 3], 64, &mut y), "a logit short");
    shape_err(cpu.add_gated(&x, &x, &[0.0; 4], 64, &mut y[1..]), "output one short");

    // concat_rows: 4 rows of 40 + 24 into `y` (4 x 64).
    assert!(cpu.concat_rows(&x[..160], &x[..96], 40, 24, &mut y).is_ok());
    assert!(cpu.concat_rows(&[], &[], 40, 24, &mut []).is_ok());
    assert!(cpu.concat_rows(&x[..4], &x[..4], 1, 1, &mut y[..8]).is_ok());
    shape_err(cpu.concat_rows(&x[..160], &[], 40, 0, &mut y[..160]), "rows of b of 0");
    shape_err(cpu.concat_rows(&[], &x[..96], 0, 24, &mut y[..96]), "rows of a of 0");
    shape_err(cpu.concat_rows(&x[..159], &x[..96], 40, 24, &mut y), "a not whole rows");
    shape_err(cpu.concat_rows(&x[..160], &x[..95], 40, 24, &mut y), "b one short");
    shape_err(cpu.concat_rows(&x[..160], &x[..120], 40, 24, &mut y), "b a row long");
    shape_err(cpu.concat_rows(&x[..160], &x[..96], 40, 24, &mut y[1..]), "output one short");
    shape_err(cpu.concat_rows(&x[..120], &x[..72], 40, 24, &mut y), "output a row long");
    shape_err(cpu.concat_rows(&x[..4], &x[..4], 1, usize::MAX, &mut y[..8]), "a row length that overflows");
    shape_err(cpu.concat_rows(&x[..4], &x[..4], 1, u32::MAX as usize, &mut y[..8]), "past one launch");
}

/// The parity suite on `name` against the replica, on plain and on padded grids (every kernel
/// must return at once in blocks past its work), window invariance and the rollback on the GPU
/// itself, plus the GPU's shape errors.
fn gpu_matches_cpu(name: &str) {
    let Some(mut gpu) = common::open_gpu(name) else { return };
    let cpu = CpuBackend::new();
    let seed = common::seed(&format!("{name}_matches_cpu"));
    for pad in [false, true] {
        gpu.set_grid_pad(pad);
        eprintln!(" grid padding {pad}");
        common::check_all(parity_cases(&[&cpu, &gpu], seed).unwrap());
    }
    gpu.set_grid_pad(false);
    conv_window_invariance(&gpu, seed);
    recur_window_invariance(&gpu, seed);
    conv_rollback(&gpu, seed);
    recur_rollback(&gpu, seed);
    let mut out = vec![0f32; 64];
    let r = gpu.rms_norm_gated(&[1f32; 64], &[1f32; 32], &[1f32; 64], 64, 1e-6, &mut out);
    assert!(matches!(r, Err(Error::Shape { .. })), "{r:?}");
    let s = RecurShape { tokens: 1, n_k: 2, n_v: 3, d: 32 };
    let (mut st, mut o) = (vec![0f32; 8], vec![0f32; 8]);
    let r = gpu.gdn_recur(&[], &[], &[], &[], &[], &mut st, &mut o, 0, s, 1e-6, 0.1);
    assert!(matches!(r, Err(Error::Shape { .. })), "{r:?}");
    let r = gpu.concat_rows(&[1f32; 6], &[1f32; 3], 2, 1, &mut o[..8]);
    assert!(matches!(r, Err(Error::Shape { .. })), "{r:?}");
}

#[test]
fn cuda_matches_cpu() {
    gpu_matches_cpu("cuda");
}

#[test]
fn hip_matches_cpu() {
    gpu_matches_cpu("hip");
}

/// The parity suite on the kernels' own code in the simulator, against the replica bit for bit.
#[test]
fn sim_matches_cpu() {
    let seed = common::seed("sim_matches_cpu");
    common::check_all(parity_cases(&[&CpuBackend::new(), &strata::host::backends::sim::SimBackend::new(132)], seed).unwrap());
}
