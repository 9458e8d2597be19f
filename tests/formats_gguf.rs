//! Block decoding against the `gguf` Python package (pinned 0.19.0, in the project venv), bit
//! for bit, on thousands of random blocks per type: random quant bytes and finite fp16 scales of
//! every size (tiny, huge and subnormal included).
mod common;

use std::path::PathBuf;
use std::process::Command;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use strata_gpu_shared::f16::f16_to_f32;
use strata_gpu_shared::formats::WeightFormat;
use strata_gpu_shared::replica::decode_group;

fn venv_python() -> Option<PathBuf> {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".venv/bin/python");
    let ok = p.exists() && Command::new(&p).args(["-c", "import gguf"]).output().is_ok_and(|o| o.status.success());
    ok.then_some(p)
}

#[test]
fn decode_matches_gguf_package() {
    let Some(python) = venv_python() else {
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
        for block in raw.chunks_exact_mut(bb) {
            // Any finite fp16: redraw infinities and NaNs (exponent all ones).
            let mut d: u16 = rng.random();
            while d & 0x7c00 == 0x7c00 {
                d = rng.random();
            }
            block[..2].copy_from_slice(&d.to_le_bytes());
        }
        let (input, output) = (dir.join(format!("{}.bin", format.name())), dir.join(format!("{}.f32", format.name())));
        std::fs::write(&input, &raw).unwrap();
        let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("scripts/gguf_dequant.py");
        let st = Command::new(&python).arg(script).arg(format.name()).arg(&input).arg(&output).status().unwrap();
        assert!(st.success(), "gguf_dequant.py {} failed", format.name());
        let want: Vec<u32> = std::fs::read(&output).unwrap().chunks_exact(4).map(|c| u32::from_le_bytes(c.try_into().unwrap())).collect();
        assert_eq!(want.len(), blocks * 32);
        for (b, block) in raw.chunks_exact(bb).enumerate() {
            let g = decode_group(format, block);
            let d = f16_to_f32(g.d);
            for j in 0..32 {
                let got = (d * g.q[j] as f32).to_bits();
                assert_eq!(got, want[b * 32 + j], "{} block {b} value {j} (d {:#06x})", format.name(), g.d);
            }
        }
        eprintln!("  {}: {blocks} random blocks identical to gguf.quants.dequantize", format.name());
    }
}
