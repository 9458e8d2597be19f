//! Strata's host side: the backends every kernel runs on, behind one trait, and the parity
//! suite that proves them identical.
//!
//! | module | what |
//! |---|---|
//! | [`backends`] | the [`Backend`] trait, the shape checks every backend shares, and the backends: `cpu` (the gpu-shared replicas, multi-threaded), `gpu` (a CUDA driver context and module, what `cuda` and `hip` share), `cuda` (the Rust PTX from `device/`), `hip` (the `device/hip/*.hip` sources, compiled at run time by NVRTC), `launch` (one kernel launch), `knobs` (the routed-expert kernel knobs and their launch plan), `mapped` (pinned device-mapped host memory) |
//! | [`model`] | a GGUF file as a model: config, weights, one module per architecture building the step's op list |
//! | [`step`] | the decode step: the op list, and the executors that run it (`cpu`, `gpu`) |
//! | [`ops`] | the step's kernel families beyond the [`Backend`] trait (attention, norms, routing, Gated DeltaNet, speculation) on each backend |
//! | [`generate`] | the decode loop: prompt, speculation, stopping |
//! | [`bench`] | `strata bench`: kernels against the device copy bandwidth (`kernels`), the decode loop's speed (`decode`) |
//! | [`gguf`] | GGUF reader (validating, memory-mapped) and writer |
//! | [`parity`] | random cases, cross-backend `memcmp`, NMSE against float64 |
//! | [`tokenizer`] | text to token ids and back, from a GGUF file's `tokenizer.ggml.*` vocabulary |

pub mod backends;
pub mod bench;
pub mod error;
pub mod lookup;
pub mod model;
pub mod ops;
pub mod parity;
pub mod reference;
pub mod step;
pub mod generate;
pub mod tokenizer;

pub use backends::{Backend, ExpertTensor, FloatWeights, MoeOut, MoeWindow, Variant, Weights};
pub use error::{Error, Result};
pub mod gguf;
