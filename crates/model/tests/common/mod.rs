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

/// FNV-1a over the bits of `values`: a fingerprint that any changed bit
/// changes, short enough to commit per case.
pub fn fingerprint(values: &[f32]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for v in values {
        for b in v.to_bits().to_le_bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    h
}

/// A case's logits and the block dispatches its GPU part recorded, as
/// one line of a bits file.
pub fn bits_line(case: &str, logits: &[f32], dispatches: Option<u64>) -> String {
    let d = dispatches.map_or("-".to_string(), |d| d.to_string());
    format!("{case} {} {:016x} {d}", logits.len(), fingerprint(logits))
}

/// Checks `lines` against `tests/reference/bits/<name>` (the logits of
/// the build before a refactor, see that folder's README); with
/// `LAMINA_BLESS=1` writes them there instead.
pub fn check_bits(name: &str, lines: &[String]) {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/reference/bits")
        .join(name);
    let got = lines.join("\n") + "\n";
    if std::env::var_os("LAMINA_BLESS").is_some() {
        std::fs::write(&p, got).unwrap();
        return;
    }
    let want = std::fs::read_to_string(&p).unwrap();
    // Keyed by case (the text before the count), so the order of the
    // cases may change.
    let key = |l: &str| l.rsplitn(4, ' ').nth(3).unwrap_or(l).to_string();
    let want: std::collections::BTreeMap<String, &str> =
        want.lines().map(|l| (key(l), l)).collect();
    let mut differ: Vec<String> = lines
        .iter()
        .filter(|g| want.get(&key(g)) != Some(&g.as_str()))
        .map(|g| {
            format!(
                "  got  {g}\n  want {}",
                want.get(&key(g)).unwrap_or(&"(none)")
            )
        })
        .collect();
    let got: std::collections::BTreeSet<String> = lines.iter().map(|l| key(l)).collect();
    differ.extend(
        want.keys()
            .filter(|k| !got.contains(*k))
            .map(|k| format!("  missing {k}")),
    );
    assert!(
        differ.is_empty(),
        "logits or dispatch counts differ from {}:\n{}",
        p.display(),
        differ.join("\n")
    );
}

/// The fixed run a bits line fingerprints: `prompt` as one batch (every
/// position's logits), `decode` one token at a time, then a step of two
/// sequences (the prompt cut at `split`, each part from an empty cache).
pub fn fixed_run(
    m: &lamina_model::HybridModel<'_>,
    prompt: &[u32],
    decode: &[u32],
    split: usize,
    n_ctx: usize,
) -> Vec<f32> {
    use lamina_model::{HybridCache, Logits};
    let mut cache = m.new_cache(n_ctx).unwrap();
    let mut out = m.forward(prompt, &mut cache, Logits::From(0)).unwrap();
    for &t in decode {
        out.extend(m.forward(&[t], &mut cache, Logits::Last).unwrap());
    }
    let mut caches = m.new_caches(2, n_ctx).unwrap();
    let (a, b) = caches.split_at_mut(1);
    let mut work: Vec<(&[u32], &mut HybridCache)> =
        vec![(&prompt[..split], &mut a[0]), (&prompt[split..], &mut b[0])];
    for l in m.forward_multi(&mut work).unwrap() {
        out.extend(l);
    }
    out
}
