//! Shared pieces of the GPU tests: one device per test binary (lavapipe runs
//! every dispatch on the same few cores, so tests take turns), a seeded RNG,
//! random valid ggml blocks and the CPU reference.
#![allow(dead_code)]

use std::sync::{Mutex, MutexGuard, OnceLock};

use lamina_gguf::GgmlType;
use lamina_gpu::{Gpu, GpuOptions, Tensor};

static GPU: OnceLock<Gpu> = OnceLock::new();
static TURN: Mutex<()> = Mutex::new(());

/// The shared device, and the lock that keeps GPU tests from running at once.
pub fn gpu() -> (MutexGuard<'static, ()>, &'static Gpu) {
    let turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    let gpu = GPU.get_or_init(|| Gpu::new(GpuOptions::default()).unwrap_or_else(|e| panic!("{e}")));
    (turn, gpu)
}

/// xorshift64*: deterministic, dependency-free.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in [lo, hi).
    pub fn range(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.unit()
    }

    /// Uniform in [-1, 1), as f32.
    pub fn signed(&mut self) -> f32 {
        self.range(-1.0, 1.0) as f32
    }

    pub fn vec(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.signed()).collect()
    }

    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next_u64() as u8).collect()
    }

    /// A scale with random sign and magnitude in [1e-3, 1e-1): never NaN,
    /// Inf or subnormal as f16.
    pub fn scale(&mut self) -> f32 {
        let m = 10f64.powf(self.range(-3.0, -1.0));
        (if self.next_u64() & 1 == 0 { m } else { -m }) as f32
    }
}

/// Random valid data for a `rows × cols` weight of `ty`: random bytes with
/// every f16 scale (and MXFP4's exponent, IQ1_M's spread d) overwritten by a
/// sane value; float types get values in [-1, 1) (kept clear of f16
/// subnormals, which a GPU may flush).
pub fn random_weight(rng: &mut Rng, ty: GgmlType, rows: usize, cols: usize) -> Vec<u8> {
    let n = rows * cols;
    let value = |rng: &mut Rng| {
        let v = rng.signed();
        if v.abs() < 1e-3 {
            0.0
        } else {
            v
        }
    };
    match ty {
        GgmlType::F32 => (0..n).flat_map(|_| value(rng).to_le_bytes()).collect(),
        GgmlType::F16 => (0..n)
            .flat_map(|_| half::f16::from_f32(value(rng)).to_le_bytes())
            .collect(),
        GgmlType::BF16 => (0..n)
            .flat_map(|_| half::bf16::from_f32(value(rng)).to_le_bytes())
            .collect(),
        _ => {
            let ts = ty.type_size() as usize;
            let bytes = lamina_gpu::row_bytes(ty, cols).unwrap() as usize * rows;
            let mut data = rng.bytes(bytes);
            for block in data.chunks_mut(ts) {
                for &at in ty.f16_scale_offsets() {
                    let h = half::f16::from_f32(rng.scale()).to_le_bytes();
                    block[at..at + 2].copy_from_slice(&h);
                }
                if ty == GgmlType::MXFP4 {
                    // The E8M0 exponent: scales 2^-11 .. 2^-1, clear of the
                    // subnormals (e < 2, which a GPU may flush) and of Inf.
                    block[0] = 117 + (rng.next_u64() % 11) as u8;
                }
                if ty == GgmlType::IQ1M {
                    // IQ1_M's f16 d is the top nibbles of its four scale
                    // words (bytes 48..56): nibble j of d in word j.
                    let d = half::f16::from_f32(rng.scale()).to_bits();
                    for j in 0..4 {
                        let at = 48 + 2 * j + 1;
                        let nib = ((d >> (4 * j)) & 0xf) as u8;
                        block[at] = (block[at] & 0x0f) | (nib << 4);
                    }
                }
            }
            data
        }
    }
}

/// The CPU reference weights, dequantized by `lamina_quant`.
pub fn dequantize(ty: GgmlType, data: &[u8], rows: usize, cols: usize) -> Vec<f32> {
    let mut out = vec![0f32; rows * cols];
    lamina_quant::dequantize(ty, data, &mut out).unwrap_or_else(|e| panic!("{ty}: {e}"));
    out
}

/// `y[c][r] = Σ_k w[r][k] x[c][k]` in f64.
pub fn reference_matmul(w: &[f32], rows: usize, cols: usize, x: &[f32], n: usize) -> Vec<f64> {
    let mut y = vec![0f64; rows * n];
    for c in 0..n {
        let xc = &x[c * cols..(c + 1) * cols];
        for r in 0..rows {
            let wr = &w[r * cols..(r + 1) * cols];
            y[c * rows + r] = wr.iter().zip(xc).map(|(&a, &b)| a as f64 * b as f64).sum();
        }
    }
    y
}

/// ‖got − want‖ / ‖want‖; NaN anywhere makes it NaN (and fails any bound).
pub fn rel_err(got: &[f32], want: &[f64]) -> f64 {
    assert_eq!(got.len(), want.len());
    let mut num = 0.0;
    let mut den = 0.0;
    for (&g, &w) in got.iter().zip(want) {
        let g = g as f64;
        num += (g - w) * (g - w);
        den += w * w;
    }
    if got.iter().any(|g| !g.is_finite()) {
        return f64::NAN;
    }
    (num / den).sqrt()
}

/// An output tensor filled with NaN, so an element a kernel fails to write
/// shows up in every comparison.
/// `n` packed columns of `cols` values laid out strided: column c at
/// `offset + c * stride`, zeros between.
pub fn spread_columns(x: &[f32], cols: usize, n: usize, offset: usize, stride: usize) -> Vec<f32> {
    let mut xs = vec![0f32; offset + n * stride];
    for c in 0..n {
        let at = offset + c * stride;
        xs[at..at + cols].copy_from_slice(&x[c * cols..(c + 1) * cols]);
    }
    xs
}

pub fn poisoned(gpu: &Gpu, n: usize) -> Tensor {
    gpu.upload_f32(&vec![f32::NAN; n]).unwrap()
}

/// `err < tol`, false for NaN (an unwritten output).
pub fn within(err: f64, tol: f64) -> bool {
    err.is_finite() && err < tol
}

/// Plain RoPE over heads of `head_dim`: base 10000, no scaling, no pair
/// factors, the first token at `pos_offset`.
pub fn rope(
    head_dim: usize,
    n_rot: usize,
    n_heads: usize,
    pos_offset: usize,
    neox: bool,
) -> lamina_gpu::Rope {
    lamina_gpu::Rope {
        head_dim,
        n_rot,
        n_heads,
        pos_offset: pos_offset as u32,
        freq_base: 10000.0,
        neox,
        freq_scale: 1.0,
        mscale: 1.0,
        factors_at: None,
    }
}
