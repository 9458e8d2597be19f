//! The simulator itself (`strata_device::arch::sim`, what the `sim` backend runs kernels on):
//! shuffles and barriers mean what they mean on the GPU, and a kernel's faults (an access
//! outside its buffers, a store into an input, a misaligned access, a barrier some threads
//! skip, a copy read before it landed, a shuffle from a returned lane, a trap) end the launch
//! with an error naming the block and thread. Each launch below is a small kernel written here against `arch`.
use strata_device::arch::sim::{launch, Region};
use strata_device::arch::{index, int, mem, sync, warp};

/// An address a launch's closure can share between its threads.
#[derive(Clone, Copy)]
struct Addr(usize);

impl Addr {
    fn of<T>(s: &mut [T]) -> Addr {
        Addr(s.as_mut_ptr() as usize)
    }

    fn f32(self) -> *mut f32 {
        self.0 as *mut f32
    }

    fn u32(self) -> *mut u32 {
        self.0 as *mut u32
    }
}

#[test]
fn shuffles_read_the_named_lane() {
    let mut out = vec![u32::MAX; 64 * 6];
    let at = Addr::of(&mut out);
    let memory = [Region::of(&out, true)];
    launch(1, 64, 0, &memory, || {
        let (t, lane) = (index::thread_idx(), index::lane());
        let v = 1000 * index::warp_in_block() + lane;
        // SAFETY: slot `t + 64 i` of `out` is this thread's.
        unsafe {
            for (i, m) in [1, 2, 4, 8, 16].into_iter().enumerate() {
                mem::st_u32(at.u32().add((t + 64 * i as u32) as usize) as *mut u8, warp::shfl_xor_u32(v, m));
            }
            mem::st_u32(at.u32().add((t + 64 * 5) as usize) as *mut u8, warp::shfl_u32(v, 7));
        }
    })
    .unwrap();
    for t in 0..64u32 {
        let (w, lane) = (t / 32, t % 32);
        for (i, m) in [1, 2, 4, 8, 16].into_iter().enumerate() {
            assert_eq!(out[(t + 64 * i as u32) as usize], 1000 * w + (lane ^ m), "thread {t}, xor {m}");
        }
        assert_eq!(out[(t + 64 * 5) as usize], 1000 * w + 7, "thread {t}, lane 7");
    }
}

/// The warp butterfly of the simulator is `order::butterfly_sum` (the spec's).
#[test]
fn warp_sum_is_the_specs_butterfly() {
    let x: Vec<f32> = (0..32).map(|i| (i as f32 * 0.37).sin() * 10f32.powi(i % 7 - 3)).collect();
    let mut out = vec![f32::NAN; 32];
    let (xa, at) = (Addr(x.as_ptr() as usize), Addr::of(&mut out));
    let memory = [Region::of(&x, false), Region::of(&out, true)];
    launch(1, 32, 0, &memory, || {
        let lane = index::lane() as usize;
        // SAFETY: `x` and `out` hold 32 values; lane `l` writes value `l`.
        unsafe { mem::st_f32(at.f32().add(lane), warp::warp_sum_f32(mem::ld_nc_f32(xa.f32(), lane))) }
    })
    .unwrap();
    let want = strata_gpu_shared::order::butterfly_sum(x.clone().try_into().unwrap());
    assert!(out.iter().all(|v| v.to_bits() == want.to_bits()), "{out:?} against {want}");
}

/// A block barrier orders shared memory: each thread reads its neighbour's store after it; and
/// shared memory starts as 0xff bytes, so a word never stored reads as NaN.
#[test]
fn barriers_order_shared_memory_which_starts_poisoned() {
    let n = 96u32;
    let mut out = vec![0u32; 2 * n as usize];
    let at = Addr::of(&mut out);
    let memory = [Region::of(&out, true)];
    launch(3, n, 4 * (n as usize + 1), &memory, || {
        let (t, b) = (index::thread_idx(), index::block_idx());
        let smem = mem::Smem::dynamic();
        // SAFETY: words 0..=n of the launch's shared memory; `out` slots of block 2 only.
        unsafe {
            smem.st_u32(t, 7 * t + b);
            sync::sync_threads();
            if b == 2 {
                mem::st_u32(at.u32().add(t as usize) as *mut u8, smem.ld_u32((t + 1) % n));
                mem::st_u32(at.u32().add((n + t) as usize) as *mut u8, smem.ld_u32(n));
            }
        }
    })
    .unwrap();
    for t in 0..n {
        assert_eq!(out[t as usize], 7 * ((t + 1) % n) + 2);
        assert_eq!(out[(n + t) as usize], u32::MAX, "a word no thread stored");
    }
}

/// Threads that return early count as arrived at the block's later barriers (as on the GPU).
#[test]
fn returned_threads_do_not_hold_barriers() {
    let mut out = vec![0u32; 64];
    let at = Addr::of(&mut out);
    let memory = [Region::of(&out, true)];
    launch(2, 64, 256, &memory, || {
        let t = index::thread_idx();
        if t >= 40 {
            return;
        }
        let smem = mem::Smem::dynamic();
        // SAFETY: words 0..40 of the shared memory, `out` slot `t`.
        unsafe {
            smem.st_u32(t, t);
            sync::sync_threads();
            mem::st_u32(at.u32().add(t as usize) as *mut u8, smem.ld_u32(39 - t));
        }
    })
    .unwrap();
    assert!((0..40).all(|t| out[t] == 39 - t as u32) && out[40..].iter().all(|&v| v == 0));
}

/// What a failed launch says.
fn fails(threads: u32, memory: &[Region], kernel: impl Fn() + Sync) -> String {
    launch(2, threads, 64, memory, kernel).expect_err("the launch should fail")
}

#[test]
fn faults_are_errors_naming_the_thread() {
    let mut out = vec![0f32; 8];
    let input = vec![1f32; 8];
    let (at, inp) = (Addr::of(&mut out), Addr(input.as_ptr() as usize));
    let memory = [Region::of(&out, true), Region::of(&input, false)];
    // SAFETY (each): the kernels' accesses are the faults under test, which the simulator
    // checks before it makes them.
    let e = fails(32, &memory, || unsafe { mem::st_f32(at.f32().add(8 + index::thread_idx() as usize), 1.0) });
    assert!(e.contains("block 0, thread 0") && e.contains("outside every buffer"), "{e}");
    let e = fails(32, &memory, || unsafe { mem::st_f32(inp.f32(), 1.0) });
    assert!(e.contains("read-only"), "{e}");
    let e = fails(32, &memory, || unsafe {
        mem::ld_nc_u32((at.0 + 2) as *const u8);
    });
    assert!(e.contains("misaligned"), "{e}");
    let e = fails(32, &memory, || unsafe {
        mem::Smem::dynamic().ld_u32(16);
    });
    assert!(e.contains("past the launch's 64"), "{e}");
    let e = fails(64, &memory, || {
        if index::block_idx() == 1 && index::thread_idx() == 37 {
            sync::trap();
        }
    });
    assert!(e.contains("block 1, thread 37") && e.contains("trapped"), "{e}");
    // Half of warp 1 waits at its warp barrier, the rest of the block at the block barrier:
    // neither can release.
    let e = fails(64, &memory, || {
        if index::thread_idx() >= 48 {
            sync::sync_warp();
        }
        sync::sync_threads();
    });
    assert!(e.contains("cannot release"), "{e}");
}

/// The integer operations' host twins, on cases worked out by hand from the PTX ISA's
/// definitions (`prmt.b32` default mode, `dp4a`).
#[test]
fn integer_twins_follow_the_ptx_definitions() {
    let (lo, hi) = (0x8811_2233u32, 0x4455_66f7u32);
    assert_eq!(int::prmt(lo, hi, 0x3210), lo);
    assert_eq!(int::prmt(lo, hi, 0x7654), hi);
    assert_eq!(int::prmt(lo, hi, 0x0415), 0x33f7_2266);
    // Bit 3 of a selector: the byte's sign replicated (0x88 and 0xf7 negative, 0x33 not).
    assert_eq!(int::prmt(lo, hi, 0x8b8c), 0x00ff_00ff);
    assert_eq!(int::prmt(lo, hi, 0xfb80), 0x00ff_0033);
    // Bytes (-1, 2, -128, 127) . (3, -4, 5, 6) = -3 - 8 - 640 + 762 = 111, plus 1000.
    let (a, b) = (u32::from_le_bytes([0xff, 2, 0x80, 127]), u32::from_le_bytes([3, 0xfc, 5, 6]));
    assert_eq!(int::dp4a(a, b, 1000), 1111);
    // Unsigned a: 255 * 3 + 2 * -4 + 128 * 5 + 127 * 6 = 765 - 8 + 640 + 762 = 2159.
    assert_eq!(int::dp4a_us(a, b, 0), 2159);
}

/// A `cp.async` copy lands when its thread waits for it: `wait_group 1` lands all but the newest
/// committed group, `wait_all` the rest; touching a destination before its copy landed (a
/// missing wait, or a buffer refilled while still read) fails the launch.
#[test]
fn async_copies_land_at_their_wait() {
    let src: Vec<u32> = (0..8).collect();
    let mut out = vec![0u32; 8];
    let (from, at) = (Addr(src.as_ptr() as usize), Addr::of(&mut out));
    let memory = [Region::of(&src, false), Region::of(&out, true)];
    let copy_two_groups = || {
        let smem = mem::Smem::dynamic();
        // SAFETY: 16-byte copies of `src` into the launch's 32 bytes of shared memory, aligned.
        unsafe {
            mem::cp_async_16(smem.addr(0), from.0 as *const u8);
            mem::cp_async_commit();
            mem::cp_async_16(smem.addr(4), (from.0 + 16) as *const u8);
            mem::cp_async_commit();
        }
        smem
    };
    let read = |smem: mem::Smem, words: std::ops::Range<usize>| {
        for w in words {
            // SAFETY: `out` holds 8 words.
            unsafe { mem::st_u32(at.u32().add(w) as *mut u8, smem.ld_u32(w as u32)) }
        }
    };
    launch(1, 1, 32, &memory, || {
        let smem = copy_two_groups();
        mem::cp_async_wait_groups::<1>();
        read(smem, 0..4);
        mem::cp_async_wait_all();
        read(smem, 4..8);
    })
    .unwrap();
    assert_eq!(out, src);
    let e = launch(1, 1, 32, &memory, || {
        let smem = copy_two_groups();
        mem::cp_async_wait_groups::<1>();
        read(smem, 4..5); // the second group is still in flight
    })
    .expect_err("a read of a copy in flight");
    assert!(e.contains("in flight"), "{e}");
}

/// A shuffle that reads a lane which has returned fails the launch (on the GPU it reads an
/// undefined value or hangs).
#[test]
fn shuffles_from_returned_lanes_fail() {
    let e = launch(1, 32, 0, &[], || {
        if index::lane() == 3 {
            return;
        }
        warp::shfl_u32(7, 3);
    })
    .expect_err("a shuffle from a returned lane");
    assert!(e.contains("lane 3, which has returned"), "{e}");
}
