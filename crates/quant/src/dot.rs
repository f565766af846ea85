//! Dot products over quantized rows: the CPU mat-vec (decode) and mat-mul (prompt)
//! kernels, multithreaded over rows with rayon.
//!
//! A row is walked in chunks of [`CHUNK`] weights (whole blocks; every block type has
//! at most 256 weights); each chunk is decoded once into a stack buffer and multiplied
//! into [`LANES`] f32 accumulators per column, which are summed by a fixed pairwise
//! tree at the end of the row. Weights stay quantized in memory.
//!
//! Batch invariance: the value computed for (row, column) depends only on that row and
//! that column. The chunking, the lane assignment and the final tree are functions of
//! the row length alone, and Rust neither reassociates nor contracts f32 arithmetic,
//! so `matmul` column j is bit-identical to `matvec` of column j and to `dot_row`.
//! Columns are processed in tiles of [`COL_TILE`] only to reuse each decoded chunk;
//! the tiling never mixes columns.

use rayon::prelude::*;

use crate::Decoder;

/// Accumulator lanes per column: two AVX or four SSE/NEON registers, enough
/// independent sums for the compiler to vectorise and pipeline the loop.
const LANES: usize = 16;
/// Weights decoded per step; a multiple of every block size.
const CHUNK: usize = 256;
/// Columns sharing one decoded chunk in `matmul`.
const COL_TILE: usize = 8;
/// Aim for at least this many weights per rayon task, so small matrices are not
/// split into tasks that cost more to schedule than to compute.
const MIN_WEIGHTS_PER_TASK: usize = 1 << 15;

/// How to walk rows of one type.
#[derive(Clone, Copy)]
pub(crate) struct RowKernel {
    pub decode: Decoder,
    pub block_size: usize,
    pub type_size: usize,
}

impl RowKernel {
    /// Bytes of one decode step.
    fn chunk_bytes(&self) -> usize {
        CHUNK / self.block_size * self.type_size
    }

    /// Rows per rayon task for rows of `cols` weights.
    pub fn min_rows_per_task(cols: usize) -> usize {
        (MIN_WEIGHTS_PER_TASK / cols.max(1)).max(1)
    }

    /// `out[c] = row · x[(col0 + c)·cols ..][..cols]` for `c < out.len() ≤ COL_TILE`.
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

    pub fn dot(&self, row: &[u8], x: &[f32]) -> f32 {
        let mut out = [0.0];
        self.row_dots(row, x.len(), x, 0, &mut out);
        out[0]
    }

    /// `y[r] = W[r] · x`; `w` holds `y.len()` rows of `row_bytes` bytes.
    pub fn matvec(&self, w: &[u8], row_bytes: usize, x: &[f32], y: &mut [f32]) {
        let cols = x.len();
        if row_bytes == 0 {
            y.fill(0.0);
            return;
        }
        y.par_iter_mut()
            .zip(w.par_chunks(row_bytes))
            .with_min_len(Self::min_rows_per_task(cols))
            .for_each(|(y, row)| {
                self.row_dots(row, cols, x, 0, std::slice::from_mut(y));
            });
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
        if row_bytes == 0 {
            y.fill(0.0);
            return;
        }
        let cols = x.len() / n;
        // Rows are the parallel axis; results land row-major first and are transposed
        // into the column-major output afterwards.
        let mut by_row = vec![0.0f32; rows * n];
        by_row
            .par_chunks_mut(n)
            .zip(w.par_chunks(row_bytes))
            .with_min_len(Self::min_rows_per_task(cols.saturating_mul(n)))
            .for_each(|(out, row)| {
                for (t, tile) in out.chunks_mut(COL_TILE).enumerate() {
                    self.row_dots(row, cols, x, t * COL_TILE, tile);
                }
            });
        for (r, vals) in by_row.chunks_exact(n).enumerate() {
            for (c, v) in vals.iter().enumerate() {
                y[c * rows + r] = *v;
            }
        }
    }
}

/// `acc[l] += w[i]·x[i]` for i ≡ l (mod LANES), in increasing i. Plain multiply then
/// add: an FMA would change the result with the target's features.
#[inline(always)]
fn accumulate(acc: &mut [f32; LANES], w: &[f32], x: &[f32]) {
    let mut wg = w.chunks_exact(LANES);
    let mut xg = x.chunks_exact(LANES);
    for (wl, xl) in (&mut wg).zip(&mut xg) {
        for l in 0..LANES {
            acc[l] += wl[l] * xl[l];
        }
    }
    // Only plain float rows have lengths that are not a multiple of LANES.
    for (a, (w, x)) in acc
        .iter_mut()
        .zip(wg.remainder().iter().zip(xg.remainder()))
    {
        *a += w * x;
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
