//! `scripts/ncu_loops.py` (the per-loop summary of an ncu SASS page) on a page whose loops,
//! shares and top instruction are known by construction.
mod common;

use std::path::PathBuf;
use std::process::Command;

/// A kernel of six instructions at addresses 0x7f00..: an inner loop 0x7f10..0x7f30 (a load, a
/// multiply-add, the branch back) inside an outer loop 0x7f00..0x7f40, then the exit.
const PAGE: &str = r#""Kernel Name","toy_kernel",
"Address","Source","Warp Stall Sampling (All Samples)","Warp Stall Sampling (Not-issued Samples)","Instructions Executed","stall_barrier","stall_short_sb"
"0x7f00","      MOV R1, R2","2","2","10","2","0"
"0x7f10","      LDS R3, [R1]","10","9","300","0","4"
"0x7f20","      FFMA R4, R3, R3, R4","60","55","300","0","50"
"0x7f30","  @P0 BRA 0x7f10","8","8","300","8","0"
"0x7f40","  @P1 BRA 0x7f00","0","0","10","0","0"
"0x7f50","      EXIT","20","20","80","20","0"
"#;

#[test]
fn ncu_loops_finds_the_innermost_loop_and_its_shares() {
    let Some(python) = common::venv_python() else {
        return common::skip_or_fail(common::tools_required(), "python", "no .venv (scripts/setup-toolchain.sh)").unwrap_or(());
    };
    let page = std::env::temp_dir().join(format!("strata-ncu-page-{}.csv", std::process::id()));
    std::fs::write(&page, PAGE).unwrap();
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("scripts/ncu_loops.py");
    let out = Command::new(python).arg(script).arg(&page).args(["--top", "1"]).output().unwrap();
    std::fs::remove_file(&page).ok();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "ncu_loops.py: {}", String::from_utf8_lossy(&out.stderr));
    let lines: Vec<Vec<&str>> = text.lines().map(|l| l.split_whitespace().collect()).collect();
    // 1,000 instructions executed, 300 of them FFMA; 100 samples, 54 short_sb, 30 barrier.
    assert!(text.starts_with("toy_kernel: 0.001 M warp instructions executed, 0.000 M of them FFMA (3.33 a FFMA); 100 stall samples"), "{text}");
    assert!(text.contains("stall reasons: short_sb 54.0 %, barrier 30.0 %"), "{text}");
    // The inner loop alone (the outer holds it), and the straight code on either side.
    let regions: Vec<&Vec<&str>> = lines.iter().filter(|l| matches!(l.first(), Some(&"loop") | Some(&"code"))).collect();
    let expected: [&[&str]; 3] = [
        &["code", "0", "0", "1", "1.0", "2.0", "0", "0"],
        &["loop", "10", "30", "3", "90.0", "78.0", "1", "1"],
        &["code", "40", "50", "2", "9.0", "20.0", "0", "0"],
    ];
    assert_eq!(regions.len(), expected.len(), "{text}");
    for (got, want) in regions.iter().zip(expected) {
        assert_eq!(got.as_slice(), want, "{text}");
    }
    // The instruction with the most samples, with its main reason.
    let top = text.lines().skip_while(|l| !l.starts_with("the 1 instructions")).nth(1).unwrap_or("");
    assert!(top.trim_start().starts_with("20 FFMA R4, R3, R3, R4") && top.contains("60 samples") && top.contains("short_sb 50"), "{text}");
}
