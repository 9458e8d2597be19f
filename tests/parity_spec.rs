//! Speculative verify (`spec_accept`): the CPU replica against a hand-written count on fixed and
//! random windows, shape errors; then `cuda` and `hip` against the replica bit for bit (skipped
//! without a GPU unless `STRATA_REQUIRE_GPU=1`).
mod common;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use strata::host::backends::cpu::CpuBackend;
use strata::host::ops::spec::{parity_cases, window_with_accepted, SpecOps};
use strata::host::Error;
use strata_gpu_shared::replica::spec::accept;


/// The accepted count written out independently: draft `a` is kept while it is the token the
/// model chose after row `a - 1`.
fn count(window: &[u32], next: &[u32]) -> usize {
    let mut a = 1;
    while a < window.len() && window[a] == next[a - 1] {
        a += 1;
    }
    a
}

/// The CPU backend's output for a window at position 1000, checked against [`count`] and
/// `next`, and the sequence moved on: row 0 the last emitted token, the position `want` later,
/// the drafts untouched.
fn check_cpu(window: &[u32], next: &[u32], want: usize) {
    let (mut out, mut moved, mut pos) = (vec![u32::MAX; window.len() + 1], window.to_vec(), 1000);
    CpuBackend::new().spec_accept(&mut moved, next, &mut out, &mut pos).unwrap();
    assert_eq!(out[0] as usize, want, "window {window:?} next {next:?}");
    assert_eq!(out[1..], *next);
    assert_eq!((moved[0], pos as usize), (next[want - 1], 1000 + want), "window {window:?} next {next:?}");
    assert_eq!(moved[1..], window[1..]);
}

#[test]
fn fixed_windows() {
    let next = [11, 12, 13, 14, 15, 16, 17, 18];
    let cases: [(&[u32], usize); 8] = [
        (&[7], 1),                                // no drafts
        (&[7, 11, 12, 13, 14, 15, 16, 17], 8),    // all accepted
        (&[7, 99, 12, 13, 14, 15, 16, 17], 1),    // first rejected, every later draft matches
        (&[7, 11, 12, 99, 14, 15, 16, 17], 3),    // mismatch in the middle, later matches
        (&[7, 11, 12, 13, 14, 15, 16, 99], 7),    // only the last rejected
        (&[11, 11, 12], 3),                       // window[0] is not compared
        (&[7, 12, 13, 14], 1),                    // drafts equal their own row's next: shifted
        (&[7, 11, 0, 13, 0, 15], 2),              // alternating
    ];
    for (window, want) in cases {
        let next = &next[..window.len()];
        assert_eq!(count(window, next), want, "{window:?}");
        assert_eq!(accept(window, next), want, "{window:?}");
        check_cpu(window, next, want);
    }
}

#[test]
fn random_windows() {
    let seed = common::seed("random_windows");
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut seen = [[0usize; 9]; 9];
    for _ in 0..20_000 {
        let tokens = rng.random_range(1..=8);
        let (window, next, forced) = if rng.random_bool(0.5) {
            let a = rng.random_range(1..=tokens);
            let (w, n) = window_with_accepted(&mut rng, tokens, a);
            (w, n, Some(a))
        } else {
            let alphabet = rng.random_range(1..=4);
            let draw = |rng: &mut SmallRng| (0..tokens).map(|_| rng.random_range(0..alphabet)).collect::<Vec<u32>>();
            (draw(&mut rng), draw(&mut rng), None)
        };
        let want = count(&window, &next);
        if let Some(a) = forced {
            assert_eq!(want, a, "seed {seed}: window_with_accepted({tokens}, {a}) gave {window:?} {next:?}");
        }
        assert_eq!(accept(&window, &next), want, "seed {seed}: {window:?} {next:?}");
        check_cpu(&window, &next, want);
        seen[tokens][want] += 1;
    }
    for tokens in 1..=8 {
        assert!((1..=tokens).all(|a| seen[tokens][a] > 0), "seed {seed}: counts seen for {tokens} rows: {:?}", seen[tokens]);
    }
}

#[test]
fn cpu_parity_cases_write_everything() {
    let seed = common::seed("cpu_parity_cases");
    common::check_all(parity_cases(&[&CpuBackend::new()], seed).unwrap());
}

#[test]
fn shape_errors_are_errors() {
    let cpu = CpuBackend::new();
    let is_shape = |r: strata::host::Result<()>| matches!(r, Err(Error::Shape { .. }));
    let (v, mut w) = ([1u32; 9], [1u32; 9]);
    let (mut out, mut pos) = ([0u32; 10], 0u32);
    assert!(cpu.spec_accept(&mut w[..8], &v[..8], &mut out[..9], &mut pos).is_ok());
    assert!(is_shape(cpu.spec_accept(&mut [], &[], &mut out[..1], &mut pos)));
    assert!(is_shape(cpu.spec_accept(&mut w, &v, &mut out, &mut pos)));
    assert!(is_shape(cpu.spec_accept(&mut w[..3], &v[..2], &mut out[..4], &mut pos)));
    assert!(is_shape(cpu.spec_accept(&mut w[..3], &v[..4], &mut out[..4], &mut pos)));
    assert!(is_shape(cpu.spec_accept(&mut w[..3], &v[..3], &mut out[..3], &mut pos)));
    assert!(is_shape(cpu.spec_accept(&mut w[..3], &v[..3], &mut out[..5], &mut pos)));
}

crate::gpu_parity_suite!(cases: parity_cases);

/// The typed launcher refuses window sizes outside 1..=8 and device buffers shorter than the
/// window, and takes longer ones (writing only `tokens + 1` words).
#[test]
fn launcher_checks_device_buffers() {
    let Some(gpu) = common::open_gpu("cuda") else { return };
    let is_shape = |r: strata::host::Result<()>| matches!(r, Err(Error::Shape { .. }));
    let mut rng = SmallRng::seed_from_u64(common::seed("launcher_checks_device_buffers"));
    let (window, next) = window_with_accepted(&mut rng, 5, 3);
    let long = |v: &[u32]| [v, &[0; 4]].concat();
    let (mut dw, dn) = (gpu.upload("spec_accept", &long(&window)).unwrap(), gpu.upload("spec_accept", &long(&next)).unwrap());
    let mut out = gpu.upload("spec_accept", &[u32::MAX; 12]).unwrap();
    let mut short = gpu.upload("spec_accept", &[0u32; 5]).unwrap();
    let mut pos = gpu.upload("spec_accept", &[40u32]).unwrap();
    assert!(is_shape(gpu.spec_accept_queue(&mut dw, &dn, 5, &mut short, &mut pos)));
    assert!(is_shape(gpu.spec_accept_queue(&mut dw, &dn, 0, &mut out, &mut pos)));
    assert!(is_shape(gpu.spec_accept_queue(&mut dw, &dn, 9, &mut out, &mut pos)));
    let mut dshort = gpu.upload("spec_accept", &window[..4]).unwrap();
    assert!(is_shape(gpu.spec_accept_queue(&mut dshort, &dn, 5, &mut out, &mut pos)));
    assert!(is_shape(gpu.spec_accept_queue(&mut dw, &dshort, 5, &mut out, &mut pos)));
    gpu.spec_accept_queue(&mut dw, &dn, 5, &mut out, &mut pos).unwrap();
    let (mut got, mut moved, mut at) = ([0u32; 12], [0u32; 9], [0u32]);
    gpu.download("spec_accept", &out, &mut got).unwrap();
    gpu.download("spec_accept", &dw, &mut moved).unwrap();
    gpu.download("spec_accept", &pos, &mut at).unwrap();
    assert_eq!(got[0], 3);
    assert_eq!(got[1..6], next);
    assert!(got[6..].iter().all(|&w| w == u32::MAX), "{got:?}");
    assert_eq!((moved[0], at[0]), (next[2], 43));
    assert_eq!(moved[1..], long(&window)[1..]);
}

/// The parity suite on the kernel's own code in the simulator, against the replica bit for bit.
#[test]
fn sim_matches_cpu() {
    let seed = common::seed("sim_matches_cpu");
    common::check_all(parity_cases(&[&CpuBackend::new(), &strata::host::backends::sim::SimBackend::new(132)], seed).unwrap());
}
