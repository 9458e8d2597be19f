//! `moe_group` (the routed-expert window's selections to groups, one block on the device) against
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
