//! Block decoding against the `gguf` Python package (pinned 0.19.0, in the project venv), bit
//! for bit, on thousands of random blocks per type: random quant bytes and finite fp16 scales of
//! every size (tiny, huge and subnormal included).
mod common;

use std::path::PathBuf;
use std::process::Command;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use strata::host::reference::dequant_row_f32;
use strata_gpu_shared::formats::WeightFormat;

#[test]
fn decode_matches_gguf_package() {
    let Some(python) = common::venv_python() else {
        return common::skip_or_fail(common::tools_required(), "gguf python package", "no .venv with gguf (scripts/setup-toolchain.sh)").unwrap_or(());
    };
    let seed = common::seed("decode_matches_gguf_package");
    let mut rng = SmallRng::seed_from_u64(seed);
    let dir = std::env::temp_dir().join(format!("strata-gguf-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for format in WeightFormat::ALL {
        let blocks = 4096;
        let bb = format.block_bytes();
        let mut raw = vec![0u8; blocks * bb];
        rng.fill(&mut raw[..]);
        let off = format.off_d();
        for block in raw.chunks_exact_mut(bb) {
            // Any finite fp16 (subnormals and the extremes included): redraw infinities and NaNs.
            let mut d: u16 = rng.random();
            while d & 0x7c00 == 0x7c00 {
                d = rng.random();
            }
            block[off..off + 2].copy_from_slice(&d.to_le_bytes());
        }
        let (input, output) = (dir.join(format!("{}.bin", format.name())), dir.join(format!("{}.f32", format.name())));
        std::fs::write(&input, &raw).unwrap();
        let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("scripts/gguf_dequant.py");
        let st = Command::new(&python).arg(script).arg(format.name()).arg(&input).arg(&output).status().unwrap();
        assert!(st.success(), "gguf_dequant.py {} failed", format.name());
        let want: Vec<u32> = std::fs::read(&output).unwrap().chunks_exact(4).map(|c| u32::from_le_bytes(c.try_into().unwrap())).collect();
        let n = blocks * format.block_values();
        assert_eq!(want.len(), n);
        let mut got = Vec::with_capacity(n);
        dequant_row_f32(format, &raw, n, &mut got);
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            let b = i / format.block_values();
            let d = u16::from_le_bytes([raw[b * bb + off], raw[b * bb + off + 1]]);
            assert_eq!(g.to_bits(), *w, "{} block {b} value {} (d {d:#06x}): {g:e} vs {:e}", format.name(), i % format.block_values(), f32::from_bits(*w));
        }
        eprintln!("  {}: {blocks} random blocks identical to scripts/gguf_dequant.py", format.name());
    }
}

/// The committed codebooks are what scripts/gen_codebooks.py makes of the pinned package.
#[test]
fn codebooks_are_generated_from_the_package() {
    let Some(python) = common::venv_python() else {
        return common::skip_or_fail(common::tools_required(), "gguf python package", "no .venv with gguf").unwrap_or(());
    };
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let out = Command::new(&python).arg(root.join("scripts/gen_codebooks.py")).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let committed = std::fs::read_to_string(root.join("gpu-shared/src/codebooks.rs")).unwrap();
    assert!(String::from_utf8_lossy(&out.stdout) == committed, "gpu-shared/src/codebooks.rs is stale: rerun scripts/gen_codebooks.py");
}
