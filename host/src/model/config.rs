//! The hyper-parameters of a `qwen3moe` model (MODELS.md section 1): everything the step's op
//! list and the buffers are sized from.

/// Shapes and constants of a qwen3moe model. `head_dim` is the key/value length (the file's
/// `attention.key_length`, defaulting to `n_embd / n_head`).
#[derive(Clone, Debug, PartialEq)]
pub struct Qwen3MoeConfig {
    pub n_layer: usize,
    pub n_embd: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    pub n_expert: usize,
    pub n_expert_used: usize,
    /// Rows of each expert's gate/up matrix (`expert_feed_forward_length`).
    pub n_ff_exp: usize,
    pub n_vocab: usize,
    /// The training context (`context_length`): the default `--ctx` is capped by it.
    pub n_ctx_train: usize,
    pub rope_freq_base: f32,
    pub rms_eps: f32,
}

impl Qwen3MoeConfig {
    /// Query heads per key/value head.
    pub fn gqa_group(&self) -> usize {
        self.n_head / self.n_head_kv
    }
}
