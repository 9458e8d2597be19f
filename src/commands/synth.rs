//! `strata synth`: a random-weight qwen3moe or qwen35moe model of any shape and formats, written
//! as GGUF (docs/synth.md).
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::ValueEnum;
use indicatif::{ProgressBar, ProgressStyle};
use strata_host::gguf::GgmlType;
use strata_host::model::synth::{self, SynthSpec};
use strata_host::model::vocab;

#[derive(Clone, Copy, Debug, PartialEq, ValueEnum)]
pub enum Arch {
    /// Qwen3-MoE (MODELS.md section 1).
    Qwen3moe,
    /// Qwen3.5-MoE hybrids: Gated DeltaNet and gated attention layers, a shared expert, an MTP
    /// block (MODELS.md section 2); written without a vocabulary.
    Qwen35moe,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum Preset {
    /// qwen3moe: 4 layers, n_embd 256, 4/2 heads of 64, 8 experts top-2 of 128, 1248 tokens.
    /// qwen35moe: the same trunk as GDN, attention, GDN, attention, with a shared expert and an
    /// MTP block, 1024 token ids. Both decode fast on the CPU.
    Tiny,
    /// qwen3moe only: Qwen3-30B-A3B's shapes: 48 layers, n_embd 2048, 32/4 heads of 128, 128
    /// experts top-8 of 768, 151936 tokens (about 15 GB).
    #[value(name = "30b-a3b")]
    Qwen3_30bA3b,
    /// qwen35moe only: Qwen3.5-35B-A3B's shapes: 40 layers (every 4th full attention), n_embd
    /// 2048, 16/2 heads of 256, GDN 16 key / 32 value heads of 128, 256 experts top-8 of 512, a
    /// shared expert of 512, an MTP block, 248320 token ids.
    #[value(name = "35b-a3b")]
    Qwen35_35bA3b,
}

fn format_help() -> String {
    let names: Vec<&str> = GgmlType::ALL.iter().map(|t| t.name()).collect();
    names.join(", ")
}

fn parse_format(s: &str) -> Result<GgmlType, String> {
    GgmlType::from_name(s).ok_or_else(|| format!("unknown format `{s}` (one of {})", format_help()))
}

fn parse_count(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(n) if n >= 1 && n <= u32::MAX as usize => Ok(n),
        _ => Err(format!("`{s}` is not a whole number between 1 and {}", u32::MAX)),
    }
}

#[derive(clap::Args)]
pub struct Args {
    /// The GGUF file to write (replaced if it exists).
    #[arg(long)]
    pub out: PathBuf,
    /// The architecture to write.
    #[arg(long, value_enum, default_value = "qwen3moe")]
    pub arch: Arch,
    /// The shapes and formats to start from; the options below change them.
    #[arg(long, value_enum, default_value = "tiny")]
    pub preset: Preset,
    /// Transformer layers (block_count).
    #[arg(long, value_name = "N", value_parser = parse_count)]
    pub layers: Option<usize>,
    /// Embedding length (n_embd): the input length of q/k/v, the router and the experts' gate/up,
    /// so a multiple of their formats' blocks (256 for the K and IQ formats, 32 for Q8_0/IQ4_NL).
    #[arg(long, value_name = "N", value_parser = parse_count)]
    pub embd: Option<usize>,
    /// Query heads (a multiple of --kv-heads).
    #[arg(long, value_name = "N", value_parser = parse_count)]
    pub heads: Option<usize>,
    /// Key/value heads.
    #[arg(long, value_name = "N", value_parser = parse_count)]
    pub kv_heads: Option<usize>,
    /// Length of one head (even: RoPE rotates pairs); heads x head-dim is attn_output's input.
    #[arg(long, value_name = "N", value_parser = parse_count)]
    pub head_dim: Option<usize>,
    /// Routed experts per layer.
    #[arg(long, value_name = "N", value_parser = parse_count)]
    pub experts: Option<usize>,
    /// Experts used per token (at most --experts).
    #[arg(long, value_name = "N", value_parser = parse_count)]
    pub used: Option<usize>,
    /// Rows of each expert's gate/up (expert_feed_forward_length): down's input length, so a
    /// multiple of --down's block.
    #[arg(long, value_name = "N", value_parser = parse_count)]
    pub ff: Option<usize>,
    /// Vocabulary size (rows of the embedding and the head); with a vocabulary at least 259, and
    /// beyond the tokens the built-in text teaches, filled with unused [PAD<id>] tokens.
    #[arg(long, value_name = "N", value_parser = parse_count)]
    pub vocab: Option<usize>,
    /// Training context length written to the file (context_length).
    #[arg(long, value_name = "N", value_parser = parse_count)]
    pub ctx: Option<usize>,
    #[arg(long, value_name = "FMT", value_parser = parse_format, help = format!("Format of the experts' gate and up matrices: {}", format_help()))]
    pub gu: Option<GgmlType>,
    /// Format of the experts' down matrices.
    #[arg(long, value_name = "FMT", value_parser = parse_format)]
    pub down: Option<GgmlType>,
    /// Format of attn_q, attn_k, attn_v and attn_output.
    #[arg(long, value_name = "FMT", value_parser = parse_format)]
    pub attn: Option<GgmlType>,
    /// Format of the router (ffn_gate_inp).
    #[arg(long, value_name = "FMT", value_parser = parse_format)]
    pub router: Option<GgmlType>,
    /// Format of the token embedding.
    #[arg(long = "embd-format", value_name = "FMT", value_parser = parse_format)]
    pub embd_format: Option<GgmlType>,
    /// Format of the output head (ignored with --tied).
    #[arg(long, value_name = "FMT", value_parser = parse_format)]
    pub head: Option<GgmlType>,
    /// No output.weight: the head is the token embedding.
    #[arg(long)]
    pub tied: bool,
    /// No vocabulary: tokenizer.ggml.model "none" and qwen3moe.vocab_size (prompts then go in as
    /// token ids).
    #[arg(long)]
    pub no_vocab: bool,
    /// Seed of the random weights: the same seed and shapes give the same bytes.
    #[arg(long)]
    pub seed: Option<u64>,
    /// qwen35moe: dimensions of an attention head that RoPE rotates (even, at most --head-dim;
    /// the rope sections are spread over them).
    #[arg(long, value_name = "N", value_parser = parse_count)]
    pub rope_dims: Option<usize>,
    /// qwen35moe: every N-th layer is full (gated) attention, the others Gated DeltaNet.
    #[arg(long, value_name = "N", value_parser = parse_count)]
    pub attn_every: Option<usize>,
    /// qwen35moe: Gated DeltaNet key heads (ssm.group_count).
    #[arg(long, value_name = "N", value_parser = parse_count)]
    pub k_heads: Option<usize>,
    /// qwen35moe: Gated DeltaNet value heads (ssm.time_step_rank), a multiple of --k-heads.
    #[arg(long, value_name = "N", value_parser = parse_count)]
    pub v_heads: Option<usize>,
    /// qwen35moe: Gated DeltaNet head size (ssm.state_size), a multiple of 32.
    #[arg(long, value_name = "N", value_parser = parse_count)]
    pub state_size: Option<usize>,
    /// qwen35moe: conv taps of the Gated DeltaNet layers (ssm.conv_kernel).
    #[arg(long, value_name = "N", value_parser = parse_count)]
    pub conv_taps: Option<usize>,
    /// qwen35moe: rows of the shared expert's gate/up (expert_shared_feed_forward_length).
    #[arg(long, value_name = "N", value_parser = parse_count)]
    pub shared_ff: Option<usize>,
}

impl Args {
    /// The preset with the options applied; an error for a preset of the other architecture.
    pub fn spec(&self) -> Result<SynthSpec, String> {
        let mut s = match (self.arch, self.preset) {
            (Arch::Qwen3moe, Preset::Tiny) => SynthSpec::tiny(),
            (Arch::Qwen3moe, Preset::Qwen3_30bA3b) => SynthSpec::qwen3_30b_a3b(),
            (Arch::Qwen35moe, Preset::Tiny) => SynthSpec::qwen35moe_tiny(),
            (Arch::Qwen35moe, Preset::Qwen35_35bA3b) => SynthSpec::qwen35moe_35b_a3b(),
            (arch, preset) => {
                let name = |v: Option<clap::builder::PossibleValue>| v.map_or(String::new(), |v| v.get_name().to_string());
                return Err(format!(
                    "there is no {} preset for {} (tiny and 30b-a3b for qwen3moe; tiny and 35b-a3b for qwen35moe)",
                    name(preset.to_possible_value()),
                    name(arch.to_possible_value())
                ));
            }
        };
        let c = &mut s.config;
        let counts = [
            (self.layers, &mut c.n_layer),
            (self.embd, &mut c.n_embd),
            (self.heads, &mut c.n_head),
            (self.kv_heads, &mut c.n_head_kv),
            (self.head_dim, &mut c.head_dim),
            (self.experts, &mut c.n_expert),
            (self.used, &mut c.n_expert_used),
            (self.ff, &mut c.n_ff_exp),
            (self.vocab, &mut c.n_vocab),
            (self.ctx, &mut c.n_ctx_train),
        ];
        for (set, field) in counts {
            if let Some(n) = set {
                *field = n;
            }
        }
        let f = &mut s.formats;
        let formats = [
            (self.gu, &mut f.gu),
            (self.down, &mut f.down),
            (self.attn, &mut f.attn),
            (self.router, &mut f.router),
            (self.embd_format, &mut f.embd),
            (self.head, &mut f.head),
        ];
        for (set, field) in formats {
            if let Some(t) = set {
                *field = t;
            }
        }
        f.tied_head |= self.tied;
        match s.hybrid.as_mut() {
            Some(h) => {
                let counts = [
                    (self.attn_every, &mut h.full_attention_interval),
                    (self.k_heads, &mut h.n_k_heads),
                    (self.v_heads, &mut h.n_v_heads),
                    (self.state_size, &mut h.d_state),
                    (self.conv_taps, &mut h.d_conv),
                    (self.shared_ff, &mut h.n_ff_shexp),
                ];
                for (set, field) in counts {
                    if let Some(n) = set {
                        *field = n;
                    }
                }
                if let Some(n) = self.rope_dims {
                    s.config.n_rot = n;
                    // Text positions use the three components alike: spread the pairs over them.
                    let pairs = (n / 2) as u32;
                    h.rope_sections = [pairs - 2 * (pairs / 3), pairs / 3, pairs / 3, 0];
                }
            }
            None => {
                let hybrid_only = [self.rope_dims, self.attn_every, self.k_heads, self.v_heads, self.state_size, self.conv_taps, self.shared_ff];
                if hybrid_only.iter().any(Option::is_some) {
                    return Err("--rope-dims, --attn-every, --k-heads, --v-heads, --state-size, --conv-taps and --shared-ff are qwen35moe options (add --arch qwen35moe)".into());
                }
                // qwen3moe rotates whole heads.
                s.config.n_rot = s.config.head_dim;
            }
        }
        s.vocab &= !self.no_vocab;
        if let Some(seed) = self.seed {
            s.seed = seed;
        }
        Ok(s)
    }
}

/// What the file holds, in one paragraph.
fn describe(s: &SynthSpec, bytes: u64) -> String {
    let (c, f) = (&s.config, &s.formats);
    let vocab = if s.vocab {
        format!("{} tokens ({} learned)", c.n_vocab, vocab::synthetic(c.n_vocab).learned())
    } else {
        format!("{} ids, no vocabulary", c.n_vocab)
    };
    let head = if f.tied_head { "tied to the embedding".to_string() } else { f.head.name().to_string() };
    let hybrid = s.hybrid.as_ref().map_or(String::new(), |h| {
        format!(
            "; full attention every {} layers, the others Gated DeltaNet ({} key / {} value heads of {}, {} conv taps), shared expert {}, {} rotated dimensions{}",
            h.full_attention_interval,
            h.n_k_heads,
            h.n_v_heads,
            h.d_state,
            h.d_conv,
            h.n_ff_shexp,
            c.n_rot,
            if h.mtp { ", an MTP block" } else { "" }
        )
    });
    format!(
        "{}, {} layers, n_embd {}, {}/{} heads of {}, {} experts ({} used) of {}, vocabulary {vocab}, context {}{hybrid}\n\
         formats: gate/up {}, down {}, attention {}, router {}, embedding {}, head {head}, norms F32\n\
         {bytes} bytes ({:.2} GiB), seed {}",
        s.arch(),
        c.n_layer,
        c.n_embd,
        c.n_head,
        c.n_head_kv,
        c.head_dim,
        c.n_expert,
        c.n_expert_used,
        c.n_ff_exp,
        c.n_ctx_train,
        f.gu.name(),
        f.down.name(),
        f.attn.name(),
        f.router.name(),
        f.embd.name(),
        bytes as f64 / (1u64 << 30) as f64,
        s.seed
    )
}

pub fn run(args: &Args) -> anyhow::Result<ExitCode> {
    let spec = match args.spec() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("strata synth: error: {e}");
            return Ok(ExitCode::from(2));
        }
    };
    if let Err(e) = spec.validate() {
        eprintln!("strata synth: error: {e}");
        return Ok(ExitCode::from(2));
    }
    let total = spec.file_len().map_err(anyhow::Error::msg)?;
    let bar = ProgressBar::new(total);
    bar.set_style(ProgressStyle::with_template("{bar:40} {bytes}/{total_bytes} {bytes_per_sec} eta {eta}").expect("a valid template"));
    let written = synth::write(&spec, &args.out, &mut |n| bar.inc(n)).with_context(|| format!("cannot write {}", args.out.display()))?;
    bar.finish_and_clear();
    println!("wrote {}: {}", args.out.display(), describe(&spec, written));
    Ok(ExitCode::SUCCESS)
}
