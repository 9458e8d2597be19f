//! Float64 references: the math a kernel approximates, on the dequantized weights and the
//! unquantized activations, and the normalized mean squared error against it.
use strata_gpu_shared::f16::f16_to_f32;
use strata_gpu_shared::formats::{WeightFormat, GROUP};
use strata_gpu_shared::replica::row_group;

use crate::backends::Weights;

/// Dequantizes one row of `k` values of `format` to f32, as `((d * f) * v) * 2^-k`. Each value
/// is an exact product (at most 24 significant bits), and that order also gives zeros the sign
/// ggml and the `gguf` package give them, so the result equals theirs bit for bit.
pub fn dequant_row_f32(format: WeightFormat, row: &[u8], k: usize, out: &mut Vec<f32>) {
    let scale = f32::from_bits((127 - format.shift()) << 23);
    for b in 0..k / GROUP {
        let g = row_group(format, row, b);
        let d = f16_to_f32(g.d);
        out.extend((0..GROUP).map(|j| d * g.f[j / 16] as f32 * g.v[j] as f32 * scale));
    }
}

/// Dequantizes row `i` of `w` to f64.
pub fn dequant_row(w: &Weights, i: usize) -> Vec<f64> {
    let row_bytes = w.format.row_bytes(w.k);
    let mut out = Vec::with_capacity(w.k);
    dequant_row_f32(w.format, &w.data[i * row_bytes..(i + 1) * row_bytes], w.k, &mut out);
    out.into_iter().map(f64::from).collect()
}

/// `y[r * m + i] = sum_j w[i][j] * x[r][j]` in float64, `x` the f32 activations before
/// quantization.
pub fn matvec_f64(w: &Weights, x: &[f32], rows: usize) -> Vec<f64> {
    let mut y = vec![0.0; rows * w.m];
    for i in 0..w.m {
        let wr = dequant_row(w, i);
        for r in 0..rows {
            let xr = &x[r * w.k..(r + 1) * w.k];
            y[r * w.m + i] = wr.iter().zip(xr).map(|(a, &b)| a * b as f64).sum();
        }
    }
    y
}

/// `y[r * m + i] = sum_j w[i][j] * x[r][j]` in float64 for float weights.
pub fn float_matvec_f64(w: &crate::backends::FloatWeights, x: &[f32], rows: usize) -> Vec<f64> {
    let rb = w.k * w.format.bytes();
    let mut y = vec![0.0; rows * w.m];
    for i in 0..w.m {
        let row = &w.data[i * rb..(i + 1) * rb];
        for r in 0..rows {
            y[r * w.m + i] = (0..w.k).map(|j| w.format.get(row, j) as f64 * x[r * w.k + j] as f64).sum();
        }
    }
    y
}

/// RMSNorm in float64 over rows of `n`: `x[j] / sqrt(mean(x^2) + eps) * w[j]`.
pub fn rms_norm_f64(x: &[f32], w: &[f32], n: usize, eps: f32) -> Vec<f64> {
    x.chunks_exact(n)
        .flat_map(|row| {
            let mean = row.iter().map(|&v| v as f64 * v as f64).sum::<f64>() / n as f64;
            let scale = 1.0 / (mean + eps as f64).sqrt();
            row.iter().zip(w).map(move |(&v, &wj)| v as f64 * scale * wj as f64)
        })
        .collect()
}

/// `sum (got - want)^2 / sum want^2`, with `want` rounded to f32 first: the closest an f32
/// result can be (a float64 value below f32's range is f32's zero, exactly; a gated recurrence
/// decaying by `exp(-256)` gives whole outputs so, and unrounded they counted as NMSE 1). 0 when
/// both are all zero, infinite when `got` holds a NaN or differs from an all-zero reference.
pub fn nmse(got: &[f32], want: &[f64]) -> f64 {
    let (mut err, mut norm) = (0.0f64, 0.0f64);
    for (&g, &w) in got.iter().zip(want) {
        let w = w as f32 as f64;
        err += (g as f64 - w).powi(2);
        norm += w * w;
    }
    if err == 0.0 {
        0.0
    } else if err.is_nan() || norm == 0.0 {
        f64::INFINITY
    } else {
        err / norm
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nmse_measures_relative_squared_error() {
        let want = [1.0f64, -2.0, 3.0, 0.5];
        let exact: Vec<f32> = want.iter().map(|&v| v as f32).collect();
        assert_eq!(nmse(&exact, &want), 0.0);
        // 10% off everywhere: NMSE 1e-2, far over the 5e-4 bar.
        let off: Vec<f32> = want.iter().map(|&v| (v * 1.1) as f32).collect();
        assert!((nmse(&off, &want) - 1e-2).abs() < 1e-6);
        let with_nan = [f32::NAN, -2.0, 3.0, 0.5];
        assert!(nmse(&with_nan, &want).is_infinite());
        assert_eq!(nmse(&[0.0, 0.0], &[0.0, 0.0]), 0.0);
        assert!(nmse(&[0.0, 1e-30], &[0.0, 0.0]).is_infinite());
        // Below f32's range the reference is f32's zero: zeros meet it, anything else does not.
        assert_eq!(nmse(&[0.0, 0.0], &[1e-93, -1e-116]), 0.0);
        assert!(nmse(&[0.0, 1e-30], &[1e-93, -1e-116]).is_infinite());
    }
}
