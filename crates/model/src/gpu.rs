//! The forward pass with the last layers (and the output head) on the GPU
//! and the rest on the CPU, as a [`Plan`] places them.
//!
//! Placement always offloads a suffix (llama.cpp's `-ngl` rule), so a step
//! crosses the CPU→GPU boundary once: the embedding lookup and the CPU blocks
//! run first, the hidden state is uploaded, and every GPU block plus the head
//! is recorded into one command buffer, submitted once, with one readback (the
//! logits). Each layer's KV cache lives on the device of its layer.
//!
//! A mixture-of-experts block on the GPU records its attention, norms,
//! router logits and shared expert (qwen2moe) like any block's. A split
//! block (llama.cpp's `--cpu-moe`, the default) then ends the submission:
//! the normed feed-forward input, the router's logits and the shared
//! expert's output come back in one readback, the CPU routes (the CPU
//! path's own code, so a token's result is still its own) and runs the
//! chosen experts over the mapped blocks ([`crate::cpu`]'s
//! `routed_experts`): the activations cross once each way.
//!
//! A block whose experts are on the GPU (`--n-cpu-moe`) keeps each kind of
//! expert matrix in one weight (split between bindings only between
//! experts) and routes on the device (lamina_gpu's
//! `moe_route`, the CPU's routing to the last bits of the device's exp).
//! A step of at most eight tokens (decoding; one on a CPU-backed device,
//! see `route_on_device_tokens`) then runs every (token, slot) pair's
//! products over its own expert from the router's run tables
//! (`matmul_runs`) and weighs them in slot order (`moe_weigh`), all in the
//! same submission: no wait for the host. A larger step (a prompt) packs
//! the pairs by expert on the device (`moe_pack`, indirect dispatches), so
//! each expert streams once for all its tokens, still in the same
//! submission ([`DeviceExperts`]; the host packs only a step too large for
//! the packing kernel, from the device's choices read back). The choices and each
//! column's bits are the same every way, so a token's result never depends
//! on its step. A shared expert (qwen2moe) is gated on the device too
//! (`moe_shared`), its output added after the routed experts' sum; the sum
//! feeds the residual add.
//!
//! The GPU layers' caches of sequences created together
//! ([`HybridModel::new_caches`], as the server does for its slots) share one
//! buffer per layer, a slot of rows each, so a step that carries several of
//! them runs RoPE, the cache writes and attention once for all: a token
//! table gives each token its position and cache row.

use std::sync::{Arc, Mutex};

use lamina_gpu::{
    topk_value, Attention, Batch, Columns, Fuse, Gate, Gpu, KvElem, MatmulKernel, NormAfter,
    QkvLayout, Rope, RopeOut, Runs, Tensor, TokenRow, TokenTable, Weight, WordCopy, ARGMAX_MAX_LEN,
    ARGMAX_NONE, TOPK_MAX, TOPK_NONE,
};

use crate::block::Block;
use crate::config::{Activation, Config};
use crate::cpu::{CpuModel, KvCache, Logits};
use crate::error::ModelError;
use crate::kv::KvType;
use crate::plan::{Device, Plan};
use crate::weights::{Ffn, Layer, Matrix};

mod scratch;

use scratch::{Pool, Scratch, Shape};

/// What a step reads back from the GPU: the logits, only each sequence's
/// argmax of them (greedy decoding), or its argmax and its `k` best logits
/// (top-k sampling, [`HybridModel::forward_multi_top`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Readback {
    Logits,
    Argmax,
    Top(usize),
}

/// A GPU step's result, as [`Readback`] asked: logits (one sequence's, or
/// several packed one after another), each sequence's pick, or its pick
/// and candidates.
#[derive(Debug)]
enum Stepped {
    Logits(Vec<f32>),
    Picks(Vec<u32>),
    Top(Vec<Candidates>),
}

/// One sequence's result of a step, as [`Readback`] asked.
#[derive(Debug)]
enum Next {
    Logits(Vec<f32>),
    Pick(u32),
    Top(Candidates),
}

/// A sequence's next-token candidates from a step of
/// [`HybridModel::forward_multi_top`]: what a greedy or a top-k sampler
/// needs of its logits.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Candidates {
    /// The argmax of the logits, as lamina_sampling's `argmax` (ties to the
    /// lowest id, NaN never chosen, 0 when every logit is NaN).
    pub argmax: u32,
    /// The best logits with their ids, as lamina_sampling's `top_entries`
    /// gives them: best first in IEEE total order, ties to the lower id,
    /// NaN left out; fewer than asked where the row has fewer numbers.
    pub best: Vec<(u32, f32)>,
}

/// The error for a step that read back another thing than was asked: a
/// bug, reported rather than turned into a wrong token.
fn misread() -> ModelError {
    ModelError::Gpu("a step read back another result than it was asked for".into())
}

impl Stepped {
    fn into_logits(self) -> Result<Vec<f32>, ModelError> {
        match self {
            Stepped::Logits(l) => Ok(l),
            Stepped::Picks(_) | Stepped::Top(_) => Err(misread()),
        }
    }
}

impl Next {
    fn into_logits(self) -> Result<Vec<f32>, ModelError> {
        match self {
            Next::Logits(l) => Ok(l),
            Next::Pick(_) | Next::Top(_) => Err(misread()),
        }
    }

    fn into_pick(self) -> Result<u32, ModelError> {
        match self {
            Next::Pick(p) => Ok(p),
            Next::Logits(_) | Next::Top(_) => Err(misread()),
        }
    }

    fn into_top(self) -> Result<Candidates, ModelError> {
        match self {
            Next::Top(t) => Ok(t),
            Next::Logits(_) | Next::Pick(_) => Err(misread()),
        }
    }
}

/// Weights whose products one step needs side by side (Q, K and V; gate
/// and up), stacked by rows so one dispatch streams them all: one weight
/// when the parts share a type, else one per part, each writing its rows of
/// the same stacked output.
struct Stacked {
    parts: Vec<Weight>,
    rows: usize,
}

impl Stacked {
    fn upload(gpu: &Gpu, ms: &[&Matrix<'_>]) -> Result<Self, ModelError> {
        let rows = ms.iter().map(|m| m.rows).sum();
        let (ty, cols) = (ms[0].ty, ms[0].cols);
        let parts = if ms.iter().all(|m| m.ty == ty && m.cols == cols) {
            let data: Vec<(usize, &[u8])> = ms.iter().map(|m| (m.rows, m.data)).collect();
            vec![gpu
                .upload_stacked(ty, cols, &data)
                .map_err(|e| ModelError::Gpu(format!("{}: {e}", ms[0].name)))?]
        } else {
            ms.iter()
                .map(|m| upload_matrix(gpu, m))
                .collect::<Result<_, _>>()?
        };
        Ok(Stacked { parts, rows })
    }

    /// `y = W x` for `n` packed columns of `x`; `y` gets `rows` values per
    /// column. With a `fuse`, each part's dispatch folds it in (only where
    /// [`Batch::fuses`]).
    fn record(
        &self,
        b: &mut Batch<'_>,
        x: &Tensor,
        y: &Tensor,
        n: usize,
        fuse: Option<Fuse<'_>>,
    ) -> Result<(), lamina_gpu::GpuError> {
        self.record_from(b, x, y, 0, n, fuse)
    }

    /// [`Stacked::record`] for columns `first..first + n` of `x` and `y`.
    fn record_from(
        &self,
        b: &mut Batch<'_>,
        x: &Tensor,
        y: &Tensor,
        first: usize,
        n: usize,
        fuse: Option<Fuse<'_>>,
    ) -> Result<(), lamina_gpu::GpuError> {
        let mut at = first * self.rows;
        for w in &self.parts {
            let cols = Columns {
                n,
                x_offset: first * w.cols(),
                x_stride: w.cols(),
                y_offset: at,
                y_stride: self.rows,
            };
            match fuse {
                Some(f) => b.matmul_fused(w, x, y, cols, f)?,
                None => b.matmul_strided(MatmulKernel::Auto, w, x, y, cols)?,
            }
            at += w.rows();
        }
        Ok(())
    }
}

struct GpuLayer {
    attn_norm: Tensor,
    /// Q, K and V stacked: each token's product row is
    /// `[q (q_dim), k (kv_dim), v (kv_dim)]`.
    qkv: Stacked,
    /// The Q, K and V biases (qwen2), concatenated in the same order.
    bqkv: Option<Tensor>,
    wo: Weight,
    q_norm: Option<Tensor>,
    k_norm: Option<Tensor>,
    post_attn_norm: Option<Tensor>,
    ffn_norm: Tensor,
    ffn: GpuFfn,
    post_ffn_norm: Option<Tensor>,
}

/// A GPU block's feed-forward part.
enum GpuFfn {
    Dense {
        /// Gate and up stacked: `[gate (n_ff), up (n_ff)]` per token.
        gate_up: Stacked,
        down: Weight,
    },
    /// A mixture of experts: the router, the shared expert's gate/up and
    /// down (qwen2moe), and the routed experts where they are on the GPU
    /// (`--n-cpu-moe`; `None` where they run on the CPU, a split block).
    Split {
        router: Weight,
        shared: Option<(Stacked, Weight)>,
        /// The shared expert's gate vector (`ffn_gate_inp_shexp`), for
        /// its gate on the device (`moe_shared`).
        shared_gate: Option<Tensor>,
        experts: Option<Box<GpuExperts>>,
    },
}

/// A block's routed experts on the GPU, each kind one weight of every
/// expert's rows in expert order (lamina_gpu's `matmul_runs` picks an
/// expert per run of columns; a weight larger than a binding is split
/// between experts, a dispatch each): gate and up stacked per expert,
/// `[gate_x; up_x]`, so one product gives each pair its activation; then
/// down.
struct GpuExperts {
    gate_up: Weight,
    down: Weight,
}

/// Most tokens a step runs its experts for straight from the device's
/// router's one-column runs: each (token, slot) pair then streams its
/// expert's weights by itself, which costs a GPU no more than packing
/// while the pairs are few (decoding); more tokens are packed by expert,
/// so each expert streams once for all its tokens. On a CPU-backed device,
/// whose products are bound by arithmetic rather than by the weight reads,
/// two pairs that chose one expert cost twice its work unless packed
/// together: there only a lone token (whose experts are distinct) skips
/// the packing. Measured on lavapipe with a synthetic qwen3moe (32
/// experts, 4 used), four sequences decode 44–46 tokens/s packed, 35–37
/// unpacked. Either way the bits are the same.
fn route_on_device_tokens(g: &Gpu) -> usize {
    if g.adapter_info().device_type == "cpu" {
        1
    } else {
        lamina_gpu::MAX_SMALL_COLS
    }
}

/// How a block that routes on the device runs its experts in a step.
///
/// A larger step packs its pairs by expert on the device, on a CPU-backed
/// device too: there a packed product's workgroup skips the columns its run
/// lacks (`matvec_rows.wgsl`), so the device's runs cost what the host's
/// exact runs cost without the readback (lavapipe, the synthetic qwen3moe,
/// pp32 97–105 tokens/s packed on the device against 100–104 on the host,
/// four sequences 46–48 against 47–49; 77–90 and 38–42 before the kernel
/// skipped those columns). The host packs only what the packing kernel
/// cannot hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum DeviceExperts {
    /// Each (token, slot) pair from the router's own one-column runs.
    Pairs,
    /// The pairs packed by expert on the device (`moe_pack`), in runs of
    /// at most this many columns.
    Packed(usize),
}

impl DeviceExperts {
    /// The way for `n` tokens routed as `r`; `None` where only the host can
    /// pack them (more pairs or runs than the packing kernel holds), or
    /// where `host_packs` asks for the host's packing.
    fn choose(g: &Gpu, r: &lamina_gpu::MoeRouting, n: usize, host_packs: bool) -> Option<Self> {
        if n <= route_on_device_tokens(g) {
            return Some(DeviceExperts::Pairs);
        }
        if host_packs {
            return None;
        }
        // Runs of eight: a workgroup skips the columns a run lacks.
        let (nk, maxc) = (n * r.k, lamina_gpu::MAX_SMALL_COLS);
        (nk < 1 << 21 && r.max_runs(n, maxc) <= u16::MAX as usize)
            .then_some(DeviceExperts::Packed(maxc))
    }
}

impl GpuLayer {
    /// A mixture of experts: the step's submission ends after its router.
    fn is_moe(&self) -> bool {
        matches!(self.ffn, GpuFfn::Split { .. })
    }

    fn gpu_experts(&self) -> Option<&GpuExperts> {
        match &self.ffn {
            GpuFfn::Split { experts, .. } => experts.as_deref(),
            GpuFfn::Dense { .. } => None,
        }
    }
}

struct GpuHead {
    norm: Tensor,
    weight: Weight,
}

/// A model whose layers run where a [`Plan`] put them.
pub struct HybridModel<'a> {
    pub cpu: CpuModel<'a>,
    pub plan: Plan,
    gpu: Option<Arc<Gpu>>,
    /// Blocks `first_gpu..n_layer` are on the GPU.
    first_gpu: usize,
    layers: Vec<GpuLayer>,
    head: Option<GpuHead>,
    /// The steps' scratch buffers, kept across steps of any shape
    /// ([`scratch`]). Held for the whole GPU part of a step, so two steps
    /// never share buffers.
    scratch: Mutex<Option<Pool>>,
    /// Dispatches recorded inside the GPU blocks so far (the rest of a
    /// step's are the first norm and the head): `bench model` prints the
    /// per-block count from it.
    block_dispatches: std::sync::atomic::AtomicU64,
    /// Pack a larger step's experts on the host from the device's choices
    /// ([`HybridModel::pack_experts_on_host`]).
    host_packs: bool,
    /// Where top-k candidates are selected: `None`, by the device's kind
    /// ([`HybridModel::select_top_on_gpu`]).
    top_on_gpu: Option<bool>,
    /// How the GPU layers' caches store keys and values ([`gpu_kv`]).
    gpu_kv: KvElem,
}

/// The GPU layers' keys and values of a set of sequences: per layer one
/// key and one value buffer of `slots` slots of `n_ctx` rows.
#[derive(Debug)]
struct KvArena {
    k: Vec<Tensor>,
    v: Vec<Tensor>,
    n_ctx: usize,
    /// Rows per slot of the sliding-window layers' rings (slot s, position
    /// p at row s · ring + p mod ring), 0 when no GPU layer keeps a ring:
    /// one size for them all (it follows from the window, one per model).
    ring: usize,
    /// Which GPU layers keep a ring.
    is_ring: Vec<bool>,
}

impl KvArena {
    /// The token table and ring size (0: none) of GPU layer `i`.
    fn ring_of(&self, i: usize) -> usize {
        if self.is_ring.get(i).copied().unwrap_or(false) {
            self.ring
        } else {
            0
        }
    }
}

/// How the GPU layers' caches store keys and values: the config's type,
/// the same for both (one element type serves keys and values alike in
/// the kernels; llama.cpp's users pair `-ctk q8_0 -ctv q8_0`).
pub(crate) fn gpu_kv(c: &Config) -> Result<KvElem, ModelError> {
    match (c.kv.k, c.kv.v) {
        (KvType::F32, KvType::F32) => Ok(KvElem::F32),
        (KvType::F16, KvType::F16) => Ok(KvElem::F16),
        (KvType::Q8_0, KvType::Q8_0) => Ok(KvElem::Q8_0),
        _ => Err(ModelError::KvType(format!(
            "layers on the GPU keep keys and values in one type, the same for both; \
             -ctk {} -ctv {} needs -ngl 0",
            c.kv.k, c.kv.v
        ))),
    }
}

/// Keys and values: CPU layers in host memory, GPU layers in a slot of
/// device buffers that other caches made at the same time share.
pub struct HybridCache {
    cpu: KvCache,
    arena: Arc<KvArena>,
    slot: usize,
    len: usize,
    /// What every layer's sliding-window ring still holds.
    rings: crate::kv::Rings,
}

impl HybridCache {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn capacity(&self) -> usize {
        self.arena.n_ctx
    }

    /// Forgets positions `len..` (to reuse a shared prefix), or everything
    /// where a sliding-window ring no longer holds the window before `len`:
    /// [`HybridCache::len`] says what was kept.
    pub fn truncate(&mut self, len: usize) {
        self.len = self.rings.keep(self.len, len);
        self.cpu.truncate(self.len);
    }

    /// Positions `0..len` are written, in every layer.
    fn advance(&mut self, len: usize) {
        self.len = len;
        self.rings.advance(len);
        CpuModel::commit(&mut self.cpu, len);
    }
}

/// Values per token a split block reads back (see `Scratch::moe_io`).
fn moe_io_width(c: &Config, m: &crate::config::Moe) -> usize {
    let shared = if m.n_ff_shared.is_some() { c.n_embd } else { 0 };
    c.n_embd + m.n_expert + shared
}

fn upload_matrix(gpu: &Gpu, m: &Matrix<'_>) -> Result<Weight, ModelError> {
    gpu.upload_weight(m.ty, m.rows, m.cols, m.data)
        .map_err(|e| ModelError::Gpu(format!("{}: {e}", m.name)))
}

fn upload_vec(gpu: &Gpu, v: &[f32]) -> Result<Tensor, ModelError> {
    gpu.upload_f32(v).map_err(gpu_err)
}

fn upload_opt(gpu: &Gpu, v: &Option<Vec<f32>>) -> Result<Option<Tensor>, ModelError> {
    v.as_deref().map(|v| upload_vec(gpu, v)).transpose()
}

fn gpu_err(e: lamina_gpu::GpuError) -> ModelError {
    ModelError::Gpu(e.to_string())
}

/// Uploads a block's routed experts as two weights: `[gate_x; up_x]` for
/// every expert `x` in order, then the down projections, each split between
/// bindings only between experts where the device's largest binding does
/// not hold them all (`Gpu::upload_matrices`: a dispatch per binding). The
/// bytes go from the map to the device, expert by expert.
fn upload_experts(gpu: &Gpu, ex: &crate::weights::Experts<'_>) -> Result<GpuExperts, ModelError> {
    // `per`: matrices an expert stacks (gate and up: 2).
    let stack = |ms: Vec<&Matrix<'_>>, per: usize| -> Result<Weight, ModelError> {
        let Some(first) = ms.first() else {
            return Err(ModelError::Gpu("a mixture without experts".into()));
        };
        let (name, ty, cols) = (&first.name, first.ty, first.cols);
        let mat_rows = ms.iter().take(per).map(|m| m.rows).sum();
        if ms.len() % per != 0
            || ms
                .iter()
                .enumerate()
                .any(|(i, m)| m.ty != ty || m.cols != cols || m.rows != ms[i % per].rows)
        {
            return Err(ModelError::Gpu(format!(
                "{name}: the routed experts on the GPU need one type and shape for their \
                 gate and up (or down) matrices; keep them on the CPU (--cpu-moe)"
            )));
        }
        let parts: Vec<(usize, &[u8])> = ms.iter().map(|m| (m.rows, m.data)).collect();
        gpu.upload_matrices(ty, cols, &parts, mat_rows)
            .map_err(|e| match e {
                lamina_gpu::GpuError::TooLarge { .. } => ModelError::Gpu(format!(
                    "{name}: one expert exceeds the device's largest binding ({e}); keep \
                     the experts on the CPU (--cpu-moe or --n-cpu-moe)"
                )),
                e => ModelError::Gpu(format!("{name}: {e}")),
            })
    };
    let gate_up = ex
        .gate
        .iter()
        .zip(&ex.up)
        .flat_map(|(g, u)| [g, u])
        .collect();
    Ok(GpuExperts {
        gate_up: stack(gate_up, 2)?,
        down: stack(ex.down.iter().collect(), 1)?,
    })
}

/// Uploads block `l`; a mixture's routed experts only with `experts` (else
/// they stay in the map, see the module header).
fn upload_layer(gpu: &Gpu, l: &Layer<'_>, experts: bool) -> Result<GpuLayer, ModelError> {
    let ffn = match &l.ffn {
        Ffn::Dense { gate, up, down } => GpuFfn::Dense {
            gate_up: Stacked::upload(gpu, &[gate, up])?,
            down: upload_matrix(gpu, down)?,
        },
        Ffn::Moe(ex) => GpuFfn::Split {
            router: upload_matrix(gpu, &ex.router)?,
            shared: match &ex.shared {
                Some((_, g, u, d)) => {
                    Some((Stacked::upload(gpu, &[g, u])?, upload_matrix(gpu, d)?))
                }
                None => None,
            },
            shared_gate: ex
                .shared
                .as_ref()
                .map(|(g, ..)| upload_vec(gpu, g))
                .transpose()?,
            experts: if experts {
                Some(Box::new(upload_experts(gpu, ex)?))
            } else {
                None
            },
        },
    };
    let bqkv = match (&l.bq, &l.bk, &l.bv) {
        (Some(q), Some(k), Some(v)) => Some(upload_vec(gpu, &[&q[..], k, v].concat())?),
        _ => None,
    };
    Ok(GpuLayer {
        attn_norm: upload_vec(gpu, &l.attn_norm)?,
        qkv: Stacked::upload(gpu, &[&l.wq, &l.wk, &l.wv])?,
        bqkv,
        wo: upload_matrix(gpu, &l.wo)?,
        q_norm: upload_opt(gpu, &l.q_norm)?,
        k_norm: upload_opt(gpu, &l.k_norm)?,
        post_attn_norm: upload_opt(gpu, &l.post_attn_norm)?,
        ffn_norm: upload_vec(gpu, &l.ffn_norm)?,
        ffn,
        post_ffn_norm: upload_opt(gpu, &l.post_ffn_norm)?,
    })
}

/// One sequence of a GPU step: its tokens are `first..first + n` of the
/// step's packed activations, at positions `pos0..`, over its own cache.
struct Segment<'c> {
    first: usize,
    n: usize,
    pos0: usize,
    cache: &'c HybridCache,
}

impl<'a> HybridModel<'a> {
    /// Uploads the GPU part of `plan` straight from the mapped weights. With
    /// `plan.ngl == 0`, or no `gpu`, everything runs on the CPU.
    pub fn new(cpu: CpuModel<'a>, plan: Plan, gpu: Option<Arc<Gpu>>) -> Result<Self, ModelError> {
        Self::with_progress(cpu, plan, gpu, &|_, _| {})
    }

    /// [`HybridModel::new`], calling `progress(bytes uploaded, bytes to upload)`
    /// after each layer goes to the GPU.
    pub fn with_progress(
        cpu: CpuModel<'a>,
        plan: Plan,
        gpu: Option<Arc<Gpu>>,
        progress: &dyn Fn(u64, u64),
    ) -> Result<Self, ModelError> {
        let n_layer = cpu.config.n_layer;
        let first_gpu = plan
            .slots
            .iter()
            .position(|s| s.device == Device::Gpu)
            .unwrap_or(n_layer + 1)
            .min(n_layer);
        let offload = plan.ngl > 0;
        let gpu = if offload {
            Some(gpu.ok_or_else(|| {
                ModelError::Gpu("the plan offloads layers but no GPU was given".into())
            })?)
        } else {
            None
        };
        let mut layers = Vec::new();
        let mut head = None;
        let mut kv = KvElem::F32;
        if let (Some(g), true) = (&gpu, first_gpu < n_layer) {
            kv = gpu_kv(&cpu.config)?;
            if kv == KvElem::F16 && !g.has_f16() {
                return Err(ModelError::KvType(
                    "this GPU has no f16 in its shaders (SHADER_F16): use -ctk f32 -ctv f32".into(),
                ));
            }
        }
        if let Some(g) = &gpu {
            let total = plan.gpu_weights;
            let mut done = 0;
            for (l, slot) in cpu.weights.layers[first_gpu..]
                .iter()
                .zip(&plan.slots[first_gpu..])
            {
                layers.push(upload_layer(g, l, !slot.is_split())?);
                done += slot.gpu_bytes();
                progress(done, total);
            }
            head = Some(GpuHead {
                norm: upload_vec(g, &cpu.weights.output_norm)?,
                weight: upload_matrix(g, &cpu.weights.output)?,
            });
            progress(total, total);
        }
        Ok(Self {
            cpu,
            plan,
            gpu,
            first_gpu: if offload { first_gpu } else { n_layer },
            layers,
            head,
            scratch: Mutex::new(None),
            block_dispatches: Default::default(),
            host_packs: false,
            top_on_gpu: None,
            gpu_kv: kv,
        })
    }

    /// Dispatches recorded inside GPU blocks since load (see the field).
    pub fn block_dispatches(&self) -> u64 {
        self.block_dispatches
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    pub fn config(&self) -> &Config {
        &self.cpu.config
    }

    pub fn gpu(&self) -> Option<&Gpu> {
        self.gpu.as_deref()
    }

    pub fn new_cache(&self, n_ctx: usize) -> Result<HybridCache, ModelError> {
        let mut v = self.new_caches(1, n_ctx)?;
        v.pop()
            .ok_or_else(|| ModelError::Gpu("no cache was made".into()))
    }

    /// `count` caches of `n_ctx` positions whose GPU layers share buffers
    /// (as many slots per buffer as the device's binding limit allows), so
    /// a step over several of them runs RoPE, the cache writes and
    /// attention once per layer instead of once per sequence.
    pub fn new_caches(&self, count: usize, n_ctx: usize) -> Result<Vec<HybridCache>, ModelError> {
        let c = &self.cpu.config;
        // Every host byte of every cache, counted before the first is made
        // and compared with what the machine can give.
        let host = crate::memory::kv_host_bytes(c, count, self.first_gpu, n_ctx)?;
        crate::memory::check_host(host, self.host_reserve(count))?;
        let slot_values = n_ctx
            .checked_mul(c.kv_dim())
            .ok_or(ModelError::KvOverflow {
                count,
                n_ctx,
                n_layers: c.n_layer,
            })?;
        // Element indices are u32 in the shaders, and a buffer is one binding.
        let per_arena = match self.gpu.as_deref() {
            Some(g) if self.first_gpu < c.n_layer => {
                // Less a little for the slack every tensor gets.
                let words = g.binding_limit().saturating_sub(1 << 16) / 4;
                let limit = self.gpu_kv.values(words.try_into().unwrap_or(usize::MAX));
                let limit = limit.min(u32::MAX as usize);
                (limit / slot_values.max(1)).max(1)
            }
            _ => count.max(1),
        };
        let mut out = Vec::new();
        // `count` is the user's `-np`: even with every layer on the GPU (no
        // host cache bytes) a huge one is an error, not an abort.
        out.try_reserve_exact(count)
            .map_err(|_| ModelError::Alloc {
                bytes: (count as u64).saturating_mul(std::mem::size_of::<HybridCache>() as u64),
            })?;
        while out.len() < count {
            let slots = per_arena.min(count - out.len());
            let rows: Vec<usize> = (self.first_gpu..c.n_layer)
                .map(|il| crate::kv::layer_rows(c, il, n_ctx))
                .collect();
            let is_ring: Vec<bool> = rows.iter().map(|&r| r < n_ctx).collect();
            let ring = rows
                .iter()
                .copied()
                .filter(|&r| r < n_ctx)
                .min()
                .unwrap_or(0);
            if rows.iter().any(|&r| r < n_ctx && r != ring) {
                return Err(ModelError::KvType(
                    "sliding-window layers of different windows on the GPU: use --swa-full".into(),
                ));
            }
            let mut arena = KvArena {
                k: Vec::new(),
                v: Vec::new(),
                n_ctx,
                ring,
                is_ring,
            };
            if let Some(g) = self.gpu.as_deref() {
                let values = slots
                    .checked_mul(slot_values)
                    .ok_or(ModelError::KvOverflow {
                        count,
                        n_ctx,
                        n_layers: c.n_layer,
                    })?;
                for (li, &r) in rows.iter().enumerate() {
                    // A ring layer's buffers hold `ring` rows per slot (no
                    // more than n_ctx: within `values`).
                    let words = if arena.is_ring[li] {
                        self.gpu_kv.words(slots * r * c.kv_dim())
                    } else {
                        self.gpu_kv.words(values)
                    };
                    arena.k.push(g.tensor(words).map_err(gpu_err)?);
                    arena.v.push(g.tensor(words).map_err(gpu_err)?);
                }
            }
            let arena = Arc::new(arena);
            for slot in 0..slots {
                out.push(HybridCache {
                    cpu: KvCache::for_layers(c, n_ctx, self.first_gpu)?,
                    arena: arena.clone(),
                    slot,
                    len: 0,
                    rings: crate::kv::Rings::new(c, n_ctx),
                });
            }
        }
        Ok(out)
    }

    /// A cache's positions as bytes (llama-server's slot save): a header
    /// naming the model's and the cache's geometry, then every layer's rows
    /// in use in their stored type, the GPU layers' read back from the
    /// device. [`HybridModel::restore_cache`] takes them into a cache of
    /// this model loaded the same way.
    pub fn save_cache(&self, cache: &HybridCache) -> Result<Vec<u8>, ModelError> {
        let c = &self.cpu.config;
        let kvd = c.kv_dim();
        let mut out = self.cache_header(cache);
        out.extend_from_slice(&(cache.len as u64).to_le_bytes());
        cache.cpu.save_state(kvd, &mut out);
        if let Some(g) = self.gpu.as_deref() {
            let arena = &cache.arena;
            let mut runs = Vec::with_capacity(2 * arena.k.len());
            for i in 0..arena.k.len() {
                let (off, words) = self.slot_words(cache, i);
                runs.push((&arena.k[i], off, words));
                runs.push((&arena.v[i], off, words));
            }
            // Read back together (one submission, not one per tensor).
            for run in g.read_runs(&runs).map_err(gpu_err)? {
                crate::kv::put_run(&mut out, &run);
            }
        }
        Ok(out)
    }

    /// Makes `dst` hold the first `len` positions of `src` (all it holds
    /// when `len` is more), as [`HybridModel::save_cache`],
    /// [`HybridModel::restore_cache`] and a truncation would, without the
    /// host round trip and moving only those positions (and a
    /// sliding-window layer's whole ring): the host layers' rows are copied
    /// in memory and the GPU layers' on the device, in one submission. A
    /// server lends one slot's prompt start to another this way. Where a
    /// ring no longer holds the window before `len`, `dst` keeps less, as
    /// [`HybridCache::truncate`] says. The caches must have the same
    /// geometry (this model's slots do). On failure `dst` is left empty.
    pub fn copy_cache(
        &self,
        src: &HybridCache,
        dst: &mut HybridCache,
        len: usize,
    ) -> Result<(), ModelError> {
        let r = self.copy_inner(src, dst, len.min(src.len));
        if r.is_err() {
            dst.truncate(0);
        }
        r
    }

    fn copy_inner(
        &self,
        src: &HybridCache,
        dst: &mut HybridCache,
        len: usize,
    ) -> Result<(), ModelError> {
        if self.cache_header(src) != self.cache_header(dst)
            || src.arena.k.len() != dst.arena.k.len()
        {
            return Err(ModelError::KvType(
                "a slot can only be copied into a cache of the same size and placement".into(),
            ));
        }
        dst.cpu.copy_from(self.cpu.config.kv_dim(), &src.cpu, len)?;
        if let Some(g) = self.gpu.as_deref() {
            let mut runs = Vec::with_capacity(2 * src.arena.k.len());
            for i in 0..src.arena.k.len() {
                let (src_at, words) = self.slot_run(src.slot, len, i, &src.arena);
                let (dst_at, _) = self.slot_run(dst.slot, len, i, &dst.arena);
                for (s, d) in [
                    (&src.arena.k[i], &dst.arena.k[i]),
                    (&src.arena.v[i], &dst.arena.v[i]),
                ] {
                    runs.push(WordCopy {
                        src: s,
                        src_at,
                        dst: d,
                        dst_at,
                        len: words,
                    });
                }
            }
            g.copy_words(&runs).map_err(gpu_err)?;
        }
        // Positions `len..` of `src` were not copied: cut to `len`, which
        // also checks that the rings still hold the window before it.
        dst.len = src.len;
        dst.rings = src.rings;
        dst.truncate(len);
        Ok(())
    }

    /// Loads [`HybridModel::save_cache`]'s bytes into `cache`; returns the
    /// positions it now holds. Fails, leaving the cache empty, when they
    /// come from another model, another cache type or size, or another
    /// placement, or are cut short.
    pub fn restore_cache(
        &self,
        cache: &mut HybridCache,
        state: &[u8],
    ) -> Result<usize, ModelError> {
        let header = self.cache_header(cache);
        let r = self.restore_inner(cache, state, &header);
        if r.is_err() {
            cache.truncate(0);
        }
        r
    }

    fn restore_inner(
        &self,
        cache: &mut HybridCache,
        state: &[u8],
        header: &[u8],
    ) -> Result<usize, ModelError> {
        let bad = |why: &str| ModelError::KvType(format!("a saved slot {why}"));
        let Some(mut data) = state.strip_prefix(header) else {
            return Err(bad(
                "was saved with another model, cache type, context size or placement",
            ));
        };
        let (len, rest) = data
            .split_first_chunk::<8>()
            .ok_or_else(|| bad("is cut short"))?;
        let len = usize::try_from(u64::from_le_bytes(*len)).map_err(|_| bad("is mis-sized"))?;
        data = rest;
        if len > cache.capacity() {
            return Err(bad("holds more positions than this slot"));
        }
        let kvd = self.cpu.config.kv_dim();
        cache.cpu.restore_state(kvd, len, &mut data)?;
        cache.len = len;
        cache.rings = crate::kv::Rings::default_for(&cache.rings, len);
        if let Some(g) = self.gpu.as_deref() {
            for i in 0..cache.arena.k.len() {
                let (off, words) = self.slot_words(cache, i);
                for t in [&cache.arena.k[i], &cache.arena.v[i]] {
                    let run = crate::kv::take_run(&mut data).ok_or_else(|| bad("is cut short"))?;
                    if run.len() != words * 4 {
                        return Err(bad("is mis-sized"));
                    }
                    g.write_words(t, off, run).map_err(gpu_err)?;
                }
            }
        }
        if !data.is_empty() {
            return Err(bad("has bytes past its cache"));
        }
        Ok(len)
    }

    /// What a saved cache must match: the model's shape, the cache's
    /// types, size and layout, and which layers are on the GPU.
    fn cache_header(&self, cache: &HybridCache) -> Vec<u8> {
        let c = &self.cpu.config;
        let mut h = b"LMKV\x01\x00\x00\x00".to_vec();
        for v in [
            c.n_layer,
            c.kv_dim(),
            self.first_gpu,
            cache.capacity(),
            cache.arena.ring,
            c.kv.k as usize,
            c.kv.v as usize,
            usize::from(c.kv.swa_full),
            self.gpu_kv as usize,
        ] {
            h.extend_from_slice(&(v as u64).to_le_bytes());
        }
        h
    }

    /// GPU layer `i`'s 32-bit words of `cache`'s slot in use: (offset,
    /// count). A ring layer's whole ring, else rows `0..len`.
    fn slot_words(&self, cache: &HybridCache, i: usize) -> (usize, usize) {
        self.slot_run(cache.slot, cache.len, i, &cache.arena)
    }

    /// [`HybridModel::slot_words`] of slot `slot` of `arena` as if it held
    /// `len` positions.
    fn slot_run(&self, slot: usize, len: usize, i: usize, arena: &KvArena) -> (usize, usize) {
        let kvd = self.cpu.config.kv_dim();
        let ring = arena.ring_of(i);
        let (per_slot, rows) = if ring > 0 {
            (ring, ring)
        } else {
            (arena.n_ctx, len)
        };
        let word = |values: usize| self.gpu_kv.words(values);
        (word(slot * per_slot * kvd), word(rows * kvd))
    }

    /// Host bytes kept free beside `count` caches. The CPU weights, when
    /// they are used in place from the map: their pages are page cache,
    /// which `MemAvailable` counts as free, and a cache that took them would
    /// have every step read the file again (with `--no-mmap` they are
    /// already anonymous memory, outside `MemAvailable`). Then one step's
    /// activations over a 512-token batch and each sequence's logits, and
    /// [`crate::memory::RUNTIME_RESERVE`] for threads, the allocator and
    /// the rest of the process.
    fn host_reserve(&self, count: usize) -> u64 {
        let c = &self.cpu.config;
        let weights = if self.cpu.mapped {
            self.plan.cpu_weights
        } else {
            0
        };
        let per_token = (4 * c.n_embd + 2 * c.q_dim() + 2 * c.kv_dim() + 3 * c.n_ff) as u64;
        let f = std::mem::size_of::<f32>() as u64;
        let acts = 512 * per_token * f;
        let logits = (count as u64).saturating_mul(c.n_vocab as u64 * f);
        weights
            .saturating_add(acts)
            .saturating_add(logits)
            .saturating_add(crate::memory::RUNTIME_RESERVE)
    }

    /// Runs `tokens` at positions `cache.len()..` and returns the logits
    /// `which` asks for, `n_vocab` per position.
    pub fn forward(
        &self,
        tokens: &[u32],
        cache: &mut HybridCache,
        which: Logits,
    ) -> Result<Vec<f32>, ModelError> {
        let limit = crate::kv::max_step(&self.cpu.config, cache.capacity());
        crate::cpu::split_steps(tokens.len(), limit, which, |r, w| {
            crate::cpu::in_pool(|| self.forward_here(&tokens[r], cache, w))
        })
    }

    fn forward_here(
        &self,
        tokens: &[u32],
        cache: &mut HybridCache,
        which: Logits,
    ) -> Result<Vec<f32>, ModelError> {
        let n = tokens.len();
        let pos0 = cache.len;
        self.cpu.check_room(n, pos0, cache.capacity())?;
        let mut x = self.cpu.embed(tokens)?;
        let mut scratch = crate::cpu::Scratch::default();
        for il in 0..self.first_gpu {
            self.cpu
                .layer(il, &mut x, n, pos0, &mut cache.cpu, &mut scratch)?;
        }
        let logits = match (self.gpu.as_deref(), &self.head) {
            (Some(g), Some(head)) => self.gpu_part(g, head, &x, n, pos0, cache, which)?,
            _ => self.cpu.head(&x, n, which)?,
        };
        cache.advance(pos0 + n);
        Ok(logits)
    }

    /// One step for several sequences, returning each one's last logits.
    /// With every layer on the CPU they go through the weights together
    /// ([`CpuModel::forward_multi`]); with a GPU part, the CPU layers run per
    /// sequence and the GPU layers take every sequence in one submission:
    /// each weight is streamed once for all of them (the small-N and tiled
    /// kernels), and RoPE and attention take every sequence whose cache
    /// shares buffers with the others ([`HybridModel::new_caches`]) in one
    /// dispatch each, every token at its own position over its own rows.
    /// Either way each sequence gets the bits it would get alone.
    pub fn forward_multi(
        &self,
        work: &mut [(&[u32], &mut HybridCache)],
    ) -> Result<Vec<Vec<f32>>, ModelError> {
        self.run_multi(work, Readback::Logits, Next::into_logits)
    }

    /// Whether [`HybridModel::forward_multi_argmax`] can run: the head is
    /// on the GPU, where the logits are reduced.
    pub fn argmax_on_gpu(&self) -> bool {
        self.gpu.is_some() && self.head.is_some() && self.cpu.config.n_vocab <= ARGMAX_MAX_LEN
    }

    /// [`HybridModel::forward_multi`] for sequences that pick their next
    /// token greedily from the raw logits: each one's argmax (ties to the
    /// lowest id, NaN never chosen, 0 when every logit is NaN, as
    /// lamina_sampling's `argmax`), reduced on the GPU so the step reads
    /// back two words per sequence instead of its `n_vocab` logits. Fails
    /// without running anything unless [`HybridModel::argmax_on_gpu`].
    pub fn forward_multi_argmax(
        &self,
        work: &mut [(&[u32], &mut HybridCache)],
    ) -> Result<Vec<u32>, ModelError> {
        if !self.argmax_on_gpu() {
            return Err(ModelError::Gpu(
                "the greedy pick is reduced on the GPU, and this model's head is not there".into(),
            ));
        }
        self.run_multi(work, Readback::Argmax, Next::into_pick)
    }

    /// The largest `k` [`HybridModel::forward_multi_top`] takes, where it
    /// runs: the head is on the GPU, and the device is one whose readback
    /// costs what a selection there saves. A CPU-backed device (lavapipe)
    /// copies the logits at memory speed and the host selects 0.1 ms a
    /// sequence at Gemma 3's vocabulary, far less than its sorting network
    /// ([`HybridModel::select_top_on_gpu`] overrides the choice, for the
    /// tests and for comparisons).
    pub fn top_on_gpu(&self) -> Option<usize> {
        let g = self.gpu.as_deref()?;
        let by_kind = g.adapter_info().device_type != "cpu";
        (self.argmax_on_gpu() && self.top_on_gpu.unwrap_or(by_kind)).then_some(TOPK_MAX)
    }

    /// Whether [`HybridModel::top_on_gpu`] selects on the GPU (where the
    /// head is there): always, never, or (`None`, the default) on any
    /// device that is not CPU-backed.
    pub fn select_top_on_gpu(&mut self, on: Option<bool>) {
        self.top_on_gpu = on;
    }

    /// [`HybridModel::forward_multi`] for sequences that need only their
    /// argmax or their `k` best logits (greedy and top-k samplers with no
    /// bias or penalty): both, selected on the GPU, so the step reads back
    /// `2 + 2k` words per sequence instead of its `n_vocab` logits (a
    /// megabyte at Gemma 3's vocabulary). The same ids and bits the host
    /// gets from the logits. Fails without running anything unless
    /// [`HybridModel::top_on_gpu`] takes `k`.
    pub fn forward_multi_top(
        &self,
        work: &mut [(&[u32], &mut HybridCache)],
        k: usize,
    ) -> Result<Vec<Candidates>, ModelError> {
        if self.top_on_gpu().is_none_or(|max| !(1..=max).contains(&k)) {
            return Err(ModelError::Gpu(format!(
                "top-{k} candidates are selected on a GPU that holds the head, for k up to \
                 {TOPK_MAX}"
            )));
        }
        self.run_multi(work, Readback::Top(k), Next::into_top)
    }

    /// A multi-sequence step in rounds no cache's limit exceeds, each
    /// sequence's result taken out of its [`Next`] by `take`.
    fn run_multi<T: Default + Send>(
        &self,
        work: &mut [(&[u32], &mut HybridCache)],
        read: Readback,
        take: fn(Next) -> Result<T, ModelError>,
    ) -> Result<Vec<T>, ModelError> {
        let limit = work
            .iter()
            .map(|(_, c)| crate::kv::max_step(&self.cpu.config, c.capacity()))
            .min()
            .unwrap_or(usize::MAX);
        crate::cpu::in_pool(|| {
            crate::cpu::split_multi(work, limit, |w| {
                self.forward_multi_here(w, read)?
                    .into_iter()
                    .map(take)
                    .collect()
            })
        })
    }

    fn forward_multi_here(
        &self,
        work: &mut [(&[u32], &mut HybridCache)],
        read: Readback,
    ) -> Result<Vec<Next>, ModelError> {
        let (Some(g), Some(head)) = (self.gpu.as_deref(), &self.head) else {
            if read != Readback::Logits {
                return Err(ModelError::Gpu("no GPU to reduce the logits on".into()));
            }
            let mut inner: Vec<(&[u32], &mut KvCache)> =
                work.iter_mut().map(|(t, c)| (*t, &mut c.cpu)).collect();
            let out = self.cpu.forward_multi(&mut inner)?;
            for (t, c) in work.iter_mut() {
                let len = c.len + t.len();
                c.len = len;
                c.rings.advance(len);
            }
            return Ok(out.into_iter().map(Next::Logits).collect());
        };
        if let ([(t, c)], Readback::Logits) = (&mut *work, read) {
            return Ok(vec![Next::Logits(self.forward_here(t, c, Logits::Last)?)]);
        }
        let mut xs = Vec::new();
        let mut firsts = Vec::with_capacity(work.len());
        let mut scratch = crate::cpu::Scratch::default();
        for (tokens, cache) in work.iter_mut() {
            let (n, pos0) = (tokens.len(), cache.len);
            self.cpu.check_room(n, pos0, cache.capacity())?;
            let mut x = self.cpu.embed(tokens)?;
            for il in 0..self.first_gpu {
                self.cpu
                    .layer(il, &mut x, n, pos0, &mut cache.cpu, &mut scratch)?;
            }
            firsts.push(xs.len() / self.cpu.config.n_embd);
            xs.extend_from_slice(&x);
        }
        let segments: Vec<Segment<'_>> = work
            .iter()
            .zip(&firsts)
            .map(|((t, c), &first)| Segment {
                first,
                n: t.len(),
                pos0: c.len,
                cache: c,
            })
            .collect();
        let out = self.gpu_step(g, head, &xs, &segments, Logits::Last, read)?;
        let v = self.cpu.config.n_vocab;
        for (t, c) in work.iter_mut() {
            let len = c.len + t.len();
            c.advance(len);
        }
        Ok(match out {
            Stepped::Logits(flat) => flat
                .chunks_exact(v)
                .map(|l| Next::Logits(l.to_vec()))
                .collect(),
            Stepped::Picks(picks) => picks.into_iter().map(Next::Pick).collect(),
            Stepped::Top(rows) => rows.into_iter().map(Next::Top).collect(),
        })
    }

    #[allow(clippy::too_many_arguments)]
    fn gpu_part(
        &self,
        g: &Gpu,
        head: &GpuHead,
        x: &[f32],
        n: usize,
        pos0: usize,
        cache: &HybridCache,
        which: Logits,
    ) -> Result<Vec<f32>, ModelError> {
        let seg = Segment {
            first: 0,
            n,
            pos0,
            cache,
        };
        self.gpu_step(g, head, x, &[seg], which, Readback::Logits)?
            .into_logits()
    }

    /// The GPU layers and the head for `segments` packed in `x`, in one
    /// submission. One segment returns the logits `which` asks for; several
    /// return each segment's last logits, one after another. With
    /// [`Readback::Argmax`] (and `which` [`Logits::Last`]) each segment's
    /// argmax instead.
    fn gpu_step(
        &self,
        g: &Gpu,
        head: &GpuHead,
        x: &[f32],
        segments: &[Segment<'_>],
        which: Logits,
        read: Readback,
    ) -> Result<Stepped, ModelError> {
        if read != Readback::Logits && which != Logits::Last {
            return Err(ModelError::Gpu(
                "a greedy pick or top-k is made from the last logits only".into(),
            ));
        }
        let c = &self.cpu.config;
        let n: usize = segments.iter().map(|s| s.n).sum();
        let seqs = segments.len();
        let kv_len = segments.iter().map(|s| s.pos0 + s.n).max().unwrap_or(0);
        let mut held = self.scratch.lock().unwrap_or_else(|e| e.into_inner());
        // Decode steps (one token per sequence) get room for the whole
        // cache, so decoding allocates once; prompt batches get what they
        // need.
        let kv_room = if n == seqs {
            segments
                .iter()
                .map(|s| s.cache.capacity())
                .max()
                .unwrap_or(0)
                .max(kv_len)
        } else {
            kv_len
        };
        let gpu_experts = self.layers.iter().any(|l| l.gpu_experts().is_some());
        let mut s = Pool::step(
            &mut held,
            g,
            c,
            gpu_experts,
            Self::rope_factor_words(c),
            Shape { n, seqs, kv_room },
            matches!(read, Readback::Top(_)),
        )?;
        // The token table: each token's position and its row in its
        // cache's buffers (its slot's first row plus the position).
        // A ring layer's table has each token at its slot's first ring row
        // plus its position mod the ring.
        s.rows.clear();
        s.rows_ring.clear();
        let any_ring = segments.iter().any(|seg| seg.cache.arena.ring > 0);
        for seg in segments {
            let arena = &seg.cache.arena;
            let base = seg.cache.slot * arena.n_ctx;
            for pos in seg.pos0..seg.pos0 + seg.n {
                let (row, pos32) = (u32::try_from(base + pos), u32::try_from(pos));
                let (Ok(row), Ok(pos32)) = (row, pos32) else {
                    return Err(ModelError::Gpu("cache rows beyond u32".into()));
                };
                s.rows.push(TokenRow { row, pos: pos32 });
                if any_ring {
                    let r = arena.ring.max(1);
                    let row = u32::try_from(seg.cache.slot * r + pos % r)
                        .map_err(|_| ModelError::Gpu("cache rows beyond u32".into()))?;
                    s.rows_ring.push(TokenRow { row, pos: pos32 });
                }
            }
        }
        // The step's RoPE divisors: the file's rope_freqs, or LongRoPE's
        // set for its caches' context (one set a step: the slots of a
        // model share their context).
        let factors = c.rope_factors_for(segments[0].cache.arena.n_ctx);
        if segments
            .iter()
            .any(|seg| c.rope_factors_for(seg.cache.arena.n_ctx) != factors)
        {
            return Err(ModelError::Gpu(
                "sequences of one step whose contexts take different LongRoPE factors".into(),
            ));
        }
        let table_words = |rows: &[TokenRow]| -> Vec<u32> {
            let mut flat: Vec<u32> = rows.iter().flat_map(|r| [r.row, r.pos]).collect();
            if let Some(f) = &factors {
                flat.resize(2 * s.n, 0);
                flat.extend(f.get().iter().map(|v| v.to_bits()));
            }
            flat
        };
        g.write_u32(&s.table, &table_words(&s.rows))
            .map_err(gpu_err)?;
        if any_ring {
            g.write_u32(&s.table_ring, &table_words(&s.rows_ring))
                .map_err(gpu_err)?;
        }
        let s = &s;
        g.write_f32(&s.x, x).map_err(gpu_err)?;
        let mut b = g.batch();
        // Each block leaves the hidden state where it found it (in `x`). A
        // fused block (record_layer) norms its inputs in its products'
        // prologues; an unfused one ends in a residual add fused with the
        // RMSNorm that follows (the next block's, or the head's) and leaves
        // that normed input in `h`. `normed` says whether `h` holds it.
        let cur = &s.x;
        let e = c.n_embd;
        // The first block's norm, when it runs alone, counts outside the
        // blocks (as the head's does).
        let mut normed = false;
        if let Some(l) = self.layers.first() {
            if Self::folded_gate_up(&b, l, n).is_none() {
                b.rms_norm(cur, &l.attn_norm, &s.h, e, c.rms_eps)
                    .map_err(gpu_err)?;
                normed = true;
            }
        }
        let mut before = b.len();
        let mut dispatched = 0;
        for (i, l) in self.layers.iter().enumerate() {
            let il = self.first_gpu + i;
            let next_norm = self.layers.get(i + 1).map_or(&head.norm, |l| &l.attn_norm);
            normed = self
                .record_layer(
                    &mut b, il, i, l, next_norm, s, cur, &s.x2, n, segments, normed,
                )
                .map_err(gpu_err)?;
            if l.is_moe() {
                match (self.device_experts(g, l, n), l.gpu_experts()) {
                    // Routed on the device: the experts follow in the same
                    // submission.
                    (Some((r, how)), Some(gx)) => {
                        self.record_device_experts(&mut b, l, gx, r, how, s, n)
                            .map_err(gpu_err)?;
                    }
                    // Else the host routes (or reads the device's routes)
                    // between two submissions; the sum comes back in `o`
                    // for the residual add.
                    // One readback, in the same submission: the input,
                    // the router's logits, the shared output.
                    _ => {
                        dispatched += b.len() - before;
                        let width = c.moe.map_or(0, |m| moe_io_width(c, &m));
                        let io = std::mem::replace(&mut b, g.batch())
                            .submit_read_f32(&s.moe_io, 0, n * width)
                            .map_err(gpu_err)?;
                        self.run_split_experts(g, &mut b, il, l, s, n, io)?;
                        before = 0;
                    }
                }
                let post = l.post_ffn_norm.as_ref();
                let eps = Block::new(c, il).eps;
                b.add_rms_norm(&s.x2, &s.o, post, next_norm, cur, &s.h, e, eps)
                    .map_err(gpu_err)?;
                normed = true;
            }
        }
        dispatched += b.len() - before;
        self.block_dispatches
            .fetch_add(dispatched as u64, std::sync::atomic::Ordering::Relaxed);
        if !normed {
            b.rms_norm(cur, &head.norm, &s.h, e, c.rms_eps)
                .map_err(gpu_err)?;
        }
        // `h` now holds the head's RMSNorm of every token.
        if which == Logits::Hidden {
            if segments.len() != 1 {
                return Err(ModelError::Gpu(
                    "hidden states are read for one sequence at a time".into(),
                ));
            }
            return b
                .submit_read_f32(&s.h, 0, n * e)
                .map(Stepped::Logits)
                .map_err(gpu_err);
        }
        let rows = match segments {
            [_] => n - which.first(n),
            _ => seqs,
        };
        let own;
        let logits = if rows * c.n_vocab > s.logits.len() {
            own = g.tensor(rows * c.n_vocab).map_err(gpu_err)?;
            &own
        } else {
            &s.logits
        };
        let m = if let [_] = segments {
            let first = which.first(n);
            let m = n - first;
            b.matmul_strided(
                MatmulKernel::Auto,
                &head.weight,
                &s.h,
                logits,
                Columns {
                    n: m,
                    x_offset: first * e,
                    x_stride: e,
                    y_offset: 0,
                    y_stride: c.n_vocab,
                },
            )
            .map_err(gpu_err)?;
            m
        } else {
            // Gather each sequence's last normed state, then one head product
            // for all of them.
            for (j, seg) in segments.iter().enumerate() {
                let at = (seg.first + seg.n - 1) * e;
                b.copy(&s.h, at, &s.last, j * e, e).map_err(gpu_err)?;
            }
            b.matmul_strided(
                MatmulKernel::Auto,
                &head.weight,
                &s.last,
                logits,
                Columns {
                    n: seqs,
                    x_offset: 0,
                    x_stride: e,
                    y_offset: 0,
                    y_stride: c.n_vocab,
                },
            )
            .map_err(gpu_err)?;
            seqs
        };
        if read == Readback::Logits {
            return b
                .submit_read_f32(logits, 0, m * c.n_vocab)
                .map(Stepped::Logits)
                .map_err(gpu_err);
        }
        // Greedy picks, alone or beside top-k candidates.
        let v = c.n_vocab;
        b.argmax_rows(logits, m, v, v, &s.pick_pairs, &s.picks)
            .map_err(gpu_err)?;
        // A row of NaN only: the host's argmax gives 0.
        let pick = |p: &[u32]| if p[1] == ARGMAX_NONE { 0 } else { p[1] };
        let Readback::Top(k) = read else {
            let pairs = b.submit_read_u32(&s.picks, 0, 2 * m).map_err(gpu_err)?;
            return Ok(Stepped::Picks(pairs.chunks_exact(2).map(pick).collect()));
        };
        let Some([t0, t1, out]) = &s.top else {
            return Err(ModelError::Gpu("top-k scratch missing".into()));
        };
        b.topk_rows(logits, m, v, v, k, [t0, t1], out)
            .map_err(gpu_err)?;
        let parts = b
            .submit_read_u32_parts(&[(&s.picks, 0, 2 * m), (out, 0, 2 * k * m)])
            .map_err(gpu_err)?;
        let rows = parts[0]
            .chunks_exact(2)
            .zip(parts[1].chunks_exact(2 * k))
            .map(|(p, row)| Candidates {
                argmax: pick(p),
                best: row
                    .chunks_exact(2)
                    .take_while(|e| e[1] != TOPK_NONE)
                    .map(|e| (e[1], topk_value(e[0])))
                    .collect(),
            })
            .collect();
        Ok(Stepped::Top(rows))
    }

    /// Records one block: `cur` holds the hidden state on entry and on exit;
    /// `spare` is scratch of the same size. Returns whether `s.h` then holds
    /// the hidden state normed by `next_norm`; `normed` says whether it
    /// holds this block's attention norm on entry.
    ///
    /// Where the products run the mat-vec or small-N kernels (decoding, and
    /// every step on a CPU-backed device) and the block has no post-norms,
    /// six dispatches: QKV with the attention norm in its prologue, RoPE +
    /// cache writes, attention, o with the residual add in its epilogue,
    /// gate/up with the feed-forward norm in its prologue and the
    /// activation in its epilogue, down with the residual add. Otherwise
    /// (tiled prompt products, gemma3's post-norms) the norms run as
    /// add + norm kernels, eight dispatches. One more for per-head norms
    /// or biases, one more for the activation when gate and up differ in
    /// type; RoPE and attention once per run of sequences whose caches
    /// share buffers. Either way the same bits. On a CPU-backed device,
    /// where the norm prologue costs more than it saves, a step of up to
    /// eight tokens norms in the epilogues of o and down instead (their
    /// last workgroup norms the new hidden state, [`NormAfter`]): five
    /// dispatches, as with the prologue.
    #[allow(clippy::too_many_arguments)]
    fn record_layer(
        &self,
        b: &mut Batch<'_>,
        il: usize,
        i: usize,
        l: &GpuLayer,
        next_norm: &Tensor,
        s: &Scratch,
        cur: &Tensor,
        spare: &Tensor,
        n: usize,
        segments: &[Segment<'_>],
        normed: bool,
    ) -> Result<bool, lamina_gpu::GpuError> {
        let c = &self.cpu.config;
        let blk = Block::new(c, il);
        let (e, hd) = (c.n_embd, c.head_dim);
        let layout = QkvLayout {
            n_head: c.n_head,
            n_kv_head: c.n_head_kv,
            head_dim: hd,
            kv: self.gpu_kv,
        };
        let folded = Self::folded_gate_up(b, l, n);
        let fused = folded.is_some();
        let ring = segments[0].cache.arena.ring_of(i);
        let table = Self::table(s, ring);
        let rope = Rope {
            head_dim: hd,
            n_rot: blk.rope.n_rot,
            n_heads: c.n_head,
            pos_offset: 0,
            freq_base: blk.rope.base,
            neox: blk.rope.neox,
            freq_scale: blk.rope.scale,
            mscale: blk.rope.mscale,
            factors_at: Self::rope_factors_at(c, s.n)?,
        };
        let window = blk.window.kernel_width();
        // The QKV product's input: the raw hidden state, normed in the
        // product's prologue, or its normed copy in `h`.
        let (qkv_in, norm) = if fused {
            (cur, Some((&l.attn_norm, blk.eps)))
        } else {
            if !normed {
                b.rms_norm(cur, &l.attn_norm, &s.h, e, blk.eps)?;
            }
            (&s.h, None)
        };
        // RoPE and the cache writes in the QKV product's epilogue, where
        // nothing comes between them (no biases, no per-head norms), the
        // product is one weight in one binding, and every sequence's cache
        // shares the step's buffers.
        let arena = &segments[0].cache.arena;
        let one_run = segments.iter().all(|o| Arc::ptr_eq(&o.cache.arena, arena));
        let rope_w = match &l.qkv.parts[..] {
            [w] if l.bqkv.is_none()
                && l.q_norm.is_none()
                && one_run
                && b.rope_fuses(w, n, layout.kv) =>
            {
                Some(w)
            }
            _ => None,
        };
        if let Some(w) = rope_w {
            let (kc, vc) = (&arena.k[i], &arena.v[i]);
            let out = RopeOut {
                k_cache: kc,
                v_cache: vc,
                layout,
                rope,
                table,
                first: segments[0].first,
            };
            let cols = Columns {
                n,
                x_offset: 0,
                x_stride: e,
                y_offset: 0,
                y_stride: c.q_dim(),
            };
            let fuse = Fuse {
                norm,
                rope: Some(out),
                ..Fuse::default()
            };
            b.matmul_fused(w, qkv_in, &s.q, cols, fuse)?;
            let a = Attention {
                n_tokens: n,
                n_head: c.n_head,
                n_kv_head: c.n_head_kv,
                head_dim: hd,
                pos0: 0,
                window,
                scale: blk.attn_scale,
                kv: layout.kv,
                ring,
            };
            b.attention_rows(
                &s.q,
                kc,
                vc,
                &s.scores,
                &s.attn,
                &a,
                table,
                segments[0].first,
            )?;
        } else {
            let fuse = norm.map(|norm| Fuse {
                norm: Some(norm),
                ..Fuse::default()
            });
            l.qkv.record(b, qkv_in, &s.qkv, n, fuse)?;
            self.record_rope_attention(
                b,
                i,
                l,
                s,
                n,
                segments,
                &layout,
                &rope,
                window,
                blk.attn_scale,
            )?;
        }
        if l.is_moe() {
            // Ends with the hidden state in `spare`: the step submits, runs
            // the routed experts and adds them (see gpu_step).
            self.record_split(b, il, l, s, cur, spare, n)?;
            return Ok(false);
        }
        self.record_ffn(b, il, l, next_norm, s, cur, spare, n, folded)
    }

    /// Words a token table holds after its entries: the file's RoPE pair
    /// factors (`rope_freqs`), which the RoPE kernels read from the table
    /// they already bind.
    fn rope_factor_words(c: &Config) -> usize {
        c.rope_factors
            .or(c.long_rope.map(|l| l.long))
            .map_or(0, |f| f.get().len())
    }

    /// Where a table of `n` entries holds the RoPE pair factors, if the
    /// file has them: right after its `2n` words of entries.
    fn rope_factors_at(c: &Config, n: usize) -> Result<Option<u32>, lamina_gpu::GpuError> {
        (c.rope_factors.is_some() || c.long_rope.is_some())
            .then(|| {
                u32::try_from(2 * n).map_err(|_| lamina_gpu::GpuError::Shape {
                    op: "rope",
                    message: format!("a token table of {n} entries"),
                })
            })
            .transpose()
    }

    /// The step's token table for a layer whose cache is a ring of `ring`
    /// rows per slot (0: every position).
    fn table(s: &Scratch, ring: usize) -> TokenTable<'_> {
        if ring > 0 {
            TokenTable {
                host: &s.rows_ring,
                gpu: &s.table_ring,
            }
        } else {
            TokenTable {
                host: &s.rows,
                gpu: &s.table,
            }
        }
    }

    /// Where block `l`'s norms fold into its products for an `n`-token
    /// step (see [`Self::record_layer`]), its one stacked gate/up weight,
    /// whose product takes the feed-forward norm; `None` where they run as
    /// their own kernels.
    fn folded_gate_up<'l>(b: &Batch<'_>, l: &'l GpuLayer, n: usize) -> Option<&'l Weight> {
        let folds = b.fuses(n)
            && b.gpu().norm_prologue()
            && l.post_attn_norm.is_none()
            && l.post_ffn_norm.is_none();
        match &l.ffn {
            GpuFfn::Dense { gate_up, .. } => match &gate_up.parts[..] {
                [w] if folds && b.glu_fuses(w, n) => Some(w),
                _ => None,
            },
            GpuFfn::Split { .. } => None,
        }
    }

    /// The per-head steps between a stacked QKV product in `s.qkv` and the
    /// attention output in `s.attn`: biases (qwen2), per-head norms (qwen3,
    /// gemma3), RoPE with the cache writes, attention.
    #[allow(clippy::too_many_arguments)]
    fn record_rope_attention(
        &self,
        b: &mut Batch<'_>,
        i: usize,
        l: &GpuLayer,
        s: &Scratch,
        n: usize,
        segments: &[Segment<'_>],
        layout: &QkvLayout,
        rope: &Rope,
        window: usize,
        attn_scale: f32,
    ) -> Result<(), lamina_gpu::GpuError> {
        let c = &self.cpu.config;
        let hd = c.head_dim;
        // Biases (qwen2), then per-head norms of q and k (qwen3, gemma3):
        // `v_src` holds the values, `qk_src` the queries and keys.
        let mut v_src = &s.qkv;
        if let Some(bias) = &l.bqkv {
            b.add_rows(&s.qkv, bias, &s.qkv2, layout.stride())?;
            v_src = &s.qkv2;
        }
        let mut qk_src = v_src;
        if let (Some(qn), Some(kn)) = (&l.q_norm, &l.k_norm) {
            let dst = if l.bqkv.is_some() { &s.qkv } else { &s.qkv2 };
            b.head_norms(qk_src, qn, kn, dst, layout, n, c.rms_eps)?;
            qk_src = dst;
        }
        // RoPE, the cache writes and attention once for each run of
        // sequences whose caches share buffers (all of them, for the
        // server's slots), every token at its own position and rows (the
        // token table); the segments' tokens are packed in order.
        let mut at = 0;
        while let Some(seg) = segments.get(at) {
            let arena = &seg.cache.arena;
            let run = segments[at..]
                .iter()
                .take_while(|o| Arc::ptr_eq(&o.cache.arena, arena))
                .count();
            let tokens: usize = segments[at..at + run].iter().map(|o| o.n).sum();
            let (kc, vc) = (&arena.k[i], &arena.v[i]);
            let ring = arena.ring_of(i);
            let table = Self::table(s, ring);
            b.rope_kv_rows(
                qk_src, v_src, &s.q, kc, vc, layout, rope, table, seg.first, tokens,
            )?;
            let a = Attention {
                n_tokens: tokens,
                n_head: c.n_head,
                n_kv_head: c.n_head_kv,
                head_dim: hd,
                pos0: 0,
                window,
                scale: attn_scale,
                kv: layout.kv,
                ring,
            };
            b.attention_rows(&s.q, kc, vc, &s.scores, &s.attn, &a, table, seg.first)?;
            at += run;
        }
        Ok(())
    }

    /// The block's second half: the attention output product, the
    /// residual adds and the feed-forward block, folded into the products
    /// (`folded`: the gate/up weight, see [`Self::folded_gate_up`]) or
    /// with add + norm kernels. Returns whether
    /// `s.h` holds the hidden state normed by `next_norm`.
    #[allow(clippy::too_many_arguments)]
    fn record_ffn(
        &self,
        b: &mut Batch<'_>,
        il: usize,
        l: &GpuLayer,
        next_norm: &Tensor,
        s: &Scratch,
        cur: &Tensor,
        spare: &Tensor,
        n: usize,
        folded: Option<&Weight>,
    ) -> Result<bool, lamina_gpu::GpuError> {
        let c = &self.cpu.config;
        let blk = Block::new(c, il);
        let e = c.n_embd;
        let gate = match blk.activation {
            Activation::SwiGlu => Gate::Silu,
            Activation::GeGlu => Gate::GeluTanh,
        };
        let (gate_up, down) = match &l.ffn {
            GpuFfn::Dense { gate_up, down } => (gate_up, down),
            GpuFfn::Split { .. } => {
                return Err(lamina_gpu::GpuError::Shape {
                    op: "record_ffn",
                    message: "a split block's feed-forward is recorded by record_split".into(),
                })
            }
        };
        if let Some(w) = folded {
            let add = Fuse {
                add: true,
                ..Fuse::default()
            };
            b.matmul_fused(&l.wo, &s.attn, cur, Columns::packed(n, &l.wo), add)?;
            b.matmul_glu_normed(w, cur, &s.gu, &s.a, n, gate, (&l.ffn_norm, blk.eps))?;
            b.matmul_fused(down, &s.a, cur, Columns::packed(n, down), add)?;
            return Ok(false);
        }
        // On a CPU-backed device, up to eight columns: the residual adds in
        // the epilogues of o and down, each followed by the norm of the new
        // hidden state in its last workgroup (two dispatches fewer).
        let norm_after = l.post_attn_norm.is_none()
            && l.post_ffn_norm.is_none()
            && b.norm_epilogue_fuses(&l.wo, n)
            && b.norm_epilogue_fuses(down, n);
        let add_norm = |weight, out| Fuse {
            add: true,
            norm_after: Some(NormAfter {
                weight,
                eps: blk.eps,
                out,
                counter: &s.norm_count,
            }),
            ..Fuse::default()
        };
        if norm_after {
            let cols = Columns::packed(n, &l.wo);
            b.matmul_fused(&l.wo, &s.attn, cur, cols, add_norm(&l.ffn_norm, &s.h))?;
        } else {
            self.record_attn_out(b, il, l, s, cur, spare, n)?;
        }
        // The hidden state after the attention block.
        let sum = if norm_after { cur } else { spare };
        match &gate_up.parts[..] {
            // One weight: the activation in the mat-vec's epilogue.
            [w] => b.matmul_glu(w, &s.h, &s.gu, &s.a, n, gate)?,
            _ => {
                gate_up.record(b, &s.h, &s.gu, n, None)?;
                b.glu_stacked(&s.gu, &s.a, c.n_ff, gate)?;
            }
        }
        if norm_after {
            let cols = Columns::packed(n, down);
            b.matmul_fused(down, &s.a, sum, cols, add_norm(next_norm, &s.h))?;
            return Ok(true);
        }
        b.matmul(down, &s.a, &s.o, n)?;
        let post = l.post_ffn_norm.as_ref();
        b.add_rms_norm(sum, &s.o, post, next_norm, cur, &s.h, e, blk.eps)?;
        Ok(true)
    }

    /// The attention output product and its residual add: `spare` gets
    /// the hidden state, `s.h` its feed-forward norm.
    #[allow(clippy::too_many_arguments)]
    fn record_attn_out(
        &self,
        b: &mut Batch<'_>,
        il: usize,
        l: &GpuLayer,
        s: &Scratch,
        cur: &Tensor,
        spare: &Tensor,
        n: usize,
    ) -> Result<(), lamina_gpu::GpuError> {
        let c = &self.cpu.config;
        let eps = Block::new(c, il).eps;
        b.matmul(&l.wo, &s.attn, &s.o, n)?;
        let post = l.post_attn_norm.as_ref();
        b.add_rms_norm(cur, &s.o, post, &l.ffn_norm, spare, &s.h, c.n_embd, eps)
    }

    /// A split block's GPU part of its feed-forward, after its attention:
    /// `spare` gets the hidden state, `s.h` the normed input, and
    /// `s.moe_io` that input, the router's logits and the shared expert's
    /// output (qwen2moe, before its gate) side by side.
    #[allow(clippy::too_many_arguments)]
    fn record_split(
        &self,
        b: &mut Batch<'_>,
        il: usize,
        l: &GpuLayer,
        s: &Scratch,
        cur: &Tensor,
        spare: &Tensor,
        n: usize,
    ) -> Result<(), lamina_gpu::GpuError> {
        let GpuFfn::Split { router, shared, .. } = &l.ffn else {
            return Ok(());
        };
        self.record_attn_out(b, il, l, s, cur, spare, n)?;
        let e = self.cpu.config.n_embd;
        let nx = router.rows();
        let device = self.device_routing(l);
        // The host reads the input back unless the experts follow on the
        // device in this submission.
        if self.device_experts(b.gpu(), l, n).is_none() {
            b.copy(&s.h, 0, &s.moe_io, 0, n * e)?;
        }
        let at = |y_offset, w: &Weight| Columns {
            n,
            x_offset: 0,
            x_stride: w.cols(),
            y_offset,
            y_stride: w.rows(),
        };
        b.matmul_strided(
            MatmulKernel::Auto,
            router,
            &s.h,
            &s.moe_io,
            at(n * e, router),
        )?;
        if let Some((gate_up, down)) = shared {
            match &gate_up.parts[..] {
                [w] => b.matmul_glu(w, &s.h, &s.sgu, &s.sa, n, Gate::Silu)?,
                _ => {
                    gate_up.record(b, &s.h, &s.sgu, n, None)?;
                    b.glu_stacked_n(&s.sgu, &s.sa, down.cols(), n, Gate::Silu)?;
                }
            }
            let y = at(n * (e + nx), down);
            b.matmul_strided(MatmulKernel::Auto, down, &s.sa, &s.moe_io, y)?;
        }
        if let Some(r) = device {
            b.moe_route(&s.moe_io, n * e, nx, n, r, &s.route)?;
        }
        Ok(())
    }

    /// Packs a larger step's routed experts on the host from the device's
    /// choices (read back), where the device packs them (`moe_pack`)
    /// unless the packing kernel cannot hold them: the tests run every way
    /// a step can take, and measurements compare them.
    pub fn pack_experts_on_host(&mut self, on: bool) {
        self.host_packs = on;
    }

    /// How block `l` runs its experts on the device for a step of `n`
    /// tokens, where they follow in the step's submission; `None` where the
    /// host routes or packs them between two submissions. Recording the
    /// block and running its experts ask the same question.
    fn device_experts(
        &self,
        g: &Gpu,
        l: &GpuLayer,
        n: usize,
    ) -> Option<(lamina_gpu::MoeRouting, DeviceExperts)> {
        let r = self.device_routing(l)?;
        Some((r, DeviceExperts::choose(g, &r, n, self.host_packs)?))
    }

    /// How block `l` routes on the device, where it can: its experts are
    /// on the GPU (with a shared expert, its gate too) and the device's
    /// router holds its experts. Every step of such a block routes with the
    /// device's router and gates the shared expert on the device, whatever
    /// its size, so a token's experts and weights never depend on how many
    /// others share its step.
    fn device_routing(&self, l: &GpuLayer) -> Option<lamina_gpu::MoeRouting> {
        let m = self.cpu.config.moe?;
        let GpuFfn::Split {
            shared,
            shared_gate,
            experts: Some(_),
            ..
        } = &l.ffn
        else {
            return None;
        };
        if shared.is_some() && shared_gate.is_none() {
            return None;
        }
        (m.n_expert <= lamina_gpu::MOE_ROUTE_MAX_EXPERTS && m.n_used <= m.n_expert).then_some(
            lamina_gpu::MoeRouting {
                n_expert: m.n_expert,
                k: m.n_used,
                norm: m.norm_weights,
                scale: m.weights_scale,
            },
        )
    }

    /// The routed experts of a block that routes on the device: each
    /// (token, slot) pair's gate/up and down products over its expert, from
    /// the router's one-column runs ([`DeviceExperts::Pairs`]) or from the
    /// pairs packed by expert on the device, their inputs gathered into that
    /// order ([`DeviceExperts::Packed`]); then their weighed sum into
    /// `s.o`. All in the step's submission: no wait for the host.
    #[allow(clippy::too_many_arguments)]
    fn record_device_experts(
        &self,
        b: &mut Batch<'_>,
        l: &GpuLayer,
        gx: &GpuExperts,
        r: lamina_gpu::MoeRouting,
        how: DeviceExperts,
        s: &Scratch,
        n: usize,
    ) -> Result<(), lamina_gpu::GpuError> {
        let c = &self.cpu.config;
        let (e, fe) = (c.n_embd, c.moe.map_or(0, |m| m.n_ff_exp));
        let runs = Runs {
            table: &s.route,
            at: r.runs_at(n),
            count: n * r.k,
            n_mats: r.n_expert,
            maxc: 1,
            indirect: None,
        };
        let (up, down, x) = match how {
            DeviceExperts::Pairs => {
                let down = Runs {
                    at: r.down_runs_at(n),
                    ..runs
                };
                (runs, down, &s.h)
            }
            DeviceExperts::Packed(maxc) => {
                let grids = [
                    b.runs_grid(&gx.gate_up, r.n_expert, true),
                    b.runs_grid(&gx.down, r.n_expert, false),
                ];
                let count = b.moe_pack(&s.route, &s.moe_args, n, r, maxc, grids)?;
                b.gather_cols(&s.h, &s.route, r.gather_at(n), &s.xin, n * r.k, e)?;
                // Only the runs that hold columns are dispatched.
                let packed = |at| Runs {
                    count,
                    maxc,
                    indirect: Some((&s.moe_args, at)),
                    ..runs
                };
                (packed(0), packed(3), &s.xin)
            }
        };
        b.matmul_runs(&gx.gate_up, up, x, e, &s.ea, fe, Some(Gate::Silu))?;
        b.matmul_runs(&gx.down, down, &s.ea, fe, &s.ys, e, None)?;
        b.moe_weigh(&s.ys, &s.route, &s.o, n, r.k, e, false)?;
        self.record_shared_gate(b, l, r, s, n)
    }

    /// A shared expert's output under its gate, added to the routed sum in
    /// `s.o` on the device (qwen2moe; nothing without one): the output is
    /// where [`Self::record_split`] put it, after the input and the
    /// router's logits in `s.moe_io`.
    fn record_shared_gate(
        &self,
        b: &mut Batch<'_>,
        l: &GpuLayer,
        r: lamina_gpu::MoeRouting,
        s: &Scratch,
        n: usize,
    ) -> Result<(), lamina_gpu::GpuError> {
        let GpuFfn::Split {
            shared_gate: Some(gate),
            ..
        } = &l.ffn
        else {
            return Ok(());
        };
        let e = self.cpu.config.n_embd;
        b.moe_shared(&s.h, gate, &s.moe_io, n * (e + r.n_expert), &s.o, n, e)
    }

    /// The host part of split block `il` over the `n` tokens of a step whose
    /// submission [`Self::record_split`] ended: from `io`, that
    /// submission's readback of the normed input, the router's logits and
    /// the shared expert's output (`Scratch::moe_io`), routes
    /// the tokens, and leaves the block's feed-forward output in `s.o`:
    /// computed here when the routed experts are on the CPU, recorded into
    /// `b` (the step's next submission) when they are on the GPU, so such
    /// a block waits for the device once, not twice.
    #[allow(clippy::too_many_arguments)]
    fn run_split_experts(
        &self,
        g: &Gpu,
        b: &mut Batch<'_>,
        il: usize,
        l: &GpuLayer,
        s: &Scratch,
        n: usize,
        mut io: Vec<f32>,
    ) -> Result<(), ModelError> {
        let c = &self.cpu.config;
        let e = c.n_embd;
        let (Ffn::Moe(ex), Some(m)) = (&self.cpu.weights.layers[il].ffn, c.moe) else {
            return Err(ModelError::Placement(format!(
                "blk.{il} was split but has no experts"
            )));
        };
        if io.len() != n * moe_io_width(c, &m) {
            return Err(ModelError::Gpu(format!(
                "blk.{il}: {} values read back for {n} tokens",
                io.len()
            )));
        }
        let (h, rest) = io.split_at_mut(n * e);
        let (logits, sy) = rest.split_at_mut(n * m.n_expert);
        match l.gpu_experts() {
            None => {
                let mut out = vec![0.0f32; n * e];
                crate::cpu::routed_experts(ex, &m, e, h, n, logits, &mut out)?;
                if let Some((gate_inp, ..)) = &ex.shared {
                    crate::cpu::add_shared(gate_inp, e, h, sy, &mut out);
                }
                g.write_f32(&s.o, &out).map_err(gpu_err)
            }
            Some(gx) => {
                let device = self.device_routing(l);
                // Routed on the host: the shared expert's gated output goes
                // into `o` first, and the GPU's weighted sum adds itself to
                // it (add_shared's order: the routed sum, plus the gated
                // shared output).
                let shared =
                    ex.shared
                        .as_ref()
                        .filter(|_| device.is_none())
                        .map(|(gate_inp, ..)| {
                            let mut sh = vec![0.0f32; n * e];
                            crate::cpu::add_shared(gate_inp, e, h, sy, &mut sh);
                            sh
                        });
                if let Some(sh) = &shared {
                    g.write_f32(&s.o, sh).map_err(gpu_err)?;
                }
                // The device's router chose where it could (the same
                // choices a small step makes without the host).
                let chosen = match device {
                    Some(r) => {
                        let words = g.read_u32(&s.route).map_err(gpu_err)?;
                        let nk = n * m.n_used;
                        (0..nk)
                            .map(|i| {
                                let id = words.get(r.runs_at(n) + 4 * i).copied().unwrap_or(0);
                                let w = words.get(nk + i).copied().unwrap_or(0);
                                (id as usize, f32::from_bits(w))
                            })
                            .collect()
                    }
                    None => crate::cpu::route(&m, n, logits),
                };
                self.host_routed_experts(g, b, gx, &m, s, h, n, &chosen, shared.is_some())?;
                // Routed on the device: its gate too, as a step that does
                // not wait gates it.
                match device {
                    Some(r) => self.record_shared_gate(b, l, r, s, n).map_err(gpu_err),
                    None => Ok(()),
                }
            }
        }
    }

    /// The routed experts of a block that has them on the GPU, for the
    /// normed input `h` of `n` tokens routed as `chosen` says (each (token,
    /// slot)'s expert and weight), recorded into `b`: every pair's input
    /// goes up packed in expert order, so each chosen expert's tokens are
    /// runs of up to eight columns of one `matmul_runs` per product (each
    /// expert's weights streamed once for all its tokens); the outputs are
    /// weighed in slot order on the GPU into `s.o` (added to what it holds
    /// with `add`), as [`crate::cpu`]'s `weigh_experts` weighs its own.
    #[allow(clippy::too_many_arguments)]
    fn host_routed_experts(
        &self,
        g: &Gpu,
        b: &mut Batch<'_>,
        gx: &GpuExperts,
        m: &crate::config::Moe,
        s: &Scratch,
        h: &[f32],
        n: usize,
        chosen: &[(usize, f32)],
        add: bool,
    ) -> Result<(), ModelError> {
        let (e, k, fe) = (self.cpu.config.n_embd, m.n_used, m.n_ff_exp);
        if chosen.len() != n * k || chosen.iter().any(|c| c.0 >= m.n_expert) {
            return Err(ModelError::Gpu(format!(
                "{} routed pairs for {n} tokens of {k} of {} experts",
                chosen.len(),
                m.n_expert
            )));
        }
        // A stable sort: within an expert, the tokens in order.
        let mut order: Vec<usize> = (0..n * k).collect();
        order.sort_by_key(|&i| chosen[i].0);
        let mut xin = Vec::with_capacity(n * k * e);
        for &i in &order {
            let t = i / k;
            xin.extend_from_slice(&h[t * e..(t + 1) * e]);
        }
        g.write_f32(&s.xin, &xin).map_err(gpu_err)?;
        // The weighted sum's table (each (token, slot)'s packed row, then
        // its weight), then the runs: each expert's packed columns, eight
        // at most a run, the same columns of x and y.
        let mut words = vec![0u32; 2 * n * k];
        for (j, &i) in order.iter().enumerate() {
            words[i] = j as u32;
        }
        for (i, c) in chosen.iter().enumerate() {
            words[n * k + i] = c.1.to_bits();
        }
        let (mut first, mut longest) = (0, 1);
        for run in order.chunk_by(|&a, &b| chosen[a].0 == chosen[b].0) {
            for part in run.chunks(lamina_gpu::MAX_SMALL_COLS) {
                let x = chosen[part[0]].0 as u32;
                words.extend([x, first, first, part.len() as u32]);
                first += part.len() as u32;
                longest = longest.max(part.len());
            }
        }
        g.write_u32(&s.route, &words).map_err(gpu_err)?;
        let runs = Runs {
            table: &s.route,
            at: 2 * n * k,
            count: (words.len() - 2 * n * k) / 4,
            n_mats: m.n_expert,
            // The kernel's compiled column count: no more than the longest
            // run needs (its arrays stay smaller).
            maxc: longest.next_power_of_two(),
            indirect: None,
        };
        b.matmul_runs(&gx.gate_up, runs, &s.xin, e, &s.ea, fe, Some(Gate::Silu))
            .map_err(gpu_err)?;
        b.matmul_runs(&gx.down, runs, &s.ea, fe, &s.ys, e, None)
            .map_err(gpu_err)?;
        b.moe_weigh(&s.ys, &s.route, &s.o, n, k, e, add)
            .map_err(gpu_err)
    }
}
