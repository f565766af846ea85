//! Layer placement, planned from the header alone before anything is
//! allocated: llama.cpp's current `-ngl` rule and a fitter over a GPU memory
//! budget.
//!
//! Slots `0..n_layer` are the repeating blocks, slot `n_layer` is the output
//! layer (final norm + head). `-ngl N` puts slots `≥ n_layer + 1 − N` on the
//! GPU: `-ngl 1` is the head alone (the largest matrix, moved first),
//! `-ngl k` the head plus the last `k − 1` blocks. The token-embedding lookup
//! always stays on the CPU. A tied head (no `output.weight`) needs its own GPU
//! copy of `token_embd`, so it is counted on the GPU while the map keeps the
//! embedding rows for the lookup.
//!
//! A mixture-of-experts block on the GPU is split (llama.cpp's `--cpu-moe`):
//! its routed experts (`ffn_{gate,up,down}_exps`) stay in host memory and
//! run on the CPU over the mapped blocks, everything else of the block goes
//! to the GPU. That is the default; [`PlanParams::cpu_moe`] (`--n-cpu-moe
//! N`) keeps only the first N blocks' experts in host memory and puts the
//! later offloaded blocks' experts on the GPU with the rest of their block.
//! [`ExpertRule`]s (llama.cpp's `-ot PATTERN=CPU|GPU`) choose per block
//! over both. [`Slot::expert_bytes`] counts what stays in host memory.

use lamina_gguf::{GgmlType, Model};

use crate::config::Config;
use crate::error::ModelError;

/// Where a slot runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Device {
    Cpu,
    Gpu,
}

/// What the plan needs besides the file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PlanParams {
    /// Total context in tokens, shared by all parallel sequences (as llama.cpp's `-c`).
    pub n_ctx: usize,
    /// Sequences decoded together.
    pub n_parallel: usize,
    /// Tokens of a prompt processed per step.
    pub n_batch: usize,
    /// Blocks whose routed experts stay in host memory when the block is
    /// offloaded: the first `cpu_moe` (`--n-cpu-moe`); `usize::MAX`, the
    /// default, for all of them (`--cpu-moe`).
    pub cpu_moe: usize,
}

impl Default for PlanParams {
    fn default() -> Self {
        Self {
            n_ctx: 4096,
            n_parallel: 1,
            n_batch: 512,
            cpu_moe: usize::MAX,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Slot {
    /// `blk.N` or `output`.
    pub name: String,
    pub device: Device,
    /// All of the slot's weights, wherever they are.
    pub weight_bytes: u64,
    /// The routed experts' share of `weight_bytes` that is in host memory:
    /// all of a CPU slot's, and an offloaded block's unless
    /// [`PlanParams::cpu_moe`] sent them to the GPU with it (0 for a dense
    /// block).
    pub expert_bytes: u64,
    pub kv_bytes: u64,
}

impl Slot {
    /// The bytes of this slot's weights in GPU memory.
    pub fn gpu_bytes(&self) -> u64 {
        match self.device {
            Device::Gpu => self.weight_bytes - self.expert_bytes,
            Device::Cpu => 0,
        }
    }

    /// A block on the GPU whose routed experts run on the CPU.
    pub fn is_split(&self) -> bool {
        self.device == Device::Gpu && self.expert_bytes > 0
    }
}

/// A tensor that kept its slot, and every slot before it, off the GPU.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Held {
    pub tensor: String,
    pub ty: GgmlType,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    /// Slots on the GPU (0 ..= n_layer + 1).
    pub ngl: usize,
    /// What `-ngl` asked for (capped at `n_layer + 1`); more than `ngl`
    /// when a tensor of a type without a GPU kernel held slots back.
    pub asked: usize,
    /// The tensors without a GPU kernel in the last slot that stayed on the
    /// CPU because of them (empty when nothing was held back).
    pub held: Vec<Held>,
    pub n_layer: usize,
    pub slots: Vec<Slot>,
    /// The token embedding, always on the CPU (used in place from the map).
    pub embd_bytes: u64,
    /// Activations, attention scores and logits of one step on the GPU (0 when nothing is offloaded).
    pub gpu_scratch: u64,
    pub gpu_weights: u64,
    pub cpu_weights: u64,
    pub gpu_kv: u64,
    pub cpu_kv: u64,
}

impl Plan {
    pub fn gpu_total(&self) -> u64 {
        self.gpu_weights
            .saturating_add(self.gpu_kv)
            .saturating_add(self.gpu_scratch)
    }

    pub fn cpu_total(&self) -> u64 {
        self.cpu_weights.saturating_add(self.cpu_kv)
    }

    /// The routed experts of the blocks on the GPU, in host memory (part
    /// of `cpu_weights`).
    pub fn split_expert_bytes(&self) -> u64 {
        self.slots
            .iter()
            .filter(|s| s.device == Device::Gpu)
            .map(|s| s.expert_bytes)
            .sum()
    }
}

/// llama.cpp's `-ot/--override-tensor PATTERN=BUFFER` for the tensors
/// Lamina places one by one: a block's routed experts
/// (`ffn_{gate,up,down}_exps`), in host memory (`CPU`) or with their
/// offloaded block on the GPU. The pattern is searched for in each tensor
/// name, as llama.cpp does; the first rule that matches a tensor decides
/// it, and a block's three expert tensors stay together (in host memory if
/// any of them is sent there). A rule that matches any other tensor is an
/// error: everything else follows `-ngl`.
#[derive(Clone, Debug)]
pub struct ExpertRule {
    pub pattern: regex::Regex,
    pub device: Device,
}

impl ExpertRule {
    /// `PATTERN=CPU` or `PATTERN=GPU`; llama.cpp's GPU buffer names (CUDA0,
    /// Vulkan0, Metal …) mean the GPU. Several rules are comma-separated
    /// (`-ot "a=CPU,b=GPU"`), as llama.cpp reads them.
    pub fn parse_list(s: &str) -> Result<Vec<Self>, String> {
        s.split(',').map(Self::parse).collect()
    }

    fn parse(rule: &str) -> Result<Self, String> {
        let (pat, buf) = rule
            .rsplit_once('=')
            .ok_or_else(|| format!("-ot {rule:?}: expected PATTERN=CPU or PATTERN=GPU"))?;
        let b = buf.to_ascii_lowercase();
        let device = if b == "cpu" {
            Device::Cpu
        } else if b == "gpu"
            || ["cuda", "vulkan", "metal", "rocm", "hip", "sycl"]
                .iter()
                .any(|g| b.starts_with(g))
        {
            Device::Gpu
        } else {
            return Err(format!(
                "-ot {rule:?}: {buf:?} is not CPU or a GPU (GPU, CUDA0, Vulkan0 …)"
            ));
        };
        let pattern =
            regex::Regex::new(pat).map_err(|e| format!("-ot {rule:?}: bad pattern: {e}"))?;
        Ok(Self { pattern, device })
    }
}

/// What placement needs of a file: each slot's weight bytes (`n_layer + 1`
/// entries), the embedding's, whether the head is tied to the embedding,
/// and each slot's tensors whose type has no GPU kernel.
#[derive(Clone, Debug, Default)]
pub struct Layout {
    pub bytes: Vec<u64>,
    /// Each slot's routed experts' bytes (part of `bytes`).
    pub experts: Vec<u64>,
    /// Slots whose routed experts have a type without a GPU kernel: they
    /// stay in host memory whatever `cpu_moe` says.
    pub experts_cpu_only: Vec<bool>,
    /// Where [`ExpertRule`]s put each slot's routed experts (`None`: as
    /// `cpu_moe` says).
    pub experts_forced: Vec<Option<Device>>,
    pub embd: u64,
    pub tied: bool,
    pub no_kernel: Vec<Vec<Held>>,
}

impl Layout {
    /// Slots at the end that can all go to the GPU: placement offloads a
    /// suffix (llama.cpp's rule), so the last slot with a tensor no kernel
    /// can multiply keeps itself and every slot before it on the CPU.
    fn gpu_capable(&self) -> usize {
        self.no_kernel
            .iter()
            .rev()
            .take_while(|held| held.is_empty())
            .count()
    }
}

/// The placement facts of `model`'s tensors, from the header alone.
pub fn layout(model: &Model, c: &Config) -> Layout {
    let mut l = Layout {
        bytes: vec![0u64; c.n_layer + 1],
        experts: vec![0u64; c.n_layer + 1],
        experts_cpu_only: vec![false; c.n_layer + 1],
        experts_forced: vec![None; c.n_layer + 1],
        no_kernel: vec![Vec::new(); c.n_layer + 1],
        ..Layout::default()
    };
    let mut has_output = false;
    let mut embd_ty = None;
    for t in model.tensors() {
        let name = &t.info.name;
        let bytes = t.info.n_bytes;
        let slot = match name.strip_prefix("blk.") {
            Some(rest) => rest
                .split('.')
                .next()
                .and_then(|n| n.parse::<usize>().ok())
                .filter(|&il| il < c.n_layer),
            None => None,
        };
        let slot = match (slot, name.as_str()) {
            (Some(il), _) => il,
            (None, "token_embd.weight") => {
                l.embd = bytes;
                embd_ty = Some(t.info.ty);
                continue;
            }
            (None, "output.weight") => {
                has_output = true;
                c.n_layer
            }
            // Output norm and anything else outside the blocks (rope factors …)
            // travel with the head.
            _ => c.n_layer,
        };
        l.bytes[slot] += bytes;
        // The routed experts are counted apart: where their block goes,
        // they may not (the router and the shared expert always do).
        if name.contains("_exps.") {
            l.experts[slot] += bytes;
            if !lamina_gpu::has_kernel(t.info.ty) {
                l.experts_cpu_only[slot] = true;
            }
        } else if !lamina_gpu::has_kernel(t.info.ty) {
            l.no_kernel[slot].push(Held {
                tensor: name.clone(),
                ty: t.info.ty,
            });
        }
    }
    // A block with an op that has no GPU arm (the tests' stand-in
    // recurrent block) stays on the CPU, and with it every block before it
    // (placement offloads a suffix).
    for il in (0..c.n_layer).filter(|&il| !crate::program::Program::new(c, il).runs_on_gpu()) {
        let name = format!("blk.{il}.ssm_in.weight");
        if let Some(t) = model.tensor(&name) {
            l.no_kernel[il].push(Held {
                tensor: name,
                ty: t.info.ty,
            });
        }
    }
    if !has_output {
        // A tied head multiplies by its own GPU copy of the embedding.
        l.tied = true;
        l.bytes[c.n_layer] += l.embd;
        if let Some(ty) = embd_ty.filter(|&ty| !lamina_gpu::has_kernel(ty)) {
            l.no_kernel[c.n_layer].push(Held {
                tensor: "token_embd.weight".into(),
                ty,
            });
        }
    }
    l
}

/// [`layout`] with `rules` placing routed experts; an error names a rule
/// that matches a tensor other than a routed expert.
pub fn layout_with(model: &Model, c: &Config, rules: &[ExpertRule]) -> Result<Layout, ModelError> {
    let mut l = layout(model, c);
    if rules.is_empty() {
        return Ok(l);
    }
    for t in model.tensors() {
        let name = &t.info.name;
        let Some(rule) = rules.iter().find(|r| r.pattern.is_match(name)) else {
            continue;
        };
        let block = name
            .strip_prefix("blk.")
            .and_then(|r| r.split('.').next())
            .and_then(|n| n.parse::<usize>().ok())
            .filter(|&il| il < c.n_layer);
        let (Some(il), true) = (block, name.contains("_exps.")) else {
            return Err(ModelError::Placement(format!(
                "-ot {}: Lamina places only routed experts (ffn_*_exps) by name; {name} follows -ngl",
                rule.pattern
            )));
        };
        let forced = &mut l.experts_forced[il];
        if *forced != Some(Device::Cpu) {
            *forced = Some(rule.device);
        }
    }
    Ok(l)
}

impl Layout {
    /// [`plan`] over this layout.
    pub fn plan(&self, c: &Config, ngl: usize, p: &PlanParams) -> Plan {
        plan_from_layout(self, c, ngl, p)
    }

    /// [`fit`] over this layout.
    pub fn fit(&self, c: &Config, budget: u64, p: &PlanParams) -> Plan {
        let usable = budget.saturating_sub(margin(budget));
        (0..=c.n_layer + 1)
            .rev()
            .map(|n| plan_from_layout(self, c, n, p))
            .find(|pl| pl.gpu_total() <= usable)
            .unwrap_or_else(|| plan_from_layout(self, c, 0, p))
    }

    /// [`all_plans`] over this layout.
    pub fn all_plans(&self, c: &Config, p: &PlanParams) -> Vec<Plan> {
        (0..=c.n_layer + 1)
            .map(|n| plan_from_layout(self, c, n, p))
            .collect()
    }
}

/// Bytes of each slot's weights (`n_layer + 1` entries), of the embedding,
/// and whether the head is tied to the embedding.
pub fn slot_bytes(model: &Model, c: &Config) -> (Vec<u64>, u64, bool) {
    let l = layout(model, c);
    (l.bytes, l.embd, l.tied)
}

/// The plan for `-ngl ngl` (values above `n_layer + 1` mean everything).
/// Slots with a tensor of a type the GPU has no kernel for stay on the CPU,
/// and so does every slot before them; the plan names those tensors.
pub fn plan(model: &Model, c: &Config, ngl: usize, p: &PlanParams) -> Plan {
    plan_from_layout(&layout(model, c), c, ngl, p)
}

fn plan_from_layout(l: &Layout, c: &Config, ngl: usize, p: &PlanParams) -> Plan {
    let n_layer = c.n_layer;
    let asked = ngl.min(n_layer + 1);
    let ngl = asked.min(l.gpu_capable());
    // The slot just before the GPU suffix holds it back when it has tensors
    // without a kernel and the user asked for more.
    let held = match (n_layer + 1).checked_sub(ngl + 1) {
        Some(i) if asked > ngl => l.no_kernel.get(i).cloned().unwrap_or_default(),
        _ => Vec::new(),
    };
    let first_gpu = n_layer + 1 - ngl;
    // Saturating: `-c` and `-np` come from the user, and a plan for an
    // absurd context must say "too much", not wrap (the cache itself is
    // counted with checked arithmetic before it is allocated).
    // In the config's cache types (`-ctk` / `-ctv`); a sliding-window
    // layer keeps a ring per sequence (`crate::kv::layer_rows`).
    let per_position = |device| match device {
        Device::Gpu => c.kv.gpu_bytes_per_position(c.kv_dim()),
        Device::Cpu => c.kv.bytes_per_position(c.kv_dim()),
    };
    let n_par = p.n_parallel.max(1);
    let kv_layer = |il: usize, device: Device| {
        let rows = crate::kv::layer_rows(c, il, p.n_ctx / n_par);
        let rows = if rows < p.n_ctx / n_par {
            (rows as u64).saturating_mul(n_par as u64)
        } else {
            p.n_ctx as u64
        };
        rows.saturating_mul(per_position(device))
    };
    // A recurrent layer's state per sequence instead of rows; the first
    // one also carries the sequences' checkpoint budget (`kv/state.rs`).
    let first_recurrent = (0..n_layer).find(|&il| c.is_recurrent(il));
    let state = |il: usize| -> u64 { (c.state_len(il) as u64 * 4).saturating_mul(n_par as u64) };
    // The checkpoints are host memory, wherever their layers run.
    let budget = |il: usize| -> u64 {
        if Some(il) == first_recurrent {
            c.kv.checkpoint_bytes.saturating_mul(n_par as u64)
        } else {
            0
        }
    };
    let embd_bytes = l.embd;
    let mut plan = Plan {
        ngl,
        asked,
        held,
        n_layer,
        slots: Vec::with_capacity(n_layer + 1),
        embd_bytes,
        gpu_scratch: 0,
        gpu_weights: 0,
        cpu_weights: embd_bytes,
        gpu_kv: 0,
        cpu_kv: 0,
    };
    for (i, &w) in l.bytes.iter().enumerate() {
        let device = if i >= first_gpu {
            Device::Gpu
        } else {
            Device::Cpu
        };
        // A tied head on the CPU reads the embedding in place: no extra bytes.
        let w = if l.tied && i == n_layer && device == Device::Cpu {
            w - embd_bytes
        } else {
            w
        };
        let (kv, host_state) = if i < n_layer {
            let own = kv_layer(i, device).saturating_add(state(i));
            match device {
                Device::Cpu => (own.saturating_add(budget(i)), 0),
                // The host keeps a copy of a GPU layer's state for the
                // checkpoints (`gpu/arena.rs`), and the checkpoints.
                Device::Gpu => (own, state(i).saturating_add(budget(i))),
            }
        } else {
            (0, 0)
        };
        // Routed experts in host memory: all of a CPU slot's, and an
        // offloaded block's unless `cpu_moe` lets them go with it.
        let experts = l.experts.get(i).copied().unwrap_or(0);
        let in_ram = device == Device::Cpu
            || l.experts_cpu_only.get(i).copied().unwrap_or(false)
            || match l.experts_forced.get(i).copied().flatten() {
                Some(d) => d == Device::Cpu,
                None => i < p.cpu_moe,
            };
        let experts = if in_ram { experts } else { 0 };
        match device {
            Device::Gpu => {
                plan.gpu_weights += w - experts;
                plan.cpu_weights += experts;
                plan.gpu_kv = plan.gpu_kv.saturating_add(kv);
                plan.cpu_kv = plan.cpu_kv.saturating_add(host_state);
            }
            Device::Cpu => {
                plan.cpu_weights += w;
                plan.cpu_kv = plan.cpu_kv.saturating_add(kv);
            }
        }
        plan.slots.push(Slot {
            name: if i < n_layer {
                format!("blk.{i}")
            } else {
                "output".into()
            },
            device,
            weight_bytes: w,
            expert_bytes: experts,
            kv_bytes: kv,
        });
    }
    if ngl > 0 {
        // Routed experts on the GPU: an offloaded block with experts none
        // of which stayed in host memory.
        let gpu_experts = plan.slots.iter().enumerate().any(|(i, s)| {
            s.device == Device::Gpu
                && s.expert_bytes == 0
                && l.experts.get(i).is_some_and(|&x| x > 0)
        });
        plan.gpu_scratch = scratch_bytes(c, p, ngl > 1, gpu_experts);
    }
    plan
}

/// One step's GPU working memory: the activations of a prompt batch through a
/// block (residual, normed input, Q, K, V, attention output, gate, up), the
/// attention partials of a batch over the whole context, and the logits of
/// the parallel sequences with the stages of their top-k selection. An
/// estimate, deliberately generous.
fn scratch_bytes(c: &Config, p: &PlanParams, blocks: bool, gpu_experts: bool) -> u64 {
    let f = 4u64;
    let b = p.n_batch as u64;
    let seqs = p.n_parallel.max(1);
    // Two tensors of stages and the pairs read back (`HybridModel`'s
    // top-k scratch, made by the first sampled step that selects there).
    let top = lamina_gpu::topk_scratch_len(seqs, c.n_vocab, lamina_gpu::TOPK_MAX)
        .saturating_mul(2)
        .saturating_add(seqs.saturating_mul(2 * lamina_gpu::TOPK_MAX));
    let logits = (c.n_vocab as u64 * f)
        .saturating_mul(seqs as u64)
        .saturating_add((top as u64).saturating_mul(f));
    if !blocks {
        return logits.saturating_add(b * c.n_embd as u64 * f);
    }
    // A mixture's readback (input, router logits, shared output) and
    // shared expert besides, and where experts may be on the GPU every
    // (token, slot)'s input, activation, output and ten table words.
    let moe = c.moe.map_or(0, |m| {
        let gpu_experts = if gpu_experts {
            m.n_used * (2 * c.n_embd + m.n_ff_exp + 10)
        } else {
            0
        };
        2 * c.n_embd + m.n_expert + 3 * m.n_ff_shared.unwrap_or(0) + gpu_experts
    });
    let acts = (3 * c.n_embd + 2 * c.q_dim() + 2 * c.kv_dim() + 2 * c.n_ff + moe) as u64;
    // The attention partials: head_dim + 4 values per head and chunk.
    let scores = lamina_gpu::attention_scratch_len(1, c.n_head, c.head_dim, p.n_ctx) as u64;
    (b * f)
        .saturating_mul(acts.saturating_add(scores))
        .saturating_add(logits)
}

/// The safety margin kept free of a budget: wgpu reports no free memory, and
/// drivers, other programs and fragmentation take their share.
pub fn margin(budget: u64) -> u64 {
    (budget / 10).min(1 << 30)
}

/// The largest `-ngl` whose GPU total fits in `budget` less the margin.
/// Slots that cannot go to the GPU (no kernel for a tensor) are never
/// counted as fitting.
pub fn fit(model: &Model, c: &Config, budget: u64, p: &PlanParams) -> Plan {
    layout(model, c).fit(c, budget, p)
}

/// Every `-ngl` from 0 to all.
/// Every `-ngl` from 0 to all (a plan past what the kernels allow repeats
/// the largest one that they do, with `asked` saying what was asked).
pub fn all_plans(model: &Model, c: &Config, p: &PlanParams) -> Vec<Plan> {
    layout(model, c).all_plans(c, p)
}

/// `1.50 GiB`, `12.00 MiB`, `512 B`.
pub fn human_size(b: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{b} B")
    } else {
        format!("{v:.2} {}", UNITS[u])
    }
}

/// Parses `6GiB`, `512MiB`, `8GB`, `1.5G`, or a plain byte count.
pub fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim();
    let split = s
        .find(|ch: char| !(ch.is_ascii_digit() || ch == '.'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let v: f64 = num.parse().ok()?;
    let mul: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kib" => 1024.0,
        "kb" => 1e3,
        "m" | "mib" => 1024.0 * 1024.0,
        "mb" => 1e6,
        "g" | "gib" => 1024.0 * 1024.0 * 1024.0,
        "gb" => 1e9,
        "t" | "tib" => 1024f64.powi(4),
        "tb" => 1e12,
        _ => return None,
    };
    let bytes = v * mul;
    (bytes.is_finite() && bytes >= 0.0 && bytes < 2f64.powi(63)).then_some(bytes as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(n_layer: usize) -> Config {
        Config {
            arch: crate::Arch::Llama,
            n_layer,
            n_embd: 64,
            n_head: 4,
            n_head_kv: 2,
            head_dim: 16,
            n_ff: 128,
            n_vocab: 1000,
            context_length: 2048,
            rms_eps: 1e-5,
            rope_dim: 16,
            rope_base: 1e4,
            rope_neox: false,
            sliding_window: None,
            rope_base_swa: 1e4,
            rope_scale: 1.0,
            rope_factors: None,
            long_rope: None,
            rope_mscale: 1.0,
            embed_scale: None,
            qk_norm: false,
            post_norms: false,
            qkv_bias: false,
            activation: crate::Activation::SwiGlu,
            attn_scale: 0.25,
            kv: Default::default(),
            moe: None,
            recurrent: None,
            attn_gate: false,
            n_layer_nextn: 0,
        }
    }

    fn layout(bytes: &[u64], embd: u64, tied: bool) -> Layout {
        Layout {
            bytes: bytes.to_vec(),
            experts: vec![0; bytes.len()],
            experts_cpu_only: vec![false; bytes.len()],
            experts_forced: vec![None; bytes.len()],
            embd,
            tied,
            no_kernel: vec![Vec::new(); bytes.len()],
        }
    }

    fn plan_from_bytes(
        bytes: &[u64],
        embd: u64,
        tied: bool,
        c: &Config,
        ngl: usize,
        p: &PlanParams,
    ) -> Plan {
        plan_from_layout(&layout(bytes, embd, tied), c, ngl, p)
    }

    #[test]
    fn a_slot_without_kernels_keeps_itself_and_those_before_it_on_the_cpu() {
        let c = cfg(4);
        let p = PlanParams::default();
        let mut l = layout(&[10, 20, 30, 40, 500], 7, false);
        let iq = Held {
            tensor: "blk.1.ffn_down.weight".into(),
            ty: GgmlType::Q8_1,
        };
        l.no_kernel[1].push(iq.clone());
        use Device::*;
        let all = plan_from_layout(&l, &c, 99, &p);
        let dev: Vec<Device> = all.slots.iter().map(|s| s.device).collect();
        assert_eq!(dev, [Cpu, Cpu, Gpu, Gpu, Gpu]);
        assert_eq!((all.ngl, all.asked), (3, 5));
        assert_eq!(all.held, [iq]);
        assert_eq!(all.cpu_weights, 7 + 10 + 20);
        // Asking for no more than the kernels allow holds nothing back.
        let two = plan_from_layout(&l, &c, 2, &p);
        assert_eq!((two.ngl, two.asked), (2, 2));
        assert!(two.held.is_empty());
        // A head without a kernel keeps everything on the CPU.
        l.no_kernel[4].push(Held {
            tensor: "output.weight".into(),
            ty: GgmlType::Q8K,
        });
        let none = plan_from_layout(&l, &c, 99, &p);
        assert_eq!((none.ngl, none.gpu_total()), (0, 0));
        assert_eq!(none.held[0].tensor, "output.weight");
        // fit never counts a held slot as fitting, however large the budget.
        assert!((0..=5).all(|n| plan_from_layout(&l, &c, n, &p).ngl == 0));
    }

    #[test]
    fn an_offloaded_blocks_routed_experts_stay_in_host_memory() {
        let c = cfg(2);
        let p = PlanParams::default();
        let mut l = layout(&[100, 100, 50], 7, false);
        l.experts = vec![60, 60, 0];
        let all = plan_from_layout(&l, &c, 3, &p);
        assert_eq!(all.ngl, 3);
        assert_eq!(all.gpu_weights, 40 + 40 + 50);
        assert_eq!(all.cpu_weights, 7 + 60 + 60);
        assert_eq!(all.split_expert_bytes(), 120);
        assert!(all.slots[0].is_split() && all.slots[1].is_split());
        assert!(!all.slots[2].is_split());
        assert_eq!(all.slots[0].gpu_bytes(), 40);
        // A block on the CPU holds its experts as its other weights.
        let two = plan_from_layout(&l, &c, 2, &p);
        assert_eq!(two.gpu_weights, 40 + 50);
        assert_eq!(two.cpu_weights, 7 + 100 + 60);
        assert_eq!(two.split_expert_bytes(), 60);
        assert!(!two.slots[0].is_split());
        assert_eq!(two.slots[0].gpu_bytes(), 0);
        // --n-cpu-moe 1: block 1's experts go to the GPU with their block.
        let n1 = PlanParams { cpu_moe: 1, ..p };
        let all = plan_from_layout(&l, &c, 3, &n1);
        assert_eq!(all.gpu_weights, 40 + 100 + 50);
        assert_eq!(all.cpu_weights, 7 + 60);
        assert!(all.slots[0].is_split() && !all.slots[1].is_split());
        assert_eq!(all.slots[1].gpu_bytes(), 100);
        // -ot: block 0's experts on the GPU, block 1's in RAM, whatever
        // cpu_moe says.
        l.experts_forced = vec![Some(Device::Gpu), Some(Device::Cpu), None];
        let ot = plan_from_layout(&l, &c, 3, &n1);
        assert!(!ot.slots[0].is_split() && ot.slots[1].is_split());
        l.experts_forced = vec![None; 3];
        // Unless their type has no GPU kernel.
        l.experts_cpu_only[1] = true;
        let held = plan_from_layout(&l, &c, 3, &n1);
        assert!(held.slots[1].is_split());
        assert_eq!(held.cpu_weights, 7 + 60 + 60);
    }

    #[test]
    fn ngl_follows_llama_cpp_rule() {
        let c = cfg(4);
        let bytes = [10, 20, 30, 40, 500];
        let p = PlanParams::default();
        let dev = |n| -> Vec<Device> {
            plan_from_bytes(&bytes, 7, false, &c, n, &p)
                .slots
                .iter()
                .map(|s| s.device)
                .collect()
        };
        use Device::*;
        assert_eq!(dev(0), [Cpu, Cpu, Cpu, Cpu, Cpu]);
        assert_eq!(dev(1), [Cpu, Cpu, Cpu, Cpu, Gpu]);
        assert_eq!(dev(2), [Cpu, Cpu, Cpu, Gpu, Gpu]);
        assert_eq!(dev(5), [Gpu, Gpu, Gpu, Gpu, Gpu]);
        assert_eq!(dev(99), dev(5));
        let pl = plan_from_bytes(&bytes, 7, false, &c, 2, &p);
        assert_eq!(pl.gpu_weights, 540);
        assert_eq!(pl.cpu_weights, 67);
        // Keys and values of 32 values a position, 2 bytes each in f16.
        assert_eq!(pl.gpu_kv, 2 * 4096 * 32 * 2);
        assert_eq!(pl.cpu_kv, 3 * 2 * 4096 * 32 * 2);
        let f32_cache = Config {
            kv: crate::KvTypes::uniform(crate::KvType::F32),
            ..c.clone()
        };
        let pl = plan_from_bytes(&bytes, 7, false, &f32_cache, 2, &p);
        assert_eq!(pl.gpu_kv, 2 * 4096 * 32 * 4);
        // q8_0: a block of keys and one of values a position and layer,
        // 34 bytes each on the host, 36 on the GPU (one layer there).
        let q8_cache = Config {
            kv: crate::KvTypes::uniform(crate::KvType::Q8_0),
            ..c.clone()
        };
        let pl = plan_from_bytes(&bytes, 7, false, &q8_cache, 2, &p);
        assert_eq!(pl.gpu_kv, 4096 * 2 * 36);
        assert_eq!(pl.cpu_kv, 3 * 4096 * 2 * 34);
        assert_eq!(plan_from_bytes(&bytes, 7, false, &c, 0, &p).gpu_total(), 0);
    }

    #[test]
    fn gpu_total_grows_with_ngl() {
        let c = cfg(4);
        let bytes = [10, 20, 30, 40, 500];
        let p = PlanParams::default();
        let totals: Vec<u64> = (0..=5)
            .map(|n| plan_from_bytes(&bytes, 7, false, &c, n, &p).gpu_total())
            .collect();
        assert!(totals.windows(2).all(|w| w[0] < w[1]), "{totals:?}");
    }

    #[test]
    fn override_rules_parse_as_llama_cpp_writes_them() {
        let r = ExpertRule::parse_list(r"blk\.[0-9]\.ffn_.*_exps=CPU,exps=CUDA0").unwrap();
        assert_eq!((r[0].device, r[1].device), (Device::Cpu, Device::Gpu));
        assert!(r[0].pattern.is_match("blk.3.ffn_up_exps.weight"));
        assert!(!r[0].pattern.is_match("blk.13.ffn_up_exps.weight"));
        assert!(ExpertRule::parse_list("exps")
            .unwrap_err()
            .contains("PATTERN=CPU"));
        assert!(ExpertRule::parse_list("exps=RAM")
            .unwrap_err()
            .contains("not CPU"));
        assert!(ExpertRule::parse_list("(=CPU")
            .unwrap_err()
            .contains("bad pattern"));
    }

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("6GiB"), Some(6 << 30));
        assert_eq!(parse_size("512MiB"), Some(512 << 20));
        assert_eq!(parse_size("8GB"), Some(8_000_000_000));
        assert_eq!(parse_size("1.5G"), Some(3 << 29));
        assert_eq!(parse_size("1234"), Some(1234));
        assert_eq!(parse_size("lots"), None);
        assert_eq!(parse_size("1e400G"), None);
    }
}
