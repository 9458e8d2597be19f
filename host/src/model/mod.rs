//! Model architectures: what a GGUF file of each architecture means (`../shared/docs/MODELS.md`),
//! as a configuration, a set of tensors and the op list of one decode step.
//!
//! | module | what |
//! |---|---|
//! | [`config`] | the hyper-parameters of a qwen3moe file |
//! | [`synth`] | random-weight models of any shape, written as GGUF (`strata synth`, the built-in model) |
//! | [`synth_hybrid`] | what a synthetic qwen35moe file adds: GDN and gated attention layers, shared experts, MTP |
//! | [`vocab`] | the synthetic GPT-2-style byte-level vocabulary synthetic models carry |
pub mod config;
pub mod qwen3moe;
pub mod synth;
pub mod synth_hybrid;
pub mod vocab;

pub use config::Qwen3MoeConfig;
pub use qwen3moe::Qwen3Moe;
