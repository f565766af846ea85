//! Loading a model the way a user asked: choose the GPU adapter, plan the
//! placement (`-ngl N|auto|all`, a GPU memory budget) before any GPU
//! allocation, describe the plan as a table, then upload the offloaded layers
//! straight from the map. `lamina run`, `bench` and `serve` all load here.

use std::fmt::Write as _;
use std::str::FromStr;
use std::sync::Arc;

use lamina_gguf::Model;
use lamina_gpu::{Gpu, GpuOptions};

use crate::config::Config;
use crate::cpu::CpuModel;
use crate::error::ModelError;
use crate::gpu::HybridModel;
use crate::kv::{KvType, KvTypes};
use crate::plan::{self, human_size, Device, Plan, PlanParams};

/// Budget assumed by `-ngl auto` when `--gpu-memory` is not given and the
/// driver does not say how much memory is free (wgpu reports limits, not
/// free memory; Vulkan drivers with `VK_EXT_memory_budget` do): the
/// smallest common discrete card, rather than risk an out-of-memory on the
/// first prompt.
pub const DEFAULT_AUTO_BUDGET: u64 = 4 << 30;

/// `-ngl auto`'s budget and where it came from: `--gpu-memory` if given,
/// else the memory the driver says is free on the device, else
/// [`DEFAULT_AUTO_BUDGET`].
pub fn auto_budget(given: Option<u64>, free: Option<u64>) -> (u64, &'static str) {
    match (given, free) {
        (Some(b), _) => (b, "--gpu-memory"),
        (None, Some(f)) => (f, "free on the device, as its driver reports"),
        (None, None) => (
            DEFAULT_AUTO_BUDGET,
            "assumed: the driver does not report free memory; --gpu-memory sets it",
        ),
    }
}

/// `-ngl`: a number of slots (blocks + the output layer), `all`, or `auto`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ngl {
    Auto,
    All,
    Layers(usize),
}

impl FromStr for Ngl {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(Ngl::Auto),
            "all" => Ok(Ngl::All),
            n => n
                .parse()
                .map(Ngl::Layers)
                .map_err(|_| format!("{n:?} is not a number of layers, `all` or `auto`")),
        }
    }
}

pub struct LoadArgs {
    pub ngl: Ngl,
    pub gpu_memory: Option<u64>,
    pub n_ctx: usize,
    pub n_parallel: usize,
    /// The KV cache's element types (`-ctk` / `-ctv`).
    pub kv: KvTypes,
    /// Offloaded blocks whose routed experts stay in host memory: the
    /// first `cpu_moe` ([`PlanParams::cpu_moe`]; `usize::MAX` for all).
    pub cpu_moe: usize,
    /// `-ot` rules for the routed experts, over `cpu_moe` ([`plan::ExpertRule`]).
    pub experts: Vec<plan::ExpertRule>,
    /// A device already open (a program embedding the engine, or a test
    /// that holds it); `None` opens one as `ngl` asks.
    pub gpu: Option<Arc<Gpu>>,
}

/// Opens the GPU for `-ngl`: `auto` uses only hardware adapters (a software
/// rasteriser such as lavapipe is slower than the CPU path), an explicit
/// count uses whatever adapter there is.
fn open_gpu(ngl: Ngl) -> Result<Option<Arc<Gpu>>, ModelError> {
    if ngl == Ngl::Layers(0) {
        return Ok(None);
    }
    let adapters = lamina_gpu::list_adapters();
    let hardware = adapters.iter().any(|a| a.compute && a.device_type != "cpu");
    if ngl == Ngl::Auto && !hardware {
        return Ok(None);
    }
    match Gpu::new(GpuOptions::default()) {
        Ok(g) => Ok(Some(Arc::new(g))),
        Err(e) if ngl == Ngl::Auto => {
            eprintln!("lamina: no usable GPU ({e}); running on the CPU");
            Ok(None)
        }
        Err(e) => Err(ModelError::OpenGpu(e)),
    }
}

/// Chooses the plan for `-ngl` within the budget, before anything is allocated.
pub fn choose_plan(
    model: &Model,
    cfg: &Config,
    a: &LoadArgs,
    gpu: Option<&lamina_gpu::AdapterInfo>,
) -> Result<Plan, ModelError> {
    let have_gpu = gpu.is_some();
    let params = PlanParams {
        n_ctx: a.n_ctx,
        n_parallel: a.n_parallel,
        cpu_moe: a.cpu_moe,
        ..PlanParams::default()
    };
    let all = cfg.n_layer + 1;
    let layout = plan::layout_with(model, cfg, &a.experts)?;
    if !have_gpu {
        return Ok(layout.plan(cfg, 0, &params));
    }
    let p = match a.ngl {
        Ngl::Auto => {
            let free = gpu.and_then(|g| g.free_memory);
            layout.fit(cfg, auto_budget(a.gpu_memory, free).0, &params)
        }
        Ngl::All => layout.plan(cfg, all, &params),
        Ngl::Layers(n) => layout.plan(cfg, n, &params),
    };
    if let (Some(budget), Ngl::All | Ngl::Layers(_)) = (a.gpu_memory, a.ngl) {
        let usable = budget.saturating_sub(plan::margin(budget));
        if p.gpu_total() > usable {
            return Err(ModelError::Placement(format!(
                "-ngl {} needs {} of GPU memory (weights {}, KV cache {}, scratch {}) but the budget \
                 allows {} ({} less a margin of {}); `lamina fit` shows what fits",
                p.ngl,
                human_size(p.gpu_total()),
                human_size(p.gpu_weights),
                human_size(p.gpu_kv),
                human_size(p.gpu_scratch),
                human_size(usable),
                human_size(budget),
                human_size(plan::margin(budget))
            )));
        }
    }
    Ok(p)
}

/// The placement table, printed at load as llama.cpp prints its buffers.
pub fn plan_table(p: &Plan, device: &str) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "placement ({device}):");
    let _ = writeln!(
        out,
        "  {:<10} {:<6} {:>12} {:>12}",
        "slot", "device", "weights", "KV cache"
    );
    let _ = writeln!(
        out,
        "  {:<10} {:<6} {:>12} {:>12}",
        "token_embd",
        "CPU",
        human_size(p.embd_bytes),
        "-"
    );
    // Runs of consecutive slots on one device, so 30 blocks are not 30 lines.
    let mut i = 0;
    while i < p.slots.len() {
        let s = &p.slots[i];
        let mut j = i;
        let (mut w, mut x, mut kv) = (0u64, 0u64, 0u64);
        while j < p.slots.len()
            && p.slots[j].device == s.device
            && (p.slots[j].name == "output") == (s.name == "output")
            && p.slots[j].is_split() == s.is_split()
        {
            // A block on the GPU counts there without its routed experts,
            // which get a line of their own on the CPU.
            let sj = &p.slots[j];
            match sj.device {
                Device::Gpu => {
                    w += sj.gpu_bytes();
                    x += sj.expert_bytes;
                }
                Device::Cpu => w += sj.weight_bytes,
            }
            kv = kv.saturating_add(sj.kv_bytes);
            j += 1;
        }
        let name = if j - i == 1 {
            s.name.clone()
        } else {
            format!("blk.{}-{}", i, j - 1)
        };
        let dev = match s.device {
            Device::Cpu => "CPU",
            Device::Gpu => "GPU",
        };
        let _ = writeln!(
            out,
            "  {name:<10} {dev:<6} {:>12} {:>12}",
            human_size(w),
            human_size(kv)
        );
        if x > 0 {
            let _ = writeln!(
                out,
                "  {name:<10} {:<6} {:>12} {:>12}  routed experts (ffn_*_exps) in system RAM",
                "CPU",
                human_size(x),
                "-"
            );
        }
        i = j;
    }
    let _ = writeln!(
        out,
        "  GPU: weights {}, KV {}, scratch {}, total {}; CPU: weights {}, KV {}",
        human_size(p.gpu_weights),
        human_size(p.gpu_kv),
        human_size(p.gpu_scratch),
        human_size(p.gpu_total()),
        human_size(p.cpu_weights),
        human_size(p.cpu_kv)
    );
    out.push_str(&summary(p));
    if let Some(held) = held_note(p) {
        out.push('\n');
        out.push_str(&held);
    }
    out
}

/// Why fewer slots went to the GPU than `-ngl` asked: the tensors without a
/// GPU kernel in the last slot held back (placement offloads a suffix, so
/// it keeps every slot before it too). `None` when nothing was held.
pub fn held_note(p: &Plan) -> Option<String> {
    if p.held.is_empty() {
        return None;
    }
    let slot = p.n_layer.checked_sub(p.ngl)?;
    let name = p.slots.get(slot).map_or("?", |s| s.name.as_str());
    // A block of one quantization type lists all its matrices: name a few.
    const SHOWN: usize = 3;
    let mut tensors: Vec<String> = p
        .held
        .iter()
        .take(SHOWN)
        .map(|h| format!("{} ({})", h.tensor, h.ty))
        .collect();
    if p.held.len() > SHOWN {
        tensors.push(format!("{} more", p.held.len() - SHOWN));
    }
    let before = if slot == 0 {
        ""
    } else {
        " and every slot before it"
    };
    Some(format!(
        "  {name}{before} stayed on the CPU: no GPU kernel for {} (-ngl asked {}, placed {})",
        tensors.join(", "),
        p.asked,
        p.ngl
    ))
}

/// `offloaded 12/31 layers to GPU`, as llama.cpp says it.
pub fn summary(p: &Plan) -> String {
    let on_gpu = p.slots.iter().filter(|s| s.device == Device::Gpu).count();
    format!(
        "offloaded {on_gpu}/{} layers to GPU ({} GPU, {} CPU)",
        p.n_layer + 1,
        human_size(p.gpu_total()),
        human_size(p.cpu_total())
    )
}

/// Builds the model as `a` asks; returns it with the plan's table.
pub fn load<'m>(model: &'m Model, a: &LoadArgs) -> Result<(HybridModel<'m>, String), ModelError> {
    load_with_progress(model, a, &|_, _| {})
}

/// [`load`], reporting upload progress as `(bytes done, bytes total)`.
pub fn load_with_progress<'m>(
    model: &'m Model,
    a: &LoadArgs,
    progress: &dyn Fn(u64, u64),
) -> Result<(HybridModel<'m>, String), ModelError> {
    let mut cpu = CpuModel::load(model)?;
    cpu.config.kv = a.kv;
    cpu.config.kv.check_head(cpu.config.head_dim)?;
    let gpu = match &a.gpu {
        Some(g) if a.ngl != Ngl::Layers(0) => Some(g.clone()),
        _ => open_gpu(a.ngl)?,
    };
    let info = gpu.as_ref().map(|g| g.adapter_info());
    let mut p = choose_plan(model, &cpu.config, a, info)?;
    let mut kv_note = String::new();
    let gpu_layers = p
        .slots
        .iter()
        .any(|s| s.device == Device::Gpu && s.name != "output");
    if let (Some(g), true) = (&gpu, gpu_layers) {
        let kv = cpu.config.kv;
        if !g.has_f16() && (kv.k == KvType::F16 || kv.v == KvType::F16) {
            // f16 caches need f16 in the shaders; this device's caches take
            // f32, so the whole cache does (one type, one count of bytes).
            let f32 = |t| if t == KvType::F16 { KvType::F32 } else { t };
            cpu.config.kv = KvTypes {
                k: f32(kv.k),
                v: f32(kv.v),
                ..kv
            };
            kv_note = " (f16 asked; this GPU's shaders have no f16, so f32)".to_string();
            p = choose_plan(model, &cpu.config, a, info)?;
        }
        crate::gpu::gpu_kv(&cpu.config)?;
    }
    let device = info.map_or("no GPU".to_owned(), |i| i.name.clone());
    let mut table = plan_table(&p, &device);
    // The cache's types under the table's header: its last line stays the
    // "offloaded N/M layers" summary that clients show.
    let at = table.find('\n').map_or(table.len(), |i| i + 1);
    table.insert_str(at, &format!("  KV cache: {}{kv_note}\n", cpu.config.kv));
    if let (Ngl::Auto, Some(i)) = (a.ngl, info) {
        let (budget, source) = auto_budget(a.gpu_memory, i.free_memory);
        let _ = writeln!(
            table,
            "-ngl auto: fitted to {} ({source})",
            human_size(budget)
        );
    }
    let gpu = if p.ngl > 0 { gpu } else { None };
    Ok((HybridModel::with_progress(cpu, p, gpu, progress)?, table))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_budget_prefers_the_flag_then_the_driver_then_the_guess() {
        let gib = 1 << 30;
        assert_eq!(auto_budget(Some(3 * gib), Some(9 * gib)).0, 3 * gib);
        let (b, source) = auto_budget(None, Some(9 * gib));
        assert_eq!(b, 9 * gib);
        assert!(source.contains("driver"), "{source}");
        let (b, source) = auto_budget(None, None);
        assert_eq!(b, DEFAULT_AUTO_BUDGET);
        assert!(source.contains("--gpu-memory"), "{source}");
    }
}
