//! Weights larger than the storage binding limit are split by rows; the
//! result must be bit-identical to the unsplit run.

use super::common;

use common::Rng;
use lamina_gguf::GgmlType;
use lamina_gpu::{Gpu, GpuOptions, MatmulKernel, Weight};

const FORCED_LIMIT: u64 = 1 << 20;

fn outputs(gpu: &Gpu, w: &Weight, x: &[f32], ids: &[u32]) -> Vec<Vec<u32>> {
    let xt = gpu.upload_f32(x).unwrap();
    let mut out = Vec::new();
    for (kernel, n) in [
        (MatmulKernel::MatVec, 1),
        (MatmulKernel::Small, 5),
        (MatmulKernel::Tiled, 70),
    ] {
        let y = common::poisoned(gpu, w.rows() * n);
        let mut b = gpu.batch();
        b.matmul_with(kernel, w, &xt, &y, n).unwrap();
        b.submit().unwrap();
        out.push(gpu.read_u32(&y).unwrap());
    }
    let idt = gpu.upload_u32(ids).unwrap();
    let y = common::poisoned(gpu, ids.len() * w.cols());
    let mut b = gpu.batch();
    b.get_rows(w, &idt, &y).unwrap();
    b.submit().unwrap();
    out.push(gpu.read_u32(&y).unwrap());
    out
}

#[test]
fn split_weights_give_bit_identical_results() {
    let (_turn, gpu) = common::gpu();
    let small = Gpu::new(GpuOptions {
        max_storage_buffer_binding_size: Some(FORCED_LIMIT),
        ..GpuOptions::default()
    })
    .unwrap();
    assert_eq!(small.binding_limit(), FORCED_LIMIT);
    // F16 with odd rows (unaligned row starts), a legacy and a k-quant type,
    // MXFP4 with odd-length ggml rows (255 blocks of 17 bytes), which the
    // stacked upload below then cuts at an odd byte, and a lattice type read
    // in place with rows starting at 2 mod 4 (17 blocks of 66 bytes).
    for (ty, rows, cols) in [
        (GgmlType::F16, 300, 2049),
        (GgmlType::Q4_0, 301, 8192),
        (GgmlType::Q6K, 403, 4096),
        (GgmlType::MXFP4, 301, 32 * 255),
        (GgmlType::IQ2XXS, 1001, 256 * 17),
    ] {
        let mut rng = Rng::new(0x5b1 ^ ty.id() as u64);
        let data = common::random_weight(&mut rng, ty, rows, cols);
        let x = rng.vec(cols * 70);
        let ids: Vec<u32> = vec![0, rows as u32 - 1, 150, 299, 226, 227, 1];
        let whole = gpu.upload_weight(ty, rows, cols, &data).unwrap();
        let split = small.upload_weight(ty, rows, cols, &data).unwrap();
        assert_eq!(whole.chunk_count(), 1);
        assert!(
            split.chunk_count() >= 2,
            "{ty}: {} chunk(s)",
            split.chunk_count()
        );
        // The same rows uploaded as a stack of two parts, the first ending
        // off a 4-byte boundary for F16 (101 rows of 4098 bytes).
        let rb = data.len() / rows;
        let stacked = small
            .upload_stacked(
                ty,
                cols,
                &[(101, &data[..101 * rb]), (rows - 101, &data[101 * rb..])],
            )
            .unwrap();
        let a = outputs(gpu, &whole, &x, &ids);
        let b = outputs(&small, &split, &x, &ids);
        let c = outputs(&small, &stacked, &x, &ids);
        for (i, ((a, b), c)) in a.iter().zip(&b).zip(&c).enumerate() {
            assert!(
                a.iter().all(|v| !f32::from_bits(*v).is_nan()),
                "{ty} output {i}: NaN"
            );
            assert!(a == b, "{ty} output {i}: split result differs");
            assert!(a == c, "{ty} output {i}: stacked split result differs");
        }
    }
}

#[test]
fn a_row_larger_than_the_limit_is_an_error() {
    let (_turn, _gpu) = common::gpu();
    let small = Gpu::new(GpuOptions {
        max_storage_buffer_binding_size: Some(4096),
        ..GpuOptions::default()
    })
    .unwrap();
    let err = small
        .upload_weight(GgmlType::F32, 2, 2048, &vec![0u8; 2 * 2048 * 4])
        .unwrap_err();
    assert!(
        matches!(err, lamina_gpu::GpuError::TooLarge { .. }),
        "{err}"
    );
}
