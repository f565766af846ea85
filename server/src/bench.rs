//! `lamina bench`: figures, never assertions.
//!
//! - `lamina bench kernels`: mat-vec GB/s per weight type on the GPU beside a
//!   plain copy kernel on the same device, mat-mul GFLOP/s at 512 columns, and
//!   the CPU kernels beside a memcpy of the same bytes.
//! - `lamina bench model -m FILE`: prompt processing and generation tokens/s,
//!   as `llama-bench -p 128 -n 64` measures them, for a chosen `-ngl`.
//! - `lamina bench serve -m FILE`: the server under concurrent streaming
//!   clients (`bench_serve.rs`).

use std::time::Instant;

use anyhow::Context as _;
use lamina_gguf::{GgmlType, LoadMode, Model};
use lamina_gpu::{Gpu, GpuOptions, MatmulKernel};
use lamina_model::Logits;
use serde_json::json;

use lamina_model::placement::{LoadArgs, Ngl};

/// The types with GPU kernels; the CPU rows cover the same ones so the two
/// tables line up.
const TYPES: [GgmlType; lamina_gpu::SUPPORTED.len()] = lamina_gpu::SUPPORTED;

pub struct KernelArgs {
    pub rows: usize,
    pub cols: usize,
    pub iters: u32,
    pub gpu: bool,
    pub cpu: bool,
    /// Column counts of the mat-mul rows (none below 2).
    pub matmul_cols: Vec<usize>,
    pub model_shapes: bool,
    pub json: bool,
}

/// (rows, cols, what) of the real models' mat-vecs: SmolLM2-135M
/// (n_embd 576, kv 192, ff 1536, vocab 49152) and Gemma 3 270M (n_embd 640,
/// q 1024, kv 256, ff 2048, vocab 262144).
const MODEL_SHAPES: [(usize, usize, &str); 11] = [
    (576, 576, "smollm2 q/o"),
    (192, 576, "smollm2 k/v"),
    (1536, 576, "smollm2 gate/up"),
    (576, 1536, "smollm2 down"),
    (49152, 576, "smollm2 head"),
    (1024, 640, "gemma3 q"),
    (2048, 640, "gemma3 gate/up"),
    (640, 2048, "gemma3 down"),
    (262144, 640, "gemma3 head"),
    (2048, 2048, "1B q/o"),
    (8192, 2048, "1B gate/up"),
];

/// The types the model-shape table covers: the real models' and the common
/// downloads'.
const SHAPE_TYPES: [GgmlType; 6] = [
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q8_0,
    GgmlType::Q4K,
    GgmlType::Q5K,
    GgmlType::Q6K,
];

/// The mat-vec at the models' shapes, each type beside a copy of its own
/// bytes (small kernels pay the same per-dispatch cost as small copies, so
/// the share compares like with like).
fn model_shape_rows(gpu: &Gpu, iters: u32, json: bool) -> anyhow::Result<Vec<serde_json::Value>> {
    let mut out = Vec::new();
    if !json {
        println!("  mat-vec at the models' shapes (share of a copy of the same bytes):");
        print!("  {:<16} {:>13}", "shape", "");
        for ty in SHAPE_TYPES {
            print!(" {:>14}", ty.name());
        }
        println!();
    }
    for (rows, cols, what) in MODEL_SHAPES {
        if !json {
            print!("  {what:<16} {:>13}", format!("{rows}×{cols}"));
        }
        for ty in SHAPE_TYPES {
            if !(cols as u64).is_multiple_of(ty.block_size()) {
                // Not whole blocks (K-quants need K % 256 == 0; llama.cpp
                // stores such tensors in another type).
                if !json {
                    print!(" {:>14}", "—");
                }
                continue;
            }
            let t = lamina_gpu::bench::matvec(gpu, ty, rows, cols, iters)?;
            // A copy of the same bytes, within one binding.
            let c = lamina_gpu::bench::copy(gpu, t.bytes_per_iter.min(gpu.binding_limit()), iters)?;
            let frac = t.gb_per_s() / c.gb_per_s().max(f64::MIN_POSITIVE);
            if !json {
                print!(" {:>6.2} GB/s {:>3.0}%", t.gb_per_s(), 100.0 * frac);
            }
            out.push(
                json!({"device": "gpu", "op": "matvec", "type": ty.name(), "rows": rows,
                "cols": cols, "shape": what, "bytes": t.bytes_per_iter, "us": t.micros(),
                "gb_per_s": t.gb_per_s(), "copy_gb_per_s": c.gb_per_s(), "fraction_of_copy": frac}),
            );
        }
        if !json {
            println!();
        }
    }
    // A sampled step's token choice for eight sequences at top-k 40: on
    // the device (what a GPU holding the head does), or the logits read
    // back and selected on the host (what a CPU-backed device does).
    let (rows, k) = (8, 40);
    if !json {
        println!("  top-{k} choice of {rows} sequences (µs a step):");
        println!(
            "  {:<16} {:>13} {:>14} {:>14} {:>14}",
            "vocabulary", "", "on device", "read logits", "host top-k"
        );
    }
    for vocab in [49_152, 151_936, 262_144] {
        let sel = lamina_gpu::bench::selection(gpu, rows, vocab, k, iters.min(20))?;
        let logits: Vec<f32> = (0..vocab)
            .map(|i| ((i * 7919) % 2048) as f32 / 64.0)
            .collect();
        let t0 = Instant::now();
        let reps = iters.clamp(1, 20);
        for _ in 0..reps {
            for _ in 0..rows {
                std::hint::black_box(lamina_sampling::top_entries(&logits, k));
            }
        }
        let host_us = t0.elapsed().as_secs_f64() * 1e6 / f64::from(reps);
        if !json {
            println!(
                "  {:<16} {:>13} {:>14.0} {:>14.0} {:>14.0}",
                "", vocab, sel.device_us, sel.read_logits_us, host_us
            );
        }
        out.push(
            json!({"device": "gpu", "op": "top_k_choice", "rows": rows, "vocab": vocab,
            "k": k, "device_us": sel.device_us, "read_logits_us": sel.read_logits_us,
            "host_top_k_us": host_us}),
        );
    }
    Ok(out)
}

fn row_bytes(ty: GgmlType, cols: usize) -> usize {
    ty.bytes_for(cols as u64).unwrap_or(0) as usize
}

/// Deterministic filler: the kernels' speed does not depend on the values.
fn filler(len: usize) -> Vec<u8> {
    let mut s = 0x2545_f491_4f6c_dd1du64;
    (0..len)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            // Keep f16/bf16 fields finite: clear the top exponent bit.
            (s as u8) & 0xbf
        })
        .collect()
}

pub fn kernels(a: &KernelArgs) -> anyhow::Result<()> {
    let mut rows_out = Vec::new();
    if a.gpu {
        let gpu = Gpu::new(GpuOptions::default()).context("opening the GPU")?;
        let name = gpu.adapter_info().name.clone();
        let report = lamina_gpu::bench::report(&gpu, a.rows, a.cols, a.iters)?;
        let copy = report.first().map_or(0.0, |t| t.gb_per_s());
        if !a.json {
            println!(
                "GPU: {name}; mat-vec {}×{}, {} iterations per type",
                a.rows, a.cols, a.iters
            );
            println!(
                "  {:<8} {:>10} {:>10} {:>9} {:>8}",
                "type", "MiB", "µs", "GB/s", "of copy"
            );
        }
        for t in &report {
            let frac = t.gb_per_s() / copy.max(f64::MIN_POSITIVE);
            if !a.json {
                println!(
                    "  {:<8} {:>10.1} {:>10.1} {:>9.2} {:>7.0}%",
                    t.label,
                    t.bytes_per_iter as f64 / 1048576.0,
                    t.micros(),
                    t.gb_per_s(),
                    100.0 * frac
                );
            }
            rows_out.push(json!({"device": "gpu", "op": if t.label == "copy" {"copy"} else {"matvec"},
                "type": t.label, "bytes": t.bytes_per_iter, "us": t.micros(), "gb_per_s": t.gb_per_s(),
                "fraction_of_copy": frac}));
        }
        if a.model_shapes {
            rows_out.extend(model_shape_rows(&gpu, a.iters, a.json)?);
        }
        for &n in a.matmul_cols.iter().filter(|&&n| n > 1) {
            if !a.json {
                println!("  mat-mul at {n} columns:");
            }
            for ty in [
                GgmlType::F16,
                GgmlType::Q4_0,
                GgmlType::Q4_1,
                GgmlType::Q8_0,
                GgmlType::Q4K,
                GgmlType::Q6K,
            ] {
                // Auto is what the model runs; the others show what each
                // kernel would give at this width (they agree bit for bit).
                for kernel in [MatmulKernel::Auto, MatmulKernel::Small, MatmulKernel::Tiled] {
                    let t = lamina_gpu::bench::matmul(&gpu, ty, a.rows, a.cols, n, kernel, 1)?;
                    let gflops = 2.0 * (a.rows * a.cols * n) as f64 / t.seconds / 1e9;
                    if !a.json {
                        println!(
                            "  {:<8} {:<6} {:>10.1} ms {:>9.2} GFLOP/s",
                            ty.name(),
                            format!("{kernel:?}"),
                            t.seconds * 1e3,
                            gflops
                        );
                    }
                    rows_out.push(json!({"device": "gpu", "op": "matmul", "type": ty.name(),
                        "kernel": format!("{kernel:?}"), "cols": n,
                        "ms": t.seconds * 1e3, "gflop_per_s": gflops}));
                }
            }
        }
    }
    if a.cpu {
        let threads = rayon::current_num_threads();
        let x: Vec<f32> = (0..a.cols)
            .map(|i| ((i % 17) as f32 - 8.0) * 0.01)
            .collect();
        let mut y = vec![0.0f32; a.rows];
        let largest = TYPES
            .iter()
            .map(|&t| row_bytes(t, a.cols) * a.rows)
            .max()
            .unwrap_or(0);
        let src = filler(largest);
        let mut dst = vec![0u8; largest];
        let t0 = Instant::now();
        for _ in 0..a.iters {
            dst.copy_from_slice(&src);
            std::hint::black_box(&mut dst);
        }
        let copy_gbs = (largest as f64 * f64::from(a.iters)) / t0.elapsed().as_secs_f64() / 1e9;
        if !a.json {
            println!(
                "CPU: {threads} threads; mat-vec {}×{}; memcpy {copy_gbs:.2} GB/s",
                a.rows, a.cols
            );
            println!(
                "  {:<8} {:>10} {:>10} {:>9} {:>8}",
                "type", "MiB", "µs", "GB/s", "of copy"
            );
        }
        rows_out
            .push(json!({"device": "cpu", "op": "memcpy", "bytes": largest, "gb_per_s": copy_gbs}));
        for ty in TYPES {
            let bytes = row_bytes(ty, a.cols) * a.rows;
            let w = &src[..bytes];
            lamina_quant::matvec(ty, w, a.rows, a.cols, &x, &mut y)?;
            let t0 = Instant::now();
            for _ in 0..a.iters {
                lamina_quant::matvec(ty, w, a.rows, a.cols, &x, &mut y)?;
                std::hint::black_box(&mut y);
            }
            let secs = t0.elapsed().as_secs_f64() / f64::from(a.iters);
            let gbs = bytes as f64 / secs / 1e9;
            if !a.json {
                println!(
                    "  {:<8} {:>10.1} {:>10.1} {:>9.2} {:>7.0}%",
                    ty.name(),
                    bytes as f64 / 1048576.0,
                    secs * 1e6,
                    gbs,
                    100.0 * gbs / copy_gbs
                );
            }
            rows_out.push(
                json!({"device": "cpu", "op": "matvec", "type": ty.name(), "bytes": bytes,
                "us": secs * 1e6, "gb_per_s": gbs, "fraction_of_copy": gbs / copy_gbs}),
            );
        }
    }
    if a.json {
        println!("{}", serde_json::Value::Array(rows_out));
    }
    Ok(())
}

pub struct ModelArgs {
    pub file: std::path::PathBuf,
    pub n_prompt: usize,
    pub n_gen: usize,
    pub reps: usize,
    /// Context already in the cache before each pp and tg run.
    pub depth: usize,
    pub ngl: Ngl,
    pub kv: lamina_model::KvTypes,
    /// `--n-cpu-moe` ([`lamina_model::plan::PlanParams::cpu_moe`]).
    pub cpu_moe: usize,
    /// `-ot` ([`lamina_model::plan::ExpertRule`]).
    pub experts: Vec<lamina_model::plan::ExpertRule>,
    /// Levels of concurrent decoding to measure besides the single stream.
    pub npl: Vec<usize>,
    pub json: bool,
}

fn mean_sd(v: &[f64]) -> (f64, f64) {
    let n = v.len().max(1) as f64;
    let m = v.iter().sum::<f64>() / n;
    let var = v.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / n;
    (m, var.sqrt())
}

pub fn model(a: &ModelArgs) -> anyhow::Result<()> {
    let file = Model::open(&a.file, LoadMode::Mmap)?;
    let n_ctx = a.depth + a.n_prompt + a.n_gen + 1;
    let load_args = LoadArgs {
        ngl: a.ngl,
        gpu_memory: None,
        n_ctx,
        n_parallel: a.npl.iter().copied().max().unwrap_or(1).max(1),
        kv: a.kv,
        cpu_moe: a.cpu_moe,
        experts: a.experts.clone(),
        gpu: None,
    };
    let (m, table) = lamina_model::placement::load(&file, &load_args)?;
    if !a.json {
        eprintln!("{table}");
    }
    let vocab = m.config().n_vocab as u64;
    // Arbitrary but fixed token ids spread over the vocabulary.
    let ids = |n: usize, salt: u64| -> Vec<u32> {
        (0..n as u64)
            .map(|i| ((i * 7919 + 13 + salt) % vocab) as u32)
            .collect()
    };
    let prompt = ids(a.n_prompt, 0);
    // One cache for every run: filled once to the depth (untimed, in
    // chunks the size of the server's prefill batches), and cut back to
    // it before each run.
    let mut cache = m.new_cache(n_ctx)?;
    for chunk in ids(a.depth, 1).chunks(512) {
        m.forward(chunk, &mut cache, Logits::Last)?;
    }
    // One untimed run first, as llama-bench does: the first use of each
    // kernel compiles its pipeline (seconds on a software device), and the
    // first touch of the map faults the weights in.
    {
        if a.n_prompt > 0 {
            m.forward(&prompt, &mut cache, Logits::Last)?;
        }
        cache.truncate(a.depth);
        for _ in 0..a.n_gen.min(2) {
            m.forward(&[1], &mut cache, Logits::Last)?;
        }
    }
    let counters = || m.gpu().map_or((0, 0), lamina_gpu::Gpu::counters);
    let host = || {
        m.gpu()
            .map(lamina_gpu::Gpu::host_counters)
            .unwrap_or_default()
    };
    // Host seconds from recording to submission, and bind groups made, per token.
    let mut host_per_token = (0.0, 0.0);
    let (mut pp, mut tg) = (Vec::new(), Vec::new());
    let mut per_token = (0.0, 0.0);
    let mut block_per_token = 0.0;
    if let Some(g) = m.gpu() {
        g.take_profile();
    }
    for _ in 0..a.reps.max(1) {
        if a.n_prompt > 0 {
            cache.truncate(a.depth);
            let t0 = Instant::now();
            m.forward(&prompt, &mut cache, Logits::Last)?;
            pp.push(a.n_prompt as f64 / t0.elapsed().as_secs_f64());
        }
        if a.n_gen > 0 {
            cache.truncate(a.depth);
            let t0 = Instant::now();
            let mut tok = 1u32;
            let (d0, s0) = counters();
            let h0 = host();
            let blocks0 = m.block_dispatches();
            for _ in 0..a.n_gen {
                let logits = m.forward(&[tok], &mut cache, Logits::Last)?;
                tok = lamina_sampling::argmax(&logits);
            }
            tg.push(a.n_gen as f64 / t0.elapsed().as_secs_f64());
            let (d1, s1) = counters();
            let n = a.n_gen as f64;
            per_token = ((d1 - d0) as f64 / n, (s1 - s0) as f64 / n);
            let h1 = host();
            host_per_token = (
                (h1.seconds - h0.seconds) / n,
                (h1.bind_groups_made - h0.bind_groups_made) as f64 / n,
            );
            block_per_token = (m.block_dispatches() - blocks0) as f64 / n;
        }
    }
    drop(cache);
    // Concurrent decoding: every sequence takes one token per step, all in
    // one `forward_multi` (as the server's scheduler does), from an empty
    // cache like `tg`. Untimed first step per level: a new batch width
    // compiles or sizes what it needs.
    let mut batched = Vec::new();
    for &np in a.npl.iter().filter(|&&np| np > 0 && a.n_gen > 0) {
        let mut runs = Vec::new();
        for rep in 0..=a.reps.max(1) {
            let mut caches = m.new_caches(np, n_ctx)?;
            let mut toks: Vec<u32> = (0..np as u32).map(|j| 1 + j).collect();
            let steps = if rep == 0 { 1 } else { a.n_gen };
            let t0 = Instant::now();
            for _ in 0..steps {
                let owned: Vec<[u32; 1]> = toks.iter().map(|&t| [t]).collect();
                let mut work: Vec<(&[u32], &mut lamina_model::HybridCache)> = owned
                    .iter()
                    .zip(caches.iter_mut())
                    .map(|(t, c)| (&t[..], c))
                    .collect();
                let out = m.forward_multi(&mut work)?;
                toks = out.iter().map(|l| lamina_sampling::argmax(l)).collect();
            }
            if rep > 0 {
                runs.push((np * steps) as f64 / t0.elapsed().as_secs_f64());
            }
        }
        batched.push((np, mean_sd(&runs)));
    }
    let name = a
        .file
        .file_name()
        .map_or(String::new(), |n| n.to_string_lossy().into_owned());
    let (ppm, pps) = mean_sd(&pp);
    let (tgm, tgs) = mean_sd(&tg);
    // Slots count the output layer first (llama.cpp's rule), then blocks.
    let blocks = m.plan.ngl.saturating_sub(1).min(m.config().n_layer).max(1) as f64;
    if a.json {
        println!(
            "{}",
            json!({"model": name, "ngl": m.plan.ngl, "threads": rayon::current_num_threads(),
                   "depth": a.depth,
                   "pp": {"tokens": a.n_prompt, "tokens_per_second": ppm, "sd": pps},
                   "tg": {"tokens": a.n_gen, "tokens_per_second": tgm, "sd": tgs,
                          "gpu_dispatches_per_token": per_token.0,
                          "gpu_dispatches_per_block": block_per_token / blocks,
                          "gpu_submits_per_token": per_token.1,
                          "gpu_host_seconds_per_token": host_per_token.0,
                          "gpu_bind_groups_made_per_token": host_per_token.1},
                   "batched_tg": batched.iter().map(|(np, (m, sd))| json!({
                       "sequences": np, "tokens_per_second": m, "sd": sd})).collect::<Vec<_>>()})
        );
    } else {
        println!("| model | ngl | threads | test | tokens/s |");
        println!("| --- | --- | --- | --- | --- |");
        let t = rayon::current_num_threads();
        // llama-bench's label for a test at depth: "tg32 @ d4096".
        let at = if a.depth > 0 {
            format!(" @ d{}", a.depth)
        } else {
            String::new()
        };
        if a.n_prompt > 0 {
            println!(
                "| {name} | {} | {t} | pp{}{at} | {ppm:.2} ± {pps:.2} |",
                m.plan.ngl, a.n_prompt
            );
        }
        if a.n_gen > 0 {
            println!(
                "| {name} | {} | {t} | tg{}{at} | {tgm:.2} ± {tgs:.2} |",
                m.plan.ngl, a.n_gen
            );
        }
        for (np, (bm, bs)) in &batched {
            println!(
                "| {name} | {} | {t} | tg{} ×{np} | {bm:.2} ± {bs:.2} |",
                m.plan.ngl, a.n_gen
            );
        }
        if m.gpu().is_some() && a.n_gen > 0 {
            println!(
                "\nGPU per generated token: {:.0} dispatches ({:.1} per offloaded block, \
                 {:.0} outside them), {:.1} submits; host {:.0} µs recording and submitting, \
                 {:.1} bind groups made",
                per_token.0,
                block_per_token / blocks,
                per_token.0 - block_per_token,
                per_token.1,
                host_per_token.0 * 1e6,
                host_per_token.1
            );
        }
    }
    if let Some(profile) = m.gpu().and_then(lamina_gpu::Gpu::take_profile) {
        let total: f64 = profile.iter().map(|p| p.2).sum();
        eprintln!("\nLAMINA_GPU_PROFILE: every timed step, each dispatch alone");
        eprintln!("| kernel | dispatches | ms | share |");
        eprintln!("| --- | --- | --- | --- |");
        for (k, n, s) in profile.iter().take(25) {
            eprintln!("| {k} | {n} | {:.1} | {:.1}% |", s * 1e3, 100.0 * s / total);
        }
    }
    Ok(())
}
