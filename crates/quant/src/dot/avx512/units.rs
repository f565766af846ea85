//! Block decoders for the AVX-512 kernels: units of 32 weights as two `__m512` of 16
//! consecutive weights, equal bit for bit to the scalar decoders.
//!
//! With 16 lanes a 4- or 5-bit quant indexes a table of its block's (or sub-block's)
//! possible weights held in one or two registers (`vpermps`, `vpermt2ps`). Each table
//! entry is computed from the level `q` by the scalar decoder's f32 operations (`q·d`,
//! `q·d + m`, `d₁·q − m₁`), so looking a weight up gives the bits decoding it would.
//! Q8_0, Q8_1 and Q6_K have too many levels per scale and convert each quant instead;
//! the 2- and 3-bit types (Q2_K, Q3_K, TQ2_0) convert the AVX2 decoders' bytes, where a
//! table would cost as much, and F16/BF16 are widened.

use std::arch::x86_64::*;

use crate::dot::avx2::units::{
    crumbs, f16_splat, iq4xs_factors, k4_factors, q2_factors, q3_bytes, q3_factors, q6_bytes,
    scale8, BF16, F16, IQ4NL, IQ4XS, Q2K, Q3K, Q4K, Q4_0, Q4_1, Q5K, Q5_0, Q5_1, Q6K, Q8_0, Q8_1,
    TQ2_0,
};
use crate::iq_tables::KVALUES_IQ4NL;

/// A block type the AVX-512 kernels can decode in registers.
///
/// # Safety
/// Implementations read only the `TS` bytes of the block they are given.
pub(crate) unsafe trait Unit512 {
    /// Weights per block (a multiple of 32).
    const BS: usize;
    /// Bytes per block.
    const TS: usize;

    /// Calls `f(u, weights 32u .. 32u + 32)` for u = 0 .. BS / 32, in order. Caller:
    /// avx512f, avx512bw, avx512vl, avx2 and f16c are available and `b` points at `TS`
    /// readable bytes.
    unsafe fn units(b: *const u8, f: impl FnMut(usize, [__m512; 2]));
}

/// The levels −16 … 31 as f32 (exact): `LEVELS[16 + q]` is q.
static LEVELS: [f32; 48] = {
    let mut t = [0.0; 48];
    let mut i = 0;
    while i < 48 {
        t[i] = i as f32 - 16.0;
        i += 1;
    }
    t
};

/// `KVALUES_IQ4NL` as f32 (exact).
static KVALUES_IQ4NL_F32: [f32; 16] = {
    let mut t = [0.0; 16];
    let mut i = 0;
    while i < 16 {
        t[i] = KVALUES_IQ4NL[i] as f32;
        i += 1;
    }
    t
};

/// The 16 levels starting at `first` (−16 ≤ first ≤ 16).
#[inline]
#[target_feature(enable = "avx512f")]
fn levels(first: i32) -> __m512 {
    let i = (first + 16) as usize;
    // SAFETY: 16 f32 from LEVELS[i ..], i ≤ 32.
    unsafe { _mm512_loadu_ps(LEVELS[i..i + 16].as_ptr()) }
}

/// The IEEE half at `p`, widened exactly into all 16 lanes. Caller: avx512f, 2 bytes
/// readable.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn f16_splat16(p: *const u8) -> __m512 {
    // SAFETY: the caller guarantees 2 readable bytes; unaligned read.
    let bits = unsafe { p.cast::<u16>().read_unaligned() };
    _mm512_cvtph_ps(_mm256_set1_epi16(bits as i16))
}

/// The 16 bytes at `p`, one per 32-bit lane (zero-extended). A lane indexes a 16-entry
/// table by its low nibble as it is (`vpermps` reads index bits 0–3 only) and by its
/// high nibble after [`high`]. Caller: avx512f, 16 bytes readable.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn bytes16(p: *const u8) -> __m512i {
    // SAFETY: the caller guarantees 16 readable bytes; unaligned load.
    _mm512_cvtepu8_epi32(unsafe { _mm_loadu_si128(p.cast()) })
}

/// The high nibble of each lane of [`bytes16`].
#[inline]
#[target_feature(enable = "avx512f")]
fn high(v: __m512i) -> __m512i {
    _mm512_srli_epi32::<4>(v)
}

/// The low nibble of each lane of [`bytes16`], cleared of the high one (for
/// [`lookup32`], which reads index bit 4).
#[inline]
#[target_feature(enable = "avx512f")]
fn low(v: __m512i) -> __m512i {
    _mm512_and_si512(v, _mm512_set1_epi32(0x0F))
}

/// Weights of 16 indices (bits 0–3 of each lane) from a 16-entry table.
#[inline]
#[target_feature(enable = "avx512f")]
fn lookup16(idx: __m512i, table: __m512) -> __m512 {
    _mm512_permutexvar_ps(idx, table)
}

/// Weights of 16 nibbles (lanes < 16) plus fifth bits (bit i of `fifth` for lane i)
/// from the 32-entry table `lo ‖ hi`.
#[inline]
#[target_feature(enable = "avx512f")]
fn lookup32(nib: __m512i, fifth: u16, lo: __m512, hi: __m512) -> __m512 {
    let i = _mm512_mask_or_epi32(nib, fifth, nib, _mm512_set1_epi32(16));
    _mm512_permutex2var_ps(lo, i, hi)
}

/// Signed bytes 0–15 and 16–31 of `q` to f32 (exact).
#[inline]
#[target_feature(enable = "avx512f,avx2")]
fn widen(q: __m256i) -> [__m512; 2] {
    let f = |v: __m128i| _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(v));
    [
        f(_mm256_castsi256_si128(q)),
        f(_mm256_extracti128_si256::<1>(q)),
    ]
}

/// Signed bytes 0–15 and 16–31 of `q` to f32, each times its scale.
#[inline]
#[target_feature(enable = "avx512f,avx2")]
fn widen_mul(q: __m256i, d0: __m512, d1: __m512) -> [__m512; 2] {
    let [q0, q1] = widen(q);
    [_mm512_mul_ps(d0, q0), _mm512_mul_ps(d1, q1)]
}

// SAFETY (every impl below): offsets are those of the layout table of the type's
// module and stay inside its TS bytes.

// SAFETY: 32 halves; 64 bytes.
unsafe impl Unit512 for F16 {
    const BS: usize = 32;
    const TS: usize = 64;

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,f16c")]
    unsafe fn units(b: *const u8, mut f: impl FnMut(usize, [__m512; 2])) {
        // SAFETY: bytes 0–63 of the block.
        let g = |k: usize| unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(b.add(32 * k).cast())) };
        f(0, [g(0), g(1)]);
    }
}

// SAFETY: 32 bf16; 64 bytes.
unsafe impl Unit512 for BF16 {
    const BS: usize = 32;
    const TS: usize = 64;

    /// As the AVX2 decoder: each bf16 shifted into the top half of its lane.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,f16c")]
    unsafe fn units(b: *const u8, mut f: impl FnMut(usize, [__m512; 2])) {
        // SAFETY: bytes 0–63 of the block.
        let g = |k: usize| unsafe {
            let v = _mm512_cvtepu16_epi32(_mm256_loadu_si256(b.add(32 * k).cast()));
            _mm512_castsi512_ps(_mm512_slli_epi32::<16>(v))
        };
        f(0, [g(0), g(1)]);
    }
}

// SAFETY: d at 0, 16 quant bytes at 2; 18 bytes.
unsafe impl Unit512 for Q4_0 {
    const BS: usize = 32;
    const TS: usize = 18;

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,f16c")]
    unsafe fn units(b: *const u8, mut f: impl FnMut(usize, [__m512; 2])) {
        // SAFETY: bytes 0–17 of the block.
        let (d, v) = unsafe { (f16_splat16(b), bytes16(b.add(2))) };
        // (q − 8) · d for q = 0 … 15.
        let t = _mm512_mul_ps(levels(-8), d);
        f(0, [lookup16(v, t), lookup16(high(v), t)]);
    }
}

// SAFETY: d at 0, m at 2, 16 quant bytes at 4; 20 bytes.
unsafe impl Unit512 for Q4_1 {
    const BS: usize = 32;
    const TS: usize = 20;

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,f16c")]
    unsafe fn units(b: *const u8, mut f: impl FnMut(usize, [__m512; 2])) {
        // SAFETY: bytes 0–19 of the block.
        let (d, m, v) = unsafe { (f16_splat16(b), f16_splat16(b.add(2)), bytes16(b.add(4))) };
        // q · d + m for q = 0 … 15.
        let t = _mm512_add_ps(_mm512_mul_ps(levels(0), d), m);
        f(0, [lookup16(v, t), lookup16(high(v), t)]);
    }
}

// SAFETY: d at 0, qh at 2, 16 quant bytes at 6; 22 bytes.
unsafe impl Unit512 for Q5_0 {
    const BS: usize = 32;
    const TS: usize = 22;

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,f16c")]
    unsafe fn units(b: *const u8, mut f: impl FnMut(usize, [__m512; 2])) {
        // SAFETY: bytes 0–1 (d), 2–5 (qh) and 6–21 (qs) of the block.
        let (d, qh, v) = unsafe {
            let qh = b.add(2).cast::<u32>().read_unaligned();
            (f16_splat16(b), qh, bytes16(b.add(6)))
        };
        // (q − 16) · d for q = 0 … 31.
        let (t0, t1) = (_mm512_mul_ps(levels(-16), d), _mm512_mul_ps(levels(0), d));
        f(
            0,
            [
                lookup32(low(v), qh as u16, t0, t1),
                lookup32(high(v), (qh >> 16) as u16, t0, t1),
            ],
        );
    }
}

// SAFETY: d at 0, m at 2, qh at 4, 16 quant bytes at 8; 24 bytes.
unsafe impl Unit512 for Q5_1 {
    const BS: usize = 32;
    const TS: usize = 24;

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,f16c")]
    unsafe fn units(b: *const u8, mut f: impl FnMut(usize, [__m512; 2])) {
        // SAFETY: bytes 0–3 (d, m), 4–7 (qh) and 8–23 (qs) of the block.
        let (d, m, qh, v) = unsafe {
            let qh = b.add(4).cast::<u32>().read_unaligned();
            (f16_splat16(b), f16_splat16(b.add(2)), qh, bytes16(b.add(8)))
        };
        // q · d + m for q = 0 … 31.
        let t0 = _mm512_add_ps(_mm512_mul_ps(levels(0), d), m);
        let t1 = _mm512_add_ps(_mm512_mul_ps(levels(16), d), m);
        f(
            0,
            [
                lookup32(low(v), qh as u16, t0, t1),
                lookup32(high(v), (qh >> 16) as u16, t0, t1),
            ],
        );
    }
}

// SAFETY: d at 0, 32 signed quant bytes at 2; 34 bytes.
unsafe impl Unit512 for Q8_0 {
    const BS: usize = 32;
    const TS: usize = 34;

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,f16c")]
    unsafe fn units(b: *const u8, mut f: impl FnMut(usize, [__m512; 2])) {
        // SAFETY: bytes 0–33 of the block.
        let (d, q) = unsafe { (f16_splat16(b), _mm256_loadu_si256(b.add(2).cast())) };
        f(0, widen_mul(q, d, d));
    }
}

// SAFETY: d at 0, s at 2 (unused), 32 signed quant bytes at 4; 36 bytes.
unsafe impl Unit512 for Q8_1 {
    const BS: usize = 32;
    const TS: usize = 36;

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,f16c")]
    unsafe fn units(b: *const u8, mut f: impl FnMut(usize, [__m512; 2])) {
        // SAFETY: bytes 0–1 and 4–35 of the block.
        let (d, q) = unsafe { (f16_splat16(b), _mm256_loadu_si256(b.add(4).cast())) };
        f(0, widen_mul(q, d, d));
    }
}

// SAFETY: qs at 0–63, d at 64; 66 bytes.
unsafe impl Unit512 for TQ2_0 {
    const BS: usize = 256;
    const TS: usize = 66;

    /// The AVX2 passes (`crumbs`) less one, converted.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,f16c")]
    unsafe fn units(b: *const u8, mut f: impl FnMut(usize, [__m512; 2])) {
        // SAFETY: bytes 64–65 of the block.
        let d = unsafe { f16_splat16(b.add(64)) };
        let one = _mm256_set1_epi8(1);
        for g in 0..2 {
            // SAFETY: bytes 32g .. 32g + 32 ≤ 64 of the block.
            let q = unsafe { _mm256_loadu_si256(b.add(32 * g).cast()) };
            for (s, q) in crumbs(q).iter().enumerate() {
                f(4 * g + s, widen_mul(_mm256_sub_epi8(*q, one), d, d));
            }
        }
    }
}

// SAFETY: Q4_0's layout (d at 0, 16 nibble bytes at 2); nibbles index `KVALUES_IQ4NL`.
unsafe impl Unit512 for IQ4NL {
    const BS: usize = 32;
    const TS: usize = 18;

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,f16c")]
    unsafe fn units(b: *const u8, mut f: impl FnMut(usize, [__m512; 2])) {
        // SAFETY: bytes 0–17 of the block; the table is 16 f32.
        let (d, v, kv) = unsafe {
            let kv = _mm512_loadu_ps(KVALUES_IQ4NL_F32.as_ptr());
            (f16_splat16(b), bytes16(b.add(2)), kv)
        };
        // d · value, as the scalar decoder reads it.
        let t = _mm512_mul_ps(d, kv);
        f(0, [lookup16(v, t), lookup16(high(v), t)]);
    }
}

// SAFETY: scales at 0–15; qs at 16–79; d, dmin at 80, 82; 84 bytes.
unsafe impl Unit512 for Q2K {
    const BS: usize = 256;
    const TS: usize = 84;

    /// The AVX2 passes (`crumbs`), converted: with four levels per scale a table would
    /// need as many operations as the conversion.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,f16c")]
    unsafe fn units(b: *const u8, mut f: impl FnMut(usize, [__m512; 2])) {
        // SAFETY: bytes 0–15 and 80–83 of the block.
        let (ds, dm) = unsafe { q2_factors(b, f16_splat(b.add(80)), f16_splat(b.add(82))) };
        for n in 0..2 {
            // SAFETY: bytes 16 + 32n .. 48 + 32n ≤ 80 of the block.
            let q = unsafe { _mm256_loadu_si256(b.add(16 + 32 * n).cast()) };
            for (j, q) in crumbs(q).iter().enumerate() {
                let u = 4 * n + j;
                let [q0, q1] = widen(*q);
                // dl·q − ml: a rounded product, then a rounded difference.
                let w = |q, k: usize| {
                    let (d, m) = (_mm512_set1_ps(ds[k]), _mm512_set1_ps(dm[k]));
                    _mm512_sub_ps(_mm512_mul_ps(d, q), m)
                };
                f(u, [w(q0, 2 * u), w(q1, 2 * u + 1)]);
            }
        }
    }
}

// SAFETY: hmask at 0–31; qs at 32–95; scales at 96–107; d at 108; 110 bytes.
unsafe impl Unit512 for Q3K {
    const BS: usize = 256;
    const TS: usize = 110;

    /// The AVX2 passes (`q3_bytes`), converted as Q2_K's are.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,f16c")]
    unsafe fn units(b: *const u8, mut f: impl FnMut(usize, [__m512; 2])) {
        // SAFETY: bytes 0–31 and 96–109 of the block.
        let (ds, hmask) = unsafe {
            (
                q3_factors(b.add(96), f16_splat(b.add(108))),
                _mm256_loadu_si256(b.cast()),
            )
        };
        for n in 0..2 {
            // SAFETY: bytes 32 + 32n .. 64 + 32n ≤ 96 of the block.
            let q = unsafe { _mm256_loadu_si256(b.add(32 + 32 * n).cast()) };
            let hm = if n == 0 {
                hmask
            } else {
                _mm256_srli_epi16::<4>(hmask)
            };
            for (j, q) in q3_bytes(q, hm).iter().enumerate() {
                let u = 4 * n + j;
                let (d0, d1) = (_mm512_set1_ps(ds[2 * u]), _mm512_set1_ps(ds[2 * u + 1]));
                f(u, widen_mul(*q, d0, d1));
            }
        }
    }
}

// SAFETY: d at 0; scales_h at 2–3; scales_l at 4–7; qs at 8–135; 136 bytes.
unsafe impl Unit512 for IQ4XS {
    const BS: usize = 256;
    const TS: usize = 136;

    /// IQ4_NL's lookup per unit, the table scaled by the unit's `d·ls`.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,f16c")]
    unsafe fn units(b: *const u8, mut f: impl FnMut(usize, [__m512; 2])) {
        // SAFETY: bytes 0–7 of the block; the table is 16 f32.
        let (ds, kv) = unsafe {
            (
                iq4xs_factors(b, f16_splat(b)),
                _mm512_loadu_ps(KVALUES_IQ4NL_F32.as_ptr()),
            )
        };
        for (i, dl) in ds.iter().enumerate() {
            // SAFETY: bytes 8 + 16i .. 24 + 16i ≤ 136 of the block.
            let v = unsafe { bytes16(b.add(8 + 16 * i)) };
            // dl · value, as the scalar decoder reads it.
            let t = _mm512_mul_ps(_mm512_set1_ps(*dl), kv);
            f(i, [lookup16(v, t), lookup16(high(v), t)]);
        }
    }
}

// SAFETY: d, dmin at 0, 2; scales at 4–15; qs at 16–143; 144 bytes.
unsafe impl Unit512 for Q4K {
    const BS: usize = 256;
    const TS: usize = 144;

    /// Sub-blocks 2p and 2p + 1 are the low and high nibbles of `qs[32p..][..32]`; the
    /// table of sub-block u is d₁·q − m₁ for q = 0 … 15.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,f16c")]
    unsafe fn units(b: *const u8, mut f: impl FnMut(usize, [__m512; 2])) {
        // SAFETY: bytes 0–15 of the block.
        let (ds, dm) = unsafe { k4_factors(b.add(4), f16_splat(b), f16_splat(b.add(2))) };
        let q = levels(0);
        let table = |u: usize| {
            _mm512_sub_ps(
                _mm512_mul_ps(_mm512_set1_ps(ds[u]), q),
                _mm512_set1_ps(dm[u]),
            )
        };
        for p in 0..4 {
            // SAFETY: bytes 16 + 32p .. 48 + 32p ≤ 144 of the block.
            let (v0, v1) = unsafe { (bytes16(b.add(16 + 32 * p)), bytes16(b.add(32 + 32 * p))) };
            let t = table(2 * p);
            f(2 * p, [lookup16(v0, t), lookup16(v1, t)]);
            let t = table(2 * p + 1);
            f(2 * p + 1, [lookup16(high(v0), t), lookup16(high(v1), t)]);
        }
    }
}

// SAFETY: d, dmin at 0, 2; scales at 4–15; qh at 16–47; qs at 48–175; 176 bytes.
unsafe impl Unit512 for Q5K {
    const BS: usize = 256;
    const TS: usize = 176;

    /// As Q4_K with 32-entry tables; bit u of `qh[l]` is the fifth bit of weight l of
    /// sub-block u.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,f16c")]
    unsafe fn units(b: *const u8, mut f: impl FnMut(usize, [__m512; 2])) {
        // SAFETY: bytes 0–47 of the block.
        let ((ds, dm), mut qh) = unsafe {
            let factors = k4_factors(b.add(4), f16_splat(b), f16_splat(b.add(2)));
            (factors, _mm256_loadu_si256(b.add(16).cast::<__m256i>()))
        };
        let (q0, q1) = (levels(0), levels(16));
        let look = |nib: [__m512i; 2], fifth: u32, u: usize| {
            let (d1, m1) = (_mm512_set1_ps(ds[u]), _mm512_set1_ps(dm[u]));
            let t0 = _mm512_sub_ps(_mm512_mul_ps(d1, q0), m1);
            let t1 = _mm512_sub_ps(_mm512_mul_ps(d1, q1), m1);
            [
                lookup32(nib[0], fifth as u16, t0, t1),
                lookup32(nib[1], (fifth >> 16) as u16, t0, t1),
            ]
        };
        for p in 0..4 {
            // SAFETY: bytes 48 + 32p .. 80 + 32p ≤ 176 of the block.
            let (v0, v1) = unsafe { (bytes16(b.add(48 + 32 * p)), bytes16(b.add(64 + 32 * p))) };
            let (lo, hi) = ([low(v0), low(v1)], [high(v0), high(v1)]);
            // qh holds bits 2p and 2p + 1 in bits 0 and 1 of each byte; `movemask`
            // reads bit 7 of each byte, and shifting 16-bit lanes left by 7 or 6 puts
            // each byte's own bit there.
            let f0 = _mm256_movemask_epi8(_mm256_slli_epi16::<7>(qh)) as u32;
            let f1 = _mm256_movemask_epi8(_mm256_slli_epi16::<6>(qh)) as u32;
            qh = _mm256_srli_epi16::<2>(qh);
            f(2 * p, look(lo, f0, 2 * p));
            f(2 * p + 1, look(hi, f1, 2 * p + 1));
        }
    }
}

// SAFETY: ql at 0–127, qh at 128–191, scales at 192–207, d at 208; 210 bytes.
unsafe impl Unit512 for Q6K {
    const BS: usize = 256;
    const TS: usize = 210;

    /// The passes of `q6_bytes`; the first 16 weights of pass j in half h take scale
    /// sc[8h + 2j], the last 16 sc[8h + 2j + 1].
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,f16c")]
    unsafe fn units(b: *const u8, mut f: impl FnMut(usize, [__m512; 2])) {
        // SAFETY: bytes 192–209 of the block.
        let (d, sc) = unsafe {
            (
                f16_splat(b.add(208)),
                b.add(192).cast::<[u64; 2]>().read_unaligned(),
            )
        };
        // The scalar decoder reads d · sc · q, left to right: d · sc first.
        let (mut ds0, mut ds1) = ([0.0; 8], [0.0; 8]);
        scale8(d, sc[0], true, &mut ds0);
        scale8(d, sc[1], true, &mut ds1);
        for (h, ds) in [ds0, ds1].iter().enumerate() {
            // SAFETY: ql bytes 64h .. 64h + 64 ≤ 128 and qh bytes 128 + 32h .. + 32 ≤ 192.
            let q = unsafe {
                q6_bytes(
                    _mm256_loadu_si256(b.add(64 * h).cast()),
                    _mm256_loadu_si256(b.add(64 * h + 32).cast()),
                    _mm256_loadu_si256(b.add(128 + 32 * h).cast()),
                )
            };
            for (j, q) in q.iter().enumerate() {
                let (s0, s1) = (_mm512_set1_ps(ds[2 * j]), _mm512_set1_ps(ds[2 * j + 1]));
                f(4 * h + j, widen_mul(*q, s0, s1));
            }
        }
    }
}
