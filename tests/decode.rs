//! The whole decode step on random models: window invariance (a position's logits are the same
//! bits whatever window it is decoded in) on every backend, graph replay = eager launches =
//! launches unchained (where the backend chains them by programmatic dependent launch),
//! cuda = hip = cpu bit for bit at every position of a decode, speculation keeping the tokens,
//! one q/k/v matrix giving the bits of three, residual adds fused into their producers giving
//! the bits of the separate adds, and each RMSNorm fused with the quantization of its output
//! giving the bits of the two ops. GPU cases skip without a GPU unless `STRATA_REQUIRE_GPU=1`.
mod common;

use std::sync::Arc;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use strata::host::generate::{forced_logits, generate, Draft, Request, Stop};
use strata::host::gguf::{GgmlType, GgufFile};
use strata::host::model::synth::{build_in_memory, SynthSpec};
use strata::host::model::{qwen35moe, qwen3moe, LoadOptions, Mixer, Model, QkvProj};
use strata::host::ops::route::SampleParams;
use strata::host::step::cpu::CpuExecutor;
use strata::host::backends::knobs::KernelKnobs;
use strata::host::step::gpu::GpuExecutor;
use strata::host::step::{fuse, Act, Executor, Op, Pick, Window};
use strata_gpu_shared::formats::WeightFormat;
use strata_gpu_shared::launch::norm::NQ_MAX_N;

/// A small model of the given shape, random weights from `seed`.
fn model(seed: u64, heads: (usize, usize), head_dim: usize, experts: (usize, usize), formats: (WeightFormat, WeightFormat)) -> Arc<Model> {
    model_of_width(seed, 256, heads, head_dim, experts, 64, formats)
}

/// [`model`] with `n_embd` values a row.
fn model_of_width(seed: u64, n_embd: usize, heads: (usize, usize), head_dim: usize, experts: (usize, usize), n_ff: usize, formats: (WeightFormat, WeightFormat)) -> Arc<Model> {
    let mut spec = SynthSpec::tiny();
    spec.seed = seed;
    spec.vocab = false;
    let c = &mut spec.config;
    (c.n_layer, c.n_embd, c.n_head, c.n_head_kv, c.head_dim) = (2, n_embd, heads.0, heads.1, head_dim);
    (c.n_expert, c.n_expert_used, c.n_ff_exp, c.n_vocab) = (experts.0, experts.1, n_ff, 512);
    spec.formats.gu = GgmlType::Quant(formats.0);
    spec.formats.down = GgmlType::Quant(formats.1);
    load(build_in_memory(&spec), &format!("<synthetic seed {seed}>"))
}

/// A model from GGUF bytes (`name` in errors).
fn load(bytes: Vec<u8>, name: &str) -> Arc<Model> {
    let file = GgufFile::from_bytes(bytes, name).unwrap_or_else(|e| panic!("{name} parses: {e}"));
    Arc::new(Model::load(Arc::new(file)).unwrap_or_else(|e| panic!("{name} loads: {e}")))
}

/// A small qwen35moe (`SynthSpec::qwen35moe_tiny`: GDN, attention, GDN, attention, shared
/// experts) with `heads` = (value, key) Gated DeltaNet heads of `d_state` and `d_conv` taps.
fn hybrid(seed: u64, heads: (usize, usize), d_state: usize, d_conv: usize) -> Arc<Model> {
    let mut spec = SynthSpec::qwen35moe_tiny();
    spec.seed = seed;
    spec.config.n_vocab = 512;
    let h = spec.hybrid.as_mut().expect("a hybrid preset");
    (h.n_v_heads, h.n_k_heads, h.d_state, h.d_conv) = (heads.0, heads.1, d_state, d_conv);
    load(build_in_memory(&spec), &format!("<synthetic qwen35moe seed {seed}>"))
}

/// Two qwen3moe shapes and two qwen35moe ones (value heads tiled over key heads; as many of
/// each).
fn models(seed: u64) -> Vec<Arc<Model>> {
    vec![
        model(seed, (4, 2), 32, (8, 2), (WeightFormat::Iq3S, WeightFormat::Iq4Nl)),
        model(seed + 1, (8, 1), 64, (16, 4), (WeightFormat::Iq2Xs, WeightFormat::Q8_0)),
        hybrid(seed + 2, (4, 2), 64, 4),
        hybrid(seed + 3, (2, 2), 32, 3),
    ]
}

/// A model whose q/k/v matrices and head have rows of 2,048 values, which the GPU holds tiled
/// (`Q8_0T`), and whose output projection (512 values a row) it does not; whose IQ4_NL expert
/// down rows (256 values) and IQ3_S gate/up rows (2,048) it holds tiled (`IQ4_NLT`, `IQ3_ST`).
fn wide(seed: u64) -> Arc<Model> {
    let m = model_of_width(seed, 2048, (8, 2), 64, (8, 2), 256, (WeightFormat::Iq3S, WeightFormat::Iq4Nl));
    let tiled = strata::host::step::gpu::tiled_weights(&m);
    let mut names: Vec<&str> = tiled.keys().map(|&id| m.weights.get(id).name.as_str()).collect();
    names.sort();
    assert_eq!(tiled.get(&m.weights.output), Some(&WeightFormat::Q8_0T), "the head is not tiled: {names:?}");
    for l in &m.weights.layers {
        let Mixer::Attention(a) = &l.mixer else { panic!("a qwen3moe layer attends") };
        let QkvProj::Fused { qkv, .. } = &a.proj else { panic!("q, k and v of one type are one matrix") };
        assert!(tiled.get(qkv) == Some(&WeightFormat::Q8_0T) && !tiled.contains_key(&a.o), "q/k/v tiled, the output projection (512 values a row) not: {names:?}");
        assert!(
            tiled.get(&l.down) == Some(&WeightFormat::Iq4NlT) && tiled.get(&l.gate) == Some(&WeightFormat::Iq3ST) && tiled.get(&l.up) == Some(&WeightFormat::Iq3ST),
            "IQ4_NL down and IQ3_S gate/up (2,048 values a row) tiled: {names:?}"
        );
    }
    assert_eq!(tiled.len(), 1 + 4 * m.weights.layers.len(), "{names:?}");
    drop(names);
    m
}

/// The built-in model (`SynthSpec::tiny()`: 4 layers, with its vocabulary).
fn builtin() -> Arc<Model> {
    load(build_in_memory(&SynthSpec::tiny()), "<built-in>")
}

/// `m`'s file loaded again with every layer's q, k and v kept as three matrices (the split
/// path, which files whose q, k, v types differ take).
fn split_qkv(m: &Model) -> Arc<Model> {
    Arc::new(Model::load_with(m.weights.file.clone(), LoadOptions { fuse_qkv: false }).expect("loads with q, k, v split"))
}

/// Per attention layer (the MTP block's last): whether its q, k and v are one matrix.
fn fused_layers(m: &Model) -> Vec<bool> {
    let fused = |l: &strata::host::model::LayerWeights| match &l.mixer {
        Mixer::Attention(a) => Some(matches!(a.proj, QkvProj::Fused { .. })),
        Mixer::DeltaNet(_) => None,
    };
    m.weights.all_layers().filter_map(fused).collect()
}

/// The built-in model without its vocabulary, layer 0's `attn_v` rewritten as F32 (random): its
/// q, k and v types differ, so that layer keeps three matrices and the others fuse theirs.
fn mixed_qkv(seed: u64) -> Arc<Model> {
    let mut rng = SmallRng::seed_from_u64(seed);
    let c = SynthSpec::tiny().config;
    let v: Vec<u8> = (0..c.n_embd * c.n_head_kv * c.head_dim).flat_map(|_| (rng.random_range(-1.0f32..1.0) / 16.0).to_le_bytes()).collect();
    rewritten(|t| {
        let x = t.iter_mut().find(|x| x.0 == "blk.0.attn_v.weight").unwrap();
        (x.2, x.3) = (GgmlType::F32, v.clone());
    })
}

fn gpu_executor(name: &str, m: Arc<Model>, n_ctx: usize) -> Option<Box<dyn Executor>> {
    gpu_executor_with(name, m, n_ctx, Launches { graphs: true, chained: true }).map(|(_, e)| e)
}

/// How a GPU executor launches the step: replaying captured graphs or eagerly (`--no-graph`),
/// chained by programmatic dependent launch where the backend can, or not (`STRATA_PDL=0`).
#[derive(Clone, Copy)]
struct Launches {
    graphs: bool,
    chained: bool,
}

/// A GPU executor launching as `how` asks, labelled (None without the GPU, and for unchained
/// launches where the backend never chains: its other executors already are).
fn gpu_executor_with(name: &str, m: Arc<Model>, n_ctx: usize, how: Launches) -> Option<(String, Box<dyn Executor>)> {
    let mut g = common::open_gpu(name)?;
    let chains = g.set_chained(true);
    if !how.chained && !chains {
        return None;
    }
    g.set_chained(how.chained);
    let mut exec = GpuExecutor::new(g, m, n_ctx, false).expect("the model fits the GPU");
    exec.set_graphs(how.graphs);
    assert_eq!(exec.graphs_on(), how.graphs);
    let label = format!("{name} {}{}", if how.graphs { "graphs" } else { "eager" }, if exec.backend().chained() { ", chained" } else { "" });
    Some((label, Box::new(exec)))
}

fn executor(name: &str, m: Arc<Model>, n_ctx: usize) -> Option<Box<dyn Executor>> {
    match name {
        "cpu" => Some(Box::new(CpuExecutor::new(m, n_ctx).expect("cpu executor"))),
        gpu => gpu_executor(gpu, m, n_ctx),
    }
}

/// The executors a backend's same-results tests run on: the CPU's one, or a GPU's with graphs
/// and without, and (where the backend chains its launches) with graphs unchained (labelled).
fn executors(name: &str, m: &Arc<Model>, n_ctx: usize) -> Vec<(String, Box<dyn Executor>)> {
    match name {
        "cpu" => vec![("cpu".into(), executor("cpu", m.clone(), n_ctx).expect("cpu executor"))],
        gpu => [(true, true), (false, true), (true, false)]
            .into_iter()
            .filter_map(|(graphs, chained)| gpu_executor_with(gpu, m.clone(), n_ctx, Launches { graphs, chained }))
            .collect(),
    }
}

fn first_difference(a: &[f32], b: &[f32], n_vocab: usize) -> Option<String> {
    let i = a.iter().zip(b).position(|(x, y)| x.to_bits() != y.to_bits())?;
    Some(format!("position {} logit {}: {:e} vs {:e}", i / n_vocab, i % n_vocab, a[i], b[i]))
}

/// Logits of a 600-position sequence (three 256-key attention chunks; on the qwen35moe models,
/// through their Gated DeltaNet states) fed in windows of every size 1..8: identical bits at
/// every position; on a GPU, with the step replayed from its captured graphs and launched
/// eagerly, all against the first.
fn window_invariance(backend: &str) {
    let seed = common::seed(&format!("window_invariance_{backend}"));
    let mut rng = SmallRng::seed_from_u64(seed);
    for m in models(seed) {
        let n_vocab = m.config.n_vocab;
        let seq: Vec<u32> = (0..600).map(|_| rng.random_range(0..n_vocab as u32)).collect();
        let ops = m.step_ops(Op::Pick(Pick::Greedy));
        let mut alone: Option<Vec<f32>> = None;
        for (label, mut exec) in executors(backend, &m, 640) {
            for window in 1..=8 {
                let got = forced_logits(exec.as_mut(), &ops, &seq, window).expect("decode");
                match &alone {
                    None => {
                        assert!(got.iter().all(|v| v.is_finite()), "{label}: non-finite logits");
                        alone = Some(got);
                    }
                    Some(want) => {
                        if let Some(d) = first_difference(want, &got, n_vocab) {
                            panic!("{label}, seed {seed}, window {window} differs from the first run (window 1) at {d}");
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn window_invariance_cpu() {
    window_invariance("cpu");
}

#[test]
fn window_invariance_cuda() {
    window_invariance("cuda");
}

#[test]
fn window_invariance_hip() {
    window_invariance("hip");
}

/// A 64-token decode (greedy, then sampled) from a 5-token prompt: the GPU backend's tokens and
/// the logits of every position equal the CPU replica's bit for bit, on [`models`] and on one
/// whose matvec weights the GPU holds tiled ([`wide`]).
fn backend_matches_cpu(backend: &str) {
    let seed = common::seed(&format!("backend_matches_cpu_{backend}"));
    let mut rng = SmallRng::seed_from_u64(seed);
    for m in models(seed).into_iter().chain([wide(seed + 4)]) {
        let n_vocab = m.config.n_vocab as u32;
        let prompt: Vec<u32> = (0..5).map(|_| rng.random_range(0..n_vocab)).collect();
        for pick in [Pick::Greedy, Pick::Sample(SampleParams { temperature: 0.8, top_k: 40, top_p: 0.95, seed })] {
            let ops = m.step_ops(Op::Pick(pick));
            let req = Request { prompt: prompt.clone(), n_predict: 64, window: 3, spec: 1, stop: vec![], ignore_eos: true, want_logits: true, draft: Draft::Lookup };
            let run = |exec: &mut dyn Executor| {
                let (mut ids, mut logits) = (Vec::new(), Vec::new());
                generate(exec, &ops, &req, |id, l| {
                    ids.push(id);
                    logits.extend_from_slice(l.expect("logits asked for"));
                    Ok(())
                })
                .expect("decode");
                (ids, logits)
            };
            let Some(mut gpu) = gpu_executor(backend, m.clone(), 128) else { return };
            let mut cpu = CpuExecutor::new(m.clone(), 128).expect("cpu executor");
            let (want_ids, want) = run(&mut cpu);
            let (ids, got) = run(gpu.as_mut());
            assert_eq!(want.len(), 64 * n_vocab as usize);
            if let Some(d) = first_difference(&want, &got, n_vocab as usize) {
                panic!("{backend} vs cpu, seed {seed}, {pick:?}: {d}");
            }
            assert_eq!(ids, want_ids, "{backend} vs cpu tokens, seed {seed}, {pick:?}");
        }
    }
}

#[test]
fn cuda_matches_cpu() {
    backend_matches_cpu("cuda");
}

/// The MTP block's logits and drafts on a GPU backend equal the CPU replica's bit for bit: a
/// 40-token sequence fed to the trunk in windows of every size 1..8, the MTP step after each
/// window over its positions (fed the tokens that follow them), then three chained one-token
/// MTP steps.
fn mtp_matches_cpu(backend: &str) {
    let seed = common::seed(&format!("mtp_matches_cpu_{backend}"));
    let mut rng = SmallRng::seed_from_u64(seed);
    let m = hybrid(seed, (4, 2), 64, 4);
    let (ops, mtp) = (m.step_ops(Op::Pick(Pick::Greedy)), m.mtp_ops().expect("the tiny qwen35moe has an MTP block"));
    let seq: Vec<u32> = (0..40).map(|_| rng.random_range(0..m.config.n_vocab as u32)).collect();
    // Every window size, in an order of the seed's.
    let mut sizes: Vec<usize> = (1..=8).collect();
    sizes.sort_by_key(|_| rng.random::<u32>());
    let run = |exec: &mut dyn Executor| {
        let (mut logits, mut drafts) = (Vec::new(), Vec::new());
        let mut pos0 = 0;
        for &size in sizes.iter().cycle() {
            if pos0 == seq.len() - 1 {
                break;
            }
            let tokens = size.min(seq.len() - 1 - pos0);
            exec.set_tokens(&seq[pos0..pos0 + tokens]).unwrap();
            exec.run(&ops, Window { tokens, pos0 }).unwrap();
            exec.next_ids(tokens).unwrap();
            exec.set_tokens(&seq[pos0 + 1..=pos0 + tokens]).unwrap();
            exec.run(&mtp, Window { tokens, pos0 }).unwrap();
            drafts.extend(exec.next_ids(tokens).unwrap());
            logits.extend(exec.logits(tokens).unwrap());
            pos0 += tokens;
        }
        for pos0 in seq.len() - 1..seq.len() + 2 {
            exec.set_tokens(&[*drafts.last().unwrap()]).unwrap();
            exec.run(&mtp, Window { tokens: 1, pos0 }).unwrap();
            drafts.extend(exec.next_ids(1).unwrap());
            logits.extend(exec.logits(1).unwrap());
        }
        (logits, drafts)
    };
    let mut cpu = CpuExecutor::new(m.clone(), 64).expect("cpu executor");
    let (want, want_drafts) = run(&mut cpu);
    for (label, mut exec) in executors(backend, &m, 64) {
        let (got, drafts) = run(exec.as_mut());
        if let Some(d) = first_difference(&want, &got, m.config.n_vocab) {
            panic!("{label} vs cpu, seed {seed}: MTP logits differ at {d} (rows: 39 MTP positions, then 3 chained steps)");
        }
        assert_eq!(drafts, want_drafts, "{label} vs cpu MTP drafts, seed {seed}");
    }
}

#[test]
fn mtp_matches_cpu_cuda() {
    mtp_matches_cpu("cuda");
}

#[test]
fn mtp_matches_cpu_hip() {
    mtp_matches_cpu("hip");
}

#[test]
fn hip_matches_cpu() {
    backend_matches_cpu("hip");
}

/// Sampling draws position i's token from (seed, i) alone: the same seed gives the same tokens
/// whatever the prefill window; another seed gives others.
#[test]
fn sampled_tokens_depend_on_seed_and_position_only() {
    let seed = common::seed("sampled_tokens");
    let m = &models(seed)[0];
    let decode = |window: usize, s: u64| {
        let p = SampleParams { temperature: 1.0, top_k: 200, top_p: 1.0, seed: s };
        let ops = m.step_ops(Op::Pick(Pick::Sample(p)));
        let mut exec = CpuExecutor::new(m.clone(), 64).expect("cpu executor");
        let req = Request { prompt: vec![1, 2, 3, 4, 5, 6, 7], n_predict: 32, window, spec: 1, stop: vec![], ignore_eos: true, want_logits: false, draft: Draft::Lookup };
        let mut ids = Vec::new();
        generate(&mut exec, &ops, &req, |id, _| {
            ids.push(id);
            Ok(())
        })
        .expect("decode");
        ids
    };
    let base = decode(8, seed);
    for w in [1, 3, 5] {
        assert_eq!(decode(w, seed), base, "prefill window {w} changed the sampled tokens (seed {seed})");
    }
    assert_ne!(decode(8, seed ^ 0x5555), base, "another seed drew the same 32 tokens");
}

/// Speculation changes the number of steps, never the tokens: `spec` 1, 2, 4 and 8 with
/// prompt-lookup drafts, and 4 with the MTP block's drafts (the qwen35moe) and with none, give
/// the same 256 tokens (and the same logits for each), greedy and sampled with three seeds, on the
/// built-in model (4 layers) and on a qwen35moe (whose Gated DeltaNet state must roll back to
/// the last accepted position) from a repetitive prompt (so that prompt lookup finds drafts and
/// some are accepted). `spec` 1 runs twice: with the logits read after each step, and as the
/// decode loop runs it without them (each step continued on the device, one queued ahead). On
/// a GPU every run is made with the captured graphs and with eager launches (`--no-graph`).
///
/// The qwen35moe is the first of the seed's eight whose greedy text accepts a lookup draft (on
/// the CPU replica, whose bits every backend has): a random model's greedy text need not repeat
/// the prompt's n-grams (seed 1796456593763778916's accepted none), and the rollback to a
/// position inside a window needs an accepted draft to be tested.
fn speculation_keeps_the_tokens(backend: &str) {
    let seed = common::seed(&format!("speculation_keeps_the_tokens_{backend}"));
    let hybrid = (0..8)
        .map(|i| seed.wrapping_add(i))
        .map(|s| (s, hybrid(s, (4, 2), 64, 4)))
        .find(|(_, m)| lookup_accepts(m))
        .map(|(s, m)| {
            eprintln!("speculation_keeps_the_tokens_{backend}: the qwen35moe of seed {s}");
            m
        })
        .unwrap_or_else(|| panic!("none of the qwen35moe models of the 8 seeds from {seed} accepted a lookup draft"));
    for m in [builtin(), hybrid] {
        speculation_keeps_the_tokens_of(backend, m);
    }
}

/// The repetitive prompt of the speculation tests: prompt lookup finds drafts in it.
fn spec_prompt() -> Vec<u32> {
    [17u32, 300, 45, 9, 17, 300, 45].repeat(3)
}

/// Whether `m`'s greedy decode of [`spec_prompt`] in windows of 2 accepts a lookup draft (CPU).
fn lookup_accepts(m: &Arc<Model>) -> bool {
    let mut exec = executor("cpu", m.clone(), 512).expect("cpu executor");
    let ops = m.step_ops(Op::Pick(Pick::Greedy));
    let req = Request { prompt: spec_prompt(), n_predict: 256, window: 8, spec: 2, stop: vec![], ignore_eos: true, want_logits: false, draft: Draft::Lookup };
    generate(exec.as_mut(), &ops, &req, |_, _| Ok(())).expect("decode").accepted > 0
}

fn speculation_keeps_the_tokens_of(backend: &str, m: Arc<Model>) {
    assert_eq!(m.config.n_layer, 4);
    let prompt = spec_prompt();
    let picks = [
        Pick::Greedy,
        Pick::Sample(SampleParams { temperature: 0.8, top_k: 40, top_p: 0.95, seed: 1 }),
        Pick::Sample(SampleParams { temperature: 0.8, top_k: 40, top_p: 0.95, seed: 2 }),
        Pick::Sample(SampleParams { temperature: 0.8, top_k: 40, top_p: 0.95, seed: 3 }),
    ];
    // One executor per mode for every run: each decode prefills from position 0, and a
    // position's cache entries are written before any token reads them.
    let mut execs = executors(backend, &m, 512);
    if execs.is_empty() {
        return;
    }
    for pick in picks {
        let ops = m.step_ops(Op::Pick(pick));
        let mut base: Option<(Vec<u32>, Vec<f32>)> = None;
        for (label, exec) in execs.iter_mut() {
            // Prompt lookup at every size; the model's MTP drafts (where it has an MTP block) and
            // no drafts at 4.
            let mut runs: Vec<(usize, bool, Draft)> = [(1, true), (1, false), (2, true), (4, true), (8, true)].map(|(s, l)| (s, l, Draft::Lookup)).into();
            runs.extend(m.mtp_ops().map(|mtp| (4, true, Draft::Mtp(mtp))));
            runs.push((4, true, Draft::None));
            for (spec, want_logits, draft) in runs {
                let lookup = draft == Draft::Lookup;
                let name = match &draft {
                    Draft::Lookup => "lookup",
                    Draft::Mtp(_) => "mtp",
                    Draft::None => "no",
                };
                let req = Request { prompt: prompt.clone(), n_predict: 256, window: 8, spec, stop: vec![], ignore_eos: true, want_logits, draft };
                let (mut ids, mut logits) = (Vec::new(), Vec::new());
                let stats = generate(exec.as_mut(), &ops, &req, |id, l| {
                    ids.push(id);
                    assert_eq!(l.is_some(), want_logits);
                    logits.extend_from_slice(l.unwrap_or_default());
                    Ok(())
                })
                .expect("decode");
                assert_eq!(ids.len(), 256);
                eprintln!("{label} {pick:?} spec {spec}, {name} drafts: {} steps, {} of {} drafts accepted", stats.steps, stats.accepted, stats.drafted);
                if spec > 1 && pick == Pick::Greedy && lookup {
                    assert!(stats.accepted > 0, "{label} spec {spec}: no draft was ever accepted, so nothing was tested");
                }
                if name == "no" {
                    assert_eq!((stats.drafted, stats.steps), (0, 255), "{label}: --draft none made drafts");
                }
                if name == "mtp" {
                    // 3 drafts a step but where fewer than 4 tokens were left to generate.
                    assert!(stats.drafted + 6 >= 3 * stats.steps && stats.drafted <= 3 * stats.steps, "{label}: the MTP block drafted {} tokens in {} steps", stats.drafted, stats.steps);
                }
                match &base {
                    None => base = Some((ids, logits)),
                    Some((want_ids, want)) => {
                        assert_eq!(&ids, want_ids, "{label} {pick:?}: spec {spec} with {name} drafts changed the tokens");
                        if want_logits {
                            if let Some(d) = first_difference(want, &logits, m.config.n_vocab) {
                                panic!("{label} {pick:?}: spec {spec} with {name} drafts changed the logits at {d}");
                            }
                        }
                    }
                }
            }
        }
    }
}

/// The decode loop without speculation (steps continued on the device, one queued ahead of the
/// token read) stops where the step-by-step loop does: at an end-of-generation token (which it
/// emits, and nothing after it, although the step after it was already queued) and at the end
/// of the context; the executor is then ready for the next decode.
fn chained_decode_stops_in_time(backend: &str) {
    let m = builtin();
    let ops = m.step_ops(Op::Pick(Pick::Sample(SampleParams { temperature: 1.0, top_k: 40, top_p: 0.95, seed: 7 })));
    let prompt = vec![3u32, 1, 4, 1, 5];
    for (label, mut exec) in executors(backend, &m, 64) {
        let mut decode = |n_predict: usize, stop: Vec<u32>, want_logits: bool| {
            let req = Request { prompt: prompt.clone(), n_predict, window: 8, spec: 1, stop, ignore_eos: false, want_logits, draft: Draft::Lookup };
            let mut ids = Vec::new();
            let stats = generate(exec.as_mut(), &ops, &req, |id, _| {
                ids.push(id);
                Ok(())
            })
            .expect("decode");
            (ids, stats)
        };
        let (all, stats) = decode(40, vec![], true);
        assert_eq!((all.len(), stats.stopped), (40, Stop::Length), "{label}");
        // A stop token whose first occurrence is well inside the 40.
        let at = (10..40).find(|&i| !all[..i].contains(&all[i])).expect("a token new after position 10");
        let (ids, stats) = decode(40, vec![all[at]], false);
        assert_eq!((&ids[..], stats.stopped), (&all[..=at], Stop::Eos), "{label}: stop token {} at {at}", all[at]);
        // 64 positions, 5 of them the prompt's: 60 tokens (the last one's position is not needed).
        let (ids, stats) = decode(100, vec![], false);
        assert_eq!((ids.len(), stats.stopped), (60, Stop::Context), "{label}");
        assert_eq!(ids[..40], all[..], "{label}");
        let (again, _) = decode(40, vec![], false);
        assert_eq!(again, all, "{label}: the decode after a stopped one");
    }
}

/// `strata decode --profile` without speculation still gives the time of every phase: a
/// profiling executor's steps are read one by one instead of chained.
#[test]
fn profiled_decode_times_every_phase() {
    for name in ["cuda", "hip"] {
        let Some(gpu) = common::open_gpu(name) else { continue };
        let m = builtin();
        let ops = m.step_ops(Op::Pick(Pick::Greedy));
        let mut exec = GpuExecutor::new(gpu, m, 64, false).unwrap();
        exec.set_profiling(true);
        let req = Request { prompt: vec![3, 1, 4], n_predict: 8, window: 8, spec: 1, stop: vec![], ignore_eos: true, want_logits: false, draft: Draft::Lookup };
        let stats = generate(&mut exec, &ops, &req, |_, _| Ok(())).unwrap();
        let phases: Vec<&str> = stats.phases.iter().map(|p| p.0).collect();
        for want in ["attention", "router", "experts", "head", "sampling", "other"] {
            assert!(phases.contains(&want), "{name}: no {want} in {phases:?}");
        }
        assert!(stats.phases.iter().all(|p| p.1 > 0.0), "{name}: {:?}", stats.phases);
    }
}

#[test]
fn chained_decode_stops_in_time_cpu() {
    chained_decode_stops_in_time("cpu");
}

#[test]
fn chained_decode_stops_in_time_cuda() {
    chained_decode_stops_in_time("cuda");
}

#[test]
fn chained_decode_stops_in_time_hip() {
    chained_decode_stops_in_time("hip");
}

#[test]
fn speculation_keeps_the_tokens_cpu() {
    speculation_keeps_the_tokens("cpu");
}

#[test]
fn speculation_keeps_the_tokens_cuda() {
    speculation_keeps_the_tokens("cuda");
}

#[test]
fn speculation_keeps_the_tokens_hip() {
    speculation_keeps_the_tokens("hip");
}

/// The built-in model without its vocabulary, its tensors rewritten by `edit`, loaded.
fn rewritten(edit: impl Fn(&mut Vec<common::TensorParts>)) -> Arc<Model> {
    load(common::rewritten_tiny(false, |_, t| edit(t)), "rewritten")
}

/// A fused `attn_qkv` (and `attn_qkv.bias`) means exactly the separate q, k, v tensors (and
/// biases): the logits of both files are the same bits, and the biases do change them. Both
/// load as one matrix and one bias a layer; loaded split (three of each), the separate tensors
/// give the same bits, and so do biases of q and k alone, fused or split.
#[test]
fn fused_qkv_and_biases_mean_the_separate_tensors() {
    let seed = common::seed("fused_qkv");
    let mut rng = SmallRng::seed_from_u64(seed);
    let c = SynthSpec::tiny().config;
    let (q_dim, kv_dim) = (c.n_head * c.head_dim, c.n_head_kv * c.head_dim);
    let bias = |n: usize, rng: &mut SmallRng| -> Vec<u8> { (0..n).flat_map(|_| rng.random_range(-0.5f32..0.5).to_le_bytes()).collect() };
    let biases: Vec<[Vec<u8>; 3]> = (0..c.n_layer).map(|_| [bias(q_dim, &mut rng), bias(kv_dim, &mut rng), bias(kv_dim, &mut rng)]).collect();
    let with_biases = |parts: usize| {
        rewritten(|t| {
            for (i, b) in biases.iter().enumerate() {
                for (part, (name, n)) in b.iter().zip([("q", q_dim), ("k", kv_dim), ("v", kv_dim)]).take(parts) {
                    t.push((format!("blk.{i}.attn_{name}.bias"), vec![n as u64], GgmlType::F32, part.clone()));
                }
            }
        })
    };
    let separate = with_biases(3);
    let fused = rewritten(|t| {
        for (i, b) in biases.iter().enumerate() {
            let mut data = Vec::new();
            let mut ty = GgmlType::F32;
            for name in ["q", "k", "v"] {
                let at = t.iter().position(|x| x.0 == format!("blk.{i}.attn_{name}.weight")).unwrap();
                let (_, _, tty, bytes) = t.remove(at);
                ty = tty;
                data.extend(bytes);
            }
            t.push((format!("blk.{i}.attn_qkv.weight"), vec![c.n_embd as u64, (q_dim + 2 * kv_dim) as u64], ty, data));
            t.push((format!("blk.{i}.attn_qkv.bias"), vec![(q_dim + 2 * kv_dim) as u64], GgmlType::F32, b.concat()));
        }
    });
    let plain = rewritten(|_| {});
    let seq: Vec<u32> = (0..40).map(|_| rng.random_range(0..c.n_vocab as u32)).collect();
    let logits = |m: &Arc<Model>| {
        let mut exec = CpuExecutor::new(m.clone(), 64).unwrap();
        forced_logits(&mut exec, &m.step_ops(Op::Pick(Pick::Greedy)), &seq, 8).unwrap()
    };
    let (a, b) = (logits(&separate), logits(&fused));
    if let Some(d) = first_difference(&a, &b, c.n_vocab) {
        panic!("fused attn_qkv differs from separate q/k/v (seed {seed}) at {d}");
    }
    let plain = logits(&plain);
    assert!(first_difference(&a, &plain, c.n_vocab).is_some(), "the biases changed nothing");
    // Each holds one matrix and one bias a layer (the file's fused ones are not kept beside
    // slices of them): the same bytes.
    assert_eq!(separate.weights.total_bytes(), fused.weights.total_bytes());
    if let Some(d) = first_difference(&a, &logits(&split_qkv(&separate)), c.n_vocab) {
        panic!("q, k, v and their biases split differ from fused (seed {seed}) at {d}");
    }
    // v's part of the fused bias, where the file has none, leaves the values as they are.
    let partial = with_biases(2);
    let p = logits(&partial);
    if let Some(d) = first_difference(&p, &logits(&split_qkv(&partial)), c.n_vocab) {
        panic!("q and k biases split differ from fused (seed {seed}) at {d}");
    }
    assert!(first_difference(&p, &plain, c.n_vocab).is_some() && first_difference(&p, &a, c.n_vocab).is_some(), "the partial biases changed nothing");
}

/// One q/k/v matrix gives the bits of three: the models of [`models`] (every layer fused) and
/// [`mixed_qkv`] (layer 0 split by its types) against the same files loaded with every layer
/// split, logits of a 40-token sequence in windows of 3, on the CPU or on a GPU with graphs and
/// eagerly.
fn fused_qkv_gives_the_split_bits(backend: &str) {
    let seed = common::seed(&format!("fused_qkv_gives_the_split_bits_{backend}"));
    let mut rng = SmallRng::seed_from_u64(seed);
    let mixed = mixed_qkv(seed);
    let mut cases: Vec<(Arc<Model>, Vec<bool>)> = models(seed).into_iter().map(|m| (m.clone(), vec![true; fused_layers(&m).len()])).collect();
    cases.push((mixed, vec![false, true, true, true]));
    for (m, want) in cases {
        let split = split_qkv(&m);
        assert_eq!(fused_layers(&m), want, "{}: the layers that fuse q/k/v", m.describe());
        assert!(fused_layers(&split).iter().all(|f| !f), "{}: split on request", m.describe());
        let n_vocab = m.config.n_vocab;
        let seq: Vec<u32> = (0..40).map(|_| rng.random_range(0..n_vocab as u32)).collect();
        let logits = |m: &Arc<Model>| trunk_and_mtp_logits(backend, m, &m.step_ops(Op::Pick(Pick::Greedy)), None, &seq, 3, 64);
        assert_same_logits(logits(&split), logits(&m), n_vocab, &format!("seed {seed}, {}: fused q/k/v differ from split", m.describe()));
    }
}

#[test]
fn fused_qkv_gives_the_split_bits_cpu() {
    fused_qkv_gives_the_split_bits("cpu");
}

#[test]
fn fused_qkv_gives_the_split_bits_cuda() {
    fused_qkv_gives_the_split_bits("cuda");
}

#[test]
fn fused_qkv_gives_the_split_bits_hip() {
    fused_qkv_gives_the_split_bits("hip");
}

/// `ops` with every residual add fused into its producer undone: a `Linear` or the routed
/// experts accumulating into `Act::X` become the plain op into `Act::Proj` (the experts:
/// `Act::Experts`), then `AddInto`: the list as it was before the fusion.
fn unfused(ops: &[Op]) -> Vec<Op> {
    ops.iter()
        .flat_map(|&op| match op {
            Op::Linear { w, xq, x, out: Act::X, accumulate: true } => {
                vec![Op::Linear { w, xq, x, out: Act::Proj, accumulate: false }, Op::AddInto { acc: Act::X, b: Act::Proj }]
            }
            Op::Experts { gate, up, down, out: Act::X, accumulate: true } => {
                vec![Op::Experts { gate, up, down, out: Act::Experts, accumulate: false }, Op::AddInto { acc: Act::X, b: Act::Experts }]
            }
            Op::Linear { accumulate: true, .. } | Op::Experts { accumulate: true, .. } => panic!("accumulates into another buffer than X: {op:?}"),
            op => vec![op],
        })
        .collect()
}

/// How many ops of `ops` accumulate into their output.
fn accumulating(ops: &[Op]) -> usize {
    ops.iter().filter(|op| matches!(op, Op::Linear { accumulate: true, .. } | Op::Experts { accumulate: true, .. })).count()
}

/// The tiny qwen35moe with float output projections, so that the float matvec accumulates: layer
/// 0's `ssm_out` F32, layer 1's `attn_output` BF16, the MTP block's `attn_output` F16 (random,
/// shapes kept).
fn float_projections(seed: u64) -> Arc<Model> {
    let mut spec = SynthSpec::qwen35moe_tiny();
    spec.seed = seed;
    let n_layer = spec.config.n_layer;
    let bytes = common::rewritten(&spec, |_, t| {
        let mut rng = SmallRng::seed_from_u64(seed);
        for (name, ty) in [("blk.0.ssm_out".to_string(), GgmlType::F32), ("blk.1.attn_output".into(), GgmlType::Bf16), (format!("blk.{n_layer}.attn_output"), GgmlType::F16)] {
            let x = t.iter_mut().find(|x| x.0 == format!("{name}.weight")).unwrap_or_else(|| panic!("{name} in the tiny qwen35moe"));
            let values: Vec<f32> = (0..x.1.iter().product::<u64>()).map(|_| rng.random_range(-1.0f32..1.0) / 16.0).collect();
            x.3 = match ty {
                GgmlType::F32 => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
                GgmlType::Bf16 => values.iter().flat_map(|v| ((v.to_bits() >> 16) as u16).to_le_bytes()).collect(),
                _ => values.iter().flat_map(|&v| strata_gpu_shared::f16::f32_to_f16(v).to_le_bytes()).collect(),
            };
            x.2 = ty;
        }
    });
    load(bytes, "<tiny qwen35moe, float output projections>")
}

/// Panics at the first executor whose `got` logits differ from its `want` ones (the lists come
/// from the same executors in the same order), naming the executor, `what` and the first
/// differing row.
fn assert_same_logits(want: Vec<(String, Vec<f32>)>, got: Vec<(String, Vec<f32>)>, n_vocab: usize, what: &str) {
    assert_eq!(want.len(), got.len(), "{what}: executors");
    for ((label, a), (_, b)) in want.into_iter().zip(got) {
        if let Some(d) = first_difference(&a, &b, n_vocab) {
            panic!("{label}, {what} at {d}");
        }
    }
}

/// On every executor of `backend` (graphs and eager on a GPU): the logits of `seq` fed in windows
/// of `window` through `ops`, then, with an MTP block's `mtp`, its logits over the first 8
/// positions (fed the token after each).
fn trunk_and_mtp_logits(backend: &str, m: &Arc<Model>, ops: &[Op], mtp: Option<&[Op]>, seq: &[u32], window: usize, n_ctx: usize) -> Vec<(String, Vec<f32>)> {
    let run = |exec: &mut dyn Executor| {
        let mut logits = forced_logits(exec, ops, seq, window).expect("decode");
        if let Some(mtp) = mtp {
            exec.set_tokens(&seq[1..9]).unwrap();
            exec.run(mtp, Window { tokens: 8, pos0: 0 }).unwrap();
            exec.next_ids(8).unwrap();
            logits.extend(exec.logits(8).unwrap());
        }
        logits
    };
    executors(backend, m, n_ctx).into_iter().map(|(label, mut exec)| (label, run(exec.as_mut()))).collect()
}

/// The residual adds fused into their producers (`mmvq` and the float `matvec` of every mixer's
/// output projection, the routed experts' combine where no shared expert comes between) give
/// the bits of the separate adds ([`unfused`]): the trunk's logits of a 40-token sequence in
/// windows of 3, then the MTP block's over the first 8 positions where the model has one, on
/// the models of [`models`] and [`float_projections`], on the CPU or on a GPU with graphs and
/// eagerly. The builders fuse both adds of a qwen3moe layer and the mixer's of a qwen35moe one.
fn fused_residual_adds_give_the_unfused_bits(backend: &str) {
    let seed = common::seed(&format!("fused_residual_adds_give_the_unfused_bits_{backend}"));
    let mut rng = SmallRng::seed_from_u64(seed);
    for m in models(seed).into_iter().chain([float_projections(seed)]) {
        let c = &m.config;
        let (ops, mtp) = (m.step_ops(Op::Pick(Pick::Greedy)), m.mtp_ops());
        let per_layer = if c.hybrid.is_some() { 1 } else { 2 };
        assert_eq!(accumulating(&ops), per_layer * c.n_layer, "{}: fused adds of the trunk", m.describe());
        assert_eq!(mtp.as_deref().map(accumulating), c.hybrid.as_ref().filter(|h| h.mtp).map(|_| 1), "{}: fused adds of the MTP block", m.describe());
        let seq: Vec<u32> = (0..40).map(|_| rng.random_range(0..c.n_vocab as u32)).collect();
        let logits = |ops: &[Op], mtp: Option<&[Op]>| trunk_and_mtp_logits(backend, &m, ops, mtp, &seq, 3, 64);
        let unfused_mtp = mtp.as_deref().map(unfused);
        let what = format!("seed {seed}, {}: fused residual adds differ from separate ones (rows: 40 trunk positions, then 8 MTP ones)", m.describe());
        assert_same_logits(logits(&unfused(&ops), unfused_mtp.as_deref()), logits(&ops, mtp.as_deref()), c.n_vocab, &what);
    }
}

#[test]
fn fused_residual_adds_give_the_unfused_bits_cpu() {
    fused_residual_adds_give_the_unfused_bits("cpu");
}

#[test]
fn fused_residual_adds_give_the_unfused_bits_cuda() {
    fused_residual_adds_give_the_unfused_bits("cuda");
}

#[test]
fn fused_residual_adds_give_the_unfused_bits_hip() {
    fused_residual_adds_give_the_unfused_bits("hip");
}

/// A fused `ffn_gate_up_exps` (each expert's gate rows, then its up rows) means exactly the
/// separate `ffn_gate_exps` and `ffn_up_exps`, in every layer and the MTP block of a qwen35moe:
/// the trunk's and the MTP block's logits are the same bits, and the two models hold the same
/// bytes (the fused tensor is not kept beside its halves).
#[test]
fn fused_gate_up_experts_mean_the_separate_tensors() {
    let seed = common::seed("fused_gate_up");
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut spec = SynthSpec::qwen35moe_tiny();
    spec.seed = seed;
    let separate = load(common::rewritten(&spec, |_, _| {}), "separate gate/up");
    let c = &separate.config;
    let (n_expert, n_ff, n_embd) = (c.n_expert, c.n_ff_exp, c.n_embd);
    let fused = load(common::rewritten(&spec, |_, t| {
        for i in 0..=c.n_layer {
            let mut take = |which: &str| {
                let at = t.iter().position(|x| x.0 == format!("blk.{i}.ffn_{which}_exps.weight")).unwrap();
                t.remove(at)
            };
            let (gate, up) = (take("gate"), take("up"));
            let per = gate.3.len() / n_expert;
            let data: Vec<u8> = (0..n_expert).flat_map(|e| gate.3[e * per..(e + 1) * per].iter().chain(&up.3[e * per..(e + 1) * per]).copied()).collect();
            t.push((format!("blk.{i}.ffn_gate_up_exps.weight"), vec![n_embd as u64, 2 * n_ff as u64, n_expert as u64], gate.2, data));
        }
    }), "fused gate/up");
    let seq: Vec<u32> = (0..24).map(|_| rng.random_range(0..c.n_vocab as u32)).collect();
    let logits = |m: &Arc<Model>| {
        let mut exec = CpuExecutor::new(m.clone(), 64).unwrap();
        let trunk = forced_logits(&mut exec, &m.step_ops(Op::Pick(Pick::Greedy)), &seq, 8).unwrap();
        exec.set_tokens(&seq[1..9]).unwrap();
        exec.run(&m.mtp_ops().unwrap(), Window { tokens: 8, pos0: 0 }).unwrap();
        exec.next_ids(8).unwrap();
        (trunk, exec.logits(8).unwrap())
    };
    let ((a, a_mtp), (b, b_mtp)) = (logits(&separate), logits(&fused));
    if let Some(d) = first_difference(&a, &b, c.n_vocab).or_else(|| first_difference(&a_mtp, &b_mtp, c.n_vocab)) {
        panic!("fused ffn_gate_up_exps differs from separate gate/up (seed {seed}) at {d}");
    }
    assert_eq!(separate.weights.total_bytes(), fused.weights.total_bytes());
}

/// Greedy decoding refuses a position whose logits are all NaN instead of picking token 0: a NaN
/// in token 7's embedding row stays in the residual stream (the q8_1 quantizer maps NaN to 0, so
/// the matvecs on quantized weights do not spread it), and an F32 head reads the normed residual
/// in float, so every logit of that position is NaN.
fn greedy_refuses_all_nan_logits(backend: &str) {
    let c = SynthSpec::tiny().config;
    let m = rewritten(|t| {
        let x = t.iter_mut().find(|x| x.0 == "token_embd.weight").unwrap();
        let row = x.3.len() / c.n_vocab;
        x.3[7 * row..7 * row + 2].copy_from_slice(&0x7e00u16.to_le_bytes()); // the first block's scale
        let head = t.iter_mut().find(|x| x.0 == "output.weight").unwrap();
        (head.2, head.3) = (GgmlType::F32, (0..c.n_embd * c.n_vocab).flat_map(|i| ((i % 7) as f32 * 0.01).to_le_bytes()).collect());
    });
    let Some(mut exec) = executor(backend, m.clone(), 64) else { return };
    let ops = m.step_ops(Op::Pick(Pick::Greedy));
    let req = Request { prompt: vec![3, 7], n_predict: 4, window: 8, spec: 1, stop: vec![], ignore_eos: true, want_logits: false, draft: Draft::Lookup };
    let err = generate(exec.as_mut(), &ops, &req, |_, _| Ok(())).expect_err("all-NaN logits must not decode");
    assert!(err.to_string().contains("position 1 are all NaN"), "{backend}: {err}");
}

#[test]
fn greedy_refuses_all_nan_logits_cpu() {
    greedy_refuses_all_nan_logits("cpu");
}

#[test]
fn greedy_refuses_all_nan_logits_cuda() {
    greedy_refuses_all_nan_logits("cuda");
}

#[test]
fn greedy_refuses_all_nan_logits_hip() {
    greedy_refuses_all_nan_logits("hip");
}

/// Every weight a model loads is read by its step or its MTP step (nothing is uploaded for
/// nothing, such as a matrix that was split into others or fused into one), on qwen3moe and
/// qwen35moe models, with q, k and v fused, split, and both (by layer).
#[test]
fn every_loaded_weight_is_read() {
    let fused = models(1).into_iter().chain([builtin(), mixed_qkv(1)]);
    for m in fused.flat_map(|m| [split_qkv(&m), m]) {
        let mut read = vec![false; m.weights.list.len()];
        let mtp = m.mtp_ops().unwrap_or_default();
        for op in m.step_ops(Op::Pick(Pick::Greedy)).iter().chain(&mtp) {
            for id in op.weights() {
                read[id.0] = true;
            }
        }
        let unread: Vec<&str> = m.weights.list.iter().zip(&read).filter(|(_, r)| !**r).map(|(w, _)| w.name.as_str()).collect();
        assert!(unread.is_empty(), "{}: loaded but never read: {unread:?}", m.arch);
    }
}

/// How many ops of `ops` are a norm fused with its quantization.
fn norm_quants(ops: &[Op]) -> usize {
    ops.iter().filter(|op| matches!(op, Op::NormQuant { .. })).count()
}

fn attn_quants(ops: &[Op]) -> usize {
    ops.iter().filter(|op| matches!(op, Op::Attention { q: Some(_), .. } | Op::PrepAttention { q: Some(_), .. })).count()
}

/// How many ops of `ops` are an `attn_prep` joined with the attention after it.
fn joined_preps(ops: &[Op]) -> usize {
    ops.iter().filter(|op| matches!(op, Op::PrepAttention { .. })).count()
}

/// Each RMSNorm followed by the quantization of its output made one `NormQuant`
/// (`step::fuse`, one `rms_norm_q8_1` launch), and each attention followed by the quantization
/// of its output made one attention that quantizes (no `quantize_q8_1` launch), give the bits
/// of the separate ops: the trunk's logits
/// of a 40-token sequence in windows of 5, then the MTP block's over the first 8 positions, of
/// the unfused lists (the architecture modules' own) against the fused ones (`Model::step_ops`,
/// `Model::mtp_ops`), on a qwen3moe and a qwen35moe, on the CPU or on a GPU with graphs and
/// eagerly. The fused trunk is shorter by exactly one op for each layer's attention (or Gated
/// DeltaNet) input, its FFN input and the head's input; the MTP block's by its layer's two and
/// its head's, by one for each attention whose output is quantized next (a qwen3moe's
/// every layer; a gated attention multiplies its output first), and by one for each attention's
/// prep joined with it. Rows longer than `NQ_MAX_N`
/// are not fused into norms. On a GPU, also 300 positions of the qwen3moe in windows of 8, so
/// the contexts pass one chunk and `attn_merge` quantizes the attention's output.
fn fused_ops_give_the_unfused_bits(backend: &str) {
    let seed = common::seed(&format!("fused_ops_give_the_unfused_bits_{backend}"));
    let mut rng = SmallRng::seed_from_u64(seed);
    for m in [models(seed).remove(0), hybrid(seed, (4, 2), 64, 4)] {
        let c = &m.config;
        let pick = Op::Pick(Pick::Greedy);
        let (unfused, unfused_mtp) = match m.arch {
            qwen35moe::ARCH => (qwen35moe::step_ops(&m, pick), qwen35moe::mtp_ops(&m)),
            _ => (qwen3moe::step_ops(&m, pick), None),
        };
        let (fused, mtp) = (m.step_ops(pick), m.mtp_ops());
        assert_eq!((norm_quants(&unfused), norm_quants(&fused)), (0, 2 * c.n_layer + 1), "{}: fused norms of the trunk", m.describe());
        let attn = if m.arch == qwen35moe::ARCH { 0 } else { c.n_layer };
        assert_eq!((attn_quants(&unfused), attn_quants(&fused)), (0, attn), "{}: attentions that quantize their output", m.describe());
        let attentions = unfused.iter().filter(|op| matches!(op, Op::Attention { .. })).count();
        assert!(attentions > 0, "{}: the trunk attends", m.describe());
        assert_eq!((joined_preps(&unfused), joined_preps(&fused)), (0, attentions), "{}: preps joined with their attention", m.describe());
        assert_eq!(fused.len() + 2 * c.n_layer + 1 + attn + attentions, unfused.len(), "{}: the trunk's ops", m.describe());
        assert_eq!(mtp.is_some(), m.arch == qwen35moe::ARCH, "{}: the tiny qwen35moe has an MTP block", m.describe());
        if let (Some(mtp), Some(unfused_mtp)) = (&mtp, &unfused_mtp) {
            assert_eq!((norm_quants(unfused_mtp), norm_quants(mtp)), (0, 3), "{}: fused norms of the MTP block", m.describe());
            assert_eq!((attn_quants(mtp), joined_preps(mtp), mtp.len() + 4), (0, 1, unfused_mtp.len()), "{}: the MTP block's ops", m.describe());
        }
        let mut long = c.clone();
        long.n_embd = NQ_MAX_N + 32;
        assert_eq!(norm_quants(&fuse(unfused.clone(), &long)), 0, "{}: rows past NQ_MAX_N stay unfused", m.describe());
        long.n_embd = NQ_MAX_N;
        assert_eq!(norm_quants(&fuse(unfused.clone(), &long)), 2 * c.n_layer + 1, "{}: rows of NQ_MAX_N fuse", m.describe());
        let seq: Vec<u32> = (0..40).map(|_| rng.random_range(0..c.n_vocab as u32)).collect();
        let logits = |ops: &[Op], mtp: Option<&[Op]>| trunk_and_mtp_logits(backend, &m, ops, mtp, &seq, 5, 64);
        let what = format!("seed {seed}, {}: the fused ops differ from the unfused ones (rows: 40 trunk positions, then 8 MTP ones)", m.describe());
        assert_same_logits(logits(&unfused, unfused_mtp.as_deref()), logits(&fused, mtp.as_deref()), c.n_vocab, &what);
        if backend != "cpu" && attn > 0 {
            // Past 256 keys the attention merges its chunks and `attn_merge` quantizes the
            // output (above, one chunk: `attn_chunk` does): 300 positions in windows of 8.
            let long: Vec<u32> = (0..300).map(|_| rng.random_range(0..c.n_vocab as u32)).collect();
            let logits = |ops: &[Op]| trunk_and_mtp_logits(backend, &m, ops, None, &long, 8, 320);
            let what = format!("seed {seed}, {}: past one chunk, the fused ops differ from the unfused ones", m.describe());
            assert_same_logits(logits(&unfused), logits(&fused), c.n_vocab, &what);
        }
    }
}

#[test]
fn fused_ops_give_the_unfused_bits_cpu() {
    fused_ops_give_the_unfused_bits("cpu");
}

/// Steps whose contexts are one chunk run `attn_prep` inside the attention launch
/// (`attn_prep_chunk_two_128`: bands of two heads of 128 values) on a GPU, and give the CPU's
/// bits: a qwen3moe of such heads (a group of two) decodes 40 positions in windows of 1 and of 3
/// with the fused launch, on every executor (graphs and eager), against the CPU's logits of the
/// unfused list in windows of 4. The step launches the fused entry once a layer in place of
/// `attn_prep` and the chunk kernel for one token and for windows of one-chunk contexts, and the
/// two launches for contexts past one chunk or with the `ATTN_FUSE` knob off.
fn prep_inside_attention(backend: &str) {
    let Some(gpu) = common::open_gpu(backend) else { return };
    let seed = common::seed(&format!("prep_inside_attention_{backend}"));
    let mut rng = SmallRng::seed_from_u64(seed);
    let m = model(seed, (4, 2), 128, (8, 2), (WeightFormat::Iq3S, WeightFormat::Iq4Nl));
    let pick = Op::Pick(Pick::Greedy);
    let (ops, unfused) = (m.step_ops(pick), qwen3moe::step_ops(&m, pick));
    let fused_entry = "attn_prep_chunk_two_128";
    let mut e = GpuExecutor::new(gpu, m.clone(), 320, false).expect("the model fits the GPU");
    let count = |k: &[&str], name: &str| k.iter().filter(|&&x| x == name).count();
    let n_layer = m.config.n_layer;
    for (tokens, pos0) in [(&[3u32][..], 5), (&[3, 4, 5, 6, 7, 8, 9, 10][..], 248)] {
        let k = e.step_kernels(&ops, tokens, pos0).unwrap();
        assert_eq!((count(&k, fused_entry), count(&k, "attn_prep"), count(&k, "attn_chunk_two_128")), (n_layer, 0, 0), "{} tokens at {pos0}: {k:?}", tokens.len());
    }
    for (tokens, pos0) in [(&[3u32][..], 290), (&[3, 4][..], 255)] {
        let k = e.step_kernels(&ops, tokens, pos0).unwrap();
        assert_eq!((count(&k, fused_entry), count(&k, "attn_prep")), (0, n_layer), "{} tokens at {pos0}: {k:?}", tokens.len());
    }
    e.set_kernel_knobs(KernelKnobs { attn_fuse: false, ..e.kernel_knobs() });
    let k = e.step_kernels(&ops, &[3], 5).unwrap();
    assert_eq!((count(&k, fused_entry), count(&k, "attn_prep"), count(&k, "attn_chunk_two_128")), (0, n_layer, n_layer), "ATTN_FUSE=0: {k:?}");
    let seq: Vec<u32> = (0..40).map(|_| rng.random_range(0..m.config.n_vocab as u32)).collect();
    let want = trunk_and_mtp_logits("cpu", &m, &unfused, None, &seq, 4, 64).remove(0).1;
    for window in [1, 3] {
        for (label, got) in trunk_and_mtp_logits(backend, &m, &ops, None, &seq, window, 64) {
            if let Some(d) = first_difference(&want, &got, m.config.n_vocab) {
                panic!("seed {seed}, {label}: windows of {window} with attn_prep inside the attention differ from the CPU at {d}");
            }
        }
    }
}

#[test]
fn prep_inside_attention_cuda() {
    prep_inside_attention("cuda");
}

#[test]
fn prep_inside_attention_hip() {
    prep_inside_attention("hip");
}

#[test]
fn fused_ops_give_the_unfused_bits_cuda() {
    fused_ops_give_the_unfused_bits("cuda");
}

#[test]
fn fused_ops_give_the_unfused_bits_hip() {
    fused_ops_give_the_unfused_bits("hip");
}
