//! Shared by the `no_std` device crate (compiled to PTX) and the host.
//!
//! - [`codebooks`]: the IQ grids and sign codes, generated from the `gguf` package.
//! - [`f16`]: bit-exact IEEE half conversions in software (the replica's stand-in for
//!   `cvt.f32.f16` / `cvt.rn.f16.f32`).
//! - [`formats`]: block layouts and codebooks of the weight and activation formats.
//! - [`grid_pad`]: the launch-size rule that pads grids away from full-die wave multiples.
//! - [`lane_grids`]: codebooks repeated once a half-warp lane, which the EXPDEC gate/up kernels
//!   stage so that a warp's codebook gathers take at most two passes through the banks.
//! - [`launch`]: launch geometry and launch bounds of every kernel (build.rs writes the bounds
//!   into the PTX; the HIP side gets them as a generated header).
//! - [`math`]: `exp_neg` and other float functions specified to the operation.
//! - [`moe`]: the routed-expert group table, grouping, SwiGLU.
//! - [`order`]: the float reduction orders every kernel variant and backend must follow.
//! - [`replica`]: the CPU replica of each kernel, which follows those orders exactly.
#![no_std]

pub mod codebooks;
pub mod f16;
pub mod formats;
pub mod grid_pad;
pub mod lane_grids;
pub mod launch;
pub mod math;
pub mod moe;
pub mod order;
pub mod replica;
