//! The SIMD path against the portable one, bit for bit, over random blocks (valid and
//! arbitrary scales, subnormal and special values included) and every tile shape.

#![allow(clippy::unwrap_used)]

use super::{simd_kernels, RowKernel, ROW_GROUP};
use crate::{geometry, GgmlType};

/// The block of the SIMD kernels of `ty` as (weights, bytes): the type's own block,
/// or for the plain 16-bit floats 32 of their 1-weight "blocks" (one unit); rows that
/// are not whole such blocks take the portable path.
fn simd_block(ty: GgmlType) -> (usize, usize) {
    let (bs, ts) = geometry(ty);
    let per = 32usize.div_ceil(bs);
    (per * bs, per * ts)
}

/// xorshift64*: deterministic, no dependencies.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
    /// Mostly uniform in [-1, 1); one value in 64 is 0, ±huge or subnormal.
    fn x(&mut self, n: usize) -> Vec<f32> {
        (0..n)
            .map(|_| match self.next() % 64 {
                0 => 0.0,
                1 => 3.0e38,
                2 => -1.0e-40,
                _ => (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0,
            })
            .collect()
    }
}

/// Types with a SIMD kernel on x86-64, with the byte offsets of their f16 scales (of
/// every value, for the plain floats).
const SIMD_TYPES: [(GgmlType, &[usize]); 16] = [
    (GgmlType::F16, &[0]),
    (GgmlType::BF16, &[0]),
    (GgmlType::Q4_0, &[0]),
    (GgmlType::Q4_1, &[0, 2]),
    (GgmlType::Q5_0, &[0]),
    (GgmlType::Q5_1, &[0, 2]),
    (GgmlType::Q8_0, &[0]),
    (GgmlType::Q8_1, &[0, 2]),
    (GgmlType::TQ2_0, &[64]),
    (GgmlType::IQ4NL, &[0]),
    (GgmlType::IQ4XS, &[0]),
    (GgmlType::Q2K, &[80, 82]),
    (GgmlType::Q3K, &[108]),
    (GgmlType::Q4K, &[0, 2]),
    (GgmlType::Q5K, &[0, 2]),
    (GgmlType::Q6K, &[208]),
];

fn kernel(ty: GgmlType) -> RowKernel {
    crate::kernel(ty).unwrap()
}

/// Equal bits, or both NaN (x86 picks a NaN operand's payload, and the compiler may
/// commute the operands of a product or sum).
fn same(a: f32, b: f32) -> bool {
    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
}

/// Random blocks; with `finite_scales`, each f16 scale is rewritten with exponent ≤ 15
/// (|s| < 2, subnormals and zeros included) so that every weight is finite.
fn blocks(rng: &mut Rng, ty: GgmlType, scales: &[usize], n: usize, finite_scales: bool) -> Vec<u8> {
    let (_, ts) = geometry(ty);
    let mut w = rng.bytes(n * ts);
    if finite_scales {
        for b in w.chunks_exact_mut(ts) {
            for &off in scales {
                let h = (rng.next() as u16) & !0x4000;
                b[off..off + 2].copy_from_slice(&h.to_le_bytes());
            }
        }
    }
    w
}

#[test]
fn simd_kernels_exist_where_the_cpu_has_them() {
    #[cfg(target_arch = "x86_64")]
    for (ty, _) in SIMD_TYPES {
        let names: Vec<_> = simd_kernels(ty).iter().map(|k| k.0).collect();
        if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("f16c") {
            assert!(names.contains(&"avx2"), "{ty} has no AVX2 kernel");
        }
        #[cfg(lamina_avx512)]
        if is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512vl")
        {
            assert_eq!(names.first(), Some(&"avx512"), "{ty} has no AVX-512 kernel");
        }
    }
}

#[test]
fn simd_path_equals_portable_path_bit_for_bit() {
    let mut rng = Rng(0x5EED_51AD);
    for (ty, scales) in SIMD_TYPES {
        let k = kernel(ty);
        let (bs, ts) = simd_block(ty);
        let type_blocks = ts / geometry(ty).1;
        for (name, simd) in simd_kernels(ty) {
            for finite_scales in [true, false] {
                for blocks_per_row in [1, 2, 3] {
                    let (cols, row_bytes) = (blocks_per_row * bs, blocks_per_row * ts);
                    // Row counts around the SIMD row group, column counts around its tile.
                    for rows in [1, 3, ROW_GROUP, ROW_GROUP + 1, 2 * ROW_GROUP + 3] {
                        let n_blocks = rows * blocks_per_row * type_blocks;
                        let w = blocks(&mut rng, ty, scales, n_blocks, finite_scales);
                        for n in (1..=9).chain([16, 17, 33]) {
                            // With finite weights, ordinary activations: every output is
                            // then finite, so a single wrong weight shows in its bits
                            // (with x's specials nearly every 256-weight row sums to ±inf
                            // or NaN, which hides most wrong weights).
                            let x = if finite_scales {
                                uniform(&mut rng, n * cols)
                            } else {
                                rng.x(n * cols)
                            };
                            let mut want = vec![f32::NAN; rows * n];
                            k.portable().dots(&w, row_bytes, &x, n, &mut want);
                            let mut got = vec![f32::NAN; rows * n];
                            assert!(simd(&w, row_bytes, &x, n, &mut got));
                            for (i, (g, e)) in got.iter().zip(&want).enumerate() {
                                assert!(
                                    same(*g, *e),
                                    "{ty} {name} rows {rows} cols {cols} n {n} out[{i}]: {g:e} \
                                 ({:#010x}), portable {e:e} ({:#010x})",
                                    g.to_bits(),
                                    e.to_bits()
                                );
                            }
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn simd_kernels_reject_wrong_shapes() {
    for (ty, _) in SIMD_TYPES {
        let Some(simd) = kernel(ty).simd else {
            continue;
        };
        let (bs, ts) = simd_block(ty);
        let w = vec![0u8; 2 * ts];
        let x = vec![0.0; bs];
        let mut out = [0.0; 2];
        assert!(simd(&w, ts, &x, 1, &mut out));
        assert!(!simd(&w, ts, &x, 1, &mut out[..1]), "{ty}: short out");
        assert!(!simd(&w, ts, &x[1..], 1, &mut out), "{ty}: short x");
        assert!(!simd(&w[1..], ts, &x, 1, &mut out), "{ty}: partial row");
        assert!(!simd(&w, ts - 1, &x, 1, &mut out), "{ty}: partial block");
        assert!(!simd(&w, 0, &x, 1, &mut out), "{ty}: empty rows");
    }
}

/// Plain float rows that are not whole units of 32 are the portable path's: the SIMD
/// kernels decline them, and the kernel's result is still the portable one.
#[test]
fn ragged_float_rows_fall_back_to_the_portable_path() {
    let mut rng = Rng(0xF16_F16);
    for ty in [GgmlType::F16, GgmlType::BF16] {
        let k = kernel(ty);
        for cols in [1, 17, 48, 80, 100] {
            let (rows, n) = (5, 3);
            let w = blocks(&mut rng, ty, &[0], rows * cols, true);
            let x = uniform(&mut rng, n * cols);
            for (name, simd) in simd_kernels(ty) {
                let mut out = vec![0.0; rows * n];
                assert!(
                    !simd(&w, 2 * cols, &x, n, &mut out),
                    "{ty} {name} took a row of {cols}"
                );
            }
            let mut want = vec![f32::NAN; rows * n];
            k.portable().dots(&w, 2 * cols, &x, n, &mut want);
            let mut got = vec![f32::NAN; rows * n];
            k.dots(&w, 2 * cols, &x, n, &mut got);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got), bits(&want), "{ty} cols {cols}");
        }
    }
}

/// Uniform in [-1, 1): activations without specials (the attention helpers, and the
/// kernels over finite weights).
fn uniform(rng: &mut Rng, n: usize) -> Vec<f32> {
    (0..n)
        .map(|_| (rng.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0)
        .collect()
}

#[test]
fn attention_scores_are_strided_dot_products_in_the_kernels_order() {
    let mut rng = Rng(0xA77E_0001);
    for (d, stride, n) in [(64, 192, 37), (256, 256, 5), (16, 48, 1)] {
        let q = uniform(&mut rng, d);
        let keys = uniform(&mut rng, (n - 1) * stride + d);
        let mut got = vec![f32::NAN; n];
        super::attention_scores(&q, &keys, stride, 0.125, &mut got);
        for (j, g) in got.iter().enumerate() {
            let k = &keys[j * stride..][..d];
            // The same bits as the kernels' dot product, then the scale.
            assert_eq!(g.to_bits(), (super::dot_f32(&q, k) * 0.125).to_bits());
            let exact: f64 = q
                .iter()
                .zip(k)
                .map(|(a, b)| f64::from(*a) * f64::from(*b))
                .sum();
            assert!(
                (f64::from(*g) - exact * 0.125).abs() < 1e-5,
                "{g} vs {}",
                exact * 0.125
            );
        }
    }
}

#[test]
fn attention_values_are_an_fma_chain_in_key_order() {
    let mut rng = Rng(0xA77E_0002);
    for (d, stride, n) in [(64, 192, 37), (256, 256, 4), (8, 8, 3), (64, 64, 1)] {
        let p = uniform(&mut rng, n);
        let values = uniform(&mut rng, (n - 1) * stride + d);
        let mut got = vec![f32::NAN; d];
        super::attention_values(&p, &values, stride, &mut got);
        for (i, g) in got.iter().enumerate() {
            // Whatever the grouping of keys per pass, one chain per element.
            let chain = (0..n).fold(0.0f32, |o, j| p[j].mul_add(values[j * stride + i], o));
            assert_eq!(g.to_bits(), chain.to_bits(), "element {i} of {d}, {n} keys");
            let exact: f64 = (0..n)
                .map(|j| f64::from(p[j]) * f64::from(values[j * stride + i]))
                .sum();
            assert!((f64::from(*g) - exact).abs() < 1e-5);
        }
    }
}

/// Several heads over shared keys and values give, bit for bit, what one
/// call per head gives (grouped-query attention reads each row once).
#[test]
fn grouped_heads_equal_one_call_per_head() {
    let mut rng = Rng(0xA77E_0003);
    for (heads, d, stride, n) in [(3, 64, 192, 37), (4, 256, 256, 6), (2, 16, 48, 1)] {
        let q = uniform(&mut rng, heads * d);
        let keys = uniform(&mut rng, (n - 1) * stride + d);
        let mut together = vec![f32::NAN; heads * n];
        super::attention_scores_heads(&q, d, &keys, stride, 0.125, &mut together);
        let p = uniform(&mut rng, heads * n);
        let mut out = vec![f32::NAN; heads * d];
        super::attention_values_heads(&p, n, &keys, stride, &mut out);
        for h in 0..heads {
            let mut alone = vec![f32::NAN; n];
            super::attention_scores(&q[h * d..][..d], &keys, stride, 0.125, &mut alone);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(
                bits(&together[h * n..][..n]),
                bits(&alone),
                "scores of head {h}"
            );
            let mut one = vec![f32::NAN; d];
            super::attention_values(&p[h * n..][..n], &keys, stride, &mut one);
            assert_eq!(bits(&out[h * d..][..d]), bits(&one), "values of head {h}");
        }
    }
}
