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
    /// The GPU recurrent layers' states: `slots` states of the layer's
    /// [`Config::state_len`] words each, laid out as the host's.
    pub(super) states: Vec<Option<Tensor>>,
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
///
/// A GPU recurrent layer's state lives on the device, with a copy in the
/// host cache's states that is made current where the host needs it (a
/// prompt chunk's checkpoint, a save, a copy) and sent back where the host
/// changed it (a rewind to a checkpoint, a restore): `host_stale` and
/// `device_stale` say which side is behind.
pub struct HybridCache {
    pub(super) cpu: KvCache,
    pub(super) arena: Arc<KvArena>,
    pub(super) slot: usize,
    pub(super) len: usize,
    /// What every layer's sliding-window ring still holds.
    pub(super) rings: crate::kv::Rings,
    /// The device's recurrent states are newer than the host's copy.
    pub(super) host_stale: bool,
    /// The host's copy is newer than the device's states.
    pub(super) device_stale: bool,
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
        let before = self.len;
        self.len = self.rings.keep(self.len, len);
        self.cpu.truncate(self.len);
        // A recurrent state cut back comes from a checkpoint (or zeros),
        // on the host: the device's goes back with it.
        if self.cpu.states.any() && self.len < before {
            self.device_stale = true;
            self.host_stale = false;
        }
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
    /// The GPU recurrent layers' states of `cache`'s slot: (GPU layer,
    /// model layer, tensor, first word, words).
    fn state_runs<'c>(
        &self,
        cache: &'c HybridCache,
    ) -> Vec<(usize, usize, &'c Tensor, usize, usize)> {
        let c = &self.cpu.config;
        cache
            .arena
            .states
            .iter()
            .enumerate()
            .filter_map(|(i, t)| {
                let t = t.as_ref()?;
                let il = self.first_gpu + i;
                let len = c.state_len(il);
                Some((i, il, t, cache.slot * len, len))
            })
            .collect()
    }

    /// Sends the host's copy of the GPU layers' recurrent states to the
    /// device where the host changed it (a rewind, a restore).
    pub(super) fn states_to_device(&self, cache: &mut HybridCache) -> Result<(), ModelError> {
        if !cache.device_stale {
            return Ok(());
        }
        if let Some(g) = self.gpu.as_deref() {
            for (_, il, t, at, _) in self.state_runs(cache) {
                let bytes: &[u8] = bytemuck::cast_slice(cache.cpu.states.layer(il));
                g.write_words(t, at, bytes).map_err(gpu_err)?;
            }
        }
        cache.device_stale = false;
        Ok(())
    }

    /// After a GPU step of `n` tokens: a prompt's chunk ends at a
    /// checkpoint, which takes the host's copy of every state, so the
    /// device's are read back now; after a decode step the host's copy is
    /// left behind until one is needed.
    pub(super) fn states_after_step(
        &self,
        cache: &mut HybridCache,
        n: usize,
    ) -> Result<(), ModelError> {
        if cache.arena.states.iter().all(Option::is_none) {
            return Ok(());
        }
        if n > 1 {
            self.states_to_host(cache)
        } else {
            cache.host_stale = true;
            Ok(())
        }
    }

    /// Reads the device's recurrent states into the host's copy.
    pub(super) fn states_to_host(&self, cache: &mut HybridCache) -> Result<(), ModelError> {
        let Some(g) = self.gpu.as_deref() else {
            return Ok(());
        };
        let runs = self.state_runs(cache);
        let reads: Vec<(&Tensor, usize, usize)> = runs.iter().map(|r| (r.2, r.3, r.4)).collect();
        let got = g.read_runs(&reads).map_err(gpu_err)?;
        let layers: Vec<usize> = runs.iter().map(|r| r.1).collect();
        for (il, bytes) in layers.into_iter().zip(got) {
            let dst = cache.cpu.states.layer_mut(il);
            if bytes.len() != dst.len() * 4 {
                return Err(ModelError::Step(
                    "a recurrent state read back mis-sized".into(),
                ));
            }
            for (d, b) in dst.iter_mut().zip(bytes.chunks_exact(4)) {
                *d = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
        }
        cache.host_stale = false;
        Ok(())
    }

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
            // A recurrent layer keeps a state, not rows: neither a ring nor
            // a cache.
            let recurrent: Vec<bool> = (self.first_gpu..c.n_layer)
                .map(|il| c.is_recurrent(il))
                .collect();
            let is_ring: Vec<bool> = rows
                .iter()
                .zip(&recurrent)
                .map(|(&r, &rec)| r < n_ctx && !rec)
                .collect();
            let ring = rows
                .iter()
                .zip(&is_ring)
                .filter(|(_, &ring)| ring)
                .map(|(&r, _)| r)
                .min()
                .unwrap_or(0);
            if rows.iter().zip(&is_ring).any(|(&r, &i)| i && r != ring) {
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
                states: Vec::new(),
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
                    if recurrent[li] {
                        let len = c.state_len(self.first_gpu + li);
                        let words = slots.checked_mul(len).ok_or(ModelError::KvOverflow {
                            count,
                            n_ctx,
                            n_layers: c.n_layer,
                        })?;
                        arena.k.push(g.tensor(1).map_err(gpu_err)?);
                        arena.v.push(g.tensor(1).map_err(gpu_err)?);
                        arena.states.push(Some(g.tensor(words).map_err(gpu_err)?));
                        continue;
                    }
                    arena.states.push(None);
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
                    host_stale: false,
                    // A new buffer is zeroed, as a new state is.
                    device_stale: false,
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
            // The recurrent states as the device holds them (the host's
            // copy saved above may be behind; its checkpoints are not).
            for (_, _, t, at, len) in self.state_runs(cache) {
                runs.push((t, at, len));
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
            let (from, to) = (self.state_runs(src), self.state_runs(dst));
            for (f, t) in from.iter().zip(&to) {
                runs.push(WordCopy {
                    src: f.2,
                    src_at: f.3,
                    dst: t.2,
                    dst_at: t.3,
                    len: f.4,
                });
            }
            g.copy_words(&runs).map_err(gpu_err)?;
        }
        dst.host_stale = src.host_stale;
        dst.device_stale = src.device_stale;
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
            for (_, _, t, at, len) in self.state_runs(cache) {
                let run = crate::kv::take_run(&mut data).ok_or_else(|| bad("is cut short"))?;
                if run.len() != len * 4 {
                    return Err(bad("is mis-sized"));
                }
                g.write_words(t, at, run).map_err(gpu_err)?;
            }
            cache.host_stale = true;
            cache.device_stale = false;
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
        // A recurrent layer keeps no rows (its state moves apart).
        if arena.states.get(i).is_some_and(Option::is_some) {
            return (0, 0);
        }
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
