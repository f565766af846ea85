//! Shared by the model tests: the real models and the exact reference.
#![allow(clippy::unwrap_used, dead_code)]

use std::path::PathBuf;

use serde_json::Value;

pub fn model_path(name: &str) -> PathBuf {
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

pub fn reference(name: &str) -> Value {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/reference/exact")
        .join(name);
    serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap()
}

pub fn log_softmax(logits: &[f32]) -> Vec<f64> {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let lse = max
        + logits
            .iter()
            .map(|&l| (l as f64 - max).exp())
            .sum::<f64>()
            .ln();
    logits.iter().map(|&l| l as f64 - lse).collect()
}

/// One teacher-forced case of the exact reference.
pub struct Case {
    pub prompt: String,
    pub prompt_ids: Vec<u32>,
    /// prompt + forced tokens but the last: the model's input.
    pub input: Vec<u32>,
    /// Per step, the exact top-20 `(id, log-prob)`.
    pub top: Vec<Vec<(usize, f64)>>,
}

pub fn cases(reference_file: &str) -> Vec<Case> {
    let r = reference(reference_file);
    r["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|case| {
            let ids = |k: &str| -> Vec<u32> {
                case[k]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|v| v.as_u64().unwrap() as u32)
                    .collect()
            };
            let prompt_ids = ids("prompt_ids");
            let forced = ids("forced_tokens");
            let mut input = prompt_ids.clone();
            input.extend_from_slice(&forced[..forced.len() - 1]);
            let top = case["steps"]
                .as_array()
                .unwrap()
                .iter()
                .map(|s| {
                    s["top"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|p| (p[0].as_u64().unwrap() as usize, p[1].as_f64().unwrap()))
                        .collect()
                })
                .collect();
            Case {
                prompt: case["prompt"].as_str().unwrap().to_owned(),
                prompt_ids,
                input,
                top,
            }
        })
        .collect()
}

/// The largest |Δ log-prob| over every listed token of every step, and how
/// many steps' argmax equals the exact one. `logits` holds one row per step.
pub fn compare(case: &Case, logits: &[f32], n_vocab: usize) -> (f64, usize) {
    let (deltas, agree) = deltas(case, logits, n_vocab);
    (deltas.into_iter().fold(0.0, f64::max), agree)
}

/// Every |Δ log-prob| of the exact top tokens at every step, and the steps
/// whose argmax agrees with the exact one.
pub fn deltas(case: &Case, logits: &[f32], n_vocab: usize) -> (Vec<f64>, usize) {
    assert_eq!(logits.len(), case.top.len() * n_vocab, "{:?}", case.prompt);
    let mut all = Vec::new();
    let mut agree = 0;
    for (top, row) in case.top.iter().zip(logits.chunks(n_vocab)) {
        let lp = log_softmax(row);
        for &(id, want) in top {
            all.push((lp[id] - want).abs());
        }
        let ours = row
            .iter()
            .enumerate()
            .max_by(|a, b| a.1.total_cmp(b.1))
            .unwrap()
            .0;
        agree += usize::from(ours == top[0].0);
    }
    (all, agree)
}
