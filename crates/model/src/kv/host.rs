//! The CPU layers' keys and values, in host memory.

use super::state::{Checkpoints, States};
use super::{KvStore, KvType, Rings};
use crate::config::Config;
use crate::error::ModelError;

/// Keys and values of every layer, for positions `0..len`, in the
/// config's cache types ([`crate::kv`]). A sliding-window layer keeps a
/// ring of [`super::layer_rows`] rows (position p in row p mod rows),
/// any other layer every position; a recurrent layer keeps a state
/// instead, with checkpoints of it ([`super::state`]).
pub struct KvCache {
    pub(crate) n_ctx: usize,
    pub(crate) k: Vec<KvStore>,
    pub(crate) v: Vec<KvStore>,
    /// Rows each layer keeps.
    pub(crate) rows: Vec<usize>,
    rings: Rings,
    pub(crate) len: usize,
    /// The recurrent layers' state after position `len`.
    pub(crate) states: States,
    pub(crate) checkpoints: Checkpoints,
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
            .map(|il| super::layer_rows(c, il, n_ctx))
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
            // Every recurrent layer's state, the GPU layers' too: theirs
            // is the device's copy at checkpoints, saves and restores
            // (`gpu/arena.rs`).
            states: States::zeros(c, c.n_layer)?,
            checkpoints: Checkpoints::new(c.kv.checkpoint_bytes),
        })
    }

    /// The recurrent state's checkpoints (positions, bytes, budget).
    pub fn checkpoints(&self) -> &Checkpoints {
        &self.checkpoints
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
        // A recurrent state goes back only to a checkpoint at or before
        // `len`, and keeps that many positions.
        let want = if self.states.any() && len < self.len {
            self.checkpoints.rewind(len, &mut self.states)
        } else {
            len
        };
        self.len = self.rings.keep(self.len, want);
        if self.len == 0 {
            self.states.clear();
            self.checkpoints.clear();
        }
    }

    /// Positions `0..len` are written.
    pub(crate) fn advance(&mut self, len: usize) {
        // A prompt's chunk (a step of more than one token) ends at a
        // checkpoint of the recurrent state: where the next turn of a
        // conversation, which repeats this one, can continue from.
        let chunk = len > self.len + 1;
        self.len = len;
        self.rings.advance(len);
        if chunk && self.states.any() {
            self.checkpoints.take(len, &self.states);
        }
    }

    /// Appends what [`KvCache::restore_state`] needs to hold these
    /// positions again: per layer, the rows in use (a ring's whole ring),
    /// keys then values, each as a length-prefixed run of stored bytes;
    /// then, where layers are recurrent, their states and checkpoints (so
    /// a restored cache can still go back to one).
    pub(crate) fn save_state(&self, kvd: usize, out: &mut Vec<u8>) {
        for (il, &ring) in self.rows.iter().enumerate() {
            let rows = if ring < self.n_ctx { ring } else { self.len };
            for store in [&self.k[il], &self.v[il]] {
                super::put_run(out, store.row_bytes(0, rows, kvd));
            }
        }
        if self.states.any() {
            self.states.save(out);
            self.checkpoints.save(out);
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
        if other.states.any() {
            self.states.clone_from(&other.states);
            self.checkpoints.copy_until(&other.checkpoints, other.len);
        }
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
                let bytes = super::take_run(data).ok_or_else(bad)?;
                let store = if v { &mut self.v[il] } else { &mut self.k[il] };
                if !store.set_row_bytes(0, kvd, bytes) {
                    return Err(bad());
                }
            }
        }
        if self.states.any() {
            let shape = self.states.clone();
            self.states.restore(data).ok_or_else(bad)?;
            self.checkpoints.restore(data, &shape).ok_or_else(bad)?;
        }
        self.len = len;
        self.rings = Rings::default_for(&self.rings, len);
        Ok(())
    }
}
