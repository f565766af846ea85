//! `lamina fit`: how many layers of a model fit a GPU memory budget, planned
//! from the header and tensor table alone (no tensor byte is read).

use std::path::Path;

use lamina_gguf::{GgmlType, LoadMode, Model};
use lamina_model::plan::{self, Device, Plan, PlanParams};
use lamina_model::Config;
use serde_json::json;

use crate::inspect::human_size;

/// Card sizes shown when no budget is given: the user's question is usually
/// "will it fit my card", and wgpu cannot tell free memory anyway.
const COMMON_CARDS_GIB: [u64; 6] = [4, 6, 8, 12, 16, 24];

pub struct FitArgs<'a> {
    pub file: &'a Path,
    pub budget: Option<u64>,
    pub n_ctx: Option<usize>,
    pub n_parallel: usize,
    /// The KV cache types the plans count.
    pub kv: lamina_model::KvTypes,
    pub json: bool,
    /// `--n-cpu-moe` ([`lamina_model::plan::PlanParams::cpu_moe`]).
    pub cpu_moe: usize,
    /// `-ot` ([`lamina_model::plan::ExpertRule`]).
    pub experts: Vec<lamina_model::plan::ExpertRule>,
    /// Probe the CPU's and the GPU's kernel bandwidth and predict decode speed.
    pub measure: bool,
}

/// Speed of each device: the CPU's from the model's own decode step, the
/// GPU's from a mat-vec of the model's dominant weight type.
struct Probe {
    ty: GgmlType,
    cpu_gbs: f64,
    /// Seconds of the probe's all-CPU decode step.
    cpu_step_s: f64,
    gpu_gbs: Option<f64>,
    gpu_name: Option<String>,
}

/// The weight type holding the most bytes in the blocks.
fn dominant_type(model: &Model) -> GgmlType {
    let mut by_type: Vec<(GgmlType, u64)> = Vec::new();
    for t in model.tensors().filter(|t| t.info.name.starts_with("blk.")) {
        match by_type.iter_mut().find(|(ty, _)| *ty == t.info.ty) {
            Some(e) => e.1 += t.info.n_bytes,
            None => by_type.push((t.info.ty, t.info.n_bytes)),
        }
    }
    by_type
        .into_iter()
        .max_by_key(|e| e.1)
        .map_or(GgmlType::Q8_0, |e| e.0)
}

/// A short speed probe. The CPU's: the model's own decode step, run whole
/// on the CPU (`-ngl 0`) over the map, timed once a first step has brought
/// the pages in and started the thread pool; its speed is the bytes that
/// step reads over its time. The GPU's: a 4096×4096 mat-vec of the
/// dominant type. Earlier versions timed the CPU on a cache-sized synthetic
/// matrix, then on the model's first blocks' mat-vecs one call at a time:
/// the first read half the decode speed `bench model` measures at 1B and 8B,
/// the second far too little for a model small enough to stay in the CPU's
/// caches, paying a pool round trip per mat-vec that the forward pass does
/// not (docs/perf/memory.md, "memory and fit at 1B and 8B").
fn probe(model: &Model, cpu_bytes: u64) -> anyhow::Result<Probe> {
    const N: usize = 4096;
    // Steps timed, unless one step takes longer than this (a large model):
    // then fewer, at least one.
    const STEPS: usize = 4;
    const BUDGET_S: f64 = 2.0;
    let mut ty = dominant_type(model);
    if !lamina_quant::supports(ty) || !lamina_gpu::has_kernel(ty) {
        ty = GgmlType::Q8_0;
    }
    let cpu = lamina_model::CpuModel::load(model)?;
    let mut cache = lamina_model::KvCache::new(&cpu.config, STEPS + 1)?;
    // Any id the vocabulary has: the weights read do not depend on it.
    let token = [1u32.min(cpu.config.n_vocab.saturating_sub(1) as u32)];
    let t0 = std::time::Instant::now();
    cpu.forward(&token, &mut cache, lamina_model::Logits::Last)?;
    let steps = if t0.elapsed().as_secs_f64() * STEPS as f64 > BUDGET_S {
        1
    } else {
        STEPS
    };
    let t0 = std::time::Instant::now();
    for _ in 0..steps {
        cpu.forward(&token, &mut cache, lamina_model::Logits::Last)?;
    }
    let step_s = t0.elapsed().as_secs_f64() / steps as f64;
    let cpu_gbs = cpu_bytes as f64 / step_s / 1e9;
    let (gpu_gbs, gpu_name) = match lamina_gpu::Gpu::new(lamina_gpu::GpuOptions::default()) {
        Ok(g) => {
            let t = lamina_gpu::bench::matvec(&g, ty, N, N, 10)?;
            (Some(t.gb_per_s()), Some(g.adapter_info().name.clone()))
        }
        Err(_) => (None, None),
    };
    Ok(Probe {
        ty,
        cpu_gbs,
        cpu_step_s: step_s,
        gpu_gbs,
        gpu_name,
    })
}

/// Weight bytes the CPU reads per decoded token under `p`: its blocks, and
/// the head when it is there (a tied head is the embedding, read whole as
/// the head, one row of it as the embedding).
fn cpu_read(p: &Plan, tied: bool) -> u64 {
    let head_on_cpu = p.slots.last().is_some_and(|s| s.device == Device::Cpu);
    p.cpu_weights - p.embd_bytes + if tied && head_on_cpu { p.embd_bytes } else { 0 }
}

/// Decode tokens/s predicted for a plan: every weight byte is read once per
/// token, each device at its probed speed (the two run one after the other).
/// The embedding lookup reads one row; a tied head on the CPU reads it all.
fn predict(p: &Plan, tied: bool, probe: &Probe) -> Option<f64> {
    let mut seconds = cpu_read(p, tied) as f64 / (probe.cpu_gbs * 1e9);
    if p.gpu_weights > 0 {
        seconds += p.gpu_weights as f64 / (probe.gpu_gbs? * 1e9);
    }
    Some(1.0 / seconds)
}

pub fn run(a: FitArgs<'_>) -> anyhow::Result<()> {
    let model = Model::open(a.file, LoadMode::Mmap)?;
    let mut cfg = Config::from_gguf(&model)?;
    cfg.kv = a.kv;
    let params = |n_ctx| PlanParams {
        n_ctx,
        n_parallel: a.n_parallel,
        cpu_moe: a.cpu_moe,
        ..PlanParams::default()
    };
    let main_ctx = a.n_ctx.unwrap_or(cfg.context_length.min(4096));
    // Past what the GPU's kernels allow, every larger -ngl is the same plan.
    let layout = plan::layout_with(&model, &cfg, &a.experts)?;
    let all = layout.all_plans(&cfg, &params(main_ctx));
    let held = all.last().map(|p| p.held.clone()).unwrap_or_default();
    let held_note = all.last().and_then(lamina_model::placement::held_note);
    let plans: Vec<Plan> = all.into_iter().filter(|p| p.asked == p.ngl).collect();
    let contexts: Vec<usize> = match a.n_ctx {
        Some(c) => vec![c],
        None => [2048, 4096, 8192, 32768, 131072]
            .into_iter()
            .filter(|&c| c < cfg.context_length)
            .chain([cfg.context_length])
            .collect(),
    };
    let budgets: Vec<u64> = match a.budget {
        Some(b) => vec![b],
        None => COMMON_CARDS_GIB.iter().map(|g| g << 30).collect(),
    };
    let recommend = |budget, n_ctx| layout.fit(&cfg, budget, &params(n_ctx));
    let tied = model.tensor("output.weight").is_none();
    let probe = if a.measure {
        // The all-CPU plan's reads: what the probe's decode step reads.
        let cpu_bytes = plans
            .iter()
            .find(|p| p.ngl == 0)
            .map_or(0, |p| cpu_read(p, tied));
        Some(probe(&model, cpu_bytes)?)
    } else {
        None
    };
    let predicted = |p: &Plan| probe.as_ref().and_then(|pr| predict(p, tied, pr));

    if a.json {
        let rows: Vec<_> = plans
            .iter()
            .map(|p| {
                json!({"ngl": p.ngl, "gpu_bytes": p.gpu_total(), "cpu_bytes": p.cpu_total(),
                       "kv_bytes": p.gpu_kv.saturating_add(p.cpu_kv), "gpu_weight_bytes": p.gpu_weights,
                       "gpu_kv_bytes": p.gpu_kv, "gpu_scratch_bytes": p.gpu_scratch,
                       "cpu_expert_bytes": p.split_expert_bytes(),
                       "predicted_tokens_per_second": predicted(p)})
            })
            .collect();
        let fits: Vec<_> = budgets
            .iter()
            .flat_map(|&b| contexts.iter().map(move |&c| (b, c)))
            .map(|(b, c)| {
                let p = recommend(b, c);
                json!({"budget_bytes": b, "n_ctx": c, "recommended_ngl": p.ngl, "gpu_bytes": p.gpu_total()})
            })
            .collect();
        let main = recommend(budgets[0], main_ctx);
        println!(
            "{}",
            json!({"n_layer": cfg.n_layer, "n_ctx": main_ctx, "n_parallel": a.n_parallel,
                   "budget_bytes": a.budget, "margin_bytes": plan::margin(budgets[0]),
                   "rows": rows, "recommended_ngl": main.ngl, "fits": fits,
                   "cache_type_k": cfg.kv.k.name(), "cache_type_v": cfg.kv.v.name(),
                   "held_by_missing_kernels": held.iter().map(|h| json!({"tensor": h.tensor, "type": h.ty.name()})).collect::<Vec<_>>(),
                   "probe": probe.as_ref().map(|p| json!({"type": p.ty.name(), "cpu_gb_per_s": p.cpu_gbs,
                       "cpu_step_ms": p.cpu_step_s * 1e3,
                       "gpu_gb_per_s": p.gpu_gbs, "gpu": p.gpu_name}))})
        );
        return Ok(());
    }

    println!(
        "{}: {} with {} blocks + output layer; KV cache {}; {} parallel",
        a.file.display(),
        cfg.arch.name(),
        cfg.n_layer,
        cfg.kv,
        a.n_parallel
    );
    println!("\nAt context {main_ctx}:");
    if let Some(pr) = &probe {
        println!(
            "Probe: CPU {:.2} GB/s (the model's decode step at -ngl 0, {:.1} ms); GPU {}",
            pr.cpu_gbs,
            pr.cpu_step_s * 1e3,
            match (&pr.gpu_gbs, &pr.gpu_name) {
                (Some(g), Some(n)) => format!("{g:.2} GB/s ({}×4096×4096 mat-vec, {n})", pr.ty),
                _ => "none".into(),
            }
        );
    }
    // A mixture's offloaded blocks keep their routed experts in RAM: a
    // column says how much of the CPU total they are.
    let moe = cfg.moe.is_some();
    let experts_col = |v: String| {
        if moe {
            format!("  {v:>11}")
        } else {
            String::new()
        }
    };
    println!(
        "  {:>4}  {:>11}  {:>11}  {:>11}  {:>11}  {:>11}{}  {:>10}",
        "-ngl",
        "GPU weights",
        "GPU KV",
        "GPU scratch",
        "GPU total",
        "CPU total",
        experts_col("CPU experts".into()),
        "pred tok/s"
    );
    for p in &plans {
        println!(
            "  {:>4}  {:>11}  {:>11}  {:>11}  {:>11}  {:>11}{}  {:>10}",
            p.ngl,
            human_size(p.gpu_weights),
            human_size(p.gpu_kv),
            human_size(p.gpu_scratch),
            human_size(p.gpu_total()),
            human_size(p.cpu_total()),
            experts_col(human_size(p.split_expert_bytes())),
            predicted(p).map_or("-".into(), |t| format!("{t:.1}"))
        );
    }
    if moe {
        println!(
            "  CPU experts: the routed experts (ffn_*_exps) of the offloaded blocks kept in system \
             RAM and run on the CPU: all of them by default (--cpu-moe), the first N blocks' with \
             --n-cpu-moe N"
        );
    }
    if let Some(note) = &held_note {
        println!("{note}");
    }
    println!(
        "\nLargest -ngl that fits (budget less a margin of 10%, at most 1 GiB; {} = all):",
        cfg.n_layer + 1
    );
    print!("  {:>10}", "budget");
    for c in &contexts {
        print!("  {:>8}", format!("c={c}"));
    }
    println!();
    for &b in &budgets {
        print!("  {:>10}", human_size(b));
        for &c in &contexts {
            print!("  {:>8}", recommend(b, c).ngl);
        }
        println!();
    }
    if let Some(b) = a.budget {
        let p = recommend(b, main_ctx);
        println!("\n{}", lamina_model::placement::summary(&p));
    }
    Ok(())
}
