//! The forward pass on the CPU, over the mapped quantized weights.
//!
//! One op list for every architecture: the layer's optional weights decide
//! biases, Q/K norms and post-norms, its [`Block`] the activation, RoPE and
//! sliding window, as they do for the GPU recorder.
//! A batch of tokens (a prompt, or one token while decoding) goes through each
//! layer as one matrix product per weight, so a weight is read once per step.

use rayon::prelude::*;

use crate::block::Block;
use crate::config::{Activation, Config, Moe};
use crate::error::ModelError;
use crate::kv::{KvStore, KvType, Rings};
use crate::ops;
use crate::weights::{Experts, Ffn, Matrix, Weights};
use lamina_quant::act::Glu;

/// Values of the gated activation per rayon task: a few microseconds of work.
const GLU_CHUNK: usize = 8192;

/// Keys and values of every layer, for positions `0..len`, in the
/// config's cache types ([`crate::kv`]). A sliding-window layer keeps a
/// ring of [`crate::kv::layer_rows`] rows (position p in row p mod rows),
/// any other layer every position.
pub struct KvCache {
    n_ctx: usize,
    k: Vec<KvStore>,
    v: Vec<KvStore>,
    /// Rows each layer keeps.
    rows: Vec<usize>,
    rings: Rings,
    len: usize,
}

impl KvCache {
    /// A cache of `n_ctx` positions for every layer. Fails, rather than
    /// aborting, when the allocator refuses the memory.
    pub fn new(c: &Config, n_ctx: usize) -> Result<Self, ModelError> {
        Self::for_layers(c, n_ctx, c.n_layer)
    }

    /// A cache for the first `n_layers` layers only (the ones on the CPU when
    /// the rest are offloaded: placement always offloads a suffix).
    ///
    /// Every byte is counted with checked arithmetic and every allocation is
    /// fallible (`n_ctx` comes from the command line): a request too large
    /// for the machine is an error, never an abort. The values are written
    /// at once (not left to the kernel's lazy zero pages), so memory that
    /// overcommit promised but cannot deliver shows at startup rather than
    /// as the OOM killer mid-request; [`crate::memory::check_host`] is what
    /// keeps it from coming to that.
    pub fn for_layers(c: &Config, n_ctx: usize, n_layers: usize) -> Result<Self, ModelError> {
        crate::memory::kv_host_bytes(c, 1, n_layers, n_ctx)?;
        if n_layers > 0 {
            c.kv.check_head(c.head_dim)?;
        }
        let rows: Vec<usize> = (0..n_layers)
            .map(|il| crate::kv::layer_rows(c, il, n_ctx))
            .collect();
        let layers = |ty: KvType| -> Result<Vec<KvStore>, ModelError> {
            let mut v = Vec::new();
            v.try_reserve_exact(n_layers)
                .map_err(|_| ModelError::Alloc {
                    bytes: (n_layers as u64).saturating_mul(std::mem::size_of::<KvStore>() as u64),
                })?;
            for &r in &rows {
                // Counted above: no overflow.
                v.push(KvStore::new(ty, r * c.kv_dim())?);
            }
            Ok(v)
        };
        Ok(Self {
            n_ctx,
            k: layers(c.kv.k)?,
            v: layers(c.kv.v)?,
            rows,
            rings: Rings::new(c, n_ctx),
            len: 0,
        })
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn capacity(&self) -> usize {
        self.n_ctx
    }

    /// Forgets positions `len..` (to reuse a shared prefix). Where a
    /// sliding-window ring no longer holds the window before `len`, the
    /// whole cache is forgotten: [`KvCache::len`] says what was kept.
    pub fn truncate(&mut self, len: usize) {
        self.len = self.rings.keep(self.len, len);
    }

    /// Positions `0..len` are written.
    fn advance(&mut self, len: usize) {
        self.len = len;
        self.rings.advance(len);
    }

    /// Appends what [`KvCache::restore_state`] needs to hold these
    /// positions again: per layer, the rows in use (a ring's whole ring),
    /// keys then values, each as a length-prefixed run of stored bytes.
    pub(crate) fn save_state(&self, kvd: usize, out: &mut Vec<u8>) {
        for (il, &ring) in self.rows.iter().enumerate() {
            let rows = if ring < self.n_ctx { ring } else { self.len };
            for store in [&self.k[il], &self.v[il]] {
                crate::kv::put_run(out, store.row_bytes(0, rows, kvd));
            }
        }
    }

    /// Makes this cache (of the same geometry) hold `other`'s first `len`
    /// positions: their rows (a ring's whole ring) copied across, then cut
    /// as [`KvCache::truncate`] cuts, which keeps less where a ring no
    /// longer holds the window before `len`.
    pub(crate) fn copy_from(
        &mut self,
        kvd: usize,
        other: &KvCache,
        len: usize,
    ) -> Result<(), ModelError> {
        if self.n_ctx != other.n_ctx || self.rows != other.rows {
            return Err(ModelError::KvType(
                "a cache can only be copied into one of the same size".into(),
            ));
        }
        for (il, &ring) in other.rows.iter().enumerate() {
            let rows = if ring < other.n_ctx {
                ring
            } else {
                len.min(other.len)
            };
            for (from, to) in [
                (&other.k[il], &mut self.k[il]),
                (&other.v[il], &mut self.v[il]),
            ] {
                if !to.set_row_bytes(0, kvd, from.row_bytes(0, rows, kvd)) {
                    return Err(ModelError::KvType("a cache's layers differ in type".into()));
                }
            }
        }
        self.len = other.len;
        self.rings = other.rings;
        self.truncate(len);
        Ok(())
    }

    /// Reads [`KvCache::save_state`]'s bytes from the front of `data` into
    /// this cache (of the same geometry: the caller checked it) as `len`
    /// positions, advancing `data`. A ring then holds only its last rows.
    pub(crate) fn restore_state(
        &mut self,
        kvd: usize,
        len: usize,
        data: &mut &[u8],
    ) -> Result<(), ModelError> {
        let bad = || ModelError::KvType("a saved slot's cache is cut short or mis-sized".into());
        if len > self.n_ctx {
            return Err(bad());
        }
        for il in 0..self.rows.len() {
            for v in [false, true] {
                let bytes = crate::kv::take_run(data).ok_or_else(bad)?;
                let store = if v { &mut self.v[il] } else { &mut self.k[il] };
                if !store.set_row_bytes(0, kvd, bytes) {
                    return Err(bad());
                }
            }
        }
        self.len = len;
        self.rings = Rings::default_for(&self.rings, len);
        Ok(())
    }
}

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

/// `out = down(act(gate · x) * (up · x))` for `n` columns of `x`, with `g`
/// and `u` as the gate's and up's buffers.
#[allow(clippy::too_many_arguments)]
fn gated(
    gate: &Matrix<'_>,
    up: &Matrix<'_>,
    down: &Matrix<'_>,
    x: &[f32],
    n: usize,
    g: &mut Vec<f32>,
    u: &mut Vec<f32>,
    out: &mut [f32],
    glu: Glu,
) -> Result<(), ModelError> {
    let ff = gate.rows;
    let g = sized(g, n * ff);
    let u = sized(u, n * ff);
    gate.matmul(x, n, g)?;
    up.matmul(x, n, u)?;
    // Element-wise, so the split changes no bits; on both cores, since a
    // prompt's gate holds n · n_ff values.
    g.par_chunks_mut(GLU_CHUNK)
        .zip(u.par_chunks(GLU_CHUNK))
        .for_each(|(g, u)| lamina_quant::act::glu(glu, g, u));
    down.matmul(g, n, &mut out[..n * down.rows])?;
    Ok(())
}

/// A mixture of experts over `n` tokens of width `e` in `h` (normed), into
/// `out`, as llama.cpp's `build_moe_ffn` with softmax gating: per token the
/// router's softmax, the `n_used` most probable experts (ties to the lower
/// index), their probabilities as weights (renormalised to sum 1 for
/// qwen3moe, then scaled where the file says), and
/// `out = Σ_slot w · expert(h)` summed in slot order, product then add.
/// Each expert runs once over all the tokens that chose it (its weights
/// read once a step); every product is batch invariant, so a token's
/// result does not depend on the others. A qwen2moe shared expert adds
/// `sigmoid(h · gate_inp_shexp) · shared(h)`.
fn experts(
    ex: &Experts<'_>,
    m: &Moe,
    e: usize,
    h: &[f32],
    n: usize,
    out: &mut [f32],
) -> Result<(), ModelError> {
    let mut logits = vec![0.0f32; n * m.n_expert];
    ex.router.matmul(h, n, &mut logits)?;
    routed_experts(ex, m, e, h, n, &mut logits, out)?;
    if let Some((gate_inp, sg, su, sd)) = &ex.shared {
        let mut sy = vec![0.0f32; n * e];
        let (mut g, mut u) = (Vec::new(), Vec::new());
        gated(sg, su, sd, h, n, &mut g, &mut u, &mut sy, Glu::Silu)?;
        add_shared(gate_inp, e, h, &sy, out);
    }
    Ok(())
}

/// The routed part of [`experts`] from the router's `logits` (`n_expert`
/// per token, softmaxed in place): `out = Σ_slot w · expert(h)`. What a
/// block split between the devices runs on the CPU, its router's logits
/// computed on the GPU.
pub(crate) fn routed_experts(
    ex: &Experts<'_>,
    m: &Moe,
    e: usize,
    h: &[f32],
    n: usize,
    logits: &mut [f32],
    out: &mut [f32],
) -> Result<(), ModelError> {
    let (nx, k) = (m.n_expert, m.n_used);
    let chosen = route(m, n, logits);
    // Each expert over the tokens that chose it; outputs by (token, slot).
    let mut ys = vec![0.0f32; n * k * e];
    let (mut xin, mut y, mut g, mut u) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut who: Vec<usize> = Vec::new();
    for x in 0..nx {
        who.clear();
        who.extend((0..n * k).filter(|&i| chosen[i].0 == x));
        if who.is_empty() {
            continue;
        }
        let mm = who.len();
        xin.clear();
        for &i in &who {
            let t = i / k;
            xin.extend_from_slice(&h[t * e..(t + 1) * e]);
        }
        let y = sized(&mut y, mm * e);
        gated(
            &ex.gate[x],
            &ex.up[x],
            &ex.down[x],
            &xin,
            mm,
            &mut g,
            &mut u,
            y,
            Glu::Silu,
        )?;
        for (j, &i) in who.iter().enumerate() {
            ys[i * e..(i + 1) * e].copy_from_slice(&y[j * e..(j + 1) * e]);
        }
    }
    weigh_experts(&chosen, k, e, &ys, &mut out[..n * e]);
    Ok(())
}

/// Routing from the router's `logits` (`n_expert` per token, softmaxed in
/// place): each token's `n_used` (expert, weight) pairs in slot order.
pub(crate) fn route(m: &Moe, n: usize, logits: &mut [f32]) -> Vec<(usize, f32)> {
    let (nx, k) = (m.n_expert, m.n_used);
    let mut chosen = vec![(0usize, 0.0f32); n * k];
    let mut order: Vec<usize> = Vec::with_capacity(nx);
    for (row, sel) in logits[..n * nx].chunks_mut(nx).zip(chosen.chunks_mut(k)) {
        ops::softmax(row);
        order.clear();
        order.extend(0..nx);
        order.sort_by(|&a, &b| row[b].total_cmp(&row[a]).then(a.cmp(&b)));
        for (s, &i) in sel.iter_mut().zip(&order) {
            *s = (i, row[i]);
        }
        if m.norm_weights {
            // llama.cpp clamps the sum to f16's smallest normal.
            let sum = sel.iter().map(|s| s.1).sum::<f32>().max(6.103_515_6e-5);
            sel.iter_mut().for_each(|s| s.1 /= sum);
        }
        if m.weights_scale != 0.0 && m.weights_scale != 1.0 {
            sel.iter_mut().for_each(|s| s.1 *= m.weights_scale);
        }
    }
    chosen
}

/// `out = Σ_slot w · y` per token, in slot order, product then add: the
/// experts' outputs `ys` by (token, slot), `k` slots a token.
pub(crate) fn weigh_experts(
    chosen: &[(usize, f32)],
    k: usize,
    e: usize,
    ys: &[f32],
    out: &mut [f32],
) {
    for (t, o) in out.chunks_mut(e).enumerate() {
        for s in 0..k {
            let w = chosen[t * k + s].1;
            let y = &ys[(t * k + s) * e..][..e];
            if s == 0 {
                o.iter_mut().zip(y).for_each(|(o, y)| *o = y * w);
            } else {
                o.iter_mut().zip(y).for_each(|(o, y)| *o += y * w);
            }
        }
    }
}

/// `out += sigmoid(h · gate_inp) · sy` per token: the qwen2moe shared
/// expert's output `sy` under its gate, added after the routed experts.
pub(crate) fn add_shared(gate_inp: &[f32], e: usize, h: &[f32], sy: &[f32], out: &mut [f32]) {
    for (t, (o, y)) in out.chunks_mut(e).zip(sy.chunks(e)).enumerate() {
        let z = lamina_quant::dot_f32(&h[t * e..(t + 1) * e], gate_inp);
        let gate = 1.0 / (1.0 + (-z).exp());
        o.iter_mut().zip(y).for_each(|(o, y)| *o += y * gate);
    }
}

/// Rows of a multi-sequence batch that belong to one sequence.
#[derive(Clone, Copy, Debug)]
struct Segment {
    start: usize,
    n: usize,
    pos0: usize,
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
    row_seg: Vec<usize>,
    row_pos: Vec<usize>,
}

/// `buf` with exactly `len` values, allocating only when it must grow. The
/// contents are stale: every user overwrites all of them.
fn sized(buf: &mut Vec<f32>, len: usize) -> &mut [f32] {
    buf.resize(len, 0.0);
    &mut buf[..len]
}

pub struct CpuModel<'a> {
    pub config: Config,
    pub weights: Weights<'a>,
    /// The weights are read in place from a map (not `--no-mmap`): their
    /// pages are page cache, which the cache's memory check keeps free.
    pub(crate) mapped: bool,
}

/// Runs `f` on a thread of rayon's pool (at once when already on one).
///
/// The kernels split a product over the pool only where the split pays for
/// its hand-off (lamina-quant's `dot.rs`): asked from a thread outside the
/// pool, a split costs two thread wake-ups (6–10 µs here), so every product
/// of a small model's decode step (SmolLM2's 576×576 takes ~13 µs on one
/// core) ran on the calling thread alone, one core of two. Inside the pool a
/// split is a steal (~1 µs) and both cores share each product. A forward
/// call makes one hand-off instead. The kernels give the same bits however
/// the rows are split, so this changes speed only.
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
        in_pool(|| split_multi(work, limit, |w| self.forward_multi_here(w)))
    }

    fn forward_multi_here(
        &self,
        work: &mut [(&[u32], &mut KvCache)],
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
        // The last row of each sequence, through the head as one product.
        let e = c.n_embd;
        let mut last = Vec::with_capacity(segs.len() * e);
        for sg in &segs {
            last.extend_from_slice(&x[(sg.start + sg.n - 1) * e..][..e]);
        }
        let logits = self.head(&last, segs.len(), Logits::From(0))?;
        Ok(logits.chunks(c.n_vocab).map(<[f32]>::to_vec).collect())
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

    /// Runs layer `il` over several sequences at once: rows
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
        let Scratch {
            h,
            q,
            k,
            v,
            attn,
            o,
            g,
            u,
            row_seg,
            row_pos,
        } = scratch;
        let l = &self.weights.layers[il];
        let c = &self.config;
        let blk = Block::new(c, il);
        let (e, qd, kvd, hd) = (c.n_embd, c.q_dim(), c.kv_dim(), c.head_dim);
        let n = x.len() / e;
        // Each row's sequence and position.
        row_seg.clear();
        row_pos.clear();
        for (si, sg) in segs.iter().enumerate() {
            row_seg.extend(std::iter::repeat_n(si, sg.n));
            row_pos.extend(sg.pos0..sg.pos0 + sg.n);
        }
        let (row_seg, row_pos) = (&row_seg[..], &row_pos[..]);

        let h = sized(h, n * e);
        h.copy_from_slice(x);
        h.chunks_mut(e)
            .for_each(|r| ops::rms_norm(r, &l.attn_norm, blk.eps));
        let q = sized(q, n * qd);
        let k = sized(k, n * kvd);
        let v = sized(v, n * kvd);
        l.wq.matmul(h, n, q)?;
        l.wk.matmul(h, n, k)?;
        l.wv.matmul(h, n, v)?;
        for (buf, bias, dim) in [
            (&mut *q, &l.bq, qd),
            (&mut *k, &l.bk, kvd),
            (&mut *v, &l.bv, kvd),
        ] {
            if let Some(b) = bias {
                buf.chunks_mut(dim)
                    .for_each(|r| r.iter_mut().zip(b).for_each(|(a, b)| *a += b));
            }
        }
        let rope = blk.rope;
        let mut angles = Vec::with_capacity(rope.n_rot / 2);
        for (t, (qrow, krow)) in q.chunks_mut(qd).zip(k.chunks_mut(kvd)).enumerate() {
            let factors = rope.factors_for(caches[row_seg[t]].n_ctx);
            ops::rope_angles(
                row_pos[t],
                rope.base,
                rope.n_rot,
                rope.scale,
                factors.map(|f| f.get()),
                rope.mscale,
                &mut angles,
            );
            for (row, norm) in [(qrow, &l.q_norm), (krow, &l.k_norm)] {
                for head in row.chunks_mut(hd) {
                    if let Some(w) = norm {
                        ops::rms_norm(head, w, blk.eps);
                    }
                    ops::rope_with(head, &angles, rope.neox);
                }
            }
        }
        for (sg, cache) in segs.iter().zip(caches.iter_mut()) {
            // Position p in row p mod rows (a ring wraps mid-step).
            let ring = cache.rows[il];
            for t in 0..sg.n {
                let src = (sg.start + t) * kvd..(sg.start + t + 1) * kvd;
                let at = (sg.pos0 + t) % ring * kvd;
                cache.k[il].write(at, &k[src.clone()]);
                cache.v[il].write(at, &v[src]);
            }
        }

        // Attention, one task per token and run of `gs` query heads that
        // share a KV head: each key and value row is read once for the run
        // (a long context streams the cache once per KV head, not once per
        // query head), with the bits of one head at a time. The run is the
        // whole group unless that leaves fewer than two tasks per thread
        // (a decode step of a model with one KV head would run on one core).
        let group = c.n_head / c.n_head_kv;
        let threads = rayon::current_num_threads().max(1);
        let gs = (1..=group)
            .rev()
            .filter(|d| group % d == 0)
            .find(|&d| n * c.n_head / d >= threads)
            .unwrap_or(1);
        let kv: Vec<(&KvStore, &KvStore, usize)> = caches
            .iter()
            .map(|cache| (&cache.k[il], &cache.v[il], cache.rows[il]))
            .collect();
        let q = &*q;
        let attn = sized(attn, n * qd);
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
        let o = sized(o, n * e);
        l.wo.matmul(attn, n, o)?;
        self.residual(x, o, l.post_attn_norm.as_deref());

        h.copy_from_slice(x);
        h.chunks_mut(e)
            .for_each(|r| ops::rms_norm(r, &l.ffn_norm, blk.eps));
        let glu = match blk.activation {
            Activation::SwiGlu => Glu::Silu,
            Activation::GeGlu => Glu::GeluTanh,
        };
        // The down product's output reuses o's buffer (its values are spent).
        match (&l.ffn, c.moe) {
            (Ffn::Dense { gate, up, down }, _) => gated(gate, up, down, h, n, g, u, o, glu)?,
            (Ffn::Moe(ex), Some(m)) => experts(ex, &m, e, h, n, o)?,
            (Ffn::Moe(_), None) => {
                return Err(ModelError::Placement(format!(
                    "blk.{il} has experts but the config no mixture"
                )))
            }
        }
        self.residual(x, o, l.post_ffn_norm.as_deref());
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

#[cfg(test)]
mod tests {
    use super::*;
    use lamina_gguf::GgmlType;

    fn noise(n: usize, seed: &mut u64) -> Vec<f32> {
        (0..n)
            .map(|_| {
                *seed ^= *seed << 13;
                *seed ^= *seed >> 7;
                *seed ^= *seed << 17;
                ((*seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.6
            })
            .collect()
    }

    fn matrix(name: &str, rows: usize, cols: usize, vals: &[f32]) -> Matrix<'static> {
        let bytes: Vec<u8> = vals.iter().flat_map(|v| v.to_le_bytes()).collect();
        Matrix {
            name: name.into(),
            ty: GgmlType::F32,
            rows,
            cols,
            data: Box::leak(bytes.into_boxed_slice()),
        }
    }

    fn mv(w: &[f32], rows: usize, cols: usize, x: &[f32]) -> Vec<f64> {
        (0..rows)
            .map(|r| {
                (0..cols)
                    .map(|c| f64::from(w[r * cols + c]) * f64::from(x[c]))
                    .sum()
            })
            .collect()
    }

    /// The mixture against a float64 reference on random weights: the
    /// router's softmax and top-k, the qwen3moe renormalisation, the
    /// weighted sum and the qwen2moe shared expert with its sigmoid gate.
    #[test]
    fn experts_match_a_float64_reference() {
        let (e, nx, k, fe, fs, n) = (48, 7, 3, 40, 24, 5);
        let mut seed = 0x5eed_u64;
        let router = noise(nx * e, &mut seed);
        let gates: Vec<Vec<f32>> = (0..nx).map(|_| noise(fe * e, &mut seed)).collect();
        let ups: Vec<Vec<f32>> = (0..nx).map(|_| noise(fe * e, &mut seed)).collect();
        let downs: Vec<Vec<f32>> = (0..nx).map(|_| noise(e * fe, &mut seed)).collect();
        let (sgi, sg, su, sd) = (
            noise(e, &mut seed),
            noise(fs * e, &mut seed),
            noise(fs * e, &mut seed),
            noise(e * fs, &mut seed),
        );
        let h = noise(n * e, &mut seed);
        let silu = |v: f64| v / (1.0 + (-v).exp());
        for (norm, shared) in [(true, false), (false, true)] {
            let ex = Experts {
                router: matrix("router", nx, e, &router),
                gate: gates.iter().map(|g| matrix("g", fe, e, g)).collect(),
                up: ups.iter().map(|u| matrix("u", fe, e, u)).collect(),
                down: downs.iter().map(|d| matrix("d", e, fe, d)).collect(),
                shared: shared.then(|| {
                    (
                        sgi.clone(),
                        matrix("sg", fs, e, &sg),
                        matrix("su", fs, e, &su),
                        matrix("sd", e, fs, &sd),
                    )
                }),
            };
            let m = Moe {
                n_expert: nx,
                n_used: k,
                n_ff_exp: fe,
                norm_weights: norm,
                weights_scale: 0.0,
                n_ff_shared: shared.then_some(fs),
            };
            let mut out = vec![0.0f32; n * e];
            experts(&ex, &m, e, &h, n, &mut out).unwrap();
            for t in 0..n {
                let x = &h[t * e..(t + 1) * e];
                let logits = mv(&router, nx, e, x);
                let mx = logits.iter().cloned().fold(f64::MIN, f64::max);
                let z: f64 = logits.iter().map(|l| (l - mx).exp()).sum();
                let p: Vec<f64> = logits.iter().map(|l| (l - mx).exp() / z).collect();
                let mut order: Vec<usize> = (0..nx).collect();
                order.sort_by(|&a, &b| p[b].total_cmp(&p[a]));
                let chosen = &order[..k];
                let sum: f64 = chosen.iter().map(|&i| p[i]).sum();
                let mut want = vec![0.0f64; e];
                for &i in chosen {
                    let w = if norm { p[i] / sum } else { p[i] };
                    let g = mv(&gates[i], fe, e, x);
                    let u = mv(&ups[i], fe, e, x);
                    let a: Vec<f32> = g
                        .iter()
                        .zip(&u)
                        .map(|(g, u)| (silu(*g) * u) as f32)
                        .collect();
                    let y = mv(&downs[i], e, fe, &a);
                    want.iter_mut().zip(&y).for_each(|(o, y)| *o += w * y);
                }
                if shared {
                    let gl: f64 = x
                        .iter()
                        .zip(&sgi)
                        .map(|(a, b)| f64::from(*a) * f64::from(*b))
                        .sum();
                    let gate = 1.0 / (1.0 + (-gl).exp());
                    let g = mv(&sg, fs, e, x);
                    let u = mv(&su, fs, e, x);
                    let a: Vec<f32> = g
                        .iter()
                        .zip(&u)
                        .map(|(g, u)| (silu(*g) * u) as f32)
                        .collect();
                    let y = mv(&sd, e, fs, &a);
                    want.iter_mut().zip(&y).for_each(|(o, y)| *o += gate * y);
                }
                let got = &out[t * e..(t + 1) * e];
                let scale = want.iter().map(|v| v.abs()).fold(0.0, f64::max);
                for (j, (g, w)) in got.iter().zip(&want).enumerate() {
                    assert!(
                        (f64::from(*g) - w).abs() <= 1e-5 * scale.max(1e-3),
                        "norm {norm} shared {shared} token {t} value {j}: {g} vs {w}"
                    );
                }
            }
        }
    }
}
