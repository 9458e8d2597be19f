//! Strata's host side: the backends every kernel runs on, behind one trait, and the parity
//! suite that proves them identical.
//!
//! | module | what |
//! |---|---|
//! | [`backend`] | the [`Backend`] trait and the shape checks every backend shares |
//! | [`cpu`] | the CPU replicas (gpu-shared), multi-threaded |
//! | [`gpu`] | a CUDA driver context + module: what `cuda` and `hip` have in common |
//! | [`cuda`] | the Rust PTX from `device/` |
//! | [`launch`] | one kernel launch: parameters, driver call, programmatic dependent launch |
//! | [`knobs`] | the routed-expert kernel knobs and the launch plan they give |
//! | [`hip`] | the `device/hip/*.hip` sources, compiled at run time by NVRTC |
//! | [`bench`] | `strata bench`: kernels against the device copy bandwidth |
//! | [`bench_decode`] | `strata bench decode`: the decode loop's speed (tg, windows, speculation, prefill) |
//! | [`gguf`] | GGUF reader (validating, memory-mapped) and writer |
//! | [`mapped`] | pinned device-mapped host memory, `copy_from_mapped_multi` |
//! | [`parity`] | random cases, cross-backend `memcmp`, NMSE against float64 |
//! | [`tokenizer`] | text to token ids and back, from a GGUF file's `tokenizer.ggml.*` vocabulary |

pub mod backend;
pub mod bench;
pub mod bench_decode;
pub mod cpu;
pub mod cuda;
pub mod error;
pub mod gpu;
pub mod hip;
pub mod knobs;
pub mod launch;
pub mod lookup;
pub mod mapped;
pub mod model;
pub mod ops;
pub mod parity;
pub mod reference;
pub mod step;
pub mod generate;
pub mod tokenizer;

pub use backend::{Backend, ExpertTensor, FloatWeights, MoeOut, MoeWindow, Variant, Weights};
pub use error::{Error, Result};
pub mod gguf;
