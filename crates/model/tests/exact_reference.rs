//! The CPU forward pass against the exact float64 log-probs of the same files
//! (`shared/reference/exact`), teacher-forced on llama.cpp's greedy tokens.
//!
//! Bound: llama.cpp without its 8-bit activation rounding lands within ~0.02
//! nats of the exact model (the reference's own check). This engine keeps
//! activations in f32 and measured a worst case of 3e-5 nats on both models
//! (f32 accumulation over 576–2048-long dot products); [`TOLERANCE`] leaves
//! 30x headroom for reduction-order changes while still catching any real
//! error (a wrong RoPE base or norm moves log-probs by tenths of a nat).
#![allow(clippy::unwrap_used)]

use std::path::PathBuf;

use lamina_gguf::{LoadMode, Model};
use lamina_model::{CpuModel, KvCache, Logits};
use serde_json::Value;

/// Nats, per log-prob of each of the top-20 exact tokens at every step.
const TOLERANCE: f64 = 1e-3;

fn model_path(name: &str) -> PathBuf {
    let dir = std::env::var_os("LAMINA_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap()).join(".cache/lamina/models")
        });
    let p = dir.join(name);
    assert!(
        p.exists(),
        "{} is missing: run scripts/fetch-models.sh",
        p.display()
    );
    p
}

fn reference(name: &str) -> Value {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/reference/exact")
        .join(name);
    serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap()
}

fn log_softmax(logits: &[f32]) -> Vec<f64> {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let lse = max
        + logits
            .iter()
            .map(|&l| (l as f64 - max).exp())
            .sum::<f64>()
            .ln();
    logits.iter().map(|&l| l as f64 - lse).collect()
}

fn check(model_file: &str, reference_file: &str) {
    let file = Model::open(model_path(model_file), LoadMode::Mmap).unwrap();
    let m = CpuModel::load(&file).unwrap();
    let r = reference(reference_file);
    let mut worst = 0.0f64;
    let mut argmax_agree = 0;
    let mut steps_total = 0;
    for case in r["cases"].as_array().unwrap() {
        let ids = |k: &str| -> Vec<u32> {
            case[k]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_u64().unwrap() as u32)
                .collect()
        };
        let prompt = ids("prompt_ids");
        let forced = ids("forced_tokens");
        let mut tokens = prompt.clone();
        tokens.extend_from_slice(&forced[..forced.len() - 1]);
        let mut cache = KvCache::new(&m.config, tokens.len());
        let logits = m
            .forward(&tokens, &mut cache, Logits::From(prompt.len() - 1))
            .unwrap();
        let steps = case["steps"].as_array().unwrap();
        assert_eq!(logits.len(), steps.len() * m.config.n_vocab);
        for (t, (step, row)) in steps
            .iter()
            .zip(logits.chunks(m.config.n_vocab))
            .enumerate()
        {
            let lp = log_softmax(row);
            for pair in step["top"].as_array().unwrap() {
                let id = pair[0].as_u64().unwrap() as usize;
                let want = pair[1].as_f64().unwrap();
                let d = (lp[id] - want).abs();
                worst = worst.max(d);
                assert!(
                    d < TOLERANCE,
                    "{model_file} {:?} step {t} token {id}: {} vs exact {want}",
                    case["prompt"],
                    lp[id]
                );
            }
            let ours = row
                .iter()
                .enumerate()
                .max_by(|a, b| a.1.total_cmp(b.1))
                .unwrap()
                .0;
            argmax_agree += usize::from(ours as u64 == step["top"][0][0].as_u64().unwrap());
            steps_total += 1;
        }
    }
    eprintln!("{model_file}: max |Δ log-prob| {worst:.5} nats; argmax agrees with exact on {argmax_agree}/{steps_total} steps");
}

#[test]
fn smollm2_matches_exact_logprobs() {
    check("SmolLM2-135M-Instruct.Q4_1.gguf", "smollm2.json");
}

#[test]
fn gemma3_matches_exact_logprobs() {
    check("gemma-3-270m-q4_k_m.gguf", "gemma3.json");
}
