//! Strata's GPU kernels, written once in Rust and compiled to PTX.
//!
//! Kernels use only the vocabulary in [`arch`]; raw `asm!` lives there and nowhere else. Every
//! kernel is an `extern "ptx-kernel"` entry exported under the same name as its HIP twin in
//! `device/hip/` and its replica in `strata_gpu_shared::replica`.
#![no_std]
#![feature(abi_ptx, asm_experimental_arch, stdarch_nvptx)]

pub mod arch;
pub mod kernels;

#[panic_handler]
fn panic(_: &core::panic::PanicInfo) -> ! {
    arch::trap()
}
