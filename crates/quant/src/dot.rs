//! Dot products over quantized rows: the CPU mat-vec (decode) and mat-mul (prompt)
//! kernels, multithreaded over rows with rayon.
//!
//! # The reduction order
//!
//! Every (row, column) value is computed the same way, whatever the path:
//! [`LANES`] = 16 f32 accumulators, lane `l` summing `w[i]·x[i]` for `i ≡ l (mod 16)`
//! in increasing `i`, each product fused into its lane (`fma(w, x, acc)`, one
//! rounding: the SIMD paths' FMA instructions, the portable path's `f32::mul_add`); at the end
//! of the row the lanes are summed by a fixed pairwise tree (8 + 8, 4 + 4, 2 + 2,
//! 1 + 1). Weights are decoded exactly as ggml decodes them, so `w[i]` is one f32
//! value whichever code produced it.
//!
//! Three paths follow that order:
//! - **AVX-512** (x86-64 with `avx512f/bw/vl` and `fma`, run-time detection; `avx512` module,
//!   built with Rust ≥ 1.89): the 16 lanes of a (row, column) pair are one register;
//!   4- and 5-bit weights are looked up in a table of the block's possible weights
//!   (each entry computed by the scalar decoder's operations), the others (2-, 3-, 6-
//!   and 8-bit quants, F16 and BF16) converted. Four rows at once in a mat-vec; in a
//!   mat-mul, tiles of 2 rows × 4 columns (32-weight blocks) or 1 row × 8 columns
//!   (256-weight blocks); from 9 columns, 4 rows decoded once into a buffer and run
//!   against every column in 4 × 4 register tiles.
//! - **AVX2** (x86-64 with `avx2`, `f16c` and `fma`; `avx2` module): the same types
//!   (the legacy ones, the k-quants but Q8_K, IQ4_NL, IQ4_XS, TQ2_0, and F16/BF16 rows
//!   of whole 32-weight units) are decoded straight into registers, 32 weights at a
//!   time, four rows at once in a mat-vec (independent add chains, one x load per four
//!   rows) and four columns at once in a mat-mul (one decode per four columns); the 16
//!   lanes are two registers.
//! - **Portable** (every type and CPU): a row is walked in chunks of [`CHUNK`] weights
//!   (whole blocks); each chunk is decoded into a stack buffer by the type's scalar
//!   decoder and multiplied into the lanes of each column, up to [`COL_TILE`] columns
//!   per decoded chunk.
//!
//! All compute the same bits (tested), so results depend neither on the CPU's
//! features nor on how rows and columns are grouped into tiles and rayon tasks.
//!
//! Batch invariance follows: the value for (row, column) depends only on that row and
//! that column, and Rust neither reassociates nor contracts f32 arithmetic (the FMAs
//! are written out, never left to the compiler), so `matmul`
//! column j is bit-identical to `matvec` of column j and to `dot_row`, for any number
//! of columns or threads.

use crate::kv::KvRows;
use rayon::prelude::*;

use crate::Decoder;
use lamina_gguf::GgmlType;

#[cfg(target_arch = "x86_64")]
mod avx2;
// Compiled only by Rust ≥ 1.89 (the build script sets `lamina_avx512`).
#[cfg(all(target_arch = "x86_64", lamina_avx512))]
#[clippy::msrv = "1.89"]
mod avx512;

/// Accumulator lanes per (row, column) pair: two AVX2 registers, one AVX-512 register.
const LANES: usize = 16;
/// Weights decoded per step of the portable path; a multiple of every block size.
const CHUNK: usize = 256;
/// Columns sharing one decoded chunk in the portable `matmul`.
const COL_TILE: usize = 8;
/// Least estimated single-thread time per rayon task, in ns, when called from a pool
/// worker: a split then costs only a steal.
const MIN_TASK_NS_IN_POOL: usize = 2_500;
/// The same when called from any other thread: the caller hands the call to the pool
/// and sleeps until it is done, two thread wake-ups that cost several microseconds
/// (more on a busy machine), so only calls long enough to absorb them are split. (A
/// model's 1536 × 576 projection ran no faster split in two from outside the pool:
/// docs/perf/cpu.md, 2026-12-02, "splitting a product".)
const MIN_TASK_NS_OUTSIDE_POOL: usize = 40_000;
/// Rows per rayon task are a multiple of this, so the SIMD path's row groups stay whole.
const ROW_GROUP: usize = 4;

/// A SIMD kernel over whole rows: `(w, row_bytes, x, n, out)` sets `out[r·n + c]` to
/// row r of `w` · column c of `x` (n columns, column-major) and returns true, or
/// returns false without writing when the shapes are not those of its type.
pub(crate) type SimdDots = fn(&[u8], usize, &[f32], usize, &mut [f32]) -> bool;

/// The SIMD kernels of `ty` this CPU can run, widest first (tests compare each with
/// the portable path).
#[cfg(test)]
fn simd_kernels(ty: GgmlType) -> Vec<(&'static str, SimdDots)> {
    #[allow(unused_mut)]
    let mut found: Vec<(&'static str, SimdDots)> = Vec::new();
    #[cfg(all(target_arch = "x86_64", lamina_avx512))]
    found.extend(avx512::dots_fn(ty).map(|f| ("avx512", f)));
    #[cfg(target_arch = "x86_64")]
    found.extend(avx2::dots_fn(ty).map(|f| ("avx2", f)));
    #[cfg(not(target_arch = "x86_64"))]
    let _ = ty;
    found
}

/// The widest SIMD kernel of `ty` on this CPU, if any, up to the limit set by
/// [`SIMD_LIMIT_VAR`].
fn simd_dots(ty: GgmlType) -> Option<(SimdLevel, SimdDots)> {
    let limit = simd_limit();
    #[cfg(all(target_arch = "x86_64", lamina_avx512))]
    if limit >= SimdLevel::Avx512 {
        if let Some(f) = avx512::dots_fn(ty) {
            return Some((SimdLevel::Avx512, f));
        }
    }
    #[cfg(target_arch = "x86_64")]
    if limit >= SimdLevel::Avx2 {
        if let Some(f) = avx2::dots_fn(ty) {
            return Some((SimdLevel::Avx2, f));
        }
    }
    let _ = (ty, limit);
    None
}

/// Environment variable capping the SIMD path: `portable`, `avx2` or `avx512` (the
/// default: the widest this CPU has). Results are the same bits whichever path runs;
/// the knob is for measuring and for ruling a path out.
pub const SIMD_LIMIT_VAR: &str = "LAMINA_CPU_SIMD";

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum SimdLevel {
    Portable,
    Avx2,
    Avx512,
}

impl SimdLevel {
    /// Rough single-thread cost of one weight·column product, in picoseconds (the
    /// 4-bit mat-vecs of `benches/matvec.rs`); it only sizes rayon tasks.
    fn ps_per_product(self) -> usize {
        match self {
            SimdLevel::Portable => 350,
            SimdLevel::Avx2 => 80,
            SimdLevel::Avx512 => 40,
        }
    }
}

/// [`SIMD_LIMIT_VAR`], read once; an unknown value means no limit.
fn simd_limit() -> SimdLevel {
    static LIMIT: std::sync::OnceLock<SimdLevel> = std::sync::OnceLock::new();
    *LIMIT.get_or_init(|| match std::env::var(SIMD_LIMIT_VAR).as_deref() {
        Ok("portable") => SimdLevel::Portable,
        Ok("avx2") => SimdLevel::Avx2,
        _ => SimdLevel::Avx512,
    })
}

/// How to walk rows of one type.
#[derive(Clone, Copy)]
pub(crate) struct RowKernel {
    decode: Decoder,
    block_size: usize,
    type_size: usize,
    simd: Option<SimdDots>,
    /// The path `simd` belongs to (`Portable` when it is `None`).
    level: SimdLevel,
}

/// Output columns per task of [`RowKernel::matmul`]'s transpose: 16 floats,
/// one cache line of a row-major result row.
const TRANSPOSE_COLS: usize = 16;

impl RowKernel {
    /// The kernel for rows of `ty`, using this CPU's SIMD path where one exists.
    pub fn new(ty: GgmlType, decode: Decoder, block_size: usize, type_size: usize) -> Self {
        let (level, simd) = match simd_dots(ty) {
            Some((level, f)) => (level, Some(f)),
            None => (SimdLevel::Portable, None),
        };
        RowKernel {
            decode,
            block_size,
            type_size,
            simd,
            level,
        }
    }

    /// The same kernel restricted to the portable path.
    #[cfg(test)]
    fn portable(self) -> Self {
        RowKernel {
            simd: None,
            level: SimdLevel::Portable,
            ..self
        }
    }

    /// Bytes of one decode step.
    fn chunk_bytes(&self) -> usize {
        CHUNK / self.block_size * self.type_size
    }

    /// Rows per rayon task when each row costs `work` products: enough for the task to
    /// outweigh its scheduling, a whole number of [`ROW_GROUP`]s. A call that fits in
    /// one task runs on the calling thread (rayon splits nothing).
    fn rows_per_task(&self, work: usize) -> usize {
        let ns = if rayon::current_thread_index().is_some() {
            MIN_TASK_NS_IN_POOL
        } else {
            MIN_TASK_NS_OUTSIDE_POOL
        };
        let products = ns * 1000 / self.level.ps_per_product();
        (products / work.max(1)).max(1).next_multiple_of(ROW_GROUP)
    }

    /// `out[c] = row · x[(col0 + c)·cols ..][..cols]` for `c < out.len() ≤ COL_TILE`
    /// (the portable path).
    ///
    /// Caller's invariants: `row` holds exactly `cols` weights of this kernel's type and
    /// `x` holds columns `col0 .. col0 + out.len()` of length `cols`.
    fn row_dots(&self, row: &[u8], cols: usize, x: &[f32], col0: usize, out: &mut [f32]) {
        let nt = out.len().min(COL_TILE);
        let mut acc = [[0.0f32; LANES]; COL_TILE];
        let mut buf = [0.0f32; CHUNK];
        for (ci, bytes) in row.chunks(self.chunk_bytes()).enumerate() {
            let w0 = ci * CHUNK;
            let n = bytes.len() / self.type_size * self.block_size;
            let w = &mut buf[..n];
            (self.decode)(bytes, w);
            for (c, a) in acc[..nt].iter_mut().enumerate() {
                let start = (col0 + c) * cols + w0;
                accumulate(a, w, &x[start..start + n]);
            }
        }
        for (o, a) in out.iter_mut().zip(&acc) {
            *o = reduce(a);
        }
    }

    /// `out[r·n + c] = W[r] · X[c]` for the whole rows of `row_bytes` (> 0) in `w` and
    /// the n columns of `x`.
    fn dots(&self, w: &[u8], row_bytes: usize, x: &[f32], n: usize, out: &mut [f32]) {
        if let Some(simd) = self.simd {
            if simd(w, row_bytes, x, n, out) {
                return;
            }
        }
        let cols = x.len() / n.max(1);
        for (row, o) in w.chunks_exact(row_bytes).zip(out.chunks_exact_mut(n)) {
            for (t, tile) in o.chunks_mut(COL_TILE).enumerate() {
                self.row_dots(row, cols, x, t * COL_TILE, tile);
            }
        }
    }

    pub fn dot(&self, row: &[u8], x: &[f32]) -> f32 {
        let mut out = [0.0];
        if !row.is_empty() {
            self.dots(row, row.len(), x, 1, &mut out);
        }
        out[0]
    }

    /// `y[r] = W[r] · x`; `w` holds `y.len()` rows of `row_bytes` bytes.
    pub fn matvec(&self, w: &[u8], row_bytes: usize, x: &[f32], y: &mut [f32]) {
        if row_bytes == 0 {
            y.fill(0.0);
            return;
        }
        let per_task = self.rows_per_task(x.len());
        y.par_chunks_mut(per_task)
            .zip(w.par_chunks(per_task * row_bytes))
            .for_each(|(y, w)| self.dots(w, row_bytes, x, 1, y));
    }

    /// `Y[c][r] = W[r] · X[c]` for column-major `x` (n columns of `cols`) and `y`
    /// (n columns of `rows`).
    pub fn matmul(
        &self,
        w: &[u8],
        rows: usize,
        row_bytes: usize,
        x: &[f32],
        n: usize,
        y: &mut [f32],
    ) {
        if n == 0 || rows == 0 {
            return;
        }
        if n == 1 {
            // One column is already laid out as the mat-vec's output.
            self.matvec(w, row_bytes, x, y);
            return;
        }
        if row_bytes == 0 {
            y.fill(0.0);
            return;
        }
        // Rows are the parallel axis; results land row-major first and are transposed
        // into the column-major output afterwards.
        let per_task = self.rows_per_task(x.len());
        let mut by_row = vec![0.0f32; rows * n];
        by_row
            .par_chunks_mut(per_task * n)
            .zip(w.par_chunks(per_task * row_bytes))
            .for_each(|(out, w)| self.dots(w, row_bytes, x, n, out));
        // The transpose on both cores too (serial, it was a twelfth of a
        // prompt's time), in TRANSPOSE_COLS × TRANSPOSE_COLS blocks: each
        // task takes that many output columns and walks the rows a block at
        // a time, so a block's reads (one cache line per row) and writes
        // (one line per column) stay in L1.
        const B: usize = TRANSPOSE_COLS;
        y[..rows * n]
            .par_chunks_mut(rows * B)
            .enumerate()
            .for_each(|(b, ys)| {
                let c0 = b * B;
                let nc = ys.len() / rows;
                for r0 in (0..rows).step_by(B) {
                    let rn = B.min(rows - r0);
                    for j in 0..nc {
                        let col = &mut ys[j * rows + r0..][..rn];
                        for (i, v) in col.iter_mut().enumerate() {
                            *v = by_row[(r0 + i) * n + c0 + j];
                        }
                    }
                }
            });
    }
}

/// `a · b` over their common length in the kernels' order (16 lanes of FMAs, the
/// pairwise tree).
pub fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let mut acc = [0.0f32; LANES];
    accumulate(&mut acc, &a[..n], &b[..n]);
    reduce(&acc)
}

/// Attention scores: `out[j] = scale · (q · k_j)` for the rows `k_j =
/// keys[j·stride ..][..q.len()]`, `j < out.len()`, each product in
/// [`dot_f32`]'s order. One call for a head's whole context, compiled for FMA
/// where the CPU has it: per key, a call and a feature check cost as much as
/// the 64-value product itself.
pub fn attention_scores(q: &[f32], keys: &[f32], stride: usize, scale: f32, out: &mut [f32]) {
    attention_scores_heads(q, q.len(), keys, stride, scale, out);
}

/// [`attention_scores`] for several query heads that share their keys
/// (grouped-query attention): `q` holds `g` heads of `d` values one after
/// another, `out` their `g` rows of scores. Each key row is read once for
/// all of them (a long context's keys stream through memory once per group
/// instead of once per head); every score is the same product, so the bits
/// are those of one call per head.
pub fn attention_scores_heads(
    q: &[f32],
    d: usize,
    keys: &[f32],
    stride: usize,
    scale: f32,
    out: &mut [f32],
) {
    attention_scores_rows(q, &KvRows::f32(keys, stride, d), scale, out);
}

/// [`attention_scores_heads`] over keys in any cache type ([`KvRows`]): a
/// row stored as f16 or q8_0 is widened to f32 first (exactly, for f16),
/// so the scores are those of an f32 cache holding the same values.
pub fn attention_scores_rows(q: &[f32], keys: &KvRows<'_>, scale: f32, out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512f") && std::arch::is_x86_feature_detected!("f16c")
    {
        // SAFETY: the features were just detected.
        unsafe { scores_avx512(q, keys, scale, out) };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("fma") && std::arch::is_x86_feature_detected!("f16c") {
        // SAFETY: the features were just detected.
        unsafe { scores_fma(q, keys, scale, out) };
        return;
    }
    scores_body::<false>(q, keys, scale, out);
}

/// [`attention_scores_rows`] compiled for AVX-512: the 16 lanes of the
/// product are one register, the same operations as the other paths.
/// Caller: the CPU has `avx512f`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,fma,f16c")]
unsafe fn scores_avx512(q: &[f32], keys: &KvRows<'_>, scale: f32, out: &mut [f32]) {
    scores_body::<true>(q, keys, scale, out);
}

/// [`attention_scores_rows`] compiled with the FMA instructions. Caller: the CPU has `fma`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "fma,f16c")]
unsafe fn scores_fma(q: &[f32], keys: &KvRows<'_>, scale: f32, out: &mut [f32]) {
    scores_body::<true>(q, keys, scale, out);
}

#[inline(always)]
fn scores_body<const F16C: bool>(q: &[f32], keys: &KvRows<'_>, scale: f32, out: &mut [f32]) {
    let d = keys.width();
    let heads = q.len() / d.max(1);
    let len = out.len() / heads.max(1);
    let mut buf = keys.buffer();
    for j in 0..len {
        let k = keys.row::<F16C>(j, &mut buf);
        for h in 0..heads {
            let mut acc = [0.0f32; LANES];
            accumulate_lanes(&mut acc, &q[h * d..][..d], k);
            out[h * len + j] = reduce(&acc) * scale;
        }
    }
}

/// `out = Σ_j p[j] · v_j` for the rows `v_j = values[j·stride ..][..out.len()]`, `j <
/// p.len()`.
pub fn attention_values(p: &[f32], values: &[f32], stride: usize, out: &mut [f32]) {
    attention_values_heads(p, p.len(), values, stride, out);
}

/// [`attention_values`] for several heads that share their values: `p`
/// holds `g` rows of `len` weights, `out` the `g` heads' outputs one after
/// another. Each value row is read once for all of them; every output
/// element is the same chain as one call per head gives.
pub fn attention_values_heads(
    p: &[f32],
    len: usize,
    values: &[f32],
    stride: usize,
    out: &mut [f32],
) {
    let heads = p.len() / len.max(1);
    let d = out.len() / heads.max(1);
    attention_values_rows(p, len, &KvRows::f32(values, stride, d), out);
}

/// [`attention_values_heads`] over values in any cache type ([`KvRows`]),
/// widened to f32 row by row as [`attention_scores_rows`] does.
pub fn attention_values_rows(p: &[f32], len: usize, values: &KvRows<'_>, out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512f") && std::arch::is_x86_feature_detected!("f16c")
    {
        // SAFETY: the features were just detected.
        unsafe { values_avx512(p, len, values, out) };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("fma") && std::arch::is_x86_feature_detected!("f16c") {
        // SAFETY: the features were just detected.
        unsafe { values_fma(p, len, values, out) };
        return;
    }
    values_body::<false>(p, len, values, out);
}

/// [`attention_values_rows`] compiled for AVX-512. Caller: the CPU has `avx512f`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,fma,f16c")]
unsafe fn values_avx512(p: &[f32], len: usize, values: &KvRows<'_>, out: &mut [f32]) {
    values_body::<true>(p, len, values, out);
}

/// [`attention_values_rows`] compiled with the FMA instructions. Caller: the CPU has `fma`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "fma,f16c")]
unsafe fn values_fma(p: &[f32], len: usize, values: &KvRows<'_>, out: &mut [f32]) {
    values_body::<true>(p, len, values, out);
}

/// `out = Σ_j p[j] · v_j`, each element a chain of FMAs in increasing j (`out` is
/// zeroed first). Compiled for FMA where the CPU has it, four rows a pass so `out`
/// is loaded and stored a quarter as often; the chain, and so the bits, do not
/// depend on that grouping.
#[inline(always)]
fn values_body<const F16C: bool>(p: &[f32], len: usize, values: &KvRows<'_>, out: &mut [f32]) {
    let heads = p.len() / len.max(1);
    let d = values.width();
    out.fill(0.0);
    let mut bufs = [
        values.buffer(),
        values.buffer(),
        values.buffer(),
        values.buffer(),
    ];
    let mut j = 0;
    while j + 4 <= len {
        let [b0, b1, b2, b3] = &mut bufs;
        let (v0, v1, v2, v3) = (
            values.row::<F16C>(j, b0),
            values.row::<F16C>(j + 1, b1),
            values.row::<F16C>(j + 2, b2),
            values.row::<F16C>(j + 3, b3),
        );
        for h in 0..heads {
            let ph = &p[h * len..][..len];
            let (p0, p1, p2, p3) = (ph[j], ph[j + 1], ph[j + 2], ph[j + 3]);
            let oh = &mut out[h * d..][..d];
            for i in 0..d {
                let mut o = oh[i];
                o = p0.mul_add(v0[i], o);
                o = p1.mul_add(v1[i], o);
                o = p2.mul_add(v2[i], o);
                o = p3.mul_add(v3[i], o);
                oh[i] = o;
            }
        }
        j += 4;
    }
    while j < len {
        let v = values.row::<F16C>(j, &mut bufs[0]);
        for h in 0..heads {
            let pj = p[h * len + j];
            for (o, x) in out[h * d..][..d].iter_mut().zip(v) {
                *o = pj.mul_add(*x, *o);
            }
        }
        j += 1;
    }
}

/// `acc[l] = fma(w[i], x[i], acc[l])` for i ≡ l (mod LANES), in increasing i: one
/// rounding per weight, as the SIMD paths' FMA instructions, so every path gives the
/// same bits. (Multiply-then-add would also agree everywhere, at half the SIMD paths'
/// arithmetic rate: a prompt is bound by it.) Where the CPU has FMA the loop is
/// compiled for it; elsewhere `mul_add` is libm's exact `fmaf`, slower but the same.
#[inline(always)]
fn accumulate(acc: &mut [f32; LANES], w: &[f32], x: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("fma") {
        // SAFETY: the feature was just detected.
        unsafe { accumulate_fma(acc, w, x) };
        return;
    }
    accumulate_lanes(acc, w, x);
}

/// [`accumulate`] compiled with the FMA instructions. Caller: the CPU has `fma`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "fma")]
unsafe fn accumulate_fma(acc: &mut [f32; LANES], w: &[f32], x: &[f32]) {
    accumulate_lanes(acc, w, x);
}

#[inline(always)]
fn accumulate_lanes(acc: &mut [f32; LANES], w: &[f32], x: &[f32]) {
    let mut wg = w.chunks_exact(LANES);
    let mut xg = x.chunks_exact(LANES);
    for (wl, xl) in (&mut wg).zip(&mut xg) {
        for l in 0..LANES {
            acc[l] = wl[l].mul_add(xl[l], acc[l]);
        }
    }
    // Only plain float rows have lengths that are not a multiple of LANES.
    for (a, (w, x)) in acc
        .iter_mut()
        .zip(wg.remainder().iter().zip(xg.remainder()))
    {
        *a = w.mul_add(*x, *a);
    }
}

/// Pairwise sum of the lanes: 8 + 8, then 4 + 4, 2 + 2, 1 + 1.
#[inline(always)]
fn reduce(acc: &[f32; LANES]) -> f32 {
    let mut s = *acc;
    let mut width = LANES / 2;
    while width > 0 {
        for l in 0..width {
            s[l] += s[l + width];
        }
        width /= 2;
    }
    s[0]
}

#[cfg(test)]
mod tests;
