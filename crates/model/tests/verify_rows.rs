//! The step that verifies drafted tokens: `forward_multi_rows` gives each
//! sequence the logits of its last `keep` tokens, and they are the bits the
//! same tokens get when decoded one at a time, for several sequences in one
//! step (runs of 1, 4 and 8 tokens beside a one-token decode), on the CPU
//! model and on the mixed model with no layer, half of them or every layer
//! on the GPU; `forward_multi_rows_argmax` picks what those logits give. A
//! bad row count is refused before anything runs.
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;

use common::model_path;
use lamina_gguf::{LoadMode, Model};
use lamina_gpu::{Gpu, GpuOptions};
use lamina_model::plan::{self, PlanParams};
use lamina_model::{CpuModel, HybridCache, HybridModel, KvCache, Logits};

const N_CTX: usize = 96;

fn prompt(seed: u32, n: u32) -> Vec<u32> {
    (0..n).map(|i| 2 + (seed + i * 7919) % 9000).collect()
}

/// The oracle: the prompt, then each token of `run` alone; the logits of
/// every token of `run`, one row after another.
fn one_at_a_time(m: &CpuModel<'_>, prompt: &[u32], run: &[u32]) -> Vec<u32> {
    let mut cache = KvCache::new(&m.config, N_CTX).unwrap();
    m.forward(prompt, &mut cache, Logits::Last).unwrap();
    let mut rows = Vec::new();
    for &t in run {
        rows.extend(m.forward(&[t], &mut cache, Logits::Last).unwrap());
    }
    rows.into_iter().map(f32::to_bits).collect()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Equal sequences of rows, or a short message naming the first that
/// differs (the rows are far too long to print).
fn same(got: &[Vec<u32>], want: &[Vec<u32>], n_vocab: usize, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: sequences");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(g.len(), w.len(), "{what}: sequence {i}'s length");
        let diff = g.iter().zip(w).position(|(a, b)| a != b);
        assert!(
            diff.is_none(),
            "{what}: sequence {i} differs first in row {} ({} values differ)",
            diff.unwrap_or(0) / n_vocab,
            g.iter().zip(w).filter(|(a, b)| a != b).count()
        );
    }
}

/// Three sequences: their prompts, then runs of these lengths.
const RUNS: [usize; 3] = [1, 4, 8];

fn sequences() -> (Vec<Vec<u32>>, Vec<Vec<u32>>) {
    let prompts = vec![prompt(1, 11), prompt(2, 5), prompt(3, 17)];
    let runs = RUNS
        .iter()
        .zip(10u32..)
        .map(|(&n, seed)| prompt(seed, n as u32))
        .collect();
    (prompts, runs)
}

fn check(model_file: &str) {
    let file = Model::open(model_path(model_file), LoadMode::Mmap).unwrap();
    let cpu = CpuModel::load(&file).unwrap();
    let n_vocab = cpu.config.n_vocab;
    let n_layer = cpu.config.n_layer;
    let (prompts, runs) = sequences();
    let want: Vec<Vec<u32>> = prompts
        .iter()
        .zip(&runs)
        .map(|(p, r)| one_at_a_time(&cpu, p, r))
        .collect();
    let picks = |rows: &[u32]| -> Vec<u32> {
        rows.chunks(n_vocab)
            .map(|r| {
                let l: Vec<f32> = r.iter().map(|&b| f32::from_bits(b)).collect();
                lamina_sampling::argmax(&l)
            })
            .collect()
    };

    // The CPU model.
    let mut caches: Vec<KvCache> = (0..3)
        .map(|_| KvCache::new(&cpu.config, N_CTX).unwrap())
        .collect();
    let mut work: Vec<(&[u32], &mut KvCache)> = prompts
        .iter()
        .map(Vec::as_slice)
        .zip(caches.iter_mut())
        .collect();
    cpu.forward_multi(&mut work).unwrap();
    let mut work: Vec<(&[u32], &mut KvCache)> = runs
        .iter()
        .map(Vec::as_slice)
        .zip(caches.iter_mut())
        .collect();
    let got = cpu.forward_multi_rows(&mut work, &RUNS).unwrap();
    let got: Vec<Vec<u32>> = got.iter().map(|g| bits(g)).collect();
    same(
        &got,
        &want,
        n_vocab,
        &format!("{model_file} on the CPU model"),
    );

    // The mixed model, with nothing, half or everything on the GPU.
    let gpu = Arc::new(Gpu::new(GpuOptions::default()).unwrap());
    for ngl in [0, n_layer / 2, n_layer + 1] {
        let params = PlanParams {
            n_ctx: N_CTX,
            n_parallel: 3,
            ..PlanParams::default()
        };
        let cpu = CpuModel::load(&file).unwrap();
        let p = plan::plan(&file, &cpu.config, ngl, &params);
        let m = HybridModel::new(cpu, p, Some(gpu.clone())).unwrap();
        // The GPU's own oracle: its bits are its own, not the CPU's.
        let want: Vec<Vec<u32>> = prompts
            .iter()
            .zip(&runs)
            .map(|(p, r)| {
                let mut cache = m.new_cache(N_CTX).unwrap();
                m.forward(p, &mut cache, Logits::Last).unwrap();
                let mut rows = Vec::new();
                for &t in r {
                    rows.extend(m.forward(&[t], &mut cache, Logits::Last).unwrap());
                }
                bits(&rows)
            })
            .collect();
        let want_picks: Vec<Vec<u32>> = want.iter().map(|w| picks(w)).collect();
        for argmax in [false, true] {
            if argmax && !m.argmax_on_gpu() {
                continue;
            }
            let mut caches: Vec<HybridCache> = m.new_caches(3, N_CTX).unwrap();
            let mut work: Vec<(&[u32], &mut HybridCache)> = prompts
                .iter()
                .map(Vec::as_slice)
                .zip(caches.iter_mut())
                .collect();
            m.forward_multi(&mut work).unwrap();
            let mut work: Vec<(&[u32], &mut HybridCache)> = runs
                .iter()
                .map(Vec::as_slice)
                .zip(caches.iter_mut())
                .collect();
            if argmax {
                let got = m.forward_multi_rows_argmax(&mut work, &RUNS).unwrap();
                assert_eq!(got, want_picks, "{model_file} -ngl {ngl}: picks");
            } else {
                let got = m.forward_multi_rows(&mut work, &RUNS).unwrap();
                let got: Vec<Vec<u32>> = got.iter().map(|g| bits(g)).collect();
                same(&got, &want, n_vocab, &format!("{model_file} -ngl {ngl}"));
            }
            for (c, (p, r)) in caches.iter().zip(prompts.iter().zip(&runs)) {
                assert_eq!(c.len(), p.len() + r.len());
            }
            // One sequence alone takes the single-sequence path.
            let mut cache = m.new_cache(N_CTX).unwrap();
            m.forward_multi(&mut [(&prompts[2][..], &mut cache)])
                .unwrap();
            let one = m
                .forward_multi_rows(&mut [(&runs[2][..], &mut cache)], &[RUNS[2]])
                .unwrap();
            let what = format!("{model_file} -ngl {ngl}: alone");
            same(&[bits(&one[0])], &want[2..], n_vocab, &what);
        }
        // No row, or more rows than tokens: refused, nothing run.
        let mut cache = m.new_cache(N_CTX).unwrap();
        for keep in [0, 4] {
            let err = m
                .forward_multi_rows(&mut [(&[5, 6, 7][..], &mut cache)], &[keep])
                .unwrap_err();
            assert!(err.to_string().contains("rows"), "{err}");
        }
        assert_eq!(cache.len(), 0);
    }
}

#[test]
fn smollm2_rows_of_a_step_equal_tokens_decoded_one_at_a_time() {
    check("SmolLM2-135M-Instruct.Q4_1.gguf");
}

#[test]
fn gemma3_rows_of_a_step_equal_tokens_decoded_one_at_a_time() {
    check("gemma-3-270m-q4_k_m.gguf");
}
