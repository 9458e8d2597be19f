//! CPU-only: the replicas against float64 math and against an independent reading of the spec.
//! Runs everywhere, in CI included.
mod common;

use half::f16;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use strata::host::backends::cpu::CpuBackend;
use strata::host::parity::{self, NMSE_MAX};
use strata::host::{Backend, Error, Weights};
use strata_gpu_shared::formats::tiles::Regroup;
use strata_gpu_shared::formats::{iq3_s, iq3_st, iq4_nl, iq4_nlt, q6_k, q6_kt, q8_0, q8_0t, q8_1, FloatFormat, WeightFormat, GROUP};
use strata_gpu_shared::replica;
use strata_gpu_shared::lane_grids::GRID_LANES;

/// Random shapes (rows 1..8, K 32..8192 in steps of 32, M up to 4096): the replica's NMSE
/// against float64 on the dequantized weights and unquantized activations stays under 5e-4;
/// every other case accumulating into random outputs gives `add_f32` of them and its output.
#[test]
fn mmvq_replica_matches_float64() {
    let seed = common::seed("mmvq_replica_matches_float64");
    let mut rng = SmallRng::seed_from_u64(seed);
    let cpu = CpuBackend::new();
    for format in WeightFormat::MATVEC {
        for case in 0..4 {
            // Alternate wide and tall so both ends of the range are hit without a 4096x8192x8 case
            // every time.
            let (max_m, max_k) = if case % 2 == 0 { (4096, 1024) } else { (256, 8192) };
            let (m, k, rows) = parity::random_mmvq_shape(&mut rng, format, max_m, max_k);
            let m = m.max(parity::NMSE_MIN_VALUES); // enough outputs for NMSE to mean something
            let case_seed = rng.random();
            let out = parity::mmvq_case(&[&cpu], format, m, k, rows, case_seed, true, case % 2 == 1).unwrap();
            let e = out.nmse.expect("NMSE measured");
            eprintln!("  {} {} seed {case_seed}: NMSE {e:.2e}", out.kernel, out.shape);
            assert!(out.passed(), "{}", out.explain());
            assert!(e <= NMSE_MAX);
        }
    }
}

/// The float matvec replica (router weights) against float64: f32 products and sums only, so far
/// under the bar; accumulating, as `mmvq`'s.
#[test]
fn matvec_replica_matches_float64() {
    let seed = common::seed("matvec_replica_matches_float64");
    let mut rng = SmallRng::seed_from_u64(seed);
    let cpu = CpuBackend::new();
    for format in FloatFormat::ALL {
        for case in 0..4 {
            let (m, k, rows) = (rng.random_range(32..=1024), rng.random_range(1..=4096), rng.random_range(1..=8));
            let out = parity::matvec_case(&[&cpu], format, m, k, rows, rng.random(), case % 2 == 1).unwrap();
            let e = out.nmse.expect("NMSE measured");
            eprintln!("  {} {}: NMSE {e:.2e}", out.kernel, out.shape);
            assert!(out.passed() && e < 1e-10, "{}", out.explain());
        }
    }
}

/// Each q8_1 block against the spec read independently (std rounding, the `half` crate).
#[test]
fn quantize_replica_follows_the_spec() {
    let seed = common::seed("quantize_replica_follows_the_spec");
    let mut rng = SmallRng::seed_from_u64(seed);
    let x = parity::random_activations(&mut rng, 32 * 20_000);
    let mut out = vec![0u8; q8_1::bytes_of(x.len())];
    CpuBackend::new().quantize_q8_1(&x, &mut out).unwrap();
    for (g, (xs, b)) in x.chunks(GROUP).zip(out.chunks(q8_1::BYTES)).enumerate() {
        let amax = xs.iter().map(|v| v.abs()).fold(0.0f32, f32::max);
        let d = f16::from_f32((amax / 127.0).min(65504.0));
        assert_eq!(u16::from_le_bytes([b[0], b[1]]), d.to_bits(), "group {g}: d");
        let df = d.to_f32();
        let mut sum = 0i64;
        for (j, &v) in xs.iter().enumerate() {
            let want = if df == 0.0 { 0.0 } else { (v / df).round_ties_even().clamp(-127.0, 127.0) };
            let q = b[4 + j] as i8;
            assert_eq!(q as f32, want, "group {g} value {j}: x {v:e}, d {df:e}");
            if df != 0.0 && amax / 127.0 <= 65504.0 {
                // Reconstruction within half a step, or for a value clamped to +-127 steps
                // (d rounded below amax / 127) within amax - 127 d: the fp16 rounding of d
                // taken as it is (a subnormal d, below 2^-14, is rounded to a multiple of
                // 2^-24, so more than 2^-11 of itself).
                let err = (v as f64 - df as f64 * q as f64).abs();
                let bound = (0.5 * df as f64).max(amax as f64 - 127.0 * df as f64);
                assert!(err <= bound * 1.0001, "group {g} value {j}: error {err:e} with d {df:e}, bound {bound:e}");
            }
            sum += q as i64;
        }
        assert_eq!(u16::from_le_bytes([b[2], b[3]]), f16::from_f32(df * sum as f32).to_bits(), "group {g}: s");
    }
}

/// The multi-threaded CPU backend gives the replica's bits for every row, whatever the split.
#[test]
fn cpu_backend_split_matches_single_thread_replica() {
    let seed = common::seed("cpu_backend_split_matches_single_thread_replica");
    let mut rng = SmallRng::seed_from_u64(seed);
    for format in WeightFormat::MATVEC {
        let (m, k, rows) = parity::random_mmvq_shape(&mut rng, format, 300, 1280);
        let data = parity::random_weights(&mut rng, format, m, k);
        let w = Weights { format, m, k, data: &data };
        let x = parity::random_activations(&mut rng, rows * k);
        let mut xq = vec![0u8; q8_1::bytes_of(rows * k)];
        replica::quantize_q8_1::quantize(&x, &mut xq);
        let mut y = vec![f32::NAN; rows * m];
        CpuBackend::new().mmvq(&w, &xq, rows, false, &mut y).unwrap();
        let rb = format.row_bytes(k);
        let xb = q8_1::bytes_of(k);
        for r in 0..rows {
            for i in 0..m {
                let want = replica::mmvq::row_dot(format, &data[i * rb..(i + 1) * rb], &xq[r * xb..(r + 1) * xb]);
                assert_eq!(y[r * m + i].to_bits(), want.to_bits(), "{format:?} {m}x{k} row {r} out {i}");
            }
        }
    }
}

/// Every tiled layout moves every byte of its blocks to its place in the tile: group g of a tile
/// decodes to its block's values and scale, for random blocks (every scale and byte drawn);
/// each tile holds its blocks' bytes, none lost or repeated; and the bytes sit where the
/// kernels' loaders read them (the layout constants, read here byte by byte: Q8_0T's quant
/// halves and scale, IQ4_NLT's nibbles and scale, IQ3_ST's indices, reordered signs, high bits,
/// scales and scale; Q6_KT's regrouped nibbles and high bits of every group, scales and scale),
/// 16-byte fields 16-byte aligned within a tile (IQ3_ST's 8- and 4-byte loads: a const
/// assertion in `formats::iq3_st`). Q6_KT and IQ3_ST move bits, not bytes: every tile holds
/// its blocks' bits (as many ones), the others their bytes.
#[test]
fn tiles_decode_to_their_blocks() {
    let seed = common::seed("tiles_decode_to_their_blocks");
    let mut rng = SmallRng::seed_from_u64(seed);
    for format in WeightFormat::TILED {
        let t = format.tiling().unwrap();
        let (base, bb) = (t.base, t.base.block_bytes());
        assert_eq!(format.base(), base);
        assert_eq!(base.tiled(), Some(format));
        assert_eq!((format.block_bytes(), format.block_values()), (t.blocks * bb, t.blocks * base.block_values()));
        assert_eq!(t.fields.iter().map(|f| f.1).sum::<usize>(), bb, "{}: the fields cover a block", format.name());
        assert_eq!(format.block_bytes() % 16, 0, "{}: rows of whole tiles keep tiles 16-byte aligned", format.name());
        let tiles = 5;
        let mut blocks = vec![0u8; tiles * format.block_bytes()];
        rng.fill(&mut blocks[..]);
        let mut tiled = vec![0xa5u8; blocks.len()];
        t.tile(&blocks, &mut tiled);
        for (n, (tile, src)) in tiled.chunks_exact(format.block_bytes()).zip(blocks.chunks_exact(format.block_bytes())).enumerate() {
            for (b, block) in src.chunks_exact(bb).enumerate() {
                let gpb = base.groups_per_block();
                for g in 0..gpb {
                    let want = replica::decode_group(base, block, g);
                    assert_eq!(replica::decode_group(format, tile, b * gpb + g), want, "seed {seed}: {} tile {n}, block {b}, group {g}", format.name());
                }
                // Where the kernels read block b: (offset in the tile, offset in the block, bytes).
                let reads: Vec<(usize, usize, usize)> = match format {
                    WeightFormat::Q8_0T => vec![(q8_0t::OFF_LO + 16 * b, q8_0::OFF_Q, 16), (q8_0t::OFF_HI + 16 * b, q8_0::OFF_Q + 16, 16), (q8_0t::OFF_D + 2 * b, q8_0::OFF_D, 2)],
                    WeightFormat::Iq4NlT => vec![(iq4_nlt::OFF_QS + 16 * b, iq4_nl::OFF_QS, 16), (iq4_nlt::OFF_D + 2 * b, iq4_nl::OFF_D, 2)],
                    WeightFormat::Iq3ST => {
                        iq3_st_signs_where_read(tile, block, b, seed);
                        vec![
                        (iq3_st::OFF_QS + 64 * b, iq3_s::OFF_QS, 64),
                        (iq3_st::OFF_QH + 8 * b, iq3_s::OFF_QH, 8),
                        (iq3_st::OFF_SCALES + 4 * b, iq3_s::OFF_SCALES, 4),
                        (iq3_st::OFF_D + 2 * b, iq3_s::OFF_D, 2),
                    ]
                    }
                    WeightFormat::Q6KT => {
                        q6_kt_groups_where_read(tile, block, b, seed);
                        vec![(q6_kt::OFF_SCALES + 16 * b, q6_k::OFF_SCALES, 16), (q6_kt::OFF_D + 2 * b, q6_k::OFF_D, 2)]
                    }
                    f => panic!("{} has no loader offsets listed here", f.name()),
                };
                for (at, from, len) in reads {
                    assert!(len != 16 || at % 16 == 0, "{}: a 16-byte field at {at}", format.name());
                    assert_eq!(&tile[at..at + len], &block[from..from + len], "seed {seed}: {} tile {n}, block {b}, tile offset {at}", format.name());
                }
            }
            let ones = |b: &[u8]| b.iter().map(|x| x.count_ones()).sum::<u32>();
            assert_eq!(ones(tile), ones(src), "seed {seed}: {} tile {n} does not hold its blocks' bits", format.name());
            if t.regroup == Regroup::None {
                let (mut a, mut b) = (tile.to_vec(), src.to_vec());
                a.sort_unstable();
                b.sort_unstable();
                assert_eq!(a, b, "seed {seed}: {} tile {n} is not a permutation of its blocks' bytes", format.name());
            }
        }
    }
}

/// Where the IQ3_ST loaders read the signs of group `k` of block `b` (`8 b + k` of the tile):
/// the 4 bytes at `OFF_SIGNS + 4 g`, read as a little-endian word, hold the sign of byte j of
/// decoded word i (value `4 i + j`) at bit `4 j + i` for the first four words and `16 + 4 j + i
/// - 4` for the last four; the values' signs read from the IQ3_S block as GGUF lays them out
/// (value v of group k: bit `v % 8` of `signs[4 k + v / 8]`).
fn iq3_st_signs_where_read(tile: &[u8], block: &[u8], b: usize, seed: u64) {
    for k in 0..8 {
        let g = 8 * b + k;
        let at = iq3_st::OFF_SIGNS + 4 * g;
        let word = u32::from_le_bytes(tile[at..at + 4].try_into().unwrap());
        for v in 0..32 {
            let (i, j) = (v / 4, v % 4);
            let bit = if i < 4 { 4 * j + i } else { 16 + 4 * j + i - 4 };
            let want = block[iq3_s::OFF_SIGNS + 4 * k + v / 8] >> (v % 8) & 1;
            assert_eq!((word >> bit & 1) as u8, want, "seed {seed}: IQ3_ST group {g}, sign of value {v}");
        }
    }
}

/// Where the Q6_KT loaders read group `k` of block `b` (`8 b + k` of the tile): 16 nibble bytes
/// at `OFF_QL + 16 g`, byte j holding value j's nibble low and value j + 16's high, and 8
/// high-bit bytes at `OFF_QH + 8 g`, bits 2s of byte `4 u + c` holding value `16 u + 4 s + c`'s
/// two high bits; the values read from the Q6_K block as GGUF lays them out (group k: half `k
/// / 4`, quarter `k % 4`: nibble `q / 2` of `ql[64 h + 32 (q % 2) + i]`, bits `2 q` of `qh[32
/// h + i]`).
fn q6_kt_groups_where_read(tile: &[u8], block: &[u8], b: usize, seed: u64) {
    for k in 0..8 {
        let (h, q, g) = (k / 4, k % 4, 8 * b + k);
        let v: Vec<u8> = (0..32).map(|i| (block[q6_k::OFF_QL + 64 * h + 32 * (q % 2) + i] >> (4 * (q / 2)) & 15) | (block[q6_k::OFF_QH + 32 * h + i] >> (2 * q) & 3) << 4).collect();
        for j in 0..16 {
            assert_eq!(tile[q6_kt::OFF_QL + 16 * g + j], v[j] & 15 | (v[j + 16] & 15) << 4, "seed {seed}: Q6_KT group {g}, nibble byte {j}");
        }
        for (i, &x) in v.iter().enumerate() {
            let (u, s, c) = (i / 16, i / 4 % 4, i % 4);
            assert_eq!(tile[q6_kt::OFF_QH + 8 * g + 4 * u + c] >> (2 * s) & 3, x >> 4, "seed {seed}: Q6_KT group {g}, high bits of value {i}");
        }
    }
    assert_eq!(q6_kt::OFF_QL % 16 + q6_kt::OFF_QH % 8, 0, "Q6_KT's 16- and 8-byte loads are aligned in a tile");
}

/// Bad shapes are errors naming the kernel, on every backend, never panics.
#[test]
fn shape_errors_name_the_kernel() {
    let cpu = CpuBackend::new();
    let err = cpu.quantize_q8_1(&[0.0; 33], &mut [0u8; 36]).unwrap_err();
    assert!(matches!(err, Error::Shape { kernel: "quantize_q8_1", .. }), "{err}");
    let err = cpu.quantize_q8_1(&[0.0; 64], &mut [0u8; 36]).unwrap_err();
    assert!(err.to_string().contains("quantize_q8_1"), "{err}");
    let data = vec![0u8; 34 * 2];
    let w = Weights { format: WeightFormat::Q8_0, m: 2, k: 32, data: &data };
    let xq = vec![0u8; 36];
    for (rows, ylen, wk) in [(0, 0, 32), (9, 18, 32), (1, 3, 32), (1, 2, 48)] {
        let w = Weights { k: wk, ..w };
        let err = cpu.mmvq(&w, &xq, rows, false, &mut vec![0.0; ylen]).unwrap_err();
        assert!(err.to_string().starts_with("kernel mmvq_q8_0:"), "{err}");
    }
    let short = Weights { data: &data[..60], ..w };
    assert!(cpu.mmvq(&short, &xq, 1, false, &mut [0.0; 2]).unwrap_err().to_string().contains("need 68 bytes"));
}

/// The repeated codebooks the EXPDEC gate/up kernels stage: for the formats that have one, words
/// `w * GRID_LANES .. (w + 1) * GRID_LANES` are all the codebook's word `w`, whose magnitudes
/// are positive (the kernels negate them by `(m ^ 0xff) + 1`, which carries only from a zero
/// byte); the others stage their codebook as it is.
#[test]
fn lane_grids_repeat_each_word_once_a_lane() {
    let mut repeated = 0;
    for format in WeightFormat::MATVEC {
        let (grid, staged) = (format.grid(), format.staged_grid());
        if !format.lane_grid() {
            assert_eq!(staged, grid, "{}", format.name());
            continue;
        }
        repeated += 1;
        assert!(!grid.is_empty() && staged.len() == GRID_LANES * grid.len(), "{}", format.name());
        assert_eq!(staged.as_ptr() as usize % 16, 0, "{}: staged with 16-byte loads", format.name());
        for (at, &word) in staged.iter().enumerate() {
            let w = at / GRID_LANES;
            assert_eq!(word, grid[w], "{} word {w} copy {}", format.name(), at % GRID_LANES);
            for i in 0..4 {
                assert!((word >> (8 * i)) as u8 as i8 > 0, "{} word {w} byte {i}: magnitudes are positive", format.name());
            }
        }
    }
    assert_eq!(repeated, 1, "IQ3_ST stages a repeated codebook");
}
