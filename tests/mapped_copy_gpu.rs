//! `copy_from_mapped_multi` on the GPU backends: one launch equals one copy per segment, byte
//! for byte, and writes nothing outside the segments. Skips without a GPU unless
//! `STRATA_REQUIRE_GPU=1`.
mod common;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use strata::host::backends::gpu::GpuBackend;
use strata::host::backends::mapped::Segment;
use strata::host::backends::{cuda, hip};
use strata::host::Error;

fn backends() -> Vec<GpuBackend> {
    let mut v = Vec::new();
    for (name, b) in [("cuda", cuda::open(0, strata::ptx::IMAGES)), ("hip", hip::open(0))] {
        match b {
            Ok(b) => v.push(b),
            Err(e) => common::skip_or_fail::<()>(common::gpu_required(), name, &e.to_string()).unwrap_or(()),
        }
    }
    v
}

/// Segments of random lengths (1 byte .. 4 MiB, multiples of 4 or not) at random 4-byte-aligned
/// offsets, some not 16-byte aligned, with gaps between destinations.
fn random_segments(rng: &mut SmallRng, n: usize, host_len: usize) -> (Vec<Segment>, usize) {
    let mut segs = Vec::new();
    let mut dst = 0;
    for i in 0..n {
        let len = match i % 4 {
            0 => rng.random_range(1..64),
            1 => 4096 * rng.random_range(1..16),
            2 => rng.random_range(4096..4 << 20),
            _ => rng.random_range(1..200_000),
        };
        let src = 4 * rng.random_range(0..(host_len - len) / 4);
        dst += 4 * rng.random_range(0..8); // a gap, sometimes none; offsets stay 4-aligned
        segs.push(Segment { src, dst, len });
        dst += len.div_ceil(4) * 4;
    }
    (segs, dst + 64)
}

#[test]
fn one_launch_equals_one_copy_per_segment() {
    let seed = common::seed("one_launch_equals_one_copy_per_segment");
    let mut rng = SmallRng::seed_from_u64(seed);
    for g in backends() {
        let host_len = 24 << 20;
        let mut host = g.alloc_mapped(host_len).unwrap();
        rng.fill(host.as_mut_slice().unwrap());
        let bytes = host.as_mut_slice().unwrap().to_vec();
        for n in [1, 2, 7, 33, 64] {
            let (segs, dst_len) = random_segments(&mut rng, n, host_len);
            let poison = vec![0x5au8; dst_len];
            let mut one = g.upload("copy_from_mapped_multi", &poison).unwrap();
            let mut many = g.upload("copy_from_mapped_multi", &poison).unwrap();
            g.copy_from_mapped_multi(&host, &segs, &mut one).unwrap();
            g.copy_segments_one_by_one(&host, &segs, &mut many).unwrap();
            let (mut a, mut b) = (vec![0u8; dst_len], vec![0u8; dst_len]);
            g.download("copy_from_mapped_multi", &one, &mut a).unwrap();
            g.download("copy_from_mapped_multi", &many, &mut b).unwrap();
            assert!(a == b, "{}: {n} segments: one launch differs from one copy per segment", g.name_static());
            let mut expect = poison.clone();
            for s in &segs {
                expect[s.dst..s.dst + s.len].copy_from_slice(&bytes[s.src..s.src + s.len]);
            }
            if let Some(i) = a.iter().zip(&expect).position(|(x, y)| x != y) {
                panic!("{}: {n} segments: byte {i} is {:#x}, expected {:#x} (outside segments must stay 0x5a)", g.name_static(), a[i], expect[i]);
            }
        }
    }
}

#[test]
fn misaligned_or_oversized_segments_are_errors() {
    for g in backends() {
        let host = g.alloc_mapped(1024).unwrap();
        let mut dst = g.upload("copy_from_mapped_multi", &[0u8; 1024]).unwrap();
        for seg in [Segment { src: 2, dst: 0, len: 8 }, Segment { src: 0, dst: 6, len: 8 }, Segment { src: 1000, dst: 0, len: 100 }, Segment { src: 0, dst: 1000, len: 100 }] {
            let e = g.copy_from_mapped_multi(&host, &[seg], &mut dst).unwrap_err();
            assert!(matches!(e, Error::Shape { kernel: "copy_from_mapped_multi", .. }), "{seg:?}: {e}");
        }
    }
}
