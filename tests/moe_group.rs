//! `moe_group` (the routed-expert window's selections to groups, one warp on the device) against
//! the one-thread spec `moe::group`: the whole table, word for word, on random selections with
//! repeated experts and out-of-range ids, from 1 to `MOE_MAX_SELECTIONS` selections. Skipped
//! without a GPU unless `STRATA_REQUIRE_GPU=1`.
mod common;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use strata::host::Error;
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
