//! CPU mat-vec and mat-mul throughput over quantized blocks, beside a copy of the same
//! byte count split over the same rayon threads (the machine's limit for streaming the
//! weights once).
//!
//! Throughput is weight bytes read per call (`Throughput::Bytes`). Shapes: a square
//! 4096 × 4096 layer and SmolLM2-135M's output head, 49152 × 576 (legacy types only:
//! 576 is not a whole number of k-quant blocks).
//!
//! Run with `cargo bench -p lamina-quant --bench matvec -- --warm-up-time 1 --measurement-time 3`.

#![allow(clippy::unwrap_used)]

use std::hint::black_box;
use std::path::PathBuf;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use lamina_quant::{matmul, matvec, GgmlType};
use rayon::prelude::*;

const TYPES: [GgmlType; 6] = [
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q8_0,
    GgmlType::Q4K,
    GgmlType::Q6K,
];
const SHAPES: [(usize, usize); 2] = [(4096, 4096), (49152, 576)];
/// Columns of the mat-mul case (a short prompt chunk).
const MATMUL_N: usize = 8;

/// A deterministic xorshift64* generator.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn vec(&mut self, n: usize) -> Vec<f32> {
        (0..n)
            .map(|_| (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0)
            .collect()
    }
}

/// `rows` × `cols` weights of `ty`, each block drawn from the golden fixture blocks
/// (valid scales, so no subnormal or NaN weights skew the timing).
fn matrix(ty: GgmlType, rows: usize, cols: usize, rng: &mut Rng) -> Vec<u8> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/quant");
    let pool = std::fs::read(dir.join(format!("{}.blocks", ty.name()))).unwrap();
    let ts = ty.type_size() as usize;
    let n_pool = pool.len() / ts;
    let blocks = rows * cols / ty.block_size() as usize;
    let mut out = Vec::with_capacity(blocks * ts);
    for _ in 0..blocks {
        let b = (rng.next() % n_pool as u64) as usize;
        out.extend_from_slice(&pool[b * ts..(b + 1) * ts]);
    }
    out
}

fn bench_matvec(c: &mut Criterion) {
    let mut rng = Rng(0x5EED_BE4C);
    for (rows, cols) in SHAPES {
        let mut g = c.benchmark_group(format!("matvec/{rows}x{cols}"));
        let x = rng.vec(cols);
        let mut y = vec![0.0f32; rows];
        // The k-quants need rows of whole 256-weight blocks; 576 is not.
        for ty in TYPES
            .into_iter()
            .filter(|t| cols % t.block_size() as usize == 0)
        {
            let w = matrix(ty, rows, cols, &mut rng);
            g.throughput(Throughput::Bytes(w.len() as u64));
            // The yardstick: copying the same bytes once, one contiguous piece per thread.
            let mut dst = vec![0u8; w.len()];
            let piece = w.len().div_ceil(rayon::current_num_threads());
            g.bench_function(BenchmarkId::new("memcpy", ty.name()), |b| {
                b.iter(|| {
                    dst.par_chunks_mut(piece)
                        .zip(black_box(&w).par_chunks(piece))
                        .for_each(|(d, s)| d.copy_from_slice(s));
                    black_box(&mut dst);
                })
            });
            g.bench_function(BenchmarkId::new("matvec", ty.name()), |b| {
                b.iter(|| {
                    matvec(ty, black_box(&w), rows, cols, black_box(&x), &mut y).unwrap();
                    black_box(&mut y);
                })
            });
        }
        g.finish();
    }
}

fn bench_matmul(c: &mut Criterion) {
    let mut rng = Rng(0x5EED_BE4D);
    let (rows, cols, n) = (4096, 4096, MATMUL_N);
    let mut g = c.benchmark_group(format!("matmul/{rows}x{cols}x{n}"));
    let x = rng.vec(cols * n);
    let mut y = vec![0.0f32; rows * n];
    for ty in TYPES {
        let w = matrix(ty, rows, cols, &mut rng);
        g.throughput(Throughput::Bytes(w.len() as u64));
        g.bench_function(ty.name(), |b| {
            b.iter(|| {
                matmul(ty, black_box(&w), rows, cols, black_box(&x), n, &mut y).unwrap();
                black_box(&mut y);
            })
        });
    }
    g.finish();
}

criterion_group!(benches, bench_matvec, bench_matmul);
criterion_main!(benches);
