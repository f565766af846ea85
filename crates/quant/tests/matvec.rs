//! `dot_row`, `matvec` and `matmul` against a dequantize-then-f64 reference, and their
//! batch invariance (bit for bit).
//!
//! Weight rows are assembled from the golden fixture blocks (valid scales, random
//! quants), picked pseudo-randomly per row; plain float rows are drawn in [-1, 1].

#![allow(clippy::unwrap_used)]

use std::path::PathBuf;

use lamina_quant::{dequantize, dot_row, matmul, matvec, supports, GgmlType, QuantError};

/// ‖y − ref‖₂ / ‖ref‖₂ allowed against the f64 reference. The kernel sums each output
/// in f32 along 16 lanes of at most cols/16 + 4 = 52 rounded steps (cols ≤ 768 here),
/// so the worst case is about 52·2⁻²⁴ ≈ 3·10⁻⁶ of Σ|w·x|; random signs make the error
/// a random walk, typically ~10⁻⁷ of ‖ref‖. 10⁻⁵ leaves headroom for unlucky
/// cancellation, while any wrong weight, block or column moves the result by O(1).
const MATVEC_REL_TOL: f64 = 1e-5;

/// A tiny deterministic xorshift64* generator; tests need no external randomness.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    /// Uniform in [-1, 1).
    fn signed_unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
    fn vec(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.signed_unit()).collect()
    }
}

fn fixture_blocks(ty: GgmlType) -> Vec<u8> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/quant");
    std::fs::read(dir.join(format!("{}.blocks", ty.name()))).unwrap()
}

/// Bytes of a `rows` × `cols` matrix of `ty` with finite, realistic weights.
fn random_matrix(ty: GgmlType, rows: usize, cols: usize, rng: &mut Rng) -> Vec<u8> {
    match ty {
        GgmlType::F32 => rng
            .vec(rows * cols)
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect(),
        GgmlType::F16 => rng
            .vec(rows * cols)
            .iter()
            .flat_map(|v| half::f16::from_f32(*v).to_le_bytes())
            .collect(),
        GgmlType::BF16 => rng
            .vec(rows * cols)
            .iter()
            .flat_map(|v| half::bf16::from_f32(*v).to_le_bytes())
            .collect(),
        _ => {
            let pool = fixture_blocks(ty);
            let ts = ty.type_size() as usize;
            let n_pool = pool.len() / ts;
            let blocks = rows * cols / ty.block_size() as usize;
            (0..blocks)
                .flat_map(|_| {
                    let b = rng.below(n_pool);
                    pool[b * ts..(b + 1) * ts].to_vec()
                })
                .collect()
        }
    }
}

/// Row lengths to try: 2 and 3 blocks for block types; for plain floats awkward lengths
/// (the portable path) and whole units of 32 weights (the SIMD kernels' rows).
fn col_counts(ty: GgmlType) -> Vec<usize> {
    let bs = ty.block_size() as usize;
    if bs == 1 {
        vec![1, 15, 17, 96, 531]
    } else {
        vec![2 * bs, 3 * bs]
    }
}

fn supported() -> impl Iterator<Item = GgmlType> {
    GgmlType::ALL.into_iter().filter(|t| supports(*t))
}

#[test]
fn matvec_matches_dequantized_f64_reference() {
    let rows = 37;
    let mut rng = Rng(0x5EED_0001);
    for ty in supported() {
        for cols in col_counts(ty) {
            let w = random_matrix(ty, rows, cols, &mut rng);
            let x = rng.vec(cols);
            let mut y = vec![f32::NAN; rows];
            matvec(ty, &w, rows, cols, &x, &mut y).unwrap();

            let mut dense = vec![0.0f32; rows * cols];
            dequantize(ty, &w, &mut dense).unwrap();
            let reference: Vec<f64> = dense
                .chunks_exact(cols)
                .map(|row| {
                    row.iter()
                        .zip(&x)
                        .map(|(w, x)| f64::from(*w) * f64::from(*x))
                        .sum()
                })
                .collect();
            let err: f64 = y
                .iter()
                .zip(&reference)
                .map(|(y, r)| (f64::from(*y) - r).powi(2))
                .sum();
            let norm: f64 = reference.iter().map(|r| r * r).sum();
            assert!(norm > 0.0, "{ty} cols {cols}: degenerate reference");
            let rel = (err / norm).sqrt();
            assert!(
                rel < MATVEC_REL_TOL,
                "{ty} cols {cols}: relative error {rel:e}"
            );
        }
    }
}

#[test]
fn matmul_and_dot_row_are_batch_invariant() {
    let rows = 37;
    let mut rng = Rng(0x5EED_0002);
    for ty in supported() {
        let cols = *col_counts(ty).last().unwrap();
        let w = random_matrix(ty, rows, cols, &mut rng);
        let row_bytes = w.len() / rows;
        for n in [1, 2, 3, 8, 17] {
            let x = rng.vec(n * cols);
            let mut y = vec![f32::NAN; n * rows];
            matmul(ty, &w, rows, cols, &x, n, &mut y).unwrap();
            for c in 0..n {
                let xc = &x[c * cols..(c + 1) * cols];
                let mut yc = vec![f32::NAN; rows];
                matvec(ty, &w, rows, cols, xc, &mut yc).unwrap();
                for r in 0..rows {
                    let got = y[c * rows + r];
                    assert_eq!(got.to_bits(), yc[r].to_bits(), "{ty} n={n} col {c} row {r}");
                    let single = dot_row(ty, &w[r * row_bytes..(r + 1) * row_bytes], xc).unwrap();
                    assert_eq!(single.to_bits(), yc[r].to_bits(), "{ty} dot_row row {r}");
                }
            }
        }
    }
}

#[test]
fn large_matvec_splits_across_threads_without_changing_results() {
    // Enough rows for rayon to split the work (called from inside a pool, where tasks
    // are small); every row must equal its own dot_row, and every thread count must
    // give the same bits.
    let (ty, rows, cols) = (GgmlType::Q4K, 1001, 512);
    let mut rng = Rng(0x5EED_0003);
    let w = random_matrix(ty, rows, cols, &mut rng);
    let x = rng.vec(cols);
    let rb = w.len() / rows;
    let want: Vec<u32> = (0..rows)
        .map(|r| dot_row(ty, &w[r * rb..(r + 1) * rb], &x).unwrap().to_bits())
        .collect();
    for threads in [1, 2, 3] {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        let mut y = vec![0.0; rows];
        pool.install(|| matvec(ty, &w, rows, cols, &x, &mut y))
            .unwrap();
        for (r, got) in y.iter().enumerate() {
            assert_eq!(got.to_bits(), want[r], "{threads} threads, row {r}");
        }
        let n = 5;
        let xs = rng.vec(n * cols);
        let mut ys = vec![0.0; n * rows];
        pool.install(|| matmul(ty, &w, rows, cols, &xs, n, &mut ys))
            .unwrap();
        for c in 0..n {
            for r in 0..rows {
                let want = dot_row(ty, &w[r * rb..(r + 1) * rb], &xs[c * cols..][..cols]).unwrap();
                assert_eq!(
                    ys[c * rows + r].to_bits(),
                    want.to_bits(),
                    "{threads} threads, col {c} row {r}"
                );
            }
        }
    }
}

#[test]
fn empty_shapes_are_fine() {
    let ty = GgmlType::Q8_0;
    let mut y = vec![f32::NAN; 3];
    matvec(ty, &[], 3, 0, &[], &mut y).unwrap();
    assert_eq!(y, [0.0; 3]);
    matvec(ty, &[], 0, 64, &[0.0; 64], &mut []).unwrap();
    let mut y6 = vec![f32::NAN; 6];
    matmul(ty, &[], 3, 0, &[], 2, &mut y6).unwrap();
    assert_eq!(y6, [0.0; 6]);
    matmul(ty, &[0; 34 * 3], 3, 32, &[], 0, &mut []).unwrap();
    assert_eq!(dot_row(ty, &[], &[]), Ok(0.0));
}

#[test]
fn shape_errors_name_the_buffer() {
    let ty = GgmlType::Q4_0;
    let w = vec![0u8; 18 * 2 * 3]; // 3 rows of 64 weights
    let x = vec![0.0; 64];
    let mut y = vec![0.0; 3];
    assert_eq!(
        matvec(ty, &w, 3, 48, &x, &mut y),
        Err(QuantError::PartialRow {
            ty,
            cols: 48,
            block_size: 32
        })
    );
    assert_eq!(
        matvec(ty, &w, 4, 64, &x, &mut y),
        Err(QuantError::LengthMismatch {
            ty,
            what: "w (bytes)",
            expected: 144,
            actual: 108
        })
    );
    assert_eq!(
        matvec(ty, &w, 3, 64, &x[..32], &mut y),
        Err(QuantError::LengthMismatch {
            ty,
            what: "x",
            expected: 64,
            actual: 32
        })
    );
    assert_eq!(
        matvec(ty, &w, 3, 64, &x, &mut y[..2]),
        Err(QuantError::LengthMismatch {
            ty,
            what: "y",
            expected: 3,
            actual: 2
        })
    );
    assert_eq!(
        matmul(ty, &w, 3, 64, &x, 2, &mut [0.0; 6]),
        Err(QuantError::LengthMismatch {
            ty,
            what: "x",
            expected: 128,
            actual: 64
        })
    );
    assert!(matches!(
        matmul(ty, &w, 3, 64, &x, usize::MAX, &mut []),
        Err(QuantError::Overflow { .. })
    ));
    assert!(matches!(
        matvec(ty, &w, usize::MAX, 64, &x, &mut y),
        Err(QuantError::Overflow { .. })
    ));
    assert_eq!(
        dot_row(ty, &w[..18], &x),
        Err(QuantError::LengthMismatch {
            ty,
            what: "x",
            expected: 32,
            actual: 64
        })
    );
    assert_eq!(
        dot_row(GgmlType::I32, &[0; 4], &[0.0]),
        Err(QuantError::Unsupported { ty: GgmlType::I32 })
    );
}
