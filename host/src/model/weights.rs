//! The weights a decode step reads, whatever the architecture: matrices as the file stores them
//! (borrowed from the memory map, or re-ordered rows where an architecture needs them apart),
//! and vectors prepared at load time (norms widened to f32, repeated biases, conv taps).
use std::sync::Arc;

use crate::gguf::{GgmlType, GgufFile};

/// Where a weight's bytes are.
#[derive(Clone, Debug)]
pub enum Data {
    /// A byte range of the model file, as stored.
    File { offset: usize, len: usize },
    /// Rows of the file re-ordered at load time (whole rows, so the bytes are the file's).
    Rows(Arc<Vec<u8>>),
    /// A vector prepared at load time (norms widened to f32, repeated biases).
    F32(Vec<f32>),
}

/// One weight of the step: `rows` x `cols` values of `ty` (ggml's ne1 x ne0; experts stack
/// `n_expert` such matrices).
#[derive(Clone, Debug)]
pub struct Weight {
    pub name: String,
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
    pub n_expert: usize,
    pub data: Data,
}

impl Weight {
    /// The values of a prepared vector (a norm, a repeated bias, conv taps).
    pub fn f32s(&self) -> &[f32] {
        match &self.data {
            Data::F32(v) => v,
            _ => unreachable!("{} is a matrix, not a prepared vector", self.name),
        }
    }

    /// The bytes of a matrix, as the file stores them (`file`: the model file's bytes).
    pub fn matrix<'a>(&'a self, file: &'a [u8]) -> &'a [u8] {
        match &self.data {
            Data::File { offset, len } => &file[*offset..*offset + *len],
            Data::Rows(b) => b,
            Data::F32(_) => unreachable!("{} is a prepared vector, not a matrix", self.name),
        }
    }

    pub fn bytes(&self) -> usize {
        match &self.data {
            Data::File { len, .. } => *len,
            Data::Rows(b) => b.len(),
            Data::F32(v) => 4 * v.len(),
        }
    }
}

/// Index of a weight in [`Weights::list`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct WeightId(pub usize);

/// A softmax-attention mixer: qwen3moe's, or qwen35moe's gated one (`gate`: the rows of
/// `attn_q` that are each head's output gate, apart from its query rows).
#[derive(Clone, Debug)]
pub struct AttnWeights {
    pub proj: QkvProj,
    pub gate: Option<WeightId>,
    pub q_norm: WeightId,
    pub k_norm: WeightId,
    pub o: WeightId,
}

/// The q, k and v projections. Biases (optional in the file) are repeated
/// [`crate::step::MAX_WINDOW`] times.
#[derive(Clone, Debug)]
pub enum QkvProj {
    /// One matrix of q's rows, then k's, then v's (q, k and v of one type: one matvec), and one
    /// bias of q's, k's and v's values per row.
    Fused { qkv: WeightId, bias: Option<WeightId> },
    /// Three matrices (their types differ), each with its bias.
    Split { q: WeightId, k: WeightId, v: WeightId, bias: [Option<WeightId>; 3] },
}

impl QkvProj {
    /// The projection matrices.
    pub fn matrices(&self) -> Vec<WeightId> {
        match *self {
            QkvProj::Fused { qkv, .. } => vec![qkv],
            QkvProj::Split { q, k, v, .. } => vec![q, k, v],
        }
    }
}

/// A Gated DeltaNet mixer (MODELS.md section 2).
#[derive(Clone, Debug)]
pub struct DeltaNetWeights {
    /// `attn_qkv` (q, k, v heads of the conv input) and `attn_gate` (the output gate `z`).
    pub qkv: WeightId,
    pub z: WeightId,
    /// `ssm_beta`, `ssm_alpha`: one row per value head.
    pub beta: WeightId,
    pub alpha: WeightId,
    /// `ssm_conv1d` taps (prepared f32, `d_conv` per channel), `ssm_dt.bias`, `ssm_a`, `ssm_norm`.
    pub conv: WeightId,
    pub dt_bias: WeightId,
    pub a: WeightId,
    pub norm: WeightId,
    pub out: WeightId,
}

/// What mixes positions in a layer.
#[derive(Clone, Debug)]
pub enum Mixer {
    Attention(AttnWeights),
    DeltaNet(DeltaNetWeights),
}

/// A shared expert with its scalar sigmoid gate (`ffn_gate_inp_shexp`, one row).
#[derive(Clone, Debug)]
pub struct SharedExpert {
    pub gate_inp: WeightId,
    pub gate: WeightId,
    pub up: WeightId,
    pub down: WeightId,
}

/// The weights of one layer.
#[derive(Clone, Debug)]
pub struct LayerWeights {
    pub attn_norm: WeightId,
    pub mixer: Mixer,
    /// `ffn_norm` (qwen3moe) or `post_attention_norm` (qwen35moe).
    pub ffn_norm: WeightId,
    pub router: WeightId,
    pub gate: WeightId,
    pub up: WeightId,
    pub down: WeightId,
    pub shared: Option<SharedExpert>,
}

/// The multi-token-prediction block of a qwen35moe file (`blk.{n_layer}`, MODELS.md section 2):
/// a full gated-attention layer fed `eh_proj · [enorm(embedding); hnorm(hidden)]`, with its own
/// head norm and head (the trunk's where the file has none).
#[derive(Clone, Debug)]
pub struct MtpWeights {
    pub layer: LayerWeights,
    pub eh_proj: WeightId,
    pub enorm: WeightId,
    pub hnorm: WeightId,
    /// `nextn.embed_tokens`, or the trunk's `token_embd`.
    pub embed: WeightId,
    /// `nextn.shared_head_norm` and `nextn.shared_head_head`, or the trunk's output norm and head.
    pub head_norm: WeightId,
    pub head: WeightId,
}

/// Every weight a step reads, with the file they come from.
pub struct Weights {
    pub file: Arc<GgufFile>,
    pub list: Vec<Weight>,
    pub token_embd: WeightId,
    pub output_norm: WeightId,
    /// `output`, or `token_embd` when the file has no head (tied).
    pub output: WeightId,
    pub layers: Vec<LayerWeights>,
    /// The MTP block, where the file has one.
    pub mtp: Option<MtpWeights>,
}

impl Weights {
    pub fn get(&self, id: WeightId) -> &Weight {
        &self.list[id.0]
    }

    /// The bytes of a matrix, as the file stores them.
    pub fn data(&self, id: WeightId) -> &[u8] {
        self.get(id).matrix(self.file.bytes())
    }

    /// A prepared vector (a norm, a repeated bias, conv taps).
    pub fn f32s(&self, id: WeightId) -> &[f32] {
        self.get(id).f32s()
    }

    /// The trunk's layers, then the MTP block's.
    pub fn all_layers(&self) -> impl Iterator<Item = &LayerWeights> {
        self.layers.iter().chain(self.mtp.as_ref().map(|m| &m.layer))
    }

    /// Bytes of all weights.
    pub fn total_bytes(&self) -> usize {
        self.list.iter().map(Weight::bytes).sum()
    }
}
