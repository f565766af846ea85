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
