//! The hyper-parameters of a model (MODELS.md sections 1 and 2): everything the step's op list
//! and the buffers are sized from.

/// Shapes and constants of a qwen3moe or qwen35moe model. `head_dim` is the key/value length
/// of the attention layers (the file's `attention.key_length`, defaulting to `n_embd / n_head`).
#[derive(Clone, Debug, PartialEq)]
pub struct ModelConfig {
    /// Trunk layers (an MTP block after them is not counted).
    pub n_layer: usize,
    pub n_embd: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    /// Dimensions of a head that RoPE rotates (NEOX pairing); the rest pass through.
    pub n_rot: usize,
    pub n_expert: usize,
    pub n_expert_used: usize,
    /// Rows of each expert's gate/up matrix (`expert_feed_forward_length`).
    pub n_ff_exp: usize,
    pub n_vocab: usize,
    /// The training context (`context_length`): the default `--ctx` is capped by it.
    pub n_ctx_train: usize,
    pub rope_freq_base: f32,
    pub rms_eps: f32,
    /// What a qwen35moe file adds; `None` for qwen3moe.
    pub hybrid: Option<HybridConfig>,
}

/// The Gated DeltaNet layers and shared experts of a qwen35moe model.
#[derive(Clone, Debug, PartialEq)]
pub struct HybridConfig {
    /// Per trunk layer: a Gated DeltaNet layer (else gated attention).
    pub recurrent: Vec<bool>,
    /// Conv taps (`ssm.conv_kernel`), key and value head size (`ssm.state_size`), value heads
    /// (`ssm.time_step_rank`), key heads (`ssm.group_count`).
    pub d_conv: usize,
    pub d_state: usize,
    pub n_v_heads: usize,
    pub n_k_heads: usize,
    /// Rows of the shared expert's gate/up (`expert_shared_feed_forward_length`).
    pub n_ff_shexp: usize,
    /// The file has an MTP block (`nextn_predict_layers` = 1), whose attention is layer
    /// `n_layer` of the caches.
    pub mtp: bool,
}

impl HybridConfig {
    /// Channels of the conv: q and k heads, then v heads.
    pub fn conv_channels(&self) -> usize {
        (2 * self.n_k_heads + self.n_v_heads) * self.d_state
    }

    /// Width of the value heads together (`ssm.inner_size`).
    pub fn inner(&self) -> usize {
        self.n_v_heads * self.d_state
    }

    /// The delta rule's shape for a window of `tokens` (0: the state alone).
    pub fn recur_shape(&self, tokens: usize) -> strata_gpu_shared::replica::gdn::RecurShape {
        strata_gpu_shared::replica::gdn::RecurShape { tokens, n_k: self.n_k_heads, n_v: self.n_v_heads, d: self.d_state }
    }
}

impl ModelConfig {
    /// Query heads per key/value head.
    pub fn gqa_group(&self) -> usize {
        self.n_head / self.n_head_kv
    }

    /// Layers the step's caches are indexed by: the trunk's, and the MTP block's after them.
    pub fn cache_layers(&self) -> usize {
        self.n_layer + usize::from(self.hybrid.as_ref().is_some_and(|h| h.mtp))
    }

    /// Trunk layers with a KV cache (every layer but the Gated DeltaNet ones).
    pub fn attention_layers(&self) -> usize {
        match &self.hybrid {
            Some(h) => h.recurrent.iter().filter(|&&r| !r).count(),
            None => self.n_layer,
        }
    }
}
