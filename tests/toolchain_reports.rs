//! What the compilers make of the kernels, without a GPU: the Rust PTX and the HIP sources
//! (through NVRTC) checked by ptxas for sm_90, the HIP sources built for AMD gfx1100/gfx1201 by
//! clang-22. Every kernel must compile with zero spills; registers and the AMD resource report
//! are printed (`cargo test --test toolchain_reports -- --nocapture`).
mod common;

use std::io::Write;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::process::{Command, Stdio};

use strata::host::backends::launch::entry_param_widths;
use strata::host::backends::trace::instrument;
use strata_gpu_shared::launch::{cluster_blocks, image_bounds, BOUNDS, SM90_ARCHS, SM90_BOUNDS};

/// One function's numbers from a ptxas `-v` report.
#[derive(Debug, Default)]
struct Usage {
    kernel: String,
    /// A kernel entry (ptxas said "Compiling entry function" for it); else a device function.
    entry: bool,
    registers: u32,
    /// Spill stores + loads and stack frame, from the function's own block: `None` if the
    /// report gave it no `bytes stack frame` line (a parse error).
    spill_bytes: Option<u32>,
    stack_bytes: Option<u32>,
}

/// Runs ptxas on `ptx` for `arch` and parses its `-v` report. Each call has files of its own:
/// the tests of this binary run in parallel threads of one process.
fn ptxas_report(ptx: &str, arch: &str) -> Vec<Usage> {
    static CALLS: AtomicUsize = AtomicUsize::new(0);
    let ptxas = common::ptxas().expect("caller checked");
    let call = CALLS.fetch_add(1, Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("strata-ptxas-{}-{call}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let input = dir.join(format!("in_{arch}.ptx"));
    std::fs::write(&input, ptx).unwrap();
    let out = Command::new(&ptxas)
        .args(["-arch", arch, "-v", "--warn-on-spills", "-o"])
        .arg(dir.join("out.cubin"))
        .arg(&input)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", ptxas.display()));
    let text = String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "ptxas -arch={arch} failed (its input kept in {}):\n{text}", dir.display());
    let _ = std::fs::remove_dir_all(&dir);
    parse_ptxas(&text)
}

/// The functions of a ptxas `-v` report, in its order. Each `Function properties for X` block
/// (its `bytes stack frame` line, and for an entry the `Used N registers` line after it) belongs
/// to X: the device functions ptxas compiles after an entry (`panic_fmt`, ...) get blocks of
/// their own, which must not overwrite the entry's numbers.
fn parse_ptxas(text: &str) -> Vec<Usage> {
    let mut usage: Vec<Usage> = Vec::new();
    let mut entry: Option<&str> = None;
    for line in text.lines() {
        if let Some(rest) = line.split("Compiling entry function '").nth(1) {
            entry = rest.split('\'').next();
        } else if let Some(name) = line.split("Function properties for ").nth(1) {
            let name = name.trim();
            usage.push(Usage { kernel: name.to_string(), entry: entry == Some(name), ..Default::default() });
        } else if let Some(u) = usage.last_mut() {
            if line.contains("bytes stack frame") {
                let n: Vec<u32> = line.split_whitespace().filter_map(|w| w.parse().ok()).collect();
                (u.stack_bytes, u.spill_bytes) = (Some(n[0]), Some(n[1] + n[2]));
            } else if let Some(r) = line.split("Used ").nth(1) {
                u.registers = r.split_whitespace().next().unwrap().parse().unwrap();
            }
        }
    }
    usage
}

/// The functions of `usage` (entries and device functions) that spill, or whose spills the
/// report did not give, with their numbers.
fn spilling(usage: &[Usage]) -> Vec<String> {
    usage.iter().filter(|u| u.spill_bytes != Some(0)).map(|u| format!("{} ({:?} bytes)", u.kernel, u.spill_bytes)).collect()
}

fn check_and_print(what: &str, usage: &[Usage]) {
    println!("{what}:");
    println!("  {:<16} {:>9} {:>12} {:>12}", "kernel", "registers", "spill bytes", "stack bytes");
    for u in usage.iter().filter(|u| u.entry) {
        let n = |v: Option<u32>| v.map_or("?".to_string(), |v| v.to_string());
        println!("  {:<16} {:>9} {:>12} {:>12}", u.kernel, u.registers, n(u.spill_bytes), n(u.stack_bytes));
    }
    for b in BOUNDS {
        let u = usage.iter().find(|u| u.entry && u.kernel == b.kernel).unwrap_or_else(|| panic!("{what}: no report for {}", b.kernel));
        assert_ne!(u.registers, 0, "{what}: {} reported no registers (parse error?)", b.kernel);
    }
    let spills = spilling(usage);
    assert!(spills.is_empty(), "{what}: spills in {}", spills.join(", "));
}

/// A captured piece of a ptxas report (sm_80): an entry that spills, then the device functions
/// compiled after it with their 0-byte blocks, then an entry that does not spill.
#[test]
fn ptxas_report_keeps_each_functions_numbers() {
    let text = "\
ptxas warning : Registers are spilled to local memory in function 'expdec_down_iq4_nl_d2_m4', 52 bytes spill stores, 52 bytes spill loads
ptxas info    : 17408 bytes gmem, 40 bytes cmem[4]
ptxas info    : Compiling entry function 'expdec_down_iq4_nl_d2_m4' for 'sm_80'
ptxas info    : Function properties for expdec_down_iq4_nl_d2_m4
    56 bytes stack frame, 52 bytes spill stores, 52 bytes spill loads
ptxas info    : Used 64 registers, used 1 barriers, 56 bytes cumulative stack size, 408 bytes cmem[0]
ptxas info    : Compile time = 33.179 ms
ptxas info    : Function properties for _RNvNtCsanIojcP8aaR_4core9panicking9panic_fmt
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Function properties for _RNvNtNtCsanIojcP8aaR_4core9panicking11panic_const23panic_const_div_by_zero
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Compiling entry function 'expdec_down_iq4_nl_d2_m2' for 'sm_80'
ptxas info    : Function properties for expdec_down_iq4_nl_d2_m2
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 96 registers, used 1 barriers, 408 bytes cmem[0]
ptxas info    : Compile time = 30.980 ms
";
    let usage = parse_ptxas(text);
    let entries: Vec<(&str, u32, Option<u32>, Option<u32>)> =
        usage.iter().filter(|u| u.entry).map(|u| (u.kernel.as_str(), u.registers, u.spill_bytes, u.stack_bytes)).collect();
    assert_eq!(entries, [("expdec_down_iq4_nl_d2_m4", 64, Some(104), Some(56)), ("expdec_down_iq4_nl_d2_m2", 96, Some(0), Some(0))]);
    assert_eq!(usage.len(), 4);
    assert!(usage.iter().any(|u| !u.entry && u.kernel.ends_with("panic_fmt") && u.spill_bytes == Some(0)));
    assert_eq!(spilling(&usage), ["expdec_down_iq4_nl_d2_m4 (Some(104) bytes)"]);
    // A block without its numbers is not taken for a spill-free one.
    assert_eq!(spilling(&parse_ptxas(&text.replace("    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\nptxas info    : Used 96", "ptxas info    : Used 96"))).len(), 2);
}

/// The entries whose spec has fused multiply-adds (the attention chunks' dot products and value
/// sums: `strata_gpu_shared::replica::attention`). Only they may hold `fma.rn.f32`.
const FMA_ENTRIES: [&str; 7] = ["attn_chunk", "attn_chunk_128", "attn_chunk_128_m4", "attn_chunk_two", "attn_chunk_two_128", "attn_prep_chunk_two_128", "attn_chunk_one"];

/// No implicit contraction (it would change the bits): every float add/mul carries an explicit
/// `.rn` so ptxas cannot fuse them, and an explicit `fma.rn.f32` appears only in the entries of
/// [`FMA_ENTRIES`] (the kernels are inlined into their entries).
fn assert_no_contraction(what: &str, ptx: &str) {
    let mut function = "";
    let mut fmas = 0;
    for line in ptx.lines().map(str::trim) {
        if let Some(rest) = line.strip_prefix(".visible .entry ").or_else(|| line.strip_prefix(".entry ")).or_else(|| line.split_once(".func ").map(|(_, f)| f)) {
            function = rest.split(['(', ' ']).find(|w| !w.is_empty()).unwrap_or("");
        }
        if line.starts_with("fma.rn.f32 ") && FMA_ENTRIES.contains(&function) {
            fmas += 1;
            continue;
        }
        assert!(!line.starts_with("fma.") && !line.starts_with("mad.f32") && !line.starts_with("mad.rn.f32"), "{what}: contraction `{line}` in `{function}`");
        for op in ["add.f32", "mul.f32", "sub.f32"] {
            assert!(!line.starts_with(op), "{what}: `{line}` lacks an explicit rounding mode, ptxas may fuse it");
        }
    }
    // The check saw the entries' names: the attention chunks' fused multiply-adds are there.
    assert!(fmas > 0, "{what}: no `fma.rn.f32` in {FMA_ENTRIES:?}, whose spec has them");
}

#[test]
fn rust_ptx_assembles_without_spills() {
    if common::ptxas().is_none() {
        return common::skip_or_fail(common::tools_required(), "ptxas", "not found (scripts/setup-toolchain.sh)").unwrap_or(());
    }
    for image in strata::ptx::IMAGES {
        // Every entry of the image carries its launch bounds from the tables, a cluster entry
        // its cluster too; an image other than sm_90's has none of its own entries.
        for b in image_bounds(image.arch) {
            let header = image.ptx.split(&format!(".entry {}(", b.kernel)).nth(1).unwrap_or_else(|| panic!("{} missing from the {} PTX", b.kernel, image.arch));
            let head = &header[..header.find('{').unwrap()];
            let mut want = vec![format!(".maxntid {}, 1, 1", b.threads), format!(".minnctapersm {}", b.min_blocks)];
            if cluster_blocks(b.kernel) > 1 {
                want.push(format!(".reqnctapercluster {}, 1, 1", cluster_blocks(b.kernel)));
            }
            assert!(want.iter().all(|w| head.contains(w.as_str())), "{} in {} PTX lacks {want:?}", b.kernel, image.arch);
        }
        if !SM90_ARCHS.contains(&image.arch) {
            for b in SM90_BOUNDS {
                assert!(!image.ptx.contains(&format!(".entry {}(", b.kernel)), "{} is in the {} PTX, which is not sm_90's", b.kernel, image.arch);
            }
        }
        assert_no_contraction(&format!("Rust PTX {}", image.arch), image.ptx);
        check_and_print(&format!("Rust PTX {} (ptxas -arch={})", image.arch, image.arch), &ptxas_report(image.ptx, image.arch));
    }
}

/// Entries the timeline build may spill: the gate/up entries at 64 registers (`_m4`: 4 blocks a
/// SM, `_w16`: 16 warps), whose allocation moves once their stamps are in (the stamps keep no
/// register alive across the kernel; an end stamp of the timer alone spilled some of them).
/// The one-token steps and windows of the bench models run none of them (their `_p2` and `_m2w`
/// entries must not spill).
fn timeline_may_spill(kernel: &str) -> bool {
    kernel.starts_with("expdec_gu_") && (kernel.ends_with("_m4") || kernel.ends_with("_w16"))
}

/// The timeline build (`strata bench decode --timeline`, made from the images that chain their
/// launches) assembles with every entry stamped, and no entry spills but those
/// [`timeline_may_spill`] names.
#[test]
fn timeline_ptx_assembles_with_every_entry_stamped() {
    if common::ptxas().is_none() {
        return common::skip_or_fail(common::tools_required(), "ptxas", "not found (scripts/setup-toolchain.sh)").unwrap_or(());
    }
    let mut images = 0;
    for image in strata::ptx::IMAGES.iter().filter(|i| i.chains_grids) {
        images += 1;
        let traced = instrument(image.ptx).unwrap_or_else(|e| panic!("{} PTX: {e}", image.arch));
        assert_eq!(traced.entries.len(), image_bounds(image.arch).count(), "{}: the stamped entries are the image's", image.arch);
        let stamped = |pat: &str| traced.ptx.matches(pat).count();
        assert_eq!(stamped("st.global.u32 \t[%trace_d1+44]"), traced.entries.len(), "{}: a start stamp an entry", image.arch);
        assert!(stamped("red.global.add.u32 \t[%trace_d1+40], 1;") >= traced.entries.len(), "{}: an end stamp an entry at least", image.arch);
        assert_eq!(stamped("red.global.max.u64 \t[%trace_d1+24]"), image.ptx.matches("griddepcontrol.wait;").count(), "{}: a release stamp a wait", image.arch);
        // The kernels' marks: each alone in its inline asm (no instruction in the default image),
        // and the step's marked kernels have theirs.
        let lines: Vec<&str> = image.ptx.lines().map(str::trim).collect();
        for (i, _) in lines.iter().enumerate().filter(|(_, l)| l.contains("strata-trace-mark")) {
            assert_eq!((lines[i - 1], lines[i + 1]), ("// begin inline asm", "// end inline asm"), "{}: a mark's asm holds only its comment", image.arch);
        }
        let marks = |kernel: &str| {
            let e = traced.entries.iter().find(|e| e.name == kernel).unwrap_or_else(|| panic!("{}: no entry {kernel}", image.arch));
            e.marks.iter().flatten().map(String::as_str).collect::<Vec<_>>()
        };
        assert_eq!(marks("expdec_gu_iq3_st_r1_p2"), ["expert", "staged", "decoded", "paired"], "{}", image.arch);
        assert_eq!(marks("moe_down_iq4_nlt"), ["expert", "summed"], "{}", image.arch);
        assert_eq!(marks("attn_chunk_two_128"), ["queries", "scored"], "{}", image.arch);
        assert_eq!(marks("rms_norm_q8_1"), ["staged", "scaled"], "{}", image.arch);
        assert_eq!(marks("router_topk"), ["maxed", "keyed", "ranked"], "{}", image.arch);
        let usage = ptxas_report(&traced.ptx, image.arch);
        println!("timeline PTX {} (ptxas -arch={}), entries that spill:", image.arch, image.arch);
        for u in usage.iter().filter(|u| u.entry && u.spill_bytes != Some(0)) {
            println!("  {:<32} {:>4} registers {:>4?} spill bytes", u.kernel, u.registers, u.spill_bytes);
        }
        let unexpected: Vec<String> = spilling(&usage).into_iter().filter(|s| !timeline_may_spill(s.split(' ').next().unwrap_or(""))).collect();
        assert!(unexpected.is_empty(), "timeline PTX {}: spills in {}", image.arch, unexpected.join(", "));
    }
    assert!(images > 0, "no image chains its launches");
}

#[test]
fn hip_sources_compile_with_nvrtc_for_sm90() {
    if !strata::host::backends::hip::nvrtc_present() {
        return common::skip_or_fail(common::tools_required(), "NVRTC", "libnvrtc.so.13 not on the library path").unwrap_or(());
    }
    let ptx = strata::host::backends::hip::compile_nvrtc((9, 0)).unwrap_or_else(|e| panic!("{e}"));
    if common::ptxas().is_none() {
        return common::skip_or_fail(common::tools_required(), "ptxas", "not found").unwrap_or(());
    }
    assert_no_contraction("HIP via NVRTC", &ptx);
    check_and_print("HIP via NVRTC compute_90 (ptxas -arch=sm_90)", &ptxas_report(&ptx, "sm_90"));
}

/// The host pushes one argument list per kernel for both backends, so a HIP twin must take its
/// Rust entry's parameters: the same count, each of the same width (checked at every launch
/// too, `strata::host::backends::launch`; this finds a mismatch without a GPU).
#[test]
fn hip_entries_take_the_rust_entries_parameters() {
    if !strata::host::backends::hip::nvrtc_present() {
        return common::skip_or_fail(common::tools_required(), "NVRTC", "libnvrtc.so.13 not on the library path").unwrap_or(());
    }
    let hip = entry_param_widths(&strata::host::backends::hip::compile_nvrtc((9, 0)).unwrap_or_else(|e| panic!("{e}")));
    let image = strata::ptx::IMAGES.iter().find(|i| i.arch == "sm_90").expect("an sm_90 image");
    let rust = entry_param_widths(image.ptx);
    let mut compared = 0;
    for b in BOUNDS {
        if let (Some(r), Some(h)) = (rust.get(b.kernel), hip.get(b.kernel)) {
            assert_eq!(r, h, "{}: Rust entry's parameters against the HIP twin's", b.kernel);
            compared += 1;
        }
    }
    // Every kernel of the table but the sm_90 image's own (SM90_BOUNDS) has both.
    assert_eq!(compared, BOUNDS.len(), "kernels of the table in both images");
    // And the backends find every entry's widths in each image they load.
    for image in strata::ptx::IMAGES {
        let widths = entry_param_widths(image.ptx);
        for b in image_bounds(image.arch) {
            assert!(widths.contains_key(b.kernel), "{}: no parameter widths in the {} PTX", b.kernel, image.arch);
        }
    }
}

#[test]
fn hip_sources_compile_for_amd_gfx1100_and_gfx1201() {
    let Some(clang) = common::clang22() else {
        return common::skip_or_fail(common::tools_required(), "clang-22", "not found").unwrap_or(());
    };
    let tu = strata::host::backends::hip::translation_unit();
    for arch in ["gfx1100", "gfx1201"] {
        let mut child = Command::new(&clang)
            .args(["-x", "hip", "-", "--cuda-device-only", "-nogpulib", "-nogpuinc", "-O3", "-std=c++17"])
            .args(["-ffp-contract=off", "-Rpass-analysis=kernel-resource-usage", "-c", "-o", "/dev/null"])
            .arg(format!("--offload-arch={arch}"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(tu.as_bytes()).unwrap();
        let out = child.wait_with_output().unwrap();
        let text = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "clang-22 --offload-arch={arch} failed:\n{}", strata::host::backends::hip::clip_lines(&text));
        // Remarks come as "Function Name: k" followed by "Key: value" lines.
        println!("HIP for AMD {arch} (clang-22 kernel-resource-usage):");
        println!("  {:<16} {:>6} {:>6} {:>10} {:>10} {:>9} {:>14}", "kernel", "VGPRs", "SGPRs", "VGPR spill", "scratch B", "LDS B", "waves/SIMD");
        let mut current: Option<(String, std::collections::HashMap<String, String>)> = None;
        let mut reports = Vec::new();
        for line in text.lines() {
            let Some(remark) = line.split("remark: ").nth(1) else { continue };
            let remark = remark.split(" [-Rpass").next().unwrap().trim();
            if let Some(name) = remark.strip_prefix("Function Name: ") {
                reports.extend(current.take());
                current = Some((name.to_string(), Default::default()));
            } else if let (Some((_, kv)), Some((k, v))) = (current.as_mut(), remark.split_once(": ")) {
                kv.insert(k.trim().to_string(), v.trim().to_string());
            }
        }
        reports.extend(current);
        for b in BOUNDS {
            let (_, kv) = reports.iter().find(|(n, _)| n == b.kernel).unwrap_or_else(|| panic!("{arch}: no report for {}", b.kernel));
            let get = |k: &str| kv.get(k).cloned().unwrap_or_else(|| panic!("{arch} {}: no `{k}` in report", b.kernel));
            println!(
                "  {:<16} {:>6} {:>6} {:>10} {:>10} {:>9} {:>14}",
                b.kernel,
                get("VGPRs"),
                get("TotalSGPRs"),
                get("VGPRs Spill"),
                get("ScratchSize [bytes/lane]"),
                get("LDS Size [bytes/block]"),
                get("Occupancy [waves/SIMD]")
            );
            assert_eq!(get("VGPRs Spill"), "0", "{arch} {} spills VGPRs", b.kernel);
            assert_eq!(get("SGPRs Spill"), "0", "{arch} {} spills SGPRs", b.kernel);
            assert_eq!(get("ScratchSize [bytes/lane]"), "0", "{arch} {} uses scratch", b.kernel);
        }
    }
}
