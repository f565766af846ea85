//! Greedy picks reduced on the GPU: on both real models, every layer
//! offloaded or half of them, `forward_multi_argmax` gives, step after step, the token
//! that lamina_sampling's `argmax` picks from `forward_multi`'s logits, for
//! one sequence and for several sharing a step (a prompt beside decodes).
//! With nothing on the GPU it refuses before running anything.
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;

use common::model_path;
use lamina_gguf::{LoadMode, Model};
use lamina_gpu::{Gpu, GpuOptions};
use lamina_model::plan::{self, PlanParams};
use lamina_model::{CpuModel, HybridCache, HybridModel};

const N_CTX: usize = 64;

fn model<'a>(file: &'a Model, gpu: &Arc<Gpu>, ngl: usize) -> HybridModel<'a> {
    let cpu = CpuModel::load(file).unwrap();
    let params = PlanParams {
        n_ctx: N_CTX,
        n_parallel: 3,
        ..PlanParams::default()
    };
    let p = plan::plan(file, &cpu.config, ngl, &params);
    HybridModel::new(cpu, p, Some(gpu.clone())).unwrap()
}

/// Steps `prompts` (one per sequence) and then `decodes` greedy tokens,
/// each sequence fed its own pick; `argmax` says which path picks. Returns
/// every step's picks.
fn run(m: &HybridModel<'_>, prompts: &[Vec<u32>], decodes: usize, argmax: bool) -> Vec<Vec<u32>> {
    let mut caches: Vec<HybridCache> = m.new_caches(prompts.len(), N_CTX).unwrap();
    let mut inputs: Vec<Vec<u32>> = prompts.to_vec();
    let mut out = Vec::new();
    for _ in 0..=decodes {
        let mut work: Vec<(&[u32], &mut HybridCache)> = inputs
            .iter()
            .map(Vec::as_slice)
            .zip(caches.iter_mut())
            .collect();
        let picks = if argmax {
            m.forward_multi_argmax(&mut work).unwrap()
        } else {
            m.forward_multi(&mut work)
                .unwrap()
                .iter()
                .map(|l| lamina_sampling::argmax(l))
                .collect()
        };
        inputs = picks.iter().map(|&t| vec![t]).collect();
        out.push(picks);
    }
    out
}

fn check(model_file: &str) {
    let file = Model::open(model_path(model_file), LoadMode::Mmap).unwrap();
    let gpu = Arc::new(Gpu::new(GpuOptions::default()).unwrap());
    let n_layer = CpuModel::load(&file).unwrap().config.n_layer;
    let prompt =
        |seed: u32, n: u32| -> Vec<u32> { (0..n).map(|i| 2 + (seed + i * 7919) % 9000).collect() };
    for ngl in [n_layer + 1, n_layer / 2] {
        let m = model(&file, &gpu, ngl);
        assert!(m.argmax_on_gpu(), "{model_file} -ngl {ngl}");
        for prompts in [
            vec![prompt(1, 12)],
            vec![prompt(2, 9), prompt(3, 1), prompt(4, 17)],
        ] {
            let want = run(&m, &prompts, 5, false);
            let got = run(&m, &prompts, 5, true);
            let n = prompts.len();
            assert_eq!(got, want, "{model_file} -ngl {ngl}: {n} sequences");
        }
    }

    // Nothing on the GPU: refused, and the cache is left as it was.
    let m = model(&file, &gpu, 0);
    assert!(!m.argmax_on_gpu(), "{model_file}");
    let mut cache = m.new_cache(N_CTX).unwrap();
    let err = m
        .forward_multi_argmax(&mut [(&[5, 6, 7][..], &mut cache)])
        .unwrap_err();
    assert!(err.to_string().contains("GPU"), "{err}");
    assert_eq!(cache.len(), 0);
}

#[test]
fn smollm2_greedy_picks_on_the_gpu_equal_the_hosts() {
    check("SmolLM2-135M-Instruct.Q4_1.gguf");
}

#[test]
fn gemma3_greedy_picks_on_the_gpu_equal_the_hosts() {
    check("gemma-3-270m-q4_k_m.gguf");
}
