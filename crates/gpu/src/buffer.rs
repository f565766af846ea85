//! GPU buffers: f32/u32 activation tensors and quantized weights.
//!
//! A weight keeps its ggml blocks quantized: byte for byte, or for the
//! small-block types and Q6_K with each row's fields regrouped so the quants
//! are 16-byte aligned (`quant::split_fields`). A weight larger than the
//! storage binding limit is split by rows into chunks, each its own buffer
//! and binding; kernels run once per chunk over its row range. Every chunk
//! is padded by [`WEIGHT_PAD`] bytes so kernels may read the word after the
//! last block. Byte offsets inside a chunk are `u32` in the shaders, so a
//! chunk is also kept below 4 GiB.

use lamina_gguf::GgmlType;
use std::sync::atomic::Ordering::Relaxed;

use crate::device::{lock, Gpu};
use crate::error::GpuError;
use crate::quant;

/// Readback buffers a device keeps between readbacks.
const STAGING_KEPT: usize = 4;

/// Largest readback buffer kept: a step's logits (64 sequences of a
/// 262144-token vocabulary). A larger readback (a slot's saved cache) gets
/// a buffer of its own size, freed after it; [`Gpu::read_runs`] groups its
/// runs into readbacks of at most this.
pub const STAGING_KEPT_BYTES: u64 = 64 << 20;

/// Bytes after the last row of every weight chunk (see module docs).
pub const WEIGHT_PAD: u64 = 128;

/// Tensor buffers are whole multiples of this many bytes, plus one more
/// (see [`Gpu::tensor`]); also the granule of the mat-vec kernel's uniform
/// activation window.
pub const TENSOR_SLACK: u64 = 1024;

/// Upload pieces: `queue.write_buffer` stages each in its own memory, so
/// writing in bounded pieces (and letting the queue drain) bounds the staging
/// held at once.
const UPLOAD_PIECE: usize = 16 << 20;
const UPLOAD_FLUSH: usize = 256 << 20;

/// Largest scratch piece of a copy within one buffer ([`Gpu::copy_words`]):
/// a slot's layer of a long context is tens of MiB, copied in pieces.
pub const COPY_PIECE: u64 = 16 << 20;

/// Largest chunk the shaders' u32 byte arithmetic can address.
const MAX_CHUNK: u64 = (1 << 32) - 4096;

/// A buffer of `len` 32-bit values (f32 activations, or u32 ids).
#[derive(Clone, Debug)]
pub struct Tensor {
    pub(crate) buf: wgpu::Buffer,
    len: usize,
}

impl Tensor {
    /// Number of 32-bit elements.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The wgpu buffer (at least `4 * len` bytes).
    pub fn buffer(&self) -> &wgpu::Buffer {
        &self.buf
    }

    /// The first `len` values, as a tensor of their own that shares this
    /// one's buffer (kernels size their work by a tensor's length, and a
    /// bind group binds the whole buffer, so a view of a larger buffer
    /// binds like the buffer itself); `None` past the end.
    pub fn prefix(&self, len: usize) -> Option<Tensor> {
        (len <= self.len).then(|| Tensor {
            buf: self.buf.clone(),
            len,
        })
    }
}

/// One run of [`Gpu::copy_words`]: `len` elements of `src` from `src_at`
/// to `dst` from `dst_at`.
#[derive(Clone, Copy, Debug)]
pub struct WordCopy<'a> {
    pub src: &'a Tensor,
    pub src_at: usize,
    pub dst: &'a Tensor,
    pub dst_at: usize,
    pub len: usize,
}

/// One binding's worth of weight rows.
#[derive(Clone, Debug)]
pub(crate) struct WeightChunk {
    pub buf: wgpu::Buffer,
    pub first_row: u32,
    pub rows: u32,
}

/// A weight matrix of `rows × cols` in its ggml type, resident on the GPU.
#[derive(Clone, Debug)]
pub struct Weight {
    ty: GgmlType,
    rows: usize,
    cols: usize,
    row_bytes: u64,
    pub(crate) chunks: Vec<WeightChunk>,
}

impl Weight {
    pub fn ty(&self) -> GgmlType {
        self.ty
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Weights per row (the inner dimension).
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Bytes between rows on the GPU (the split layout's, for its types).
    pub fn row_bytes(&self) -> u64 {
        self.row_bytes
    }

    /// Number of buffers (bindings) the rows were split into.
    pub fn chunk_count(&self) -> usize {
        self.chunks.len()
    }

    /// Bytes of weight data (without padding).
    pub fn bytes(&self) -> u64 {
        self.row_bytes * self.rows as u64
    }
}

/// Bytes of one row of `cols` weights of `ty`, if `cols` is whole blocks.
pub fn row_bytes(ty: GgmlType, cols: usize) -> Option<u64> {
    ty.bytes_for(cols as u64)
}

impl Gpu {
    fn create_buffer(
        &self,
        what: &str,
        size: u64,
        usage: wgpu::BufferUsages,
    ) -> Result<wgpu::Buffer, GpuError> {
        let failing = &self.failing;
        let forced = failing
            .fetch_update(Relaxed, Relaxed, |n| n.checked_sub(1))
            .is_ok();
        if forced {
            return Err(GpuError::OutOfMemory {
                what: what.to_string(),
                bytes: size,
            });
        }
        if size > self.limits().max_buffer_size {
            return Err(GpuError::TooLarge {
                what: what.to_string(),
                bytes: size,
                limit: self.limits().max_buffer_size,
            });
        }
        self.scoped(what, size, || {
            self.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some(what),
                size,
                usage,
                mapped_at_creation: false,
            })
        })
    }

    /// A zero-filled tensor of `len` 32-bit elements.
    ///
    /// The buffer is rounded up to whole KiB plus one more, and may also be
    /// bound as a uniform buffer: the mat-vec kernel binds activations as a
    /// uniform array whose length is a whole KiB, from an offset aligned
    /// down to the device's uniform alignment ([`TENSOR_SLACK`]), so that
    /// range must lie inside the buffer. A tensor the slack would push past
    /// the storage binding limit (a whole prompt's logits) gets none: it
    /// can still be bound whole, and the mat-vec reads it from storage.
    pub fn tensor(&self, len: usize) -> Result<Tensor, GpuError> {
        let bytes = (len.max(1) as u64) * 4;
        let padded = bytes.div_ceil(TENSOR_SLACK) * TENSOR_SLACK + TENSOR_SLACK;
        let size = if padded <= self.binding_limit() {
            padded
        } else {
            bytes
        };
        let buf = self.create_buffer(
            "tensor",
            size,
            // INDIRECT: a kernel may write another's workgroup counts.
            wgpu::BufferUsages::STORAGE
                | wgpu::BufferUsages::UNIFORM
                | wgpu::BufferUsages::INDIRECT
                | wgpu::BufferUsages::COPY_SRC
                | wgpu::BufferUsages::COPY_DST,
        )?;
        Ok(Tensor { buf, len })
    }

    /// A tensor holding `data`.
    pub fn upload_f32(&self, data: &[f32]) -> Result<Tensor, GpuError> {
        let t = self.tensor(data.len())?;
        self.write_f32(&t, data)?;
        Ok(t)
    }

    /// A tensor holding `data` (token ids and other indices).
    pub fn upload_u32(&self, data: &[u32]) -> Result<Tensor, GpuError> {
        let t = self.tensor(data.len())?;
        self.write_bytes(&t, bytemuck::cast_slice(data))?;
        Ok(t)
    }

    /// Overwrites the first `data.len()` elements of `t`.
    pub fn write_f32(&self, t: &Tensor, data: &[f32]) -> Result<(), GpuError> {
        self.write_bytes(t, bytemuck::cast_slice(data))
    }

    /// Overwrites the first `data.len()` elements of `t` with u32 values.
    pub fn write_u32(&self, t: &Tensor, data: &[u32]) -> Result<(), GpuError> {
        self.write_bytes(t, bytemuck::cast_slice(data))
    }

    fn write_bytes(&self, t: &Tensor, bytes: &[u8]) -> Result<(), GpuError> {
        if bytes.len() > t.len * 4 {
            return Err(GpuError::Shape {
                op: "write",
                message: format!("{} elements into a tensor of {}", bytes.len() / 4, t.len),
            });
        }
        if bytes.is_empty() {
            return Ok(());
        }
        self.scoped("tensor write", bytes.len() as u64, || {
            self.queue.write_buffer(&t.buf, 0, bytes)
        })
    }

    /// Copies `t` back to the host (waits for all submitted work).
    pub fn read_f32(&self, t: &Tensor) -> Result<Vec<f32>, GpuError> {
        self.read_f32_range(t, 0, t.len)
    }

    /// Copies elements `offset .. offset + len` of `t` back to the host (for
    /// example the logits of the last token only).
    pub fn read_f32_range(
        &self,
        t: &Tensor,
        offset: usize,
        len: usize,
    ) -> Result<Vec<f32>, GpuError> {
        Ok(bytemuck::pod_collect_to_vec(
            &self.read_range(t, offset, len)?,
        ))
    }

    /// The raw bytes of 32-bit elements `offset .. offset + len` of `t`
    /// (a KV cache slot, whatever its element type).
    pub fn read_words(&self, t: &Tensor, offset: usize, len: usize) -> Result<Vec<u8>, GpuError> {
        self.read_range(t, offset, len)
    }

    /// Several runs of 32-bit elements, `(tensor, offset, len)`, as bytes
    /// in order: [`Gpu::read_words`] of each, with the runs that fit in
    /// [`STAGING_KEPT_BYTES`] together read back in one submission and one
    /// map (a KV cache slot is two runs per layer; one readback each cost
    /// a submission and a wait each). Nothing is read when a run lies
    /// outside its tensor.
    pub fn read_runs(&self, runs: &[(&Tensor, usize, usize)]) -> Result<Vec<Vec<u8>>, GpuError> {
        for &(t, offset, len) in runs {
            if offset.checked_add(len).is_none_or(|end| end > t.len) {
                return Err(GpuError::Shape {
                    op: "read",
                    message: format!("elements {offset}..+{len} of a tensor of {}", t.len),
                });
            }
        }
        let mut out = Vec::with_capacity(runs.len());
        let mut at = 0;
        while at < runs.len() {
            // The next group: as many runs as fit in one kept staging
            // buffer, or one run alone that does not.
            let mut end = at;
            let mut size = 0u64;
            while let Some(&(_, _, len)) = runs.get(end) {
                let bytes = len as u64 * 4;
                if end > at && size + bytes > STAGING_KEPT_BYTES {
                    break;
                }
                size += bytes;
                end += 1;
            }
            if size == 0 {
                out.extend((at..end).map(|_| Vec::new()));
                at = end;
                continue;
            }
            let staging = self.take_staging(size)?;
            self.submitted
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            self.scoped("tensor runs", size, || {
                let mut enc = self
                    .device
                    .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                        label: Some("readback runs"),
                    });
                let mut to = 0u64;
                for &(t, offset, len) in &runs[at..end] {
                    let bytes = len as u64 * 4;
                    if bytes > 0 {
                        enc.copy_buffer_to_buffer(&t.buf, offset as u64 * 4, &staging, to, bytes);
                    }
                    to += bytes;
                }
                self.queue.submit([enc.finish()]);
            })?;
            let data = self.map_staging(staging, size, "tensor runs")?;
            let mut from = 0usize;
            for &(_, _, len) in &runs[at..end] {
                out.push(data[from..from + len * 4].to_vec());
                from += len * 4;
            }
            at = end;
        }
        Ok(out)
    }

    /// Overwrites 32-bit elements from `offset` of `t` with `bytes` (a
    /// whole number of elements).
    pub fn write_words(&self, t: &Tensor, offset: usize, bytes: &[u8]) -> Result<(), GpuError> {
        let words = bytes.len() / 4;
        if bytes.len() % 4 != 0 || offset.checked_add(words).is_none_or(|end| end > t.len) {
            return Err(GpuError::Shape {
                op: "write",
                message: format!(
                    "{} bytes at element {offset} of a tensor of {}",
                    bytes.len(),
                    t.len
                ),
            });
        }
        if bytes.is_empty() {
            return Ok(());
        }
        self.scoped("tensor write", bytes.len() as u64, || {
            self.queue.write_buffer(&t.buf, offset as u64 * 4, bytes)
        })
    }

    /// Copies runs of 32-bit elements on the device, in order, in one
    /// submission (a KV cache slot into another, without the trip through
    /// host memory that [`Gpu::read_words`] and [`Gpu::write_words`] take).
    /// A buffer cannot be both the source and the destination of one copy,
    /// so a run within one tensor (slots that share a layer's buffer) goes
    /// through a scratch buffer of at most [`COPY_PIECE`] bytes, piece by
    /// piece; its two ranges must not overlap.
    pub fn copy_words(&self, runs: &[WordCopy<'_>]) -> Result<(), GpuError> {
        let mut piece = 0u64;
        for r in runs {
            let fits = |at: usize, t: &Tensor| at.checked_add(r.len).is_some_and(|e| e <= t.len);
            let inside = fits(r.src_at, r.src) && fits(r.dst_at, r.dst);
            let within = r.src.buf == r.dst.buf;
            // (Both ends are inside their tensors here: no overflow.)
            let overlap = inside
                && within
                && r.len > 0
                && r.src_at < r.dst_at + r.len
                && r.dst_at < r.src_at + r.len;
            if !inside || overlap {
                return Err(GpuError::Shape {
                    op: "copy",
                    message: format!(
                        "elements {}..+{} of a tensor of {} to {}.. of a tensor of {}{}",
                        r.src_at,
                        r.len,
                        r.src.len,
                        r.dst_at,
                        r.dst.len,
                        if overlap { ", overlapping" } else { "" }
                    ),
                });
            }
            if within {
                piece = piece.max((r.len as u64 * 4).min(COPY_PIECE));
            }
        }
        let scratch = if piece > 0 {
            Some(self.create_buffer(
                "copy scratch",
                piece,
                wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST,
            )?)
        } else {
            None
        };
        let bytes = runs.iter().map(|r| r.len as u64 * 4).sum();
        self.submitted
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.scoped("device copy", bytes, || {
            let mut enc = self
                .device
                .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                    label: Some("device copy"),
                });
            for r in runs.iter().filter(|r| r.len > 0) {
                let (src, dst) = (r.src_at as u64 * 4, r.dst_at as u64 * 4);
                let size = r.len as u64 * 4;
                match &scratch {
                    Some(tmp) if r.src.buf == r.dst.buf => {
                        // wgpu orders the copies of one encoder and puts a
                        // barrier between a write and a read of a buffer.
                        let mut done = 0;
                        while done < size {
                            let n = (size - done).min(tmp.size());
                            enc.copy_buffer_to_buffer(&r.src.buf, src + done, tmp, 0, n);
                            enc.copy_buffer_to_buffer(tmp, 0, &r.dst.buf, dst + done, n);
                            done += n;
                        }
                    }
                    _ => enc.copy_buffer_to_buffer(&r.src.buf, src, &r.dst.buf, dst, size),
                }
            }
            self.queue.submit([enc.finish()]);
        })
    }

    /// Copies `t` back to the host as u32 values.
    pub fn read_u32(&self, t: &Tensor) -> Result<Vec<u32>, GpuError> {
        Ok(bytemuck::pod_collect_to_vec(&self.read_range(t, 0, t.len)?))
    }

    fn read_range(&self, t: &Tensor, offset: usize, len: usize) -> Result<Vec<u8>, GpuError> {
        if offset.checked_add(len).is_none_or(|end| end > t.len) {
            return Err(GpuError::Shape {
                op: "read",
                message: format!("elements {offset}..+{len} of a tensor of {}", t.len),
            });
        }
        self.read_bytes(&t.buf, offset as u64 * 4, len as u64 * 4, "tensor")
    }

    pub(crate) fn read_bytes(
        &self,
        buf: &wgpu::Buffer,
        offset: u64,
        size: u64,
        what: &str,
    ) -> Result<Vec<u8>, GpuError> {
        if size == 0 {
            return Ok(Vec::new());
        }
        let staging = self.take_staging(size)?;
        // A submission of its own: counted with the batches'.
        self.submitted
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.scoped(what, size, || {
            let mut enc = self
                .device
                .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                    label: Some("readback"),
                });
            enc.copy_buffer_to_buffer(buf, offset, &staging, 0, size);
            self.queue.submit([enc.finish()]);
        })?;
        self.map_staging(staging, size, what)
    }

    /// Bytes of the readback buffers the device keeps between readbacks
    /// (host-visible memory it holds while idle).
    pub fn readback_bytes_kept(&self) -> u64 {
        lock(&self.staging).iter().map(wgpu::Buffer::size).sum()
    }

    /// A mappable buffer of at least `size` bytes for a readback: the
    /// smallest kept one that holds it, else a new one (a power of two up
    /// to [`STAGING_KEPT_BYTES`], so a model's few readback sizes settle on
    /// a few buffers). Give it back with [`Gpu::map_staging`].
    pub(crate) fn take_staging(&self, size: u64) -> Result<wgpu::Buffer, GpuError> {
        {
            let mut pool = lock(&self.staging);
            let best = pool
                .iter()
                .enumerate()
                .filter(|(_, b)| b.size() >= size)
                .min_by_key(|(_, b)| b.size())
                .map(|(i, _)| i);
            if let Some(i) = best {
                return Ok(pool.swap_remove(i));
            }
        }
        let rounded = if size > STAGING_KEPT_BYTES {
            size
        } else {
            size.next_power_of_two().max(4096)
        };
        self.create_buffer(
            "readback",
            rounded,
            wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        )
    }

    /// Waits for the work submitted so far (which copies into `staging`),
    /// returns the first `size` bytes of `staging` and keeps the buffer for
    /// the next readback (unless it is larger than [`STAGING_KEPT_BYTES`]).
    pub(crate) fn map_staging(
        &self,
        staging: wgpu::Buffer,
        size: u64,
        what: &str,
    ) -> Result<Vec<u8>, GpuError> {
        let data = self.map_read(&staging, size, what)?;
        if staging.size() > STAGING_KEPT_BYTES {
            return Ok(data);
        }
        let mut pool = lock(&self.staging);
        pool.push(staging);
        // A few sizes at most (a step's logits, picks, a split block's
        // inputs): past that, the smallest go.
        if pool.len() > STAGING_KEPT {
            pool.sort_by_key(|b| std::cmp::Reverse(b.size()));
            pool.truncate(STAGING_KEPT);
        }
        Ok(data)
    }

    fn map_read(&self, staging: &wgpu::Buffer, size: u64, what: &str) -> Result<Vec<u8>, GpuError> {
        let (tx, rx) = std::sync::mpsc::channel();
        staging.map_async(wgpu::MapMode::Read, ..size, move |r| {
            // The receiver outlives the wait below; a failed send cannot happen.
            let _ = tx.send(r);
        });
        self.wait()?;
        match rx.recv() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                return Err(GpuError::Readback {
                    what: what.to_string(),
                    message: e.to_string(),
                })
            }
            Err(e) => {
                return Err(GpuError::Readback {
                    what: what.to_string(),
                    message: e.to_string(),
                })
            }
        }
        let data = staging
            .get_mapped_range(..size)
            .map_err(|e| GpuError::Readback {
                what: what.to_string(),
                message: e.to_string(),
            })?
            .to_vec();
        staging.unmap();
        Ok(data)
    }

    /// Uploads a `rows × cols` weight of type `ty` from its ggml bytes (row
    /// major, `rows * row_bytes(ty, cols)` bytes, e.g. straight from a mapped
    /// GGUF file). Rows are split over several buffers when the whole would
    /// exceed [`Gpu::binding_limit`].
    pub fn upload_weight(
        &self,
        ty: GgmlType,
        rows: usize,
        cols: usize,
        data: &[u8],
    ) -> Result<Weight, GpuError> {
        self.upload_stacked(ty, cols, &[(rows, data)])
    }

    /// Uploads several weights of the same type and row length as one,
    /// their rows one after another (`parts`: rows and bytes of each): Q, K
    /// and V as one QKV matrix, gate and up as one, so one dispatch streams
    /// them all. The bytes go from each part to the GPU without a copy of
    /// the whole; only when a part ends off a 4-byte boundary do the pieces
    /// after it pass through a bounce buffer of one piece.
    pub fn upload_stacked(
        &self,
        ty: GgmlType,
        cols: usize,
        parts: &[(usize, &[u8])],
    ) -> Result<Weight, GpuError> {
        self.upload_rows(ty, cols, parts, 1)
    }

    /// Uploads a weight of several matrices of `mat_rows` rows each, their
    /// rows one after another from `parts` as [`Gpu::upload_stacked`]
    /// takes them (a block's routed experts), for
    /// [`crate::Batch::matmul_runs`]: where the whole exceeds
    /// [`Gpu::binding_limit`], its buffers split only between matrices, so
    /// each holds whole matrices and one dispatch per buffer serves the runs
    /// of its matrices. A model of hundreds of experts a block (whose
    /// gate/up stack at 8 bits can pass the 4 GiB that even a desktop GPU
    /// binds at once) runs on any device where one matrix fits a binding.
    pub fn upload_matrices(
        &self,
        ty: GgmlType,
        cols: usize,
        parts: &[(usize, &[u8])],
        mat_rows: usize,
    ) -> Result<Weight, GpuError> {
        self.upload_rows(ty, cols, parts, mat_rows)
    }

    /// [`Gpu::upload_stacked`], each buffer holding a whole multiple of
    /// `align` rows.
    fn upload_rows(
        &self,
        ty: GgmlType,
        cols: usize,
        parts: &[(usize, &[u8])],
        align: usize,
    ) -> Result<Weight, GpuError> {
        if !quant::has_kernel(ty) {
            return Err(GpuError::NoKernel {
                ty,
                op: "weight upload",
            });
        }
        let shape_err = |message: String| GpuError::Shape {
            op: "weight upload",
            message,
        };
        let row_bytes = row_bytes(ty, cols).ok_or_else(|| {
            shape_err(format!(
                "{cols} columns is not a whole number of {ty} blocks of {}",
                ty.block_size()
            ))
        })?;
        let rows = parts
            .iter()
            .try_fold(0usize, |acc, &(r, _)| acc.checked_add(r))
            .ok_or_else(|| shape_err("row count overflows".into()))?;
        if rows == 0 || cols == 0 || parts.iter().any(|&(r, _)| r == 0) {
            return Err(shape_err(format!("empty weight {rows}×{cols}")));
        }
        if align == 0 || rows % align != 0 {
            return Err(shape_err(format!(
                "{rows} rows are not a whole number of matrices of {align}"
            )));
        }
        if rows > u32::MAX as usize || cols > u32::MAX as usize {
            return Err(shape_err(format!("{rows}×{cols} exceeds u32 indexing")));
        }
        for &(r, data) in parts {
            let expected = row_bytes.checked_mul(r as u64);
            if expected != Some(data.len() as u64) {
                return Err(shape_err(format!(
                    "{r}×{cols} {ty} needs {} bytes, got {}",
                    row_bytes as u128 * r as u128,
                    data.len()
                )));
            }
        }
        // The stride of a row on the GPU: its ggml bytes, or the split
        // layout's (quant::split_fields), which rewrites each row on the way.
        let split = quant::split_fields(ty).is_some();
        let ggml_row = row_bytes;
        let row_bytes = quant::gpu_row_bytes(ty, (ggml_row / ty.type_size()) as usize) as u64;
        let limit = self.binding_limit().min(MAX_CHUNK) & !3;
        let align = align as u64;
        let rows_per_chunk = limit.saturating_sub(WEIGHT_PAD) / row_bytes / align * align;
        if rows_per_chunk == 0 {
            let what = if align == 1 {
                format!("one row of a {ty} weight")
            } else {
                format!("one {align}×{cols} {ty} matrix")
            };
            return Err(GpuError::TooLarge {
                what,
                bytes: row_bytes * align + WEIGHT_PAD,
                limit,
            });
        }
        let mut chunks = Vec::new();
        let mut first = 0u64;
        let mut since_flush = 0usize;
        while first < rows as u64 {
            let n = rows_per_chunk.min(rows as u64 - first);
            let len = n * row_bytes;
            let size = len.div_ceil(4) * 4 + WEIGHT_PAD;
            let buf = self.create_buffer(
                "weight",
                size,
                wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST,
            )?;
            let rows_here = rows_of(parts, ggml_row, first, n);
            if split {
                self.write_split(&buf, ty, rows_here, ggml_row, row_bytes, &mut since_flush)?;
            } else {
                self.write_raw(&buf, rows_here, &mut since_flush)?;
            }
            chunks.push(WeightChunk {
                buf,
                first_row: first as u32,
                rows: n as u32,
            });
            first += n;
        }
        self.queue.submit([]);
        Ok(Weight {
            ty,
            rows,
            cols,
            row_bytes,
            chunks,
        })
    }

    /// Lets the queue drain once `since_flush` bytes have been staged, which
    /// bounds the staging memory an upload holds at once.
    fn pace(&self, since_flush: &mut usize, written: usize) -> Result<(), GpuError> {
        *since_flush += written;
        if *since_flush >= UPLOAD_FLUSH {
            self.queue.submit([]);
            self.wait()?;
            *since_flush = 0;
        }
        Ok(())
    }

    /// Writes `slices` (whole rows, byte for byte) to `buf` from offset 0.
    fn write_raw<'a>(
        &self,
        buf: &wgpu::Buffer,
        slices: impl Iterator<Item = &'a [u8]>,
        since_flush: &mut usize,
    ) -> Result<(), GpuError> {
        let mut at = 0u64;
        let mut carry: Vec<u8> = Vec::new();
        for bytes in slices {
            for piece in bytes.chunks(UPLOAD_PIECE) {
                // write_buffer needs 4-byte offsets and sizes: a piece
                // that starts or ends unaligned goes through `carry`.
                if carry.is_empty() && at % 4 == 0 && piece.len() % 4 == 0 {
                    self.scoped("weight upload", piece.len() as u64, || {
                        self.queue.write_buffer(buf, at, piece);
                    })?;
                } else {
                    carry.extend_from_slice(piece);
                    let whole = carry.len() / 4 * 4;
                    let start = at - (carry.len() - piece.len()) as u64;
                    if whole > 0 && start % 4 == 0 {
                        self.scoped("weight upload", whole as u64, || {
                            self.queue.write_buffer(buf, start, &carry[..whole]);
                        })?;
                        carry.drain(..whole);
                    }
                }
                at += piece.len() as u64;
                self.pace(since_flush, piece.len())?;
            }
        }
        if !carry.is_empty() {
            let start = at - carry.len() as u64;
            carry.resize(carry.len().div_ceil(4) * 4, 0);
            self.scoped("weight upload", carry.len() as u64, || {
                self.queue.write_buffer(buf, start, &carry);
            })?;
        }
        Ok(())
    }

    /// Writes the rows in `slices` (`ggml_row` bytes each) to `buf` in the
    /// split layout of `ty` (`gpu_row` bytes each), through one bounded
    /// bounce buffer of whole rows.
    fn write_split<'a>(
        &self,
        buf: &wgpu::Buffer,
        ty: GgmlType,
        slices: impl Iterator<Item = &'a [u8]>,
        ggml_row: u64,
        gpu_row: u64,
        since_flush: &mut usize,
    ) -> Result<(), GpuError> {
        let mut bounce: Vec<u8> = Vec::new();
        let mut at = 0u64;
        let mut flush = |bounce: &mut Vec<u8>| -> Result<(), GpuError> {
            self.scoped("weight upload", bounce.len() as u64, || {
                self.queue.write_buffer(buf, at, bounce);
            })?;
            at += bounce.len() as u64;
            let written = bounce.len();
            bounce.clear();
            self.pace(since_flush, written)
        };
        for bytes in slices {
            for row in bytes.chunks_exact(ggml_row as usize) {
                quant::split_row(ty, row, &mut bounce);
                if bounce.len() + gpu_row as usize > UPLOAD_PIECE {
                    flush(&mut bounce)?;
                }
            }
        }
        if !bounce.is_empty() {
            flush(&mut bounce)?;
        }
        Ok(())
    }
}

/// The bytes of rows `first..first + n` of `parts` stacked, as slices of
/// the parts themselves.
fn rows_of<'a>(
    parts: &'a [(usize, &'a [u8])],
    row_bytes: u64,
    first: u64,
    n: u64,
) -> impl Iterator<Item = &'a [u8]> + 'a {
    let mut start = 0u64;
    parts.iter().filter_map(move |&(rows, data)| {
        let (p0, p1) = (start, start + rows as u64);
        start = p1;
        let (a, b) = (first.max(p0), (first + n).min(p1));
        (a < b).then(|| &data[((a - p0) * row_bytes) as usize..((b - p0) * row_bytes) as usize])
    })
}
