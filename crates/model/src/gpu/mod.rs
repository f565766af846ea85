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
//! submission (`moe.rs`'s `DeviceExperts`; the host packs only a step too large for
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
    topk_value, Columns, Gpu, KvElem, MatmulKernel, TokenRow, ARGMAX_MAX_LEN, ARGMAX_NONE,
    TOPK_MAX, TOPK_NONE,
};

use crate::config::Config;
use crate::cpu::{CpuModel, Logits};
use crate::error::ModelError;
use crate::kv::KvCache;
use crate::plan::{Device, Plan};

mod arena;
pub mod fusion;
mod moe;
mod readback;
mod record;
mod scratch;
mod upload;

pub use arena::HybridCache;
pub use readback::Candidates;

pub(crate) use arena::gpu_kv;
use arena::KvArena;
use fusion::{DeviceTraits, WeightFacts};
use readback::{Next, Readback, Stepped};
use scratch::{Pool, Shape};
use upload::{upload_layer, upload_matrix, upload_vec, GpuHead, GpuLayer};

use crate::program::Program;

/// A step plan's class of width and whether its caches share buffers.
type PlanKey = (usize, bool);

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
    /// Step plans already made, by [`fusion::step_class`] and whether the
    /// step's caches share buffers: a plan depends on nothing else, so
    /// decoding plans once.
    plans: Mutex<Vec<(PlanKey, Arc<fusion::StepPlan>)>>,
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

fn gpu_err(e: lamina_gpu::GpuError) -> ModelError {
    ModelError::Gpu(e)
}

/// One sequence of a GPU step: its tokens are `first..first + n` of the
/// step's packed activations, at positions `pos0..`, over its own cache.
struct Segment<'c> {
    first: usize,
    n: usize,
    pos0: usize,
    cache: &'c HybridCache,
    /// Its last tokens whose logits (or picks, or candidates) a step of
    /// several segments reads back: 1, or a drafted run's length.
    keep: usize,
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
                ModelError::Step("the plan offloads layers but no GPU was given".into())
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
                let c = &cpu.config;
                let delta = c.recurrent.and_then(|r| r.delta);
                let gate_heads = c.attn_gate.then_some(c.head_dim);
                layers.push(upload_layer(g, l, !slot.is_split(), kv, gate_heads, delta)?);
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
            plans: Mutex::new(Vec::new()),
            block_dispatches: Default::default(),
            host_packs: false,
            top_on_gpu: None,
            gpu_kv: kv,
        })
    }

    /// The plan of a step of `n` columns ([`fusion::plan_step`]), made
    /// once per class of step.
    fn step_plan(&self, g: &Gpu, n: usize, one_run: bool) -> Arc<fusion::StepPlan> {
        let key = (fusion::step_class(n), one_run);
        let mut plans = self.plans.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, p)) = plans.iter().find(|(k, _)| *k == key) {
            return p.clone();
        }
        let blocks: Vec<(&Program, &WeightFacts)> = self
            .layers
            .iter()
            .enumerate()
            .map(|(i, l)| (&self.cpu.programs[self.first_gpu + i], &l.facts))
            .collect();
        let plan = Arc::new(fusion::plan_step(&blocks, DeviceTraits::of(g), n, one_run));
        plans.push((key, plan.clone()));
        plan
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
            (Some(g), Some(head)) => {
                self.states_to_device(cache)?;
                let logits = self.gpu_part(g, head, &x, n, pos0, cache, which)?;
                self.states_after_step(cache, n)?;
                logits
            }
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
        self.run_multi(work, None, Readback::Logits, Next::into_logits)
    }

    /// [`HybridModel::forward_multi`] where sequence `i` gets the logits of
    /// its last `keep[i]` tokens, one row after another (what verifying a
    /// drafted run needs): the rows it would get from
    /// [`HybridModel::forward`] with [`Logits::From`], bit for bit. Fails
    /// without running anything when a sequence asks for more rows than it
    /// has tokens, or has more tokens than one step of its cache takes.
    pub fn forward_multi_rows(
        &self,
        work: &mut [(&[u32], &mut HybridCache)],
        keep: &[usize],
    ) -> Result<Vec<Vec<f32>>, ModelError> {
        self.run_multi(work, Some(keep), Readback::Logits, Next::into_logits)
    }

    /// [`HybridModel::forward_multi_rows`] reduced to each kept row's
    /// argmax, on the GPU (as [`HybridModel::forward_multi_argmax`]).
    pub fn forward_multi_rows_argmax(
        &self,
        work: &mut [(&[u32], &mut HybridCache)],
        keep: &[usize],
    ) -> Result<Vec<Vec<u32>>, ModelError> {
        if !self.argmax_on_gpu() {
            return Err(ModelError::Step(
                "the greedy pick is reduced on the GPU, and this model's head is not there".into(),
            ));
        }
        self.run_multi(work, Some(keep), Readback::Argmax, Next::into_picks)
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
            return Err(ModelError::Step(
                "the greedy pick is reduced on the GPU, and this model's head is not there".into(),
            ));
        }
        self.run_multi(work, None, Readback::Argmax, Next::into_pick)
    }

    /// The largest `k` [`HybridModel::forward_multi_top`] takes, where it
    /// runs: the head is on the GPU, and the device is one whose readback
    /// costs what a selection there saves. A CPU-backed device (lavapipe)
    /// copies the logits at memory speed and the host's selection costs far
    /// less than its sorting network (docs/perf/kernels.md, 2026-12-06;
    /// [`HybridModel::select_top_on_gpu`] overrides the choice, for the
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
            return Err(ModelError::Step(format!(
                "top-{k} candidates are selected on a GPU that holds the head, for k up to \
                 {TOPK_MAX}"
            )));
        }
        self.run_multi(work, None, Readback::Top(k), Next::into_top)
    }

    /// A multi-sequence step in rounds no cache's limit exceeds, each
    /// sequence's result taken out of its [`Next`] by `take`. With `keep`
    /// (rows per sequence, [`HybridModel::forward_multi_rows`]) in one
    /// round, which every sequence must fit.
    fn run_multi<T: Default + Send>(
        &self,
        work: &mut [(&[u32], &mut HybridCache)],
        keep: Option<&[usize]>,
        read: Readback,
        take: fn(Next) -> Result<T, ModelError>,
    ) -> Result<Vec<T>, ModelError> {
        let limit = work
            .iter()
            .map(|(_, c)| crate::kv::max_step(&self.cpu.config, c.capacity()))
            .min()
            .unwrap_or(usize::MAX);
        if let Some(keep) = keep {
            crate::cpu::check_rows(work, keep, limit)?;
            return crate::cpu::in_pool(|| {
                self.forward_multi_here(work, keep, read)?
                    .into_iter()
                    .map(take)
                    .collect()
            });
        }
        crate::cpu::in_pool(|| {
            crate::cpu::split_multi(work, limit, |w| {
                let ones = vec![1; w.len()];
                self.forward_multi_here(w, &ones, read)?
                    .into_iter()
                    .map(take)
                    .collect()
            })
        })
    }

    fn forward_multi_here(
        &self,
        work: &mut [(&[u32], &mut HybridCache)],
        keep: &[usize],
        read: Readback,
    ) -> Result<Vec<Next>, ModelError> {
        let (Some(g), Some(head)) = (self.gpu.as_deref(), &self.head) else {
            if read != Readback::Logits {
                return Err(ModelError::Step("no GPU to reduce the logits on".into()));
            }
            let mut inner: Vec<(&[u32], &mut KvCache)> =
                work.iter_mut().map(|(t, c)| (*t, &mut c.cpu)).collect();
            let out = self.cpu.forward_multi_rows(&mut inner, keep)?;
            for (t, c) in work.iter_mut() {
                let len = c.len + t.len();
                c.len = len;
                c.rings.advance(len);
            }
            return Ok(out.into_iter().map(Next::Logits).collect());
        };
        if let ([(t, c)], [k], Readback::Logits) = (&mut *work, keep, read) {
            let from = Logits::From(t.len().saturating_sub(*k));
            return Ok(vec![Next::Logits(self.forward_here(t, c, from)?)]);
        }
        let mut xs = Vec::new();
        let mut firsts = Vec::with_capacity(work.len());
        let mut scratch = crate::cpu::Scratch::default();
        for (_, cache) in work.iter_mut() {
            self.states_to_device(cache)?;
        }
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
            .zip(keep)
            .map(|(((t, c), &first), &keep)| Segment {
                first,
                n: t.len(),
                pos0: c.len,
                cache: c,
                keep,
            })
            .collect();
        let which = match &segments[..] {
            [one] => Logits::From(one.n.saturating_sub(one.keep)),
            _ => Logits::Last,
        };
        let out = self.gpu_step(g, head, &xs, &segments, which, read)?;
        let v = self.cpu.config.n_vocab;
        for (t, c) in work.iter_mut() {
            self.states_after_step(c, t.len())?;
            let len = c.len + t.len();
            c.advance(len);
        }
        // Each sequence's rows, in the order of the segments.
        let mut at = 0;
        let mut next = Vec::with_capacity(keep.len());
        for &k in keep {
            next.push(match &out {
                Stepped::Logits(flat) => Next::Logits(
                    flat.get(at * v..(at + k) * v)
                        .ok_or_else(readback::misread)?
                        .to_vec(),
                ),
                Stepped::Picks(p) => {
                    Next::Picks(p.get(at..at + k).ok_or_else(readback::misread)?.to_vec())
                }
                Stepped::Top(rows) => {
                    Next::Tops(rows.get(at..at + k).ok_or_else(readback::misread)?.to_vec())
                }
            });
            at += k;
        }
        Ok(next)
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
            keep: n - which.first(n),
        };
        self.gpu_step(g, head, x, &[seg], which, Readback::Logits)?
            .into_logits()
    }

    /// The GPU layers and the head for `segments` packed in `x`, in one
    /// submission. One segment returns the logits `which` asks for; several
    /// return the logits of each segment's last `keep` tokens, one segment
    /// after another. With [`Readback::Argmax`] (or `Top`) each of those
    /// rows' argmax (or candidates) instead.
    fn gpu_step(
        &self,
        g: &Gpu,
        head: &GpuHead,
        x: &[f32],
        segments: &[Segment<'_>],
        which: Logits,
        read: Readback,
    ) -> Result<Stepped, ModelError> {
        if read != Readback::Logits && which == Logits::Hidden {
            return Err(ModelError::Step(
                "a greedy pick or top-k is made from logits, not hidden states".into(),
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
        // The rows of logits the head computes: one segment's as `which`
        // says, else each segment's last `keep`.
        let out_rows = match segments {
            [_] => n - which.first(n),
            _ => segments.iter().map(|s| s.keep).sum(),
        };
        // The scratch's rows (logits, picks, gathered states): one per
        // sequence, or a row per kept token; a single sequence's logits
        // of many rows get a tensor of their own below.
        let rows_room = if seqs == 1 && read == Readback::Logits {
            seqs
        } else {
            seqs.max(out_rows)
        };
        let gpu_experts = self.layers.iter().any(|l| l.gpu_experts().is_some());
        let mut s = Pool::step(
            &mut held,
            g,
            c,
            gpu_experts,
            record::rope_factor_words(c),
            Shape {
                n,
                seqs: rows_room,
                kv_room,
            },
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
                    return Err(ModelError::Step("cache rows beyond u32".into()));
                };
                s.rows.push(TokenRow { row, pos: pos32 });
                if any_ring {
                    let r = arena.ring.max(1);
                    let row = u32::try_from(seg.cache.slot * r + pos % r)
                        .map_err(|_| ModelError::Step("cache rows beyond u32".into()))?;
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
            return Err(ModelError::Step(
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
        // folded block norms its inputs in its products' prologues; an
        // unfolded one ends in a residual add fused with the RMSNorm that
        // follows (the next block's, or the head's) and leaves that normed
        // input in `h` (fusion.rs decides which).
        let cur = &s.x;
        let e = c.n_embd;
        // The plan of every block's dispatches (fusion.rs), then its
        // recording. The first block's norm, when it runs alone, counts
        // outside the blocks (as the head's does).
        let arena = &segments[0].cache.arena;
        let one_run = segments.iter().all(|o| Arc::ptr_eq(&o.cache.arena, arena));
        let plan = self.step_plan(g, n, one_run);
        if let (Some(l), true) = (self.layers.first(), plan.first_norm) {
            b.rms_norm(cur, &l.attn_norm, &s.h, e, c.rms_eps)
                .map_err(gpu_err)?;
        }
        let mut count = record::Counted {
            before: b.len(),
            dispatched: 0,
        };
        for (i, (l, bp)) in self.layers.iter().zip(&plan.blocks).enumerate() {
            let io = record::BlockIo {
                s,
                cur,
                spare: &s.x2,
                next_norm: self.layers.get(i + 1).map_or(&head.norm, |l| &l.attn_norm),
                n,
                segments,
            };
            self.record_block(g, &mut b, &mut count, i, l, &bp.dispatches, &io)?;
        }
        let dispatched = count.dispatched + b.len() - count.before;
        self.block_dispatches
            .fetch_add(dispatched as u64, std::sync::atomic::Ordering::Relaxed);
        if plan.head_norm {
            b.rms_norm(cur, &head.norm, &s.h, e, c.rms_eps)
                .map_err(gpu_err)?;
        }
        // `h` now holds the head's RMSNorm of every token.
        if which == Logits::Hidden {
            if segments.len() != 1 {
                return Err(ModelError::Step(
                    "hidden states are read for one sequence at a time".into(),
                ));
            }
            return b
                .submit_read_f32(&s.h, 0, n * e)
                .map(Stepped::Logits)
                .map_err(gpu_err);
        }
        let rows = out_rows;
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
            // Gather each sequence's last `keep` normed states, then one
            // head product for all of them.
            let mut j = 0;
            for seg in segments {
                let keep = seg.keep.min(seg.n);
                let at = (seg.first + seg.n - keep) * e;
                b.copy(&s.h, at, &s.last, j * e, keep * e)
                    .map_err(gpu_err)?;
                j += keep;
            }
            b.matmul_strided(
                MatmulKernel::Auto,
                &head.weight,
                &s.last,
                logits,
                Columns {
                    n: out_rows,
                    x_offset: 0,
                    x_stride: e,
                    y_offset: 0,
                    y_stride: c.n_vocab,
                },
            )
            .map_err(gpu_err)?;
            out_rows
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
            return Err(ModelError::Step("top-k scratch missing".into()));
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
}
