//! The GPU layers' KV caches: an arena of slots per set of sequences,
//! and a sequence's cache across both devices (save, copy, restore).

use std::sync::Arc;

use lamina_gpu::{KvElem, Tensor, WordCopy};

use super::{gpu_err, HybridModel};
use crate::config::Config;
use crate::cpu::CpuModel;
use crate::error::ModelError;
use crate::kv::KvCache;
use crate::kv::KvType;

/// The GPU layers' keys and values of a set of sequences: per layer one
/// key and one value buffer of `slots` slots of `n_ctx` rows.
#[derive(Debug)]
pub(super) struct KvArena {
    pub(super) k: Vec<Tensor>,
    pub(super) v: Vec<Tensor>,
    pub(super) n_ctx: usize,
    /// Rows per slot of the sliding-window layers' rings (slot s, position
    /// p at row s · ring + p mod ring), 0 when no GPU layer keeps a ring:
    /// one size for them all (it follows from the window, one per model).
    pub(super) ring: usize,
    /// Which GPU layers keep a ring.
    pub(super) is_ring: Vec<bool>,
}

impl KvArena {
    /// The token table and ring size (0: none) of GPU layer `i`.
    pub(super) fn ring_of(&self, i: usize) -> usize {
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
    pub(super) cpu: KvCache,
    pub(super) arena: Arc<KvArena>,
    pub(super) slot: usize,
    pub(super) len: usize,
    /// What every layer's sliding-window ring still holds.
    pub(super) rings: crate::kv::Rings,
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

    /// Host bytes its recurrent-state checkpoints hold (`kv/state.rs`).
    pub fn checkpoint_bytes(&self) -> u64 {
        self.cpu.checkpoints().bytes()
    }

    /// Forgets positions `len..` (to reuse a shared prefix), or everything
    /// where a sliding-window ring no longer holds the window before `len`:
    /// [`HybridCache::len`] says what was kept.
    pub fn truncate(&mut self, len: usize) {
        self.len = self.rings.keep(self.len, len);
        self.cpu.truncate(self.len);
        // The CPU layers' recurrent state may go back further, to its
        // checkpoint: the cache holds what every layer holds.
        if self.cpu.states.any() && self.cpu.len() < self.len {
            self.len = self.cpu.len();
        }
    }

    /// Positions `0..len` are written, in every layer.
    pub(super) fn advance(&mut self, len: usize) {
        self.len = len;
        self.rings.advance(len);
        CpuModel::commit(&mut self.cpu, len);
    }
}

impl HybridModel<'_> {
    pub fn new_cache(&self, n_ctx: usize) -> Result<HybridCache, ModelError> {
        let mut v = self.new_caches(1, n_ctx)?;
        v.pop()
            .ok_or_else(|| ModelError::Step("no cache was made".into()))
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

    pub(super) fn copy_inner(
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

    pub(super) fn restore_inner(
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
    pub(super) fn cache_header(&self, cache: &HybridCache) -> Vec<u8> {
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
    pub(super) fn slot_words(&self, cache: &HybridCache, i: usize) -> (usize, usize) {
        self.slot_run(cache.slot, cache.len, i, &cache.arena)
    }

    /// [`HybridModel::slot_words`] of slot `slot` of `arena` as if it held
    /// `len` positions.
    pub(super) fn slot_run(
        &self,
        slot: usize,
        len: usize,
        i: usize,
        arena: &KvArena,
    ) -> (usize, usize) {
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
    pub(super) fn host_reserve(&self, count: usize) -> u64 {
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
}
