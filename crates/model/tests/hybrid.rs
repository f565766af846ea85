//! The Qwen hybrids (`qwen35` with and without its MTP block, `qwen35moe`)
//! against an exact reference: small files with the real structure and
//! random weights, written by llama.cpp's `gguf` Python package
//! (`scripts/synth-hybrid.py`, F32 and Q8_0), and a float64 NumPy pass of
//! our own over their dequantized weights (`scripts/exact-reference.py`,
//! itself checked against llama.cpp: `docs/dev/hybrid-reference.md`).
//! Top-20 log-probs at every position of three prompts plus 32 greedy
//! steps, in one batched prefill and token by token, on the CPU, split
//! and with every block the GPU takes; and a step of eight sequences
//! equals each sequence alone, bit for bit.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex, OnceLock};

use lamina_gguf::{LoadMode, Model};
use lamina_gpu::{Gpu, GpuOptions};
use lamina_model::plan::{self, PlanParams};
use lamina_model::{CpuModel, HybridCache, HybridModel, KvType, KvTypes, Logits};
use serde_json::Value;

const N_CTX: usize = 128;
/// Worst |Δ log-prob| against the float64 pass: f32 arithmetic over 8
/// blocks lands within 1e-4 here; 1e-3 is the bar the family is held to.
const TOL: f64 = 1e-3;
const PROMPTS: &str = "[[1,2,3,4,5,6,7,8],[100,2000,30000,7,7,7,7,7,7,7,7,12,13],[5000,6000]]";

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn python(args: &[&str]) {
    let out = Command::new("python3")
        .args(args)
        .current_dir(root())
        .output()
        .expect("python3 with gguf and numpy (scripts/install-deps.sh installs them)");
    assert!(
        out.status.success(),
        "python3 {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A file and its reference, written once per test run.
struct Fixture {
    path: PathBuf,
    reference: Value,
}

fn fixture(arch: &str, ty: &str, mtp: bool) -> Arc<Fixture> {
    static MADE: OnceLock<Mutex<HashMap<String, Arc<Fixture>>>> = OnceLock::new();
    let name = format!("{arch}-{ty}{}", if mtp { "-mtp" } else { "" });
    let made = MADE.get_or_init(Default::default);
    let mut made = made.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(f) = made.get(&name) {
        return f.clone();
    }
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("hybrid");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("{name}.gguf"));
    let refp = dir.join(format!("{name}.json"));
    let vocab = common::model_path("SmolLM2-135M-Instruct.Q4_1.gguf");
    let (p, v, r) = (
        path.to_str().unwrap(),
        vocab.to_str().unwrap(),
        refp.to_str().unwrap(),
    );
    let (ty_name, ssm_in) = match ty.strip_suffix("-ssm-in") {
        Some(t) => (t, true),
        None => (ty, false),
    };
    let mut args = vec![
        "scripts/synth-hybrid.py",
        "--arch",
        arch,
        "--type",
        ty_name,
        "--vocab-from",
        v,
        "-o",
        p,
    ];
    if mtp {
        args.push("--mtp");
    }
    if ssm_in {
        args.push("--ssm-in");
    }
    python(&args);
    let prompts = dir.join("prompts.json");
    std::fs::write(&prompts, PROMPTS).unwrap();
    python(&[
        "scripts/exact-reference.py",
        p,
        "--prompts",
        prompts.to_str().unwrap(),
        "--gen",
        "32",
        "-o",
        r,
    ]);
    let reference = serde_json::from_str(&std::fs::read_to_string(&refp).unwrap()).unwrap();
    let f = Arc::new(Fixture { path, reference });
    made.insert(name, f.clone());
    f
}

fn gpu() -> Arc<Gpu> {
    static GPU: OnceLock<Arc<Gpu>> = OnceLock::new();
    GPU.get_or_init(|| Arc::new(Gpu::new(GpuOptions::default()).unwrap()))
        .clone()
}

/// The model at `-ngl ngl` with an f32 KV cache: the reference's keys and
/// values are not rounded (an f16 cache moves random-weight models' log-
/// probs by up to 1e-3 here).
fn model(file: &Model, ngl: usize) -> HybridModel<'_> {
    let mut cpu = CpuModel::load(file).unwrap();
    cpu.config.kv = KvTypes {
        checkpoint_bytes: cpu.config.kv.checkpoint_bytes,
        ..KvTypes::uniform(KvType::F32)
    };
    let params = PlanParams {
        n_ctx: N_CTX,
        ..PlanParams::default()
    };
    let p = plan::plan(file, &cpu.config, ngl, &params);
    HybridModel::new(cpu, p, (ngl > 0).then(gpu)).unwrap()
}

/// One reference sequence: every token, and per position the exact
/// top-20 `(id, log-prob)` of the next token.
struct Sequence {
    tokens: Vec<u32>,
    top: Vec<Vec<(usize, f64)>>,
}

fn sequences(r: &Value) -> Vec<Sequence> {
    r["sequences"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| Sequence {
            tokens: s["tokens"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| t.as_u64().unwrap() as u32)
                .collect(),
            top: s["top"]
                .as_array()
                .unwrap()
                .iter()
                .map(|pos| {
                    pos.as_array()
                        .unwrap()
                        .iter()
                        .map(|p| (p[0].as_u64().unwrap() as usize, p[1].as_f64().unwrap()))
                        .collect()
                })
                .collect(),
        })
        .collect()
}

/// Worst |Δ| over the reference's top-20 at each of the rows of `logits`
/// (row `i`: the prediction after token `i`).
fn worst(seq: &Sequence, logits: &[f32], n_vocab: usize) -> f64 {
    let mut worst = 0.0f64;
    for (i, row) in logits.chunks_exact(n_vocab).enumerate() {
        let lp = common::log_softmax(row);
        for &(id, want) in &seq.top[i] {
            worst = worst.max((lp[id] - want).abs());
        }
    }
    worst
}

/// Each file at `-ngl 0`, a split and all: its sequences in one batched
/// prefill and token by token, within [`TOL`] of the exact reference.
fn matches_reference(arch: &str, ty: &str, mtp: bool) {
    let fx = fixture(arch, ty, mtp);
    let file = Model::open(&fx.path, LoadMode::Mmap).unwrap();
    let seqs = sequences(&fx.reference);
    let n_layer = CpuModel::load(&file).unwrap().config.n_layer;
    for ngl in [0, n_layer / 2, n_layer + 1] {
        let m = model(&file, ngl);
        let nv = m.config().n_vocab;
        for (si, seq) in seqs.iter().enumerate() {
            let n = seq.top.len();
            let mut cache: HybridCache = m.new_cache(N_CTX).unwrap();
            let batch = m
                .forward(&seq.tokens[..n], &mut cache, Logits::From(0))
                .unwrap();
            let w = worst(seq, &batch, nv);
            assert!(w < TOL, "{arch} {ty} -ngl {ngl} seq {si} prefill: {w}");
            let mut cache = m.new_cache(N_CTX).unwrap();
            let mut one = Vec::with_capacity(n * nv);
            for &t in &seq.tokens[..n] {
                one.extend(m.forward(&[t], &mut cache, Logits::Last).unwrap());
            }
            let w = worst(seq, &one, nv);
            assert!(w < TOL, "{arch} {ty} -ngl {ngl} seq {si} one by one: {w}");
        }
        // The offloaded blocks ran on the device.
        assert_eq!(m.block_dispatches() > 0, ngl > 0, "{arch} {ty} -ngl {ngl}");
    }
}

#[test]
fn qwen35_f32_matches_the_exact_reference() {
    matches_reference("qwen35", "F32", false);
}

#[test]
fn qwen35_q8_0_matches_the_exact_reference() {
    matches_reference("qwen35", "Q8_0", false);
}

#[test]
fn qwen35_with_an_mtp_block_matches_the_exact_reference() {
    matches_reference("qwen35", "F32", true);
}

#[test]
fn qwen35moe_f32_matches_the_exact_reference() {
    matches_reference("qwen35moe", "F32", false);
}

#[test]
fn qwen35moe_q8_0_matches_the_exact_reference() {
    matches_reference("qwen35moe", "Q8_0", false);
}

#[test]
fn qwen3next_f32_matches_the_exact_reference() {
    matches_reference("qwen3next", "F32", false);
}

#[test]
fn qwen3next_q8_0_matches_the_exact_reference() {
    matches_reference("qwen3next", "Q8_0", false);
}

/// Qwen3-Next's older files: q, k, v and z in one product (`ssm_in`).
#[test]
fn qwen3next_with_a_fused_input_matches_the_exact_reference() {
    matches_reference("qwen3next", "F32-ssm-in", false);
}

/// Eight sequences in one step, prompts then decode steps side by side,
/// give each sequence's bits alone.
#[test]
fn eight_sequences_in_a_step_keep_their_bits() {
    for arch in ["qwen35", "qwen35moe", "qwen3next"] {
        let fx = fixture(arch, "Q8_0", false);
        let file = Model::open(&fx.path, LoadMode::Mmap).unwrap();
        let n_layer = CpuModel::load(&file).unwrap().config.n_layer;
        for ngl in [0, n_layer + 1] {
            eight_in_a_step(arch, &model(&file, ngl));
        }
    }
}

fn eight_in_a_step(arch: &str, m: &HybridModel<'_>) {
    {
        let prompts: Vec<Vec<u32>> = (0..8u32)
            .map(|i| {
                (0..3 + i as usize)
                    .map(|j| 17 + 1000 * i + 7 * j as u32)
                    .collect()
            })
            .collect();
        let alone: Vec<Vec<Vec<f32>>> = prompts
            .iter()
            .map(|p| {
                let mut c = m.new_cache(N_CTX).unwrap();
                let mut out = vec![m.forward(p, &mut c, Logits::Last).unwrap()];
                for s in 0..3u32 {
                    out.push(m.forward(&[40 + s], &mut c, Logits::Last).unwrap());
                }
                out
            })
            .collect();
        let mut caches = m.new_caches(8, N_CTX).unwrap();
        let mut work: Vec<(&[u32], &mut HybridCache)> = prompts
            .iter()
            .zip(caches.iter_mut())
            .map(|(p, c)| (&p[..], c))
            .collect();
        let got = m.forward_multi(&mut work).unwrap();
        for (i, g) in got.iter().enumerate() {
            assert_eq!(g, &alone[i][0], "{arch} seq {i} prompt");
        }
        for s in 0..3u32 {
            let tok = [40 + s];
            let mut work: Vec<(&[u32], &mut HybridCache)> =
                caches.iter_mut().map(|c| (&tok[..], c)).collect();
            let got = m.forward_multi(&mut work).unwrap();
            for (i, g) in got.iter().enumerate() {
                assert_eq!(g, &alone[i][1 + s as usize], "{arch} seq {i} step {s}");
            }
        }
    }
}

/// A sequence's recurrent state through a slot's life, on the CPU and with
/// every block on the GPU (the device's states copied to the host at a
/// prompt chunk's checkpoint, sent back after a rewind, a restore or a
/// copy): a prompt gives the bits of its tokens one by one; cutting back
/// lands on a checkpoint and goes on with the bits of the first time; a
/// saved and restored slot, and a slot lent another's prefix, go on as
/// the source; checkpoints stay within their bound.
mod state {
    use super::*;

    const TOKENS: [u32; 12] = [3, 1400, 15, 920, 65, 35, 8900, 79, 32, 38, 46, 26];
    const BUDGET: u64 = 1 << 20;

    fn with_budget(file: &Model, ngl: usize, budget: u64) -> HybridModel<'_> {
        let mut cpu = CpuModel::load(file).unwrap();
        cpu.config.kv.checkpoint_bytes = budget;
        let p = plan::plan(
            file,
            &cpu.config,
            ngl,
            &PlanParams {
                n_ctx: N_CTX,
                ..PlanParams::default()
            },
        );
        HybridModel::new(cpu, p, (ngl > 0).then(gpu)).unwrap()
    }

    /// Checkpoints at 5 and 9 (two prompt chunks), then decoding to `len`.
    fn chunks_then_decode(m: &HybridModel<'_>, cache: &mut HybridCache, len: usize) {
        m.forward(&TOKENS[..5], cache, Logits::Last).unwrap();
        m.forward(&TOKENS[5..9], cache, Logits::Last).unwrap();
        for &t in &TOKENS[9..len] {
            m.forward(&[t], cache, Logits::Last).unwrap();
        }
    }

    fn one_by_one(m: &HybridModel<'_>, tokens: &[u32]) -> Vec<Vec<f32>> {
        let mut cache = m.new_cache(N_CTX).unwrap();
        tokens
            .iter()
            .map(|&t| m.forward(&[t], &mut cache, Logits::Last).unwrap())
            .collect()
    }

    fn placements(file: &Model) -> [usize; 2] {
        [0, CpuModel::load(file).unwrap().config.n_layer + 1]
    }

    #[test]
    fn a_prompt_gives_the_bits_of_its_tokens_one_by_one() {
        let fx = fixture("qwen35", "Q8_0", false);
        let f = Model::open(&fx.path, LoadMode::Mmap).unwrap();
        for ngl in placements(&f) {
            let m = with_budget(&f, ngl, BUDGET);
            let nv = m.config().n_vocab;
            let each = one_by_one(&m, &TOKENS);
            let mut cache = m.new_cache(N_CTX).unwrap();
            let mut split = m
                .forward(&TOKENS[..5], &mut cache, Logits::From(0))
                .unwrap();
            split.extend(
                m.forward(&TOKENS[5..], &mut cache, Logits::From(0))
                    .unwrap(),
            );
            for (i, l) in each.iter().enumerate() {
                assert_eq!(&split[i * nv..(i + 1) * nv], &l[..], "-ngl {ngl} token {i}");
            }
            assert_ne!(each[1], one_by_one(&m, &TOKENS[1..2])[0], "-ngl {ngl}");
        }
    }

    #[test]
    fn truncation_goes_back_to_a_checkpoint_and_continues_with_the_same_bits() {
        let fx = fixture("qwen35", "Q8_0", false);
        let f = Model::open(&fx.path, LoadMode::Mmap).unwrap();
        for ngl in placements(&f) {
            let m = with_budget(&f, ngl, BUDGET);
            let each = one_by_one(&m, &TOKENS);
            for (want, kept) in [(11, 9), (9, 9), (8, 5), (4, 0)] {
                let mut c = m.new_cache(N_CTX).unwrap();
                chunks_then_decode(&m, &mut c, 12);
                c.truncate(want);
                assert_eq!(c.len(), kept, "-ngl {ngl} truncate({want})");
                for (i, &t) in TOKENS.iter().enumerate().skip(kept) {
                    let got = m.forward(&[t], &mut c, Logits::Last).unwrap();
                    assert_eq!(got, each[i], "-ngl {ngl} truncate({want}) token {i}");
                }
            }
        }
    }

    #[test]
    fn save_restore_and_copy_keep_state_and_checkpoints() {
        let fx = fixture("qwen35", "Q8_0", false);
        let f = Model::open(&fx.path, LoadMode::Mmap).unwrap();
        for ngl in placements(&f) {
            let m = with_budget(&f, ngl, BUDGET);
            let each = one_by_one(&m, &TOKENS);
            let mut caches = m.new_caches(3, N_CTX).unwrap();
            let (src, rest) = caches.split_at_mut(1);
            let src = &mut src[0];
            chunks_then_decode(&m, src, 10);
            let bytes = m.save_cache(src).unwrap();
            let (a, b) = rest.split_at_mut(1);
            let restored = &mut a[0];
            assert_eq!(m.restore_cache(restored, &bytes).unwrap(), 10);
            let got = m.forward(&TOKENS[10..11], restored, Logits::Last).unwrap();
            assert_eq!(got, each[10], "-ngl {ngl} restored");
            restored.truncate(7);
            assert_eq!(restored.len(), 5, "-ngl {ngl}");
            let got = m.forward(&TOKENS[5..6], restored, Logits::Last).unwrap();
            assert_eq!(got, each[5], "-ngl {ngl} restored, cut back");
            assert!(m
                .restore_cache(restored, &bytes[..bytes.len() - 5])
                .is_err());
            assert_eq!(restored.len(), 0);
            let dst = &mut b[0];
            m.copy_cache(src, dst, 10).unwrap();
            assert_eq!(dst.len(), 10, "-ngl {ngl}");
            let got = m.forward(&TOKENS[10..11], dst, Logits::Last).unwrap();
            assert_eq!(got, each[10], "-ngl {ngl} copied whole");
            m.copy_cache(src, dst, 8).unwrap();
            assert_eq!(dst.len(), 5, "-ngl {ngl}");
            for (i, &t) in TOKENS.iter().enumerate().skip(5) {
                let got = m.forward(&[t], dst, Logits::Last).unwrap();
                assert_eq!(got, each[i], "-ngl {ngl} copied, token {i}");
            }
        }
    }

    #[test]
    fn checkpoints_stay_within_their_budget() {
        let fx = fixture("qwen35", "Q8_0", false);
        let f = Model::open(&fx.path, LoadMode::Mmap).unwrap();
        let c = CpuModel::load(&f).unwrap().config;
        // One checkpoint: every recurrent layer's state.
        let state: u64 = (0..c.n_layer).map(|il| c.state_len(il) as u64 * 4).sum();
        for ngl in placements(&f) {
            let m = with_budget(&f, ngl, 2 * state);
            let mut cache = m.new_cache(N_CTX).unwrap();
            for chunk in TOKENS.chunks(3) {
                m.forward(chunk, &mut cache, Logits::Last).unwrap();
                assert!(cache.checkpoint_bytes() <= 2 * state, "-ngl {ngl}");
            }
            assert_eq!(cache.checkpoint_bytes(), 2 * state, "-ngl {ngl}");
            // Back to the newest checkpoint (9 of 12), then on.
            cache.truncate(11);
            assert_eq!(cache.len(), 9, "-ngl {ngl}");
            cache.truncate(5);
            assert_eq!(cache.len(), 0, "-ngl {ngl}: 3 and 6 were evicted");
        }
    }
}

/// Placement counts a recurrent block's state on its device, and on the
/// host its copy and the checkpoints' budget (`gpu/arena.rs`).
#[test]
fn placement_counts_each_state_where_it_lives() {
    let fx = fixture("qwen35", "Q8_0", false);
    let f = Model::open(&fx.path, LoadMode::Mmap).unwrap();
    let c = CpuModel::load(&f).unwrap().config;
    let budget = c.kv.checkpoint_bytes;
    let states: u64 = (0..c.n_layer).map(|il| c.state_len(il) as u64 * 4).sum();
    let params = PlanParams {
        n_ctx: N_CTX,
        ..PlanParams::default()
    };
    let all = plan::plan(&f, &c, c.n_layer + 1, &params);
    for (il, slot) in all.slots.iter().take(c.n_layer).enumerate() {
        if c.is_recurrent(il) {
            assert_eq!(slot.kv_bytes, c.state_len(il) as u64 * 4, "blk.{il}");
        }
    }
    assert_eq!(all.cpu_kv, states + budget);
    let none = plan::plan(&f, &c, 0, &params);
    assert_eq!(none.gpu_kv, 0);
    let rows: u64 = none.slots.iter().map(|s| s.kv_bytes).sum();
    assert_eq!(none.cpu_kv, rows);
    assert!(rows >= states + budget);
}
