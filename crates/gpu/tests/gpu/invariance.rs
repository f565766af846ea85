//! Batch invariance: column j of an N-column product is bit-identical to the
//! 1-column (mat-vec) product of the same input, for every kernel variant.

use super::common;

use common::Rng;
use lamina_gguf::GgmlType;
use lamina_gpu::{Columns, Gpu, MatmulKernel, MatvecShape, Tensor, Weight, SUPPORTED};

const NS: [usize; 7] = [1, 2, 5, 8, 9, 64, 300];
const ROWS: usize = 37;

fn cols_for(ty: GgmlType) -> usize {
    match ty.block_size() {
        1 => 1059,
        32 => 32 * 35,
        _ => 256 * 5,
    }
}

fn run(gpu: &Gpu, kernel: MatmulKernel, w: &Weight, x: &Tensor, n: usize) -> Vec<u32> {
    let y = common::poisoned(gpu, w.rows() * n);
    let mut b = gpu.batch();
    b.matmul_with(kernel, w, x, &y, n).unwrap();
    b.submit().unwrap();
    gpu.read_u32(&y).unwrap()
}

#[test]
fn every_column_count_matches_matvec_bit_for_bit() {
    let (_turn, gpu) = common::gpu();
    let nmax = *NS.iter().max().unwrap();
    let mut failures = Vec::new();
    for ty in SUPPORTED {
        let cols = cols_for(ty);
        let mut rng = Rng::new(0x5eed ^ ty.id() as u64);
        let data = common::random_weight(&mut rng, ty, ROWS, cols);
        let w = gpu.upload_weight(ty, ROWS, cols, &data).unwrap();
        let x = rng.vec(cols * nmax);
        let xt = gpu.upload_f32(&x).unwrap();

        // The 1-column products, each from its own single-column buffer for a
        // few columns, and by the mat-vec kernel per column for all of them.
        let single = run(gpu, MatmulKernel::MatVec, &w, &xt, nmax);
        assert!(
            single.iter().all(|b| !f32::from_bits(*b).is_nan()),
            "{ty}: NaN"
        );
        for j in [0, 1, 150, nmax - 1] {
            let xj = gpu.upload_f32(&x[j * cols..(j + 1) * cols]).unwrap();
            let alone = run(gpu, MatmulKernel::MatVec, &w, &xj, 1);
            assert_eq!(alone, single[j * ROWS..(j + 1) * ROWS], "{ty} column {j}");
        }

        for n in NS {
            let xn = gpu.upload_f32(&x[..n * cols]).unwrap();
            let want = &single[..n * ROWS];
            let mut kernels = vec![MatmulKernel::Auto];
            // Every variant at a few sizes, beyond the sizes Auto picks it for.
            if matches!(n, 2 | 9) {
                kernels.extend([MatmulKernel::Small, MatmulKernel::Tiled]);
            }
            if n == 1 {
                kernels.extend([MatmulKernel::Small, MatmulKernel::Tiled]);
            }
            for kernel in kernels {
                let got = run(gpu, kernel, &w, &xn, n);
                if got != want {
                    let diff = got.iter().zip(want).filter(|(a, b)| a != b).count();
                    failures.push(format!(
                        "{ty} {kernel:?} N={n}: {diff} of {} outputs differ",
                        want.len()
                    ));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Every thread shape of the mat-vec kernel (one thread per row with 32 lane
/// accumulators, teams of 8/16/32 with two rows per thread) gives the same
/// bits as the tiled kernel, at 1 and at several columns, on a row count that
/// leaves every shape a partial last workgroup and on a row length with fewer
/// units than lanes. The shape code is shared by every type (each type only
/// supplies `dq32`), so the types here cover its three paths: a float row
/// with a short tail, a 32-weight block and a 256-weight super-block; the
/// other types run the default shape in every other test.
#[test]
fn every_matvec_thread_shape_matches_the_tiled_kernel() {
    let (_turn, gpu) = common::gpu();
    let mut failures = Vec::new();
    for ty in [GgmlType::F32, GgmlType::F16, GgmlType::Q4_1, GgmlType::Q4K] {
        // A long row (more units than lanes) and a short one (fewer).
        let short = match ty.block_size() {
            1 => 575,
            32 => 32 * 18,
            _ => 256 * 2,
        };
        for cols in [cols_for(ty), short] {
            let mut rng = Rng::new(0x7ead ^ ty.id() as u64 ^ cols as u64);
            let data = common::random_weight(&mut rng, ty, ROWS, cols);
            let w = gpu.upload_weight(ty, ROWS, cols, &data).unwrap();
            for n in [1, 2, 3, 8] {
                let x = gpu.upload_f32(&rng.vec(cols * n)).unwrap();
                let want = run(gpu, MatmulKernel::Tiled, &w, &x, n);
                for shape in MatvecShape::CANDIDATES {
                    let kernel = if n == 1 {
                        MatmulKernel::MatVec
                    } else {
                        MatmulKernel::Small
                    };
                    let y = common::poisoned(gpu, ROWS * n);
                    let mut b = gpu.batch();
                    b.matmul_shaped(kernel, Some(shape), &w, &x, &y, Columns::packed(n, &w))
                        .unwrap();
                    b.submit().unwrap();
                    let got = gpu.read_u32(&y).unwrap();
                    if got != want {
                        let diff = got.iter().zip(&want).filter(|(a, b)| a != b).count();
                        failures.push(format!(
                            "{ty} K={cols} N={n} {shape:?}: {diff} of {} outputs differ",
                            want.len()
                        ));
                    }
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The tiled kernel across whole and partial tiles in both directions (its
/// tile is 64 rows × 64 columns): 129 rows (two tiles and one row) and 130
/// strided columns, for a float type with a short last unit, a legacy and a
/// grouped k-quant type; every column's bits equal the mat-vec's, and the
/// gaps between strided output columns stay untouched.
#[test]
fn tiled_tiles_across_rows_and_columns_give_the_matvec_bits() {
    let (_turn, gpu) = common::gpu();
    let (rows, n) = (129, 130);
    for (ty, cols) in [
        (GgmlType::F16, 100),
        (GgmlType::Q4_1, 32 * 35),
        (GgmlType::Q6K, 256 * 5),
    ] {
        let mut rng = Rng::new(0x711e ^ ty.id() as u64);
        let data = common::random_weight(&mut rng, ty, rows, cols);
        let w = gpu.upload_weight(ty, rows, cols, &data).unwrap();
        let x = rng.vec(cols * n);
        let want = run(
            gpu,
            MatmulKernel::MatVec,
            &w,
            &gpu.upload_f32(&x).unwrap(),
            n,
        );
        // Columns 3 apart in x after a 5-element prefix; 2 apart in y
        // after 7.
        let (xs_stride, ys_stride) = (cols + 3, rows + 2);
        let xs = common::spread_columns(&x, cols, n, 5, xs_stride);
        let xt = gpu.upload_f32(&xs).unwrap();
        let y = common::poisoned(gpu, 7 + n * ys_stride);
        let poison = gpu.read_u32(&y).unwrap()[0];
        let mut b = gpu.batch();
        let layout = Columns {
            n,
            x_offset: 5,
            x_stride: xs_stride,
            y_offset: 7,
            y_stride: ys_stride,
        };
        b.matmul_strided(MatmulKernel::Tiled, &w, &xt, &y, layout)
            .unwrap();
        b.submit().unwrap();
        let got = gpu.read_u32(&y).unwrap();
        let mut differ = 0;
        for c in 0..n {
            let at = 7 + c * ys_stride;
            let col = &got[at..at + rows];
            differ += col
                .iter()
                .zip(&want[c * rows..(c + 1) * rows])
                .filter(|(a, b)| a != b)
                .count();
            assert!(
                got[at + rows..at + ys_stride].iter().all(|&v| v == poison),
                "{ty}: the gap after column {c} was written"
            );
        }
        assert!(
            got[..7].iter().all(|&v| v == poison),
            "{ty}: the prefix was written"
        );
        assert_eq!(
            differ,
            0,
            "{ty} K={cols}: {differ} of {} outputs differ",
            rows * n
        );
    }
}
