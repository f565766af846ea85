//! `lamina fit`: how many layers of a model fit a GPU memory budget, planned
//! from the header and tensor table alone (no tensor byte is read).

use std::path::Path;

use lamina_gguf::{LoadMode, Model};
use lamina_model::plan::{self, PlanParams};
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
    pub json: bool,
}

pub fn run(a: FitArgs<'_>) -> anyhow::Result<()> {
    let model = Model::open(a.file, LoadMode::Mmap)?;
    let cfg = Config::from_gguf(&model)?;
    let params = |n_ctx| PlanParams {
        n_ctx,
        n_parallel: a.n_parallel,
        ..PlanParams::default()
    };
    let main_ctx = a.n_ctx.unwrap_or(cfg.context_length.min(4096));
    let plans = plan::all_plans(&model, &cfg, &params(main_ctx));
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
    let recommend = |budget, n_ctx| plan::fit(&model, &cfg, budget, &params(n_ctx));

    if a.json {
        let rows: Vec<_> = plans
            .iter()
            .map(|p| {
                json!({"ngl": p.ngl, "gpu_bytes": p.gpu_total(), "cpu_bytes": p.cpu_total(),
                       "kv_bytes": p.gpu_kv + p.cpu_kv, "gpu_weight_bytes": p.gpu_weights,
                       "gpu_kv_bytes": p.gpu_kv, "gpu_scratch_bytes": p.gpu_scratch})
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
                   "rows": rows, "recommended_ngl": main.ngl, "fits": fits})
        );
        return Ok(());
    }

    println!(
        "{}: {} with {} blocks + output layer; KV cache f32; {} parallel",
        a.file.display(),
        cfg.arch.name(),
        cfg.n_layer,
        a.n_parallel
    );
    println!("\nAt context {main_ctx}:");
    println!(
        "  {:>4}  {:>11}  {:>11}  {:>11}  {:>11}  {:>11}",
        "-ngl", "GPU weights", "GPU KV", "GPU scratch", "GPU total", "CPU total"
    );
    for p in &plans {
        println!(
            "  {:>4}  {:>11}  {:>11}  {:>11}  {:>11}  {:>11}",
            p.ngl,
            human_size(p.gpu_weights),
            human_size(p.gpu_kv),
            human_size(p.gpu_scratch),
            human_size(p.gpu_total()),
            human_size(p.cpu_total())
        );
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
