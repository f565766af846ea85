//! Rows of a key or value cache in the types llama.cpp offers for it
//! (`-ctk` / `-ctv`): f32, f16 and q8_0, and the conversions that store a
//! row. The attention kernels (`dot.rs`) read any of them through
//! [`KvRows`], widening a row to f32 just before its products, so a cache
//! of f16 or q8_0 values gives the bits an f32 cache holding the same
//! (rounded) values would.

use half::f16;
use half::slice::HalfFloatSliceExt;

/// Values per q8_0 block, and its bytes (an f16 scale, then 32 `i8`).
pub const Q8_0_BLOCK: usize = 32;
pub const Q8_0_BYTES: usize = 34;

/// A cache's elements: f32, f16, or q8_0 blocks (34 bytes per 32 values).
#[derive(Clone, Copy, Debug)]
pub enum KvData<'a> {
    F32(&'a [f32]),
    F16(&'a [f16]),
    Q8_0(&'a [u8]),
}

/// The rows `j = 0, 1, …` of one head's keys or values: row j is the `d`
/// values from element `((first + j) mod ring) · stride` of `data` (a
/// sliding-window layer's cache is a ring of `ring` rows; any other has
/// `ring` = `usize::MAX`, rows one after another). For q8_0, `stride`,
/// `d` and the head's offset into `data` are multiples of 32.
#[derive(Clone, Copy, Debug)]
pub struct KvRows<'a> {
    pub data: KvData<'a>,
    pub stride: usize,
    pub d: usize,
    pub first: usize,
    pub ring: usize,
}

impl<'a> KvRows<'a> {
    /// Contiguous f32 rows from row 0 (the plain kernels' layout).
    pub fn f32(data: &'a [f32], stride: usize, d: usize) -> Self {
        KvRows {
            data: KvData::F32(data),
            stride,
            d,
            first: 0,
            ring: usize::MAX,
        }
    }

    /// Values per row.
    pub fn width(&self) -> usize {
        self.d
    }

    /// A buffer for [`KvRows::row`]: none for f32 rows, which are borrowed.
    pub(crate) fn buffer(&self) -> Vec<f32> {
        match self.data {
            KvData::F32(_) => Vec::new(),
            _ => vec![0.0; self.d],
        }
    }

    /// Row `j` as f32: borrowed from the cache, or widened into `buf` (from
    /// [`KvRows::buffer`]). `F16C`: the caller is compiled with the `f16c`
    /// feature (x86-64), and f16 rows widen eight values an instruction
    /// inline; else through `half`, a call per row (a visible share of a
    /// small model's step: docs/perf/cpu.md, 2026-12-05, "f16 cache rows").
    #[inline(always)]
    pub(crate) fn row<'b, const F16C: bool>(&'b self, j: usize, buf: &'b mut [f32]) -> &'b [f32] {
        let (d, at) = (self.d, (self.first + j) % self.ring * self.stride);
        match self.data {
            KvData::F32(x) => &x[at..][..d],
            KvData::F16(x) => {
                #[cfg(target_arch = "x86_64")]
                if F16C {
                    // SAFETY: F16C is set only by callers compiled with f16c.
                    unsafe { widen_f16c(&x[at..][..d], &mut buf[..d]) };
                    return &buf[..d];
                }
                x[at..][..d].convert_to_f32_slice(&mut buf[..d]);
                &buf[..d]
            }
            KvData::Q8_0(x) => {
                let b0 = at / Q8_0_BLOCK * Q8_0_BYTES;
                let blocks = &x[b0..][..d / Q8_0_BLOCK * Q8_0_BYTES];
                crate::legacy::q8_0(blocks, &mut buf[..d]);
                &buf[..d]
            }
        }
    }
}

/// `dst = src` widened, eight values an instruction (exact, as every f16
/// widening). Caller: the CPU has `f16c`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx,f16c")]
#[inline]
unsafe fn widen_f16c(src: &[f16], dst: &mut [f32]) {
    use std::arch::x86_64::{__m128i, _mm256_cvtph_ps, _mm256_storeu_ps, _mm_loadu_si128};
    let n = src.len().min(dst.len());
    let mut i = 0;
    while i + 8 <= n {
        // SAFETY: i + 8 <= n elements of both slices; unaligned loads and stores.
        unsafe {
            let h = _mm_loadu_si128(src.as_ptr().add(i).cast::<__m128i>());
            _mm256_storeu_ps(dst.as_mut_ptr().add(i), _mm256_cvtph_ps(h));
        }
        i += 8;
    }
    for k in i..n {
        dst[k] = src[k].to_f32();
    }
}

/// Stores `src` as f16, rounding to nearest, ties to even (as ggml's
/// `ggml_fp32_to_fp16_row` and the GPU's conversion).
pub fn f16_row(src: &[f32], dst: &mut [f16]) {
    dst.convert_from_f32_slice(src);
}

/// Stores `src` (a multiple of 32 values) as q8_0 blocks into `dst`, as
/// ggml's `quantize_row_q8_0_ref`: per block, `d = max|x| / 127` (stored
/// as f16), `q = round(x / d)` with ties away from zero.
pub fn q8_0_row(src: &[f32], dst: &mut [u8]) {
    for (x, y) in src
        .chunks_exact(Q8_0_BLOCK)
        .zip(dst.chunks_exact_mut(Q8_0_BYTES))
    {
        let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        y[..2].copy_from_slice(&f16::from_f32(d).to_bits().to_le_bytes());
        for (q, v) in y[2..].iter_mut().zip(x) {
            *q = ((v * id).round() as i8) as u8;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn noise(n: usize, seed: u32) -> Vec<f32> {
        let mut s = seed;
        (0..n)
            .map(|_| {
                s = s.wrapping_mul(1664525).wrapping_add(1013904223);
                (s >> 8) as f32 / (1u32 << 24) as f32 * 4.0 - 2.0
            })
            .collect()
    }

    #[test]
    fn f16_rows_round_to_nearest_and_widen_exactly() {
        let x = noise(128, 7);
        let mut h = vec![f16::ZERO; 128];
        f16_row(&x, &mut h);
        let rows = KvRows {
            data: KvData::F16(&h),
            ..KvRows::f32(&[], 64, 64)
        };
        let mut buf = rows.buffer();
        let r1 = rows.row::<false>(1, &mut buf).to_vec();
        for (i, (&v, &orig)) in r1.iter().zip(&x[64..]).enumerate() {
            assert_eq!(v, f16::from_f32(orig).to_f32(), "value {i}");
            // Within half an f16 ulp (2^-11 relative).
            assert!(
                (v - orig).abs() <= orig.abs() * (1.0 / 2048.0) + 1e-7,
                "{v} vs {orig}"
            );
        }
    }

    #[test]
    fn q8_0_rows_match_ggml_rounding() {
        let mut x = noise(64, 3);
        x[5] = 0.0;
        let mut q = vec![0u8; 2 * Q8_0_BYTES];
        q8_0_row(&x, &mut q);
        let rows = KvRows {
            data: KvData::Q8_0(&q),
            ..KvRows::f32(&[], 32, 32)
        };
        let mut buf = rows.buffer();
        for j in 0..2 {
            let r = rows.row::<false>(j, &mut buf).to_vec();
            let amax = x[j * 32..][..32].iter().fold(0.0f32, |m, v| m.max(v.abs()));
            let d = f16::from_f32(amax / 127.0).to_f32();
            // The largest value maps to ±127 and every value lands within
            // half a step of its original.
            assert!(r.iter().any(|v| (v.abs() - 127.0 * d).abs() < 1e-6));
            for (v, o) in r.iter().zip(&x[j * 32..][..32]) {
                assert!((v - o).abs() <= 0.5 * d + 1e-3 * d, "{v} vs {o} (step {d})");
            }
        }
        assert_eq!(rows.row::<false>(0, &mut buf)[5], 0.0);
        // An all-zero block stores d = 0 and zeros, not NaN.
        let mut z = vec![0u8; Q8_0_BYTES];
        q8_0_row(&[0.0; 32], &mut z);
        assert!(z.iter().all(|&b| b == 0));
    }

    #[test]
    fn widened_rows_give_the_bits_of_f32_rows_holding_the_same_values() {
        // Scores and values over an f16 cache equal those over an f32 cache
        // of the rounded values: the kernels see the same f32 rows.
        let (d, len, heads) = (64, 37, 3);
        let k = noise(len * 2 * d, 11);
        let v = noise(len * 2 * d, 12);
        let q = noise(heads * d, 13);
        let p = noise(heads * len, 14);
        let round = |ty: &str, x: &[f32]| -> Vec<f32> {
            if ty == "f16" {
                return x.iter().map(|&a| f16::from_f32(a).to_f32()).collect();
            }
            let mut b = vec![0u8; x.len() / 32 * Q8_0_BYTES];
            q8_0_row(x, &mut b);
            let mut out = vec![0.0; x.len()];
            crate::legacy::q8_0(&b, &mut out);
            out
        };
        for ty in ["f16", "q8_0"] {
            let (kr, vr) = (round(ty, &k), round(ty, &v));
            let (mut kh, mut vh) = (vec![f16::ZERO; k.len()], vec![f16::ZERO; v.len()]);
            f16_row(&k, &mut kh);
            f16_row(&v, &mut vh);
            let (mut kq, mut vq) = (
                vec![0u8; k.len() / 32 * Q8_0_BYTES],
                vec![0u8; v.len() / 32 * Q8_0_BYTES],
            );
            q8_0_row(&k, &mut kq);
            q8_0_row(&v, &mut vq);
            // Second head of each row: offset d into the row of 2d values.
            let at = |data| KvRows {
                data,
                ..KvRows::f32(&[], 2 * d, d)
            };
            let (krows, vrows) = match ty {
                "f16" => (at(KvData::F16(&kh[d..])), at(KvData::F16(&vh[d..]))),
                _ => (
                    at(KvData::Q8_0(&kq[d / 32 * Q8_0_BYTES..])),
                    at(KvData::Q8_0(&vq[d / 32 * Q8_0_BYTES..])),
                ),
            };
            let mut want = vec![0.0; heads * len];
            crate::attention_scores_heads(&q, d, &kr[d..], 2 * d, 0.125, &mut want);
            let mut got = vec![0.0; heads * len];
            crate::attention_scores_rows(&q, &krows, 0.125, &mut got);
            assert_eq!(want, got, "{ty} scores");
            let mut want = vec![0.0; heads * d];
            crate::attention_values_heads(&p, len, &vr[d..], 2 * d, &mut want);
            let mut got = vec![0.0; heads * d];
            crate::attention_values_rows(&p, len, &vrows, &mut got);
            assert_eq!(want, got, "{ty} values");
        }
    }

    #[test]
    fn the_f16c_widening_equals_the_portable_one() {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("f16c") {
            // Every f16 bit pattern: normals, subnormals, zeros, inf, NaN.
            let all: Vec<f16> = (0..=u16::MAX).map(f16::from_bits).collect();
            let (mut hw, mut sw) = (vec![0.0f32; all.len()], vec![0.0f32; all.len()]);
            // SAFETY: f16c was just detected.
            unsafe { widen_f16c(&all, &mut hw) };
            all.convert_to_f32_slice(&mut sw);
            for (i, (a, b)) in hw.iter().zip(&sw).enumerate() {
                assert!(
                    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan()),
                    "{i:#06x}"
                );
            }
            // Odd lengths take the scalar tail.
            let mut tail = vec![0.0f32; 13];
            unsafe { widen_f16c(&all[100..113], &mut tail) };
            assert_eq!(tail, sw[100..113]);
        }
    }

    #[test]
    fn ring_rows_wrap_to_the_start() {
        // Rows 0..5 of a ring of 5 read from row 3: 3, 4, 0, 1, 2.
        let data: Vec<f32> = (0..5 * 4).map(|i| i as f32).collect();
        let rows = KvRows {
            first: 3,
            ring: 5,
            ..KvRows::f32(&data, 4, 2)
        };
        let mut buf = rows.buffer();
        let firsts: Vec<f32> = (0..5).map(|j| rows.row::<false>(j, &mut buf)[0]).collect();
        assert_eq!(firsts, [12.0, 16.0, 0.0, 4.0, 8.0]);
    }
}
