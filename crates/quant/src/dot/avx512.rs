//! AVX-512 row kernels: the AVX2 kernels' structure with the 16 lanes of a (row,
//! column) pair in one `__m512`, and 4- and 5-bit weights looked up in per-block tables
//! (see `units`). Same order as the portable kernel, so bit-identical to it.
//!
//! A unit of 32 weights arrives as two registers, weights 0–15 and 16–31, each
//! multiplied into the pair's accumulator by one FMA: lane l takes weight 32u + l,
//! then 32u + 16 + l, in increasing order as the portable lanes do.
//!
//! Built only with Rust ≥ 1.89 (`lamina_avx512`, set by the build script) and used
//! only where `avx512f`, `avx512bw` and `avx512vl` are detected at run time.

use std::arch::x86_64::*;

use lamina_gguf::GgmlType;

use super::avx2::reduce;
use super::avx2::units::{
    BF16, F16, IQ4NL, IQ4XS, Q2K, Q3K, Q4K, Q4_0, Q4_1, Q5K, Q5_0, Q5_1, Q6K, Q8_0, Q8_1, TQ2_0,
};
use super::SimdDots;

mod units;

use units::Unit512;

/// Rows decoded together in a mat-vec (one accumulator register each).
const MATVEC_ROWS: usize = 4;
/// As in the AVX2 kernels: bytes ahead of the current block requested into L1.
const PREFETCH_AHEAD: usize = 16384;
/// From this many columns a mat-mul decodes each row once into a buffer and runs
/// every column over it ([`matmul_decoded`]); below, the tiles decode a row once per
/// tile of 4 or 8 columns, which is already once for the whole call.
const DECODE_ONCE_MIN: usize = 9;
/// Rows decoded together by [`matmul_decoded`]: each column load feeds this many.
const DECODED_ROWS: usize = 4;
/// Columns of [`decoded_tile`]: each weight load feeds this many (4 × 4
/// accumulators, 4 weights and a column in 21 of the 32 registers).
const DECODED_COLS: usize = 4;

/// The AVX-512 kernel of `ty`, when this CPU has the features and the type has one.
pub(super) fn dots_fn(ty: GgmlType) -> Option<SimdDots> {
    let features = is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vl")
        && is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("f16c")
        && is_x86_feature_detected!("fma");
    if !features {
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

/// `out[r·n + c] = row r of w · column c of x`; false (nothing written) when the
/// buffers do not have those shapes. See the AVX2 `dots`.
fn dots<K: Unit512>(w: &[u8], row_bytes: usize, x: &[f32], n: usize, out: &mut [f32]) -> bool {
    if row_bytes == 0 || !row_bytes.is_multiple_of(K::TS) || !w.len().is_multiple_of(row_bytes) {
        return false;
    }
    let rows = w.len() / row_bytes;
    let cols = row_bytes / K::TS * K::BS;
    if cols.checked_mul(n) != Some(x.len()) || rows.checked_mul(n) != Some(out.len()) {
        return false;
    }
    // SAFETY: `dots_fn` hands this function out only after detecting the features, and
    // the shapes `dots_avx512` relies on were checked just above.
    unsafe { dots_avx512::<K>(w, row_bytes, x, cols, n, out) };
    true
}

/// [`dots`] after its checks. Caller: the features of [`dots_fn`] are available; `w` is
/// whole rows of `row_bytes` (a non-zero multiple of `K::TS`), `x` is n columns of
/// `cols` weights, `out` holds rows · n values.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,f16c,fma")]
unsafe fn dots_avx512<K: Unit512>(
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
        if n >= DECODE_ONCE_MIN {
            let bulk = rows - rows % DECODED_ROWS;
            matmul_decoded::<K, DECODED_ROWS>(wp, bulk, row_bytes, xp, cols, n, op);
            let rest = rows - bulk;
            matmul_decoded::<K, 1>(
                wp.add(bulk * row_bytes),
                rest,
                row_bytes,
                xp,
                cols,
                n,
                op.add(bulk * n),
            );
            return;
        }
        // Blocks of one unit (the legacy types, F16, BF16) share each column load
        // between two rows; with 8 units a block, the loads of a whole block would be
        // hoisted out of the row loop and spilled, so those take one row and more
        // columns.
        if K::BS == 32 {
            matmul_tiles::<K, 2, 4>(wp, rows, row_bytes, xp, cols, n, op);
        } else {
            matmul_tiles::<K, 1, 8>(wp, rows, row_bytes, xp, cols, n, op);
        }
    }
}

/// The mat-mul for many columns: R rows at a time are decoded once into a buffer (R ×
/// `cols` floats, in L1 or L2), then every column runs over them, each column load
/// feeding R rows. The tiles instead decode a row once per tile of columns: for a
/// 128-token prompt that is 16 to 32 decodes of every weight where this makes one.
/// Each output sees the operations of [`tile`] in the same order (unit by unit, its
/// weights 0–15 then 16–31, a fused multiply-add each), so the bits are the same.
///
/// Caller: as for [`matmul_tiles`], with `rows` a multiple of R.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,f16c,fma")]
unsafe fn matmul_decoded<K: Unit512, const R: usize>(
    w: *const u8,
    rows: usize,
    row_bytes: usize,
    x: *const f32,
    cols: usize,
    n: usize,
    out: *mut f32,
) {
    if rows == 0 {
        return;
    }
    let units = cols / 32;
    let blocks = row_bytes / K::TS;
    // Row i's unit u is buf[(i·units + u)·2 ..][..2].
    let mut buf = vec![_mm512_setzero_ps(); R * units * 2];
    let bp = buf.as_mut_ptr();
    let mut r = 0;
    while r < rows {
        // SAFETY: rows r .. r + R ≤ rows lie in `w`, block b < blocks of each inside
        // its row; unit slots (i·units + b·BS/32 + u)·2 + 1 < R·units·2 for i < R,
        // b < blocks, u < BS/32 (cols = blocks·BS); columns c < n hold `cols` floats
        // at x + c·cols; out[(r + i)·n + c] is in bounds.
        unsafe {
            for i in 0..R {
                let row = w.add((r + i) * row_bytes);
                for b in 0..blocks {
                    let base = (i * units + b * (K::BS / 32)) * 2;
                    K::units(row.add(b * K::TS), |u, q| {
                        *bp.add(base + 2 * u) = q[0];
                        *bp.add(base + 2 * u + 1) = q[1];
                    });
                }
            }
            let mut c = 0;
            while c + DECODED_COLS <= n {
                decoded_tile::<R, DECODED_COLS>(
                    bp,
                    units,
                    x.add(c * cols),
                    cols,
                    out.add(r * n + c),
                    n,
                );
                c += DECODED_COLS;
            }
            while c < n {
                decoded_tile::<R, 1>(bp, units, x.add(c * cols), cols, out.add(r * n + c), n);
                c += 1;
            }
        }
        r += R;
    }
}

/// R decoded rows (`buf`, `units` units each, as [`matmul_decoded`] lays them out)
/// times T columns at `x` (`cols` floats apart): the R·T accumulators stay in
/// registers while the units stream past, each weight load feeding T columns and
/// each column load R rows. `out[i·stride + c]` receives row i · column c.
///
/// Caller: avx512f is available; `buf` holds R·units·2 registers; columns c < T hold
/// `units`·32 floats; the outputs are writable.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,f16c,fma")]
// Indexed loops: the tile is written as the register block it becomes, each
// accumulator named by its (row, column).
#[allow(clippy::needless_range_loop)]
unsafe fn decoded_tile<const R: usize, const T: usize>(
    buf: *const __m512,
    units: usize,
    x: *const f32,
    cols: usize,
    out: *mut f32,
    stride: usize,
) {
    let mut acc = [[_mm512_setzero_ps(); T]; R];
    // SAFETY: unit u < units of row i < R is buf[(i·units + u)·2 ..][..2]; column c < T
    // holds floats 32u .. 32u + 32 at x + c·cols.
    unsafe {
        for u in 0..units {
            for h in 0..2 {
                let mut wv = [_mm512_setzero_ps(); R];
                for (i, w) in wv.iter_mut().enumerate() {
                    *w = *buf.add((i * units + u) * 2 + h);
                }
                for c in 0..T {
                    let xv = _mm512_loadu_ps(x.add(c * cols + 32 * u + 16 * h));
                    for i in 0..R {
                        acc[i][c] = _mm512_fmadd_ps(wv[i], xv, acc[i][c]);
                    }
                }
            }
        }
        for (i, row) in acc.iter().enumerate() {
            for (c, a) in row.iter().enumerate() {
                *out.add(i * stride + c) = reduce512(*a);
            }
        }
    }
}

/// The mat-mul in tiles of R rows × T columns, then the leftover rows one at a time
/// and the leftover columns in tiles of 4, 2 and 1.
///
/// Caller: as for [`dots_avx512`], with `w`, `x` and `out` its buffers' pointers.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,f16c,fma")]
unsafe fn matmul_tiles<K: Unit512, const R: usize, const T: usize>(
    w: *const u8,
    rows: usize,
    row_bytes: usize,
    x: *const f32,
    cols: usize,
    n: usize,
    out: *mut f32,
) {
    // SAFETY: each call covers rows r .. r + R' ≤ rows and columns c .. c + T' ≤ n.
    unsafe {
        let mut r = 0;
        while r < rows {
            let (w, out) = (w.add(r * row_bytes), out.add(r * n));
            if r + R <= rows {
                row_group::<K, R, T>(w, row_bytes, x, cols, n, out);
                r += R;
            } else {
                row_group::<K, 1, T>(w, row_bytes, x, cols, n, out);
                r += 1;
            }
        }
    }
}

/// All n columns for R rows: tiles of T columns, then the rest in tiles of 4, 2, 1.
///
/// Caller: as for [`tile`] with R rows at `w`, n columns at `x`, and `out` the R·n
/// row-major results of these rows.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,f16c,fma")]
unsafe fn row_group<K: Unit512, const R: usize, const T: usize>(
    w: *const u8,
    row_bytes: usize,
    x: *const f32,
    cols: usize,
    n: usize,
    out: *mut f32,
) {
    // SAFETY: each call covers columns c .. c + T' ≤ n of the caller's R rows.
    unsafe {
        let mut c = 0;
        while c + T <= n {
            tile::<K, R, T>(w, row_bytes, x.add(c * cols), cols, out.add(c), n);
            c += T;
        }
        if T > 4 && c + 4 <= n {
            tile::<K, R, 4>(w, row_bytes, x.add(c * cols), cols, out.add(c), n);
            c += 4;
        }
        while c + 2 <= n {
            tile::<K, R, 2>(w, row_bytes, x.add(c * cols), cols, out.add(c), n);
            c += 2;
        }
        if c < n {
            tile::<K, R, 1>(w, row_bytes, x.add(c * cols), cols, out.add(c), n);
        }
    }
}

/// Dot products of R rows with T columns: `out[r·stride + c] = row r · column c`.
///
/// Caller: the features of [`dots_fn`] are available; row r (< R) is `row_bytes` bytes
/// at `w + r·row_bytes`, a whole number of blocks; column c (< T) is `cols` floats at
/// `x + c·cols`, `cols` being the weights in a row; `out + r·stride + c` is writable.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,f16c,fma")]
unsafe fn tile<K: Unit512, const R: usize, const T: usize>(
    w: *const u8,
    row_bytes: usize,
    x: *const f32,
    cols: usize,
    out: *mut f32,
    stride: usize,
) {
    let mut acc = [[_mm512_setzero_ps(); T]; R];
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
                        *a = _mm512_fmadd_ps(q[0], _mm512_loadu_ps(xs), *a);
                        *a = _mm512_fmadd_ps(q[1], _mm512_loadu_ps(xs.add(16)), *a);
                    }
                });
                *row_acc = local;
            }
        }
    }
    for (r, row) in acc.iter().enumerate() {
        for (c, a) in row.iter().enumerate() {
            // SAFETY: r < R and c < T, inside `out` by the caller's contract.
            unsafe { *out.add(r * stride + c) = reduce512(*a) };
        }
    }
}

/// The 16 lanes of a (row, column) pair summed by the portable tree (its halves
/// as the AVX2 kernels' two registers).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,f16c,fma")]
fn reduce512(a: __m512) -> f32 {
    let lo = _mm512_castps512_ps256(a);
    let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(a)));
    reduce(lo, hi)
}

/// Prefetches the cache lines [`PREFETCH_AHEAD`] bytes past the block at `bp`.
#[inline]
#[target_feature(enable = "avx512f")]
fn prefetch<K: Unit512>(bp: *const u8) {
    // `wrapping_add` keeps the arithmetic defined past the end of the buffer, and a
    // prefetch never faults, whatever the address.
    let p = bp.wrapping_add(PREFETCH_AHEAD);
    let mut off = 0;
    while off < K::TS {
        _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(off).cast());
        off += 64;
    }
}
