//! The KV cache's size and its sliding-window rings on the real models.
//!
//! Sizes: llama-server (llama.cpp 0.3.36, the `llama-cpp-python` sdist's)
//! started with `-c 8192 -np 4 -v` prints its caches at load, f16 keys and
//! values, four sequences of 2048 cells:
//!
//! - SmolLM2: `llama_kv_cache: size = 180.00 MiB (2048 cells, 30 layers,
//!   4/4 seqs), K (f16): 90.00 MiB, V (f16): 90.00 MiB`
//! - Gemma 3: `non-SWA KV cache, size = 2048 cells` … `size = 24.00 MiB
//!   (2048 cells, 3 layers, 4/4 seqs)`, then `SWA KV cache, size = 1024
//!   cells` … `size = 60.00 MiB (1024 cells, 15 layers, 4/4 seqs)`.
//!
//! Rings: a sliding-window layer's ring gives the bits of a cache of every
//! position (`--swa-full`), past the point where it wraps, on the CPU and
//! with every layer on the GPU.
#![allow(clippy::unwrap_used)]

mod common;

use common::model_path;
use lamina_gguf::{LoadMode, Model};
use lamina_gpu::{Gpu, GpuOptions};
use lamina_model::plan::{self, PlanParams};
use lamina_model::{CpuModel, HybridModel, KvCache, KvType, KvTypes, Logits};

const MIB: u64 = 1 << 20;

fn kv_bytes(file: &str, kv: KvTypes) -> u64 {
    let model = Model::open(model_path(file), LoadMode::Mmap).unwrap();
    let mut cpu = CpuModel::load(&model).unwrap();
    cpu.config.kv = kv;
    let params = PlanParams {
        n_ctx: 8192,
        n_parallel: 4,
        ..PlanParams::default()
    };
    let p = plan::plan(&model, &cpu.config, 0, &params);
    // What the plan counts is what four slots' caches allocate.
    let host =
        lamina_model::memory::kv_host_bytes(&cpu.config, 4, cpu.config.n_layer, 2048).unwrap();
    assert_eq!(p.cpu_kv + p.gpu_kv, host, "{file}: plan and caches agree");
    host
}

#[test]
fn f16_cache_bytes_equal_llama_servers_at_8192_by_4() {
    let f16 = KvTypes::uniform(KvType::F16);
    assert_eq!(kv_bytes("SmolLM2-135M-Instruct.Q4_1.gguf", f16), 180 * MIB);
    assert_eq!(kv_bytes("gemma-3-270m-q4_k_m.gguf", f16), (24 + 60) * MIB);
    // --swa-full: every layer keeps all 2048 positions, as llama.cpp's.
    let full = KvTypes {
        swa_full: true,
        ..f16
    };
    assert_eq!(
        kv_bytes("gemma-3-270m-q4_k_m.gguf", full),
        18 * 24 / 3 * MIB
    );
    // f32 doubles, q8_0 is 34/64 of f16.
    let f32 = KvTypes::uniform(KvType::F32);
    assert_eq!(kv_bytes("SmolLM2-135M-Instruct.Q4_1.gguf", f32), 360 * MIB);
    let q8 = KvTypes::uniform(KvType::Q8_0);
    assert_eq!(
        kv_bytes("SmolLM2-135M-Instruct.Q4_1.gguf", q8),
        180 * MIB / 64 * 34
    );
}

/// Gemma 3's prompt past its 1024-row rings: chunks of 600, then 500 (the
/// ring allows 513 a step: split inside), then single tokens.
fn steps() -> (Vec<u32>, Vec<usize>) {
    let tokens: Vec<u32> = (0..1110u32).map(|i| 2 + (i * 7919) % 20000).collect();
    (tokens, vec![600, 500, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1])
}

fn run_steps(m: &HybridModel<'_>, n_ctx: usize) -> Vec<Vec<f32>> {
    let (tokens, steps) = steps();
    let mut cache = m.new_cache(n_ctx).unwrap();
    let mut at = 0;
    let mut out = Vec::new();
    for n in steps {
        out.push(
            m.forward(&tokens[at..at + n], &mut cache, Logits::Last)
                .unwrap(),
        );
        at += n;
    }
    out
}

fn ring_equals_full(on_gpu: bool) {
    let file = Model::open(model_path("gemma-3-270m-q4_k_m.gguf"), LoadMode::Mmap).unwrap();
    let gpu = on_gpu.then(|| std::sync::Arc::new(Gpu::new(GpuOptions::default()).unwrap()));
    let n_ctx = 2048;
    let mut runs = Vec::new();
    for swa_full in [false, true] {
        let mut cpu = CpuModel::load(&file).unwrap();
        cpu.config.kv = KvTypes {
            swa_full,
            ..KvTypes::default()
        };
        let ngl = if on_gpu { cpu.config.n_layer + 1 } else { 0 };
        let params = PlanParams {
            n_ctx,
            ..PlanParams::default()
        };
        let p = plan::plan(&file, &cpu.config, ngl, &params);
        let m = HybridModel::new(cpu, p, gpu.clone()).unwrap();
        runs.push(run_steps(&m, n_ctx));
    }
    let (ring, full) = (&runs[0], &runs[1]);
    for (i, (a, b)) in ring.iter().zip(full).enumerate() {
        let diff = a
            .iter()
            .zip(b)
            .filter(|(x, y)| x.to_bits() != y.to_bits())
            .count();
        assert_eq!(diff, 0, "step {i}: {diff} logits differ (gpu {on_gpu})");
    }
}

#[test]
fn gemma3_rings_give_the_bits_of_a_full_cache_on_the_cpu() {
    ring_equals_full(false);
}

#[test]
fn gemma3_rings_give_the_bits_of_a_full_cache_on_the_gpu() {
    ring_equals_full(true);
}

#[test]
fn a_ring_cache_keeps_a_prefix_only_while_it_holds_the_window() {
    let file = Model::open(model_path("gemma-3-270m-q4_k_m.gguf"), LoadMode::Mmap).unwrap();
    let m = CpuModel::load(&file).unwrap();
    let mut cache = KvCache::new(&m.config, 4096).unwrap();
    let tokens: Vec<u32> = (0..1300u32).map(|i| 2 + i).collect();
    m.forward(&tokens, &mut cache, Logits::Last).unwrap();
    // Rings of 1024 rows hold positions 276..1300: a prefix of 1000 needs
    // 489..1000, still there; 700 needs 189..700, overwritten.
    cache.truncate(1000);
    assert_eq!(cache.len(), 1000);
    cache.truncate(700);
    assert_eq!(cache.len(), 0);
    // Full caches keep any prefix.
    let mut m2 = CpuModel::load(&file).unwrap();
    m2.config.kv.swa_full = true;
    let mut full = KvCache::new(&m2.config, 4096).unwrap();
    m2.forward(&tokens, &mut full, Logits::Last).unwrap();
    full.truncate(700);
    assert_eq!(full.len(), 700);
}
