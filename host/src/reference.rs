//! Float64 references: the math a kernel approximates, on the dequantized weights and the
//! unquantized activations, and the normalized mean squared error against it.
use strata_gpu_shared::f16::f16_to_f32;
use strata_gpu_shared::formats::GROUP;
use strata_gpu_shared::replica::decode_group;

use crate::backend::Weights;

/// Dequantizes row `i` of `w` to f64.
pub fn dequant_row(w: &Weights, i: usize) -> Vec<f64> {
    let bb = w.format.block_bytes();
    let row_bytes = w.k / GROUP * bb;
    let row = &w.data[i * row_bytes..(i + 1) * row_bytes];
    let mut out = Vec::with_capacity(w.k);
    for block in row.chunks_exact(bb) {
        let g = decode_group(w.format, block);
        let d = f16_to_f32(g.d) as f64;
        out.extend(g.q.iter().map(|&q| d * q as f64));
    }
    out
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

/// `sum (got - want)^2 / sum want^2`; infinite when `got` holds a NaN or the reference is all 0.
pub fn nmse(got: &[f32], want: &[f64]) -> f64 {
    let (mut err, mut norm) = (0.0f64, 0.0f64);
    for (&g, &w) in got.iter().zip(want) {
        err += (g as f64 - w).powi(2);
        norm += w * w;
    }
    if err.is_nan() || norm == 0.0 {
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
    }
}
