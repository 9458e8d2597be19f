//! One module per kernel family; each exports its `extern "ptx-kernel"` entries unmangled.
pub mod attention;
pub mod blocks;
pub mod copy;
pub mod embed;
pub mod expdec_down;
pub mod expdec_gu;
pub mod expdec_stage;
pub mod head;
pub mod matvec;
pub mod mmvq;
pub mod norm;
pub mod moe;
pub mod quantize_q8_0;
pub mod quantize_q8_1;
pub mod route;
pub mod sample;
pub mod spec;
