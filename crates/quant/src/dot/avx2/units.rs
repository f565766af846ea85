//! Block decoders for the AVX2 kernels: each hands out its block as units of 32
//! weights, four `__m256` of 8 consecutive weights each, equal bit for bit to its scalar
//! decoder in `legacy.rs` / `kquants.rs` / `iquants.rs` / `ternary.rs` / `float.rs`
//! (layouts documented there).
//!
//! The plain floats are widened exactly (F16C for halves, a shift for bf16). For the
//! quantized types the pattern is the same: the quants become 32 small integers in the
//! bytes of a vector (exact), are widened to i32 and converted to f32 (exact: |q| < 2⁷),
//! and then get the scalar decoder's f32 operations in its order: `q·d`, `q·d + m`,
//! `d₁·q − m₁` or `(d·sc)·q`, each a rounded multiply then a rounded add. Per-block
//! factors (`d·sc` of each sub-block) are computed once per block, eight at a time.

use std::arch::x86_64::*;

use crate::iq_tables::KVALUES_IQ4NL;

/// A block type the AVX2 kernels can decode in registers.
///
/// # Safety
/// Implementations read only the `TS` bytes of the block they are given.
pub(crate) unsafe trait Unit {
    /// Weights per block (a multiple of 32).
    const BS: usize;
    /// Bytes per block.
    const TS: usize;

    /// Calls `f(u, weights 32u .. 32u + 32)` for u = 0 .. BS / 32, in order. Caller:
    /// avx2 and f16c are available and `b` points at `TS` readable bytes.
    unsafe fn units(b: *const u8, f: impl FnMut(usize, [__m256; 4]));
}

/// The IEEE half at `p`, widened exactly (F16C) into all 8 lanes. Caller: f16c
/// available, 2 bytes readable.
///
/// A broadcast load writes the whole register; a scalar load plus insert compiles to
/// `vpinsrw`, which merges into a live register and chains each block's decode to
/// the previous block's arithmetic.
#[inline]
#[target_feature(enable = "avx2,f16c")]
pub(crate) unsafe fn f16_splat(p: *const u8) -> __m256 {
    // SAFETY: the caller guarantees 2 readable bytes; unaligned read.
    let bits = unsafe { p.cast::<u16>().read_unaligned() };
    _mm256_cvtph_ps(_mm_set1_epi16(bits as i16))
}

/// 16 bytes at `p` as (low nibbles, high nibbles): weights 0–15 and 16–31 of a legacy
/// 4-bit block. Caller: avx2 available, 16 bytes readable.
#[inline]
#[target_feature(enable = "avx2,f16c")]
pub(crate) unsafe fn nibbles16(p: *const u8) -> (__m128i, __m128i) {
    // SAFETY: the caller guarantees 16 readable bytes; unaligned load.
    let q = unsafe { _mm_loadu_si128(p.cast()) };
    let m = _mm_set1_epi8(0x0F);
    (
        _mm_and_si128(q, m),
        _mm_and_si128(_mm_srli_epi16::<4>(q), m),
    )
}

/// 32 bytes at `p` as (low nibbles, high nibbles): two 32-weight sub-blocks of the 4-
/// and 5-bit k-quants. Caller: avx2 available, 32 bytes readable.
#[inline]
#[target_feature(enable = "avx2,f16c")]
pub(crate) unsafe fn nibbles32(p: *const u8) -> (__m256i, __m256i) {
    // SAFETY: the caller guarantees 32 readable bytes; unaligned load.
    let q = unsafe { _mm256_loadu_si256(p.cast()) };
    let m = _mm256_set1_epi8(0x0F);
    (
        _mm256_and_si256(q, m),
        _mm256_and_si256(_mm256_srli_epi16::<4>(q), m),
    )
}

/// Byte i of the result is 0xFF where bit i of `bits` is set, else 0.
#[inline]
#[target_feature(enable = "avx2")]
fn bits_to_bytes(bits: u32) -> __m256i {
    // Byte i takes byte i/8 of `bits`, then keeps bit i mod 8.
    let spread = _mm256_shuffle_epi8(
        _mm256_set1_epi32(bits as i32),
        _mm256_set_epi64x(
            0x0303_0303_0303_0303,
            0x0202_0202_0202_0202,
            0x0101_0101_0101_0101,
            0,
        ),
    );
    let select = _mm256_set1_epi64x(0x8040_2010_0804_0201_u64 as i64);
    _mm256_cmpeq_epi8(_mm256_and_si256(spread, select), select)
}

/// Signed bytes to f32 in four groups of 8: bytes 0–7 and 8–15 of `lo`, then of `hi`.
#[inline]
#[target_feature(enable = "avx2")]
fn widen(lo: __m128i, hi: __m128i) -> [__m256; 4] {
    let f = |v: __m128i| _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v));
    [
        f(lo),
        f(_mm_srli_si128::<8>(lo)),
        f(hi),
        f(_mm_srli_si128::<8>(hi)),
    ]
}

/// [`widen`] of the 32 signed bytes of `v`, in order.
#[inline]
#[target_feature(enable = "avx2")]
fn widen32(v: __m256i) -> [__m256; 4] {
    widen(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v))
}

/// `d·q` (the product commutes bit for bit).
#[inline]
#[target_feature(enable = "avx2")]
fn mul(q: [__m256; 4], d: __m256) -> [__m256; 4] {
    let f = |q| _mm256_mul_ps(d, q);
    [f(q[0]), f(q[1]), f(q[2]), f(q[3])]
}

/// `q·d + m`: a rounded product, then a rounded sum.
#[inline]
#[target_feature(enable = "avx2")]
fn mul_add(q: [__m256; 4], d: __m256, m: __m256) -> [__m256; 4] {
    let f = |q| _mm256_add_ps(_mm256_mul_ps(q, d), m);
    [f(q[0]), f(q[1]), f(q[2]), f(q[3])]
}

/// `d·q − m`: a rounded product, then a rounded difference.
#[inline]
#[target_feature(enable = "avx2")]
fn mul_sub(q: [__m256; 4], d: __m256, m: __m256) -> [__m256; 4] {
    let f = |q| _mm256_sub_ps(_mm256_mul_ps(d, q), m);
    [f(q[0]), f(q[1]), f(q[2]), f(q[3])]
}

/// `d · f32(bytes[i])` for the 8 bytes of `bytes` (unsigned, or signed with `signed`),
/// written to `out`: the per-sub-block factors of a k-quant block.
#[inline]
#[target_feature(enable = "avx2")]
pub(crate) fn scale8(d: __m256, bytes: u64, signed: bool, out: &mut [f32; 8]) {
    let v = _mm_cvtsi64_si128(bytes as i64);
    let wide = if signed {
        _mm256_cvtepi8_epi32(v)
    } else {
        _mm256_cvtepu8_epi32(v)
    };
    let s = _mm256_mul_ps(d, _mm256_cvtepi32_ps(wide));
    // SAFETY: `out` is 8 writable f32; unaligned store.
    unsafe { _mm256_storeu_ps(out.as_mut_ptr(), s) };
}

/// [`scale8`] of the 16 bytes `lo` (bytes 0–7) and `hi` (bytes 8–15).
#[inline]
#[target_feature(enable = "avx2")]
pub(crate) fn scale16(d: __m256, lo: u64, hi: u64, signed: bool) -> [f32; 16] {
    let (mut a, mut b) = ([0.0; 8], [0.0; 8]);
    scale8(d, lo, signed, &mut a);
    scale8(d, hi, signed, &mut b);
    let mut out = [0.0; 16];
    out[..8].copy_from_slice(&a);
    out[8..].copy_from_slice(&b);
    out
}

/// The four 2-bit fields of each of the 32 bytes of `q`: entry j holds bits 2j–2j+1 of
/// every byte, as bytes 0–3 (the passes of Q2_K, Q3_K and TQ2_0). Shifting 16-bit lanes
/// moves the neighbouring byte's bits into bits 6–7 at most, which the mask drops.
#[inline]
#[target_feature(enable = "avx2")]
pub(crate) fn crumbs(q: __m256i) -> [__m256i; 4] {
    let m = _mm256_set1_epi8(3);
    [
        _mm256_and_si256(q, m),
        _mm256_and_si256(_mm256_srli_epi16::<2>(q), m),
        _mm256_and_si256(_mm256_srli_epi16::<4>(q), m),
        _mm256_and_si256(_mm256_srli_epi16::<6>(q), m),
    ]
}

/// The sixteen `d·sc` and `dmin·m` factors of a Q2_K block from its 16 scale bytes at
/// `sc` (low nibble the sub-block's scale, high nibble its min). Caller: avx2, 16
/// bytes readable.
#[inline]
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn q2_factors(sc: *const u8, d: __m256, dmin: __m256) -> ([f32; 16], [f32; 16]) {
    // SAFETY: the caller guarantees the 16 bytes; unaligned reads.
    let (a, b) = unsafe {
        let p = sc.cast::<u64>();
        (p.read_unaligned(), p.add(1).read_unaligned())
    };
    const LOW4: u64 = 0x0F0F_0F0F_0F0F_0F0F;
    let ds = scale16(d, a & LOW4, b & LOW4, false);
    let dm = scale16(dmin, (a >> 4) & LOW4, (b >> 4) & LOW4, false);
    (ds, dm)
}

/// The sixteen `d·sc` factors of a Q3_K block from its 12 scale bytes at `sc`: 6-bit
/// scales biased by 32, unpacked for all sixteen at once with ggml's `kmask1`/`kmask2`
/// word trick (see `q3_k_scales` for where each bit lives). Caller: avx2, 12 bytes
/// readable.
#[inline]
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn q3_factors(sc: *const u8, d: __m256) -> [f32; 16] {
    // SAFETY: the caller guarantees the 12 bytes; unaligned reads.
    let (a, b, t) = unsafe {
        let p = sc.cast::<u32>();
        (
            p.read_unaligned(),
            p.add(1).read_unaligned(),
            p.add(2).read_unaligned(),
        )
    };
    const K1: u32 = 0x0303_0303;
    const K2: u32 = 0x0F0F_0F0F;
    // Scales 4w … 4w + 3 are the bytes of word w.
    let words = [
        (a & K2) | ((t & K1) << 4),
        (b & K2) | (((t >> 2) & K1) << 4),
        ((a >> 4) & K2) | (((t >> 4) & K1) << 4),
        ((b >> 4) & K2) | (((t >> 6) & K1) << 4),
    ];
    // Each byte s ≤ 63 becomes s − 32 as an i8: s + 0x60 ≤ 0x9F stays inside its byte,
    // and flipping bit 7 subtracts the remaining 0x80 mod 256.
    let unbias = |w: u32| u64::from(w.wrapping_add(0x6060_6060) ^ 0x8080_8080);
    let lo = unbias(words[0]) | unbias(words[1]) << 32;
    let hi = unbias(words[2]) | unbias(words[3]) << 32;
    scale16(d, lo, hi, true)
}

/// The four Q3_K passes over the 32 quant bytes `q` of one half as signed bytes
/// `low − 4` where the weight's hmask bit is clear, `low` otherwise: pass j takes bits
/// 2j–2j+1 of `q` and bit j of `hm` (the hmask, shifted right by 4 for the second half).
#[inline]
#[target_feature(enable = "avx2")]
pub(crate) fn q3_bytes(q: __m256i, hm: __m256i) -> [__m256i; 4] {
    let low = crumbs(q);
    // Bit j of each byte moved to bit 2 within 16-bit lanes; the bits that cross into
    // the neighbouring byte land in bits 0–1 or 7, never bit 2.
    let high = [
        _mm256_slli_epi16::<2>(hm),
        _mm256_slli_epi16::<1>(hm),
        hm,
        _mm256_srli_epi16::<1>(hm),
    ];
    let four = _mm256_set1_epi8(4);
    // 4 where bit 2 is clear, 0 where it is set.
    let f = |j: usize| _mm256_sub_epi8(low[j], _mm256_andnot_si256(high[j], four));
    [f(0), f(1), f(2), f(3)]
}

/// The eight `d·ls` factors of an IQ4_XS block at `b`: `ls` of unit i is nibble i of
/// `scales_l` (bytes 4–7) below bits 2i–2i+1 of `scales_h` (bytes 2–3), less 32.
/// Caller: avx2, bytes 2–7 of the block readable.
#[inline]
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn iq4xs_factors(b: *const u8, d: __m256) -> [f32; 8] {
    // SAFETY: the caller guarantees bytes 2–7; unaligned reads.
    let (high, low) = unsafe {
        (
            b.add(2).cast::<u16>().read_unaligned(),
            b.add(4).cast::<u32>().read_unaligned(),
        )
    };
    // Lane i shifts its copy of each word right by 4i and 2i.
    let low = _mm256_and_si256(
        _mm256_srlv_epi32(
            _mm256_set1_epi32(low as i32),
            _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28),
        ),
        _mm256_set1_epi32(0xF),
    );
    let high = _mm256_and_si256(
        _mm256_srlv_epi32(
            _mm256_set1_epi32(i32::from(high)),
            _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14),
        ),
        _mm256_set1_epi32(3),
    );
    let ls = _mm256_sub_epi32(
        _mm256_or_si256(low, _mm256_slli_epi32::<4>(high)),
        _mm256_set1_epi32(32),
    );
    let mut out = [0.0; 8];
    // SAFETY: `out` is 8 writable f32; unaligned store.
    unsafe { _mm256_storeu_ps(out.as_mut_ptr(), _mm256_mul_ps(d, _mm256_cvtepi32_ps(ls))) };
    out
}

/// Marker types, one per block layout.
pub(crate) struct Q4_0;
pub(crate) struct Q4_1;
pub(crate) struct Q5_0;
pub(crate) struct Q5_1;
pub(crate) struct Q8_0;
pub(crate) struct Q8_1;
pub(crate) struct TQ2_0;
pub(crate) struct IQ4NL;
pub(crate) struct IQ4XS;
pub(crate) struct Q2K;
pub(crate) struct Q3K;
pub(crate) struct Q4K;
pub(crate) struct Q5K;
pub(crate) struct Q6K;
/// Plain IEEE halves, in blocks of 32 (one unit); rows of other lengths are left to
/// the portable path.
pub(crate) struct F16;
/// Plain bf16, in blocks of 32 as [`F16`].
pub(crate) struct BF16;

// SAFETY (every impl below): offsets are those of the layout table of the type's
// module and stay inside its TS bytes.

// SAFETY: 32 halves; 64 bytes.
unsafe impl Unit for F16 {
    const BS: usize = 32;
    const TS: usize = 64;

    /// F16C widens exactly, as the scalar decoder does.
    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    unsafe fn units(b: *const u8, mut f: impl FnMut(usize, [__m256; 4])) {
        // SAFETY: bytes 16k .. 16k + 16 ≤ 64 of the block for k < 4.
        let g = |k: usize| unsafe { _mm256_cvtph_ps(_mm_loadu_si128(b.add(16 * k).cast())) };
        f(0, [g(0), g(1), g(2), g(3)]);
    }
}

// SAFETY: 32 bf16; 64 bytes.
unsafe impl Unit for BF16 {
    const BS: usize = 32;
    const TS: usize = 64;

    /// A bf16 is the top half of its f32: widen each to 32 bits and shift it there.
    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    unsafe fn units(b: *const u8, mut f: impl FnMut(usize, [__m256; 4])) {
        // SAFETY: bytes 16k .. 16k + 16 ≤ 64 of the block for k < 4.
        let g = |k: usize| unsafe {
            let v = _mm256_cvtepu16_epi32(_mm_loadu_si128(b.add(16 * k).cast()));
            _mm256_castsi256_ps(_mm256_slli_epi32::<16>(v))
        };
        f(0, [g(0), g(1), g(2), g(3)]);
    }
}

// SAFETY: d at 0, 16 quant bytes at 2; 18 bytes.
unsafe impl Unit for Q4_0 {
    const BS: usize = 32;
    const TS: usize = 18;

    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    unsafe fn units(b: *const u8, mut f: impl FnMut(usize, [__m256; 4])) {
        // SAFETY: bytes 0–17 of the block.
        let (d, (lo, hi)) = unsafe { (f16_splat(b), nibbles16(b.add(2))) };
        let eight = _mm_set1_epi8(8);
        f(
            0,
            mul(widen(_mm_sub_epi8(lo, eight), _mm_sub_epi8(hi, eight)), d),
        );
    }
}

// SAFETY: d at 0, m at 2, 16 quant bytes at 4; 20 bytes.
unsafe impl Unit for Q4_1 {
    const BS: usize = 32;
    const TS: usize = 20;

    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    unsafe fn units(b: *const u8, mut f: impl FnMut(usize, [__m256; 4])) {
        // SAFETY: bytes 0–19 of the block.
        let (d, m, (lo, hi)) = unsafe { (f16_splat(b), f16_splat(b.add(2)), nibbles16(b.add(4))) };
        f(0, mul_add(widen(lo, hi), d, m));
    }
}

/// The 5-bit legacy quants of the 16 nibble bytes at `qs` and the 32 fifth bits `qh`,
/// less `bias`, as 32 signed bytes in weight order. Caller: avx2, 16 bytes readable.
#[inline]
#[target_feature(enable = "avx2,f16c")]
unsafe fn q5_bytes(qs: *const u8, qh: u32, bias: i8) -> __m256i {
    // SAFETY: the caller guarantees the 16 bytes at `qs`.
    let (lo, hi) = unsafe { nibbles16(qs) };
    let nib = _mm256_set_m128i(hi, lo);
    let fifth = _mm256_and_si256(bits_to_bytes(qh), _mm256_set1_epi8(0x10));
    _mm256_sub_epi8(_mm256_or_si256(nib, fifth), _mm256_set1_epi8(bias))
}

// SAFETY: d at 0, qh at 2, 16 quant bytes at 6; 22 bytes.
unsafe impl Unit for Q5_0 {
    const BS: usize = 32;
    const TS: usize = 22;

    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    unsafe fn units(b: *const u8, mut f: impl FnMut(usize, [__m256; 4])) {
        // SAFETY: bytes 0–1 (d), 2–5 (qh) and 6–21 (qs) of the block.
        let (d, q) = unsafe {
            let qh = b.add(2).cast::<u32>().read_unaligned();
            (f16_splat(b), q5_bytes(b.add(6), qh, 16))
        };
        f(0, mul(widen32(q), d));
    }
}

// SAFETY: d at 0, m at 2, qh at 4, 16 quant bytes at 8; 24 bytes.
unsafe impl Unit for Q5_1 {
    const BS: usize = 32;
    const TS: usize = 24;

    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    unsafe fn units(b: *const u8, mut f: impl FnMut(usize, [__m256; 4])) {
        // SAFETY: bytes 0–3 (d, m), 4–7 (qh) and 8–23 (qs) of the block.
        let (d, m, q) = unsafe {
            let qh = b.add(4).cast::<u32>().read_unaligned();
            (f16_splat(b), f16_splat(b.add(2)), q5_bytes(b.add(8), qh, 0))
        };
        f(0, mul_add(widen32(q), d, m));
    }
}

// SAFETY: d at 0, 32 signed quant bytes at 2; 34 bytes.
unsafe impl Unit for Q8_0 {
    const BS: usize = 32;
    const TS: usize = 34;

    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    unsafe fn units(b: *const u8, mut f: impl FnMut(usize, [__m256; 4])) {
        // SAFETY: bytes 0–1 and 2 + 8k .. 10 + 8k (k < 4) of the block.
        let (d, q) = unsafe {
            let g = |k: usize| {
                let v = _mm_loadl_epi64(b.add(2 + 8 * k).cast());
                _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v))
            };
            (f16_splat(b), [g(0), g(1), g(2), g(3)])
        };
        f(0, mul(q, d));
    }
}

// SAFETY: d at 0, s at 2 (unused), 32 signed quant bytes at 4; 36 bytes.
unsafe impl Unit for Q8_1 {
    const BS: usize = 32;
    const TS: usize = 36;

    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    unsafe fn units(b: *const u8, mut f: impl FnMut(usize, [__m256; 4])) {
        // SAFETY: bytes 0–1 and 4 + 8k .. 12 + 8k (k < 4) of the block.
        let (d, q) = unsafe {
            let g = |k: usize| {
                let v = _mm_loadl_epi64(b.add(4 + 8 * k).cast());
                _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v))
            };
            (f16_splat(b), [g(0), g(1), g(2), g(3)])
        };
        f(0, mul(q, d));
    }
}

// SAFETY: qs at 0–63, d at 64; 66 bytes.
unsafe impl Unit for TQ2_0 {
    const BS: usize = 256;
    const TS: usize = 66;

    /// Unit 4g + s is bits 2s–2s+1 of `qs[32g..][..32]`, less one: a trit.
    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    unsafe fn units(b: *const u8, mut f: impl FnMut(usize, [__m256; 4])) {
        // SAFETY: bytes 64–65 of the block.
        let d = unsafe { f16_splat(b.add(64)) };
        let one = _mm256_set1_epi8(1);
        for g in 0..2 {
            // SAFETY: bytes 32g .. 32g + 32 ≤ 64 of the block.
            let q = unsafe { _mm256_loadu_si256(b.add(32 * g).cast()) };
            for (s, q) in crumbs(q).iter().enumerate() {
                f(4 * g + s, mul(widen32(_mm256_sub_epi8(*q, one)), d));
            }
        }
    }
}

// SAFETY: Q4_0's layout (d at 0, 16 nibble bytes at 2); nibbles index `KVALUES_IQ4NL`.
unsafe impl Unit for IQ4NL {
    const BS: usize = 32;
    const TS: usize = 18;

    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    unsafe fn units(b: *const u8, mut f: impl FnMut(usize, [__m256; 4])) {
        // SAFETY: bytes 0–17 of the block; the table is 16 bytes.
        let (d, (lo, hi), table) = unsafe {
            let table = _mm_loadu_si128(KVALUES_IQ4NL.as_ptr().cast());
            (f16_splat(b), nibbles16(b.add(2)), table)
        };
        let q = widen(_mm_shuffle_epi8(table, lo), _mm_shuffle_epi8(table, hi));
        f(0, mul(q, d));
    }
}

// SAFETY: d at 0; scales_h at 2–3; scales_l at 4–7; qs at 8–135; 136 bytes.
unsafe impl Unit for IQ4XS {
    const BS: usize = 256;
    const TS: usize = 136;

    /// Unit i is `qs[16i..][..16]` in IQ4_NL's nibble order, with the factor `d·ls`.
    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    unsafe fn units(b: *const u8, mut f: impl FnMut(usize, [__m256; 4])) {
        // SAFETY: bytes 0–7 of the block; the table is 16 bytes.
        let (ds, table) = unsafe {
            (
                iq4xs_factors(b, f16_splat(b)),
                _mm_loadu_si128(KVALUES_IQ4NL.as_ptr().cast()),
            )
        };
        for (i, dl) in ds.iter().enumerate() {
            // SAFETY: bytes 8 + 16i .. 24 + 16i ≤ 136 of the block.
            let (lo, hi) = unsafe { nibbles16(b.add(8 + 16 * i)) };
            let q = widen(_mm_shuffle_epi8(table, lo), _mm_shuffle_epi8(table, hi));
            f(i, mul(q, _mm256_set1_ps(*dl)));
        }
    }
}

/// The eight `d·sc` and `dmin·m` factors of a Q4_K/Q5_K block, from its 12 scale bytes
/// at `sc` (6 bits each; ggml `get_scale_min_k4`, unpacked for all eight sub-blocks at
/// once with ggml's `kmask` word trick). Caller: avx2, 12 bytes readable.
#[inline]
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn k4_factors(sc: *const u8, d: __m256, dmin: __m256) -> ([f32; 8], [f32; 8]) {
    // SAFETY: the caller guarantees the 12 bytes; unaligned reads.
    let (a, b, c) = unsafe {
        let p = sc.cast::<u32>();
        (
            p.read_unaligned(),
            p.add(1).read_unaligned(),
            p.add(2).read_unaligned(),
        )
    };
    const LOW6: u32 = 0x3F3F_3F3F;
    const LOW4: u32 = 0x0F0F_0F0F;
    const LOW2: u32 = 0x0303_0303;
    // Sub-blocks 0–3 keep 6 bits in bytes 0–3 (scales) and 4–7 (mins); 4–7 take 4 low
    // bits from bytes 8–11 and 2 high bits from the tops of bytes 0–7.
    let scales = u64::from(a & LOW6) | u64::from((c & LOW4) | (((a >> 6) & LOW2) << 4)) << 32;
    let mins = u64::from(b & LOW6) | u64::from(((c >> 4) & LOW4) | (((b >> 6) & LOW2) << 4)) << 32;
    let (mut ds, mut dm) = ([0.0; 8], [0.0; 8]);
    scale8(d, scales, false, &mut ds);
    scale8(dmin, mins, false, &mut dm);
    (ds, dm)
}

// SAFETY: scales at 0–15; qs at 16–79; d, dmin at 80, 82; 84 bytes.
unsafe impl Unit for Q2K {
    const BS: usize = 256;
    const TS: usize = 84;

    /// Unit 4n + j is bits 2j–2j+1 of `qs[32n..][..32]`; its first 16 weights take
    /// scale byte 2(4n + j), its last 16 the next.
    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    unsafe fn units(b: *const u8, mut f: impl FnMut(usize, [__m256; 4])) {
        // SAFETY: bytes 0–15 and 80–83 of the block.
        let (ds, dm) = unsafe { q2_factors(b, f16_splat(b.add(80)), f16_splat(b.add(82))) };
        for n in 0..2 {
            // SAFETY: bytes 16 + 32n .. 48 + 32n ≤ 80 of the block.
            let q = unsafe { _mm256_loadu_si256(b.add(16 + 32 * n).cast()) };
            for (j, q) in crumbs(q).iter().enumerate() {
                let u = 4 * n + j;
                let q = widen32(*q);
                let s = |k: usize| (_mm256_set1_ps(ds[k]), _mm256_set1_ps(dm[k]));
                let ((d0, m0), (d1, m1)) = (s(2 * u), s(2 * u + 1));
                // dl·q − ml: a rounded product, then a rounded difference.
                let w = |q, d, m| _mm256_sub_ps(_mm256_mul_ps(d, q), m);
                f(
                    u,
                    [
                        w(q[0], d0, m0),
                        w(q[1], d0, m0),
                        w(q[2], d1, m1),
                        w(q[3], d1, m1),
                    ],
                );
            }
        }
    }
}

// SAFETY: hmask at 0–31; qs at 32–95; scales at 96–107; d at 108; 110 bytes.
unsafe impl Unit for Q3K {
    const BS: usize = 256;
    const TS: usize = 110;

    /// Unit 4n + j is pass j of `q3_bytes` over `qs[32n..][..32]` and the hmask (read
    /// once for all eight units); its first 16 weights take scale 2(4n + j), its last
    /// 16 the next.
    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    unsafe fn units(b: *const u8, mut f: impl FnMut(usize, [__m256; 4])) {
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
                let q = widen32(*q);
                let (d0, d1) = (_mm256_set1_ps(ds[2 * u]), _mm256_set1_ps(ds[2 * u + 1]));
                let w = [
                    _mm256_mul_ps(d0, q[0]),
                    _mm256_mul_ps(d0, q[1]),
                    _mm256_mul_ps(d1, q[2]),
                    _mm256_mul_ps(d1, q[3]),
                ];
                f(u, w);
            }
        }
    }
}

// SAFETY: d, dmin at 0, 2; scales at 4–15; qs at 16–143; 144 bytes.
unsafe impl Unit for Q4K {
    const BS: usize = 256;
    const TS: usize = 144;

    /// Sub-blocks 2p and 2p + 1 are the low and high nibbles of `qs[32p..][..32]`.
    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    unsafe fn units(b: *const u8, mut f: impl FnMut(usize, [__m256; 4])) {
        // SAFETY: bytes 0–15 of the block.
        let (ds, dm) = unsafe { k4_factors(b.add(4), f16_splat(b), f16_splat(b.add(2))) };
        for p in 0..4 {
            // SAFETY: bytes 16 + 32p .. 48 + 32p ≤ 144 of the block.
            let (lo, hi) = unsafe { nibbles32(b.add(16 + 32 * p)) };
            let s = |u: usize| (_mm256_set1_ps(ds[u]), _mm256_set1_ps(dm[u]));
            let (d1, m1) = s(2 * p);
            f(2 * p, mul_sub(widen32(lo), d1, m1));
            let (d2, m2) = s(2 * p + 1);
            f(2 * p + 1, mul_sub(widen32(hi), d2, m2));
        }
    }
}

// SAFETY: d, dmin at 0, 2; scales at 4–15; qh at 16–47; qs at 48–175; 176 bytes.
unsafe impl Unit for Q5K {
    const BS: usize = 256;
    const TS: usize = 176;

    /// As Q4_K, plus bit u of `qh[l]` as the fifth bit of weight l of sub-block u.
    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    unsafe fn units(b: *const u8, mut f: impl FnMut(usize, [__m256; 4])) {
        // SAFETY: bytes 0–47 of the block.
        let ((ds, dm), mut qh) = unsafe {
            let factors = k4_factors(b.add(4), f16_splat(b), f16_splat(b.add(2)));
            (factors, _mm256_loadu_si256(b.add(16).cast()))
        };
        let (one, two) = (_mm256_set1_epi8(1), _mm256_set1_epi8(2));
        for p in 0..4 {
            // SAFETY: bytes 48 + 32p .. 80 + 32p ≤ 176 of the block.
            let (lo, hi) = unsafe { nibbles32(b.add(48 + 32 * p)) };
            // qh now holds bits 2p and 2p + 1 in bits 0 and 1 of each byte; moving them
            // to bit 4 inside 16-bit lanes cannot carry across bytes.
            let h1 = _mm256_slli_epi16::<4>(_mm256_and_si256(qh, one));
            let h2 = _mm256_slli_epi16::<3>(_mm256_and_si256(qh, two));
            qh = _mm256_srli_epi16::<2>(qh);
            let s = |u: usize| (_mm256_set1_ps(ds[u]), _mm256_set1_ps(dm[u]));
            let (d1, m1) = s(2 * p);
            f(2 * p, mul_sub(widen32(_mm256_or_si256(lo, h1)), d1, m1));
            let (d2, m2) = s(2 * p + 1);
            f(2 * p + 1, mul_sub(widen32(_mm256_or_si256(hi, h2)), d2, m2));
        }
    }
}

/// The four 32-weight passes of one Q6_K half, as signed bytes `q − 32`: pass j takes
/// the low (j < 2) or high nibbles of `ql0` (even j) or `ql1` (odd j) and bits 2j–2j+1
/// of `qh` as bits 4–5.
#[inline]
#[target_feature(enable = "avx2")]
pub(crate) fn q6_bytes(ql0: __m256i, ql1: __m256i, qh: __m256i) -> [__m256i; 4] {
    let m4 = _mm256_set1_epi8(0x0F);
    let m2 = _mm256_set1_epi8(0x30);
    // ((qh >> 2j) & 3) << 4, shifted inside 16-bit lanes: the 0x30 mask drops whatever
    // crosses from the neighbouring byte.
    let high = [
        _mm256_and_si256(_mm256_slli_epi16::<4>(qh), m2),
        _mm256_and_si256(_mm256_slli_epi16::<2>(qh), m2),
        _mm256_and_si256(qh, m2),
        _mm256_and_si256(_mm256_srli_epi16::<2>(qh), m2),
    ];
    let low = [
        _mm256_and_si256(ql0, m4),
        _mm256_and_si256(ql1, m4),
        _mm256_and_si256(_mm256_srli_epi16::<4>(ql0), m4),
        _mm256_and_si256(_mm256_srli_epi16::<4>(ql1), m4),
    ];
    let bias = _mm256_set1_epi8(32);
    let f = |j: usize| _mm256_sub_epi8(_mm256_or_si256(low[j], high[j]), bias);
    [f(0), f(1), f(2), f(3)]
}

// SAFETY: ql at 0–127, qh at 128–191, scales at 192–207, d at 208; 210 bytes.
unsafe impl Unit for Q6K {
    const BS: usize = 256;
    const TS: usize = 210;

    /// In half h, pass j takes the low (j < 2) or high nibbles of
    /// `ql[64h + 32·(j mod 2)..][..32]`, bits 2j–2j+1 of `qh[32h..][..32]` as bits 4–5,
    /// and scales `sc[8h + 2j]` (first 16 weights) and `sc[8h + 2j + 1]` (last 16).
    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    unsafe fn units(b: *const u8, mut f: impl FnMut(usize, [__m256; 4])) {
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
            let (ql0, ql1, qh) = unsafe {
                (
                    _mm256_loadu_si256(b.add(64 * h).cast()),
                    _mm256_loadu_si256(b.add(64 * h + 32).cast()),
                    _mm256_loadu_si256(b.add(128 + 32 * h).cast()),
                )
            };
            let q = q6_bytes(ql0, ql1, qh);
            for j in 0..4 {
                let q = widen32(q[j]);
                let (s0, s1) = (_mm256_set1_ps(ds[2 * j]), _mm256_set1_ps(ds[2 * j + 1]));
                let w = [
                    _mm256_mul_ps(s0, q[0]),
                    _mm256_mul_ps(s0, q[1]),
                    _mm256_mul_ps(s1, q[2]),
                    _mm256_mul_ps(s1, q[3]),
                ];
                f(4 * h + j, w);
            }
        }
    }
}
