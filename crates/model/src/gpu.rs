//! The forward pass with the last layers (and the output head) on the GPU
//! and the rest on the CPU, as a [`Plan`] places them.
//!
//! Placement always offloads a suffix (llama.cpp's `-ngl` rule), so a step
//! crosses the CPU→GPU boundary once: the embedding lookup and the CPU blocks
//! run first, the hidden state is uploaded, and every GPU block plus the head
//! is recorded into one command buffer, submitted once, with one readback (the
//! logits). Each layer's KV cache lives on the device of its layer.

use std::sync::{Arc, Mutex};

use lamina_gpu::{Attention, Batch, Columns, Gpu, MatmulKernel, Rope, Tensor, Weight};

use crate::config::{Activation, Config};
use crate::cpu::{CpuModel, KvCache, Logits};
use crate::error::ModelError;
use crate::plan::{Device, Plan};
use crate::weights::{Layer, Matrix};

struct GpuLayer {
    attn_norm: Tensor,
    wq: Weight,
    wk: Weight,
    wv: Weight,
    wo: Weight,
    bq: Option<Tensor>,
    bk: Option<Tensor>,
    bv: Option<Tensor>,
    q_norm: Option<Tensor>,
    k_norm: Option<Tensor>,
    post_attn_norm: Option<Tensor>,
    ffn_norm: Tensor,
    gate: Weight,
    up: Weight,
    down: Weight,
    post_ffn_norm: Option<Tensor>,
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
    /// The last step's scratch, reused while the batch size matches: decoding
    /// allocates nothing per token. Held for the whole GPU part of a step, so
    /// two steps never share buffers.
    scratch: Mutex<Option<Scratch>>,
}

/// Keys and values: CPU layers in host memory, GPU layers in device buffers.
pub struct HybridCache {
    cpu: KvCache,
    k: Vec<Tensor>,
    v: Vec<Tensor>,
    n_ctx: usize,
    len: usize,
}

impl HybridCache {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn capacity(&self) -> usize {
        self.n_ctx
    }

    /// Forgets positions `len..` (to reuse a shared prefix).
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
        self.cpu.truncate(len);
    }
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

fn upload_layer(gpu: &Gpu, l: &Layer<'_>) -> Result<GpuLayer, ModelError> {
    Ok(GpuLayer {
        attn_norm: upload_vec(gpu, &l.attn_norm)?,
        wq: upload_matrix(gpu, &l.wq)?,
        wk: upload_matrix(gpu, &l.wk)?,
        wv: upload_matrix(gpu, &l.wv)?,
        wo: upload_matrix(gpu, &l.wo)?,
        bq: upload_opt(gpu, &l.bq)?,
        bk: upload_opt(gpu, &l.bk)?,
        bv: upload_opt(gpu, &l.bv)?,
        q_norm: upload_opt(gpu, &l.q_norm)?,
        k_norm: upload_opt(gpu, &l.k_norm)?,
        post_attn_norm: upload_opt(gpu, &l.post_attn_norm)?,
        ffn_norm: upload_vec(gpu, &l.ffn_norm)?,
        gate: upload_matrix(gpu, &l.gate)?,
        up: upload_matrix(gpu, &l.up)?,
        down: upload_matrix(gpu, &l.down)?,
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

/// Scratch tensors of one step, sized for `n` tokens of `seqs` sequences.
struct Scratch {
    n: usize,
    seqs: usize,
    /// Positions the attention scores have room for.
    kv_room: usize,
    logits: Tensor,
    /// The last hidden state of each sequence (multi-sequence steps).
    last: Tensor,
    x: Tensor,
    x2: Tensor,
    h: Tensor,
    q: Tensor,
    q2: Tensor,
    k: Tensor,
    k2: Tensor,
    v: Tensor,
    attn: Tensor,
    o: Tensor,
    o2: Tensor,
    g: Tensor,
    u: Tensor,
    a: Tensor,
    scores: Tensor,
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
        if let Some(g) = &gpu {
            let total = plan.gpu_weights;
            let mut done = 0;
            for (l, slot) in cpu.weights.layers[first_gpu..]
                .iter()
                .zip(&plan.slots[first_gpu..])
            {
                layers.push(upload_layer(g, l)?);
                done += slot.weight_bytes;
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
        })
    }

    pub fn config(&self) -> &Config {
        &self.cpu.config
    }

    pub fn gpu(&self) -> Option<&Gpu> {
        self.gpu.as_deref()
    }

    pub fn new_cache(&self, n_ctx: usize) -> Result<HybridCache, ModelError> {
        let c = &self.cpu.config;
        let mut k = Vec::new();
        let mut v = Vec::new();
        if let Some(g) = self.gpu.as_deref() {
            for _ in self.first_gpu..c.n_layer {
                k.push(g.tensor(n_ctx * c.kv_dim()).map_err(gpu_err)?);
                v.push(g.tensor(n_ctx * c.kv_dim()).map_err(gpu_err)?);
            }
        }
        Ok(HybridCache {
            cpu: KvCache::for_layers(c, n_ctx, self.first_gpu),
            k,
            v,
            n_ctx,
            len: 0,
        })
    }

    /// Runs `tokens` at positions `cache.len()..` and returns the logits
    /// `which` asks for, `n_vocab` per position.
    pub fn forward(
        &self,
        tokens: &[u32],
        cache: &mut HybridCache,
        which: Logits,
    ) -> Result<Vec<f32>, ModelError> {
        let n = tokens.len();
        let pos0 = cache.len;
        self.cpu.check_room(n, pos0, cache.n_ctx)?;
        let mut x = self.cpu.embed(tokens)?;
        for il in 0..self.first_gpu {
            self.cpu.layer(il, &mut x, n, pos0, &mut cache.cpu)?;
        }
        let logits = match (self.gpu.as_deref(), &self.head) {
            (Some(g), Some(head)) => self.gpu_part(g, head, &x, n, pos0, cache, which)?,
            _ => self.cpu.head(&x, n, which)?,
        };
        cache.len = pos0 + n;
        CpuModel::commit(&mut cache.cpu, pos0 + n);
        Ok(logits)
    }

    /// One step for several sequences, returning each one's last logits.
    /// With every layer on the CPU they go through the weights together
    /// ([`CpuModel::forward_multi`]); with a GPU part, the CPU layers run per
    /// sequence and the GPU layers take every sequence in one submission:
    /// each weight is streamed once for all of them (the small-N and tiled
    /// kernels), with RoPE and attention per sequence over its own cache.
    /// Either way each sequence gets the bits it would get alone.
    pub fn forward_multi(
        &self,
        work: &mut [(&[u32], &mut HybridCache)],
    ) -> Result<Vec<Vec<f32>>, ModelError> {
        let (Some(g), Some(head)) = (self.gpu.as_deref(), &self.head) else {
            let mut inner: Vec<(&[u32], &mut KvCache)> =
                work.iter_mut().map(|(t, c)| (*t, &mut c.cpu)).collect();
            let out = self.cpu.forward_multi(&mut inner)?;
            for (t, c) in work.iter_mut() {
                c.len += t.len();
            }
            return Ok(out);
        };
        if work.len() == 1 {
            let (t, c) = &mut work[0];
            return Ok(vec![self.forward(t, c, Logits::Last)?]);
        }
        let mut xs = Vec::new();
        let mut firsts = Vec::with_capacity(work.len());
        for (tokens, cache) in work.iter_mut() {
            let (n, pos0) = (tokens.len(), cache.len);
            self.cpu.check_room(n, pos0, cache.n_ctx)?;
            let mut x = self.cpu.embed(tokens)?;
            for il in 0..self.first_gpu {
                self.cpu.layer(il, &mut x, n, pos0, &mut cache.cpu)?;
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
        let flat = self.gpu_step(g, head, &xs, &segments, Logits::Last)?;
        let v = self.cpu.config.n_vocab;
        for (t, c) in work.iter_mut() {
            c.len += t.len();
            CpuModel::commit(&mut c.cpu, c.len);
        }
        Ok(flat.chunks_exact(v).map(<[f32]>::to_vec).collect())
    }

    fn scratch(
        &self,
        g: &Gpu,
        n: usize,
        seqs: usize,
        kv_room: usize,
    ) -> Result<Scratch, ModelError> {
        let c = &self.cpu.config;
        let t = |len: usize| g.tensor(len).map_err(gpu_err);
        let (e, qd, kvd, ff) = (c.n_embd, c.q_dim(), c.kv_dim(), c.n_ff);
        Ok(Scratch {
            n,
            seqs,
            kv_room,
            logits: t(n.max(seqs) * c.n_vocab)?,
            last: t(seqs * e)?,
            x: t(n * e)?,
            x2: t(n * e)?,
            h: t(n * e)?,
            q: t(n * qd)?,
            q2: t(n * qd)?,
            k: t(n * kvd)?,
            k2: t(n * kvd)?,
            v: t(n * kvd)?,
            attn: t(n * qd)?,
            o: t(n * e)?,
            o2: t(n * e)?,
            g: t(n * ff)?,
            u: t(n * ff)?,
            a: t(n * ff)?,
            scores: t(n * c.n_head * kv_room)?,
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
        self.gpu_step(g, head, x, &[seg], which)
    }

    /// The GPU layers and the head for `segments` packed in `x`, in one
    /// submission. One segment returns the logits `which` asks for; several
    /// return each segment's last logits, one after another.
    fn gpu_step(
        &self,
        g: &Gpu,
        head: &GpuHead,
        x: &[f32],
        segments: &[Segment<'_>],
        which: Logits,
    ) -> Result<Vec<f32>, ModelError> {
        let c = &self.cpu.config;
        let n: usize = segments.iter().map(|s| s.n).sum();
        let seqs = segments.len();
        let kv_len = segments.iter().map(|s| s.pos0 + s.n).max().unwrap_or(0);
        let mut held = self.scratch.lock().unwrap_or_else(|e| e.into_inner());
        if !held
            .as_ref()
            .is_some_and(|s| s.n == n && s.seqs == seqs && s.kv_room >= kv_len)
        {
            // Decode steps (one token per sequence) get room for the whole
            // cache, so decoding allocates once; prompt batches get what
            // they need.
            let room = if n == seqs {
                segments
                    .iter()
                    .map(|s| s.cache.n_ctx)
                    .max()
                    .unwrap_or(0)
                    .max(kv_len)
            } else {
                kv_len
            };
            *held = Some(self.scratch(g, n, seqs, room)?);
        }
        let Some(s) = held.as_ref() else {
            return Err(ModelError::Gpu("scratch buffers missing".into()));
        };
        g.write_f32(&s.x, x).map_err(gpu_err)?;
        let mut b = g.batch();
        // Each block leaves the hidden state where it found it (in `x`).
        let cur = &s.x;
        for (i, l) in self.layers.iter().enumerate() {
            let il = self.first_gpu + i;
            self.record_layer(&mut b, il, i, l, s, cur, &s.x2, n, segments)
                .map_err(gpu_err)?;
        }
        let logits = &s.logits;
        let e = c.n_embd;
        let m = if let [_] = segments {
            let first = which.first(n);
            let m = n - first;
            b.rms_norm(cur, &head.norm, &s.h, e, c.rms_eps)
                .map_err(gpu_err)?;
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
            // Gather each sequence's last hidden state, then one head product
            // for all of them.
            for (j, seg) in segments.iter().enumerate() {
                let at = (seg.first + seg.n - 1) * e;
                b.copy(cur, at, &s.last, j * e, e).map_err(gpu_err)?;
            }
            b.rms_norm(&s.last, &head.norm, &s.h, e, c.rms_eps)
                .map_err(gpu_err)?;
            b.matmul_strided(
                MatmulKernel::Auto,
                &head.weight,
                &s.h,
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
        b.submit().map_err(gpu_err)?;
        g.read_f32_range(logits, 0, m * c.n_vocab).map_err(gpu_err)
    }

    /// Records one block: `cur` holds the hidden state on entry and on exit;
    /// `spare` is scratch of the same size.
    #[allow(clippy::too_many_arguments)]
    fn record_layer(
        &self,
        b: &mut Batch<'_>,
        il: usize,
        i: usize,
        l: &GpuLayer,
        s: &Scratch,
        cur: &Tensor,
        spare: &Tensor,
        n: usize,
        segments: &[Segment<'_>],
    ) -> Result<(), lamina_gpu::GpuError> {
        let c = &self.cpu.config;
        let (e, qd, kvd, hd) = (c.n_embd, c.q_dim(), c.kv_dim(), c.head_dim);
        b.rms_norm(cur, &l.attn_norm, &s.h, e, c.rms_eps)?;
        b.matmul(&l.wq, &s.h, &s.q, n)?;
        b.matmul(&l.wk, &s.h, &s.k, n)?;
        b.matmul(&l.wv, &s.h, &s.v, n)?;
        // Biases (qwen2) then per-head norms (qwen3, gemma3) then RoPE; each
        // step writes the other buffer of its pair, and `q`/`k` name the
        // current one.
        let (mut q, mut q_alt) = (&s.q, &s.q2);
        let (mut k, mut k_alt) = (&s.k, &s.k2);
        if let (Some(bq), Some(bk), Some(bv)) = (&l.bq, &l.bk, &l.bv) {
            b.add_rows(q, bq, q_alt, qd)?;
            std::mem::swap(&mut q, &mut q_alt);
            b.add_rows(k, bk, k_alt, kvd)?;
            std::mem::swap(&mut k, &mut k_alt);
            b.add_rows(&s.v, bv, &s.o2, kvd)?;
            b.copy(&s.o2, 0, &s.v, 0, n * kvd)?;
        }
        if let (Some(qn), Some(kn)) = (&l.q_norm, &l.k_norm) {
            b.rms_norm(q, qn, q_alt, hd, c.rms_eps)?;
            std::mem::swap(&mut q, &mut q_alt);
            b.rms_norm(k, kn, k_alt, hd, c.rms_eps)?;
            std::mem::swap(&mut k, &mut k_alt);
        }
        // RoPE, the cache writes and attention are per sequence: each has
        // its own positions and cache.
        for seg in segments {
            let rope = |heads| Rope {
                head_dim: hd,
                n_rot: c.rope_dim,
                n_heads: heads,
                pos_offset: seg.pos0 as u32,
                freq_base: c.rope_base_for(il),
                neox: c.rope_neox,
            };
            b.rope_tokens(q, q_alt, &rope(c.n_head), seg.first, seg.n)?;
            b.rope_tokens(k, k_alt, &rope(c.n_head_kv), seg.first, seg.n)?;
        }
        std::mem::swap(&mut q, &mut q_alt);
        std::mem::swap(&mut k, &mut k_alt);
        for seg in segments {
            let (kc, vc) = (&seg.cache.k[i], &seg.cache.v[i]);
            let (at, len) = (seg.pos0 * kvd, seg.n * kvd);
            b.copy(k, seg.first * kvd, kc, at, len)?;
            b.copy(&s.v, seg.first * kvd, vc, at, len)?;
            b.attention_at(
                q,
                kc,
                vc,
                &s.scores,
                &s.attn,
                &Attention {
                    n_tokens: seg.n,
                    n_head: c.n_head,
                    n_kv_head: c.n_head_kv,
                    head_dim: hd,
                    pos0: seg.pos0,
                    window: if c.is_swa(il) {
                        c.sliding_window.unwrap_or(0)
                    } else {
                        0
                    },
                    scale: c.attn_scale,
                },
                seg.first,
            )?;
        }
        b.matmul(&l.wo, &s.attn, &s.o, n)?;
        let o = match &l.post_attn_norm {
            Some(w) => {
                b.rms_norm(&s.o, w, &s.o2, e, c.rms_eps)?;
                &s.o2
            }
            None => &s.o,
        };
        b.add(cur, o, spare)?;

        b.rms_norm(spare, &l.ffn_norm, &s.h, e, c.rms_eps)?;
        b.matmul(&l.gate, &s.h, &s.g, n)?;
        b.matmul(&l.up, &s.h, &s.u, n)?;
        match c.activation {
            Activation::SwiGlu => b.silu_mul(&s.g, &s.u, &s.a)?,
            Activation::GeGlu => b.gelu_mul(&s.g, &s.u, &s.a)?,
        }
        b.matmul(&l.down, &s.a, &s.o, n)?;
        let d = match &l.post_ffn_norm {
            Some(w) => {
                b.rms_norm(&s.o, w, &s.o2, e, c.rms_eps)?;
                &s.o2
            }
            None => &s.o,
        };
        b.add(spare, d, cur)
    }
}
