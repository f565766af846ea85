//! The seam between scheduling and arithmetic.
//!
//! The scheduler only needs "run these tokens on this sequence's cache and
//! give me the last logits". The CPU forward pass implements it today; a GPU
//! or mixed-device model implements the same trait and the loop is unchanged.
//! [`Backend::forward_batch`] is where a backend that can decode many
//! sequences in one pass overrides the one-at-a-time default; the CPU model
//! does, with `forward_multi`. [`Backend::forward_batch_argmax`] is the same
//! step for sequences that only need their greedy pick, which a model with
//! its head on the GPU reduces there; [`Backend::forward_batch_top`] for
//! sequences that need their pick or their top-k candidates.

use lamina_model::{
    Candidates, Config, CpuModel, HybridCache, HybridModel, KvCache, Logits, ModelError,
};

/// A sequence's KV cache as the scheduler sees it.
pub trait Cache {
    /// Positions held.
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Positions it can hold.
    fn capacity(&self) -> usize;
    /// Forgets positions `len..` (prefix reuse).
    fn truncate(&mut self, len: usize);
    /// Host bytes its recurrent-state checkpoints hold (0 without
    /// recurrent layers).
    fn checkpoint_bytes(&self) -> u64 {
        0
    }
}

impl Cache for KvCache {
    fn len(&self) -> usize {
        KvCache::len(self)
    }
    fn capacity(&self) -> usize {
        KvCache::capacity(self)
    }
    fn truncate(&mut self, len: usize) {
        KvCache::truncate(self, len)
    }
    fn checkpoint_bytes(&self) -> u64 {
        self.checkpoints().bytes()
    }
}

/// A model the engine can run.
pub trait Backend {
    type Cache: Cache;

    fn config(&self) -> &Config;

    /// A cache for one sequence of at most `n_ctx` positions (on the GPU,
    /// for offloaded layers, so it can fail).
    fn new_cache(&self, n_ctx: usize) -> Result<Self::Cache, ModelError>;

    /// `count` caches for sequences that will run together (the slots): a
    /// backend may let them share storage so that a step over several runs
    /// their attention at once.
    fn new_caches(&self, count: usize, n_ctx: usize) -> Result<Vec<Self::Cache>, ModelError> {
        (0..count).map(|_| self.new_cache(n_ctx)).collect()
    }

    /// Runs `tokens` after what `cache` holds and returns the logits of the
    /// last one (`n_vocab` floats).
    fn forward(&self, tokens: &[u32], cache: &mut Self::Cache) -> Result<Vec<f32>, ModelError>;

    /// The cache's positions as bytes that [`Backend::restore_cache`] takes
    /// back (slot save); a backend without it says so.
    fn save_cache(&self, _cache: &Self::Cache) -> Result<Vec<u8>, ModelError> {
        Err(ModelError::KvType(
            "this backend cannot save a cache".into(),
        ))
    }

    /// Makes `dst` hold the first `len` positions `src` holds (a cache of
    /// the same model and size; the slots' caches are), or fewer where a
    /// sliding-window ring no longer holds the window before them:
    /// `dst.len()` says. By default through [`Backend::save_cache`] and
    /// [`Backend::restore_cache`], which move every position. On failure
    /// `dst` may hold anything up to its length: its owner empties it.
    fn copy_cache(
        &self,
        src: &Self::Cache,
        dst: &mut Self::Cache,
        len: usize,
    ) -> Result<(), ModelError> {
        let state = self.save_cache(src)?;
        self.restore_cache(dst, &state)?;
        dst.truncate(len);
        Ok(())
    }

    /// Loads [`Backend::save_cache`]'s bytes; the positions now held.
    fn restore_cache(&self, _cache: &mut Self::Cache, _state: &[u8]) -> Result<usize, ModelError> {
        Err(ModelError::KvType(
            "this backend cannot restore a cache".into(),
        ))
    }

    /// Runs `tokens` after what `cache` holds and returns every token's
    /// hidden state after the final norm (`n_embd` floats each, in order):
    /// what embeddings pool.
    fn hidden(&self, tokens: &[u32], cache: &mut Self::Cache) -> Result<Vec<f32>, ModelError>;

    /// One step for several sequences; by default one after the other.
    /// Results are in the order of `work`, each independent of the others.
    fn forward_batch(
        &self,
        work: &mut [(&[u32], &mut Self::Cache)],
    ) -> Vec<Result<Vec<f32>, ModelError>> {
        work.iter_mut()
            .map(|(tokens, cache)| self.forward(tokens, cache))
            .collect()
    }

    /// [`Backend::forward_batch`] for a step whose sequences all pick their
    /// next token greedily from the raw logits
    /// ([`lamina_sampling::Sampler::is_plain_greedy`]): each one's
    /// [`lamina_sampling::argmax`]. A backend with its logits on a GPU
    /// reduces them there and reads back a token per sequence instead of
    /// the vocabulary; by default, the argmax of `forward_batch`'s logits.
    fn forward_batch_argmax(
        &self,
        work: &mut [(&[u32], &mut Self::Cache)],
    ) -> Vec<Result<u32, ModelError>> {
        picks_of(self.forward_batch(work))
    }

    /// The largest `k` for which [`Backend::forward_batch_top`] selects
    /// where the logits are; `None` where it would read back the logits
    /// and select on the host, which the scheduler then does itself.
    fn top_on_device(&self) -> Option<usize> {
        None
    }

    /// Whether steps run kernels that are compiled on first use (layers on
    /// a GPU), which the scheduler's `warm_up` compiles before the
    /// first request.
    fn compiles_kernels(&self) -> bool {
        false
    }

    /// [`Backend::forward_batch`] where sequence `i` needs the logits of its
    /// last `keep[i]` tokens (a drafted run to verify), one row after
    /// another: the bits the tokens would get one at a time. By default
    /// one at a time; a backend that runs them in one step overrides it.
    fn forward_batch_rows(
        &self,
        work: &mut [(&[u32], &mut Self::Cache)],
        keep: &[usize],
    ) -> Vec<Result<Vec<f32>, ModelError>> {
        work.iter_mut()
            .zip(keep)
            .map(|((tokens, cache), &k)| {
                rows_one_by_one(|t, c| self.forward(t, c), tokens, cache, k)
            })
            .collect()
    }

    /// [`Backend::forward_batch_rows`] for greedy sequences: each row's
    /// argmax. By default from the rows' logits.
    fn forward_batch_rows_argmax(
        &self,
        work: &mut [(&[u32], &mut Self::Cache)],
        keep: &[usize],
    ) -> Vec<Result<Vec<u32>, ModelError>> {
        row_picks(self.forward_batch_rows(work, keep), self.config().n_vocab)
    }

    /// [`Backend::forward_batch`] for a step whose sampling sequences each
    /// need only their argmax ([`lamina_sampling::Sampler::is_plain_greedy`])
    /// or their `k` best logits ([`lamina_sampling::Sampler::top_k_only`]):
    /// each one's [`Candidates`]. By default from `forward_batch`'s logits.
    fn forward_batch_top(
        &self,
        work: &mut [(&[u32], &mut Self::Cache)],
        k: usize,
    ) -> Vec<Result<Candidates, ModelError>> {
        candidates_of(self.forward_batch(work), k)
    }
}

/// Each row's greedy pick from rows of logits laid one after another.
fn row_picks(
    logits: Vec<Result<Vec<f32>, ModelError>>,
    n_vocab: usize,
) -> Vec<Result<Vec<u32>, ModelError>> {
    logits
        .into_iter()
        .map(|r| {
            r.map(|l| {
                l.chunks(n_vocab.max(1))
                    .map(lamina_sampling::argmax)
                    .collect()
            })
        })
        .collect()
}

/// The first `tokens.len() - keep` tokens of a sequence, then each of the
/// rest alone: the logits of the last `keep`, one row after another.
fn rows_one_by_one<C>(
    forward: impl Fn(&[u32], &mut C) -> Result<Vec<f32>, ModelError>,
    tokens: &[u32],
    cache: &mut C,
    keep: usize,
) -> Result<Vec<f32>, ModelError> {
    let split = tokens.len().saturating_sub(keep.max(1));
    let (head, tail) = tokens.split_at(split);
    if !head.is_empty() {
        forward(head, cache)?;
    }
    let mut rows = Vec::new();
    for t in tail {
        rows.extend(forward(std::slice::from_ref(t), cache)?);
    }
    Ok(rows)
}

/// Each sequence's [`Candidates`] from its logits, on the host.
fn candidates_of(
    logits: Vec<Result<Vec<f32>, ModelError>>,
    k: usize,
) -> Vec<Result<Candidates, ModelError>> {
    logits
        .into_iter()
        .map(|r| {
            r.map(|l| Candidates {
                argmax: lamina_sampling::argmax(&l),
                best: lamina_sampling::top_entries(&l, k),
            })
        })
        .collect()
}

/// Each sequence's greedy pick from its logits, on the host.
fn picks_of(logits: Vec<Result<Vec<f32>, ModelError>>) -> Vec<Result<u32, ModelError>> {
    logits
        .into_iter()
        .map(|r| r.map(|l| lamina_sampling::argmax(&l)))
        .collect()
}

impl Backend for CpuModel<'_> {
    type Cache = KvCache;

    fn config(&self) -> &Config {
        &self.config
    }

    fn new_cache(&self, n_ctx: usize) -> Result<KvCache, ModelError> {
        KvCache::new(&self.config, n_ctx)
    }

    fn forward(&self, tokens: &[u32], cache: &mut KvCache) -> Result<Vec<f32>, ModelError> {
        CpuModel::forward(self, tokens, cache, Logits::Last)
    }

    fn hidden(&self, tokens: &[u32], cache: &mut KvCache) -> Result<Vec<f32>, ModelError> {
        CpuModel::forward(self, tokens, cache, Logits::Hidden)
    }

    /// All sequences through each weight together (read once per step),
    /// bit-identical to separate calls. If the joint call fails, each
    /// sequence runs alone so one bad sequence cannot fail the others: the
    /// joint call commits no cache length before it succeeds.
    fn forward_batch(
        &self,
        work: &mut [(&[u32], &mut KvCache)],
    ) -> Vec<Result<Vec<f32>, ModelError>> {
        if work.len() > 1 {
            if let Ok(all) = self.forward_multi(work) {
                return all.into_iter().map(Ok).collect();
            }
        }
        work.iter_mut()
            .map(|(tokens, cache)| CpuModel::forward(self, tokens, cache, Logits::Last))
            .collect()
    }

    /// In one step ([`CpuModel::forward_multi_rows`]), and one sequence at
    /// a time if that fails: it commits no cache length before it succeeds.
    fn forward_batch_rows(
        &self,
        work: &mut [(&[u32], &mut KvCache)],
        keep: &[usize],
    ) -> Vec<Result<Vec<f32>, ModelError>> {
        if let Ok(all) = self.forward_multi_rows(work, keep) {
            return all.into_iter().map(Ok).collect();
        }
        work.iter_mut()
            .zip(keep)
            .map(|((tokens, cache), &k)| {
                let from = Logits::From(tokens.len().saturating_sub(k));
                CpuModel::forward(self, tokens, cache, from)
            })
            .collect()
    }
}

impl Cache for HybridCache {
    fn len(&self) -> usize {
        HybridCache::len(self)
    }
    fn capacity(&self) -> usize {
        HybridCache::capacity(self)
    }
    fn truncate(&mut self, len: usize) {
        HybridCache::truncate(self, len)
    }
    fn checkpoint_bytes(&self) -> u64 {
        HybridCache::checkpoint_bytes(self)
    }
}

/// The model as placement put it: blocks on the CPU, the GPU, or both.
impl Backend for HybridModel<'_> {
    type Cache = HybridCache;

    fn config(&self) -> &Config {
        HybridModel::config(self)
    }

    fn new_cache(&self, n_ctx: usize) -> Result<HybridCache, ModelError> {
        HybridModel::new_cache(self, n_ctx)
    }

    fn new_caches(&self, count: usize, n_ctx: usize) -> Result<Vec<HybridCache>, ModelError> {
        HybridModel::new_caches(self, count, n_ctx)
    }

    fn save_cache(&self, cache: &HybridCache) -> Result<Vec<u8>, ModelError> {
        HybridModel::save_cache(self, cache)
    }

    fn restore_cache(&self, cache: &mut HybridCache, state: &[u8]) -> Result<usize, ModelError> {
        HybridModel::restore_cache(self, cache, state)
    }

    fn copy_cache(
        &self,
        src: &HybridCache,
        dst: &mut HybridCache,
        len: usize,
    ) -> Result<(), ModelError> {
        HybridModel::copy_cache(self, src, dst, len)
    }

    fn forward(&self, tokens: &[u32], cache: &mut HybridCache) -> Result<Vec<f32>, ModelError> {
        HybridModel::forward(self, tokens, cache, Logits::Last)
    }

    fn hidden(&self, tokens: &[u32], cache: &mut HybridCache) -> Result<Vec<f32>, ModelError> {
        HybridModel::forward(self, tokens, cache, Logits::Hidden)
    }

    /// As for the CPU model: jointly when it can, and one by one if the joint
    /// step fails, so one bad sequence cannot fail the others.
    fn forward_batch(
        &self,
        work: &mut [(&[u32], &mut HybridCache)],
    ) -> Vec<Result<Vec<f32>, ModelError>> {
        if work.len() > 1 {
            if let Ok(all) = self.forward_multi(work) {
                return all.into_iter().map(Ok).collect();
            }
        }
        work.iter_mut()
            .map(|(tokens, cache)| HybridModel::forward(self, tokens, cache, Logits::Last))
            .collect()
    }

    /// On the GPU when the head is there (jointly, and one by one if the
    /// joint step fails, as `forward_batch`); else from the logits.
    fn forward_batch_argmax(
        &self,
        work: &mut [(&[u32], &mut HybridCache)],
    ) -> Vec<Result<u32, ModelError>> {
        if !self.argmax_on_gpu() {
            return picks_of(self.forward_batch(work));
        }
        if work.len() > 1 {
            if let Ok(all) = self.forward_multi_argmax(work) {
                return all.into_iter().map(Ok).collect();
            }
        }
        work.iter_mut()
            .map(|(tokens, cache)| {
                let picks = self.forward_multi_argmax(&mut [(*tokens, &mut **cache)])?;
                picks
                    .first()
                    .copied()
                    .ok_or_else(|| ModelError::Step("a greedy step returned no pick".into()))
            })
            .collect()
    }

    fn top_on_device(&self) -> Option<usize> {
        self.top_on_gpu()
    }

    /// In one step ([`HybridModel::forward_multi_rows`]), and one sequence
    /// at a time if that fails, as `forward_batch`.
    fn forward_batch_rows(
        &self,
        work: &mut [(&[u32], &mut HybridCache)],
        keep: &[usize],
    ) -> Vec<Result<Vec<f32>, ModelError>> {
        if let Ok(all) = self.forward_multi_rows(work, keep) {
            return all.into_iter().map(Ok).collect();
        }
        work.iter_mut()
            .zip(keep)
            .map(|((tokens, cache), &k)| {
                let from = Logits::From(tokens.len().saturating_sub(k));
                HybridModel::forward(self, tokens, cache, from)
            })
            .collect()
    }

    /// On the GPU when the head is there (jointly, and one by one if the
    /// joint step fails); else from the rows' logits.
    fn forward_batch_rows_argmax(
        &self,
        work: &mut [(&[u32], &mut HybridCache)],
        keep: &[usize],
    ) -> Vec<Result<Vec<u32>, ModelError>> {
        if !self.argmax_on_gpu() {
            return row_picks(self.forward_batch_rows(work, keep), self.config().n_vocab);
        }
        if let Ok(all) = self.forward_multi_rows_argmax(work, keep) {
            return all.into_iter().map(Ok).collect();
        }
        work.iter_mut()
            .zip(keep)
            .map(|((tokens, cache), &k)| {
                let k = k.clamp(1, tokens.len().max(1));
                let before = cache.len();
                match self.forward_multi_rows_argmax(&mut [(*tokens, &mut **cache)], &[k]) {
                    Ok(mut one) => one.pop().ok_or_else(|| {
                        ModelError::Step("a verifying step returned no picks".into())
                    }),
                    // Refused before it ran (more tokens than one step of
                    // the cache takes): in rounds, from the logits.
                    Err(_) if cache.len() == before => {
                        let from = Logits::From(tokens.len() - k);
                        let rows = HybridModel::forward(self, tokens, cache, from);
                        row_picks(vec![rows], self.config().n_vocab)
                            .pop()
                            .unwrap_or_else(|| Err(ModelError::Step("no rows".into())))
                    }
                    Err(e) => Err(e),
                }
            })
            .collect()
    }

    fn compiles_kernels(&self) -> bool {
        self.gpu().is_some() && self.plan.ngl > 0
    }

    /// On the GPU where [`HybridModel::top_on_gpu`] takes `k` (jointly,
    /// and one by one if the joint step fails); else from the logits.
    fn forward_batch_top(
        &self,
        work: &mut [(&[u32], &mut HybridCache)],
        k: usize,
    ) -> Vec<Result<Candidates, ModelError>> {
        if self.top_on_gpu().is_none_or(|max| k > max) {
            return candidates_of(self.forward_batch(work), k);
        }
        if work.len() > 1 {
            if let Ok(all) = self.forward_multi_top(work, k) {
                return all.into_iter().map(Ok).collect();
            }
        }
        work.iter_mut()
            .map(|(tokens, cache)| {
                let mut one = self.forward_multi_top(&mut [(*tokens, &mut **cache)], k)?;
                one.pop()
                    .ok_or_else(|| ModelError::Step("a top-k step returned nothing".into()))
            })
            .collect()
    }
}
