//! Small synthetic models of every architecture, written with the GGUF
//! writer: they load, they run on the CPU and on the GPU with the same
//! results, and a file that lacks a key or a tensor, or has one of the wrong
//! shape, is refused with the name of what is wrong.
//!
//! There is no real qwen2/qwen3 file here, so numerical parity with llama.cpp
//! for those waits for one; this checks that their specific parts (QKV biases,
//! per-head Q/K norms, a head dim that differs from n_embd / n_head) are
//! wired on both devices identically.
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::{Arc, OnceLock};

use lamina_gguf::{File, GgmlType, Model, Value, Writer};
use lamina_gpu::{Gpu, GpuOptions};
use lamina_model::arch::{MoeKind, ARCHS};
use lamina_model::plan::{self, PlanParams};
use lamina_model::{CpuModel, HybridModel, KvCache, KvType, KvTypes, Logits};

const E: usize = 64;
const FF: usize = 96;
const HEADS: usize = 4;
const KV_HEADS: usize = 2;
const VOCAB: usize = 100;
const LAYERS: usize = 2;
/// Experts of the MoE architectures, the ones each token uses, their width
/// and the shared expert's (qwen2moe).
const EXPERTS: usize = 6;
const USED: usize = 2;
const FF_EXP: usize = 32;
const FF_SHARED: usize = 64;

/// Relative error allowed between the CPU and GPU logits: both accumulate in
/// f32 over at most 128 products, in different orders.
const CPU_GPU_REL: f64 = 1e-4;

struct Rng(u64);

impl Rng {
    fn f32(&mut self) -> f32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        ((self.0 >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.5
    }
    fn vec(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.f32()).collect()
    }
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// ggml's Q8_0: per 32 weights an f16 scale max|x|/127 and rounded int8s.
fn q8_0_bytes(v: &[f32]) -> Vec<u8> {
    let mut out = Vec::new();
    for block in v.chunks(32) {
        let amax = block.iter().fold(0.0f32, |m, x| m.max(x.abs()));
        let d = amax / 127.0;
        let id = if d > 0.0 { 1.0 / d } else { 0.0 };
        out.extend_from_slice(&half::f16::from_f32(d).to_le_bytes());
        out.extend(block.iter().map(|x| (x * id).round() as i8 as u8));
    }
    out
}

/// The table's row of an architecture the tests name.
fn row(arch: &str) -> &'static lamina_model::arch::ArchRow {
    lamina_model::arch::find(arch).unwrap()
}

struct Spec {
    arch: &'static str,
    head_dim: usize,
    bias: bool,
    qk_norm: bool,
    tied: bool,
    skip_tensor: Option<&'static str>,
    bad_shape: Option<&'static str>,
    skip_key: Option<&'static str>,
    /// The gate weight in Q8_0 like the up weight (one stacked gate/up
    /// product, as real files have); F32 otherwise, to cover mixed stacks.
    gate_q8: bool,
    /// phi3: Q, K and V as three tensors instead of one fused `attn_qkv`.
    unfused_qkv: bool,
    /// phi3: LongRoPE factors, as the 128k-context files carry (long and
    /// short sets, a trained context of 8 and an attention factor).
    long_rope: bool,
    /// `rope_freqs.weight` (Llama 3.x): pair i's divisor 1 + s·i, for s.
    rope_freqs: Option<f32>,
    /// `rope.scaling.type` and `rope.scaling.factor`.
    rope_scaling: Option<(&'static str, f32)>,
}

impl Spec {
    fn new(arch: &'static str) -> Self {
        Spec {
            arch,
            head_dim: E / HEADS,
            bias: row(arch).qkv_bias,
            qk_norm: row(arch).qk_norm,
            tied: arch != "llama",
            skip_tensor: None,
            bad_shape: None,
            skip_key: None,
            gate_q8: false,
            unfused_qkv: false,
            long_rope: false,
            rope_freqs: None,
            rope_scaling: None,
        }
    }
}

fn build(spec: &Spec) -> Vec<u8> {
    let a = spec.arch;
    let hd = spec.head_dim;
    let (qd, kvd) = (HEADS * hd, KV_HEADS * hd);
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut w = Writer::new().kv("general.architecture", Value::String(a.into()));
    let keys: Vec<(String, Value)> = vec![
        (format!("{a}.block_count"), Value::U32(LAYERS as u32)),
        (format!("{a}.embedding_length"), Value::U32(E as u32)),
        (format!("{a}.feed_forward_length"), Value::U32(FF as u32)),
        (
            format!("{a}.attention.head_count"),
            Value::U32(HEADS as u32),
        ),
        // A u64 on purpose: readers must coerce integer widths.
        (
            format!("{a}.attention.head_count_kv"),
            Value::U64(KV_HEADS as u64),
        ),
        (format!("{a}.attention.key_length"), Value::U32(hd as u32)),
        (format!("{a}.context_length"), Value::U32(256)),
        (format!("{a}.vocab_size"), Value::U32(VOCAB as u32)),
        (format!("{a}.rope.freq_base"), Value::F32(10000.0)),
        (
            format!("{a}.attention.layer_norm_rms_epsilon"),
            Value::F32(1e-5),
        ),
        (format!("{a}.attention.sliding_window"), Value::U32(3)),
    ];
    let r = row(a);
    let moe = r.moe.is_some();
    let shared_expert = r.moe == Some(MoeKind::SharedExpert);
    let mut keys = keys;
    if spec.long_rope {
        keys.push((
            format!("{a}.rope.scaling.original_context_length"),
            Value::U32(8),
        ));
        keys.push((format!("{a}.rope.scaling.attn_factor"), Value::F32(1.19)));
    }
    if let Some((ty, factor)) = spec.rope_scaling {
        keys.push((format!("{a}.rope.scaling.type"), Value::String(ty.into())));
        keys.push((format!("{a}.rope.scaling.factor"), Value::F32(factor)));
    }
    if moe {
        keys.push((format!("{a}.expert_count"), Value::U32(EXPERTS as u32)));
        keys.push((format!("{a}.expert_used_count"), Value::U32(USED as u32)));
        keys.push((
            format!("{a}.expert_feed_forward_length"),
            Value::U32(FF_EXP as u32),
        ));
        if shared_expert {
            keys.push((
                format!("{a}.expert_shared_feed_forward_length"),
                Value::U32(FF_SHARED as u32),
            ));
        }
    }
    for (k, v) in keys {
        if spec.skip_key.is_some_and(|s| k.ends_with(s)) {
            continue;
        }
        w = w.kv(k, v);
    }
    let add = |w: Writer, name: &str, dims: &[usize], q8: bool, rng: &mut Rng| -> Writer {
        if spec.skip_tensor == Some(name) {
            return w;
        }
        let mut dims: Vec<u64> = dims.iter().map(|&d| d as u64).collect();
        if spec.bad_shape == Some(name) {
            dims[0] += 32;
        }
        let n: u64 = dims.iter().product();
        let is_norm = name.contains("norm");
        let vals: Vec<f32> = if is_norm {
            (0..n).map(|_| 1.0 + rng.f32()).collect()
        } else {
            rng.vec(n as usize)
        };
        if q8 {
            w.tensor(name, &dims, GgmlType::Q8_0, q8_0_bytes(&vals))
        } else {
            w.tensor(name, &dims, GgmlType::F32, f32_bytes(&vals))
        }
    };
    w = add(w, "token_embd.weight", &[E, VOCAB], true, &mut rng);
    for il in 0..LAYERS {
        let n = |s: &str| format!("blk.{il}.{s}");
        w = add(w, &n("attn_norm.weight"), &[E], false, &mut rng);
        if r.fused_gate_up {
            // Fused Q, K, V (or the same values as three tensors), and gate
            // and up as one `ffn_up` of 2 · FF rows, the gate's first.
            let (q, k, v) = (rng.vec(E * qd), rng.vec(E * kvd), rng.vec(E * kvd));
            if spec.unfused_qkv {
                w = w.tensor(
                    n("attn_q.weight"),
                    &[E as u64, qd as u64],
                    GgmlType::Q8_0,
                    q8_0_bytes(&q),
                );
                w = w.tensor(
                    n("attn_k.weight"),
                    &[E as u64, kvd as u64],
                    GgmlType::Q8_0,
                    q8_0_bytes(&k),
                );
                w = w.tensor(
                    n("attn_v.weight"),
                    &[E as u64, kvd as u64],
                    GgmlType::Q8_0,
                    q8_0_bytes(&v),
                );
            } else {
                let qkv = [q, k, v].concat();
                let dims = [E as u64, (qd + 2 * kvd) as u64];
                w = w.tensor(
                    n("attn_qkv.weight"),
                    &dims,
                    GgmlType::Q8_0,
                    q8_0_bytes(&qkv),
                );
            }
            w = add(w, &n("attn_output.weight"), &[qd, E], false, &mut rng);
            w = add(w, &n("ffn_norm.weight"), &[E], false, &mut rng);
            w = add(w, &n("ffn_up.weight"), &[E, 2 * FF], true, &mut rng);
            w = add(w, &n("ffn_down.weight"), &[FF, E], false, &mut rng);
            continue;
        }
        w = add(w, &n("attn_q.weight"), &[E, qd], true, &mut rng);
        w = add(w, &n("attn_k.weight"), &[E, kvd], false, &mut rng);
        w = add(w, &n("attn_v.weight"), &[E, kvd], true, &mut rng);
        w = add(w, &n("attn_output.weight"), &[qd, E], false, &mut rng);
        if spec.bias {
            w = add(w, &n("attn_q.bias"), &[qd], false, &mut rng);
            w = add(w, &n("attn_k.bias"), &[kvd], false, &mut rng);
            w = add(w, &n("attn_v.bias"), &[kvd], false, &mut rng);
        }
        if spec.qk_norm {
            w = add(w, &n("attn_q_norm.weight"), &[hd], false, &mut rng);
            w = add(w, &n("attn_k_norm.weight"), &[hd], false, &mut rng);
        }
        if r.post_norms {
            w = add(w, &n("post_attention_norm.weight"), &[E], false, &mut rng);
            w = add(w, &n("post_ffw_norm.weight"), &[E], false, &mut rng);
        }
        w = add(w, &n("ffn_norm.weight"), &[E], false, &mut rng);
        if moe {
            w = add(w, &n("ffn_gate_inp.weight"), &[E, EXPERTS], false, &mut rng);
            let x = &[E, FF_EXP, EXPERTS];
            w = add(w, &n("ffn_gate_exps.weight"), x, true, &mut rng);
            w = add(w, &n("ffn_up_exps.weight"), x, true, &mut rng);
            w = add(
                w,
                &n("ffn_down_exps.weight"),
                &[FF_EXP, E, EXPERTS],
                true,
                &mut rng,
            );
            if shared_expert {
                w = add(w, &n("ffn_gate_inp_shexp.weight"), &[E], false, &mut rng);
                w = add(
                    w,
                    &n("ffn_gate_shexp.weight"),
                    &[E, FF_SHARED],
                    true,
                    &mut rng,
                );
                w = add(
                    w,
                    &n("ffn_up_shexp.weight"),
                    &[E, FF_SHARED],
                    true,
                    &mut rng,
                );
                w = add(
                    w,
                    &n("ffn_down_shexp.weight"),
                    &[FF_SHARED, E],
                    false,
                    &mut rng,
                );
            }
            continue;
        }
        w = add(w, &n("ffn_gate.weight"), &[E, FF], spec.gate_q8, &mut rng);
        w = add(w, &n("ffn_up.weight"), &[E, FF], true, &mut rng);
        w = add(w, &n("ffn_down.weight"), &[FF, E], false, &mut rng);
    }
    if spec.long_rope {
        for (name, step) in [
            ("rope_factors_long.weight", 0.9),
            ("rope_factors_short.weight", 0.05),
        ] {
            let f: Vec<f32> = (0..hd / 2).map(|i| 1.0 + step * i as f32).collect();
            w = w.tensor(name, &[(hd / 2) as u64], GgmlType::F32, f32_bytes(&f));
        }
    }
    if let Some(s) = spec.rope_freqs {
        let pairs = hd / 2 + usize::from(spec.bad_shape == Some("rope_freqs.weight"));
        let f: Vec<f32> = (0..pairs).map(|i| 1.0 + s * i as f32).collect();
        w = w.tensor(
            "rope_freqs.weight",
            &[pairs as u64],
            GgmlType::F32,
            f32_bytes(&f),
        );
    }
    w = add(w, "output_norm.weight", &[E], false, &mut rng);
    if !spec.tied {
        w = add(w, "output.weight", &[E, VOCAB], false, &mut rng);
    }
    w.to_bytes()
}

fn open(spec: &Spec) -> Model {
    Model::from_shards(vec![File::from_bytes(build(spec)).unwrap()]).unwrap()
}

fn gpu() -> Arc<Gpu> {
    static GPU: OnceLock<Arc<Gpu>> = OnceLock::new();
    GPU.get_or_init(|| Arc::new(Gpu::new(GpuOptions::default()).unwrap()))
        .clone()
}

const PROMPT: [u32; 5] = [3, 14, 15, 92, 65];

/// Prompt as one batch, then two decode steps; logits of every step.
fn cpu_logits(m: &CpuModel<'_>) -> Vec<f32> {
    let mut cache = KvCache::new(&m.config, 16).unwrap();
    let mut out = m.forward(&PROMPT, &mut cache, Logits::From(0)).unwrap();
    for t in [7, 8] {
        out.extend(m.forward(&[t], &mut cache, Logits::Last).unwrap());
    }
    out
}

fn hybrid_logits(file: &Model, ngl: usize) -> Vec<f32> {
    hybrid_logits_on(file, ngl, gpu())
}

fn hybrid_logits_on(file: &Model, ngl: usize, gpu: Arc<Gpu>) -> Vec<f32> {
    hybrid_logits_moe(file, ngl, gpu, usize::MAX)
}

/// [`hybrid_logits_on`] with the routed experts of blocks `cpu_moe..` on
/// the GPU (`--n-cpu-moe`).
fn hybrid_logits_moe(file: &Model, ngl: usize, gpu: Arc<Gpu>, cpu_moe: usize) -> Vec<f32> {
    let cpu = CpuModel::load(file).unwrap();
    let p = plan::plan(
        file,
        &cpu.config,
        ngl,
        &PlanParams {
            n_ctx: 16,
            cpu_moe,
            ..PlanParams::default()
        },
    );
    let m = HybridModel::new(cpu, p, Some(gpu)).unwrap();
    let mut cache = m.new_cache(16).unwrap();
    let mut out = m.forward(&PROMPT, &mut cache, Logits::From(0)).unwrap();
    for t in [7, 8] {
        out.extend(m.forward(&[t], &mut cache, Logits::Last).unwrap());
    }
    out
}

/// The model planned for 32 positions at `-ngl ngl`, the experts of the
/// first `cpu_moe` offloaded blocks in RAM (`--n-cpu-moe`).
fn hybrid_32(file: &Model, ngl: usize, cpu_moe: usize, gpu: Option<Arc<Gpu>>) -> HybridModel<'_> {
    let cpu = CpuModel::load(file).unwrap();
    let params = PlanParams {
        n_ctx: 32,
        cpu_moe,
        ..PlanParams::default()
    };
    let p = plan::plan(file, &cpu.config, ngl, &params);
    HybridModel::new(cpu, p, gpu).unwrap()
}

fn rel_err(a: &[f32], b: &[f32]) -> f64 {
    let num: f64 = a.iter().zip(b).map(|(x, y)| f64::from(x - y).powi(2)).sum();
    let den: f64 = b.iter().map(|y| f64::from(*y).powi(2)).sum();
    (num / den).sqrt()
}

fn cpu_and_gpu_agree(spec: Spec) {
    let file = open(&spec);
    let cpu = CpuModel::load(&file).unwrap();
    let reference = cpu_logits(&cpu);
    assert_eq!(reference.len(), (PROMPT.len() + 2) * VOCAB);
    assert!(reference.iter().all(|v| v.is_finite()));
    for ngl in [LAYERS + 1, 2, 1] {
        let got = hybrid_logits(&file, ngl);
        let e = rel_err(&got, &reference);
        assert!(
            e < CPU_GPU_REL,
            "{} -ngl {ngl}: relative error {e}",
            spec.arch
        );
    }
}

/// `Logits::Hidden` (what embeddings pool): every prompt token's state
/// after the final norm, on the CPU and through the GPU layers alike, and
/// the head's input: the logits are those rows times the output matrix.
#[test]
fn hidden_states_agree_on_cpu_and_gpu() {
    let spec = Spec::new("llama");
    let file = open(&spec);
    let cpu = CpuModel::load(&file).unwrap();
    let mut cache = KvCache::new(&cpu.config, 16).unwrap();
    let reference = cpu.forward(&PROMPT, &mut cache, Logits::Hidden).unwrap();
    let e = cpu.config.n_embd;
    assert_eq!(reference.len(), PROMPT.len() * e);
    assert_eq!(
        cache.len(),
        PROMPT.len(),
        "the prompt's keys and values are kept"
    );
    // Each row is RMS-normed by the output norm (whose weights are not 1).
    assert!(reference.iter().all(|v| v.is_finite()));
    assert_ne!(reference[..e], reference[e..2 * e]);
    let mut cache = KvCache::new(&cpu.config, 16).unwrap();
    let logits = cpu.forward(&PROMPT, &mut cache, Logits::From(0)).unwrap();
    let mut again = vec![0.0f32; PROMPT.len() * VOCAB];
    cpu.weights
        .output
        .matmul(&reference, PROMPT.len(), &mut again)
        .unwrap();
    assert_eq!(again, logits, "the head multiplies exactly these rows");
    for ngl in [LAYERS + 1, 1] {
        let cpu = CpuModel::load(&file).unwrap();
        let p = plan::plan(
            &file,
            &cpu.config,
            ngl,
            &PlanParams {
                n_ctx: 16,
                ..PlanParams::default()
            },
        );
        let m = HybridModel::new(cpu, p, Some(gpu())).unwrap();
        let mut cache = m.new_cache(16).unwrap();
        let got = m.forward(&PROMPT, &mut cache, Logits::Hidden).unwrap();
        assert_eq!(got.len(), reference.len());
        let err = rel_err(&got, &reference);
        assert!(err < CPU_GPU_REL, "-ngl {ngl}: relative error {err}");
    }
}

#[test]
fn llama_runs_the_same_on_cpu_and_gpu() {
    cpu_and_gpu_agree(Spec::new("llama"));
}

#[test]
fn qwen2_runs_the_same_on_cpu_and_gpu() {
    cpu_and_gpu_agree(Spec::new("qwen2"));
}

#[test]
fn qwen3_with_a_wide_head_runs_the_same_on_cpu_and_gpu() {
    // head_dim 32 with 4 heads: Q is 128 wide while n_embd is 64.
    cpu_and_gpu_agree(Spec {
        head_dim: 32,
        ..Spec::new("qwen3")
    });
}

/// Mixtures of experts: an offloaded block is split, its routed experts
/// in host memory on the CPU and the rest (attention, norms, router,
/// shared expert) on the GPU; the plan counts the experts' bytes on the
/// CPU, and the logits agree with the CPU's at every placement.
#[test]
fn mixtures_of_experts_split_their_blocks_between_the_devices() {
    for arch in ["qwen3moe", "qwen2moe"] {
        let file = open(&Spec::new(arch));
        let cpu = CpuModel::load(&file).unwrap();
        let m = cpu.config.moe.unwrap();
        assert_eq!((m.n_expert, m.n_used, m.n_ff_exp), (EXPERTS, USED, FF_EXP));
        assert_eq!(m.norm_weights, arch == "qwen3moe");
        assert_eq!(m.n_ff_shared, (arch == "qwen2moe").then_some(FF_SHARED));
        let p = plan::plan(&file, &cpu.config, LAYERS + 1, &PlanParams::default());
        assert_eq!(p.ngl, LAYERS + 1, "{arch}: every slot is offloaded");
        assert!(p.held.is_empty(), "{:?}", p.held);
        // Three Q8_0 matrices of FF_EXP × E per expert (34 bytes per 32
        // weights), in every block.
        let experts = (3 * EXPERTS * FF_EXP * E / 32 * 34) as u64;
        for s in &p.slots[..LAYERS] {
            assert!(s.is_split(), "{arch} {}", s.name);
            assert_eq!(s.expert_bytes, experts, "{arch} {}", s.name);
            assert_eq!(s.gpu_bytes(), s.weight_bytes - experts);
        }
        assert!(!p.slots[LAYERS].is_split());
        let all_cpu = plan::plan(&file, &cpu.config, 0, &PlanParams::default());
        assert_eq!(
            p.cpu_weights,
            all_cpu.cpu_weights - all_cpu.slots.iter().map(|s| s.weight_bytes).sum::<u64>()
                + LAYERS as u64 * experts
        );
        assert_eq!(
            p.gpu_weights,
            p.slots.iter().map(|s| s.gpu_bytes()).sum::<u64>()
        );
        let table = lamina_model::placement::plan_table(&p, "test");
        assert!(
            table.contains("routed experts"),
            "the table names the experts on the CPU: {table}"
        );
        cpu_and_gpu_agree(Spec::new(arch));
        // --n-cpu-moe 1 and 0: the later blocks' experts on the GPU.
        let reference = cpu_logits(&cpu);
        for cpu_moe in [1, 0] {
            let params = PlanParams {
                cpu_moe,
                ..PlanParams::default()
            };
            let p = plan::plan(&file, &cpu.config, LAYERS + 1, &params);
            let split: Vec<bool> = p.slots[..LAYERS].iter().map(|s| s.is_split()).collect();
            assert_eq!(split, (0..LAYERS).map(|i| i < cpu_moe).collect::<Vec<_>>());
            assert_eq!(p.split_expert_bytes(), cpu_moe as u64 * experts);
            let got = hybrid_logits_moe(&file, LAYERS + 1, gpu(), cpu_moe);
            let err = rel_err(&got, &reference);
            assert!(err < CPU_GPU_REL, "{arch} --n-cpu-moe {cpu_moe}: {err}");
        }
    }
}

/// Greedy decoding at split placement picks the tokens of the CPU path.
#[test]
fn split_mixtures_decode_the_cpu_tokens() {
    for arch in ["qwen3moe", "qwen2moe"] {
        let file = open(&Spec::new(arch));
        let greedy_moe = |ngl: usize, cpu_moe: usize| -> Vec<u32> {
            let m = hybrid_32(&file, ngl, cpu_moe, (ngl > 0).then(gpu));
            let mut cache = m.new_cache(32).unwrap();
            let mut logits = m.forward(&PROMPT, &mut cache, Logits::Last).unwrap();
            let mut out = Vec::new();
            for _ in 0..16 {
                let t = (0..logits.len())
                    .max_by(|&a, &b| logits[a].total_cmp(&logits[b]).then(b.cmp(&a)))
                    .unwrap() as u32;
                out.push(t);
                logits = m.forward(&[t], &mut cache, Logits::Last).unwrap();
            }
            out
        };
        let greedy = |ngl| greedy_moe(ngl, usize::MAX);
        let cpu = greedy(0);
        assert_eq!(greedy(LAYERS + 1), cpu, "{arch}: -ngl all");
        assert_eq!(greedy(2), cpu, "{arch}: -ngl 2");
        assert_eq!(greedy_moe(LAYERS + 1, 1), cpu, "{arch}: --n-cpu-moe 1");
        assert_eq!(greedy_moe(LAYERS + 1, 0), cpu, "{arch}: --n-cpu-moe 0");
        // Not a constant: the tokens depend on the model.
        assert!(cpu.iter().any(|&t| t != cpu[0]), "{arch}: {cpu:?}");
    }
}

/// Routed experts on the GPU (`--n-cpu-moe 0`) route on the device: a step
/// of few tokens (one on a CPU-backed device, eight on others) runs each
/// pair from the router's one-column runs; a larger one packs the pairs by
/// expert, on the device (by default) or on the host from the device's
/// choices (when asked, and where the packing kernel cannot hold a step).
/// A sequence gets the same bits every way: decoding alone (a step of one
/// token: pairs), beside two others (seven tokens) and beside a prompt of
/// twelve (thirteen: packed), packed on the host and by default; qwen2moe's shared expert
/// gated on the device every way too. On a device whose bindings hold two
/// experts' gate/up and four experts' down matrices (the experts split
/// between bindings, a dispatch each), the same bits again.
#[test]
fn experts_routed_on_the_device_give_a_sequence_its_bits_at_any_step_size() {
    for arch in ["qwen3moe", "qwen2moe"] {
        experts_routed_on_the_device(arch);
    }
}

fn experts_routed_on_the_device(arch: &'static str) {
    let file = open(&Spec::new(arch));
    let mut on_host = hybrid_32(&file, LAYERS + 1, 0, Some(gpu()));
    on_host.pack_experts_on_host(true);
    let by_default = hybrid_32(&file, LAYERS + 1, 0, Some(gpu()));
    // Q8_0 experts of 64 wide: 4352 bytes of gate/up and 2176 of down an
    // expert, so bindings of 2, 2, 2 and of 4, 2 experts.
    let small = Arc::new(
        Gpu::new(GpuOptions {
            max_storage_buffer_binding_size: Some(10 << 10),
            ..GpuOptions::default()
        })
        .unwrap(),
    );
    let mut split = hybrid_32(&file, LAYERS + 1, 0, Some(small));
    split.pack_experts_on_host(arch == "qwen2moe");
    let same = |x: &[f32], y: &[f32]| {
        x.len() == y.len() && x.iter().zip(y).all(|(p, q)| p.to_bits() == q.to_bits())
    };
    let long: Vec<u32> = (10..22).collect();
    let mut runs = Vec::new();
    for m in [&by_default, &on_host, &split] {
        multi_sequence_step_is_batch_invariant(m, true, &format!("{arch}, experts on the GPU"));
        let mut v = m.new_caches(2, 32).unwrap();
        let (mut b2, mut a2) = (v.pop().unwrap(), v.pop().unwrap());
        let mut a1 = m.new_cache(32).unwrap();
        m.forward(&PROMPT, &mut a1, Logits::Last).unwrap();
        m.forward(&PROMPT, &mut a2, Logits::Last).unwrap();
        let mut b1 = m.new_cache(32).unwrap();
        let prompt_alone = m.forward(&long, &mut b1, Logits::Last).unwrap();
        let mut got = vec![prompt_alone.clone()];
        for t in [40u32, 41, 42] {
            let alone = m.forward(&[t], &mut a1, Logits::Last).unwrap();
            let together = if t == 40 {
                m.forward_multi(&mut [(&[t], &mut a2), (&long, &mut b2)])
                    .unwrap()
            } else {
                m.forward_multi(&mut [(&[t], &mut a2)]).unwrap()
            };
            assert!(
                same(&alone, &together[0]),
                "{arch} token {t}: differs beside a prompt"
            );
            if t == 40 {
                assert!(
                    same(&prompt_alone, &together[1]),
                    "{arch}: the prompt differs beside a decoding token"
                );
            }
            got.push(alone);
        }
        runs.push(got);
    }
    for (x, y) in runs[0].iter().zip(&runs[1]) {
        assert!(
            same(x, y),
            "{arch}: packed on the host and by default differ"
        );
    }
    for (x, y) in runs[0].iter().zip(&runs[2]) {
        assert!(same(x, y), "{arch}: experts split between bindings differ");
    }
}

/// The experts differ from a dense block where they should: the qwen3moe
/// weights renormalised, the qwen2moe shared expert added.
#[test]
fn expert_routing_matters() {
    let logits = |arch| cpu_logits(&CpuModel::load(&open(&Spec::new(arch))).unwrap());
    let (a, b) = (logits("qwen3moe"), logits("qwen2moe"));
    assert!(a.iter().chain(&b).all(|v| v.is_finite()));
    assert!(rel_err(&a, &b) > 1e-3);
    // A file that lacks an expert tensor names it.
    let e = load_err(Spec {
        skip_tensor: Some("blk.1.ffn_down_exps.weight"),
        ..Spec::new("qwen3moe")
    });
    assert_eq!(e, "missing tensor blk.1.ffn_down_exps.weight");
    let e = load_err(Spec {
        skip_key: Some(".expert_used_count"),
        ..Spec::new("qwen3moe")
    });
    assert_eq!(e, "missing metadata key qwen3moe.expert_used_count");
}

/// phi3: fused QKV and gate/up matrices, split into views of their rows,
/// run alike on both devices and give the bits of the same weights as
/// separate tensors; a LongRoPE file is refused by name.
#[test]
fn phi3_fused_matrices_run_the_same_on_cpu_and_gpu() {
    cpu_and_gpu_agree(Spec::new("phi3"));
    let fused = cpu_logits(&CpuModel::load(&open(&Spec::new("phi3"))).unwrap());
    let split = cpu_logits(
        &CpuModel::load(&open(&Spec {
            unfused_qkv: true,
            ..Spec::new("phi3")
        }))
        .unwrap(),
    );
    assert_eq!(
        fused, split,
        "fused and separate Q, K, V give the same bits"
    );
    let plain = cpu_logits(&CpuModel::load(&open(&Spec::new("llama"))).unwrap());
    assert!(rel_err(&fused, &plain) > 1e-3);
}

/// Phi-3's LongRoPE: the long divisors for caches past the trained context
/// (8 here), the short ones within it, the cosines and sines times the
/// attention factor; CPU and GPU agree (at 16 positions: the long set).
#[test]
fn phi3_long_rope_turns_by_the_set_its_context_chooses() {
    let spec = Spec {
        long_rope: true,
        ..Spec::new("phi3")
    };
    let file = open(&spec);
    let m = CpuModel::load(&file).unwrap();
    let run = |n_ctx| {
        let mut cache = KvCache::new(&m.config, n_ctx).unwrap();
        m.forward(&PROMPT, &mut cache, Logits::From(0)).unwrap()
    };
    let (short, long) = (run(8), run(16));
    let plain_file = open(&Spec::new("phi3"));
    let plain = {
        let m = CpuModel::load(&plain_file).unwrap();
        let mut cache = KvCache::new(&m.config, 16).unwrap();
        m.forward(&PROMPT, &mut cache, Logits::From(0)).unwrap()
    };
    assert!(rel_err(&short, &long) > 1e-3, "the context picks the set");
    assert!(
        rel_err(&short, &plain) > 1e-3,
        "the short set and the factor count"
    );
    cpu_and_gpu_agree(spec);
}

#[test]
fn gemma3_with_a_sliding_window_runs_the_same_on_cpu_and_gpu() {
    // A window of 3 over a 7-token sequence is active on layers 0 and 1.
    cpu_and_gpu_agree(Spec::new("gemma3"));
}

/// The blocks whose norms fold into their products (the norm prologue and
/// add epilogue of the mat-vec kernels, or on a CPU-backed device the norm
/// epilogue of the product before each norm) give the bits of the blocks
/// that run them as separate kernels: a prompt of five columns (small-N)
/// and decode steps, every architecture (gemma3's post-norms keep the
/// separate kernels either way), every layer offloaded and only some.
#[test]
fn folded_norms_give_the_bits_of_separate_norm_kernels() {
    let open_gpu = |prologue, epilogue| {
        Arc::new(
            Gpu::new(GpuOptions {
                norm_prologue: Some(prologue),
                norm_epilogue: Some(epilogue),
                ..GpuOptions::default()
            })
            .unwrap(),
        )
    };
    let (folded, after, separate) = (
        open_gpu(true, false),
        open_gpu(false, true),
        open_gpu(false, false),
    );
    for (arch, gate_q8) in [
        ("llama", true),
        ("llama", false),
        ("qwen2", true),
        ("qwen3", true),
        ("gemma3", true),
    ] {
        let file = open(&Spec {
            gate_q8,
            ..Spec::new(arch)
        });
        for ngl in [LAYERS + 1, 2] {
            let b = hybrid_logits_on(&file, ngl, separate.clone());
            for (how, gpu) in [("folded", &folded), ("epilogue", &after)] {
                let a = hybrid_logits_on(&file, ngl, gpu.clone());
                assert_eq!(a.len(), b.len());
                let same = a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits());
                assert!(same, "{arch} -ngl {ngl}: {how} norms change the logits");
            }
        }
    }
    // And the folding happened: fewer dispatches per decode step.
    let file = open(&Spec {
        gate_q8: true,
        ..Spec::new("llama")
    });
    let count = |gpu: Arc<Gpu>| {
        let before = gpu.counters().0;
        hybrid_logits_on(&file, LAYERS + 1, gpu.clone());
        gpu.counters().0 - before
    };
    // A step (the prompt, then two decode steps) is one submission, its
    // logits' readback copied in it.
    let submits = |gpu: &Arc<Gpu>| {
        let before = gpu.counters().1;
        hybrid_logits_on(&file, LAYERS + 1, gpu.clone());
        gpu.counters().1 - before
    };
    assert_eq!(submits(&separate), 3, "submissions for three steps");
    let cpu_backed = after.norm_epilogue();
    let (f, e, s) = (count(folded), count(after), count(separate));
    assert!(f < s, "folded {f} dispatches, separate {s}");
    if cpu_backed {
        assert!(e < s, "norm epilogues {e} dispatches, separate {s}");
    }
}

#[test]
fn the_architectures_differ_where_they_should() {
    let logits = |spec: Spec| cpu_logits(&CpuModel::load(&open(&spec)).unwrap());
    let plain = logits(Spec::new("llama"));
    let biased = logits(Spec {
        bias: true,
        ..Spec::new("qwen2")
    });
    assert!(rel_err(&plain, &biased) > 1e-3, "qwen2 differs from llama");
}

fn load_err(spec: Spec) -> String {
    match CpuModel::load(&open(&spec)) {
        Ok(_) => panic!("{} loaded", spec.arch),
        Err(e) => e.to_string(),
    }
}

#[test]
fn missing_and_misshapen_parts_are_named() {
    let e = load_err(Spec {
        skip_tensor: Some("blk.1.ffn_up.weight"),
        ..Spec::new("llama")
    });
    assert_eq!(e, "missing tensor blk.1.ffn_up.weight");
    let e = load_err(Spec {
        skip_tensor: Some("blk.0.attn_q_norm.weight"),
        ..Spec::new("qwen3")
    });
    assert_eq!(e, "missing tensor blk.0.attn_q_norm.weight");
    let e = load_err(Spec {
        bad_shape: Some("blk.0.attn_k.weight"),
        ..Spec::new("llama")
    });
    assert!(
        e.starts_with("tensor blk.0.attn_k.weight has shape [96, 32], expected [64, 32]"),
        "{e}"
    );
    let e = load_err(Spec {
        skip_key: Some(".embedding_length"),
        ..Spec::new("qwen2")
    });
    assert_eq!(e, "missing metadata key qwen2.embedding_length");
    assert!(matches!(
        CpuModel::load(&open(&Spec::new("llama"))).map(|m| m.config.n_head_kv),
        Ok(KV_HEADS)
    ));
}

/// Several sequences in one step (a decode beside a prompt beside a longer
/// decode) give each the bits it gets alone: the server's promise that a
/// request's output does not depend on what else is running.
#[test]
fn a_multi_sequence_step_equals_separate_steps_bit_for_bit() {
    for arch in ["llama", "qwen2", "qwen3", "gemma3", "qwen3moe", "qwen2moe"] {
        let file = open(&Spec::new(arch));
        // At -ngl 0 the hybrid model hands each step to CpuModel's own
        // forward and forward_multi.
        let m = hybrid_32(&file, 0, usize::MAX, None);
        multi_sequence_step_is_batch_invariant(&m, false, arch);
    }
}

/// The same promise with layers on the GPU: the batched step runs every
/// GPU layer for all sequences in one submission (shared mat-muls, RoPE and
/// attention per sequence at its own offset), and each sequence still gets
/// the bits it gets alone, fully offloaded and split with the CPU.
#[test]
fn a_multi_sequence_gpu_step_equals_separate_steps_bit_for_bit() {
    for arch in ["llama", "gemma3", "qwen3moe", "qwen2moe"] {
        let file = open(&Spec::new(arch));
        // Batched caches made together (one buffer per layer: one RoPE and
        // one attention dispatch for the step) or not (runs of sequences
        // that share buffers: here the middle one does not).
        // And for the mixtures, block 1's routed experts on the GPU
        // (`--n-cpu-moe 1`: block 0 split, block 1's experts on the GPU).
        let all = usize::MAX;
        for (ngl, shared, cpu_moe) in [
            (LAYERS + 1, true, all),
            (LAYERS + 1, false, all),
            (1, true, all),
            (LAYERS + 1, true, 1),
        ] {
            let m = hybrid_32(&file, ngl, cpu_moe, Some(gpu()));
            multi_sequence_step_is_batch_invariant(
                &m,
                shared,
                &format!("{arch} -ngl {ngl}, shared {shared}, --n-cpu-moe {cpu_moe}"),
            );
        }
    }
    // q8_0 caches (heads of 32: whole blocks), fully offloaded and split.
    let file = open(&Spec {
        head_dim: 32,
        ..Spec::new("llama")
    });
    let q8 = |ngl| {
        let mut cpu = CpuModel::load(&file).unwrap();
        cpu.config.kv = KvTypes::uniform(KvType::Q8_0);
        let params = PlanParams {
            n_ctx: 32,
            ..PlanParams::default()
        };
        let p = plan::plan(&file, &cpu.config, ngl, &params);
        HybridModel::new(cpu, p, (ngl > 0).then(gpu)).unwrap()
    };
    let logits = |m: &HybridModel<'_>| {
        let mut c = m.new_cache(32).unwrap();
        m.forward(&PROMPT, &mut c, Logits::Last).unwrap();
        m.forward(&[7, 8], &mut c, Logits::Last).unwrap()
    };
    let on_cpu = logits(&q8(0));
    for ngl in [LAYERS + 1, 1] {
        let m = q8(ngl);
        let what = format!("llama, q8_0 cache, -ngl {ngl}");
        // The GPU's blocks are the CPU's: the logits agree as closely as
        // with f16 caches.
        let err = rel_err(&logits(&m), &on_cpu);
        eprintln!("{what}: relative error {err:e} against the CPU");
        assert!(
            err < CPU_GPU_REL,
            "{what}: relative error {err:e} against the CPU"
        );
        multi_sequence_step_is_batch_invariant(&m, true, &what);
        // A saved slot (the GPU layers' blocks read back as they are)
        // restores to the same history.
        let mut a = m.new_cache(32).unwrap();
        m.forward(&PROMPT, &mut a, Logits::Last).unwrap();
        let saved = m.save_cache(&a).unwrap();
        let mut b = m.new_cache(32).unwrap();
        assert_eq!(m.restore_cache(&mut b, &saved).unwrap(), PROMPT.len());
        let x = m.forward(&[7], &mut a, Logits::Last).unwrap();
        let y = m.forward(&[7], &mut b, Logits::Last).unwrap();
        assert!(
            x.iter().zip(&y).all(|(p, q)| p.to_bits() == q.to_bits()),
            "{what}: a restored slot differs"
        );
    }
}

/// A slot copied into another on the device (a server lending a prompt's
/// start) continues exactly as its source: the next two steps' logits are
/// the same bits, whether the caches are slots of one set (one buffer per
/// layer: the copy goes through a scratch) or caches of their own, with
/// layers on the host, on the GPU, and in sliding-window rings (gemma3). A
/// copy of a start holds what the source cut there holds. A cache of
/// another size is refused and left empty.
#[test]
fn a_slot_copied_on_the_device_continues_as_its_source() {
    for arch in ["llama", "gemma3"] {
        let file = open(&Spec::new(arch));
        for ngl in [LAYERS + 1, 1] {
            let m = hybrid_32(&file, ngl, usize::MAX, Some(gpu()));
            for slots in [true, false] {
                let what = format!("{arch} -ngl {ngl}, slots of one set {slots}");
                let (mut a, mut b) = if slots {
                    let mut v = m.new_caches(2, 32).unwrap();
                    let b = v.pop().unwrap();
                    (v.pop().unwrap(), b)
                } else {
                    (m.new_cache(32).unwrap(), m.new_cache(32).unwrap())
                };
                m.forward(&PROMPT, &mut a, Logits::Last).unwrap();
                // The destination held a longer, other history.
                m.forward(&[9, 8, 7, 6, 5, 4, 3, 2], &mut b, Logits::Last)
                    .unwrap();
                // Asked for more than it holds: all of it.
                m.copy_cache(&a, &mut b, 99).unwrap();
                assert_eq!(b.len(), PROMPT.len(), "{what}");
                let same =
                    |x: &[f32], y: &[f32]| x.iter().zip(y).all(|(p, q)| p.to_bits() == q.to_bits());
                for t in [[7u32], [8]] {
                    let x = m.forward(&t, &mut a, Logits::Last).unwrap();
                    let y = m.forward(&t, &mut b, Logits::Last).unwrap();
                    assert!(same(&x, &y), "{what}: the copy differs from its source");
                }
                // A start of it: what the source cut to that start holds
                // (none of it where a ring lost the window before it).
                m.copy_cache(&a, &mut b, 3).unwrap();
                let mut cut = m.new_cache(32).unwrap();
                m.forward(&PROMPT, &mut cut, Logits::Last).unwrap();
                m.forward(&[7, 8], &mut cut, Logits::Last).unwrap();
                cut.truncate(3);
                assert_eq!(b.len(), cut.len(), "{what}");
                let x = m.forward(&[11, 12], &mut cut, Logits::Last).unwrap();
                let y = m.forward(&[11, 12], &mut b, Logits::Last).unwrap();
                assert!(same(&x, &y), "{what}: a copied start differs");
            }
            let a = m.new_cache(32).unwrap();
            let mut small = m.new_cache(16).unwrap();
            m.forward(&[1, 2], &mut small, Logits::Last).unwrap();
            assert!(
                m.copy_cache(&a, &mut small, 0).is_err(),
                "{arch}: another size"
            );
            assert_eq!(small.len(), 0);
        }
    }
}

/// Steps of changing shape share one set of scratch buffers. A server's
/// steps change shape all the time (a prompt chunk joins the decodes, a
/// sequence ends), and scratch made anew for each shape bound new buffers
/// in every dispatch: going back to a shape seen two steps before makes no
/// new bind group.
#[test]
fn steps_of_changing_shape_keep_their_scratch_buffers() {
    let file = open(&Spec::new("llama"));
    // A device of its own: its counters see only this test's steps.
    let g = Arc::new(Gpu::new(GpuOptions::default()).unwrap());
    let m = hybrid_32(&file, LAYERS + 1, usize::MAX, Some(g.clone()));
    let mut v = m.new_caches(2, 32).unwrap();
    let mut b = v.pop().unwrap();
    let mut a = v.pop().unwrap();
    m.forward_multi(&mut [(&PROMPT[..], &mut a), (&[1, 2, 3][..], &mut b)])
        .unwrap();
    let decode = |a: &mut _, b: &mut _, t: u32| {
        m.forward_multi(&mut [(&[t][..], a), (&[t + 1][..], b)])
            .unwrap()
    };
    let first = decode(&mut a, &mut b, 7);
    // A larger step, then a smaller one alone.
    m.forward(&[9, 10, 11, 12, 13, 14, 15, 16, 17], &mut a, Logits::Last)
        .unwrap();
    m.forward(&[18], &mut b, Logits::Last).unwrap();
    let made = g.host_counters().bind_groups_made;
    let again = decode(&mut a, &mut b, 20);
    assert_eq!(
        g.host_counters().bind_groups_made,
        made,
        "a decode step of a shape seen before made new bind groups"
    );
    // Views of larger buffers give what exact ones gave: the logits are
    // finite and differ from the first decode's (other inputs).
    assert!(again.iter().flatten().all(|x| x.is_finite()));
    assert_ne!(first, again);
}

/// Three sequences stepped alone and in one `forward_multi` step get the
/// same bits, and their caches the same history.
fn multi_sequence_step_is_batch_invariant(m: &HybridModel<'_>, shared: bool, what: &str) {
    let new = || m.new_cache(32).unwrap();
    let (mut a1, mut b1, mut c1) = (new(), new(), new());
    let (mut a2, mut b2, mut c2) = if shared {
        let mut v = m.new_caches(3, 32).unwrap();
        let c = v.pop().unwrap();
        let b = v.pop().unwrap();
        (v.pop().unwrap(), b, c)
    } else {
        let mut v = m.new_caches(2, 32).unwrap();
        let c = v.pop().unwrap();
        (v.pop().unwrap(), new(), c)
    };
    m.forward(&PROMPT, &mut a1, Logits::Last).unwrap();
    m.forward(&PROMPT, &mut a2, Logits::Last).unwrap();
    m.forward(&[1, 2, 3], &mut b1, Logits::Last).unwrap();
    m.forward(&[1, 2, 3], &mut b2, Logits::Last).unwrap();
    let steps: [&[u32]; 3] = [&[40], &[41, 42], &[9, 8, 7, 6]];
    let alone = [
        m.forward(steps[0], &mut a1, Logits::Last).unwrap(),
        m.forward(steps[1], &mut b1, Logits::Last).unwrap(),
        m.forward(steps[2], &mut c1, Logits::Last).unwrap(),
    ];
    let together = m
        .forward_multi(&mut [
            (steps[0], &mut a2),
            (steps[1], &mut b2),
            (steps[2], &mut c2),
        ])
        .unwrap();
    assert_eq!(together.len(), 3);
    for (i, (x, y)) in alone.iter().zip(&together).enumerate() {
        assert_eq!(x.len(), y.len());
        let same = x.iter().zip(y).all(|(p, q)| p.to_bits() == q.to_bits());
        assert!(same, "{what}: sequence {i} differs when batched");
    }
    assert_eq!((a2.len(), b2.len(), c2.len()), (6, 5, 4));
    // The caches hold the same history: one more decode step agrees.
    let next1 = m.forward(&[5], &mut c1, Logits::Last).unwrap();
    let next2 = m.forward(&[5], &mut c2, Logits::Last).unwrap();
    assert!(
        next1
            .iter()
            .zip(&next2)
            .all(|(p, q)| p.to_bits() == q.to_bits()),
        "{what}: the next step differs"
    );
}

/// Llama 3.x's per-pair RoPE divisors (`rope_freqs.weight`) and linear
/// `rope.scaling`: divisors of 1 and a factor of 1 change no bit; others
/// change the logits, on the CPU and the GPU alike (which agree); YaRN
/// and a misshapen `rope_freqs` are refused by name.
#[test]
fn rope_frequency_factors_and_linear_scaling_turn_the_angles() {
    let logits = |spec: &Spec| cpu_logits(&CpuModel::load(&open(spec)).unwrap());
    let plain = logits(&Spec::new("llama"));
    let with = |rope_freqs, rope_scaling| Spec {
        rope_freqs,
        rope_scaling,
        ..Spec::new("llama")
    };
    assert_eq!(logits(&with(Some(0.0), None)), plain, "divisors of 1");
    assert_eq!(
        logits(&with(None, Some(("linear", 1.0)))),
        plain,
        "a factor of 1"
    );
    assert_eq!(logits(&with(None, Some(("none", 4.0)))), plain, "type none");
    // Each scaling moves the logits, and CPU and GPU agree on them.
    for spec in [
        with(Some(0.5), None),
        with(None, Some(("linear", 4.0))),
        with(None, Some(("yarn", 4.0))),
    ] {
        let got = logits(&spec);
        let diff = got
            .iter()
            .zip(&plain)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        assert!(
            diff > 1e-3,
            "{:?} {:?}: logits moved {diff}",
            spec.rope_freqs,
            spec.rope_scaling
        );
        cpu_and_gpu_agree(spec);
    }
    // YaRN beside Gemma 3's sliding windows (unscaled layers in llama.cpp)
    // is refused.
    let e = load_err(Spec {
        rope_scaling: Some(("yarn", 4.0)),
        ..Spec::new("gemma3")
    });
    assert!(e.contains("YaRN"), "{e}");
    let e = load_err(with(None, Some(("rope-ish", 4.0))));
    assert!(e.contains("RoPE scaling `rope-ish`"), "{e}");
    let bad = Spec {
        bad_shape: Some("rope_freqs.weight"),
        ..with(Some(0.5), None)
    };
    let e = load_err(bad);
    assert!(e.contains("rope_freqs"), "{e}");
}

/// Every architecture's logits and block dispatches, bit for bit as the
/// build before the block program (`tests/reference/bits/synthetic.txt`):
/// a prompt as one batch, two decode steps, and a step of two sequences,
/// with every layer on the CPU, split, and all on the GPU; the cache in
/// each type the GPU stores.
#[test]
fn every_architecture_keeps_its_bits() {
    let mut specs: Vec<(String, Spec, KvType, usize)> = Vec::new();
    // Architectures with recurrent blocks came after the fixture and have
    // their own tests (recurrent_state.rs, hybrid.rs).
    for r in ARCHS.iter().filter(|r| r.recurrent.is_none()) {
        specs.push((r.name.into(), Spec::new(r.name), KvType::F16, usize::MAX));
    }
    let variants = [
        // q8_0 blocks are 32 values: heads of 32.
        (
            "llama-q8cache",
            Spec {
                head_dim: 32,
                ..Spec::new("llama")
            },
            KvType::Q8_0,
        ),
        ("llama-f32cache", Spec::new("llama"), KvType::F32),
        (
            "llama-gate-q8",
            Spec {
                gate_q8: true,
                ..Spec::new("llama")
            },
            KvType::F16,
        ),
        (
            "llama-rope-freqs",
            Spec {
                rope_freqs: Some(0.5),
                ..Spec::new("llama")
            },
            KvType::F16,
        ),
        (
            "qwen3-wide-head",
            Spec {
                head_dim: 32,
                ..Spec::new("qwen3")
            },
            KvType::F16,
        ),
        (
            "phi3-unfused",
            Spec {
                unfused_qkv: true,
                ..Spec::new("phi3")
            },
            KvType::F16,
        ),
        (
            "phi3-long-rope",
            Spec {
                long_rope: true,
                ..Spec::new("phi3")
            },
            KvType::F16,
        ),
    ];
    for (name, spec, kv) in variants {
        specs.push((name.into(), spec, kv, usize::MAX));
    }
    for arch in ["qwen3moe", "qwen2moe"] {
        specs.push((
            format!("{arch}-gpu-experts"),
            Spec::new(arch),
            KvType::F16,
            0,
        ));
    }
    let mut lines = Vec::new();
    for (name, spec, kv, cpu_moe) in &specs {
        let file = open(spec);
        for ngl in [0, LAYERS, LAYERS + 1] {
            let mut cpu = CpuModel::load(&file).unwrap();
            cpu.config.kv = KvTypes::uniform(*kv);
            let params = PlanParams {
                n_ctx: 32,
                cpu_moe: *cpu_moe,
                ..PlanParams::default()
            };
            let p = plan::plan(&file, &cpu.config, ngl, &params);
            let m = HybridModel::new(cpu, p, (ngl > 0).then(gpu)).unwrap();
            let out = common::fixed_run(&m, &PROMPT, &[7, 8], 3, 32);
            let d = (ngl > 0).then(|| m.block_dispatches());
            lines.push(common::bits_line(&format!("{name} -ngl {ngl}"), &out, d));
        }
    }
    common::check_bits("synthetic.txt", &lines);
}
