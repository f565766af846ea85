//! Mat-vec and mat-mul for every supported type against the CPU reference
//! (`lamina_quant::dequantize`, then f64 dot products).

use super::common;

use common::Rng;
use lamina_gguf::GgmlType;
use lamina_gpu::{Columns, MatmulKernel, SUPPORTED};

/// Bound on ‖gpu − ref‖ / ‖ref‖ for the f32-accumulated kernels. The GPU
/// dequantizes to the same f32 weights as the reference (up to one rounding
/// where it fuses `q·d + m`) and sums ~1100–1300 products in f32 over 32
/// lanes; for random signs the rounding error is ≈ ε·√(K/P)·small factor,
/// about 1e-7 relative. 1e-5 leaves two orders of magnitude and still
/// catches any wrong weight, scale or index (those give errors ≥ 1e-3).
const MATMUL_REL_TOL: f64 = 1e-5;

/// Rows chosen so no kernel's row tiling divides them.
const ROWS: [usize; 2] = [37, 129];

/// Columns: several blocks, so lanes wrap and the tiled kernel takes more
/// than one step (> 32 units of 32). Float rows get a length that is not a
/// multiple of 32 (a short last unit) and is odd (F16/BF16 rows then start
/// at 2 mod 4 bytes).
fn cols_for(ty: GgmlType) -> usize {
    match ty.block_size() {
        1 => 1101,
        32 => 32 * 37,
        _ => 256 * 5,
    }
}

fn check(kernel: MatmulKernel, rows: usize, n: usize, seed: u64) {
    let (_turn, gpu) = common::gpu();
    let mut failures = Vec::new();
    for ty in SUPPORTED {
        let cols = cols_for(ty);
        let mut rng = Rng::new(seed ^ ty.id() as u64);
        let data = common::random_weight(&mut rng, ty, rows, cols);
        let x = rng.vec(cols * n);
        let want = common::reference_matmul(
            &common::dequantize(ty, &data, rows, cols),
            rows,
            cols,
            &x,
            n,
        );
        let w = gpu.upload_weight(ty, rows, cols, &data).unwrap();
        let xt = gpu.upload_f32(&x).unwrap();
        let y = common::poisoned(gpu, rows * n);
        let mut b = gpu.batch();
        b.matmul_with(kernel, &w, &xt, &y, n).unwrap();
        b.submit().unwrap();
        let got = gpu.read_f32(&y).unwrap();
        let err = common::rel_err(&got, &want);
        if !common::within(err, MATMUL_REL_TOL) {
            failures.push(format!("{ty}: relative error {err:e}"));
        }
    }
    assert!(
        failures.is_empty(),
        "{kernel:?} {rows} rows × {n} columns:\n{}",
        failures.join("\n")
    );
}

#[test]
fn matvec_matches_reference_for_every_type() {
    check(MatmulKernel::MatVec, ROWS[0], 1, 1);
}

#[test]
fn small_n_matches_reference_for_every_type() {
    check(MatmulKernel::Small, ROWS[1], 3, 2);
}

#[test]
fn tiled_matches_reference_for_every_type() {
    // 70 columns: one full 64-column tile and a partial one.
    check(MatmulKernel::Tiled, ROWS[0], 70, 3);
}

#[test]
fn strided_columns_write_only_their_slices() {
    let (_turn, gpu) = common::gpu();
    let (ty, rows) = (GgmlType::Q4K, 37);
    let cols = cols_for(ty);
    let mut rng = Rng::new(4);
    let data = common::random_weight(&mut rng, ty, rows, cols);
    let w = gpu.upload_weight(ty, rows, cols, &data).unwrap();
    let n = 3;
    let x = rng.vec(cols * n);
    let packed = {
        let xt = gpu.upload_f32(&x).unwrap();
        let y = common::poisoned(gpu, rows * n);
        let mut b = gpu.batch();
        b.matmul(&w, &xt, &y, n).unwrap();
        b.submit().unwrap();
        gpu.read_u32(&y).unwrap()
    };
    // Columns 3 apart in x after a 5-element prefix; 4 apart in y after 7.
    let layout = Columns {
        n,
        x_offset: 5,
        x_stride: cols + 3,
        y_offset: 7,
        y_stride: rows + 4,
    };
    let xs = common::spread_columns(&x, cols, n, 5, cols + 3);
    let xt = gpu.upload_f32(&xs).unwrap();
    let len = 7 + n * (rows + 4);
    for kernel in [MatmulKernel::Small, MatmulKernel::Tiled] {
        let y = common::poisoned(gpu, len);
        let mut b = gpu.batch();
        b.matmul_strided(kernel, &w, &xt, &y, layout).unwrap();
        b.submit().unwrap();
        let got = gpu.read_u32(&y).unwrap();
        for (i, v) in got.iter().enumerate() {
            let slot = i.checked_sub(7).map(|j| (j / (rows + 4), j % (rows + 4)));
            match slot {
                Some((c, r)) if r < rows => {
                    assert_eq!(*v, packed[c * rows + r], "{kernel:?} column {c} row {r}")
                }
                _ => assert!(f32::from_bits(*v).is_nan(), "{kernel:?} wrote element {i}"),
            }
        }
        // A partial read returns the same bits.
        let part = gpu.read_f32_range(&y, 7 + rows + 4, rows).unwrap();
        assert!(part
            .iter()
            .zip(&packed[rows..2 * rows])
            .all(|(a, b)| a.to_bits() == *b));
    }
    // Overlapping output columns are refused.
    let bad = Columns {
        y_stride: rows - 1,
        ..layout
    };
    let y = gpu.tensor(len).unwrap();
    assert!(gpu
        .batch()
        .matmul_strided(MatmulKernel::Auto, &w, &xt, &y, bad)
        .is_err());
}

/// The one-thread-per-row kernels share a unit's activations through
/// subgroupBroadcast where the device has subgroups; a device opened
/// `portable` (no SUBGROUP) loads them in every invocation. Both must give
/// the same bits, mat-vec and small-N (5 columns of 8: the clamped ones
/// too), GLU epilogue too. The broadcast only moves activations, whatever
/// the weight type, so a few types stand for all (a float row with a short
/// last unit among them); each pipeline compiles twice, seconds apiece on a
/// software device. (Without subgroups both sides take the portable path.)
#[test]
fn lane_broadcast_gives_the_bits_of_per_invocation_loads() {
    let (_turn, gpu) = common::gpu();
    let portable = lamina_gpu::Gpu::new(lamina_gpu::GpuOptions {
        portable: true,
        ..Default::default()
    })
    .unwrap();
    assert!(!portable.lane_broadcast());
    if gpu.adapter_info().subgroup_min_size >= 8 {
        assert!(
            gpu.lane_broadcast(),
            "subgroups of 8 or more but no broadcast"
        );
    }
    let run = |g: &lamina_gpu::Gpu, ty: GgmlType, data: &[u8], x: &[f32], n: usize, glu: bool| {
        let (rows, cols) = (ROWS[1] * 2, cols_for(ty));
        let w = g.upload_weight(ty, rows, cols, data).unwrap();
        let xt = g.upload_f32(x).unwrap();
        let out = if glu { rows / 2 } else { rows };
        let y = common::poisoned(g, out * n);
        let mut b = g.batch();
        if glu {
            let gu = common::poisoned(g, rows * n);
            b.matmul_glu(&w, &xt, &gu, &y, n, lamina_gpu::Gate::Silu)
                .unwrap();
        } else {
            b.matmul_with(MatmulKernel::Auto, &w, &xt, &y, n).unwrap();
        }
        b.submit().unwrap();
        g.read_f32(&y).unwrap()
    };
    let types = [
        GgmlType::F32,
        GgmlType::Q4_1,
        GgmlType::Q8_0,
        GgmlType::Q4K,
        GgmlType::Q6K,
    ];
    for ty in types {
        let (rows, cols) = (ROWS[1] * 2, cols_for(ty));
        let mut rng = Rng::new(0x5eed ^ ty.id() as u64);
        let data = common::random_weight(&mut rng, ty, rows, cols);
        for (n, glus) in [(1, &[false][..]), (5, &[false, true][..])] {
            let x = rng.vec(cols * n);
            for &glu in glus {
                let a = run(gpu, ty, &data, &x, n, glu);
                let b = run(&portable, ty, &data, &x, n, glu);
                let same = a.iter().zip(&b).all(|(p, q)| p.to_bits() == q.to_bits());
                assert!(same, "{ty} × {n} columns (glu {glu}): the paths differ");
            }
        }
    }
}
