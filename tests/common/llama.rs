//! What the comparisons with llama.cpp share (`tests/llama_reference.rs`, `tests/llama_mtp.rs`):
//! per-position NMSE and top-1 statistics, the `strata` binary under test, llama.cpp's venv
//! python, f32 row files.
use std::path::{Path, PathBuf};
use std::process::Command;

/// A position above this NMSE counts as a spike (a routing flip: 1e-3 to 0.47 measured).
pub const SPIKE_NMSE: f64 = 1e-2;

/// Per-position NMSE of our rows against the reference rows, and top-1 agreement.
pub struct Stats {
    pub median: f64,
    pub mean: f64,
    pub max: f64,
    /// The position of the largest NMSE.
    pub worst: usize,
    pub spike_rate: f64,
    pub top1: f64,
}

impl Stats {
    /// From (position, our row, reference row) triples.
    pub fn of<'a>(rows: impl Iterator<Item = (usize, &'a [f32], &'a [f32])>) -> Stats {
        let (mut nmse, mut agree, mut worst, mut max) = (Vec::new(), 0usize, 0, f64::MIN);
        for (position, ours, theirs) in rows {
            let e = nmse_row(ours, theirs);
            if e > max {
                (worst, max) = (position, e);
            }
            nmse.push(e);
            agree += usize::from(row_argmax(ours) == row_argmax(theirs));
        }
        let n = nmse.len() as f64;
        let mean = nmse.iter().sum::<f64>() / n;
        let spike_rate = nmse.iter().filter(|&&e| e > SPIKE_NMSE).count() as f64 / n;
        let mut sorted = nmse;
        sorted.sort_by(f64::total_cmp);
        let median = (sorted[(sorted.len() - 1) / 2] + sorted[sorted.len() / 2]) / 2.0;
        Stats { median, mean, max, worst, spike_rate, top1: agree as f64 / n }
    }

    /// The NMSE figures only (top-1 means nothing for a hidden state).
    pub fn line_nmse(&self) -> String {
        format!(
            "NMSE median {:.2e}, mean {:.2e}, max {:.2e} (position {}), {:.0} % over {SPIKE_NMSE:.0e}",
            self.median,
            self.mean,
            self.max,
            self.worst,
            self.spike_rate * 100.0
        )
    }

    /// Adds to `failures` each bar the comparison `what` misses: its median NMSE above
    /// `median_max`, its share of spiking positions above `spike_rate_max`, a position above
    /// `nmse_max`, its top-1 agreement below `top1_min`.
    pub fn judge(&self, failures: &mut Vec<String>, what: &str, median_max: f64, spike_rate_max: f64, nmse_max: f64, top1_min: f64) {
        if self.median > median_max {
            failures.push(format!("{what}: median NMSE {:.2e} > {median_max:.0e}", self.median));
        }
        if self.spike_rate > spike_rate_max {
            failures.push(format!("{what}: {:.0} % of positions above NMSE {SPIKE_NMSE:.0e} > {:.0} %", self.spike_rate * 100.0, spike_rate_max * 100.0));
        }
        if self.max > nmse_max {
            failures.push(format!("{what}: NMSE {:.2e} at position {} > {nmse_max}", self.max, self.worst));
        }
        if self.top1 < top1_min {
            failures.push(format!("{what}: top-1 agreement {:.1} % < {:.0} %", self.top1 * 100.0, top1_min * 100.0));
        }
    }

    pub fn line(&self) -> String {
        format!(
            "NMSE median {:.2e}, mean {:.2e}, max {:.2e} (position {}), {:.0} % over {SPIKE_NMSE:.0e}; top-1 agreement {:.1} %",
            self.median,
            self.mean,
            self.max,
            self.worst,
            self.spike_rate * 100.0,
            self.top1 * 100.0
        )
    }
}

/// sum (a - b)^2 / sum b^2 in float64, b the reference.
pub fn nmse_row(ours: &[f32], reference: &[f32]) -> f64 {
    let (mut err, mut norm) = (0f64, 0f64);
    for (&a, &b) in ours.iter().zip(reference) {
        err += (a as f64 - b as f64).powi(2);
        norm += (b as f64).powi(2);
    }
    err / norm
}

/// The first index of the largest value.
pub fn row_argmax(row: &[f32]) -> usize {
    row.iter().enumerate().fold(0, |best, (i, &v)| if v > row[best] { i } else { best })
}

/// Runs the binary under test (cargo's, or `STRATA_BIN`), panicking with its stderr on failure.
pub fn strata(args: &[&str]) {
    let bin = std::env::var("STRATA_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_strata").to_string());
    let out = Command::new(&bin).args(args).env_remove("STRATA_REQUIRE_GPU").output().unwrap_or_else(|e| panic!("{bin}: {e}"));
    assert!(out.status.success(), "strata {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr));
}

/// A file of little-endian f32 rows of `n`.
pub fn f32_rows(path: &Path, n: usize) -> Vec<Vec<f32>> {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(bytes.len() % (4 * n), 0, "{}: {} bytes is not a whole number of rows of {n} f32", path.display(), bytes.len());
    bytes.chunks_exact(4 * n).map(|row| row.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect()).collect()
}

/// The project venv's python when it can import llama_cpp 0.3.36 (scripts/setup-llama.sh).
pub fn llama_python() -> Option<PathBuf> {
    let python = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".venv/bin/python");
    let check = "import sys, llama_cpp; sys.exit(llama_cpp.__version__ != '0.3.36')";
    let ok = python.exists() && Command::new(&python).args(["-c", check]).output().is_ok_and(|o| o.status.success());
    ok.then_some(python)
}

pub fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}
