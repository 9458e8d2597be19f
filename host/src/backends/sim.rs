//! The `sim` backend: the device kernels' own code (`device/src`, compiled for the host as the
//! `strata-device-sim` crate) run on CPU threads by the simulator (`strata_device::arch::sim`),
//! launched as the cuda backend launches them: the same entries, grids, bands and shared memory.
//! For tests where no GPU is at hand: a kernel's logic bit for bit against the replica, every
//! global access checked against the launch's buffers and every shared access against its size.
//! It says nothing of speed. Families it runs so far: attention (`ops::attention`).
use crate::error::{Error, Result};
use strata_device::arch::sim::{self, Region};
use strata_gpu_shared::launch::image_bounds;

/// The simulator and the launch choices a GPU's size or a knob would make.
#[derive(Clone, Copy, Debug)]
pub struct SimBackend {
    /// The SM count the launch rules see (the band rule, the lean rule).
    pub sms: usize,
    /// The attention band (query heads an `attn_chunk` block takes): `None` for the rule's.
    pub attn_band: Option<usize>,
    /// The lean attention entry (`attn_chunk_128_m4`) where the band has one: `None` for the
    /// rule's, as `ATTN_MINB` forces it on the cuda backend.
    pub attn_lean: Option<bool>,
}

impl SimBackend {
    /// The launch rules of a GPU of `sms` SMs (the H200's 132 where it does not matter).
    pub fn new(sms: usize) -> Self {
        SimBackend { sms, attn_band: None, attn_lean: None }
    }

    /// Runs the entry `kernel` over `blocks` blocks, its threads and shared memory from its
    /// launch bounds (the sm_90 image's, whose entries the simulator compiles but for the
    /// cluster ones), `body` calling the entry with pointers into `memory`'s buffers.
    pub fn launch(&self, kernel: &'static str, blocks: usize, memory: &[Region], body: impl Fn() + Sync) -> Result<()> {
        let b = image_bounds("sm_90").find(|b| b.kernel == kernel).ok_or_else(|| Error::Simulated { kernel: kernel.into(), detail: "no launch bounds for this entry".into() })?;
        sim::launch(blocks as u32, b.threads, b.smem_bytes as usize, memory, body).map_err(|detail| Error::Simulated { kernel: kernel.into(), detail })
    }
}

/// A buffer's address as a launch's closure holds it: raw pointers are neither `Send` nor
/// `Sync`, and the simulator's threads share the closure. Read through [`At::get`], so that a
/// closure captures the whole `At` and not its pointer field.
#[derive(Clone, Copy)]
pub struct At<T>(*mut T);

// SAFETY: an address; every access through it is the kernel's, checked by the simulator
// against the launch's regions, and ordered by its barriers as on the GPU.
unsafe impl<T> Send for At<T> {}
// SAFETY: as above.
unsafe impl<T> Sync for At<T> {}

impl<T> At<T> {
    /// `s` for a kernel to read, its region added to `memory`.
    pub fn input(s: &[T], memory: &mut Vec<Region>) -> At<T> {
        memory.push(Region::of(s, false));
        At(s.as_ptr() as *mut T)
    }

    /// `s` for a kernel to write (and read), its region added to `memory`.
    pub fn output(s: &mut [T], memory: &mut Vec<Region>) -> At<T> {
        memory.push(Region::of(s, true));
        At(s.as_mut_ptr())
    }

    /// A null pointer (an argument the kernel takes as "none").
    pub fn null() -> At<T> {
        At(std::ptr::null_mut())
    }

    pub fn get(self) -> *mut T {
        self.0
    }
}
