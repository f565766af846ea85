//! The forward pass on the CPU, over the mapped quantized weights.
//!
//! Each layer runs its block program ([`crate::program`]) op by op.
//! A batch of tokens (a prompt, or one token while decoding) goes through each
//! layer as one matrix product per weight, so a weight is read once per step.

use rayon::prelude::*;

use crate::block::Block;
use crate::config::{Activation, Config};
use crate::error::ModelError;
use crate::kv::{KvCache, KvStore};
use crate::moe::{experts, gated};
use crate::ops::{self, sized};
use crate::program::{Op, Program};
use crate::weights::{Ffn, Mixer, RecurrentWeights, Weights};
use lamina_quant::act::Glu;

/// Runs a step of `n` tokens as steps of at most `limit` tokens (what a
/// sliding-window ring allows, [`crate::kv::max_step`]): `run(range,
/// which)` runs one of them. Returns the logits `which` asks of the whole
/// step. The kernels are batch invariant, so the split changes no bits.
pub(crate) fn split_steps(
    n: usize,
    limit: usize,
    which: Logits,
    mut run: impl FnMut(std::ops::Range<usize>, Logits) -> Result<Vec<f32>, ModelError>,
) -> Result<Vec<f32>, ModelError> {
    if n <= limit {
        return run(0..n, which);
    }
    let mut out = Vec::new();
    let mut s = 0;
    while s < n {
        let e = (s + limit).min(n);
        let part = match which {
            Logits::From(i) if i >= e => Logits::Last,
            Logits::From(i) => Logits::From(i.saturating_sub(s)),
            w => w,
        };
        let got = run(s..e, part)?;
        match which {
            Logits::Last if e == n => out = got,
            Logits::Hidden => out.extend(got),
            Logits::From(i) if i < e => out.extend(got),
            _ => {}
        }
        s = e;
    }
    Ok(out)
}

/// [`split_steps`] for a step of several sequences: rounds in which each
/// sequence with tokens left takes up to `limit` more; each sequence's
/// logits are those of the round its tokens ended in.
pub(crate) fn split_multi<C, T: Default>(
    work: &mut [(&[u32], &mut C)],
    limit: usize,
    mut run: impl FnMut(&mut [(&[u32], &mut C)]) -> Result<Vec<T>, ModelError>,
) -> Result<Vec<T>, ModelError> {
    if work.iter().all(|(t, _)| t.len() <= limit) {
        return run(work);
    }
    let mut out: Vec<T> = work.iter().map(|_| T::default()).collect();
    let mut off = 0;
    loop {
        let mut idx = Vec::new();
        let mut round: Vec<(&[u32], &mut C)> = Vec::new();
        for (i, (t, c)) in work.iter_mut().enumerate() {
            let t: &[u32] = t;
            if t.len() > off {
                idx.push(i);
                round.push((&t[off..(off + limit).min(t.len())], &mut **c));
            }
        }
        if round.is_empty() {
            return Ok(out);
        }
        for (i, got) in idx.into_iter().zip(run(&mut round)?) {
            out[i] = got;
        }
        off += limit;
    }
}

/// Checks a step that keeps `keep[i]` rows of logits of sequence `i`
/// (`forward_multi_rows`) before anything runs: one row at least, no more
/// than its tokens, and tokens one step of its cache takes (`limit`), so
/// the step needs no rounds.
pub(crate) fn check_rows<C>(
    work: &[(&[u32], &mut C)],
    keep: &[usize],
    limit: usize,
) -> Result<(), ModelError> {
    if keep.len() != work.len() {
        return Err(ModelError::Step(format!(
            "{} row counts for {} sequences",
            keep.len(),
            work.len()
        )));
    }
    for ((t, _), &k) in work.iter().zip(keep) {
        if k == 0 || k > t.len() || t.len() > limit {
            return Err(ModelError::Step(format!(
                "a step keeps 1 to {} rows of a sequence of {} tokens (at most {limit} a step); \
                 asked {k}",
                t.len(),
                t.len()
            )));
        }
    }
    Ok(())
}

/// Rows of a multi-sequence batch that belong to one sequence.
#[derive(Clone, Copy, Debug)]
struct Segment {
    start: usize,
    n: usize,
    pos0: usize,
}

/// The stand-in recurrent block ([`Op::Recurrent`]) over one sequence's
/// inputs `u` (`ch` per token, in order) from its `state` (the last
/// `kernel − 1` inputs, oldest first, then the recurrence's `ch` values),
/// left holding the state after the last token; `y` gets each token's
/// recurrence state. Token by token in order, so a sequence's bits do not
/// depend on how its tokens were split into steps.
fn recurrent_scan(
    w: &RecurrentWeights<'_>,
    kernel: usize,
    ch: usize,
    state: &mut [f32],
    u: &[f32],
    y: &mut [f32],
) {
    let (window, s) = state.split_at_mut((kernel - 1) * ch);
    for (row, out) in u.chunks_exact(ch).zip(y.chunks_exact_mut(ch)) {
        for c in 0..ch {
            let taps = &w.conv[c * kernel..(c + 1) * kernel];
            let mut acc = taps[kernel - 1] * row[c];
            for (j, tap) in taps[..kernel - 1].iter().enumerate() {
                acc += tap * window[j * ch + c];
            }
            let act = acc / (1.0 + (-acc).exp());
            let decay = 1.0 / (1.0 + (-w.decay[c]).exp());
            s[c] = decay * s[c] + act;
            out[c] = s[c];
        }
        // The window moves on by one input.
        window.copy_within(ch.., 0);
        let last = window.len() - ch;
        window[last..].copy_from_slice(row);
    }
}

/// What the ops of one layer's step share: the layer, the step's rows and
/// the sequences' caches.
struct Step<'s, 'c> {
    il: usize,
    n: usize,
    blk: &'s Block,
    segs: &'s [Segment],
    caches: &'s mut [&'c mut KvCache],
}

/// Attention of every row's queries `q` over its sequence's cache rows
/// (`kv[seq]`: keys, values, rows kept), one task per token and run of
/// `gs` query heads that share a KV head: each key and value row is read
/// once for the run (a long context streams the cache once per KV head,
/// not once per query head), with the bits of one head at a time. The run
/// is the whole group unless that leaves fewer than two tasks per thread
/// (a decode step of a model with one KV head would run on one core).
fn attend(
    c: &Config,
    blk: &Block,
    q: &[f32],
    kv: &[(&KvStore, &KvStore, usize)],
    row_seg: &[usize],
    row_pos: &[usize],
    attn: &mut [f32],
) {
    let (qd, kvd, hd) = (c.q_dim(), c.kv_dim(), c.head_dim);
    let n = q.len() / qd;
    let group = c.n_head / c.n_head_kv;
    let threads = rayon::current_num_threads().max(1);
    let gs = (1..=group)
        .rev()
        .filter(|d| group % d == 0)
        .find(|&d| n * c.n_head / d >= threads)
        .unwrap_or(1);
    attn.par_chunks_mut(gs * hd)
        .enumerate()
        .for_each(|(i, out)| {
            let runs = c.n_head / gs;
            let (t, head) = (i / runs, i % runs * gs);
            let (kc, vc, ring) = kv[row_seg[t]];
            let p = row_pos[t];
            let lo = blk.window.first(p);
            let len = p + 1 - lo;
            let qh = &q[t * qd + head * hd..][..gs * hd];
            let koff = head / group * hd;
            let mut scores = vec![0.0f32; gs * len];
            lamina_quant::attention_scores_rows(
                qh,
                &kc.rows(koff, kvd, hd, lo % ring, ring),
                blk.attn_scale,
                &mut scores,
            );
            scores.chunks_mut(len).for_each(ops::softmax);
            lamina_quant::attention_values_rows(
                &scores,
                len,
                &vc.rows(koff, kvd, hd, lo % ring, ring),
                out,
            );
        });
}

/// Which positions of a batch get logits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Logits {
    /// Only the last token (generation).
    Last,
    /// Every token from this index of the batch on (teacher forcing, scoring).
    From(usize),
    /// No logits: every position's hidden state after the final norm, the
    /// `n_embd` values the head would multiply (what embeddings pool, as
    /// llama.cpp's `result_norm`).
    Hidden,
}

impl Logits {
    /// The first batch index that gets logits, for a batch of `n`.
    pub fn first(self, n: usize) -> usize {
        match self {
            Logits::Last => n.saturating_sub(1),
            Logits::From(i) => i.min(n),
            Logits::Hidden => 0,
        }
    }
}

/// The buffers of one layer's step, kept across the layers of a forward
/// pass: every layer of a step has the same shapes, so only the first one
/// allocates. Fresh buffers per layer cost a prompt a twentieth of its time
/// in page faults and zeroing, as the allocator gave large blocks back to
/// the system and took them again.
#[derive(Default)]
pub(crate) struct Scratch {
    h: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    attn: Vec<f32>,
    o: Vec<f32>,
    g: Vec<f32>,
    u: Vec<f32>,
    /// Attention's output gate (split from Q's product).
    gate: Vec<f32>,
    row_seg: Vec<usize>,
    row_pos: Vec<usize>,
}

pub struct CpuModel<'a> {
    pub config: Config,
    pub weights: Weights<'a>,
    /// The weights are read in place from a map (not `--no-mmap`): their
    /// pages are page cache, which the cache's memory check keeps free.
    pub(crate) mapped: bool,
    /// Each layer's block program.
    pub(crate) programs: Vec<Program>,
}

/// Runs `f` on a thread of rayon's pool (at once when already on one).
///
/// The kernels split a product over the pool only where the split pays for
/// its hand-off (lamina-quant's `dot.rs`): asked from a thread outside the
/// pool, a split costs two thread wake-ups, about as long as a small model's
/// whole product, so every product of its decode step ran on the calling
/// thread alone, one core of two. Inside the pool a split is a steal, far
/// cheaper, and both cores share each product (docs/perf/cpu.md,
/// 2026-12-05). A forward call makes one hand-off instead. The kernels
/// give the same bits however the rows are split, so this changes speed
/// only.
pub(crate) fn in_pool<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    if rayon::current_thread_index().is_some() {
        f()
    } else {
        rayon::scope(|_| f())
    }
}

impl<'a> CpuModel<'a> {
    pub fn load(model: &'a lamina_gguf::Model) -> Result<Self, ModelError> {
        let config = Config::from_gguf(model)?;
        let weights = Weights::load(model, &config)?;
        let mapped = model.shards().iter().all(|f| f.is_mapped());
        Ok(Self {
            programs: Program::all(&config),
            config,
            weights,
            mapped,
        })
    }

    /// Runs `tokens` at positions `cache.len()..`, appends their keys and
    /// values, and returns the logits asked for, `n_vocab` per position.
    pub fn forward(
        &self,
        tokens: &[u32],
        cache: &mut KvCache,
        which: Logits,
    ) -> Result<Vec<f32>, ModelError> {
        let limit = crate::kv::max_step(&self.config, cache.n_ctx);
        split_steps(tokens.len(), limit, which, |r, w| {
            self.forward_step(&tokens[r], cache, w)
        })
    }

    fn forward_step(
        &self,
        tokens: &[u32],
        cache: &mut KvCache,
        which: Logits,
    ) -> Result<Vec<f32>, ModelError> {
        in_pool(|| {
            let pos0 = cache.len;
            self.check_room(tokens.len(), pos0, cache.n_ctx)?;
            let mut x = self.embed(tokens)?;
            let mut scratch = Scratch::default();
            for il in 0..self.config.n_layer {
                self.layer(il, &mut x, tokens.len(), pos0, cache, &mut scratch)?;
            }
            cache.advance(pos0 + tokens.len());
            self.head(&x, tokens.len(), which)
        })
    }

    /// One step for several sequences at once, each with its own cache:
    /// their tokens go through every weight together (read once), and each
    /// gets the logits of its last token. Results equal separate
    /// [`CpuModel::forward`] calls bit for bit.
    pub fn forward_multi(
        &self,
        work: &mut [(&[u32], &mut KvCache)],
    ) -> Result<Vec<Vec<f32>>, ModelError> {
        let limit = work
            .iter()
            .map(|(_, c)| crate::kv::max_step(&self.config, c.n_ctx))
            .min()
            .unwrap_or(usize::MAX);
        in_pool(|| {
            split_multi(work, limit, |w| {
                let ones = vec![1; w.len()];
                self.forward_multi_here(w, &ones)
            })
        })
    }

    /// [`CpuModel::forward_multi`] where sequence `i` gets the logits of its
    /// last `keep[i]` tokens, one row after another (what verifying a
    /// drafted run needs): the rows [`CpuModel::forward`] gives with
    /// [`Logits::From`], bit for bit. Fails without running anything when a
    /// sequence asks for no row or more rows than it has tokens, or has
    /// more tokens than one step of its cache takes.
    pub fn forward_multi_rows(
        &self,
        work: &mut [(&[u32], &mut KvCache)],
        keep: &[usize],
    ) -> Result<Vec<Vec<f32>>, ModelError> {
        let limit = work
            .iter()
            .map(|(_, c)| crate::kv::max_step(&self.config, c.n_ctx))
            .min()
            .unwrap_or(usize::MAX);
        check_rows(work, keep, limit)?;
        in_pool(|| self.forward_multi_here(work, keep))
    }

    fn forward_multi_here(
        &self,
        work: &mut [(&[u32], &mut KvCache)],
        keep: &[usize],
    ) -> Result<Vec<Vec<f32>>, ModelError> {
        let c = &self.config;
        let mut segs = Vec::with_capacity(work.len());
        let mut tokens = Vec::new();
        for (t, cache) in work.iter() {
            self.check_room(t.len(), cache.len, cache.n_ctx)?;
            if t.is_empty() {
                return Err(ModelError::EmptyBatch);
            }
            segs.push(Segment {
                start: tokens.len(),
                n: t.len(),
                pos0: cache.len,
            });
            tokens.extend_from_slice(t);
        }
        let mut x = self.embed(&tokens)?;
        let mut caches: Vec<&mut KvCache> = work.iter_mut().map(|(_, c)| &mut **c).collect();
        let mut scratch = Scratch::default();
        for il in 0..c.n_layer {
            self.layer_multi(il, &mut x, &segs, &mut caches, &mut scratch)?;
        }
        for (sg, cache) in segs.iter().zip(caches.iter_mut()) {
            cache.advance(sg.pos0 + sg.n);
        }
        // The last `keep` rows of each sequence, through the head as one
        // product.
        let e = c.n_embd;
        let rows: usize = keep.iter().sum();
        let mut last = Vec::with_capacity(rows * e);
        for (sg, &k) in segs.iter().zip(keep) {
            let k = k.clamp(1, sg.n);
            last.extend_from_slice(&x[(sg.start + sg.n - k) * e..][..k * e]);
        }
        let logits = self.head(&last, last.len() / e, Logits::From(0))?;
        let mut out = Vec::with_capacity(segs.len());
        let mut at = 0;
        for (sg, &k) in segs.iter().zip(keep) {
            let k = k.clamp(1, sg.n) * c.n_vocab;
            out.push(logits[at..at + k].to_vec());
            at += k;
        }
        Ok(out)
    }

    pub(crate) fn check_room(&self, n: usize, pos0: usize, n_ctx: usize) -> Result<(), ModelError> {
        if pos0 + n > n_ctx {
            return Err(ModelError::ContextFull {
                pos: pos0 + n,
                n_ctx,
            });
        }
        Ok(())
    }

    /// The token embedding rows (scaled where the architecture says), always
    /// looked up on the CPU from the map.
    pub(crate) fn embed(&self, tokens: &[u32]) -> Result<Vec<f32>, ModelError> {
        let c = &self.config;
        let e = c.n_embd;
        let mut x = vec![0.0f32; tokens.len() * e];
        for (t, &id) in tokens.iter().enumerate() {
            if id as usize >= c.n_vocab {
                return Err(ModelError::BadToken {
                    id,
                    n_vocab: c.n_vocab,
                });
            }
            let row = &mut x[t * e..(t + 1) * e];
            self.weights.token_embd.row(id as usize, row)?;
            if let Some(s) = c.embed_scale {
                row.iter_mut().for_each(|v| *v *= s);
            }
        }
        Ok(x)
    }

    /// Final norm and output head for the positions `which` selects.
    pub(crate) fn head(&self, x: &[f32], n: usize, which: Logits) -> Result<Vec<f32>, ModelError> {
        let c = &self.config;
        let e = c.n_embd;
        let first = which.first(n);
        let mut h = x[first * e..].to_vec();
        let m = n - first;
        for row in h.chunks_mut(e) {
            ops::rms_norm(row, &self.weights.output_norm, c.rms_eps);
        }
        if which == Logits::Hidden {
            return Ok(h);
        }
        let mut logits = vec![0.0f32; m * c.n_vocab];
        self.weights.output.matmul(&h, m, &mut logits)?;
        Ok(logits)
    }

    /// Advances the cache after the layers of a step ran elsewhere too.
    pub(crate) fn commit(cache: &mut KvCache, len: usize) {
        cache.advance(len);
    }

    /// Runs layer `il` on the CPU over `n` tokens starting at position `pos0`.
    pub(crate) fn layer(
        &self,
        il: usize,
        x: &mut [f32],
        n: usize,
        pos0: usize,
        cache: &mut KvCache,
        scratch: &mut Scratch,
    ) -> Result<(), ModelError> {
        self.layer_multi(
            il,
            x,
            &[Segment { start: 0, n, pos0 }],
            &mut [cache],
            scratch,
        )
    }

    /// Runs layer `il`'s program over several sequences at once: rows
    /// `seg.start..seg.start + seg.n` of `x` belong to the sequence whose
    /// cache is `caches[i]`, at positions `seg.pos0..`. The projections are
    /// one matrix product over all rows (each weight read once per step);
    /// attention is per sequence, against its own cache. Because the kernels
    /// are batch invariant, a sequence's result does not depend on what else
    /// is in the batch.
    fn layer_multi(
        &self,
        il: usize,
        x: &mut [f32],
        segs: &[Segment],
        caches: &mut [&mut KvCache],
        scratch: &mut Scratch,
    ) -> Result<(), ModelError> {
        let c = &self.config;
        let n = x.len() / c.n_embd;
        // Each row's sequence and position.
        scratch.row_seg.clear();
        scratch.row_pos.clear();
        for (si, sg) in segs.iter().enumerate() {
            scratch.row_seg.extend(std::iter::repeat_n(si, sg.n));
            scratch.row_pos.extend(sg.pos0..sg.pos0 + sg.n);
        }
        let program = &self.programs[il];
        let mut step = Step {
            il,
            n,
            blk: &program.block,
            segs,
            caches,
        };
        for op in &program.ops {
            self.run_op(op, &mut step, x, scratch)?;
        }
        Ok(())
    }

    /// One op of a block's program ([`crate::program`]) over a step's rows.
    fn run_op(
        &self,
        op: &Op,
        st: &mut Step<'_, '_>,
        x: &mut [f32],
        scratch: &mut Scratch,
    ) -> Result<(), ModelError> {
        let Scratch {
            h,
            q,
            k,
            v,
            attn,
            o,
            g,
            u,
            gate,
            row_seg,
            row_pos,
        } = scratch;
        let l = &self.weights.layers[st.il];
        let c = &self.config;
        let (e, qd, kvd, hd) = (c.n_embd, c.q_dim(), c.kv_dim(), c.head_dim);
        let (n, il, blk) = (st.n, st.il, st.blk);
        match *op {
            Op::AttnNorm | Op::FfnNorm => {
                let w = if *op == Op::AttnNorm {
                    &l.attn_norm
                } else {
                    &l.ffn_norm
                };
                let h = sized(h, n * e);
                h.copy_from_slice(x);
                h.chunks_mut(e).for_each(|r| ops::rms_norm(r, w, blk.eps));
            }
            Op::Qkv { bias, gate: gated } => {
                let h = &h[..n * e];
                let q = sized(q, n * qd);
                let k = sized(k, n * kvd);
                let v = sized(v, n * kvd);
                let a = l.attention()?;
                if gated {
                    // Each head's query then its gate, apart.
                    let both = sized(g, n * 2 * qd);
                    a.wq.matmul(h, n, both)?;
                    let gate = sized(gate, n * qd);
                    for (i, pair) in both.chunks_exact(2 * hd).enumerate() {
                        q[i * hd..(i + 1) * hd].copy_from_slice(&pair[..hd]);
                        gate[i * hd..(i + 1) * hd].copy_from_slice(&pair[hd..]);
                    }
                } else {
                    a.wq.matmul(h, n, q)?;
                }
                a.wk.matmul(h, n, k)?;
                a.wv.matmul(h, n, v)?;
                if bias {
                    for (buf, b, dim) in [(q, &a.bq, qd), (k, &a.bk, kvd), (v, &a.bv, kvd)] {
                        if let Some(b) = b {
                            buf.chunks_mut(dim)
                                .for_each(|r| r.iter_mut().zip(b).for_each(|(a, b)| *a += b));
                        }
                    }
                }
            }
            Op::HeadNorms => {
                let a = l.attention()?;
                for (buf, norm, dim) in [(&mut *q, &a.q_norm, qd), (&mut *k, &a.k_norm, kvd)] {
                    if let Some(w) = norm {
                        buf[..n * dim]
                            .chunks_mut(hd)
                            .for_each(|head| ops::rms_norm(head, w, blk.eps));
                    }
                }
            }
            Op::RopeStore => {
                let rope = blk.rope;
                let mut angles = Vec::with_capacity(rope.n_rot / 2);
                let (q, k) = (&mut q[..n * qd], &mut k[..n * kvd]);
                for (t, (qrow, krow)) in q.chunks_mut(qd).zip(k.chunks_mut(kvd)).enumerate() {
                    let factors = rope.factors_for(st.caches[row_seg[t]].n_ctx);
                    ops::rope_angles(
                        row_pos[t],
                        rope.base,
                        rope.n_rot,
                        rope.scale,
                        factors.map(|f| f.get()),
                        rope.mscale,
                        &mut angles,
                    );
                    for head in qrow.chunks_mut(hd).chain(krow.chunks_mut(hd)) {
                        ops::rope_with(head, &angles, rope.neox);
                    }
                }
                for (sg, cache) in st.segs.iter().zip(st.caches.iter_mut()) {
                    // Position p in row p mod rows (a ring wraps mid-step).
                    let ring = cache.rows[il];
                    for t in 0..sg.n {
                        let src = (sg.start + t) * kvd..(sg.start + t + 1) * kvd;
                        let at = (sg.pos0 + t) % ring * kvd;
                        cache.k[il].write(at, &k[src.clone()]);
                        cache.v[il].write(at, &v[src]);
                    }
                }
            }
            Op::Attend => {
                let kv: Vec<(&KvStore, &KvStore, usize)> = st
                    .caches
                    .iter()
                    .map(|cache| (&cache.k[il], &cache.v[il], cache.rows[il]))
                    .collect();
                attend(
                    c,
                    blk,
                    &q[..n * qd],
                    &kv,
                    row_seg,
                    row_pos,
                    sized(attn, n * qd),
                );
            }
            Op::OutputGate => {
                for (a, gt) in attn[..n * qd].iter_mut().zip(&gate[..n * qd]) {
                    *a *= 1.0 / (1.0 + (-gt).exp());
                }
            }
            Op::DeltaNet => {
                let (Mixer::DeltaNet(w), Some(r)) = (&l.mixer, c.recurrent) else {
                    return Err(ModelError::Placement(format!(
                        "blk.{il} has no Gated DeltaNet weights but its program is one"
                    )));
                };
                let Some(d) = r.delta else {
                    return Err(ModelError::Placement(format!(
                        "blk.{il}: a Gated DeltaNet program without its heads"
                    )));
                };
                let (ch, vd, nv) = (d.conv_dim(), d.value_dim(), d.n_v);
                let h = &h[..n * e];
                let qkv = sized(q, n * ch);
                let z = sized(g, n * vd);
                let beta = sized(k, n * nv);
                let alpha = sized(v, n * nv);
                crate::delta::project(w, d, h, n, qkv, z, beta, alpha, u, o)?;
                let y = sized(attn, n * vd);
                for (sg, cache) in st.segs.iter().zip(st.caches.iter_mut()) {
                    let rows = sg.start..sg.start + sg.n;
                    crate::delta::scan(
                        w,
                        d,
                        r.conv_kernel,
                        blk.eps,
                        cache.states.layer_mut(il),
                        &mut qkv[rows.start * ch..rows.end * ch],
                        &beta[rows.start * nv..rows.end * nv],
                        &alpha[rows.start * nv..rows.end * nv],
                        &mut y[rows.start * vd..rows.end * vd],
                    );
                }
                // Each head's output normed, times silu of its gate.
                for (yh, zh) in y.chunks_exact_mut(d.head_v).zip(z.chunks_exact(d.head_v)) {
                    ops::rms_norm(yh, &w.norm, blk.eps);
                    yh.iter_mut()
                        .zip(zh)
                        .for_each(|(a, z)| *a *= z / (1.0 + (-z).exp()));
                }
                let o = sized(o, n * e);
                w.out.matmul(y, n, o)?;
                self.residual(x, o, None);
            }
            Op::AttnOut { post_norm } => {
                let o = sized(o, n * e);
                l.attention()?.wo.matmul(&attn[..n * qd], n, o)?;
                let w = if post_norm {
                    l.post_attn_norm.as_deref()
                } else {
                    None
                };
                self.residual(x, o, w);
            }
            Op::Recurrent { post_norm } => {
                let (Mixer::Recurrent(w), Some(r)) = (&l.mixer, c.recurrent) else {
                    return Err(ModelError::Placement(format!(
                        "blk.{il} attends but its program is recurrent"
                    )));
                };
                let ch = r.channels;
                let u = sized(q, n * ch);
                w.w_in.matmul(&h[..n * e], n, u)?;
                let y = sized(attn, n * ch);
                for (sg, cache) in st.segs.iter().zip(st.caches.iter_mut()) {
                    let state = cache.states.layer_mut(il);
                    let rows = sg.start..sg.start + sg.n;
                    recurrent_scan(
                        w,
                        r.conv_kernel,
                        ch,
                        state,
                        &u[rows.start * ch..rows.end * ch],
                        &mut y[rows.start * ch..rows.end * ch],
                    );
                }
                let o = sized(o, n * e);
                w.w_out.matmul(y, n, o)?;
                let pn = if post_norm {
                    l.post_attn_norm.as_deref()
                } else {
                    None
                };
                self.residual(x, o, pn);
            }
            Op::GatedFfn(act) => {
                let Ffn::Dense { gate, up, down } = &l.ffn else {
                    return Err(ModelError::Placement(format!(
                        "blk.{il} has experts but its program a dense feed-forward"
                    )));
                };
                let glu = match act {
                    Activation::SwiGlu => Glu::Silu,
                    Activation::GeGlu => Glu::GeluTanh,
                };
                // The down product's output reuses o's buffer (its values
                // are spent).
                gated(gate, up, down, &h[..n * e], n, g, u, sized(o, n * e), glu)?;
            }
            Op::Experts(m) => {
                let Ffn::Moe(ex) = &l.ffn else {
                    return Err(ModelError::Placement(format!(
                        "blk.{il} has a dense feed-forward but its program experts"
                    )));
                };
                experts(ex, &m, e, &h[..n * e], n, sized(o, n * e))?;
            }
            Op::FfnOut { post_norm } => {
                let w = if post_norm {
                    l.post_ffn_norm.as_deref()
                } else {
                    None
                };
                self.residual(x, &mut o[..n * e], w);
            }
        }
        Ok(())
    }

    /// `x += norm(y)` (Gemma normalises a sub-layer's output before adding it).
    fn residual(&self, x: &mut [f32], y: &mut [f32], post_norm: Option<&[f32]>) {
        let e = self.config.n_embd;
        if let Some(w) = post_norm {
            y.chunks_mut(e)
                .for_each(|r| ops::rms_norm(r, w, self.config.rms_eps));
        }
        x.iter_mut().zip(y.iter()).for_each(|(a, b)| *a += b);
    }
}
