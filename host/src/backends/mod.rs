//! The one trait every backend implements. Callers never know which backend runs.
//!
//! Buffers are host slices: a GPU backend uploads the inputs, uploads the *current contents* of
//! the output (so a caller can poison it, e.g. fill it with NaN, and see afterwards which
//! elements the kernel wrote), launches, and downloads the output.
//!
//! | module | what |
//! |---|---|
//! | [`cpu`] | the CPU replicas (gpu-shared), multi-threaded |
//! | [`gpu`] | a CUDA driver context + module: what `cuda` and `hip` have in common |
//! | [`cuda`] | the Rust PTX from `device/` |
//! | [`hip`] | the `device/hip/*.hip` sources, compiled at run time by NVRTC |
//! | [`sim`] | the `device/` kernels' own code on CPU threads (the simulator), for tests |
//! | [`launch`] | one kernel launch: parameters, driver call, programmatic dependent launch |
//! | [`knobs`] | the kernel knobs (routed experts, attention) and the expert launch plan they give |
//! | [`mapped`] | pinned device-mapped host memory, `copy_from_mapped_multi` |
//! | [`trace`] | the timeline build: every entry stamps its blocks' start, release and end |
pub mod cpu;
pub mod cuda;
pub mod gpu;
pub mod hip;
pub mod knobs;
pub mod launch;
pub mod mapped;
#[cfg(feature = "sim")]
pub mod sim;
pub mod trace;

use crate::error::{Error, Result};
use strata_gpu_shared::formats::{q8_1, FloatFormat, WeightFormat, GROUP};
use strata_gpu_shared::launch::{matvec_blocks, MMVQ_MAX_ROWS, MOE_MAX_SELECTIONS};

/// A quantized weight matrix: `m` rows of `k` values in `format`, row-major blocks.
#[derive(Clone, Copy, Debug)]
pub struct Weights<'a> {
    pub format: WeightFormat,
    pub m: usize,
    pub k: usize,
    pub data: &'a [u8],
}

/// A float weight matrix: `m` rows of `k` elements of `format`, row-major.
#[derive(Clone, Copy, Debug)]
pub struct FloatWeights<'a> {
    pub format: FloatFormat,
    pub m: usize,
    pub k: usize,
    pub data: &'a [u8],
}

/// One expert tensor of a MoE layer: `n_expert` matrices of `rows` x `cols` values of `format`,
/// one after another.
#[derive(Clone, Copy, Debug)]
pub struct ExpertTensor<'a> {
    pub format: WeightFormat,
    pub n_expert: usize,
    pub rows: usize,
    pub cols: usize,
    pub data: &'a [u8],
}

impl ExpertTensor<'_> {
    pub fn expert_bytes(&self) -> usize {
        self.rows * self.format.row_bytes(self.cols)
    }

    /// Row `i` of expert `e`.
    pub fn row(&self, e: usize, i: usize) -> &[u8] {
        let rb = self.format.row_bytes(self.cols);
        let at = e * self.expert_bytes() + i * rb;
        &self.data[at..at + rb]
    }
}

/// A verify window through one MoE layer's routed experts: `tokens` rows of q8_1 activations
/// (`n_embd` values each), each token's `k` expert ids and routing weights (token-major), and
/// the gate, up (`n_ff` x `n_embd`) and down (`n_embd` x `n_ff`) expert tensors.
#[derive(Clone, Copy, Debug)]
pub struct MoeWindow<'a> {
    pub tokens: usize,
    pub k: usize,
    pub ids: &'a [u32],
    pub weights: &'a [f32],
    pub xq: &'a [u8],
    pub gate: ExpertTensor<'a>,
    pub up: ExpertTensor<'a>,
    pub down: ExpertTensor<'a>,
}

/// What a MoE window produces, intermediates included so that parity can say where two
/// backends part: `hq` the SwiGLU output per selection (q8_1, `tokens * k` rows of `n_ff / 32`
/// blocks), `y` the down output per selection (`tokens * k` rows of `n_embd`), `out` the
/// combined rows (`tokens` x `n_embd`), added to what `out` holds with `accumulate`
/// (`order::stored`).
pub struct MoeOut<'a> {
    pub hq: &'a mut [u8],
    pub y: &'a mut [f32],
    pub out: &'a mut [f32],
    pub accumulate: bool,
}

/// Which kernel of a family runs where a family has a reference and a fast variant (the CPU
/// replica computes the one spec both follow).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Variant {
    /// The simple kernel the fast one is checked against (one block per row for the head, one
    /// thread per block for the quantizer).
    Reference,
    /// The kernel the engine uses (split across blocks, one warp per block).
    Fast,
}

pub trait Backend {
    /// `cpu`, `cuda` or `hip`.
    fn name(&self) -> &'static str;

    /// `x`: rows of f32 laid end to end, `x.len()` a multiple of 32. `out`: `x.len() / 32` q8_1
    /// blocks (36 bytes each).
    fn quantize_q8_1(&self, x: &[f32], out: &mut [u8]) -> Result<()>;

    /// `y[r * m + i] = dot(w row i, activation row r)` for `rows` (1..=8) q8_1 rows of `w.k`
    /// values in `xq`; with `accumulate`, `y[r * m + i] += ...` (`order::stored`).
    fn mmvq(&self, w: &Weights, xq: &[u8], rows: usize, accumulate: bool, y: &mut [f32]) -> Result<()>;

    /// `y[r * m + i] = dot(w row i, x row r)` for `rows` (1..=8) f32 rows of `w.k` values; with
    /// `accumulate`, `y[r * m + i] += ...`.
    fn matvec(&self, w: &FloatWeights, x: &[f32], rows: usize, accumulate: bool, y: &mut [f32]) -> Result<()>;

    /// Per row of `n` logits: the index of the maximum (`order::argmax_better`) and whether the
    /// row is all NaN (1) or not (0).
    fn argmax_rows(&self, x: &[f32], n: usize, variant: Variant, idx: &mut [u32], all_nan: &mut [u32]) -> Result<()>;

    /// Per row of `n` logits: the softmax probability of the maximum (`order`, row_top_prob).
    fn row_top_prob(&self, x: &[f32], n: usize, variant: Variant, p: &mut [f32]) -> Result<()>;

    /// Rows of `k` values times per-row (`per_column == false`) or per-column scales to Q8_0.
    fn quantize_q8_0_scaled(&self, x: &[f32], k: usize, scales: &[f32], per_column: bool, variant: Variant, out: &mut [u8]) -> Result<()>;

    /// The routed experts of one window: grouping, gate/up + SwiGLU + q8_1, down, combine.
    fn moe(&self, w: &MoeWindow, out: &mut MoeOut) -> Result<()>;
}

pub(crate) fn shape_err(kernel: &'static str, detail: String) -> Error {
    Error::Shape { kernel, detail }
}

/// The blocks of a float `matvec` launch ([`matvec_blocks`]), or a shape error naming `kernel`
/// where they would not fit a grid.
pub(crate) fn matvec_grid(kernel: &'static str, m: usize, rows: usize) -> Result<u32> {
    matvec_blocks(m, rows).ok_or_else(|| shape_err(kernel, format!("{m} weight rows of {rows} activation rows are more blocks than a grid holds")))
}

/// A host slice holds exactly `want` elements.
pub(crate) fn exact_len(kernel: &'static str, what: &str, have: usize, want: usize) -> Result<()> {
    if have != want {
        return Err(shape_err(kernel, format!("{what} holds {have} elements, {want} expected")));
    }
    Ok(())
}

/// Checks `quantize_q8_1`'s sizes; returns the number of groups.
pub fn check_quantize(x: &[f32], out: &[u8]) -> Result<usize> {
    let k = "quantize_q8_1";
    if x.len() % GROUP != 0 {
        return Err(shape_err(k, format!("input length {} is not a multiple of {GROUP}", x.len())));
    }
    let groups = x.len() / GROUP;
    if out.len() != groups * q8_1::BYTES {
        return Err(shape_err(k, format!("output is {} bytes, {groups} groups need {}", out.len(), groups * q8_1::BYTES)));
    }
    if groups > u32::MAX as usize {
        return Err(shape_err(k, format!("{groups} groups exceed one launch")));
    }
    Ok(groups)
}

/// Checks `mmvq`'s sizes; returns the number of groups per row.
pub fn check_mmvq(w: &Weights, xq: &[u8], rows: usize, y: &[f32]) -> Result<usize> {
    let kname = w.format.mmvq_kernel();
    if w.k == 0 || w.k % w.format.block_values() != 0 {
        return Err(shape_err(kname, format!("row length {} is not a positive multiple of {}", w.k, w.format.block_values())));
    }
    if w.m == 0 || w.m > u32::MAX as usize {
        return Err(shape_err(kname, format!("{} weight rows", w.m)));
    }
    if !(1..=MMVQ_MAX_ROWS).contains(&rows) {
        return Err(shape_err(kname, format!("{rows} activation rows, supported 1..={MMVQ_MAX_ROWS}")));
    }
    let groups = w.k / GROUP;
    let wbytes = w.m * w.format.row_bytes(w.k);
    if w.data.len() != wbytes {
        return Err(shape_err(kname, format!("{}x{} {} weights need {wbytes} bytes, got {}", w.m, w.k, w.format.name(), w.data.len())));
    }
    if xq.len() != rows * groups * q8_1::BYTES {
        return Err(shape_err(kname, format!("{rows} q8_1 rows of {} values need {} bytes, got {}", w.k, rows * groups * q8_1::BYTES, xq.len())));
    }
    if y.len() != rows * w.m {
        return Err(shape_err(kname, format!("output holds {} floats, {rows} x {} needed", y.len(), w.m)));
    }
    Ok(groups)
}

/// Checks `matvec`'s sizes; the launch's blocks ([`matvec_grid`]).
pub fn check_matvec(w: &FloatWeights, x: &[f32], rows: usize, y: &[f32]) -> Result<u32> {
    let kname = w.format.matvec_kernel();
    if w.k == 0 || w.k > u32::MAX as usize || w.m == 0 || w.m > u32::MAX as usize {
        return Err(shape_err(kname, format!("{}x{} weights", w.m, w.k)));
    }
    if !(1..=MMVQ_MAX_ROWS).contains(&rows) {
        return Err(shape_err(kname, format!("{rows} activation rows, supported 1..={MMVQ_MAX_ROWS}")));
    }
    let blocks = matvec_grid(kname, w.m, rows)?;
    let wbytes = w.m * w.k * w.format.bytes();
    if w.data.len() != wbytes {
        return Err(shape_err(kname, format!("{}x{} {} weights need {wbytes} bytes, got {}", w.m, w.k, w.format.name(), w.data.len())));
    }
    if x.len() != rows * w.k {
        return Err(shape_err(kname, format!("{rows} rows of {} values need {} floats, got {}", w.k, rows * w.k, x.len())));
    }
    if y.len() != rows * w.m {
        return Err(shape_err(kname, format!("output holds {} floats, {rows} x {} needed", y.len(), w.m)));
    }
    Ok(blocks)
}

/// Checks a head kernel's sizes; returns the number of rows.
pub fn check_head(kernel: &'static str, x: &[f32], n: usize, outs: &[usize]) -> Result<usize> {
    if n == 0 || n > u32::MAX as usize / 2 || x.len() % n != 0 || x.is_empty() {
        return Err(shape_err(kernel, format!("{} logits are not whole rows of {n}", x.len())));
    }
    let rows = x.len() / n;
    if let Some(bad) = outs.iter().find(|&&l| l != rows) {
        return Err(shape_err(kernel, format!("output holds {bad} values, {rows} rows given")));
    }
    if rows * n.div_ceil(strata_gpu_shared::launch::HEAD_CHUNK) > u32::MAX as usize / 2 {
        return Err(shape_err(kernel, format!("{rows} rows of {n} exceed one launch")));
    }
    Ok(rows)
}

/// Checks `quantize_q8_0_scaled`'s sizes; returns the number of blocks.
pub fn check_quantize_q8_0(x: &[f32], k: usize, scales: &[f32], per_column: bool, out: &[u8]) -> Result<usize> {
    let kname = "quantize_q8_0_scaled";
    if k == 0 || k % GROUP != 0 || x.len() % k != 0 || x.is_empty() {
        return Err(shape_err(kname, format!("{} values are not whole rows of {k} (a positive multiple of {GROUP})", x.len())));
    }
    let want = if per_column { k } else { x.len() / k };
    if scales.len() != want {
        return Err(shape_err(kname, format!("{} scales given, {want} needed ({})", scales.len(), if per_column { "one per column" } else { "one per row" })));
    }
    let groups = x.len() / GROUP;
    if out.len() != groups * strata_gpu_shared::formats::q8_0::BYTES || groups > u32::MAX as usize / 2 {
        return Err(shape_err(kname, format!("output is {} bytes, {groups} blocks need {}", out.len(), groups * strata_gpu_shared::formats::q8_0::BYTES)));
    }
    Ok(groups)
}

/// Checks a MoE window's sizes and ids; returns (n_embd, n_ff).
pub fn check_moe(w: &MoeWindow, o: &MoeOut) -> Result<(usize, usize)> {
    let kname = "moe";
    let err = |d: String| Err(shape_err(kname, d));
    let (n_embd, n_ff) = (w.gate.cols, w.gate.rows);
    if w.tokens == 0 || w.k == 0 || w.tokens * w.k > MOE_MAX_SELECTIONS {
        return err(format!("{} tokens x {} slots (1..={MOE_MAX_SELECTIONS} selections supported)", w.tokens, w.k));
    }
    if w.up.format != w.gate.format {
        return err(format!("gate is {} and up {}: one format for both", w.gate.format.name(), w.up.format.name()));
    }
    if w.up.rows != n_ff || w.up.cols != n_embd || w.down.rows != n_embd || w.down.cols != n_ff {
        return err(format!("gate {}x{}, up {}x{}, down {}x{} do not fit one another", w.gate.rows, w.gate.cols, w.up.rows, w.up.cols, w.down.rows, w.down.cols));
    }
    if n_ff == 0 || n_ff % GROUP != 0 || n_embd == 0 || n_embd % GROUP != 0 {
        return err(format!("n_ff {n_ff} and n_embd {n_embd} must be positive multiples of {GROUP}"));
    }
    for t in [&w.gate, &w.up, &w.down] {
        if t.cols % t.format.block_values() != 0 {
            return err(format!("{} expert rows of {} values: not a multiple of the format's {}-value block", t.format.name(), t.cols, t.format.block_values()));
        }
        if t.n_expert != w.gate.n_expert || t.data.len() != t.n_expert * t.expert_bytes() {
            return err(format!("{} expert tensor of {} x {}x{} holds {} bytes, needs {}", t.format.name(), t.n_expert, t.rows, t.cols, t.data.len(), t.n_expert * t.expert_bytes()));
        }
    }
    let n = w.tokens * w.k;
    if let Some(bad) = w.ids.iter().find(|&&id| id as usize >= w.gate.n_expert) {
        return err(format!("expert id {bad} out of range (layer has {} experts)", w.gate.n_expert));
    }
    if w.ids.len() != n || w.weights.len() != n {
        return err(format!("{} ids and {} weights for {n} selections", w.ids.len(), w.weights.len()));
    }
    let xq_len = q8_1::bytes_of(w.tokens * n_embd);
    let hq_len = q8_1::bytes_of(n * n_ff);
    if w.xq.len() != xq_len || o.hq.len() != hq_len || o.y.len() != n * n_embd || o.out.len() != w.tokens * n_embd {
        return err(format!("buffers of {} / {} / {} / {} elements, need {xq_len} / {hq_len} / {} / {}", w.xq.len(), o.hq.len(), o.y.len(), o.out.len(), n * n_embd, w.tokens * n_embd));
    }
    Ok((n_embd, n_ff))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A matvec whose blocks would not fit a grid is a shape error naming the kernel, before any
    /// buffer is looked at (its weights would be gigabytes).
    #[test]
    fn matvec_past_a_grid_is_a_shape_error() {
        let w = FloatWeights { format: FloatFormat::F32, m: 1 << 29, k: 1, data: &[] };
        let err = check_matvec(&w, &[0.0; 8], 8, &[]).unwrap_err().to_string();
        assert!(err.contains("matvec_f32") && err.contains("more blocks than a grid holds"), "{err}");
        // The same rows with one activation row fit, so the next check (the weights' bytes) fails.
        let err = check_matvec(&w, &[0.0], 1, &[]).unwrap_err().to_string();
        assert!(err.contains("bytes"), "{err}");
    }
}
