//! Strata's GPU kernels, written once in Rust and compiled to PTX.
//!
//! Kernels use only the vocabulary in [`arch`]; raw `asm!` lives there and nowhere else. Every
//! kernel is an `extern "ptx-kernel"` entry exported under the same name as its HIP twin in
//! `device/hip/` and its replica in `strata_gpu_shared::replica`.
//!
//! Outside the PTX build the crate compiles for the host, with `std`, as the simulator's
//! (`arch::sim`): every entry an ordinary Rust function a test runs on CPU threads.
#![cfg_attr(target_arch = "nvptx64", no_std)]
#![cfg_attr(target_arch = "nvptx64", feature(abi_ptx, asm_experimental_arch, stdarch_nvptx))]

pub mod arch;
pub mod kernels;

/// Declares a kernel entry: in the PTX build an unmangled `extern "ptx-kernel"` function; on the
/// host (the simulator) the same function with the Rust ABI, and its [`arch::sim::Entry`] in
/// [`arch::sim::ENTRIES`] (its name, and a call from a launch's argument list).
#[macro_export]
macro_rules! entry {
    ($(#[$attr:meta])* pub unsafe fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $body:block) => {
        #[cfg(target_arch = "nvptx64")]
        $(#[$attr])*
        #[no_mangle]
        pub unsafe extern "ptx-kernel" fn $name($($arg: $ty),*) $body

        #[cfg(not(target_arch = "nvptx64"))]
        $(#[$attr])*
        pub unsafe fn $name($($arg: $ty),*) $body

        // (The entry's attributes again: a `cfg` among them leaves its registration out too.)
        #[cfg(not(target_arch = "nvptx64"))]
        $(#[$attr])*
        const _: () = {
            #[linkme::distributed_slice($crate::arch::sim::ENTRIES)]
            static ENTRY: $crate::arch::sim::Entry = $crate::arch::sim::Entry {
                name: stringify!($name),
                params: &[$(stringify!($arg)),*],
                call: |args| {
                    let mut args = args.iter().enumerate();
                    $(let $arg: $ty = $crate::arch::sim::FromArg::take(&mut args, stringify!($name));)*
                    // SAFETY: `Entry::call`'s contract is the entry's, passed on.
                    unsafe { $name($($arg),*) }
                },
            };
        };
    };
}

#[cfg(target_arch = "nvptx64")]
#[panic_handler]
fn panic(_: &core::panic::PanicInfo) -> ! {
    arch::trap()
}
