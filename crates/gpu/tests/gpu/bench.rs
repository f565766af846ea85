//! Throughput report (ignored by default: it measures, it does not check).
//! Run with `cargo test -p lamina-gpu --test gpu -- --ignored --nocapture bench`.

use super::common;

use lamina_gguf::GgmlType;
use lamina_gpu::MatmulKernel;

#[test]
#[ignore]
fn bench_matvec_against_copy() {
    let (_turn, gpu) = common::gpu();
    let (rows, cols) = (4096, 4096);
    eprintln!("{}", gpu.adapter_info());
    eprintln!("mat-vec {rows}×{cols}, weight bytes per iteration:");
    for t in lamina_gpu::bench::report(gpu, rows, cols, 8).unwrap() {
        eprintln!("  {t}");
    }
    for n in [8, 64] {
        for kernel in [MatmulKernel::Small, MatmulKernel::Tiled] {
            let t =
                lamina_gpu::bench::matmul(gpu, GgmlType::Q4_0, rows, cols, n, kernel, 2).unwrap();
            eprintln!("  {t}");
        }
    }
}
