//! Launch bounds and geometry of speculative decoding's verify step.
use super::{Bounds, MMVQ_MAX_ROWS};

/// The most rows of a verify window: the last accepted token and up to 7 drafts, one
/// `mmvq` launch's activation rows.
pub const SPEC_MAX_TOKENS: usize = MMVQ_MAX_ROWS;

/// This family's kernels (joined into [`super::BOUNDS`]). `spec_accept` is one warp of one
/// block; its thread 0 does the work.
pub const BOUNDS: [Bounds; 1] = [Bounds { kernel: "spec_accept", threads: 32, min_blocks: 1, smem_bytes: 0 }];
