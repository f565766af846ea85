//! Kernel throughput on the open device, for `lamina bench`-style reports:
//! mat-vec GB/s per weight type beside a plain copy kernel's GB/s on the same
//! device (the practical ceiling). Wall-clock timing of `iters` back-to-back
//! dispatches in one submission after a warm-up run, so per-dispatch
//! overhead is included, as it is when decoding.

use std::fmt;
use std::time::Instant;

use lamina_gguf::GgmlType;

use crate::device::Gpu;
use crate::error::GpuError;
use crate::ops::MatmulKernel;

/// One measurement.
#[derive(Clone, Debug, PartialEq)]
pub struct Throughput {
    /// `copy` or the weight type's name.
    pub label: String,
    /// Bytes read per iteration (weight bytes for mat-vec; source bytes for copy).
    pub bytes_per_iter: u64,
    pub iters: u32,
    pub seconds: f64,
}

impl Throughput {
    pub fn gb_per_s(&self) -> f64 {
        self.bytes_per_iter as f64 * f64::from(self.iters) / self.seconds / 1e9
    }

    /// Microseconds per iteration.
    pub fn micros(&self) -> f64 {
        self.seconds * 1e6 / f64::from(self.iters)
    }
}

impl fmt::Display for Throughput {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:<18} {:>9.1} MiB  {:>9.1} µs  {:>7.2} GB/s",
            self.label,
            self.bytes_per_iter as f64 / (1024.0 * 1024.0),
            self.micros(),
            self.gb_per_s()
        )
    }
}

fn time(
    gpu: &Gpu,
    iters: u32,
    mut record: impl FnMut(&mut crate::Batch) -> Result<(), GpuError>,
) -> Result<f64, GpuError> {
    let mut warm = gpu.batch();
    record(&mut warm)?;
    warm.submit()?;
    gpu.wait()?;
    let mut batch = gpu.batch();
    for _ in 0..iters {
        record(&mut batch)?;
    }
    let start = Instant::now();
    batch.submit()?;
    gpu.wait()?;
    Ok(start.elapsed().as_secs_f64())
}

/// A copy kernel moving `bytes` (rounded to 16) from one buffer to another.
pub fn copy(gpu: &Gpu, bytes: u64, iters: u32) -> Result<Throughput, GpuError> {
    let words = (bytes / 16).max(1);
    let words32 = u32::try_from(words).map_err(|_| GpuError::Shape {
        op: "bench copy",
        message: format!("{bytes} bytes is too many"),
    })?;
    let src = gpu.tensor(words as usize * 4)?;
    let dst = gpu.tensor(words as usize * 4)?;
    let seconds = time(gpu, iters, |b| b.copy_words(&src.buf, &dst.buf, words32))?;
    Ok(Throughput {
        label: "copy".into(),
        bytes_per_iter: words * 16,
        iters,
        seconds,
    })
}

/// The mat-vec kernel of `ty` over a `rows × cols` weight (zero blocks; the
/// speed does not depend on the values).
pub fn matvec(
    gpu: &Gpu,
    ty: GgmlType,
    rows: usize,
    cols: usize,
    iters: u32,
) -> Result<Throughput, GpuError> {
    matmul(gpu, ty, rows, cols, 1, MatmulKernel::MatVec, iters)
}

/// `kernel` over a `rows × cols` weight of `ty` and `n` activation columns.
/// Bytes are the weight's ggml bytes, read once per iteration by the kernel.
pub fn matmul(
    gpu: &Gpu,
    ty: GgmlType,
    rows: usize,
    cols: usize,
    n: usize,
    kernel: MatmulKernel,
    iters: u32,
) -> Result<Throughput, GpuError> {
    let row_bytes = crate::buffer::row_bytes(ty, cols).ok_or_else(|| GpuError::Shape {
        op: "bench matmul",
        message: format!("{cols} columns is not whole {ty} blocks"),
    })?;
    let data = vec![0u8; row_bytes as usize * rows];
    let w = gpu.upload_weight(ty, rows, cols, &data)?;
    let x = gpu.tensor(cols * n)?;
    let y = gpu.tensor(rows * n)?;
    let seconds = time(gpu, iters, |b| b.matmul_with(kernel, &w, &x, &y, n))?;
    let label = if n == 1 {
        ty.name().to_string()
    } else {
        format!("{ty} ×{n} {kernel:?}")
    };
    Ok(Throughput {
        label,
        bytes_per_iter: data.len() as u64,
        iters,
        seconds,
    })
}

/// What a sampled step's token choice costs on the device, for `rows`
/// sequences over a `vocab`-token vocabulary and top-`k` samplers.
#[derive(Clone, Debug, PartialEq)]
pub struct Selection {
    /// `Batch::topk_rows` and `Batch::argmax_rows` over the logits, and
    /// the readback of their `2 + 2k` words a row, in one submission.
    pub device_us: f64,
    /// The readback of the logits themselves (`4·vocab` bytes a row),
    /// which the host then selects from.
    pub read_logits_us: f64,
}

/// Times [`Selection`] over logits on a coarse grid (many ties), mean of
/// `iters` runs after a warm-up.
pub fn selection(
    gpu: &Gpu,
    rows: usize,
    vocab: usize,
    k: usize,
    iters: u32,
) -> Result<Selection, GpuError> {
    let logits: Vec<f32> = (0..rows * vocab)
        .map(|i| ((i.wrapping_mul(2_654_435_761) >> 7) % 2048) as f32 / 64.0 - 16.0)
        .collect();
    let x = gpu.upload_f32(&logits)?;
    let words = crate::ops::topk_scratch_len(rows, vocab, k).max(1);
    let (s0, s1) = (gpu.tensor(words)?, gpu.tensor(words)?);
    let out = gpu.tensor(2 * k * rows)?;
    let pairs = gpu.tensor(crate::ops::argmax_scratch_len(rows, vocab).max(1))?;
    let picks = gpu.tensor(2 * rows)?;
    let select = || -> Result<(), GpuError> {
        let mut b = gpu.batch();
        b.argmax_rows(&x, rows, vocab, vocab, &pairs, &picks)?;
        b.topk_rows(&x, rows, vocab, vocab, k, [&s0, &s1], &out)?;
        b.submit_read_u32_parts(&[(&picks, 0, 2 * rows), (&out, 0, 2 * k * rows)])?;
        Ok(())
    };
    let mean = |f: &dyn Fn() -> Result<(), GpuError>| -> Result<f64, GpuError> {
        f()?;
        let t0 = Instant::now();
        for _ in 0..iters.max(1) {
            f()?;
        }
        Ok(t0.elapsed().as_secs_f64() * 1e6 / f64::from(iters.max(1)))
    };
    let device_us = mean(&select)?;
    let read_logits_us = mean(&|| gpu.read_f32(&x).map(|_| ()))?;
    Ok(Selection {
        device_us,
        read_logits_us,
    })
}

/// Copy, then mat-vec for every supported type, on a `rows × cols` weight
/// (4096 × 4096 is the customary shape).
pub fn report(
    gpu: &Gpu,
    rows: usize,
    cols: usize,
    iters: u32,
) -> Result<Vec<Throughput>, GpuError> {
    let mut out = Vec::new();
    let mut largest = 0;
    for ty in crate::quant::SUPPORTED {
        out.push(matvec(gpu, ty, rows, cols, iters)?);
        largest = largest.max(out.last().map_or(0, |t| t.bytes_per_iter));
    }
    out.insert(0, copy(gpu, largest, iters)?);
    Ok(out)
}
