//! Which backends this machine can run, found without panicking whatever it lacks.
use strata_host::backends::cpu::CpuBackend;
use strata_host::backends::gpu::GpuBackend;
use strata_host::backends::{cuda, hip};
use strata_host::{Backend, Error};

/// The backends that opened, and why each missing one did not.
pub struct Available {
    pub cpu: CpuBackend,
    pub cuda: Result<GpuBackend, Error>,
    pub hip: Result<GpuBackend, Error>,
}

impl Available {
    /// Opens every backend on GPU `ordinal`.
    pub fn open(ordinal: usize) -> Available {
        Available { cpu: CpuBackend::new(), cuda: cuda::open(ordinal, crate::ptx::IMAGES), hip: hip::open(ordinal) }
    }

    /// The opened backends, the CPU replica (the reference) first.
    pub fn all(&self) -> Vec<&dyn Backend> {
        let mut v: Vec<&dyn Backend> = vec![&self.cpu];
        for g in [&self.cuda, &self.hip].into_iter().flatten() {
            v.push(g);
        }
        v
    }

    /// Whether a GPU backend is expected: `STRATA_REQUIRE_GPU=1`.
    pub fn gpu_required() -> bool {
        std::env::var("STRATA_REQUIRE_GPU").is_ok_and(|v| v == "1")
    }
}
