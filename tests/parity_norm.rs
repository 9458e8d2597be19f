//! The norm family (`embed_rows_<tag>`, `rms_norm`, `rms_norm_q8_1`, `add_f32`): the CPU replica
//! against float64, its written spec and the dequantization `strata dump` writes (which
//! tests/gguf_files.rs checks against the `gguf` package), NaN rows for ids past the table,
//! `rms_norm_q8_1` as the two launches it replaces, shape errors; then `cuda` and `hip` against
//! the replica bit for bit, with and without padded grids (skipped without a GPU unless
//! `STRATA_REQUIRE_GPU=1`).
mod common;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use strata::host::backends::cpu::CpuBackend;
use strata::host::gguf::GgmlType;
use strata::host::ops::norm::{embed_table, parity_cases, random_table, NormOps};
use strata::host::reference::{dequant_row_f32, nmse, rms_norm_f64};
use strata::host::{Backend, Error};
use strata_gpu_shared::f16::f16_to_f32;
use strata_gpu_shared::formats::{q8_1, WeightFormat};
use strata_gpu_shared::launch::norm::{EMBED_NAN, NORM_MAX_N, NQ_MAX_N};
use strata_gpu_shared::replica::norm::rms_norm_row;
use strata_gpu_shared::replica::row_group;


#[test]
fn cpu_parity_cases_write_everything_and_meet_the_float64_bar() {
    let seed = common::seed("cpu_parity_cases");
    common::check_all(parity_cases(&[&CpuBackend::new()], seed).unwrap());
}

/// Rows at scales 1e-3..1e3 (and zero rows) against float64, element by element. The bound:
/// with `m = n / 32` terms per lane, the sum of squares (all terms positive) is within
/// `(m + 5) u` relative (u = 2^-24: `m` roundings of products and adds per lane, 5 in the
/// butterfly), `mean + eps` within `(m + 7) u`; the square root halves that and adds `u`, the
/// reciprocal, `x * scale` and `* w` add `u` each: `((m + 7) / 2 + 4) u = (m / 2 + 7.5) u` to first
/// order. Checked at `(m / 2 + 8) u`; NMSE at 1e-10.
#[test]
fn rms_norm_replica_is_within_its_float64_bound() {
    let seed = common::seed("rms_norm_replica_is_within_its_float64_bound");
    let mut rng = SmallRng::seed_from_u64(seed);
    let cpu = CpuBackend::new();
    let (mut worst, u) = (0.0f64, 2f64.powi(-24));
    for n in [32, 128, 2048, 4096, NORM_MAX_N] {
        for _ in 0..4 {
            let rows = rng.random_range(1..=8);
            let mut x = Vec::with_capacity(rows * n);
            for r in 0..rows {
                let scale = if r == 1 { 0.0 } else { 10f32.powf(rng.random_range(-3.0..3.0)) };
                x.extend((0..n).map(|_| rng.random_range(-1.0f32..1.0) * scale));
            }
            let w: Vec<f32> = (0..n).map(|_| rng.random_range(-2.0f32..2.0)).collect();
            let eps = [1e-6f32, 1e-5][rng.random_range(0..2)];
            let mut out = vec![f32::NAN; rows * n];
            cpu.rms_norm(&x, &w, n, eps, &mut out).unwrap();
            let want = rms_norm_f64(&x, &w, n, eps);
            let bound = (n as f64 / 32.0 / 2.0 + 8.0) * u;
            for (i, (&got, &want)) in out.iter().zip(&want).enumerate() {
                let rel = if want == 0.0 { (got as f64).abs() } else { (got as f64 - want).abs() / want.abs() };
                worst = worst.max(rel / bound);
                assert!(rel <= bound, "seed {seed}: {rows}x{n} row {} value {}: {got:e} vs {want:e}, relative error {rel:.2e} > {bound:.2e}", i / n, i % n);
            }
            let e = nmse(&out, &want);
            assert!(e < 1e-10, "seed {seed}: {rows}x{n}: NMSE {e:e}");
        }
    }
    eprintln!("  worst error: {worst:.3} of the bound");
}

/// The replica is the spec written in its module doc: checked against that spec spelled out
/// again here with other means (an explicit strided loop per lane, the butterfly as recursive
/// halving, sqrt through float64, which rounds correctly for f32 inputs).
#[test]
fn rms_norm_replica_follows_its_written_spec() {
    fn halving(v: &[f32]) -> f32 {
        if v.len() == 1 {
            return v[0];
        }
        let h = v.len() / 2;
        halving(&(0..h).map(|i| v[i] + v[i + h]).collect::<Vec<_>>())
    }
    let seed = common::seed("rms_norm_replica_follows_its_written_spec");
    let mut rng = SmallRng::seed_from_u64(seed);
    for _ in 0..300 {
        let n = 32 * rng.random_range(1..=NORM_MAX_N / 32);
        let scale = 10f32.powf(rng.random_range(-4.0..4.0));
        let x: Vec<f32> = (0..n).map(|_| rng.random_range(-1.0f32..1.0) * scale).collect();
        let w: Vec<f32> = (0..n).map(|_| rng.random_range(-2.0f32..2.0)).collect();
        let eps = rng.random_range(1e-7f32..1e-4);
        let partials: Vec<f32> = (0..32)
            .map(|p| {
                let mut s = 0.0f32;
                let mut j = p;
                while j < n {
                    s += x[j] * x[j];
                    j += 32;
                }
                s
            })
            .collect();
        let mean = halving(&partials) / n as f32;
        let scale = 1.0 / ((mean + eps) as f64).sqrt() as f32;
        let mut got = vec![0f32; n];
        rms_norm_row(&x, &w, eps, &mut got);
        for j in 0..n {
            let want = (x[j] * scale) * w[j];
            assert_eq!(got[j].to_bits(), want.to_bits(), "seed {seed}: n {n} value {j}: {} vs {want}", got[j]);
        }
    }
}

/// `rms_norm_q8_1` is `rms_norm` then `quantize_q8_1` of its output: the CPU backend's fused
/// call over 1..=8 rows (each at its own scale, 1e-4 to 1e4, some all zero) equals its two
/// calls one after the other, both outputs bit for bit, at `NQ_MAX_N` and random multiples of
/// 32 below it.
#[test]
fn rms_norm_q8_1_is_rms_norm_then_quantize() {
    let seed = common::seed("rms_norm_q8_1_is_rms_norm_then_quantize");
    let mut rng = SmallRng::seed_from_u64(seed);
    let cpu = CpuBackend::new();
    for case in 0..100 {
        let n = if case % 4 == 0 { NQ_MAX_N } else { 32 * rng.random_range(1..=NQ_MAX_N / 32) };
        let rows = rng.random_range(1..=8);
        let x: Vec<f32> = (0..rows)
            .flat_map(|_| {
                let scale = if rng.random_bool(0.2) { 0.0 } else { 10f32.powf(rng.random_range(-4.0..4.0)) };
                (0..n).map(|_| rng.random_range(-1.0f32..1.0) * scale).collect::<Vec<_>>()
            })
            .collect();
        let w: Vec<f32> = (0..n).map(|_| rng.random_range(-2.0f32..2.0)).collect();
        let eps = rng.random_range(1e-7f32..1e-4);
        let qlen = q8_1::bytes_of(rows * n);
        let (mut got, mut got_q) = (vec![f32::NAN; rows * n], vec![0xa5u8; qlen]);
        cpu.rms_norm_q8_1(&x, &w, n, eps, &mut got, &mut got_q).unwrap();
        let (mut want, mut want_q) = (vec![0f32; rows * n], vec![0x5au8; qlen]);
        cpu.rms_norm(&x, &w, n, eps, &mut want).unwrap();
        cpu.quantize_q8_1(&want, &mut want_q).unwrap();
        let at = format!("seed {seed}: case {case}, {rows}x{n}");
        assert!(got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()), "{at}: the normed rows");
        assert_eq!(got_q, want_q, "{at}: the q8_1 blocks");
    }
}

/// `strata dump`'s decoding of one row (src/commands/dump.rs `decode_row`): `dequant_row_f32`
/// for the quantized formats; the float types widened here independently (the `half` crate).
fn dump_row(ty: GgmlType, row: &[u8], n: usize) -> Vec<f32> {
    let half = |b: &[u8]| u16::from_le_bytes([b[0], b[1]]);
    match ty {
        GgmlType::Quant(f) => {
            let mut out = Vec::with_capacity(n);
            dequant_row_f32(f, row, n, &mut out);
            out
        }
        GgmlType::F32 => row.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect(),
        GgmlType::F16 => row.chunks_exact(2).map(|b| half::f16::from_bits(half(b)).to_f32()).collect(),
        GgmlType::Bf16 => row.chunks_exact(2).map(|b| half::bf16::from_bits(half(b)).to_f32()).collect(),
    }
}

/// Value `j` of a quantized row computed exactly in float64 (`d * f * v * 2^-shift` has at most
/// 23 significant bits, far inside float64's 53).
fn exact_value(f: WeightFormat, row: &[u8], j: usize) -> f64 {
    let g = row_group(f, row, j / 32);
    f16_to_f32(g.d) as f64 * g.f[j % 32 / 16] as f64 * g.v[j % 32] as f64 * 2f64.powi(-(f.shift() as i32))
}

/// Every table type: each gathered row equals the dump's decoding of that row. For the
/// quantized formats both the dump (`((d * f) * v) * 2^-k`, three f32 products) and the kernel
/// (`d * (f * v * 2^-k)`, one) round nothing: both equal the exact float64 value, checked here.
/// They may differ only in the sign of a zero: the kernel's zero has the sign of `d`, the dump's
/// the sign of `d * f * v` with a signed `v = 0` read as +0. Nonzero values are identical bits.
#[test]
fn embed_rows_equal_the_dump_dequantization() {
    let seed = common::seed("embed_rows_equal_the_dump_dequantization");
    let mut rng = SmallRng::seed_from_u64(seed);
    let cpu = CpuBackend::new();
    let (n_rows, n) = (12, 4096);
    for ty in GgmlType::ALL {
        let table = random_table(&mut rng, ty, n_rows, n);
        let mut ids: Vec<u32> = (0..n_rows as u32).collect();
        ids.swap(0, rng.random_range(0..n_rows));
        let mut out = vec![f32::NAN; n_rows * n];
        cpu.embed_rows(&table, ty, n_rows, n, &ids, &mut out).unwrap();
        let row_bytes = embed_table(ty).row_bytes(n);
        let mut signed_zeros = 0;
        for (t, &id) in ids.iter().enumerate() {
            let row = &table[id as usize * row_bytes..(id as usize + 1) * row_bytes];
            let want = dump_row(ty, row, n);
            for j in 0..n {
                let (got, want) = (out[t * n + j], want[j]);
                let at = format!("seed {seed}: {} row {id} value {j}", ty.name());
                if let GgmlType::Quant(f) = ty {
                    let exact = exact_value(f, row, j);
                    assert_eq!(want as f64, exact, "{at}: the dump rounded");
                    assert_eq!(got as f64, exact, "{at}: the kernel rounded");
                }
                if matches!(ty, GgmlType::Quant(_)) && got == 0.0 && want == 0.0 {
                    signed_zeros += (got.to_bits() != want.to_bits()) as usize;
                } else {
                    assert_eq!(got.to_bits(), want.to_bits(), "{at}: {got:e} vs {want:e}");
                }
            }
        }
        eprintln!("  {}: {} values equal, {signed_zeros} zeros of the other sign", ty.name(), n_rows * n);
    }
}

/// An id at or past the table's row count gives a row of quiet NaN (0x7fc00000); the rows around
/// it are the table's.
#[test]
fn out_of_range_ids_give_nan_rows() {
    let seed = common::seed("out_of_range_ids_give_nan_rows");
    let mut rng = SmallRng::seed_from_u64(seed);
    let cpu = CpuBackend::new();
    let (n_rows, n) = (5, 512);
    for ty in GgmlType::ALL {
        let table = random_table(&mut rng, ty, n_rows, n);
        let ids = [4, 5, u32::MAX, 0, 6];
        let mut out = vec![0f32; ids.len() * n];
        cpu.embed_rows(&table, ty, n_rows, n, &ids, &mut out).unwrap();
        let row_bytes = embed_table(ty).row_bytes(n);
        for (t, &id) in ids.iter().enumerate() {
            let got = &out[t * n..(t + 1) * n];
            if id as usize >= n_rows {
                assert!(got.iter().all(|v| v.to_bits() == EMBED_NAN), "{} id {id}: not a NaN row", ty.name());
            } else {
                let want = dump_row(ty, &table[id as usize * row_bytes..(id as usize + 1) * row_bytes], n);
                assert!(got.iter().zip(&want).all(|(a, b)| a == b), "{} id {id}: not the table's row", ty.name());
            }
        }
    }
}

#[test]
fn shape_errors_are_errors() {
    fn shape_err(r: strata::host::Result<()>, what: &str) {
        assert!(matches!(r, Err(Error::Shape { .. })), "{what}: {r:?}");
    }
    let cpu = CpuBackend::new();
    let q6 = GgmlType::Quant(WeightFormat::Q6K);
    let table = vec![0u8; 2 * 210];
    let mut out = vec![0f32; 256];
    shape_err(cpu.embed_rows(&table, q6, 2, 256, &[0], &mut out[..255]), "output one short");
    shape_err(cpu.embed_rows(&table[1..], q6, 2, 256, &[0], &mut out), "table one byte short");
    shape_err(cpu.embed_rows(&table, q6, 3, 256, &[0], &mut out), "table of fewer rows than said");
    shape_err(cpu.embed_rows(&table, q6, 2, 0, &[], &mut []), "empty rows");
    shape_err(cpu.embed_rows(&[], q6, 0, 256, &[0], &mut out), "a table of no rows");
    shape_err(cpu.embed_rows(&table[..2 * 210 / 8], q6, 2, 32, &[0], &mut out[..32]), "row not whole Q6_K blocks");
    shape_err(cpu.embed_rows(&[0; 12], GgmlType::F32, 1, 3, &[0, 1], &mut out[..3]), "output of one token for two");
    assert!(cpu.embed_rows(&[0; 12], GgmlType::F32, 1, 3, &[0, 1], &mut out[..6]).is_ok());

    let x = vec![1f32; 4 * 64];
    let w = vec![1f32; 64];
    let mut y = vec![0f32; 4 * 64];
    shape_err(cpu.rms_norm(&x[..96], &w[..48], 48, 1e-6, &mut y[..96]), "row not whole warps");
    shape_err(cpu.rms_norm(&x[..64 * 3 + 32], &w, 64, 1e-6, &mut y[..64 * 3 + 32]), "not whole rows");
    shape_err(cpu.rms_norm(&x, &w, 0, 1e-6, &mut y), "empty rows");
    shape_err(cpu.rms_norm(&x, &w[..32], 64, 1e-6, &mut y), "weights of another length");
    shape_err(cpu.rms_norm(&x, &w, 64, 1e-6, &mut y[1..]), "output one short");
    let big = vec![1f32; NORM_MAX_N + 32];
    let mut big_out = big.clone();
    shape_err(cpu.rms_norm(&big, &big, NORM_MAX_N + 32, 1e-6, &mut big_out), "row past NORM_MAX_N");
    assert!(cpu.rms_norm(&big[..NORM_MAX_N], &big[..NORM_MAX_N], NORM_MAX_N, 1e-6, &mut big_out[..NORM_MAX_N]).is_ok());

    shape_err(cpu.add(&x, &x[1..], &mut y), "b one short");
    shape_err(cpu.add(&x[1..], &x[1..], &mut y), "output one long");

    // rms_norm_q8_1: 4 rows of 64 (2 q8_1 blocks a row).
    let qb = q8_1::BYTES;
    let mut q = vec![0u8; 4 * 2 * qb];
    assert!(cpu.rms_norm_q8_1(&x, &w, 64, 1e-6, &mut y, &mut q).is_ok());
    assert!(cpu.rms_norm_q8_1(&[], &w, 64, 1e-6, &mut [], &mut []).is_ok(), "no rows");
    shape_err(cpu.rms_norm_q8_1(&x[..96], &w[..48], 48, 1e-6, &mut y[..96], &mut q[..3 * qb]), "row not whole warps");
    shape_err(cpu.rms_norm_q8_1(&x[..64 * 3 + 32], &w, 64, 1e-6, &mut y[..64 * 3 + 32], &mut q[..7 * qb]), "not whole rows");
    shape_err(cpu.rms_norm_q8_1(&x, &w, 0, 1e-6, &mut y, &mut q), "empty rows");
    shape_err(cpu.rms_norm_q8_1(&x, &w[..32], 64, 1e-6, &mut y, &mut q), "weights of another length");
    shape_err(cpu.rms_norm_q8_1(&x, &w, 64, 1e-6, &mut y[1..], &mut q), "output one short");
    shape_err(cpu.rms_norm_q8_1(&x, &w, 64, 1e-6, &mut y, &mut q[1..]), "q8_1 output one byte short");
    shape_err(cpu.rms_norm_q8_1(&x, &w, 64, 1e-6, &mut y, &mut [q.clone(), vec![0]].concat()), "q8_1 output one byte long");
    let n = NQ_MAX_N + 32;
    let mut big_q = vec![0u8; n / 32 * qb];
    shape_err(cpu.rms_norm_q8_1(&big[..n], &big[..n], n, 1e-6, &mut big_out[..n], &mut big_q), "row past NQ_MAX_N");
    assert!(cpu.rms_norm(&big[..n], &big[..n], n, 1e-6, &mut big_out[..n]).is_ok(), "rms_norm takes it");
    let n = NQ_MAX_N;
    assert!(cpu.rms_norm_q8_1(&big[..n], &big[..n], n, 1e-6, &mut big_out[..n], &mut big_q[..n / 32 * qb]).is_ok());
}


/// The parity suite on `name` against the replica, on plain and on padded grids (every kernel
/// must return at once in blocks past its work), plus the GPU's shape errors.
fn gpu_matches_cpu(name: &str) {
    let Some(mut gpu) = common::open_gpu(name) else { return };
    let cpu = CpuBackend::new();
    let seed = common::seed(&format!("{name}_matches_cpu"));
    for pad in [false, true] {
        gpu.set_grid_pad(pad);
        eprintln!(" grid padding {pad}");
        common::check_all(parity_cases(&[&cpu, &gpu], seed).unwrap());
    }
    let mut out = vec![0f32; 64];
    let r = gpu.rms_norm(&[1f32; 64], &[1f32; 32], 64, 1e-6, &mut out);
    assert!(matches!(r, Err(Error::Shape { .. })), "{r:?}");
    // The launcher itself refuses a row its block's shared memory cannot stage.
    let n = NQ_MAX_N + 32;
    let x = gpu.upload("test", &vec![1f32; n]).unwrap();
    let (mut dout, mut dq) = (gpu.upload("test", &vec![0f32; n]).unwrap(), gpu.upload("test", &vec![0u8; q8_1::bytes_of(n)]).unwrap());
    let r = gpu.rms_norm_q8_1_queue(&x, &x, &mut dout, &mut dq, 1, n, 1e-6);
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
