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

/// A llama-shaped model.
#[derive(Clone, Copy, Debug)]
pub struct Shape {
    pub name: &'static str,
    pub layers: u32,
    pub embd: u64,
    pub ff: u64,
    pub heads: u32,
    pub kv_heads: u32,
    pub head_dim: u64,
}

/// SmolLM2-135M's shape; Llama 3.2 1B's; Llama 3.1 8B's.
pub const SHAPES: [Shape; 3] = [
    Shape {
        name: "smollm2",
        layers: 30,
        embd: 576,
        ff: 1536,
        heads: 9,
        kv_heads: 3,
        head_dim: 64,
    },
    Shape {
        name: "1b",
        layers: 16,
        embd: 2048,
        ff: 8192,
        heads: 32,
        kv_heads: 8,
        head_dim: 64,
    },
    Shape {
        name: "8b",
        layers: 32,
        embd: 4096,
        ff: 14336,
        heads: 32,
        kv_heads: 8,
        head_dim: 128,
    },
];

/// The weight types `synth` writes: the common ones, then IQ grids for
/// `--tensor-type` (their f16 d is the only field random bytes could break),
/// and Q8_1, ggml's activation type, which no GPU kernel reads (a type gap
/// for the placement tests).
pub const TYPES: [GgmlType; 21] = [
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

struct Rng(u64);

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
fn random_weights(rng: &mut Rng, ty: GgmlType, n: u64, k: u64, buf: &mut Vec<u8>) {
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
    for (what, k) in [
        ("embedding length", shape.embd),
        ("feed-forward length", shape.ff),
    ] {
        if k % ty.block_size() != 0 {
            bail!(
                "{} rows of {k} weights ({what} of {}) are not whole {ty} blocks of {}",
                ty,
                shape.name,
                ty.block_size()
            );
        }
    }
    let mut w = Writer::new()
        .kv("general.architecture", Value::String("llama".into()))
        .kv(
            "general.name",
            Value::String(format!(
                "synthetic llama {} {ty} (random weights)",
                shape.name
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
        ("rope.dimension_count", Value::U32(hd as u32)),
        ("context_length", Value::U32(8192)),
        ("vocab_size", Value::U32(vocab as u32)),
        ("rope.freq_base", Value::F32(500000.0)),
        ("attention.layer_norm_rms_epsilon", Value::F32(1e-5)),
    ] {
        w = w.kv(format!("llama.{k}"), v);
    }
    // (name, [k, rows], type): GGUF dims are innermost first.
    let mut tensors: Vec<(String, [u64; 2], GgmlType)> =
        vec![("token_embd.weight".into(), [e, vocab], ty)];
    for il in 0..shape.layers {
        let n = |s: &str| format!("blk.{il}.{s}.weight");
        tensors.push((n("attn_norm"), [e, 1], GgmlType::F32));
        tensors.push((n("attn_q"), [e, qd], ty));
        tensors.push((n("attn_k"), [e, kvd], ty));
        tensors.push((n("attn_v"), [e, kvd], ty));
        tensors.push((n("attn_output"), [qd, e], ty));
        tensors.push((n("ffn_norm"), [e, 1], GgmlType::F32));
        tensors.push((n("ffn_gate"), [e, ff], ty));
        tensors.push((n("ffn_up"), [e, ff], ty));
        tensors.push((n("ffn_down"), [ff, e], ty));
    }
    tensors.push(("output_norm.weight".into(), [e, 1], GgmlType::F32));
    tensors.push(("output.weight".into(), [e, vocab], ty));
    for (name, _, t) in &mut tensors {
        if *t == GgmlType::F32 {
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
    for (name, [k, rows], t) in &tensors {
        let bytes = t
            .bytes_for(k * rows)
            .with_context(|| format!("{name}: {k}×{rows} is not whole {t} blocks"))?;
        total += bytes;
        let dims: Vec<u64> = if *rows == 1 {
            vec![*k]
        } else {
            vec![*k, *rows]
        };
        w = w.tensor_deferred(name.clone(), &dims, *t, bytes);
    }
    let file = std::fs::File::create(a.output)
        .with_context(|| format!("creating {}", a.output.display()))?;
    let mut out = BufWriter::with_capacity(1 << 22, file);
    let mut rng = Rng(a.seed | 1);
    w.write_with(&mut out, |i, t, buf| {
        let [k, rows] = tensors[i].1;
        if rows == 1 {
            // Norm weights near 1.
            for _ in 0..k {
                buf.extend_from_slice(&(1.0 + 0.1 * rng.signed()).to_le_bytes());
            }
        } else {
            random_weights(&mut rng, t.ty, k * rows, k, buf);
        }
    })
    .with_context(|| format!("writing {}", a.output.display()))?;
    out.flush()?;
    println!(
        "wrote {}: llama {} ({} layers, {e} wide, {ty}), {:.2} GiB of weights, vocabulary {vocab}",
        a.output.display(),
        shape.name,
        shape.layers,
        total as f64 / (1u64 << 30) as f64
    );
    Ok(())
}
