//! Strata's host side: the backends every kernel runs on, behind one trait, and the parity
//! suite that proves them identical.
//!
//! | module | what |
//! |---|---|
//! | [`backends`] | the [`Backend`] trait and the backends (`cpu`, `cuda`, `hip`), their launches and the kernel knobs |
//! | [`model`] | a GGUF file as a model: config, weights, the step's op list per architecture |
//! | [`step`] | the decode step: the op list, and the executors that run it (`cpu`, `gpu`) |
//! | [`ops`] | the step's kernel families beyond the [`Backend`] trait, on each backend |
//! | [`generate`] | the decode loop: prompt, speculation, stopping |
//! | [`bench`] | `strata bench`: kernels against the copy bandwidth, the decode loop's speed |
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
