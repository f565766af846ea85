//! AVX2 row kernels: blocks decoded straight into registers, several rows or columns
//! at a time, in exactly the order of the portable kernel (see the `dot` module).
//!
//! A block is walked in *units* of 32 weights; a unit arrives as four `__m256` of 8
//! consecutive weights, so group `k` of a unit holds weights ≡ 8·(k mod 2) … (mod 16)
//! and is added into accumulator register `k mod 2` of its (row, column) pair: lanes
//! 0–7 of the portable kernel in register 0, lanes 8–15 in register 1. Each weight is
//! produced by the integer and f32 steps of its scalar decoder (exact integer work,
//! then the same rounded products and sums), each weight meets its activation in one
//! fused multiply-add into the accumulator, as the portable path's `f32::mul_add`, and
//! the final tree is the portable one, so every result is bit-identical to the
//! portable path.
//!
//! Only called where `avx2`, `f16c` and `fma` were detected at run time ([`dots_fn`]).

use std::arch::x86_64::*;

use lamina_gguf::GgmlType;

use super::SimdDots;

pub(super) mod units;

use units::{
    Unit, BF16, F16, IQ4NL, IQ4XS, Q2K, Q3K, Q4K, Q4_0, Q4_1, Q5K, Q5_0, Q5_1, Q6K, Q8_0, Q8_1,
    TQ2_0,
};

/// Rows decoded together in a mat-vec: 4 × 2 accumulator registers, enough
/// independent add chains to hide the add latency.
const MATVEC_ROWS: usize = 4;
/// Columns sharing one decoded unit in a mat-mul (4 × 2 accumulator registers).
const MATMUL_COLS: usize = 4;

/// The AVX2 kernel of `ty`, when this CPU has AVX2 and F16C and the type has one.
pub(super) fn dots_fn(ty: GgmlType) -> Option<SimdDots> {
    if !(is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("f16c")
        && is_x86_feature_detected!("fma"))
    {
        return None;
    }
    let f: SimdDots = match ty {
        GgmlType::F16 => dots::<F16>,
        GgmlType::BF16 => dots::<BF16>,
        GgmlType::Q4_0 => dots::<Q4_0>,
        GgmlType::Q4_1 => dots::<Q4_1>,
        GgmlType::Q5_0 => dots::<Q5_0>,
        GgmlType::Q5_1 => dots::<Q5_1>,
        GgmlType::Q8_0 => dots::<Q8_0>,
        GgmlType::Q8_1 => dots::<Q8_1>,
        GgmlType::TQ2_0 => dots::<TQ2_0>,
        GgmlType::Q2K => dots::<Q2K>,
        GgmlType::Q3K => dots::<Q3K>,
        GgmlType::Q4K => dots::<Q4K>,
        GgmlType::Q5K => dots::<Q5K>,
        GgmlType::Q6K => dots::<Q6K>,
        GgmlType::IQ4NL => dots::<IQ4NL>,
        GgmlType::IQ4XS => dots::<IQ4XS>,
        _ => return None,
    };
    Some(f)
}

/// `out[r·n + c] = row r of w · column c of x`, for whole rows of `row_bytes` and n
/// columns of `cols = row_bytes / TS · BS` floats. Returns false (and writes nothing)
/// when the buffers do not have those shapes; the caller has checked them already.
fn dots<K: Unit>(w: &[u8], row_bytes: usize, x: &[f32], n: usize, out: &mut [f32]) -> bool {
    if row_bytes == 0 || row_bytes % K::TS != 0 || w.len() % row_bytes != 0 {
        return false;
    }
    let rows = w.len() / row_bytes;
    let cols = row_bytes / K::TS * K::BS;
    if cols.checked_mul(n) != Some(x.len()) || rows.checked_mul(n) != Some(out.len()) {
        return false;
    }
    // SAFETY: `dots_fn` hands this function out only after detecting avx2 and f16c, and
    // the shapes `dots_avx2` relies on were checked just above.
    unsafe { dots_avx2::<K>(w, row_bytes, x, cols, n, out) };
    true
}

/// [`dots`] after its checks. Caller: avx2 and f16c are available; `w` is whole rows of
/// `row_bytes` (a non-zero multiple of `K::TS`), `x` is n columns of `cols` weights,
/// `out` holds rows · n values.
#[target_feature(enable = "avx2,f16c,fma")]
unsafe fn dots_avx2<K: Unit>(
    w: &[u8],
    row_bytes: usize,
    x: &[f32],
    cols: usize,
    n: usize,
    out: &mut [f32],
) {
    let rows = w.len() / row_bytes;
    let wp = w.as_ptr();
    let xp = x.as_ptr();
    let op = out.as_mut_ptr();
    // SAFETY (for every `tile` call below): row r < rows starts at wp + r·row_bytes and
    // holds row_bytes bytes; column c < n starts at xp + c·cols; out[r·n + c] is in
    // bounds for r < rows, c < n. Each call covers rows r .. r + R ≤ rows and columns
    // c .. c + T ≤ n.
    unsafe {
        if n == 1 {
            let mut r = 0;
            while r + MATVEC_ROWS <= rows {
                tile::<K, MATVEC_ROWS, 1>(wp.add(r * row_bytes), row_bytes, xp, cols, op.add(r), 1);
                r += MATVEC_ROWS;
            }
            while r < rows {
                tile::<K, 1, 1>(wp.add(r * row_bytes), row_bytes, xp, cols, op.add(r), 1);
                r += 1;
            }
            return;
        }
        for r in 0..rows {
            let row = wp.add(r * row_bytes);
            let o = op.add(r * n);
            let mut c = 0;
            while c + MATMUL_COLS <= n {
                tile::<K, 1, MATMUL_COLS>(row, row_bytes, xp.add(c * cols), cols, o.add(c), n);
                c += MATMUL_COLS;
            }
            match n - c {
                1 => tile::<K, 1, 1>(row, row_bytes, xp.add(c * cols), cols, o.add(c), n),
                2 => tile::<K, 1, 2>(row, row_bytes, xp.add(c * cols), cols, o.add(c), n),
                3 => tile::<K, 1, 3>(row, row_bytes, xp.add(c * cols), cols, o.add(c), n),
                _ => {}
            }
        }
    }
}

/// Dot products of R rows with T columns: `out[r·stride + c] = row r · column c`.
///
/// Caller: avx2 and f16c are available; row r (< R) is `row_bytes` bytes at
/// `w + r·row_bytes`, a whole number of blocks; column c (< T) is `cols` floats at
/// `x + c·cols`, `cols` being the weights in a row; `out + r·stride + c` is writable.
#[inline]
#[target_feature(enable = "avx2,f16c,fma")]
unsafe fn tile<K: Unit, const R: usize, const T: usize>(
    w: *const u8,
    row_bytes: usize,
    x: *const f32,
    cols: usize,
    out: *mut f32,
    stride: usize,
) {
    let mut acc = [[[_mm256_setzero_ps(); 2]; T]; R];
    let blocks = row_bytes / K::TS;
    for b in 0..blocks {
        // SAFETY: block b < blocks of row r < R lies inside that row (caller's contract),
        // and its weights are x[b·BS .. (b+1)·BS] of every column.
        unsafe {
            for (r, row_acc) in acc.iter_mut().enumerate() {
                let bp = w.add(r * row_bytes + b * K::TS);
                prefetch::<K>(bp);
                // A copy per block: when this loop over rows is not unrolled (k-quants),
                // indexing `acc` inside the unit loop would keep it in memory.
                let mut local = *row_acc;
                K::units(bp, |u, q| {
                    for (c, a) in local.iter_mut().enumerate() {
                        let xs = x.add(c * cols + b * K::BS + 32 * u);
                        for (k, wk) in q.iter().enumerate() {
                            let xv = _mm256_loadu_ps(xs.add(8 * k));
                            a[k & 1] = _mm256_fmadd_ps(*wk, xv, a[k & 1]);
                        }
                    }
                });
                *row_acc = local;
            }
        }
    }
    for (r, row) in acc.iter().enumerate() {
        for (c, a) in row.iter().enumerate() {
            // SAFETY: r < R and c < T, inside `out` by the caller's contract.
            unsafe { *out.add(r * stride + c) = reduce(a[0], a[1]) };
        }
    }
}

/// Bytes ahead of the block being decoded that are requested into L1. Every row of a
/// tile prefetches at the same distance, so together they cover the `R · row_bytes`
/// bytes that far ahead in address order. Needed for short rows: a head of 576-weight
/// Q8_0 rows is four interleaved 612-byte streams per tile, which the hardware
/// prefetcher picks up too late. 16 KiB (a third of a 48 KiB L1) keeps memory-bound
/// types at the read bandwidth, where 4 KiB fell well short (docs/perf/cpu.md,
/// 2026-12-02, "software prefetch").
const PREFETCH_AHEAD: usize = 16384;

/// Prefetches the cache lines [`PREFETCH_AHEAD`] bytes past the block at `bp`.
#[inline]
#[target_feature(enable = "avx2")]
fn prefetch<K: Unit>(bp: *const u8) {
    // `wrapping_add` keeps the arithmetic defined past the end of the buffer, and a
    // prefetch never faults, whatever the address.
    let p = bp.wrapping_add(PREFETCH_AHEAD);
    let mut off = 0;
    while off < K::TS {
        _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(off).cast());
        off += 64;
    }
}

/// The portable tree over 16 lanes (lanes 0–7 in `lo`, 8–15 in `hi`): 8 + 8, then
/// 4 + 4, 2 + 2, 1 + 1, each sum keeping the lower lane as its first operand.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn reduce(lo: __m256, hi: __m256) -> f32 {
    let s8 = _mm256_add_ps(lo, hi);
    let s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps::<1>(s8));
    let s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    let s1 = _mm_add_ss(s2, _mm_shuffle_ps::<1>(s2, s2));
    _mm_cvtss_f32(s1)
}
