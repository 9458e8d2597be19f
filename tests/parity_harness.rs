//! The parity harness itself: a backend that is wrong by one bit, leaves one element
//! unwritten, or stores where it should accumulate, must be caught by every case function (so a
//! green parity run means something).
use strata::host::backends::cpu::CpuBackend;
use strata::host::parity;
use strata::host::{Backend, FloatWeights, MoeOut, MoeWindow, Result, Variant, Weights};
use strata_gpu_shared::formats::{FloatFormat, WeightFormat};

#[derive(Clone, Copy, PartialEq)]
enum Fault {
    FlipLastBit,
    SkipLast,
    /// Accumulating kernels store their sums instead.
    Store,
}

/// The CPU replica with one fault applied to the last element of every output (or to the
/// accumulating runs).
struct Broken(CpuBackend, Fault);

impl Broken {
    fn spoil<T: Copy>(&self, out: &mut [T], keep: &[T], flip: impl Fn(T) -> T) {
        let last = out.len() - 1;
        out[last] = match self.1 {
            Fault::FlipLastBit => flip(out[last]),
            Fault::SkipLast => keep[last],
            Fault::Store => out[last],
        };
    }

    fn accumulates(&self, accumulate: bool) -> bool {
        accumulate && self.1 != Fault::Store
    }
}

impl Backend for Broken {
    fn name(&self) -> &'static str {
        "broken"
    }
    fn quantize_q8_1(&self, x: &[f32], out: &mut [u8]) -> Result<()> {
        let keep = out.to_vec();
        self.0.quantize_q8_1(x, out)?;
        self.spoil(out, &keep, |b| b ^ 1);
        Ok(())
    }
    fn mmvq(&self, w: &Weights, xq: &[u8], rows: usize, accumulate: bool, y: &mut [f32]) -> Result<()> {
        let keep = y.to_vec();
        self.0.mmvq(w, xq, rows, self.accumulates(accumulate), y)?;
        self.spoil(y, &keep, |v| f32::from_bits(v.to_bits() ^ 1));
        Ok(())
    }
    fn matvec(&self, w: &FloatWeights, x: &[f32], rows: usize, accumulate: bool, y: &mut [f32]) -> Result<()> {
        let keep = y.to_vec();
        self.0.matvec(w, x, rows, self.accumulates(accumulate), y)?;
        self.spoil(y, &keep, |v| f32::from_bits(v.to_bits() ^ 1));
        Ok(())
    }
    fn argmax_rows(&self, x: &[f32], n: usize, v: Variant, idx: &mut [u32], all_nan: &mut [u32]) -> Result<()> {
        let keep = idx.to_vec();
        self.0.argmax_rows(x, n, v, idx, all_nan)?;
        self.spoil(idx, &keep, |i| i ^ 1);
        Ok(())
    }
    fn row_top_prob(&self, x: &[f32], n: usize, v: Variant, p: &mut [f32]) -> Result<()> {
        let keep = p.to_vec();
        self.0.row_top_prob(x, n, v, p)?;
        self.spoil(p, &keep, |x| f32::from_bits(x.to_bits() ^ 1));
        Ok(())
    }
    fn moe(&self, w: &MoeWindow, o: &mut MoeOut) -> Result<()> {
        let keep = o.out.to_vec();
        o.accumulate = self.accumulates(o.accumulate);
        self.0.moe(w, o)?;
        self.spoil(o.out, &keep, |x| f32::from_bits(x.to_bits() ^ 1));
        Ok(())
    }
    fn quantize_q8_0_scaled(&self, x: &[f32], k: usize, s: &[f32], pc: bool, v: Variant, out: &mut [u8]) -> Result<()> {
        let keep = out.to_vec();
        self.0.quantize_q8_0_scaled(x, k, s, pc, v, out)?;
        self.spoil(out, &keep, |b| b ^ 1);
        Ok(())
    }
}

#[test]
fn every_case_catches_a_wrong_bit_and_an_unwritten_element() {
    let cpu = CpuBackend::new();
    for fault in [Fault::FlipLastBit, Fault::SkipLast] {
        let bad = Broken(CpuBackend::new(), fault);
        let pair: [&dyn Backend; 2] = [&cpu, &bad];
        let outcomes = [
            parity::quantize_case(&pair, 3, 256, 1).unwrap(),
            parity::mmvq_case(&pair, WeightFormat::Iq3S, 40, 512, 3, 2, false, false).unwrap(),
            parity::mmvq_case(&pair, WeightFormat::Iq3S, 40, 512, 3, 2, false, true).unwrap(),
            parity::matvec_case(&pair, FloatFormat::Bf16, 40, 100, 2, 3, false).unwrap(),
            parity::matvec_case(&pair, FloatFormat::Bf16, 40, 100, 2, 3, true).unwrap(),
            parity::argmax_case(&pair, 4, 5000, 4).unwrap(),
            parity::top_prob_case(&pair, 4, 5000, 5).unwrap(),
            parity::quantize_q8_0_case(&pair, 2, 128, true, 6).unwrap(),
            parity::moe_case(&pair, &parity::MoeCase::random(&mut rand::SeedableRng::seed_from_u64(7), (WeightFormat::Iq2Xs, WeightFormat::Iq4Nl), 6, 256, 64, 3, 2), 7).unwrap(),
        ];
        for o in outcomes {
            assert!(!o.passed(), "{}: a {} backend passed", o.kernel, if fault == Fault::SkipLast { "lazy" } else { "wrong" });
            match fault {
                // A skipped element is caught as unwritten where outputs are poisoned per run;
                // either way the case must fail and say which backend.
                Fault::SkipLast => assert!(o.explain().contains("broken"), "{}", o.explain()),
                Fault::FlipLastBit => {
                    let m = o.mismatch.as_ref().unwrap_or_else(|| panic!("{}: no mismatch reported", o.kernel));
                    assert!(m.backend.starts_with("broken"), "{}", o.explain());
                }
                Fault::Store => unreachable!("accumulating_cases_catch_a_store"),
            }
        }
    }
}

/// A backend that stores where it should accumulate is caught by every case that accumulates,
/// against `add_f32` of the initial values and its own stored output.
#[test]
fn accumulating_cases_catch_a_store() {
    let (cpu, bad) = (CpuBackend::new(), Broken(CpuBackend::new(), Fault::Store));
    let pair: [&dyn Backend; 2] = [&cpu, &bad];
    let outcomes = [
        parity::mmvq_case(&pair, WeightFormat::Q6K, 40, 512, 3, 8, false, true).unwrap(),
        parity::matvec_case(&pair, FloatFormat::F16, 40, 100, 2, 9, true).unwrap(),
        parity::moe_case(&pair, &parity::MoeCase::random(&mut rand::SeedableRng::seed_from_u64(10), (WeightFormat::Iq3S, WeightFormat::Q8_0), 6, 256, 64, 3, 2), 10).unwrap(),
    ];
    for o in outcomes {
        let m = o.mismatch.as_ref().unwrap_or_else(|| panic!("{}: a backend that does not accumulate passed", o.kernel));
        assert!(m.backend.starts_with("broken") && o.explain().contains("accumulat"), "{}", o.explain());
    }
}
