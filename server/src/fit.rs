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

/// Kernel bandwidth of each device, measured on the model's dominant weight type.
struct Probe {
    ty: GgmlType,
    cpu_gbs: f64,
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

/// A short bandwidth probe. The CPU's: the model's own first blocks' mat-vecs
/// (up to 1 GiB of them, read in place from the map as decoding reads them,
/// from inside the thread pool as the forward pass calls its kernels),
/// timed on a second pass once the first has brought the pages in. The
/// GPU's: a 4096×4096 mat-vec of the dominant type. (A first version timed
/// one cache-sized synthetic matrix on the CPU too, and predicted about half
/// the decode speed `bench model` measured at 1B and 8B.)
fn probe(model: &Model) -> anyhow::Result<Probe> {
    const N: usize = 4096;
    let mut ty = dominant_type(model);
    if !lamina_quant::supports(ty) || !lamina_gpu::has_kernel(ty) {
        ty = GgmlType::Q8_0;
    }
    let cfg = Config::from_gguf(model)?;
    let weights = lamina_model::Weights::load(model, &cfg)?;
    let mut mats: Vec<&lamina_model::Matrix<'_>> = Vec::new();
    let mut total = 0usize;
    for l in &weights.layers {
        let block: Vec<&lamina_model::Matrix<'_>> = match &l.ffn {
            lamina_model::Ffn::Dense { gate, up, down } => {
                vec![&l.wq, &l.wk, &l.wv, &l.wo, gate, up, down]
            }
            // A token reads the router and `n_used` experts.
            lamina_model::Ffn::Moe(ex) => {
                let used = cfg.moe.map_or(1, |m| m.n_used);
                let mut v = vec![&l.wq, &l.wk, &l.wv, &l.wo, &ex.router];
                for e in 0..used.min(ex.gate.len()) {
                    v.extend([&ex.gate[e], &ex.up[e], &ex.down[e]]);
                }
                v
            }
        };
        total += block.iter().map(|m| m.data.len()).sum::<usize>();
        mats.extend(block);
        if total >= 1 << 30 {
            break;
        }
    }
    let widest = mats.iter().map(|m| m.rows.max(m.cols)).max().unwrap_or(1);
    let x = vec![0.5f32; widest];
    let mut y = vec![0.0f32; widest];
    let pass = |y: &mut [f32]| -> anyhow::Result<()> {
        for m in &mats {
            m.matmul(&x[..m.cols], 1, &mut y[..m.rows])?;
        }
        Ok(())
    };
    let cpu_gbs = rayon::scope(|_| -> anyhow::Result<f64> {
        pass(&mut y)?;
        let t0 = std::time::Instant::now();
        pass(&mut y)?;
        Ok(total as f64 / t0.elapsed().as_secs_f64() / 1e9)
    })?;
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
        gpu_gbs,
        gpu_name,
    })
}

/// Decode tokens/s predicted for a plan: every weight byte is read once per
/// token, each device at its probed speed (the two run one after the other).
/// The embedding lookup reads one row; a tied head on the CPU reads it all.
fn predict(p: &Plan, tied: bool, probe: &Probe) -> Option<f64> {
    let head_on_cpu = p.slots.last().is_some_and(|s| s.device == Device::Cpu);
    let cpu_read =
        p.cpu_weights - p.embd_bytes + if tied && head_on_cpu { p.embd_bytes } else { 0 };
    let mut seconds = cpu_read as f64 / (probe.cpu_gbs * 1e9);
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
        Some(probe(&model)?)
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
            "Probe ({}×4096×4096 mat-vec): CPU {:.2} GB/s; GPU {}",
            pr.ty,
            pr.cpu_gbs,
            match (&pr.gpu_gbs, &pr.gpu_name) {
                (Some(g), Some(n)) => format!("{g:.2} GB/s ({n})"),
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
