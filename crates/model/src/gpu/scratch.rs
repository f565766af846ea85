//! A step's scratch tensors, kept across steps of any shape.
//!
//! The server's steps change shape all the time: eight decodes, then seven
//! decodes and a 16-token prompt chunk, then seven decodes alone. The
//! scratch used to be sized to each step's shape and made anew whenever the
//! shape changed, and then every dispatch bound new buffers. In
//! `lamina bench serve --ngl all --clients 1,8` on SmolLM2, over half of
//! the eight-client level's steps changed shape; keeping the buffers made
//! that level faster (docs/perf/server.md, 2026-12-07, "warm-up, kept
//! scratch, shared prompt starts"; the rest of what those steps cost was
//! kernels compiled on first use: see the engine's warm-up).
//!
//! So the buffers ([`Pool`]) only grow: each tensor keeps the largest size a
//! step has needed, rounded up so that a growing prompt chunk does not make
//! it again every step, and a step sees exact-length views of them
//! ([`Scratch`]): the kernels take their sizes from the views, and bind
//! groups, which bind whole buffers, stay the same from one shape to the
//! next. Peak memory is what the largest step needed (rounded up), as
//! before; it is now also what is held between steps.

use std::ops::Deref;

use lamina_gpu::{argmax_scratch_len, topk_scratch_len, Gpu, Tensor, TokenRow, TOPK_MAX};

use crate::config::Config;
use crate::error::ModelError;

use super::gpu_err;

/// Steps' token counts are rounded up to this when a buffer grows.
const GROW_TOKENS: usize = 32;
/// And sequence counts to this.
const GROW_SEQS: usize = 4;

macro_rules! buffers {
    ($($(#[$doc:meta])* $field:ident,)*) => {
        /// One value per scratch tensor: the tensor itself, or its length.
        #[derive(Debug)]
        pub(super) struct Buffers<T> {
            $($(#[$doc])* pub $field: T,)*
        }

        impl<T> Buffers<T> {
            /// Each field through `f`.
            fn map<V, E>(&self, mut f: impl FnMut(&T) -> Result<V, E>) -> Result<Buffers<V>, E> {
                Ok(Buffers {
                    $($field: f(&self.$field)?,)*
                })
            }

            /// Each field combined with the same field of `other`.
            fn zip<U, V, E>(
                &self,
                other: &Buffers<U>,
                mut f: impl FnMut(&T, &U) -> Result<V, E>,
            ) -> Result<Buffers<V>, E> {
                Ok(Buffers {
                    $($field: f(&self.$field, &other.$field)?,)*
                })
            }
        }
    };
}

buffers! {
    logits,
    /// Each sequence's greedy pick ((key, index) pairs) and the first
    /// stage of its reduction (`lamina_gpu`'s `argmax_rows`).
    picks,
    pick_pairs,
    /// The last hidden state of each sequence (multi-sequence steps).
    last,
    /// The token table of the step (`TokenRow`s), then the RoPE pair
    /// factors at word 2n (see `HybridModel::rope_factors_at`).
    table,
    /// The same tokens' rows in the sliding-window layers' rings.
    table_ring,
    x,
    x2,
    /// The normed input of the next product (attention, feed-forward, head).
    h,
    /// The stacked QKV product and its biased / per-head-normed copy.
    qkv,
    qkv2,
    q,
    attn,
    o,
    /// The stacked gate/up product and the gated activation.
    gu,
    a,
    /// What a split block hands the CPU, read back at once: the normed
    /// feed-forward input (`n · n_embd`), the router's logits
    /// (`n · n_expert`) and the shared expert's output (`n · n_embd`,
    /// qwen2moe); and the shared expert's stacked gate/up product and
    /// activation (one value each where there is no mixture or no shared
    /// expert).
    moe_io,
    sgu,
    sa,
    /// Routed experts on the GPU: every (token, slot)'s input packed in
    /// expert order (a step the host routes), its activation and output
    /// (one value each where no block has its experts on the GPU).
    xin,
    ea,
    ys,
    /// Each (token, slot)'s row of `ys`, then its weight (f32 bits): the
    /// weighted sum's table (lamina_gpu's `moe_weigh`); then the run tables
    /// of the experts' products (`matmul_runs`).
    route,
    /// The packed experts' indirect dispatch arguments (`moe_pack`).
    moe_args,
    /// The attention chunks' partials.
    scores,
    /// Attention's output gate (qwen35), and the gated output.
    gate,
    gated,
    /// Gated DeltaNet: the q, k, v products and their convolved copy, the
    /// gate z, beta's and alpha's logits, the heads' outputs (one value
    /// each without such blocks).
    d_in,
    d_y,
    d_z,
    d_beta,
    d_alpha,
    d_out,
    /// The norm epilogues' workgroup counter (lamina_gpu::NormAfter). A new
    /// buffer starts zeroed, which is what the counter needs; the kernel
    /// leaves it at zero again.
    norm_count,
}

/// What a step's shape asks of the scratch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Shape {
    /// Tokens of the step, over all its sequences.
    pub n: usize,
    pub seqs: usize,
    /// Positions the attention partials have room for.
    pub kv_room: usize,
}

impl Shape {
    /// Every tensor's length for this shape.
    fn lens(&self, c: &Config, gpu_experts: bool, rope_factor_words: usize) -> Buffers<usize> {
        let Shape { n, seqs, kv_room } = *self;
        let (e, qd, kvd, ff) = (c.n_embd, c.q_dim(), c.kv_dim(), c.n_ff);
        let fs = c.moe.and_then(|m| m.n_ff_shared).unwrap_or(0);
        // (token, slot) pairs of the routed experts on the GPU, if any.
        let (slots, fe) = match c.moe {
            Some(m) if gpu_experts => (n * m.n_used, m.n_ff_exp),
            _ => (0, 0),
        };
        let delta = c.recurrent.and_then(|r| r.delta);
        let (dch, dvd, dnv) = delta.map_or((0, 0, 0), |d| (d.conv_dim(), d.value_dim(), d.n_v));
        Buffers {
            // One row per sequence: the usual ask (a step's last logits).
            // A step that wants more rows gets a tensor of its own, so a
            // long prompt over a large vocabulary (Gemma 3's 262144) does
            // not bind `n` rows of logits it never computes.
            logits: seqs.max(1) * c.n_vocab,
            picks: 2 * seqs.max(1),
            pick_pairs: argmax_scratch_len(seqs.max(1), c.n_vocab).max(1),
            last: (seqs * e).max(1),
            table: 2 * n + rope_factor_words,
            table_ring: 2 * n + rope_factor_words,
            x: n * e,
            x2: n * e,
            h: n * e,
            qkv: n * (qd + 2 * kvd),
            qkv2: n * (qd + 2 * kvd),
            q: n * qd,
            attn: n * qd,
            o: n * e,
            gu: n * 2 * ff,
            a: n * ff,
            moe_io: (n * c.moe.map_or(0, |m| super::moe::moe_io_width(c, &m))).max(1),
            sgu: (n * 2 * fs).max(1),
            sa: (n * fs).max(1),
            xin: (slots * e).max(1),
            ea: (slots * fe).max(1),
            ys: (slots * e).max(1),
            route: (slots * 11).max(1),
            moe_args: 6,
            scores: lamina_gpu::attention_scratch_len(n, c.n_head, c.head_dim, kv_room),
            gate: if c.attn_gate { n * qd } else { 1 },
            gated: if c.attn_gate { n * qd } else { 1 },
            d_in: (n * dch).max(1),
            d_y: (n * dch).max(1),
            d_z: (n * dvd).max(1),
            d_beta: (n * dnv).max(1),
            d_alpha: (n * dnv).max(1),
            d_out: (n * dvd).max(1),
            norm_count: 1,
        }
    }
}

/// The buffers behind every step's [`Scratch`]: each as large as the
/// largest step so far needed (rounded up), never smaller.
pub(super) struct Pool {
    full: Buffers<Tensor>,
    /// The top-k stages' tensors and the candidates: made by the first step
    /// that asks for them, sized for the sequences of that step's pool.
    top: Option<([Tensor; 3], usize)>,
}

/// One step's scratch: exact-length views of a [`Pool`]'s buffers, and the
/// host side of its token tables.
pub(super) struct Scratch {
    pub n: usize,
    t: Buffers<Tensor>,
    /// Each sequence's best logits ((key, index) pairs, [`TOPK_MAX`] a
    /// sequence) and the two tensors of their stages (`lamina_gpu`'s
    /// `topk_rows`), when the step asked for them.
    pub top: Option<[Tensor; 3]>,
    /// The host copies of `table` and `table_ring`.
    pub rows: Vec<TokenRow>,
    pub rows_ring: Vec<TokenRow>,
}

impl Deref for Scratch {
    type Target = Buffers<Tensor>;

    fn deref(&self) -> &Buffers<Tensor> {
        &self.t
    }
}

fn view(t: &Tensor, len: usize) -> Result<Tensor, ModelError> {
    t.prefix(len)
        .ok_or_else(|| ModelError::Step("a scratch buffer smaller than its step".into()))
}

impl Pool {
    /// A step's scratch for `shape` from `pool` (`None`: nothing made yet),
    /// growing the buffers that are too small for it; with `top`, the
    /// top-k tensors too.
    pub fn step(
        pool: &mut Option<Pool>,
        g: &Gpu,
        c: &Config,
        gpu_experts: bool,
        rope_factor_words: usize,
        shape: Shape,
        top: bool,
    ) -> Result<Scratch, ModelError> {
        let lens = |s: Shape| s.lens(c, gpu_experts, rope_factor_words);
        let need = lens(shape);
        let mut grown = lens(Shape {
            n: shape.n.next_multiple_of(GROW_TOKENS),
            seqs: shape.seqs.next_multiple_of(GROW_SEQS),
            kv_room: shape.kv_room,
        });
        // The attention partials grow with tokens times context: rounding
        // the tokens up would hold several times what a decode step over a
        // long context needs.
        grown.scores = need.scores;
        // (what the step needs, what a buffer grows to)
        let sizes = need.zip(&grown, |&len, &round| {
            Ok::<_, ModelError>((len, round.max(len)))
        })?;
        let make = |len: usize| g.tensor(len).map_err(gpu_err);
        let old = pool.take();
        let full = match &old {
            Some(old) => old.full.zip(&sizes, |t, &(len, round)| {
                if t.len() >= len {
                    Ok(t.clone())
                } else {
                    make(round)
                }
            })?,
            None => sizes.map(|&(_, round)| make(round))?,
        };
        let mut top_pool = old.and_then(|o| o.top);
        let rows = shape.seqs.max(1);
        let words = |rows: usize| topk_scratch_len(rows, c.n_vocab, TOPK_MAX).max(1);
        if top && top_pool.as_ref().is_none_or(|(_, cap)| *cap < rows) {
            let cap = rows.next_multiple_of(GROW_SEQS);
            top_pool = Some((
                [
                    make(words(cap))?,
                    make(words(cap))?,
                    make(2 * TOPK_MAX * cap)?,
                ],
                cap,
            ));
        }
        let top = match (&top_pool, top) {
            (Some(([t0, t1, out], _)), true) => Some([
                view(t0, words(rows))?,
                view(t1, words(rows))?,
                view(out, 2 * TOPK_MAX * rows)?,
            ]),
            _ => None,
        };
        let t = full.zip(&need, |t, &len| view(t, len))?;
        *pool = Some(Pool {
            full,
            top: top_pool,
        });
        Ok(Scratch {
            n: shape.n,
            t,
            top,
            rows: Vec::with_capacity(shape.n),
            rows_ring: Vec::with_capacity(shape.n),
        })
    }
}
