//! The recorder: a block's planned dispatches ([`super::fusion`]) into a
//! step's batch. It decides nothing: every fusion was chosen by the plan.

use std::sync::Arc;

use lamina_gpu::{
    Attention, Batch, Columns, DeltaShape, Fuse, Gate, Gpu, NormAfter, QkvLayout, Rope, RopeOut,
    Tensor, TokenTable,
};

use super::fusion::Dispatch;
use super::scratch::Scratch;
use super::upload::{GpuFfn, GpuLayer};
use super::{gpu_err, moe::moe_io_width, HybridModel, Segment};
use crate::config::{Activation, Config};
use crate::error::ModelError;

/// The buffers a block reads and writes in a step: the hidden state
/// `cur` on entry and on exit, `spare` of the same size, and the norm
/// that follows the block (the next block's, or the head's).
pub(super) struct BlockIo<'s> {
    pub(super) s: &'s Scratch,
    pub(super) cur: &'s Tensor,
    pub(super) spare: &'s Tensor,
    pub(super) next_norm: &'s Tensor,
    pub(super) n: usize,
    pub(super) segments: &'s [Segment<'s>],
}

/// Dispatches recorded in the blocks of a step, across the submissions a
/// host-routed mixture splits it into.
pub(super) struct Counted {
    /// The batch's length where the blocks' count resumes.
    pub(super) before: usize,
    /// Dispatches of batches already submitted.
    pub(super) dispatched: usize,
}

impl HybridModel<'_> {
    /// Records GPU layer `i`'s `plan`: `io.cur` holds the hidden state on
    /// entry and on exit, and `h` the next norm where the plan says so.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn record_block<'g>(
        &self,
        g: &'g Gpu,
        b: &mut Batch<'g>,
        count: &mut Counted,
        i: usize,
        l: &GpuLayer,
        plan: &[Dispatch],
        io: &BlockIo<'_>,
    ) -> Result<(), ModelError> {
        let c = &self.cpu.config;
        let il = self.first_gpu + i;
        let blk = &self.cpu.programs[il].block;
        let BlockIo {
            s,
            cur,
            spare,
            next_norm,
            n,
            segments,
        } = *io;
        let (e, hd, eps) = (c.n_embd, c.head_dim, blk.eps);
        let layout = QkvLayout {
            n_head: c.n_head,
            n_kv_head: c.n_head_kv,
            head_dim: hd,
            kv: self.gpu_kv,
        };
        let rope = Rope {
            head_dim: hd,
            n_rot: blk.rope.n_rot,
            n_heads: c.n_head,
            pos_offset: 0,
            freq_base: blk.rope.base,
            neox: blk.rope.neox,
            freq_scale: blk.rope.scale,
            mscale: blk.rope.mscale,
            factors_at: rope_factors_at(c, s.n).map_err(gpu_err)?,
        };
        let gate = match blk.activation {
            Activation::SwiGlu => Gate::Silu,
            Activation::GeGlu => Gate::GeluTanh,
        };
        let add = Fuse {
            add: true,
            ..Fuse::default()
        };
        let add_norm = |weight, out| Fuse {
            add: true,
            norm_after: Some(NormAfter {
                weight,
                eps,
                out,
                counter: &s.norm_count,
            }),
            ..Fuse::default()
        };
        let attn_norm = |norm: bool| norm.then_some((&l.attn_norm, eps));
        // Where the values and the queries and keys are after each step
        // between the QKV product and RoPE (biases, head norms), and where
        // the hidden state is after the attention's residual.
        let (mut v_src, mut qk_src, mut sum) = (&s.qkv, &s.qkv, cur);
        // Where the attention's output is: gated, after an output gate.
        let mut attn_src = &s.attn;
        for d in plan {
            match *d {
                Dispatch::Norm => b.rms_norm(cur, &l.attn_norm, &s.h, e, eps),
                Dispatch::Qkv { norm } => {
                    let x = if norm { cur } else { &s.h };
                    let fuse = attn_norm(norm).map(|norm| Fuse {
                        norm: Some(norm),
                        ..Fuse::default()
                    });
                    l.qkv.record(b, x, &s.qkv, n, fuse)
                }
                Dispatch::QkvRope { norm } => {
                    let [w] = &l.qkv.parts[..] else {
                        return Err(planned("RoPE in the epilogue of one QKV weight"));
                    };
                    let arena = &segments[0].cache.arena;
                    let ring = arena.ring_of(i);
                    let out = RopeOut {
                        k_cache: &arena.k[i],
                        v_cache: &arena.v[i],
                        layout,
                        rope,
                        table: table(s, ring),
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
                        norm: attn_norm(norm),
                        rope: Some(out),
                        ..Fuse::default()
                    };
                    let x = if norm { cur } else { &s.h };
                    b.matmul_fused(w, x, &s.q, cols, fuse)
                }
                Dispatch::Bias => {
                    let Some(bias) = &l.bqkv else {
                        return Err(planned("QKV biases"));
                    };
                    v_src = &s.qkv2;
                    qk_src = &s.qkv2;
                    b.add_rows(&s.qkv, bias, &s.qkv2, layout.stride())
                }
                Dispatch::HeadNorms => {
                    let (Some(qn), Some(kn)) = (&l.q_norm, &l.k_norm) else {
                        return Err(planned("per-head norms"));
                    };
                    let dst = if l.bqkv.is_some() { &s.qkv } else { &s.qkv2 };
                    let r = b.head_norms(qk_src, qn, kn, dst, &layout, n, c.rms_eps);
                    qk_src = dst;
                    r
                }
                Dispatch::RopeStore => runs(segments, |arena, first, tokens| {
                    let (kc, vc) = (&arena.k[i], &arena.v[i]);
                    let t = table(s, arena.ring_of(i));
                    b.rope_kv_rows(
                        qk_src, v_src, &s.q, kc, vc, &layout, &rope, t, first, tokens,
                    )
                }),
                Dispatch::Attend => runs(segments, |arena, first, tokens| {
                    let ring = arena.ring_of(i);
                    let a = Attention {
                        n_tokens: tokens,
                        n_head: c.n_head,
                        n_kv_head: c.n_head_kv,
                        head_dim: hd,
                        pos0: 0,
                        window: blk.window.kernel_width(),
                        scale: blk.attn_scale,
                        kv: layout.kv,
                        ring,
                    };
                    let (kc, vc) = (&arena.k[i], &arena.v[i]);
                    b.attention_rows(&s.q, kc, vc, &s.scores, &s.attn, &a, table(s, ring), first)
                }),
                Dispatch::OutAdd { norm_after } => {
                    let cols = Columns::packed(n, &l.wo);
                    let fuse = if norm_after {
                        add_norm(&l.ffn_norm, &s.h)
                    } else {
                        add
                    };
                    b.matmul_fused(&l.wo, attn_src, cur, cols, fuse)
                }
                Dispatch::Out => b.matmul(&l.wo, attn_src, &s.o, n),
                Dispatch::OutputGate => {
                    let Some(gw) = &l.gate else {
                        return Err(planned("an output gate's weight"));
                    };
                    attn_src = &s.gated;
                    b.matmul(gw, &s.h, &s.gate, n)
                        .and_then(|()| b.sigmoid_mul(&s.gate, &s.attn, &s.gated))
                }
                Dispatch::DeltaNet => {
                    let (Some(dw), Some(d)) = (&l.delta, c.recurrent.and_then(|r| r.delta)) else {
                        return Err(planned("Gated DeltaNet weights"));
                    };
                    let kernel = c.recurrent.map_or(0, |r| r.conv_kernel);
                    let state_len = c.state_len(il);
                    self.record_delta(b, dw, d, kernel, state_len, i, eps, s, segments)
                        .and_then(|()| b.matmul(&l.wo, &s.d_out, &s.o, n))
                }
                Dispatch::AttnResidual => {
                    sum = spare;
                    let post = l.post_attn_norm.as_ref();
                    b.add_rms_norm(cur, &s.o, post, &l.ffn_norm, spare, &s.h, e, eps)
                }
                Dispatch::GateUpAct { norm } => {
                    let GpuFfn::Dense { gate_up, .. } = &l.ffn else {
                        return Err(planned("a dense feed-forward"));
                    };
                    let [w] = &gate_up.parts[..] else {
                        return Err(planned("gate and up as one weight"));
                    };
                    if norm {
                        b.matmul_glu_normed(w, cur, &s.gu, &s.a, n, gate, (&l.ffn_norm, eps))
                    } else {
                        b.matmul_glu(w, &s.h, &s.gu, &s.a, n, gate)
                    }
                }
                Dispatch::GateUp => {
                    let GpuFfn::Dense { gate_up, .. } = &l.ffn else {
                        return Err(planned("a dense feed-forward"));
                    };
                    gate_up.record(b, &s.h, &s.gu, n, None)
                }
                Dispatch::Act => b.glu_stacked(&s.gu, &s.a, c.n_ff, gate),
                Dispatch::DownAdd { norm_after } => {
                    let GpuFfn::Dense { down, .. } = &l.ffn else {
                        return Err(planned("a dense feed-forward"));
                    };
                    let cols = Columns::packed(n, down);
                    let fuse = if norm_after {
                        add_norm(next_norm, &s.h)
                    } else {
                        add
                    };
                    b.matmul_fused(down, &s.a, sum, cols, fuse)
                }
                Dispatch::Down => {
                    let GpuFfn::Dense { down, .. } = &l.ffn else {
                        return Err(planned("a dense feed-forward"));
                    };
                    b.matmul(down, &s.a, &s.o, n)
                }
                Dispatch::FfnResidual => {
                    let post = l.post_ffn_norm.as_ref();
                    b.add_rms_norm(sum, &s.o, post, next_norm, cur, &s.h, e, eps)
                }
                Dispatch::Router => self.record_router(b, l, s, n),
                Dispatch::Recurrent => {
                    return Err(planned("a recurrent block's kernels (it runs on the CPU)"))
                }
                Dispatch::Experts => {
                    match (self.device_experts(g, l, n), l.gpu_experts()) {
                        // Routed on the device: the experts follow in the
                        // same submission.
                        (Some((r, how)), Some(gx)) => {
                            self.record_device_experts(b, l, gx, r, how, s, n)
                        }
                        // Else the host routes (or reads the device's
                        // routes) between two submissions, from one
                        // readback of the input, the router's logits and
                        // the shared output; the sum comes back in `o` for
                        // the residual add.
                        _ => {
                            count.dispatched += b.len() - count.before;
                            let width = c.moe.map_or(0, |m| moe_io_width(c, &m));
                            let io = std::mem::replace(b, g.batch())
                                .submit_read_f32(&s.moe_io, 0, n * width)
                                .map_err(gpu_err)?;
                            self.run_split_experts(g, b, il, l, s, n, io)?;
                            count.before = 0;
                            Ok(())
                        }
                    }
                }
            }
            .map_err(gpu_err)?;
        }
        Ok(())
    }
}

impl HybridModel<'_> {
    /// A Gated DeltaNet block's input products over the step's tokens,
    /// then per sequence the convolution, the delta rule over its state
    /// and the gated norm, into `s.d_out`.
    #[allow(clippy::too_many_arguments)]
    fn record_delta(
        &self,
        b: &mut Batch<'_>,
        dw: &super::upload::GpuDelta,
        d: crate::config::DeltaNet,
        kernel: usize,
        state_len: usize,
        i: usize,
        eps: f32,
        s: &Scratch,
        segments: &[Segment<'_>],
    ) -> Result<(), lamina_gpu::GpuError> {
        let n = s.n;
        b.matmul(&dw.qkv, &s.h, &s.d_in, n)?;
        b.matmul(&dw.z, &s.h, &s.d_z, n)?;
        b.matmul(&dw.beta, &s.h, &s.d_beta, n)?;
        b.matmul(&dw.alpha, &s.h, &s.d_alpha, n)?;
        for seg in segments {
            let Some(Some(state)) = seg.cache.arena.states.get(i) else {
                return Err(lamina_gpu::GpuError::Shape {
                    op: "delta",
                    message: "a recurrent layer's cache has no state".into(),
                });
            };
            let shape = DeltaShape {
                kernel,
                head_k: d.head_k,
                head_v: d.head_v,
                n_k: d.n_k,
                n_v: d.n_v,
                grouped: d.grouped,
                eps,
                first: seg.first,
                n: seg.n,
                state_at: seg.cache.slot * state_len,
            };
            b.delta_conv(&s.d_in, &dw.conv, state, &s.d_y, &shape)?;
            b.delta_scan(
                &s.d_y, &s.d_beta, &s.d_alpha, &dw.dt, &dw.a, state, &s.d_out, &shape,
            )?;
            b.delta_gate(&s.d_out, &s.d_z, &dw.norm, &shape)?;
        }
        Ok(())
    }
}

/// A plan that names a weight the block lacks: a bug in the planner.
fn planned(what: &str) -> ModelError {
    ModelError::Step(format!("the block's plan needs {what}, which it has not"))
}

/// Runs `f(arena, first token, tokens)` once for each run of `segments`
/// whose caches share buffers (all of them, for the server's slots), every
/// token at its own position and rows (the token table); the segments'
/// tokens are packed in order.
fn runs(
    segments: &[Segment<'_>],
    mut f: impl FnMut(&super::KvArena, usize, usize) -> Result<(), lamina_gpu::GpuError>,
) -> Result<(), lamina_gpu::GpuError> {
    let mut at = 0;
    while let Some(seg) = segments.get(at) {
        let arena = &seg.cache.arena;
        let run = segments[at..]
            .iter()
            .take_while(|o| Arc::ptr_eq(&o.cache.arena, arena))
            .count();
        let tokens: usize = segments[at..at + run].iter().map(|o| o.n).sum();
        f(arena, seg.first, tokens)?;
        at += run;
    }
    Ok(())
}

/// Words a token table holds after its entries: the file's RoPE pair
/// factors (`rope_freqs`), which the RoPE kernels read from the table
/// they already bind.
pub(super) fn rope_factor_words(c: &Config) -> usize {
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
