//! The kernel knobs (the routed-expert kernels', and the attention chunk's blocks a SM): one
//! struct, settable from the environment (read once, at the first backend opened) and from the
//! command line (`strata --knob NAME=VALUE`), and the launch plan the expert knobs give for a
//! layer shape and a window.
//!
//! The defaults are what `strata bench experts` and `strata bench decode` chose on the H200
//! (docs/kernels/moe.md and docs/kernels/attention.md have the numbers; docs/bench/ the whole
//! tables).
use strata_gpu_shared::formats::WeightFormat;
use strata_gpu_shared::launch::{
    bounds, expdec_down_kernel, expdec_down_smem, expdec_gu_kernel, expdec_gu_pair_kernel, expdec_gu_pair_smem, expdec_gu_ring_bytes, expdec_gu_smem, expdec_gu_warp_rows_kernel, expdec_gu_w16_kernel, rows_per_block, expdec_down_block_rows, EXPDEC_DOWN_FORMATS,
    EXPDEC_DOWN_MAX_GROUPS, EXPDEC_DR, EXPDEC_DRB, EXPDEC_GU_FORMATS, EXPDEC_GU_MINB4_FORMATS, EXPDEC_MINB, EXPDEC_MINB4_MAX_DR, EXPDEC_MINB4_MAX_R,
    EXPDEC_PAIR, EXPDEC_R, EXPDEC_RB, MMVQ_WARPS, MOE_DOWN_ROWS, MOE_GU_ROWS,
};
use strata_gpu_shared::launch::attention::{attn_chunk_has_lean, attn_chunk_kernel};

/// Dynamic shared memory an EXPDEC launch may ask for (96 KiB; the backends opt the EXPDEC
/// entries in to it at load, which every device the PTX runs on allows: compute capability 8.0
/// and up lets a block have at least 99 KiB): shapes that need more run the default kernels.
/// IQ3_ST's signed codebook alone is 32 KiB of it.
pub const EXPDEC_SMEM_MAX: u32 = 96 * 1024;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelKnobs {
    /// `STRATA_EXPDEC`: EXPDEC gate/up (`expdec_gu_*`) instead of `moe_gu_*`.
    pub expdec: bool,
    /// `STRATA_EXPDEC_R`: gate/up weight rows per lane, 1 or 2; 0 picks by the rule: two where
    /// they replace the warps' row slots (`EXPDEC_WARP_ROWS`: IQ3_ST at 2 blocks a SM) in a
    /// launch whose 8-warp blocks give every SM two or more (windows), one elsewhere: a
    /// one-token window (which the pair and 16-warp entries take), `EXPDEC_WARPS=16` or
    /// `EXPDEC_PAIRS=2`, and the formats without row slots ([`Self::plan`]).
    pub r: u32,
    /// `STRATA_EXPDEC_RB`: gate/up rows per block, 32, 64 or 128; 0 picks by the minimum-blocks
    /// rule.
    pub rb: u32,
    /// `STRATA_EXPDEC_DOWN`: EXPDEC down (`expdec_down_*`) for IQ4_NL down weights, plain or
    /// tiled (opt-in).
    pub down: bool,
    /// `STRATA_EXPDEC_D20`: EXPDEC down for Q2_0 down weights.
    pub d20: bool,
    /// `STRATA_EXPDEC_DR`: down rows per lane, 1, 2 or 4.
    pub dr: u32,
    /// `STRATA_EXPDEC_DRB`: down rows per block, 16, 32, 64, 128 or 256 (rounded down to whole
    /// steps of the block's row slots x DR, at least one); 0 picks by the rule.
    pub drb: u32,
    /// `STRATA_EXPDEC_MINB`: the minimum resident blocks per SM the `expdec_gu_*` entry was
    /// compiled for (its launch bounds), 2 or 4.
    pub minb: u32,
    /// `STRATA_EXPDEC_DMINB`: the same for the `expdec_down_*` entry.
    pub dminb: u32,
    /// `STRATA_EXPDEC_MINBLK`: the minimum-blocks rule: the most rows per block that still
    /// launches at least this many blocks for the window's worst-case group count.
    pub minblk: u32,
    /// `STRATA_EXPDEC_WARPS`: warps of a gate/up block, 8 or 16 (`expdec_gu_*_r1_w16`: R = 1, an
    /// IQ format); 0 picks 16 where 8-warp blocks would not give every SM two ([`Self::plan`]).
    pub warps: u32,
    /// `STRATA_EXPDEC_PAIRS`: the pair gate/up entries (`expdec_gu_*_r1_p2`: each 32-row chunk
    /// over the two blocks of a cluster; R = 1, an IQ format, a backend with cluster entries):
    /// 0 never, 1 where the rule would pick 16-warp blocks ([`Self::plan`]), 2 always.
    pub pairs: u32,
    /// `STRATA_EXPDEC_WARP_ROWS`: for a gate/up format whose rows are whole 16-byte units
    /// (IQ3_ST), where the 8-warp entry of one row a lane at 2 blocks per SM runs (windows of
    /// several tokens), `_m2w`: each warp copies its own rows to shared memory, two ahead of the
    /// one it decodes, and starts on a row once it has landed, where they otherwise come from
    /// L2 (on by default: full windows of 4 and 8 1.3 % and 0.4 % faster on the H200).
    pub warp_rows: bool,
    /// `STRATA_ATTN_MINB`: the blocks a SM of the `attn_chunk` launches of bands above two
    /// heads of 128 values: 2 (`attn_chunk_128`), 4 (its lean twin `attn_chunk_128_m4`: the same
    /// loops at 64 registers; cuda on sm_90 only), or 0, the lean rule
    /// (`launch::attention::attn_lean_wanted`: 4 where more than two blocks a SM work, on a
    /// backend with the twin).
    pub attn_minb: u32,
    /// `STRATA_ATTN_FUSE`: a step whose contexts are one chunk launches `attn_prep` and the
    /// attention chunk as one kernel where the band and head size have the fused entry
    /// (`attn_prep_chunk_two_128`; `GpuBackend::prep_attention_kernel`), else as two (on by
    /// default; 0, the two launches everywhere, for comparing them in one process).
    pub attn_fuse: bool,
}

impl Default for KernelKnobs {
    fn default() -> Self {
        KernelKnobs { expdec: true, r: 0, rb: 0, down: false, d20: true, dr: 2, drb: 0, minb: 2, dminb: 4, minblk: 4096, warps: 0, pairs: 1, warp_rows: true, attn_minb: 0, attn_fuse: true }
    }
}

/// One knob: its name (the environment variable without `STRATA_`), what it takes, and what it
/// does, for `--help` and the error messages.
pub struct Knob {
    pub name: &'static str,
    pub values: &'static str,
    pub what: &'static str,
}

pub const KNOBS: [Knob; 15] = [
    Knob { name: "EXPDEC", values: "0|1", what: "EXPDEC gate/up kernels" },
    Knob { name: "EXPDEC_R", values: "0|1|2", what: "gate/up weight rows per lane (0: 2 for windows of a format with row slots, IQ3_ST; 1 elsewhere)" },
    Knob { name: "EXPDEC_RB", values: "0|32|64|128", what: "gate/up rows per block (0: minimum-blocks rule)" },
    Knob { name: "EXPDEC_DOWN", values: "0|1", what: "EXPDEC down for IQ4_NL (and its tiles, IQ4_NLT)" },
    Knob { name: "EXPDEC_D20", values: "0|1", what: "EXPDEC down for Q2_0" },
    Knob { name: "EXPDEC_DR", values: "1|2|4", what: "down rows per lane" },
    Knob { name: "EXPDEC_DRB", values: "0|16|32|64|128|256", what: "down rows per block (0: minimum-blocks rule)" },
    Knob { name: "EXPDEC_MINB", values: "2|4", what: "EXPDEC gate/up launch bounds: minimum blocks per SM (4 needs R=1 and an IQ format)" },
    Knob { name: "EXPDEC_DMINB", values: "2|4", what: "EXPDEC down launch bounds: minimum blocks per SM (4 needs DR<=2)" },
    Knob { name: "EXPDEC_MINBLK", values: "1..=1000000", what: "minimum-blocks rule: blocks a launch should reach" },
    Knob { name: "EXPDEC_WARPS", values: "0|8|16", what: "EXPDEC gate/up warps per block (16 needs R=1 and an IQ format; 0: 16 where 8 leaves SMs under two blocks)" },
    Knob { name: "EXPDEC_PAIRS", values: "0|1|2", what: "EXPDEC gate/up chunks split over a cluster's two blocks (cuda on sm_90+, R=1, an IQ format): 0 never, 1 where the rule picks 16 warps, 2 always" },
    Knob { name: "EXPDEC_WARP_ROWS", values: "0|1", what: "IQ3_ST gate/up in 8-warp blocks at R=1 MINB=2: each warp copies its rows to shared memory two ahead and decodes a row once it lands" },
    Knob { name: "ATTN_MINB", values: "0|2|4", what: "attention chunk blocks a SM for bands above two heads of 128 values (4: the lean entry, cuda on sm_90; 0: 4 where more than two blocks a SM work)" },
    Knob { name: "ATTN_FUSE", values: "0|1", what: "steps whose contexts are one chunk run attn_prep inside the attention launch (bands of two heads of 128 values)" },
];

impl KernelKnobs {
    /// Sets knob `name` (`EXPDEC_R`, case-insensitive, `STRATA_` prefix optional) from `value`;
    /// an unknown name or a value outside the knob's set is an error naming both.
    pub fn set(&mut self, name: &str, value: &str) -> Result<(), String> {
        let upper = name.trim().to_ascii_uppercase();
        let key = upper.strip_prefix("STRATA_").unwrap_or(&upper);
        let knob = KNOBS.iter().find(|k| k.name == key).ok_or_else(|| {
            format!("unknown kernel knob {name:?} (known: {})", KNOBS.iter().map(|k| k.name).collect::<Vec<_>>().join(", "))
        })?;
        let bad = || format!("STRATA_{}={value:?}: expected {}", knob.name, knob.values);
        let num = || value.trim().parse::<u32>().map_err(|_| bad());
        let one_of = |set: &[u32]| num().and_then(|v| if set.contains(&v) { Ok(v) } else { Err(bad()) });
        let flag = || match value.trim() {
            "0" => Ok(false),
            "1" => Ok(true),
            _ => Err(bad()),
        };
        let with_auto = |set: &[u32]| one_of(&[&[0], set].concat());
        match knob.name {
            "EXPDEC" => self.expdec = flag()?,
            "EXPDEC_R" => self.r = with_auto(&EXPDEC_R)?,
            "EXPDEC_RB" => self.rb = with_auto(&EXPDEC_RB)?,
            "EXPDEC_DOWN" => self.down = flag()?,
            "EXPDEC_D20" => self.d20 = flag()?,
            "EXPDEC_DR" => self.dr = one_of(&EXPDEC_DR)?,
            "EXPDEC_DRB" => self.drb = with_auto(&EXPDEC_DRB)?,
            "EXPDEC_MINB" => self.minb = one_of(&EXPDEC_MINB)?,
            "EXPDEC_DMINB" => self.dminb = one_of(&EXPDEC_MINB)?,
            "EXPDEC_MINBLK" => self.minblk = num().and_then(|v| if (1..=1_000_000).contains(&v) { Ok(v) } else { Err(bad()) })?,
            "EXPDEC_WARPS" => self.warps = one_of(&[0, 8, 16])?,
            "EXPDEC_PAIRS" => self.pairs = one_of(&[0, 1, 2])?,
            "EXPDEC_WARP_ROWS" => self.warp_rows = flag()?,
            "ATTN_MINB" => self.attn_minb = one_of(&[0, 2, 4])?,
            "ATTN_FUSE" => self.attn_fuse = flag()?,
            _ => unreachable!("every name of KNOBS is matched"),
        }
        Ok(())
    }

    /// The combinations no entry is compiled for: 4 blocks per SM with R=2 or with DR=4 (and with
    /// a gate/up format outside `EXPDEC_GU_MINB4_FORMATS`, which [`Self::plan`] refuses: the
    /// knobs alone do not know the format).
    pub fn check(&self) -> Result<(), String> {
        if self.minb == 4 && self.r > EXPDEC_MINB4_MAX_R {
            return Err(format!("EXPDEC_MINB=4 needs EXPDEC_R<={EXPDEC_MINB4_MAX_R} (given {}): more rows per lane spill in 64 registers", self.r));
        }
        if self.warps == 16 && self.r == 2 {
            return Err(format!("EXPDEC_WARPS=16 needs EXPDEC_R=1 (given {}): the 16-warp gate/up entries take one row a lane", self.r));
        }
        if self.pairs == 2 && (self.r == 2 || self.warps != 0) {
            return Err(format!("EXPDEC_PAIRS=2 needs EXPDEC_R=1 and EXPDEC_WARPS=0 (given {} and {}): the pair entries take one row a lane in blocks of 8 warps", self.r, self.warps));
        }
        if self.dminb == 4 && self.dr > EXPDEC_MINB4_MAX_DR {
            return Err(format!("EXPDEC_DMINB=4 needs EXPDEC_DR<={EXPDEC_MINB4_MAX_DR} (given {}): more rows per lane spill in 64 registers", self.dr));
        }
        Ok(())
    }

    /// The defaults with every `STRATA_<knob>` variable that `var` finds applied, checked.
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<KernelKnobs, String> {
        let mut k = KernelKnobs::default();
        for knob in &KNOBS {
            if let Some(v) = var(&format!("STRATA_{}", knob.name)) {
                k.set(knob.name, &v)?;
            }
        }
        k.check()?;
        Ok(k)
    }

    /// The defaults with the environment's `STRATA_<knob>` variables applied.
    pub fn from_env() -> Result<KernelKnobs, String> {
        Self::from_vars(|n| std::env::var(n).ok())
    }

    /// The process's knobs: what [`Self::init_process`] set, else the environment's, read once.
    pub fn process() -> Result<KernelKnobs, String> {
        PROCESS.get_or_init(Self::from_env).clone()
    }

    /// Fixes the process's knobs (the CLI, before any backend opens); false if already fixed.
    pub fn init_process(knobs: KernelKnobs) -> bool {
        PROCESS.set(Ok(knobs)).is_ok()
    }

    /// The `attn_chunk` entry a band of `band` query heads of `hd` values launches, `ATTN_MINB`
    /// deciding between `attn_chunk_128` and its lean twin: `has_lean`, the backend has the twin
    /// (the sm_90 image of the cuda backend); `wanted`, the lean rule's answer for the launch
    /// (`attn_lean_wanted`). An error where the knob asks for the twin and the backend has none.
    pub fn attn_chunk_entry(&self, band: usize, hd: usize, has_lean: bool, wanted: bool) -> Result<&'static str, String> {
        let lean = match self.attn_minb {
            0 => wanted && has_lean,
            4 if attn_chunk_has_lean(band, hd) && !has_lean => {
                return Err("ATTN_MINB=4 asks for the lean attention entry, which this backend does not have (cuda on sm_90 has it)".into())
            }
            m => m == 4,
        };
        Ok(attn_chunk_kernel(band, hd, lean))
    }

    /// One line naming every knob and its value.
    pub fn describe(&self) -> String {
        format!(
            "EXPDEC={} R={} RB={} MINB={} WARPS={} PAIRS={} EXPDEC_WARP_ROWS={} DOWN={} D20={} DR={} DRB={} DMINB={} MINBLK={} ATTN_MINB={} ATTN_FUSE={}",
            self.expdec as u8, self.r, self.rb, self.minb, self.warps, self.pairs, self.warp_rows as u8, self.down as u8, self.d20 as u8, self.dr, self.drb, self.dminb, self.minblk, self.attn_minb, self.attn_fuse as u8
        )
    }

    /// The kernels and launch sizes for one window of `n = tokens * k` selections over a layer
    /// of `formats` (gate/up, down) and `n_embd` x `n_ff`; an error when the knobs ask for an
    /// entry that is not compiled ([`Self::check`], and `EXPDEC_MINB=4` for a gate/up format
    /// outside `EXPDEC_GU_MINB4_FORMATS`, `EXPDEC_WARPS=16` for one without a 16-warp entry,
    /// `EXPDEC_PAIRS=2` for one without a pair entry or on a backend without clusters).
    /// `sms`: the device's SMs (compute units), for the `EXPDEC_WARPS=0` rule; `sm90`: the
    /// backend has the sm_90 entries (`launch::SM90_BOUNDS`: the thread-block cluster ones).
    pub fn plan(&self, formats: (WeightFormat, WeightFormat), n_embd: usize, n_ff: usize, n: usize, sms: u32, sm90: bool) -> Result<ExpertPlan, String> {
        self.check()?;
        let (gf, df) = formats;
        let n = n as u32;
        let (n_embd32, n_ff32) = (n_embd as u32, n_ff as u32);
        let rb = match self.rb {
            0 => rows_per_block(&EXPDEC_RB, n, n_ff32, self.minblk),
            rb => rb,
        };
        let gu_smem = expdec_gu_smem(n_embd, rb, gf.staged_grid().len());
        let blocks = n * n_ff32.div_ceil(rb);
        let expdec = self.expdec && gu_smem <= EXPDEC_SMEM_MAX && EXPDEC_GU_FORMATS.contains(&gf);
        // The rule (docs/kernels/moe.md has the measurements): where 8-warp blocks would leave
        // the SMs under two each, 16-warp blocks; and where splitting each 32-row chunk over a
        // cluster's pair of blocks gives the busiest SM fewer rows than that (a pair block is
        // 16 rows, 4 fit a SM), the pairs, if the backend has them.
        let one_row_few = blocks < 2 * sms;
        // `EXPDEC_R=0`: two rows a lane where they replace the warps' row slots (`_m2w`: a format
        // with them, the knob on, 2 blocks a SM) in a launch of many blocks (windows of 2 to 8
        // tokens 0.8 to 1.7 % faster in the step on an H100); one elsewhere: where its 8-warp
        // blocks would be few (the pair and 16-warp entries take those), where the other knobs
        // ask for one-row entries, and for the formats without row slots, whose two-row entries
        // took 25 to 45 % longer than their one-row ones (IQ3_S and IQ3_XXS gate/up, windows of
        // 2 to 8, docs/kernels/moe.md).
        // The row-slot entry's own conditions (the format has one, its knob on, 2 blocks a SM),
        // which also choose it below.
        let row_slots = expdec_gu_warp_rows_kernel(gf).is_some() && self.warp_rows && self.minb == 2;
        let r = match self.r {
            0 if one_row_few || !row_slots || self.warps == 16 || self.pairs == 2 => 1,
            0 => 2,
            r => r,
        };
        let few = self.warps == 0 && r == 1 && one_row_few;
        let chunks = n * (n_ff32 / MOE_GU_ROWS);
        let pairs_lighter = (EXPDEC_PAIR * chunks).div_ceil(sms) < EXPDEC_PAIR * chunks.div_ceil(sms);
        let pair_smem = expdec_gu_pair_smem(n_embd, gf);
        let pair_entry = expdec_gu_pair_kernel(gf);
        let pair_kernel = pair_entry.filter(|_| sm90 && pair_smem <= EXPDEC_SMEM_MAX);
        let pair = match self.pairs {
            2 if expdec => Some(pair_kernel.ok_or_else(|| {
                let why = if !sm90 {
                    "this backend has no cluster entries (cuda on sm_90 and later)".into()
                } else if pair_entry.is_none() {
                    format!("{} has no pair gate/up entry (compiled for {} only)", gf.name(), minb4_names())
                } else {
                    format!("a pair block of {} at n_embd {n_embd} needs {pair_smem} bytes of shared memory, above {EXPDEC_SMEM_MAX}", gf.name())
                };
                format!("EXPDEC_PAIRS=2: {why}: set EXPDEC_PAIRS=1")
            })?),
            1 if expdec && few && pairs_lighter && rb == MOE_GU_ROWS => pair_kernel, // (not over an explicit EXPDEC_RB)
            _ => None,
        };
        let gu = if let Some(kernel) = pair {
            Launch { kernel, blocks: EXPDEC_PAIR * chunks, smem: pair_smem, rows_per_block: MOE_GU_ROWS }
        } else if expdec {
            let w16 = expdec_gu_w16_kernel(gf);
            let sixteen = match self.warps {
                16 => Some(w16.ok_or_else(|| format!("EXPDEC_WARPS=16 has no {} gate/up entry (it is compiled for {} only): set EXPDEC_WARPS=8", gf.name(), minb4_names()))?),
                0 if few => w16,
                _ => None,
            };
            let kernel = match sixteen {
                Some(k) => k,
                None => expdec_gu_kernel(gf, r, self.minb).ok_or_else(|| {
                    format!("EXPDEC_MINB={} has no {} gate/up entry (it spills in 64 registers; 4 blocks per SM is compiled for {} only): set EXPDEC_MINB=2", self.minb, gf.name(), minb4_names())
                })?,
            };
            // The warps' row slots where asked for and compiled (R = 1, 2 blocks per SM), and
            // where they fit beside the stage and the codebook.
            let ring = gu_smem + expdec_gu_ring_bytes(n_embd, gf);
            match expdec_gu_warp_rows_kernel(gf).filter(|_| row_slots && sixteen.is_none() && r == 1 && ring <= EXPDEC_SMEM_MAX) {
                Some(kernel) => Launch { kernel, blocks, smem: ring, rows_per_block: rb },
                None => Launch { kernel, blocks, smem: gu_smem, rows_per_block: rb },
            }
        } else {
            plain(&format!("moe_gu_{}", gf.tag()), n * (n_ff32 / MOE_GU_ROWS), MOE_GU_ROWS)
        };
        let ff_groups = n_ff32 / 32;
        let drb = match self.drb {
            0 => rows_per_block(&EXPDEC_DRB, n, n_embd32, self.minblk),
            drb => drb,
        };
        let drb = expdec_down_block_rows(drb, ff_groups.max(1), self.dr);
        let down_smem = expdec_down_smem(ff_groups.max(1), self.dr);
        let wanted = match df {
            WeightFormat::Q2_0 => self.d20,
            WeightFormat::Iq4Nl | WeightFormat::Iq4NlT => self.down,
            _ => false,
        };
        let fits = EXPDEC_DOWN_FORMATS.contains(&df) && ff_groups <= EXPDEC_DOWN_MAX_GROUPS && down_smem <= EXPDEC_SMEM_MAX;
        let down = match (wanted && fits).then(|| expdec_down_kernel(df, self.dr, self.dminb)).flatten() {
            Some(kernel) => Launch { kernel, blocks: n * n_embd32.div_ceil(drb), smem: down_smem, rows_per_block: drb },
            None => plain(&format!("moe_down_{}", df.tag()), n * n_embd32.div_ceil(MMVQ_WARPS * MOE_DOWN_ROWS), MMVQ_WARPS * MOE_DOWN_ROWS),
        };
        Ok(ExpertPlan { gu, down })
    }
}

/// The formats with 4-blocks-per-SM, 16-warp and pair gate/up entries, for the errors.
fn minb4_names() -> String {
    EXPDEC_GU_MINB4_FORMATS.map(|f| f.name()).join(", ")
}

static PROCESS: std::sync::OnceLock<Result<KernelKnobs, String>> = std::sync::OnceLock::new();

/// A default-kernel launch (its table shared memory).
fn plain(name: &str, blocks: u32, rows_per_block: u32) -> Launch {
    let b = bounds(name).unwrap_or_else(|| panic!("{name} is in the launch table for every weight format"));
    Launch { kernel: b.kernel, blocks, smem: b.smem_bytes, rows_per_block }
}

/// One kernel launch of the plan.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Launch {
    pub kernel: &'static str,
    pub blocks: u32,
    pub smem: u32,
    /// Output rows per block (the EXPDEC kernels take it as an argument).
    pub rows_per_block: u32,
}

/// The gate/up and down launches of one window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExpertPlan {
    pub gu: Launch,
    pub down: Launch,
}

#[cfg(test)]
mod tests {
    use super::*;
    use WeightFormat::*;

    /// The H200's SMs.
    const H200_SMS: u32 = 132;

    #[test]
    fn environment_and_cli_names_parse_and_bad_values_are_refused() {
        let k = KernelKnobs::from_vars(|n| match n {
            "STRATA_EXPDEC_R" => Some("1".into()),
            "STRATA_EXPDEC_DRB" => Some("256".into()),
            "STRATA_EXPDEC_D20" => Some("0".into()),
            _ => None,
        })
        .unwrap();
        assert_eq!((k.r, k.drb, k.d20, k.minb), (1, 256, false, KernelKnobs::default().minb));
        let mut k = KernelKnobs::default();
        k.set("strata_expdec_minb", "4").unwrap();
        k.set("expdec_rb", "64").unwrap();
        assert_eq!((k.minb, k.rb), (4, 64));
        for (name, value) in [("EXPDEC_R", "3"), ("EXPDEC_RB", "48"), ("EXPDEC", "yes"), ("EXPDEC_MINBLK", "0"), ("EXPDEC_DR", "-1")] {
            let e = k.set(name, value).unwrap_err();
            assert!(e.contains(name) && e.contains("expected"), "{e}");
        }
        assert!(k.set("EXPDEC_Q", "1").unwrap_err().contains("unknown"));
        assert!(KernelKnobs::from_vars(|n| (n == "STRATA_EXPDEC_DR").then(|| "8".into())).is_err());
        // Each value valid, the combination not compiled.
        let e = KernelKnobs::from_vars(|n| match n {
            "STRATA_EXPDEC_MINB" => Some("4".into()),
            "STRATA_EXPDEC_R" => Some("2".into()),
            _ => None,
        })
        .unwrap_err();
        assert!(e.contains("EXPDEC_MINB=4 needs"), "{e}");
        let e = KernelKnobs { dminb: 4, dr: 4, ..KernelKnobs::default() }.check().unwrap_err();
        assert!(e.contains("EXPDEC_DMINB=4 needs"), "{e}");
        assert!(KernelKnobs::default().check().is_ok());
    }

    #[test]
    fn plan_follows_the_knobs() {
        let on = KernelKnobs { expdec: true, r: 1, rb: 64, down: true, d20: true, dr: 4, drb: 128, minb: 2, dminb: 2, minblk: 1, warps: 8, pairs: 1, warp_rows: false, attn_minb: 2, attn_fuse: true };
        let p = on.plan((Iq3S, Q2_0), 2560, 640, 40, H200_SMS, false).unwrap();
        assert_eq!(p.gu, Launch { kernel: "expdec_gu_iq3_s_r1_m2", blocks: 40 * 10, smem: expdec_gu_smem(2560, 64, 512), rows_per_block: 64 });
        // 20 groups: 12 row slots x 4 rows a step; 128 rows asked is two whole steps.
        assert_eq!(p.down, Launch { kernel: "expdec_down_q2_0_d4_m2", blocks: 40 * 2560u32.div_ceil(96), smem: expdec_down_smem(20, 4), rows_per_block: 96 });
        assert_eq!(on.plan((Iq3S, Iq4Nl), 2560, 640, 40, H200_SMS, false).unwrap().down.kernel, "expdec_down_iq4_nl_d4_m2");
        // IQ3_ST stages its signed codebook (16 x 512 words).
        let p = on.plan((Iq3ST, Iq4NlT), 2048, 768, 8, H200_SMS, false).unwrap();
        assert_eq!((p.gu.kernel, p.gu.smem), ("expdec_gu_iq3_st_r1_m2", expdec_gu_smem(2048, 64, 16 * 512)));
        let m4 = KernelKnobs { minb: 4, dminb: 4, dr: 2, ..on };
        assert_eq!(m4.plan((Iq3S, Iq4Nl), 2560, 640, 40, H200_SMS, false).unwrap().down.kernel, "expdec_down_iq4_nl_d2_m4");
        assert_eq!(m4.plan((Iq3S, Iq4Nl), 2560, 640, 40, H200_SMS, false).unwrap().gu.kernel, "expdec_gu_iq3_s_r1_m4");
        // Knobs off, formats without EXPDEC entries, rows too long: the default kernels.
        let off = KernelKnobs { expdec: false, down: false, d20: false, ..on };
        let p = off.plan((Iq3S, Q2_0), 2560, 640, 40, H200_SMS, false).unwrap();
        // moe_down: 4 warps of 4 rows a block.
        assert_eq!((p.gu.kernel, p.gu.blocks, p.down.kernel, p.down.blocks, p.down.rows_per_block), ("moe_gu_iq3_s", 40 * 20, "moe_down_q2_0", 40 * 160, 16));
        assert_eq!(on.plan((Iq4Xs, Iq3S), 2048, 768, 8, H200_SMS, false).unwrap().gu.kernel, "moe_gu_iq4_xs");
        assert_eq!(on.plan((Iq4Xs, Iq3S), 2048, 768, 8, H200_SMS, false).unwrap().down.kernel, "moe_down_iq3_s");
        assert_eq!(on.plan((Iq2S, Q2_0), 2048, 2048, 8, H200_SMS, false).unwrap().down.kernel, "moe_down_q2_0");
        // Staged rows over 96 KiB: the default gate/up; under it, EXPDEC.
        assert!(expdec_gu_smem(24576, 64, 2048) > EXPDEC_SMEM_MAX && expdec_gu_smem(12288, 64, 2048) > 48 * 1024);
        assert_eq!(on.plan((Iq2S, Q2_0), 24576, 640, 8, H200_SMS, false).unwrap().gu.kernel, "moe_gu_iq2_s");
        assert_eq!(on.plan((Iq2S, Q2_0), 12288, 640, 8, H200_SMS, false).unwrap().gu.kernel, "expdec_gu_iq2_s_r1_m2");
        // Q8_0 gate/up has no entry at 4 blocks per SM: refused, naming it; at 2, or with
        // EXPDEC gate/up off, it plans.
        let e = m4.plan((Q8_0, Q2_0), 2560, 640, 40, H200_SMS, false).unwrap_err();
        assert!(e.contains("EXPDEC_MINB=4 has no Q8_0 gate/up entry"), "{e}");
        assert_eq!(on.plan((Q8_0, Q2_0), 2560, 640, 40, H200_SMS, false).unwrap().gu.kernel, "expdec_gu_q8_0_r1_m2");
        assert_eq!(KernelKnobs { expdec: false, ..m4 }.plan((Q8_0, Q2_0), 2560, 640, 40, H200_SMS, false).unwrap().gu.kernel, "moe_gu_q8_0");
        // Combinations `check` refuses are refused by the plan too.
        assert!(KernelKnobs { r: 2, ..m4 }.plan((Iq3S, Q2_0), 2560, 640, 40, H200_SMS, false).unwrap_err().contains("EXPDEC_MINB=4 needs"));
    }

    #[test]
    fn zero_rows_a_lane_take_two_only_for_windows_of_row_slot_formats() {
        let rule = KernelKnobs::default();
        assert_eq!(rule.r, 0);
        // One token of 8 experts at n_ff 768: 192 blocks of 32 rows, under 2 x 132: one row a
        // lane (the pair entry with clusters, 16 warps without).
        assert_eq!(rule.plan((Iq3ST, Iq4NlT), 2048, 768, 8, H200_SMS, true).unwrap().gu.kernel, "expdec_gu_iq3_st_r1_p2");
        assert_eq!(rule.plan((Iq3S, Iq4Nl), 2048, 768, 8, H200_SMS, false).unwrap().gu.kernel, "expdec_gu_iq3_s_r1_w16");
        assert_eq!(rule.plan((Q8_0, Iq4Nl), 2048, 768, 8, H200_SMS, false).unwrap().gu.kernel, "expdec_gu_q8_0_r1_m2");
        // Windows of 2 and 8 tokens of IQ3_ST (row slots): two rows a lane (so no `_m2w`,
        // which takes one).
        assert_eq!(rule.plan((Iq3ST, Iq4NlT), 2048, 768, 16, H200_SMS, true).unwrap().gu.kernel, "expdec_gu_iq3_st_r2_m2");
        assert_eq!(rule.plan((Iq3ST, Iq4NlT), 2048, 768, 64, H200_SMS, true).unwrap().gu.kernel, "expdec_gu_iq3_st_r2_m2");
        // Windows of formats without row slots, or with the slots' knob off: one row a lane.
        assert_eq!(rule.plan((Iq3S, Iq4Nl), 2560, 640, 40, H200_SMS, false).unwrap().gu.kernel, "expdec_gu_iq3_s_r1_m2");
        assert_eq!(rule.plan((Iq3Xxs, Q2_0), 2560, 640, 80, H200_SMS, true).unwrap().gu.kernel, "expdec_gu_iq3_xxs_r1_m2");
        assert_eq!(rule.plan((Iq3S, Iq4Nl), 2048, 768, 64, H200_SMS, true).unwrap().gu.kernel, "expdec_gu_iq3_s_r1_m2");
        assert_eq!(KernelKnobs { warp_rows: false, ..rule }.plan((Iq3ST, Iq4NlT), 2048, 768, 64, H200_SMS, true).unwrap().gu.kernel, "expdec_gu_iq3_st_r1_m2");
        // A device with more SMs than the window fills two blocks each: one row a lane.
        assert_eq!(rule.plan((Iq3S, Iq4Nl), 2048, 768, 16, 256, false).unwrap().gu.kernel, "expdec_gu_iq3_s_r1_w16");
        assert_eq!(rule.plan((Iq3ST, Iq4NlT), 2048, 768, 16, 256, true).unwrap().gu.kernel, "expdec_gu_iq3_st_r1_p2");
        // Knobs that ask for one-row entries get them; an explicit R wins over the rule.
        assert_eq!(KernelKnobs { minb: 4, ..rule }.plan((Iq3S, Iq4Nl), 2048, 768, 16, H200_SMS, false).unwrap().gu.kernel, "expdec_gu_iq3_s_r1_m4");
        assert_eq!(KernelKnobs { warps: 16, ..rule }.plan((Iq3S, Iq4Nl), 2048, 768, 16, H200_SMS, false).unwrap().gu.kernel, "expdec_gu_iq3_s_r1_w16");
        assert_eq!(KernelKnobs { pairs: 2, ..rule }.plan((Iq3ST, Iq4NlT), 2048, 768, 16, H200_SMS, true).unwrap().gu.kernel, "expdec_gu_iq3_st_r1_p2");
        assert_eq!(KernelKnobs { r: 1, ..rule }.plan((Iq3ST, Iq4NlT), 2048, 768, 16, H200_SMS, true).unwrap().gu.kernel, "expdec_gu_iq3_st_r1_m2w");
        assert_eq!(KernelKnobs { r: 2, ..rule }.plan((Iq3S, Iq4Nl), 2048, 768, 8, H200_SMS, false).unwrap().gu.kernel, "expdec_gu_iq3_s_r2_m2");
        let mut k = rule;
        k.set("EXPDEC_R", "0").unwrap();
        assert!(k.set("EXPDEC_R", "3").unwrap_err().contains("expected 0|1|2"));
    }

    #[test]
    fn zero_warps_take_sixteen_where_eight_leave_sms_under_two_blocks() {
        // One row a lane throughout (the rows-a-lane rule has its own test).
        let rule = KernelKnobs { r: 1, ..KernelKnobs::default() };
        assert_eq!(rule.warps, 0);
        // One token of 8 experts at n_ff 768: 8 x 24 blocks of 32 rows, under 2 x 132.
        assert_eq!(rule.plan((Iq3S, Iq4Nl), 2048, 768, 8, H200_SMS, false).unwrap().gu.kernel, "expdec_gu_iq3_s_r1_w16");
        assert_eq!(rule.plan((Iq3S, Iq4Nl), 2048, 768, 8, H200_SMS, false).unwrap().gu.blocks, 192);
        // Two tokens: 384 blocks, 8 warps. A device of 256 SMs: too few blocks for it at 8 warps.
        assert_eq!(rule.plan((Iq3S, Iq4Nl), 2048, 768, 16, H200_SMS, false).unwrap().gu.kernel, "expdec_gu_iq3_s_r1_m2");
        assert_eq!(rule.plan((Iq3S, Iq4Nl), 2048, 768, 16, 256, false).unwrap().gu.kernel, "expdec_gu_iq3_s_r1_w16");
        assert_eq!(KernelKnobs { minb: 4, ..rule }.plan((Iq3S, Iq4Nl), 2048, 768, 16, H200_SMS, false).unwrap().gu.kernel, "expdec_gu_iq3_s_r1_m4");
        // No 16-warp entry (Q8_0, or two rows a lane): the rule keeps 8 warps; asked for, it is
        // refused.
        assert_eq!(rule.plan((Q8_0, Iq4Nl), 2048, 768, 8, H200_SMS, false).unwrap().gu.kernel, "expdec_gu_q8_0_r1_m2");
        assert_eq!(KernelKnobs { r: 2, ..rule }.plan((Iq3S, Iq4Nl), 2048, 768, 8, H200_SMS, false).unwrap().gu.kernel, "expdec_gu_iq3_s_r2_m2");
        let sixteen = KernelKnobs { warps: 16, ..rule };
        assert_eq!(sixteen.plan((Iq2S, Q2_0), 2560, 640, 80, H200_SMS, false).unwrap().gu.kernel, "expdec_gu_iq2_s_r1_w16");
        assert!(sixteen.plan((Q8_0, Q2_0), 2560, 640, 8, H200_SMS, false).unwrap_err().contains("EXPDEC_WARPS=16 has no Q8_0 gate/up entry"));
        assert!(KernelKnobs { r: 2, ..sixteen }.check().unwrap_err().contains("EXPDEC_WARPS=16 needs EXPDEC_R=1"));
        assert_eq!(KernelKnobs { warps: 8, ..rule }.plan((Iq3S, Iq4Nl), 2048, 768, 8, H200_SMS, false).unwrap().gu.kernel, "expdec_gu_iq3_s_r1_m2");
    }

    #[test]
    fn pairs_take_the_sixteen_warp_cases_where_the_backend_has_clusters() {
        // One row a lane throughout (the rows-a-lane rule has its own test).
        let rule = KernelKnobs { r: 1, ..KernelKnobs::default() };
        assert_eq!(rule.pairs, 1);
        // One token of 8 experts at n_ff 768: 192 chunks, each over a pair of 8-warp blocks.
        let p = rule.plan((Iq3ST, Iq4NlT), 2048, 768, 8, H200_SMS, true).unwrap();
        assert_eq!((p.gu.kernel, p.gu.blocks, p.gu.rows_per_block), ("expdec_gu_iq3_st_r1_p2", 384, 32));
        // IQ3_ST's blocks also hold their 16 gate and 16 up rows of 880 bytes; IQ3_S's do not.
        assert_eq!(p.gu.smem, expdec_gu_smem(2048, 32, 16 * 512) + 2 * 16 * 880);
        assert_eq!(rule.plan((Iq3S, Iq4Nl), 2048, 768, 8, H200_SMS, true).unwrap().gu.smem, expdec_gu_smem(2048, 32, 512));
        // At n_embd 4096 the rows take a block past EXPDEC_SMEM_MAX: 16 warps by the rule, refused
        // when asked for.
        assert_eq!(rule.plan((Iq3ST, Iq4NlT), 4096, 768, 8, H200_SMS, true).unwrap().gu.kernel, "expdec_gu_iq3_st_r1_w16");
        let err = KernelKnobs { pairs: 2, ..rule }.plan((Iq3ST, Iq4NlT), 4096, 768, 8, H200_SMS, true).unwrap_err();
        assert!(err.contains("needs 108032 bytes of shared memory"), "{err}");
        assert_eq!(bounds(p.gu.kernel).unwrap().threads, 256);
        // Where the rule keeps 8 warps, or 16 are asked for, or the format has no pair entry,
        // or the backend no clusters: no pairs.
        assert_eq!(rule.plan((Iq3S, Iq4Nl), 2048, 768, 16, H200_SMS, true).unwrap().gu.kernel, "expdec_gu_iq3_s_r1_m2");
        assert_eq!(KernelKnobs { warps: 16, ..rule }.plan((Iq3S, Iq4Nl), 2048, 768, 8, H200_SMS, true).unwrap().gu.kernel, "expdec_gu_iq3_s_r1_w16");
        assert_eq!(rule.plan((Q8_0, Iq4Nl), 2048, 768, 8, H200_SMS, true).unwrap().gu.kernel, "expdec_gu_q8_0_r1_m2");
        assert_eq!(rule.plan((Iq3S, Iq4Nl), 2048, 768, 8, H200_SMS, false).unwrap().gu.kernel, "expdec_gu_iq3_s_r1_w16");
        assert_eq!(KernelKnobs { pairs: 0, ..rule }.plan((Iq3S, Iq4Nl), 2048, 768, 8, H200_SMS, true).unwrap().gu.kernel, "expdec_gu_iq3_s_r1_w16");
        assert_eq!(KernelKnobs { rb: 64, ..rule }.plan((Iq3S, Iq4Nl), 2048, 768, 8, H200_SMS, true).unwrap().gu.kernel, "expdec_gu_iq3_s_r1_w16");
        // Where the pairs' busiest SM would hold as many rows as the 16-warp blocks' (10 of 512
        // at n_ff 640: 400 pair blocks put 4 on some SMs, 64 rows, as 2 blocks of 32 do; and
        // under one 16-warp block a SM, 100 chunks: 2 pair blocks or 1 block, 32 rows), not.
        assert_eq!(rule.plan((Iq3S, Iq4Nl), 2560, 640, 10, H200_SMS, true).unwrap().gu.kernel, "expdec_gu_iq3_s_r1_w16");
        assert_eq!(rule.plan((Iq3S, Iq4Nl), 2560, 640, 5, H200_SMS, true).unwrap().gu.kernel, "expdec_gu_iq3_s_r1_w16");
        assert_eq!(rule.plan((Iq3S, Iq4Nl), 2560, 640, 3, H200_SMS, true).unwrap().gu.kernel, "expdec_gu_iq3_s_r1_p2");
        // Always: at any window, refused without clusters or a pair entry, or with R=2 or 16 warps.
        let always = KernelKnobs { pairs: 2, ..rule };
        let p = always.plan((Iq2S, Q2_0), 2560, 640, 80, H200_SMS, true).unwrap();
        assert_eq!((p.gu.kernel, p.gu.blocks), ("expdec_gu_iq2_s_r1_p2", 2 * 80 * 20));
        assert!(always.plan((Iq2S, Q2_0), 2560, 640, 8, H200_SMS, false).unwrap_err().contains("no cluster entries"));
        assert!(always.plan((Q8_0, Q2_0), 2560, 640, 8, H200_SMS, true).unwrap_err().contains("Q8_0 has no pair gate/up entry"));
        assert!(KernelKnobs { r: 2, ..always }.check().unwrap_err().contains("EXPDEC_PAIRS=2 needs"));
        assert!(KernelKnobs { warps: 16, ..always }.check().unwrap_err().contains("EXPDEC_PAIRS=2 needs"));
        let mut k = KernelKnobs::default();
        k.set("EXPDEC_PAIRS", "0").unwrap();
        assert_eq!(k.pairs, 0);
        assert!(k.set("EXPDEC_PAIRS", "3").unwrap_err().contains("expected 0|1|2"));
        // EXPDEC_WARP_ROWS (on by default): pair blocks keep their block copy (one token), and so
        // do the 16-warp blocks.
        let warp_rows = KernelKnobs { warp_rows: true, ..rule };
        assert!(KernelKnobs::default().warp_rows);
        assert_eq!(warp_rows.plan((Iq3ST, Iq4NlT), 2048, 768, 8, H200_SMS, true).unwrap().gu.kernel, "expdec_gu_iq3_st_r1_p2");
        assert_eq!(warp_rows.plan((Iq3ST, Iq4NlT), 2048, 768, 8, H200_SMS, false).unwrap().gu.kernel, "expdec_gu_iq3_st_r1_w16");
        assert_eq!(KernelKnobs { pairs: 2, ..warp_rows }.plan((Iq3ST, Iq4NlT), 2048, 768, 32, H200_SMS, true).unwrap().gu.kernel, "expdec_gu_iq3_st_r1_p2");
        // The 8-warp blocks of windows (R = 1, 2 blocks per SM) take `_m2w`, their slots after
        // the stage and the codebook; at 4 blocks per SM, R = 2, 16 warps, another format or
        // with the knob off, not.
        let m2w = warp_rows.plan((Iq3ST, Iq4NlT), 2048, 768, 32, H200_SMS, true).unwrap();
        let slots = 8 * 2 * 2 * 880;
        assert_eq!(expdec_gu_ring_bytes(2048, Iq3ST), slots);
        // (A pair block's copy of its 16 gate and 16 up rows is as large.)
        assert_eq!(expdec_gu_pair_smem(2048, Iq3ST), expdec_gu_smem(2048, 32, 16 * 512) + 2 * 16 * 880);
        assert_eq!((m2w.gu.kernel, m2w.gu.blocks, m2w.gu.smem), ("expdec_gu_iq3_st_r1_m2w", 32 * 24, expdec_gu_smem(2048, 32, 16 * 512) + slots));
        assert_eq!(KernelKnobs { rb: 128, warps: 8, ..warp_rows }.plan((Iq3ST, Iq4NlT), 2048, 768, 32, H200_SMS, true).unwrap().gu.smem, expdec_gu_smem(2048, 128, 16 * 512) + slots);
        assert_eq!(KernelKnobs { minb: 4, ..warp_rows }.plan((Iq3ST, Iq4NlT), 2048, 768, 32, H200_SMS, true).unwrap().gu.kernel, "expdec_gu_iq3_st_r1_m4");
        assert_eq!(KernelKnobs { r: 2, ..warp_rows }.plan((Iq3ST, Iq4NlT), 2048, 768, 32, H200_SMS, true).unwrap().gu.kernel, "expdec_gu_iq3_st_r2_m2");
        assert_eq!(KernelKnobs { warps: 16, ..warp_rows }.plan((Iq3ST, Iq4NlT), 2048, 768, 32, H200_SMS, true).unwrap().gu.kernel, "expdec_gu_iq3_st_r1_w16");
        assert_eq!(warp_rows.plan((Iq3S, Iq4Nl), 2048, 768, 32, H200_SMS, true).unwrap().gu.kernel, "expdec_gu_iq3_s_r1_m2");
        // Past EXPDEC_SMEM_MAX with the slots (n_embd 4096: 1,760-byte rows), the plain entry.
        assert_eq!(warp_rows.plan((Iq3ST, Iq4NlT), 4096, 768, 32, H200_SMS, true).unwrap().gu.kernel, "expdec_gu_iq3_st_r1_m2");
        assert_eq!(KernelKnobs { warp_rows: false, ..warp_rows }.plan((Iq3ST, Iq4NlT), 2048, 768, 32, H200_SMS, true).unwrap().gu.kernel, "expdec_gu_iq3_st_r1_m2");
        k.set("expdec_warp_rows", "0").unwrap();
        assert!(!k.warp_rows && k.describe().contains("EXPDEC_WARP_ROWS=0"));
        assert!(k.set("EXPDEC_WARP_ROWS", "2").unwrap_err().contains("expected 0|1"));
    }

    #[test]
    fn attention_blocks_a_sm_pick_the_lean_entry_by_the_rule_or_the_knob() {
        // The rule (default): the twin where the launch wants it and the backend has it.
        let rule = KernelKnobs::default();
        assert_eq!(rule.attn_minb, 0);
        assert_eq!(rule.attn_chunk_entry(8, 128, true, true).unwrap(), "attn_chunk_128_m4");
        assert_eq!(rule.attn_chunk_entry(8, 128, true, false).unwrap(), "attn_chunk_128");
        assert_eq!(rule.attn_chunk_entry(8, 128, false, true).unwrap(), "attn_chunk_128");
        assert_eq!(rule.attn_chunk_entry(2, 128, true, true).unwrap(), "attn_chunk_two_128");
        assert_eq!(rule.attn_chunk_entry(8, 256, true, true).unwrap(), "attn_chunk");
        // 2: never; 4: wherever the band has the twin, refused on a backend without it.
        let mut k = KernelKnobs::default();
        k.set("attn_minb", "2").unwrap();
        assert_eq!(k.attn_chunk_entry(8, 128, true, true).unwrap(), "attn_chunk_128");
        k.set("ATTN_MINB", "4").unwrap();
        assert!(k.describe().contains("ATTN_MINB=4"));
        assert_eq!(k.attn_chunk_entry(4, 128, true, false).unwrap(), "attn_chunk_128_m4");
        assert_eq!(k.attn_chunk_entry(2, 128, false, false).unwrap(), "attn_chunk_two_128");
        assert_eq!(k.attn_chunk_entry(1, 128, false, false).unwrap(), "attn_chunk_one");
        assert!(k.attn_chunk_entry(8, 128, false, true).unwrap_err().contains("ATTN_MINB=4"));
        assert!(k.set("ATTN_MINB", "3").unwrap_err().contains("expected 0|2|4"));
    }

    #[test]
    fn rows_per_block_zero_follows_the_minimum_blocks_rule() {
        let auto = KernelKnobs { rb: 0, drb: 0, minblk: 400, dminb: 2, ..KernelKnobs::default() };
        // 10 selections of n_ff 640: 20 blocks each at 32 rows, 10 at 64, 5 at 128.
        assert_eq!(auto.plan((Iq2Xxs, Iq4Nl), 2560, 640, 10, H200_SMS, false).unwrap().gu.rows_per_block, 32);
        assert_eq!(auto.plan((Iq2Xxs, Iq4Nl), 2560, 640, 40, H200_SMS, false).unwrap().gu.rows_per_block, 64);
        assert_eq!(auto.plan((Iq2Xxs, Iq4Nl), 2560, 640, 80, H200_SMS, false).unwrap().gu.rows_per_block, 128);
        // 256, 128, 64 rows per block: 100, 200, 400 blocks; 64 rounds to two steps of 12 x 2.
        let p = KernelKnobs { dr: 2, ..auto }.plan((Iq2Xxs, Q2_0), 2560, 640, 10, H200_SMS, false).unwrap();
        assert_eq!((p.down.rows_per_block, p.down.blocks), (48, 10 * 2560u32.div_ceil(48)));
    }
}
