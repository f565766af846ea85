//! The KV cache's element types (llama.cpp's `-ctk` / `-ctv`): what a
//! cached key or value costs, and the host storage of one layer's keys or
//! values in that type.
//!
//! f16 is the default, as in llama.cpp: half the bytes of f32, and the
//! rounding moves the exact-reference log-probabilities by a median of
//! 0.0009 nats on SmolLM2 and 0.0006 on Gemma 3 (`tests/exact_reference.rs`
//! measures it against the float64 model; the bar is 0.01), with the argmax
//! unchanged on every step. q8_0 is a little over a quarter of f32 (34
//! bytes per 32 values; 36 on the GPU, whose blocks are nine whole words)
//! and costs these small models more (medians 0.033 and 0.027, mostly from
//! the keys). A GPU layer's keys and values share one type.

use std::fmt;
use std::str::FromStr;

use half::f16;
use lamina_quant::kv::{Q8_0_BLOCK, Q8_0_BYTES};
use lamina_quant::{KvData, KvRows};

use crate::block::{Block, Window};
use crate::config::Config;
use crate::error::ModelError;

mod host;
pub mod state;

pub use host::KvCache;

/// One cached key or value element.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum KvType {
    F32,
    #[default]
    F16,
    Q8_0,
}

impl KvType {
    pub const ALL: [KvType; 3] = [KvType::F32, KvType::F16, KvType::Q8_0];

    /// llama.cpp's name (`-ctk f16`).
    pub fn name(self) -> &'static str {
        match self {
            KvType::F32 => "f32",
            KvType::F16 => "f16",
            KvType::Q8_0 => "q8_0",
        }
    }

    /// Bytes of `values` elements (whole q8_0 blocks: a head's row is a
    /// multiple of 32 values, [`KvType::check_head`]). Saturating: plans
    /// for absurd contexts must say "too much", not wrap.
    pub fn bytes(self, values: u64) -> u64 {
        match self {
            KvType::F32 => values.saturating_mul(4),
            KvType::F16 => values.saturating_mul(2),
            KvType::Q8_0 => values
                .div_ceil(Q8_0_BLOCK as u64)
                .saturating_mul(Q8_0_BYTES as u64),
        }
    }

    /// Bytes of `values` elements in a GPU layer's cache: a q8_0 block is
    /// 36 bytes there (nine 32-bit words, so neighbouring blocks never
    /// share a word; `lamina_gpu::KvElem`), the other types as on the host.
    pub fn gpu_bytes(self, values: u64) -> u64 {
        match self {
            KvType::Q8_0 => values
                .div_ceil(Q8_0_BLOCK as u64)
                .saturating_mul(lamina_gpu::KV_Q8_WORDS as u64 * 4),
            _ => self.bytes(values),
        }
    }

    /// Whether a head of `head_dim` values can be stored: q8_0 blocks must
    /// not straddle heads (llama.cpp has the same rule).
    pub fn check_head(self, head_dim: usize) -> Result<(), ModelError> {
        if self == KvType::Q8_0 && head_dim % Q8_0_BLOCK != 0 {
            return Err(ModelError::KvType(format!(
                "a q8_0 cache needs heads of a multiple of 32 values; this model's have {head_dim}"
            )));
        }
        Ok(())
    }
}

impl fmt::Display for KvType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for KvType {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        KvType::ALL
            .into_iter()
            .find(|t| t.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| {
                let names: Vec<&str> = KvType::ALL.iter().map(|t| t.name()).collect();
                format!(
                    "{s:?} is not a cache type Lamina has; one of {}",
                    names.join(", ")
                )
            })
    }
}

/// The key and the value cache types, whether sliding-window layers keep
/// every position (`--swa-full`) or only their window, and the bytes of
/// recurrent-state checkpoints a sequence may keep
/// ([`state::Checkpoints`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvTypes {
    pub k: KvType,
    pub v: KvType,
    pub swa_full: bool,
    pub checkpoint_bytes: u64,
}

/// Bytes of recurrent-state checkpoints a sequence keeps by default: a
/// few of a small hybrid's states, and a laptop's worth over a handful of
/// slots (`--ctx-checkpoint-ram` sets the server's total).
pub const DEFAULT_CHECKPOINT_BYTES: u64 = 64 << 20;

impl Default for KvTypes {
    fn default() -> Self {
        KvTypes::uniform(KvType::default())
    }
}

impl KvTypes {
    pub fn uniform(t: KvType) -> Self {
        KvTypes {
            k: t,
            v: t,
            swa_full: false,
            checkpoint_bytes: DEFAULT_CHECKPOINT_BYTES,
        }
    }

    /// Bytes of one position's keys and values over one layer of `kv_dim`.
    pub fn bytes_per_position(self, kv_dim: usize) -> u64 {
        self.k
            .bytes(kv_dim as u64)
            .saturating_add(self.v.bytes(kv_dim as u64))
    }

    /// [`KvTypes::bytes_per_position`] in a GPU layer's cache.
    pub fn gpu_bytes_per_position(self, kv_dim: usize) -> u64 {
        self.k
            .gpu_bytes(kv_dim as u64)
            .saturating_add(self.v.gpu_bytes(kv_dim as u64))
    }

    pub fn check_head(self, head_dim: usize) -> Result<(), ModelError> {
        self.k.check_head(head_dim)?;
        self.v.check_head(head_dim)
    }
}

impl fmt::Display for KvTypes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.k == self.v {
            write!(f, "{}", self.k)
        } else {
            write!(f, "K {} / V {}", self.k, self.v)
        }
    }
}

/// The most tokens one step may bring a sequence whose sliding-window
/// layers keep a ring: llama.cpp's default micro-batch, which its SWA cache
/// is sized for too. Longer steps are split (`CpuModel::forward`), which
/// changes no bits: the kernels are batch invariant.
pub const SWA_STEP: usize = 512;

/// Rows layer `il` keeps for a sequence of `n_ctx` positions: every
/// position, or for a sliding-window layer (unless `--swa-full`) a ring of
/// its window plus one step, rounded up to 256 as llama.cpp's SWA cache is
/// (so the bytes match its), never more than `n_ctx`. Position p lives in
/// row p mod rows.
pub fn layer_rows(c: &Config, il: usize, n_ctx: usize) -> usize {
    // A recurrent layer keeps a state, not rows ([`state`]).
    if c.is_recurrent(il) {
        return 0;
    }
    match Block::new(c, il).window {
        Window::Last(w) if !c.kv.swa_full => {
            n_ctx.min(w.saturating_add(SWA_STEP).div_ceil(256).saturating_mul(256))
        }
        _ => n_ctx,
    }
}

/// The most tokens one step may add to a sequence of `n_ctx` positions:
/// for a ring of `rows` over a window `w`, the step's first token still
/// sees its whole window when `n ≤ rows − w + 1`.
pub fn max_step(c: &Config, n_ctx: usize) -> usize {
    (0..c.n_layer)
        .filter_map(|il| match Block::new(c, il).window {
            Window::Last(w) => {
                let rows = layer_rows(c, il, n_ctx);
                (rows < n_ctx).then(|| (rows + 1).saturating_sub(w).max(1))
            }
            Window::Full => None,
        })
        .min()
        .unwrap_or(usize::MAX)
}

/// What the ring layers of a cache of `n_ctx` positions still hold, for
/// reusing a prefix: after positions up to `len` were written, a ring of
/// `rows` rows has lost every position below `len − rows`, and continuing
/// at position L needs the `back` positions before it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Rings {
    /// The smallest ring (usize::MAX: no layer is a ring).
    rows: usize,
    /// The largest window less one.
    back: usize,
    /// No position below this is whole in every ring.
    valid_from: usize,
}

impl Rings {
    pub fn new(c: &Config, n_ctx: usize) -> Self {
        let mut r = Rings {
            rows: usize::MAX,
            ..Rings::default()
        };
        for il in 0..c.n_layer {
            if let Window::Last(w) = Block::new(c, il).window {
                let rows = layer_rows(c, il, n_ctx);
                if rows < n_ctx {
                    r.rows = r.rows.min(rows);
                    r.back = r.back.max(w.saturating_sub(1));
                }
            }
        }
        r
    }

    /// The same rings after a restore of `len` positions: only the last
    /// `rows` of them are whole.
    pub fn default_for(r: &Rings, len: usize) -> Rings {
        Rings {
            valid_from: len.saturating_sub(r.rows),
            ..*r
        }
    }

    /// Positions up to `len` have been written.
    pub fn advance(&mut self, len: usize) {
        self.valid_from = self.valid_from.max(len.saturating_sub(self.rows));
    }

    /// The length a cache of `len` positions can be cut to when `want` is
    /// asked: `want` (at most `len`) when the rings still hold the window
    /// before it, else 0 (the prefix is computed again).
    pub fn keep(&mut self, len: usize, want: usize) -> usize {
        let l = want.min(len);
        if l == 0 || l.saturating_sub(self.back) < self.valid_from {
            self.valid_from = 0;
            return 0;
        }
        l
    }
}

/// One layer's keys (or values) in host memory, `row` values per position.
pub(crate) enum KvStore {
    F32(Vec<f32>),
    F16(Vec<f16>),
    Q8_0(Vec<u8>),
}

/// A saved cache's runs of bytes: a little-endian u64 length, then the
/// bytes. Used by the host layers' state and the GPU layers' alike.
pub(crate) fn put_run(out: &mut Vec<u8>, bytes: &[u8]) {
    out.extend_from_slice(&(bytes.len() as u64).to_le_bytes());
    out.extend_from_slice(bytes);
}

/// Takes one [`put_run`] run off the front of `data`; `None` when it is
/// cut short.
pub(crate) fn take_run<'a>(data: &mut &'a [u8]) -> Option<&'a [u8]> {
    let (n, rest) = data.split_first_chunk::<8>()?;
    let n = usize::try_from(u64::from_le_bytes(*n)).ok()?;
    if n > rest.len() {
        return None;
    }
    let (run, rest) = rest.split_at(n);
    *data = rest;
    Some(run)
}

impl KvStore {
    /// Storage for `values` elements of type `ty`.
    pub(crate) fn new(ty: KvType, values: usize) -> Result<Self, ModelError> {
        Ok(match ty {
            KvType::F32 => KvStore::F32(crate::memory::try_filled(values, 0.0f32)?),
            KvType::F16 => KvStore::F16(crate::memory::try_filled(values, f16::ZERO)?),
            KvType::Q8_0 => KvStore::Q8_0(crate::memory::try_filled(
                values.div_ceil(Q8_0_BLOCK) * Q8_0_BYTES,
                0u8,
            )?),
        })
    }

    /// Stores `src` from element `at` on (for q8_0, `at` and the length are
    /// whole blocks: the cache writes whole positions).
    pub(crate) fn write(&mut self, at: usize, src: &[f32]) {
        match self {
            KvStore::F32(d) => d[at..][..src.len()].copy_from_slice(src),
            KvStore::F16(d) => lamina_quant::kv::f16_row(src, &mut d[at..][..src.len()]),
            KvStore::Q8_0(d) => {
                let b = at / Q8_0_BLOCK * Q8_0_BYTES;
                let n = src.len() / Q8_0_BLOCK * Q8_0_BYTES;
                lamina_quant::kv::q8_0_row(src, &mut d[b..][..n]);
            }
        }
    }

    /// The stored bytes of rows `first .. first + rows` of `width` values.
    pub(crate) fn row_bytes(&self, first: usize, rows: usize, width: usize) -> &[u8] {
        let (a, b) = (first * width, (first + rows) * width);
        match self {
            KvStore::F32(x) => bytemuck::cast_slice(&x[a..b]),
            KvStore::F16(x) => bytemuck::cast_slice(&x[a..b]),
            KvStore::Q8_0(x) => &x[a / Q8_0_BLOCK * Q8_0_BYTES..b / Q8_0_BLOCK * Q8_0_BYTES],
        }
    }

    /// Overwrites rows from `first` with `bytes` as [`KvStore::row_bytes`]
    /// gave them; false when they do not fit.
    pub(crate) fn set_row_bytes(&mut self, first: usize, width: usize, bytes: &[u8]) -> bool {
        let at = first * width;
        match self {
            KvStore::F32(x) => {
                let n = bytes.len() / 4;
                if bytes.len() % 4 != 0 || at + n > x.len() {
                    return false;
                }
                bytemuck::cast_slice_mut::<f32, u8>(&mut x[at..at + n]).copy_from_slice(bytes);
            }
            KvStore::F16(x) => {
                let n = bytes.len() / 2;
                if bytes.len() % 2 != 0 || at + n > x.len() {
                    return false;
                }
                bytemuck::cast_slice_mut::<f16, u8>(&mut x[at..at + n]).copy_from_slice(bytes);
            }
            KvStore::Q8_0(x) => {
                let b = at / Q8_0_BLOCK * Q8_0_BYTES;
                if b + bytes.len() > x.len() {
                    return false;
                }
                x[b..b + bytes.len()].copy_from_slice(bytes);
            }
        }
        true
    }

    /// One head's rows: `d` values from element `off` of each row of
    /// `stride`, row j of the result at storage row `(first + j) mod ring`
    /// (for q8_0, `off`, `stride` and `d` are multiples of 32).
    pub(crate) fn rows(
        &self,
        off: usize,
        stride: usize,
        d: usize,
        first: usize,
        ring: usize,
    ) -> KvRows<'_> {
        let data = match self {
            KvStore::F32(x) => KvData::F32(&x[off..]),
            KvStore::F16(x) => KvData::F16(&x[off..]),
            KvStore::Q8_0(x) => KvData::Q8_0(&x[off / Q8_0_BLOCK * Q8_0_BYTES..]),
        };
        KvRows {
            data,
            stride,
            d,
            first,
            ring,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_both_ways_and_sizes_follow_llama_cpp() {
        for t in KvType::ALL {
            assert_eq!(t.name().parse::<KvType>(), Ok(t));
        }
        assert_eq!("F16".parse::<KvType>(), Ok(KvType::F16));
        let e = "q4_0".parse::<KvType>().unwrap_err();
        assert!(e.contains("f32, f16, q8_0"), "{e}");
        // SmolLM2: kv_dim 192 per layer and position.
        assert_eq!(KvType::F32.bytes(192), 768);
        assert_eq!(KvType::F16.bytes(192), 384);
        assert_eq!(KvType::Q8_0.bytes(192), 6 * 34);
        // Keys and values, two bytes each in the default f16.
        assert_eq!(KvTypes::default().bytes_per_position(192), 2 * 192 * 2);
        assert!(KvType::Q8_0.check_head(80).is_err());
        assert!(KvType::F16.check_head(80).is_ok());
        assert_eq!(KvType::F32.bytes(u64::MAX), u64::MAX);
    }

    #[test]
    fn rings_keep_a_prefix_only_while_they_hold_its_window() {
        // A ring of 1024 rows over a window of 512.
        let mut r = Rings {
            rows: 1024,
            back: 511,
            valid_from: 0,
        };
        r.advance(900);
        assert_eq!(r.keep(900, 600), 600);
        // Written up to 2000: positions below 976 are gone.
        r.advance(2000);
        assert_eq!(r.keep(2000, 1500), 1500, "1500 needs 989..1500");
        assert_eq!(r.keep(2000, 1400), 0, "1400 needs 889.., overwritten");
        // After forgetting everything, the ring starts clean.
        r.advance(10);
        assert_eq!(r.keep(10, 5), 5);
        // No ring: any prefix stays.
        let mut none = Rings {
            rows: usize::MAX,
            ..Rings::default()
        };
        none.advance(100_000);
        assert_eq!(none.keep(100_000, 3), 3);
    }

    #[test]
    fn stores_read_back_what_they_wrote() {
        let src: Vec<f32> = (0..128).map(|i| (i as f32 - 64.0) / 16.0).collect();
        for t in KvType::ALL {
            let mut s = KvStore::new(t, 256).unwrap();
            s.write(128, &src);
            let rows = s.rows(0, 64, 64, 3, 4);
            let mut buf = vec![0.0; 64];
            let mut got = vec![0.0; 64];
            lamina_quant::attention_values_rows(&[1.0], 1, &rows, &mut got);
            buf.copy_from_slice(&src[64..]);
            for (g, w) in got.iter().zip(&buf) {
                // These values are exact in f16; q8_0 within half a step.
                let tol = if t == KvType::Q8_0 {
                    4.0 / 127.0 / 2.0 + 1e-6
                } else {
                    0.0
                };
                assert!((g - w).abs() <= tol, "{t}: {g} vs {w}");
            }
        }
    }
}
