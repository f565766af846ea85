//! The KV cache's element types (llama.cpp's `-ctk` / `-ctv`): what a
//! cached key or value costs, and the host storage of one layer's keys or
//! values in that type.
//!
//! f16 is the default, as in llama.cpp: half the bytes of f32, and the
//! rounding moves the exact-reference log-probabilities by a median of
//! 0.0009 nats on SmolLM2 and 0.0006 on Gemma 3 (`tests/exact_reference.rs`
//! measures it against the float64 model; the bar is 0.01), with the argmax
//! unchanged on every step. q8_0 is a little over a quarter of f32 (34
//! bytes per 32 values) and costs these small models more (medians 0.033
//! and 0.027, mostly from the keys); it is host-only for now: the GPU
//! kernels read f32 or f16.

use std::fmt;
use std::str::FromStr;

use half::f16;
use lamina_quant::kv::{Q8_0_BLOCK, Q8_0_BYTES};
use lamina_quant::KvRows;

use crate::error::ModelError;

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

/// The key and the value cache types.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct KvTypes {
    pub k: KvType,
    pub v: KvType,
}

impl KvTypes {
    pub fn uniform(t: KvType) -> Self {
        KvTypes { k: t, v: t }
    }

    /// Bytes of one position's keys and values over one layer of `kv_dim`.
    pub fn bytes_per_position(self, kv_dim: usize) -> u64 {
        self.k
            .bytes(kv_dim as u64)
            .saturating_add(self.v.bytes(kv_dim as u64))
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

/// One layer's keys (or values) in host memory, `row` values per position.
pub(crate) enum KvStore {
    F32(Vec<f32>),
    F16(Vec<f16>),
    Q8_0(Vec<u8>),
}

/// A zeroed vector of `n` elements, or an error naming the bytes when the
/// allocator refuses them (the size comes from the command line).
fn try_filled<T: Clone>(n: usize, zero: T) -> Result<Vec<T>, ModelError> {
    let mut v = Vec::new();
    v.try_reserve_exact(n).map_err(|_| ModelError::Alloc {
        bytes: (n as u64).saturating_mul(std::mem::size_of::<T>() as u64),
    })?;
    v.resize(n, zero);
    Ok(v)
}

impl KvStore {
    /// Storage for `values` elements of type `ty`.
    pub(crate) fn new(ty: KvType, values: usize) -> Result<Self, ModelError> {
        Ok(match ty {
            KvType::F32 => KvStore::F32(try_filled(values, 0.0f32)?),
            KvType::F16 => KvStore::F16(try_filled(values, f16::ZERO)?),
            KvType::Q8_0 => {
                KvStore::Q8_0(try_filled(values.div_ceil(Q8_0_BLOCK) * Q8_0_BYTES, 0u8)?)
            }
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

    /// The rows of `d` values every `stride` elements from element `start`
    /// (for q8_0, all multiples of 32).
    pub(crate) fn rows(&self, start: usize, stride: usize, d: usize) -> KvRows<'_> {
        match self {
            KvStore::F32(x) => KvRows::F32 {
                data: &x[start..],
                stride,
                d,
            },
            KvStore::F16(x) => KvRows::F16 {
                data: &x[start..],
                stride,
                d,
            },
            KvStore::Q8_0(x) => KvRows::Q8_0 {
                data: &x[start / Q8_0_BLOCK * Q8_0_BYTES..],
                stride,
                d,
            },
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
    fn stores_read_back_what_they_wrote() {
        let src: Vec<f32> = (0..128).map(|i| (i as f32 - 64.0) / 16.0).collect();
        for t in KvType::ALL {
            let mut s = KvStore::new(t, 256).unwrap();
            s.write(128, &src);
            let rows = s.rows(128 + 64, 64, 64);
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
