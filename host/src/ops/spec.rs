//! Speculative decoding's verify step: [`SpecOps`] (host slices, what parity runs) for the CPU
//! replica and the GPU backends, the typed launcher `spec_accept_queue`, and [`parity_cases`].
use cudarc::driver::{CudaSlice, PushKernelArg};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use crate::backends::{exact_len, shape_err};
use crate::backends::cpu::CpuBackend;
use crate::error::Result;
use crate::backends::gpu::{holds, GpuBackend};
#[cfg(feature = "sim")]
use crate::backends::sim::{Args as SimArgs, SimBackend};
use crate::parity::{compare_bits, note_unwritten, Outcome, NMSE_MAX};
use strata_gpu_shared::launch::spec::SPEC_MAX_TOKENS;
use strata_gpu_shared::replica;

const SPEC: &str = "spec_accept";
/// Output poison: never a token id (the cases' ids stay below 2^20).
const POISON: u32 = 0xa5a5_a5a5;

/// The verify step on host slices.
pub trait SpecOps {
    fn name(&self) -> &'static str;

    /// For a window of `tokens = window.len() == next.len()` rows (`1..=SPEC_MAX_TOKENS`):
    /// `out[0]` = the accepted count `a`, `out[1 + i] = next[i]`; then `window[0] = next[a -
    /// 1]` and `pos += a` (`replica::spec`); `out.len() == tokens + 1`.
    fn spec_accept(&self, window: &mut [u32], next: &[u32], out: &mut [u32], pos: &mut u32) -> Result<()>;
}

fn check_tokens(tokens: usize) -> Result<()> {
    if !(1..=SPEC_MAX_TOKENS).contains(&tokens) {
        return Err(shape_err(SPEC, format!("{tokens} window rows, 1..={SPEC_MAX_TOKENS} supported")));
    }
    Ok(())
}

/// The rows of a host-slice call, its sizes checked.
fn window_rows(window: &[u32], next: &[u32], out: &[u32]) -> Result<usize> {
    let tokens = window.len();
    check_tokens(tokens)?;
    exact_len(SPEC, "next", next.len(), tokens)?;
    exact_len(SPEC, "out", out.len(), tokens + 1)?;
    Ok(tokens)
}

impl SpecOps for CpuBackend {
    fn name(&self) -> &'static str {
        "cpu"
    }

    fn spec_accept(&self, window: &mut [u32], next: &[u32], out: &mut [u32], pos: &mut u32) -> Result<()> {
        window_rows(window, next, out)?;
        replica::spec::spec_accept(window, next, out, pos);
        Ok(())
    }
}

impl GpuBackend {
    /// Queues `spec_accept` over a window of `tokens` rows: `out[0]` the accepted count,
    /// `out[1..=tokens]` the rows' next tokens, then the window's row 0 and `pos[0]` moved on
    /// (see [`SpecOps::spec_accept`]; buffers may be longer than needed).
    pub fn spec_accept_queue(&self, window: &mut CudaSlice<u32>, next: &CudaSlice<u32>, tokens: usize, out: &mut CudaSlice<u32>, pos: &mut CudaSlice<u32>) -> Result<()> {
        check_tokens(tokens)?;
        holds(SPEC, "window", window.len(), tokens)?;
        holds(SPEC, "next", next.len(), tokens)?;
        holds(SPEC, "out", out.len(), tokens + 1)?;
        holds(SPEC, "pos", pos.len(), 1)?;
        let t = tokens as u32;
        let mut a = self.builder(SPEC);
        a.arg(window).arg(next).arg(&t).arg(out).arg(pos);
        // SAFETY: the kernel's parameters in order, buffers checked above; blocks past 0
        // return at once, so a padded grid is covered.
        unsafe { self.launch_async(SPEC, self.padded_grid(SPEC, 1), a) }
    }
}

impl SpecOps for GpuBackend {
    fn name(&self) -> &'static str {
        self.name_static()
    }

    fn spec_accept(&self, window: &mut [u32], next: &[u32], out: &mut [u32], pos: &mut u32) -> Result<()> {
        let tokens = window_rows(window, next, out)?;
        let (mut dw, dn, mut dpos) = (self.upload(SPEC, window)?, self.upload(SPEC, next)?, self.upload(SPEC, &[*pos])?);
        let mut dout = self.upload_out(SPEC, out)?;
        self.spec_accept_queue(&mut dw, &dn, tokens, &mut dout, &mut dpos)?;
        self.synchronize(SPEC)?;
        self.download_out(SPEC, &dout, out)?;
        self.download(SPEC, &dw, window)?;
        let mut p = [0u32];
        self.download(SPEC, &dpos, &mut p)?;
        *pos = p[0];
        Ok(())
    }
}

/// The cuda backend's launch run by the simulator.
#[cfg(feature = "sim")]
impl SpecOps for SimBackend {
    fn name(&self) -> &'static str {
        "sim"
    }

    fn spec_accept(&self, window: &mut [u32], next: &[u32], out: &mut [u32], pos: &mut u32) -> Result<()> {
        let tokens = window_rows(window, next, out)? as u32;
        let mut p = [*pos];
        self.run(SPEC, 1, None, SimArgs::new().output(window).input(next).u32(tokens).output(out).output(&mut p))?;
        *pos = p[0];
        Ok(())
    }
}

/// A window of `tokens` rows whose accepted count is `accepted` (`1..=tokens`): drafts
/// `1..accepted` equal the previous row's next token, draft `accepted` (if any) differs from
/// it, and each later draft matches with probability one half (matches that must not count).
/// Ids are drawn from 3 to 2^20 values (small alphabets give chance matches). Returns
/// `(window, next)`.
pub fn window_with_accepted(rng: &mut SmallRng, tokens: usize, accepted: usize) -> (Vec<u32>, Vec<u32>) {
    let alphabet = [3, 50, 1 << 20][rng.random_range(0..3)];
    let next: Vec<u32> = (0..tokens).map(|_| rng.random_range(0..alphabet)).collect();
    let mut window: Vec<u32> = (0..tokens).map(|_| rng.random_range(0..alphabet)).collect();
    for i in 1..tokens {
        window[i] = match i.cmp(&accepted) {
            std::cmp::Ordering::Less => next[i - 1],
            std::cmp::Ordering::Equal => (next[i - 1] + rng.random_range(1..alphabet)) % alphabet,
            std::cmp::Ordering::Greater if rng.random_bool(0.5) => next[i - 1],
            std::cmp::Ordering::Greater => window[i],
        };
    }
    (window, next)
}

/// `spec_accept` on every backend for windows of `tokens` rows, one per accepted count
/// `1..=tokens` and two with random drafts, each at a random position (some near `u32::MAX`,
/// where the add wraps): outputs poisoned, compared bit for bit with the moved-on row 0 and
/// position, every element written.
fn accept_case(backends: &[&dyn SpecOps], tokens: usize, seed: u64) -> Result<Outcome> {
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut windows: Vec<_> = (1..=tokens).map(|a| window_with_accepted(&mut rng, tokens, a)).collect();
    for _ in 0..2 {
        let accepted = rng.random_range(1..=tokens);
        windows.push(window_with_accepted(&mut rng, tokens, accepted));
    }
    let positions: Vec<u32> = windows.iter().map(|_| if rng.random_bool(0.2) { u32::MAX - rng.random_range(0..8) } else { rng.random() }).collect();
    let (mut outs, mut unwritten) = (Vec::new(), Vec::new());
    for &b in backends {
        let (mut words, mut poisoned) = (Vec::new(), Vec::new());
        for ((window, next), &pos) in windows.iter().zip(&positions) {
            let (mut out, mut window, mut pos) = (vec![POISON; tokens + 1], window.clone(), pos);
            b.spec_accept(&mut window, next, &mut out, &mut pos)?;
            poisoned.extend(out.iter().map(|&w| w == POISON));
            words.extend(out);
            words.extend([window[0], pos]);
        }
        note_unwritten(&mut unwritten, b.name(), poisoned.into_iter());
        outs.push((b.name().to_string(), words));
    }
    let mismatch = compare_bits(&outs, |i, v| match i % (tokens + 3) {
        0 => format!("accepted {v} (window {})", i / (tokens + 3)),
        j if j == tokens + 1 => format!("next row 0 {v} (window {})", i / (tokens + 3)),
        j if j == tokens + 2 => format!("next position {v} (window {})", i / (tokens + 3)),
        j => format!("next {v} (window {}, row {})", i / (tokens + 3), j - 1),
    });
    Ok(Outcome {
        kernel: SPEC.into(),
        shape: format!("{tokens} rows x {} windows", windows.len()),
        seed,
        backends: outs.into_iter().map(|o| o.0).collect(),
        mismatch,
        unwritten,
        nmse: None,
        nmse_max: NMSE_MAX,
    })
}

/// The family's parity suite from `seed`: windows of 1..=`SPEC_MAX_TOKENS` rows, every
/// accepted count of each forced once. `backends[0]` is the reference.
pub fn parity_cases(backends: &[&dyn SpecOps], seed: u64) -> Result<Vec<Outcome>> {
    let mut rng = SmallRng::seed_from_u64(seed);
    (1..=SPEC_MAX_TOKENS).map(|tokens| accept_case(backends, tokens, rng.random())).collect()
}
