//! `moe_group` (the routed-expert window's selections to groups, one warp on the device) against
//! the one-thread spec `moe::group`: the whole table, word for word, on random selections with
//! repeated experts and out-of-range ids, from 1 to `MOE_MAX_SELECTIONS` selections. And the
//! table `router_topk` writes for a one-token window, against `moe::group` of the ids it picked.
//! Skipped without a GPU unless `STRATA_REQUIRE_GPU=1`.
mod common;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use strata::host::backends::cpu::CpuBackend;
use strata::host::ops::route::{router_logits, RouteOps};
use strata::host::Error;
use strata_gpu_shared::launch::route::{ROUTER_MAX_EXPERTS, ROUTER_MAX_K};
use strata_gpu_shared::launch::MOE_MAX_SELECTIONS;
use strata_gpu_shared::moe;

/// Table words a kernel never writes stay this (no table word takes it: `n` is at most 256).
const POISON: u32 = 0xdead_beef;

fn group_matches_the_spec(backend: &str) {
    let Some(gpu) = common::open_gpu(backend) else { return };
    let seed = common::seed(&format!("moe_group_{backend}"));
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut sizes = vec![1, 2, 8, 31, 32, 33, 64, 80, 200, MOE_MAX_SELECTIONS];
    sizes.extend((0..20).map(|_| rng.random_range(1..=MOE_MAX_SELECTIONS)));
    for n in sizes {
        // Few experts (many repeats), router-like counts, and some ids out of range.
        let n_expert = [4, 128, 512][rng.random_range(0..3)];
        let bad = rng.random_bool(0.3);
        let ids: Vec<u32> = (0..n).map(|_| if bad && rng.random_bool(0.1) { n_expert + rng.random_range(0..3) } else { rng.random_range(0..n_expert) }).collect();
        let mut want = vec![0u32; moe::table_words(n)];
        moe::group(&ids, n_expert, &mut want);
        let dids = gpu.upload("moe_group", &ids).unwrap();
        let mut table = gpu.upload("moe_group", &vec![POISON; moe::table_words(n) + 4]).unwrap();
        gpu.moe_group_queue(&dids, n, n_expert as usize, &mut table).unwrap();
        let mut got = vec![0u32; moe::table_words(n) + 4];
        gpu.download("moe_group", &table, &mut got).unwrap();
        assert_eq!(got[..want.len()], want[..], "{backend}, seed {seed}: {n} selections of {n_expert} experts: {ids:?}");
        assert!(got[want.len()..].iter().all(|&w| w == POISON), "{backend}: wrote past the table");
    }
}

#[test]
fn group_matches_the_spec_cuda() {
    group_matches_the_spec("cuda");
}

#[test]
fn group_matches_the_spec_hip() {
    group_matches_the_spec("hip");
}

/// A one-token window's table from `router_topk`: the spec's table of the picks, every word
/// written and none past it, with the picks and weights those of the launch without a table.
fn router_table_matches_the_spec(backend: &str) {
    let Some(gpu) = common::open_gpu(backend) else { return };
    let seed = common::seed(&format!("router_table_{backend}"));
    let mut rng = SmallRng::seed_from_u64(seed);
    for case in 0..40 {
        let n_expert = [8, 64, 128, 512, rng.random_range(1..=ROUTER_MAX_EXPERTS)][case % 5];
        let k = rng.random_range(1..=ROUTER_MAX_K.min(n_expert));
        let logits = router_logits(&mut rng, 1, n_expert);
        let dl = gpu.upload("router_topk", &logits).unwrap();
        let (mut ids, mut w) = (gpu.upload("router_topk", &vec![POISON; k]).unwrap(), gpu.upload("router_topk", &vec![f32::NAN; k]).unwrap());
        let mut table = gpu.upload("router_topk", &vec![POISON; moe::table_words(k) + 4]).unwrap();
        gpu.router_topk_queue(&dl, 1, n_expert, k, &mut ids, &mut w, Some(&mut table)).unwrap();
        let (mut got_ids, mut got_w, mut got) = (vec![0u32; k], vec![0f32; k], vec![0u32; moe::table_words(k) + 4]);
        gpu.download("router_topk", &ids, &mut got_ids).unwrap();
        gpu.download("router_topk", &w, &mut got_w).unwrap();
        gpu.download("router_topk", &table, &mut got).unwrap();
        let (mut want_ids, mut want_w) = (vec![0u32; k], vec![0f32; k]);
        CpuBackend::new().router_topk(&logits, n_expert, k, &mut want_ids, &mut want_w).unwrap();
        let what = format!("{backend}, seed {seed}: top {k} of {n_expert}");
        assert_eq!(got_ids, want_ids, "{what}: ids");
        assert_eq!(got_w.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), want_w.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), "{what}: weights");
        let mut want = vec![0u32; moe::table_words(k)];
        moe::group(&want_ids, n_expert as u32, &mut want);
        assert_eq!(got[..want.len()], want[..], "{what}: table of {want_ids:?}");
        assert!(got[want.len()..].iter().all(|&w| w == POISON), "{what}: wrote past the table");
    }
}

#[test]
fn router_table_matches_the_spec_cuda() {
    router_table_matches_the_spec("cuda");
}

#[test]
fn router_table_matches_the_spec_hip() {
    router_table_matches_the_spec("hip");
}

/// `router_topk` writes a group table for one token only, into a table that holds it.
#[test]
fn router_table_refuses_bad_sizes() {
    let Some(gpu) = common::open_gpu("cuda") else { return };
    let is_shape = |r: strata::host::Result<()>| matches!(r, Err(Error::Shape { .. }));
    let mut rng = SmallRng::seed_from_u64(common::seed("router_table_refuses_bad_sizes"));
    let (n_expert, k) = (128, 8);
    let dl = gpu.upload("router_topk", &router_logits(&mut rng, 2, n_expert)).unwrap();
    let (mut ids, mut w) = (gpu.upload("router_topk", &[0u32; 16]).unwrap(), gpu.upload("router_topk", &[0f32; 16]).unwrap());
    let mut table = gpu.upload("router_topk", &vec![0u32; moe::table_words(2 * k)]).unwrap();
    assert!(is_shape(gpu.router_topk_queue(&dl, 2, n_expert, k, &mut ids, &mut w, Some(&mut table))));
    let mut short = gpu.upload("router_topk", &vec![0u32; moe::table_words(k) - 1]).unwrap();
    assert!(is_shape(gpu.router_topk_queue(&dl, 1, n_expert, k, &mut ids, &mut w, Some(&mut short))));
    gpu.router_topk_queue(&dl, 1, n_expert, k, &mut ids, &mut w, Some(&mut table)).unwrap();
}

#[test]
fn launcher_refuses_bad_sizes() {
    let Some(gpu) = common::open_gpu("cuda") else { return };
    let is_shape = |r: strata::host::Result<()>| matches!(r, Err(Error::Shape { .. }));
    let ids = gpu.upload("moe_group", &[1u32; MOE_MAX_SELECTIONS + 1]).unwrap();
    let mut table = gpu.upload("moe_group", &vec![0u32; moe::table_words(MOE_MAX_SELECTIONS + 1)]).unwrap();
    assert!(is_shape(gpu.moe_group_queue(&ids, 0, 8, &mut table)));
    assert!(is_shape(gpu.moe_group_queue(&ids, MOE_MAX_SELECTIONS + 1, 8, &mut table)));
    let mut short = gpu.upload("moe_group", &vec![0u32; moe::table_words(8) - 1]).unwrap();
    assert!(is_shape(gpu.moe_group_queue(&ids, 8, 8, &mut short)));
    gpu.moe_group_queue(&ids, 8, 8, &mut table).unwrap();
}

/// The routing gate/up entries (`EXPDEC_ROUTE`: IQ3_ST's `_p2r` and `_p2wr`) of one-token
/// windows, and the fallback where no routing entry serves the window (IQ3_S's pair entry:
/// `moe_queue` launches `router_topk` first), against the replica: from router logits with ties,
/// NaN and infinities, the ids and weights the CPU's `router_topk` picks, the group table
/// `moe::group` makes of them, and the replica window's SwiGLU rows, down rows and combined row
/// over those picks, bit for bit, every output poisoned first and nothing written past it;
/// 8 to 512 experts, `k` from 1 to 16, the grid padded or not. The launches are checked too: the
/// routing entry and no `router_topk`, or the reverse.
#[test]
fn routing_gate_up_matches_the_replica() {
    use strata::host::backends::gpu::{MoeBuffers, MoeStages};
    use strata::host::backends::knobs::ExpertKnobs;
    use strata::host::parity::{moe_xq, run_moe, MoeCase};
    use strata_gpu_shared::formats::{q8_1, WeightFormat};
    let Some(mut gpu) = common::open_gpu("cuda") else { return };
    if !gpu.clusters() {
        assert!(!common::gpu_required() || gpu.info().compute_capability.0 < 9, "an sm_90 device without the cluster entries");
        eprintln!("SKIPPED routing_gate_up_matches_the_replica: this device has no thread-block clusters (sm_90 and later)");
        return;
    }
    let seed = common::seed("routing_gate_up");
    let mut rng = SmallRng::seed_from_u64(seed);
    let cpu = CpuBackend::new();
    let (n_embd, n_ff) = (2048, 64);
    for case in 0..12 {
        let n_expert = [8, 64, 128, 512, rng.random_range(1..=ROUTER_MAX_EXPERTS)][case % 5];
        let k = rng.random_range(1..=ROUTER_MAX_K.min(n_expert));
        // Every third case IQ3_S, whose pair entry has no routing twin.
        let formats = if case % 3 == 2 { (WeightFormat::Iq3S, WeightFormat::Iq4Nl) } else { (WeightFormat::Iq3ST, WeightFormat::Iq4Nl) };
        let knobs = ExpertKnobs { pairs: 2, route: true, warp_rows: case % 2 == 1, ..ExpertKnobs::default() };
        gpu.set_expert_knobs(knobs);
        gpu.set_grid_pad(case % 4 >= 2);
        let logits = router_logits(&mut rng, 1, n_expert);
        let mut case = MoeCase::random(&mut rng, formats, n_expert, n_embd, n_ff, 1, k);
        (case.ids, case.weights) = (vec![0; k], vec![0.0; k]);
        cpu.router_topk(&logits, n_expert, k, &mut case.ids, &mut case.weights).unwrap();
        let xq = moe_xq(&cpu, &case).unwrap();
        let (want_hq, want_y, want_out) = run_moe(&cpu, &case, &xq, 0, false).unwrap();
        let mut want_table = vec![0u32; moe::table_words(k)];
        moe::group(&case.ids, n_expert as u32, &mut want_table);

        // Every buffer one guard word longer than the window, all poisoned.
        let poisoned_u8 = |n: usize| gpu.upload("moe", &vec![0xa5u8; n + 4]).unwrap();
        let poisoned_f32 = |n: usize| gpu.upload("moe", &vec![f32::from_bits(POISON); n + 1]).unwrap();
        let w = case.window(&xq);
        let layer = gpu.upload_layer(w.gate, w.up, w.down).unwrap();
        let mut win = MoeBuffers {
            tokens: 1,
            k,
            ids: gpu.upload("moe", &vec![POISON; k + 1]).unwrap(),
            weights: poisoned_f32(k),
            xq: gpu.upload("moe", &xq).unwrap(),
            table: gpu.upload("moe", &vec![POISON; moe::table_words(k) + 1]).unwrap(),
            grouped: false,
            hq: poisoned_u8(q8_1::bytes_of(k * n_ff)),
            y: poisoned_f32(k * n_embd),
        };
        let mut out = poisoned_f32(n_embd);
        let dl = gpu.upload("router_topk", &logits).unwrap();
        gpu.start_recording();
        gpu.moe_queue(&layer, &mut win, &mut out, false, MoeStages::ALL, None, Some(&dl)).unwrap();
        let launched = gpu.stop_recording();
        let what = format!("seed {seed}: {} gate/up, top {k} of {n_expert}, {}, launched {launched:?}", formats.0.name(), knobs.describe());
        let routes = formats.0 == WeightFormat::Iq3ST;
        let twin = if knobs.warp_rows { "expdec_gu_iq3_st_r1_p2wr" } else { "expdec_gu_iq3_st_r1_p2r" };
        assert_eq!((launched.contains(&twin), launched.contains(&"router_topk"), launched.contains(&"moe_group")), (routes, !routes, false), "{what}");

        // A buffer's first `n` elements as downloaded (floats as their bits).
        macro_rules! got {
            ($d:expr, u32, $n:expr) => {{
                let mut v = vec![0u32; $n];
                gpu.download("moe", $d, &mut v).unwrap();
                v
            }};
            ($d:expr, f32, $n:expr) => {{
                let mut v = vec![0f32; $n];
                gpu.download("moe", $d, &mut v).unwrap();
                v.iter().map(|x| x.to_bits()).collect::<Vec<u32>>()
            }};
        }
        let and_poison = |v: &[u32]| [v, &[POISON]].concat();
        let bits = |v: &[f32]| and_poison(&v.iter().map(|x| x.to_bits()).collect::<Vec<u32>>());
        assert_eq!(got!(&win.ids, u32, k + 1), and_poison(&case.ids), "{what}: ids");
        assert_eq!(got!(&win.weights, f32, k + 1), bits(&case.weights), "{what}: weights");
        assert_eq!(got!(&win.table, u32, want_table.len() + 1), and_poison(&want_table), "{what}: table of {:?}", case.ids);
        let mut hq = vec![0u8; want_hq.len() + 4];
        gpu.download("moe", &win.hq, &mut hq).unwrap();
        assert!(hq == [&want_hq[..], &[0xa5; 4]].concat(), "{what}: hq");
        assert_eq!(got!(&win.y, f32, want_y.len() + 1), bits(&want_y), "{what}: y");
        assert_eq!(got!(&out, f32, n_embd + 1), bits(&want_out), "{what}: out");
    }
}
