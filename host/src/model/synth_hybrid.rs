//! What a synthetic qwen35moe (Qwen3.5-MoE hybrid) file holds beyond a qwen3moe one: its extra
//! hyper-parameters ([`HybridShape`]), the tensors of its Gated DeltaNet layers, gated attention
//! layers, shared experts and MTP block, and its keys, with the names and shapes of MODELS.md
//! section 2 (`strata synth --arch qwen35moe`). The random values and the writing are
//! [`super::synth`]'s.
//!
//! Values that are not matrices get ranges that keep a random model sane: `ssm_a` (which holds
//! `-exp(A_log)`) in `[-1, -0.1]`, so the decay `g` is negative; `ssm_dt.bias` in `[-0.5, 0.5]`;
//! the conv taps as a matrix of `d_conv` inputs; the shared expert's gate as a row of `n_embd`
//! inputs. Norms are near 1 as stored (the converter's `+1` is already in a real file's values).
use super::config::ModelConfig;
use super::synth::{check_counts, matrix, norm, tensor, Init, SynthFormats, SynthTensor};
use crate::gguf::{GgmlType, GgufWriter, Value};

/// The qwen35moe hyper-parameters a qwen3moe config lacks.
#[derive(Clone, Debug, PartialEq)]
pub struct HybridShape {
    /// Rows of the shared expert's gate/up (`expert_shared_feed_forward_length`).
    pub n_ff_shexp: usize,
    /// `rope.dimension_sections`: four counts summing to the config's `n_rot / 2` (text positions use all
    /// three position components alike).
    pub rope_sections: [u32; 4],
    /// Gated DeltaNet: conv taps (`ssm.conv_kernel`), key (and value) head dimension
    /// (`ssm.state_size`), value heads (`ssm.time_step_rank`), key heads (`ssm.group_count`).
    pub d_conv: usize,
    pub d_state: usize,
    pub n_v_heads: usize,
    pub n_k_heads: usize,
    /// Every `full_attention_interval`-th layer is full (gated) attention; the others are GDN.
    pub full_attention_interval: usize,
    /// One MTP block after the trunk (`nextn_predict_layers = 1`).
    pub mtp: bool,
}

impl HybridShape {
    /// Whether trunk layer `i` is a Gated DeltaNet layer (MODELS.md section 2).
    pub fn recurrent(&self, i: usize) -> bool {
        (i + 1) % self.full_attention_interval != 0
    }

    /// Key and value widths of a GDN layer's q/k and v: `d_state` per head.
    fn widths(&self) -> (u64, u64) {
        ((self.d_state * self.n_k_heads) as u64, (self.d_state * self.n_v_heads) as u64)
    }

    /// The checks `SynthSpec::validate` adds for this architecture.
    pub fn validate(&self, c: &ModelConfig) -> Result<(), String> {
        let sizes = [
            ("shared expert feed-forward length", self.n_ff_shexp),
            ("conv kernel", self.d_conv),
            ("state size", self.d_state),
            ("value heads", self.n_v_heads),
            ("key heads", self.n_k_heads),
            ("full attention interval", self.full_attention_interval),
        ];
        check_counts(&sizes)?;
        if c.n_rot == 0 || c.n_rot % 2 != 0 || c.n_rot > c.head_dim {
            return Err(format!("rope dimension count {} must be even, in 2..={} (the head dimension)", c.n_rot, c.head_dim));
        }
        let sections: u64 = self.rope_sections.iter().map(|&s| s as u64).sum();
        if sections != c.n_rot as u64 / 2 {
            return Err(format!("rope sections {:?} sum to {sections}, not half the rope dimension count {}", self.rope_sections, c.n_rot));
        }
        if !self.n_v_heads.is_multiple_of(self.n_k_heads) {
            return Err(format!("{} value heads are not a multiple of {} key heads", self.n_v_heads, self.n_k_heads));
        }
        if !(0..c.n_layer).any(|i| !self.recurrent(i)) {
            return Err(format!("no full-attention layer among {} layers with interval {}", c.n_layer, self.full_attention_interval));
        }
        Ok(())
    }

    /// The tensors after the embedding and before the output norm: the trunk layers, then the
    /// MTP block (`blk.{n_layer}`).
    pub(super) fn layer_tensors(&self, c: &ModelConfig, f: &SynthFormats) -> Vec<SynthTensor> {
        let mut out = Vec::new();
        for l in 0..c.n_layer {
            if self.recurrent(l) {
                out.extend(self.gdn(l, c, f));
            } else {
                out.extend(self.attention(l, c, f));
            }
            out.extend(self.ffn(l, c, f));
        }
        if self.mtp {
            let l = c.n_layer;
            let embd = c.n_embd as u64;
            out.extend(self.attention(l, c, f));
            out.extend(self.ffn(l, c, f));
            let name = |t: &str| format!("blk.{l}.nextn.{t}.weight");
            out.extend([
                matrix(name("eh_proj"), &[2 * embd, embd], f.attn),
                norm(name("enorm"), embd),
                norm(name("hnorm"), embd),
            ]);
        }
        out
    }

    /// A Gated DeltaNet layer's mixer tensors and its input norm.
    fn gdn(&self, l: usize, c: &ModelConfig, f: &SynthFormats) -> Vec<SynthTensor> {
        let embd = c.n_embd as u64;
        let (kd, vd) = self.widths();
        let (n_v, cd) = (self.n_v_heads as u64, 2 * kd + vd);
        let name = |t: &str| format!("blk.{l}.{t}.weight");
        vec![
            norm(name("attn_norm"), embd),
            matrix(name("attn_qkv"), &[embd, cd], f.attn),
            matrix(name("attn_gate"), &[embd, vd], f.attn),
            tensor(name("ssm_conv1d"), &[self.d_conv as u64, cd], GgmlType::F32, Init::Matrix { k: self.d_conv as u64 }),
            tensor(format!("blk.{l}.ssm_dt.bias"), &[n_v], GgmlType::F32, Init::Uniform { lo: -0.5, hi: 0.5 }),
            tensor(format!("blk.{l}.ssm_a"), &[n_v], GgmlType::F32, Init::Uniform { lo: -1.0, hi: -0.1 }),
            matrix(name("ssm_beta"), &[embd, n_v], f.router),
            matrix(name("ssm_alpha"), &[embd, n_v], f.router),
            norm(name("ssm_norm"), self.d_state as u64),
            matrix(name("ssm_out"), &[vd, embd], f.attn),
        ]
    }

    /// A gated attention layer's tensors and its input norm (`attn_q` holds each head's query
    /// and gate).
    fn attention(&self, l: usize, c: &ModelConfig, f: &SynthFormats) -> Vec<SynthTensor> {
        let [embd, hd] = [c.n_embd, c.head_dim].map(|n| n as u64);
        let (q_dim, kv_dim) = (hd * c.n_head as u64, hd * c.n_head_kv as u64);
        let name = |t: &str| format!("blk.{l}.{t}.weight");
        vec![
            norm(name("attn_norm"), embd),
            matrix(name("attn_q"), &[embd, 2 * q_dim], f.attn),
            matrix(name("attn_k"), &[embd, kv_dim], f.attn),
            matrix(name("attn_v"), &[embd, kv_dim], f.attn),
            matrix(name("attn_output"), &[q_dim, embd], f.attn),
            norm(name("attn_q_norm"), hd),
            norm(name("attn_k_norm"), hd),
        ]
    }

    /// The routed and shared experts and their input norm, as every layer has them.
    fn ffn(&self, l: usize, c: &ModelConfig, f: &SynthFormats) -> Vec<SynthTensor> {
        let [embd, ff, experts, shexp] = [c.n_embd, c.n_ff_exp, c.n_expert, self.n_ff_shexp].map(|n| n as u64);
        let name = |t: &str| format!("blk.{l}.{t}.weight");
        vec![
            norm(name("post_attention_norm"), embd),
            matrix(name("ffn_gate_inp"), &[embd, experts], f.router),
            matrix(name("ffn_gate_exps"), &[embd, ff, experts], f.gu),
            matrix(name("ffn_up_exps"), &[embd, ff, experts], f.gu),
            matrix(name("ffn_down_exps"), &[ff, embd, experts], f.down),
            tensor(name("ffn_gate_inp_shexp"), &[embd], GgmlType::F32, Init::Matrix { k: embd }),
            matrix(name("ffn_gate_shexp"), &[embd, shexp], f.attn),
            matrix(name("ffn_up_shexp"), &[embd, shexp], f.attn),
            matrix(name("ffn_down_shexp"), &[shexp, embd], f.attn),
        ]
    }

    /// The qwen35moe keys (the generic ones included) for trunk config `c`.
    pub(super) fn keys(&self, c: &ModelConfig, w: &mut GgufWriter) {
        let u32_ = |n: usize| Value::U32(n as u32);
        let k = |key: &str| format!("qwen35moe.{key}");
        let blocks = c.n_layer + self.mtp as usize;
        w.meta(&k("context_length"), u32_(c.n_ctx_train))
            .meta(&k("embedding_length"), u32_(c.n_embd))
            .meta(&k("block_count"), u32_(blocks))
            .meta(&k("feed_forward_length"), u32_(c.n_ff_exp * c.n_expert_used))
            .meta(&k("expert_feed_forward_length"), u32_(c.n_ff_exp))
            .meta(&k("expert_shared_feed_forward_length"), u32_(self.n_ff_shexp))
            .meta(&k("expert_count"), u32_(c.n_expert))
            .meta(&k("expert_used_count"), u32_(c.n_expert_used))
            .meta(&k("attention.head_count"), u32_(c.n_head))
            .meta(&k("attention.head_count_kv"), u32_(c.n_head_kv))
            .meta(&k("attention.key_length"), u32_(c.head_dim))
            .meta(&k("attention.value_length"), u32_(c.head_dim))
            .meta(&k("attention.layer_norm_rms_epsilon"), Value::F32(c.rms_eps))
            .meta(&k("rope.freq_base"), Value::F32(c.rope_freq_base))
            .meta(&k("rope.dimension_count"), u32_(c.n_rot))
            .meta(&k("rope.dimension_sections"), Value::Array(self.rope_sections.iter().map(|&s| Value::I32(s as i32)).collect()))
            .meta(&k("ssm.conv_kernel"), u32_(self.d_conv))
            .meta(&k("ssm.inner_size"), u32_(self.d_state * self.n_v_heads))
            .meta(&k("ssm.state_size"), u32_(self.d_state))
            .meta(&k("ssm.time_step_rank"), u32_(self.n_v_heads))
            .meta(&k("ssm.group_count"), u32_(self.n_k_heads))
            .meta(&k("full_attention_interval"), u32_(self.full_attention_interval));
        if self.mtp {
            w.meta(&k("nextn_predict_layers"), u32_(1));
        }
    }
}
