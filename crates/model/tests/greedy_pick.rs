//! Greedy picks and top-k candidates reduced on the GPU: on both real
//! models, every layer offloaded or half of them, `forward_multi_argmax`
//! gives, step after step, the token that lamina_sampling's `argmax` picks
//! from `forward_multi`'s logits, and `forward_multi_top` that token and
//! the ids and bits of lamina_sampling's `top_entries`, for one sequence
//! and for several sharing a step (a prompt beside decodes). With nothing
//! on the GPU both refuse before running anything.
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;

use common::model_path;
use lamina_gguf::{LoadMode, Model};
use lamina_gpu::{Gpu, GpuOptions};
use lamina_model::plan::{self, PlanParams};
use lamina_model::{CpuModel, HybridCache, HybridModel};

/// How a step picks: from the logits on the host, or on the GPU.
#[derive(Clone, Copy)]
enum Mode {
    Host,
    Argmax,
    Top,
}

/// Candidates each test asks for.
const K: usize = 40;

/// One sequence's result of a step: its argmax, and (Host and Top) its
/// best ids and logit bits.
type Picked = (u32, Vec<(u32, u32)>);

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
/// each sequence fed its own pick; `mode` says which path picks. Returns
/// every step's results.
fn run(m: &HybridModel<'_>, prompts: &[Vec<u32>], decodes: usize, mode: Mode) -> Vec<Vec<Picked>> {
    let mut caches: Vec<HybridCache> = m.new_caches(prompts.len(), N_CTX).unwrap();
    let mut inputs: Vec<Vec<u32>> = prompts.to_vec();
    let mut out = Vec::new();
    for _ in 0..=decodes {
        let mut work: Vec<(&[u32], &mut HybridCache)> = inputs
            .iter()
            .map(Vec::as_slice)
            .zip(caches.iter_mut())
            .collect();
        let bits = |best: Vec<(u32, f32)>| -> Vec<(u32, u32)> {
            best.into_iter().map(|(i, l)| (i, l.to_bits())).collect()
        };
        let picks: Vec<Picked> = match mode {
            Mode::Host => m
                .forward_multi(&mut work)
                .unwrap()
                .iter()
                .map(|l| {
                    let best = lamina_sampling::top_entries(l, K);
                    (lamina_sampling::argmax(l), bits(best))
                })
                .collect(),
            Mode::Argmax => m
                .forward_multi_argmax(&mut work)
                .unwrap()
                .into_iter()
                .map(|t| (t, Vec::new()))
                .collect(),
            Mode::Top => m
                .forward_multi_top(&mut work, K)
                .unwrap()
                .into_iter()
                .map(|c| (c.argmax, bits(c.best)))
                .collect(),
        };
        inputs = picks.iter().map(|&(t, _)| vec![t]).collect();
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
        let mut m = model(&file, &gpu, ngl);
        assert!(m.argmax_on_gpu(), "{model_file} -ngl {ngl}");
        // A CPU-backed device selects on the host unless told otherwise.
        let cpu_backed = gpu.adapter_info().device_type == "cpu";
        assert_eq!(m.top_on_gpu().is_none(), cpu_backed, "{model_file}");
        m.select_top_on_gpu(Some(false));
        assert!(m.top_on_gpu().is_none());
        m.select_top_on_gpu(Some(true));
        assert!(m.top_on_gpu().is_some_and(|max| max >= K));
        for prompts in [
            vec![prompt(1, 12)],
            vec![prompt(2, 9), prompt(3, 1), prompt(4, 17)],
        ] {
            let n = prompts.len();
            let want = run(&m, &prompts, 5, Mode::Host);
            assert!(want.iter().flatten().all(|(_, best)| best.len() == K));
            let top = run(&m, &prompts, 5, Mode::Top);
            assert_eq!(top, want, "{model_file} -ngl {ngl}: {n} sequences, top-{K}");
            let picks: Vec<Vec<u32>> = run(&m, &prompts, 5, Mode::Argmax)
                .into_iter()
                .map(|step| step.into_iter().map(|(t, _)| t).collect())
                .collect();
            let want: Vec<Vec<u32>> = want
                .into_iter()
                .map(|step| step.into_iter().map(|(t, _)| t).collect())
                .collect();
            assert_eq!(picks, want, "{model_file} -ngl {ngl}: {n} sequences");
        }
        // k past what the device selects, or 0: refused.
        let mut cache = m.new_cache(N_CTX).unwrap();
        for k in [0, lamina_gpu::TOPK_MAX + 1] {
            let err = m
                .forward_multi_top(&mut [(&[5, 6, 7][..], &mut cache)], k)
                .unwrap_err();
            assert!(err.to_string().contains("top-"), "{err}");
        }
        assert_eq!(cache.len(), 0);
    }

    // Nothing on the GPU: refused, and the cache is left as it was.
    let m = model(&file, &gpu, 0);
    assert!(!m.argmax_on_gpu(), "{model_file}");
    let mut cache = m.new_cache(N_CTX).unwrap();
    let err = m
        .forward_multi_argmax(&mut [(&[5, 6, 7][..], &mut cache)])
        .unwrap_err();
    assert!(err.to_string().contains("GPU"), "{err}");
    let err = m
        .forward_multi_top(&mut [(&[5, 6, 7][..], &mut cache)], K)
        .unwrap_err();
    assert!(err.to_string().contains("GPU"), "{err}");
    assert_eq!(cache.len(), 0);
}

#[test]
fn smollm2_greedy_picks_and_candidates_on_the_gpu_equal_the_hosts() {
    check("SmolLM2-135M-Instruct.Q4_1.gguf");
}

#[test]
fn gemma3_greedy_picks_and_candidates_on_the_gpu_equal_the_hosts() {
    check("gemma-3-270m-q4_k_m.gguf");
}
