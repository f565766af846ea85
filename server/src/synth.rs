//! `lamina synth`: a llama-architecture GGUF of a realistic shape with random
//! quantized weights, for measuring speed, memory and placement where
//! bandwidth rather than dispatch count dominates (1B, 8B), and for machines
//! that can run the binary but cannot receive a large model file.
//!
//! The weights are random bytes with every block's f16 scales overwritten by
//! a small value (so no block decodes to NaN or infinity and activations stay
//! in range through the layers); the text such a model writes is noise, its
//! speed is the real model's. Tensors are generated while the file is written
//! (a few MiB of memory whatever the size). `--vocab-from` copies a real
//! file's tokenizer so `run` and `serve` work on the result.

use std::io::{BufWriter, Write};
use std::path::Path;

use anyhow::{bail, Context};
use lamina_gguf::{GgmlType, LoadMode, Model, Value, Writer};

/// A model's shape: llama's, or a mixture of experts' (qwen2moe with a
/// shared expert, qwen3moe).
#[derive(Clone, Copy, Debug)]
pub struct Shape {
    pub name: &'static str,
    pub arch: &'static str,
    pub layers: u32,
    pub embd: u64,
    pub ff: u64,
    pub heads: u32,
    pub kv_heads: u32,
    pub head_dim: u64,
    pub experts: Option<Experts>,
    /// Llama 3.x RoPE scaling factor the real model carries (its
    /// `rope_freqs.weight`), if any.
    pub llama3_rope: Option<f32>,
    /// A hybrid's Gated DeltaNet blocks (qwen35, qwen35moe).
    pub hybrid: Option<Hybrid>,
}

/// A Qwen hybrid's recurrent blocks: three Gated DeltaNet blocks to each
/// gated attention block, `k_heads` key heads and `v_heads` value heads
/// of `head` dims, and the attention's partial RoPE.
#[derive(Clone, Copy, Debug)]
pub struct Hybrid {
    pub k_heads: u32,
    pub v_heads: u32,
    pub head: u64,
    pub rope_dim: u32,
}

/// The convolution's kernel and the attention interval of every released
/// Qwen hybrid.
const CONV_KERNEL: u64 = 4;
const ATTN_INTERVAL: u32 = 4;

/// A mixture of experts' counts and widths.
#[derive(Clone, Copy, Debug)]
pub struct Experts {
    pub count: u32,
    pub used: u32,
    pub ff: u64,
    /// The shared expert's width (qwen2moe).
    pub shared_ff: Option<u64>,
}

const fn llama(
    name: &'static str,
    layers: u32,
    embd: u64,
    ff: u64,
    heads: u32,
    kv: u32,
    hd: u64,
) -> Shape {
    Shape {
        name,
        arch: "llama",
        layers,
        embd,
        ff,
        heads,
        kv_heads: kv,
        head_dim: hd,
        experts: None,
        llama3_rope: None,
        hybrid: None,
    }
}

/// SmolLM2-135M's shape; Llama 3.2 1B's; Llama 3.1 8B's; small mixtures of
/// experts in Qwen3-30B-A3B's proportions (128 experts, 8 used, experts a
/// quarter as wide as the model's dense width) and Qwen1.5-MoE-A2.7B's (60
/// experts, 4 used, a shared expert), for the tests, at a width where they
/// run in seconds; a small phi3 (fused QKV and gate/up); a small qwen3moe (0.4 B expert weights, 4 of 32 experts
/// a token) for speed beside llama.cpp; Qwen3-30B-A3B's own shape; and
/// the 2026 Qwen hybrids' shapes (Qwen3.5-0.8B, Qwen3.6-27B and
/// Qwen3.6-35B-A3B: Gated DeltaNet blocks, heads of 256 in the gated
/// attention blocks, a quarter of each head rotated) and a small one.
pub const SHAPES: [Shape; 12] = [
    llama("smollm2", 30, 576, 1536, 9, 3, 64),
    Shape {
        llama3_rope: Some(32.0),
        ..llama("1b", 16, 2048, 8192, 32, 8, 64)
    },
    Shape {
        llama3_rope: Some(8.0),
        ..llama("8b", 32, 4096, 14336, 32, 8, 128)
    },
    Shape {
        name: "qwen3moe-tiny",
        arch: "qwen3moe",
        experts: Some(Experts {
            count: 16,
            used: 4,
            ff: 128,
            shared_ff: None,
        }),
        ..llama("", 4, 256, 512, 4, 2, 64)
    },
    Shape {
        name: "qwen2moe-tiny",
        arch: "qwen2moe",
        experts: Some(Experts {
            count: 12,
            used: 4,
            ff: 128,
            shared_ff: Some(512),
        }),
        ..llama("", 4, 256, 512, 4, 2, 64)
    },
    Shape {
        name: "phi3-tiny",
        arch: "phi3",
        ..llama("", 4, 256, 512, 4, 4, 64)
    },
    Shape {
        name: "qwen3moe-small",
        arch: "qwen3moe",
        experts: Some(Experts {
            count: 32,
            used: 4,
            ff: 512,
            shared_ff: None,
        }),
        ..llama("", 8, 1024, 2048, 16, 4, 64)
    },
    Shape {
        name: "30b-a3b",
        arch: "qwen3moe",
        experts: Some(Experts {
            count: 128,
            used: 8,
            ff: 768,
            shared_ff: None,
        }),
        ..llama("", 48, 2048, 6144, 32, 4, 128)
    },
    Shape {
        name: "qwen35-tiny",
        arch: "qwen35",
        hybrid: Some(Hybrid {
            k_heads: 2,
            v_heads: 4,
            head: 64,
            rope_dim: 16,
        }),
        ..llama("", 8, 256, 512, 4, 2, 64)
    },
    Shape {
        name: "qwen35-0.8b",
        arch: "qwen35",
        hybrid: Some(Hybrid {
            k_heads: 16,
            v_heads: 16,
            head: 128,
            rope_dim: 64,
        }),
        ..llama("", 24, 1024, 3584, 8, 2, 256)
    },
    Shape {
        name: "qwen36-27b",
        arch: "qwen35",
        hybrid: Some(Hybrid {
            k_heads: 16,
            v_heads: 48,
            head: 128,
            rope_dim: 64,
        }),
        ..llama("", 64, 5120, 17408, 24, 4, 256)
    },
    Shape {
        name: "qwen36-35b-a3b",
        arch: "qwen35moe",
        experts: Some(Experts {
            count: 256,
            used: 8,
            ff: 512,
            shared_ff: Some(512),
        }),
        hybrid: Some(Hybrid {
            k_heads: 16,
            v_heads: 32,
            head: 128,
            rope_dim: 64,
        }),
        ..llama("", 40, 2048, 512, 16, 2, 256)
    },
];

/// The weight types `synth` writes: F32 (no rounding anywhere, for exact
/// comparisons with llama.cpp, which rounds activations to 8 bits for
/// quantized weights), the common ones, then IQ grids for
/// `--tensor-type` (their f16 d is the only field random bytes could break),
/// and Q8_1, ggml's activation type, which no GPU kernel reads (a type gap
/// for the placement tests).
pub const TYPES: [GgmlType; 22] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q2K,
    GgmlType::Q3K,
    GgmlType::Q4K,
    GgmlType::Q5K,
    GgmlType::Q6K,
    GgmlType::IQ4NL,
    GgmlType::IQ4XS,
    GgmlType::IQ2XXS,
    GgmlType::IQ2XS,
    GgmlType::IQ3XXS,
    GgmlType::IQ3S,
    GgmlType::IQ2S,
    GgmlType::IQ1S,
    GgmlType::IQ1M,
    GgmlType::Q8_1,
];

fn parse_type(name: &str) -> anyhow::Result<GgmlType> {
    TYPES
        .iter()
        .copied()
        .find(|t| t.name().eq_ignore_ascii_case(name))
        .with_context(|| {
            let names: Vec<_> = TYPES.iter().map(|t| t.name()).collect();
            format!("unknown type {name:?} (one of {})", names.join(", "))
        })
}

/// `--tensor-type PATTERN=TYPE`, as llama-quantize spells it: tensors whose
/// name contains PATTERN get TYPE instead of --type.
fn parse_overrides(specs: &[String]) -> anyhow::Result<Vec<(String, GgmlType)>> {
    specs
        .iter()
        .map(|spec| {
            let (pat, ty) = spec
                .split_once('=')
                .with_context(|| format!("--tensor-type {spec:?}: expected PATTERN=TYPE"))?;
            if pat.is_empty() {
                bail!("--tensor-type {spec:?}: the pattern is empty");
            }
            Ok((pat.to_owned(), parse_type(ty)?))
        })
        .collect()
}

pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    fn next(&mut self) -> u64 {
        // xorshift64*: fast, and the values do not matter beyond variety.
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn fill(&mut self, buf: &mut [u8]) {
        for chunk in buf.chunks_mut(8) {
            let v = self.next().to_le_bytes();
            chunk.copy_from_slice(&v[..chunk.len()]);
        }
    }

    /// Uniform in [-1, 1).
    fn signed(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
}

/// `n` weights of `ty` whose rows have `k` weights: random blocks with sane
/// scales (weights of magnitude about 1/sqrt(k)), appended to `buf`.
pub(crate) fn random_weights(rng: &mut Rng, ty: GgmlType, n: u64, k: u64, buf: &mut Vec<u8>) {
    let scale = 0.25 / (k as f32).sqrt();
    let start = buf.len();
    match ty {
        GgmlType::F32 => {
            for _ in 0..n {
                buf.extend_from_slice(&(rng.signed() * 4.0 * scale).to_le_bytes());
            }
        }
        GgmlType::F16 => {
            for _ in 0..n {
                let v = half::f16::from_f32(rng.signed() * 4.0 * scale);
                buf.extend_from_slice(&v.to_le_bytes());
            }
        }
        _ => {
            let bytes = ty.bytes_for(n).unwrap_or(0) as usize;
            buf.resize(start + bytes, 0);
            rng.fill(&mut buf[start..]);
            let ts = ty.type_size() as usize;
            for block in buf[start..].chunks_mut(ts) {
                for &at in ty.f16_scale_offsets() {
                    let d = half::f16::from_f32(scale * (0.5 + 0.5 * rng.signed().abs()));
                    block[at..at + 2].copy_from_slice(&d.to_le_bytes());
                }
                if ty == GgmlType::IQ1M {
                    // IQ1_M's f16 d is the top nibbles of its four scale
                    // words (bytes 48..56), nibble j of d in word j.
                    let d = half::f16::from_f32(scale * (0.5 + 0.5 * rng.signed().abs()));
                    for j in 0..4 {
                        let nib = ((d.to_bits() >> (4 * j)) & 0xf) as u8;
                        block[49 + 2 * j] = (block[49 + 2 * j] & 0x0f) | (nib << 4);
                    }
                }
            }
        }
    }
}

pub struct SynthArgs<'a> {
    pub shape: &'a str,
    pub ty: &'a str,
    pub vocab_from: Option<&'a Path>,
    pub vocab: u64,
    pub output: &'a Path,
    pub seed: u64,
    /// `PATTERN=TYPE`: tensors whose name contains PATTERN get TYPE.
    pub tensor_types: &'a [String],
    /// Only the metadata (with --vocab-from: the tokenizer), no tensors: a
    /// small file to carry where a real model cannot go.
    pub vocab_only: bool,
    /// Llama 3.x RoPE scaling factor (`rope_freqs.weight`); `None`: the
    /// shape's own, 0: none.
    pub llama3_rope: Option<f32>,
    /// phi3: LongRoPE's long and short factor sets.
    pub long_rope: bool,
    /// YaRN scaling with this factor.
    pub yarn: Option<f32>,
}

/// The trained context a `--long-rope` file declares (of its 8192).
const LONG_ROPE_ORIG_CTX: u32 = 512;

/// Llama 3.x's RoPE frequency divisors for `factor`, as llama.cpp's
/// converter computes them (low and high frequency factors 1 and 4 over
/// 8192 original positions): high frequencies keep theirs, low ones are
/// divided by `factor`, those between blend smoothly.
pub fn llama3_rope_factors(head_dim: u64, base: f32, factor: f32) -> Vec<f32> {
    let (low, high, old_ctx) = (1.0f64, 4.0f64, 8192.0f64);
    let (low_wavelen, high_wavelen) = (old_ctx / low, old_ctx / high);
    (0..head_dim / 2)
        .map(|i| {
            let freq = 1.0 / f64::from(base).powf(2.0 * i as f64 / head_dim as f64);
            let wavelen = 2.0 * std::f64::consts::PI / freq;
            let f = f64::from(factor);
            let r = if wavelen < high_wavelen {
                1.0
            } else if wavelen > low_wavelen {
                f
            } else {
                let smooth = (old_ctx / wavelen - low) / (high - low);
                1.0 / ((1.0 - smooth) / f + smooth)
            };
            r as f32
        })
        .collect()
}

pub fn run(a: SynthArgs<'_>) -> anyhow::Result<()> {
    let shape = SHAPES.iter().find(|s| s.name == a.shape).with_context(|| {
        let names: Vec<_> = SHAPES.iter().map(|s| s.name).collect();
        format!("unknown shape {:?} (one of {})", a.shape, names.join(", "))
    })?;
    let ty = parse_type(a.ty)?;
    let overrides = parse_overrides(a.tensor_types)?;
    // An override's rows are checked tensor by tensor below: IQ types of
    // 256-weight blocks fit SmolLM2's ffn_down (1536 wide) but not its
    // 576-wide matrices.
    let widths = [
        ("embedding length", shape.embd),
        ("feed-forward length", shape.ff),
        ("expert width", shape.experts.map_or(shape.ff, |x| x.ff)),
    ];
    for (what, k) in widths {
        if k % ty.block_size() != 0 {
            bail!(
                "{} rows of {k} weights ({what} of {}) are not whole {ty} blocks of {}",
                ty,
                shape.name,
                ty.block_size()
            );
        }
    }
    let arch = shape.arch;
    let mut w = Writer::new()
        .kv("general.architecture", Value::String(arch.into()))
        // No architecture or shape in the name: llama.cpp's vocabulary
        // loader changes token attributes for names containing "phi3"
        // (and then needs Phi-3's own special tokens).
        .kv(
            "general.name",
            Value::String(format!(
                "synthetic {}-layer {}-wide {ty} model (random weights)",
                shape.layers, shape.embd
            )),
        );
    // The tokenizer of a real file, and its vocabulary size.
    let mut vocab = a.vocab;
    if let Some(path) = a.vocab_from {
        let src = Model::open(path, LoadMode::Mmap)
            .with_context(|| format!("reading {}", path.display()))?;
        let mut found = false;
        for e in &src.shards()[0].layout().metadata {
            if e.key.starts_with("tokenizer.") {
                if e.key == "tokenizer.ggml.tokens" {
                    if let Value::Array(arr) = &e.value {
                        vocab = arr.len() as u64;
                        found = true;
                    }
                }
                w = w.kv(e.key.clone(), e.value.clone());
            }
        }
        if !found {
            bail!("{} has no tokenizer.ggml.tokens", path.display());
        }
    }
    if a.vocab_only {
        std::fs::write(a.output, w.to_bytes())
            .with_context(|| format!("writing {}", a.output.display()))?;
        println!("wrote {}: metadata only", a.output.display());
        return Ok(());
    }
    let (e, ff, hd) = (shape.embd, shape.ff, shape.head_dim);
    let (qd, kvd) = (u64::from(shape.heads) * hd, u64::from(shape.kv_heads) * hd);
    for (k, v) in [
        ("block_count", Value::U32(shape.layers)),
        ("embedding_length", Value::U32(e as u32)),
        ("feed_forward_length", Value::U32(ff as u32)),
        ("attention.head_count", Value::U32(shape.heads)),
        ("attention.head_count_kv", Value::U32(shape.kv_heads)),
        (
            "rope.dimension_count",
            Value::U32(shape.hybrid.map_or(hd as u32, |h| h.rope_dim)),
        ),
        ("context_length", Value::U32(8192)),
        ("vocab_size", Value::U32(vocab as u32)),
        ("rope.freq_base", Value::F32(500000.0)),
        ("attention.layer_norm_rms_epsilon", Value::F32(1e-5)),
        ("attention.key_length", Value::U32(hd as u32)),
        ("attention.value_length", Value::U32(hd as u32)),
    ] {
        w = w.kv(format!("{arch}.{k}"), v);
    }
    if let Some(x) = shape.experts {
        w = w
            .kv(format!("{arch}.expert_count"), Value::U32(x.count))
            .kv(format!("{arch}.expert_used_count"), Value::U32(x.used))
            .kv(
                format!("{arch}.expert_feed_forward_length"),
                Value::U32(x.ff as u32),
            );
        if let Some(s) = x.shared_ff {
            w = w.kv(
                format!("{arch}.expert_shared_feed_forward_length"),
                Value::U32(s as u32),
            );
        }
    }
    if let Some(h) = shape.hybrid {
        // Sections as Qwen3.5's (11, 11, 10 of 32 pairs), scaled to the
        // rotated pairs: every pair turns with the text's one position.
        let pairs = h.rope_dim / 2;
        let (t, hh) = (pairs.div_ceil(3), pairs.div_ceil(3));
        let sections = vec![t, hh, pairs - t - hh, 0];
        for (k, v) in [
            ("ssm.conv_kernel", CONV_KERNEL as u32),
            ("ssm.state_size", h.head as u32),
            ("ssm.group_count", h.k_heads),
            ("ssm.time_step_rank", h.v_heads),
            ("ssm.inner_size", h.head as u32 * h.v_heads),
            ("full_attention_interval", ATTN_INTERVAL),
        ] {
            w = w.kv(format!("{arch}.{k}"), Value::U32(v));
        }
        w = w.kv(
            format!("{arch}.rope.dimension_sections"),
            Value::Array(lamina_gguf::Array::U32(sections)),
        );
    }
    // (name, dims, type): GGUF dims are innermost first; a 1-D F32 tensor
    // is a norm weight (or a bias).
    let mut tensors: Vec<(String, Vec<u64>, GgmlType)> =
        vec![("token_embd.weight".into(), vec![e, vocab], ty)];
    let f32v = GgmlType::F32;
    let rope_factors = match a.llama3_rope.or(shape.llama3_rope) {
        Some(f) if f != 0.0 => {
            if arch != "llama" || !(f.is_finite() && f >= 1.0) {
                bail!("--llama3-rope {f}: a factor of at least 1, for a llama shape");
            }
            tensors.push(("rope_freqs.weight".into(), vec![hd / 2], f32v));
            Some(llama3_rope_factors(hd, 500000.0, f))
        }
        _ => None,
    };
    // LongRoPE's sets: short ones near 1, long ones growing to 40 (the
    // shape of Phi-3's own), and the converter's attention factor
    // sqrt(1 + ln(scale) / ln(original context)).
    let long_rope = if a.long_rope {
        if arch != "phi3" {
            bail!("--long-rope: for a phi3 shape");
        }
        let pairs = hd / 2;
        let at = |top: f32| -> Vec<f32> {
            (0..pairs)
                .map(|i| 1.0 + (top - 1.0) * (i as f32 / pairs as f32).powi(2))
                .collect()
        };
        tensors.push(("rope_factors_long.weight".into(), vec![pairs], f32v));
        tensors.push(("rope_factors_short.weight".into(), vec![pairs], f32v));
        let scale = 8192.0f64 / f64::from(LONG_ROPE_ORIG_CTX);
        let attn = (1.0 + scale.ln() / f64::from(LONG_ROPE_ORIG_CTX).ln()).sqrt() as f32;
        w = w
            .kv(
                format!("{arch}.rope.scaling.original_context_length"),
                Value::U32(LONG_ROPE_ORIG_CTX),
            )
            .kv(format!("{arch}.rope.scaling.attn_factor"), Value::F32(attn));
        Some((at(40.0), at(1.2)))
    } else {
        None
    };
    if let Some(f) = a.yarn {
        if !(f.is_finite() && f > 1.0)
            || long_rope.is_some()
            || lamina_model::arch::find(arch).is_some_and(|r| r.swa.is_some())
        {
            bail!("--yarn {f}: a factor above 1, without --long-rope, for a shape without sliding windows");
        }
        w = w
            .kv(
                format!("{arch}.rope.scaling.type"),
                Value::String("yarn".into()),
            )
            .kv(format!("{arch}.rope.scaling.factor"), Value::F32(f))
            .kv(
                format!("{arch}.rope.scaling.original_context_length"),
                Value::U32((8192.0 / f) as u32),
            );
    }
    // The optional tensors each block of this architecture has, from the
    // table that the loader reads too.
    let row = lamina_model::arch::find(arch).with_context(|| {
        format!(
            "shape {}: architecture {arch} is not in the table",
            shape.name
        )
    })?;
    for il in 0..shape.layers {
        let n = |s: &str| format!("blk.{il}.{s}.weight");
        tensors.push((n("attn_norm"), vec![e], f32v));
        if row.fused_gate_up {
            // Q, K, V fused; gate and up fused (the gate's rows first).
            tensors.push((n("attn_qkv"), vec![e, qd + 2 * kvd], ty));
            tensors.push((n("attn_output"), vec![qd, e], ty));
            tensors.push((n("ffn_norm"), vec![e], f32v));
            tensors.push((n("ffn_up"), vec![e, 2 * ff], ty));
            tensors.push((n("ffn_down"), vec![ff, e], ty));
            continue;
        }
        match shape.hybrid {
            Some(h) if (il + 1) % ATTN_INTERVAL != 0 => {
                // A Gated DeltaNet block; its small per-head tensors stay
                // f32, as converters write them.
                let (kd, vd) = (u64::from(h.k_heads) * h.head, u64::from(h.v_heads) * h.head);
                let (conv, nv) = (2 * kd + vd, u64::from(h.v_heads));
                tensors.push((n("attn_qkv"), vec![e, conv], ty));
                tensors.push((n("attn_gate"), vec![e, vd], ty));
                tensors.push((n("ssm_conv1d"), vec![CONV_KERNEL, conv], f32v));
                tensors.push((format!("blk.{il}.ssm_dt.bias"), vec![nv], f32v));
                tensors.push((format!("blk.{il}.ssm_a"), vec![nv], f32v));
                tensors.push((n("ssm_beta"), vec![e, nv], f32v));
                tensors.push((n("ssm_alpha"), vec![e, nv], f32v));
                tensors.push((n("ssm_norm"), vec![h.head], f32v));
                tensors.push((n("ssm_out"), vec![vd, e], ty));
            }
            _ => {
                // With an output gate, Q's rows hold each head's query
                // then its gate.
                let q_rows = if row.attn_gate { 2 * qd } else { qd };
                tensors.push((n("attn_q"), vec![e, q_rows], ty));
                tensors.push((n("attn_k"), vec![e, kvd], ty));
                tensors.push((n("attn_v"), vec![e, kvd], ty));
                if row.qkv_bias {
                    for (b, d) in [("attn_q", qd), ("attn_k", kvd), ("attn_v", kvd)] {
                        tensors.push((format!("blk.{il}.{b}.bias"), vec![d], f32v));
                    }
                }
                if row.qk_norm {
                    tensors.push((n("attn_q_norm"), vec![hd], f32v));
                    tensors.push((n("attn_k_norm"), vec![hd], f32v));
                }
                tensors.push((n("attn_output"), vec![qd, e], ty));
            }
        }
        tensors.push((n(row.ffn_norm), vec![e], f32v));
        match shape.experts {
            None => {
                tensors.push((n("ffn_gate"), vec![e, ff], ty));
                tensors.push((n("ffn_up"), vec![e, ff], ty));
                tensors.push((n("ffn_down"), vec![ff, e], ty));
            }
            Some(x) => {
                let (c, xf) = (u64::from(x.count), x.ff);
                // The router stays f32, as converters write it.
                tensors.push((n("ffn_gate_inp"), vec![e, c], f32v));
                tensors.push((n("ffn_gate_exps"), vec![e, xf, c], ty));
                tensors.push((n("ffn_up_exps"), vec![e, xf, c], ty));
                tensors.push((n("ffn_down_exps"), vec![xf, e, c], ty));
                if let Some(s) = x.shared_ff {
                    tensors.push((n("ffn_gate_inp_shexp"), vec![e], f32v));
                    tensors.push((n("ffn_gate_shexp"), vec![e, s], ty));
                    tensors.push((n("ffn_up_shexp"), vec![e, s], ty));
                    tensors.push((n("ffn_down_shexp"), vec![s, e], ty));
                }
            }
        }
    }
    tensors.push(("output_norm.weight".into(), vec![e], f32v));
    tensors.push(("output.weight".into(), vec![e, vocab], ty));
    for (name, dims, t) in &mut tensors {
        if *t == GgmlType::F32 && (dims.len() == 1 || name.contains("gate_inp")) {
            continue;
        }
        if let Some((_, o)) = overrides
            .iter()
            .find(|(pat, _)| name.contains(pat.as_str()))
        {
            *t = *o;
        }
    }
    let mut total = 0u64;
    for (name, dims, t) in &tensors {
        let count: u64 = dims.iter().product();
        let bytes = t
            .bytes_for(count)
            .with_context(|| format!("{name}: {dims:?} is not whole {t} blocks"))?;
        total += bytes;
        w = w.tensor_deferred(name.clone(), dims, *t, bytes);
    }
    let file = std::fs::File::create(a.output)
        .with_context(|| format!("creating {}", a.output.display()))?;
    let mut out = BufWriter::with_capacity(1 << 22, file);
    let mut rng = Rng(a.seed | 1);
    w.write_with(&mut out, |i, t, buf| {
        let dims = &tensors[i].1;
        let (k, count) = (dims[0], dims.iter().product::<u64>());
        if tensors[i].0 == "rope_freqs.weight" {
            for f in rope_factors.iter().flatten() {
                buf.extend_from_slice(&f.to_le_bytes());
            }
        } else if tensors[i].0.starts_with("rope_factors_") {
            if let Some((long, short)) = &long_rope {
                let set = if tensors[i].0.contains("long") {
                    long
                } else {
                    short
                };
                for f in set {
                    buf.extend_from_slice(&f.to_le_bytes());
                }
            }
        } else if tensors[i].0.ends_with(".bias") {
            // Biases small, around 0.
            for _ in 0..k {
                buf.extend_from_slice(&(0.1 * rng.signed()).to_le_bytes());
            }
        } else if tensors[i].0.ends_with(".ssm_a") {
            // A decay rate, negative (the converter's −exp(A_log)).
            for _ in 0..k {
                buf.extend_from_slice(&(-0.5 - 0.5 * rng.signed().abs()).to_le_bytes());
            }
        } else if dims.len() == 1 && !tensors[i].0.contains("gate_inp") {
            // Norm weights near 1.
            for _ in 0..k {
                buf.extend_from_slice(&(1.0 + 0.1 * rng.signed()).to_le_bytes());
            }
        } else if tensors[i].0.contains("gate_inp") {
            // A router spread enough that the experts' choice is clear (and
            // a shared expert's gate around 0, neither open nor shut).
            for _ in 0..count {
                buf.extend_from_slice(&(rng.signed() * 2.0 / (k as f32).sqrt()).to_le_bytes());
            }
        } else {
            random_weights(&mut rng, t.ty, count, k, buf);
        }
    })
    .with_context(|| format!("writing {}", a.output.display()))?;
    out.flush()?;
    println!(
        "wrote {}: {arch} {} ({} layers, {e} wide, {ty}), {:.2} GiB of weights, vocabulary {vocab}",
        a.output.display(),
        shape.name,
        shape.layers,
        total as f64 / (1u64 << 30) as f64
    );
    Ok(())
}
