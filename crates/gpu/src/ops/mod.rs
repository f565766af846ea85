//! Recording kernels into a [`Batch`] and submitting them in one command
//! buffer: one compute pass, all parameters in one uniform buffer.
//!
//! * [`matmul`]: mat-vec / mat-mul per weight type and row lookup; its docs
//!   state the canonical reduction order that makes every mat-mul batch
//!   invariant.
//! * `elementwise`: RMSNorm, RoPE, softmax, attention, gated activations,
//!   add, bias rows, scale, copy, each row's argmax.
//! * `topk`: each row's best values, a top-k sampler's candidates.
//! * `fused`: the decode path's fusions: residual add + RMSNorm, RoPE + KV
//!   cache writes, per-head norms and the gated activation over stacked
//!   QKV and gate/up products.

mod delta;
mod elementwise;
mod fused;
pub mod matmul;
mod topk;

#[cfg(test)]
pub(crate) use delta::delta_specs;
pub use delta::{DeltaShape, DELTA_MAX_HEAD};
pub use elementwise::{
    argmax_scratch_len, attention_scratch_len, Attention, Rope, TokenRow, TokenTable,
    ARGMAX_MAX_LEN, ARGMAX_NONE, ATTN_CHUNK,
};
#[cfg(test)]
pub(crate) use elementwise::{attention_lanes_specs, elementwise_specs};
#[cfg(test)]
pub(crate) use fused::{f16_cache_specs, fused_specs};
pub use fused::{
    Gate, KvElem, MoeRouting, QkvLayout, KV_Q8_BLOCK, KV_Q8_WORDS, MOE_ROUTE_MAX_EXPERTS,
};
#[cfg(test)]
pub(crate) use matmul::{get_rows_spec, matvec_spec, matvec_variants, tiled_spec};
pub use matmul::{
    Columns, Fuse, MatmulKernel, MatvecShape, NormAfter, RopeOut, Runs, LANES, MAX_SMALL_COLS,
};
#[cfg(test)]
pub(crate) use topk::topk_specs;
pub use topk::{topk_scratch_len, topk_value, TOPK_MAX, TOPK_NONE};

use std::sync::Arc;

use bytemuck::Pod;

use crate::buffer::Tensor;
use crate::device::{lock, Gpu};
use crate::error::GpuError;
use crate::shader::{KernelSpec, Pipeline};

/// A buffer range bound at one binding slot.
struct Binding {
    buf: wgpu::Buffer,
    offset: u64,
    size: Option<u64>,
}

/// One recorded dispatch.
struct Dispatch {
    pipeline: Arc<Pipeline>,
    bindings: Vec<Binding>,
    params: Vec<u8>,
    groups: [u32; 3],
    /// Where a kernel wrote the workgroup counts (three words), if not
    /// `groups` (an indirect dispatch: only the device knows them).
    indirect: Option<(wgpu::Buffer, u64)>,
}

impl Dispatch {
    /// Sets the pipeline and `group` on `pass` and dispatches, with the
    /// recorded counts or the ones a kernel wrote.
    fn encode(&self, pass: &mut wgpu::ComputePass<'_>, group: &wgpu::BindGroup) {
        pass.set_pipeline(&self.pipeline.pipeline);
        pass.set_bind_group(0, group, &[]);
        match &self.indirect {
            Some((b, at)) => pass.dispatch_workgroups_indirect(b, *at),
            None => {
                let [x, y, z] = self.groups;
                pass.dispatch_workgroups(x, y, z);
            }
        }
    }
}

/// Kernels recorded for one submission. Nothing runs until [`Batch::submit`],
/// which encodes every dispatch into one compute pass, with all parameters in
/// one uniform buffer.
pub struct Batch<'g> {
    gpu: &'g Gpu,
    dispatches: Vec<Dispatch>,
    /// When recording began: [`Batch::submit`] adds the host time of the
    /// whole batch to the device's counters.
    started: std::time::Instant,
}

/// A copy a submission ends with: `size` bytes of `src` from `offset` to
/// `dst_offset` of `dst` (a readback buffer).
struct ReadbackCopy {
    src: wgpu::Buffer,
    offset: u64,
    dst: wgpu::Buffer,
    dst_offset: u64,
    size: u64,
}

/// Submissions a bind group may go unused before [`BindCache`] drops it
/// (and with it its hold on the buffers it binds).
const BIND_GROUP_TTL: u64 = 4;

/// What one dispatch binds: its pipeline, its buffer ranges and the range of
/// the parameters in the uniform buffer.
#[derive(PartialEq, Eq, Hash)]
struct BindKey {
    pipeline: usize,
    bindings: Vec<(wgpu::Buffer, u64, Option<u64>)>,
    params: (u64, u64),
}

/// The host side of submissions, kept across them: one uniform buffer for
/// every batch's parameters (grown when a batch needs more) and the bind
/// groups of recent submissions. A decode step records the same dispatches
/// over the same buffers as the step before, with only the parameters'
/// values changed, so in steady state it makes no bind group and no buffer:
/// both cost host time per dispatch that a small model on a fast GPU would
/// otherwise spend waiting on the host.
#[derive(Default)]
pub(crate) struct BindCache {
    uniforms: Option<wgpu::Buffer>,
    groups: std::collections::HashMap<BindKey, (wgpu::BindGroup, u64)>,
    submission: u64,
    pub(crate) made: u64,
    pub(crate) reused: u64,
    pub(crate) host_ns: u64,
}

pub(crate) fn shape(op: &'static str, message: String) -> GpuError {
    GpuError::Shape { op, message }
}

pub(crate) fn to_u32(op: &'static str, what: &str, v: usize) -> Result<u32, GpuError> {
    u32::try_from(v).map_err(|_| shape(op, format!("{what} = {v} exceeds u32")))
}

impl Gpu {
    /// An empty batch of kernels.
    pub fn batch(&self) -> Batch<'_> {
        Batch {
            gpu: self,
            dispatches: Vec::new(),
            started: std::time::Instant::now(),
        }
    }

    /// Splits `n` workgroups over x and y so neither exceeds the device's
    /// per-dimension limit; kernels linearise `wid.x + wid.y * nwg.x` and skip
    /// the excess.
    pub(crate) fn grid(&self, n: u32) -> (u32, u32) {
        let max = self.limits().max_compute_workgroups_per_dimension.max(1);
        if n <= max {
            return (n.max(1), 1);
        }
        let y = n.div_ceil(max);
        (n.div_ceil(y), y)
    }
}

impl<'g> Batch<'g> {
    pub(crate) fn push<P: Pod>(
        &mut self,
        spec: &KernelSpec,
        buffers: &[(&wgpu::Buffer, Option<u64>)],
        params: &P,
        groups: [u32; 3],
    ) -> Result<(), GpuError> {
        let ranges: Vec<_> = buffers.iter().map(|&(b, size)| (b, 0, size)).collect();
        self.push_ranges(spec, &ranges, params, groups)
    }

    /// [`Batch::push`] with each buffer bound from a byte offset.
    pub(crate) fn push_ranges<P: Pod>(
        &mut self,
        spec: &KernelSpec,
        buffers: &[(&wgpu::Buffer, u64, Option<u64>)],
        params: &P,
        groups: [u32; 3],
    ) -> Result<(), GpuError> {
        let pipeline = self.gpu.pipeline(spec)?;
        self.dispatches.push(Dispatch {
            pipeline,
            bindings: buffers
                .iter()
                .map(|&(b, offset, size)| Binding {
                    buf: b.clone(),
                    offset,
                    size,
                })
                .collect(),
            params: bytemuck::bytes_of(params).to_vec(),
            groups,
            indirect: None,
        });
        Ok(())
    }

    /// [`Batch::push_ranges`] with the workgroup counts read from three
    /// words of `args` from word `at` when the dispatch runs (written by an
    /// earlier kernel of the batch); `groups` is what the host checked as
    /// the most they can be.
    pub(crate) fn push_ranges_indirect<P: Pod>(
        &mut self,
        spec: &KernelSpec,
        buffers: &[(&wgpu::Buffer, u64, Option<u64>)],
        params: &P,
        groups: [u32; 3],
        args: &Tensor,
        at: usize,
    ) -> Result<(), GpuError> {
        self.push_ranges(spec, buffers, params, groups)?;
        if let Some(d) = self.dispatches.last_mut() {
            d.indirect = Some((args.buf.clone(), at as u64 * 4));
        }
        Ok(())
    }

    pub(crate) fn check_binding(&self, op: &'static str, t: &Tensor) -> Result<(), GpuError> {
        let bytes = t.len() as u64 * 4;
        let limit = self.gpu.limits().max_storage_buffer_binding_size;
        if bytes > limit {
            return Err(GpuError::TooLarge {
                what: format!("{op} activation tensor"),
                bytes,
                limit,
            });
        }
        Ok(())
    }

    pub(crate) fn distinct(
        op: &'static str,
        out: &Tensor,
        ins: &[&Tensor],
    ) -> Result<(), GpuError> {
        if ins.iter().any(|t| t.buf == out.buf) {
            return Err(shape(op, "the output must not be one of the inputs".into()));
        }
        Ok(())
    }

    /// The device this batch records for.
    pub fn gpu(&self) -> &Gpu {
        self.gpu
    }

    /// Number of dispatches recorded so far.
    pub fn len(&self) -> usize {
        self.dispatches.len()
    }

    pub fn is_empty(&self) -> bool {
        self.dispatches.is_empty()
    }

    /// Encodes every recorded dispatch into one compute pass and submits it.
    /// Returns once submitted; [`Gpu::wait`] or a read blocks until done.
    pub fn submit(self) -> Result<(), GpuError> {
        self.submit_copying(&[])
    }

    /// [`Batch::submit`], then elements `offset .. offset + len` of `t`
    /// back to the host as f32 values, copied in the same submission (a
    /// step's logits or hidden states: one submission and one wait a step,
    /// into a readback buffer the device keeps).
    pub fn submit_read_f32(
        self,
        t: &Tensor,
        offset: usize,
        len: usize,
    ) -> Result<Vec<f32>, GpuError> {
        Ok(bytemuck::pod_collect_to_vec(
            &self.submit_read(t, offset, len)?,
        ))
    }

    /// [`Batch::submit_read_f32`] for u32 values (a step's picks).
    pub fn submit_read_u32(
        self,
        t: &Tensor,
        offset: usize,
        len: usize,
    ) -> Result<Vec<u32>, GpuError> {
        Ok(bytemuck::pod_collect_to_vec(
            &self.submit_read(t, offset, len)?,
        ))
    }

    /// [`Batch::submit_read_u32`] for several ranges, each of its own
    /// tensor, copied into one readback buffer in the same submission (a
    /// step's candidates and its greedy picks).
    pub fn submit_read_u32_parts(
        self,
        parts: &[(&Tensor, usize, usize)],
    ) -> Result<Vec<Vec<u32>>, GpuError> {
        let bytes = self.submit_read_ranges(parts)?;
        let mut out = Vec::with_capacity(parts.len());
        let mut at = 0;
        for &(_, _, len) in parts {
            out.push(bytemuck::pod_collect_to_vec(&bytes[at..at + 4 * len]));
            at += 4 * len;
        }
        Ok(out)
    }

    fn submit_read(self, t: &Tensor, offset: usize, len: usize) -> Result<Vec<u8>, GpuError> {
        self.submit_read_ranges(&[(t, offset, len)])
    }

    /// The bytes of every range, one after another.
    fn submit_read_ranges(self, parts: &[(&Tensor, usize, usize)]) -> Result<Vec<u8>, GpuError> {
        for &(t, offset, len) in parts {
            if offset.checked_add(len).is_none_or(|end| end > t.len()) {
                return Err(GpuError::Shape {
                    op: "read",
                    message: format!("elements {offset}..+{len} of a tensor of {}", t.len()),
                });
            }
        }
        let gpu = self.gpu;
        // No kernels: the plain readbacks, a copy each.
        if self.dispatches.is_empty() {
            let mut out = Vec::new();
            for &(t, offset, len) in parts {
                out.extend(gpu.read_bytes(&t.buf, offset as u64 * 4, len as u64 * 4, "tensor")?);
            }
            return Ok(out);
        }
        let size: u64 = parts.iter().map(|&(_, _, len)| len as u64 * 4).sum();
        if size == 0 {
            self.submit()?;
            return Ok(Vec::new());
        }
        let staging = gpu.take_staging(size)?;
        let mut copies = Vec::with_capacity(parts.len());
        let mut at = 0;
        for &(t, offset, len) in parts {
            copies.push(ReadbackCopy {
                src: t.buf.clone(),
                offset: offset as u64 * 4,
                dst: staging.clone(),
                dst_offset: at,
                size: len as u64 * 4,
            });
            at += len as u64 * 4;
        }
        // A failed submission returns nothing to map: the buffer is dropped.
        self.submit_copying(&copies)?;
        gpu.map_staging(staging, size, "tensor")
    }

    /// Encodes the dispatches (and then `copies`, in the same command
    /// buffer) and submits them; nothing without dispatches (a readback
    /// alone goes through `Gpu::read_bytes`).
    fn submit_copying(self, copies: &[ReadbackCopy]) -> Result<(), GpuError> {
        let gpu = self.gpu;
        if self.dispatches.is_empty() {
            return Ok(());
        }
        {
            use std::sync::atomic::Ordering::Relaxed;
            gpu.dispatched
                .fetch_add(self.dispatches.len() as u64, Relaxed);
            gpu.submitted.fetch_add(1, Relaxed);
        }
        let align = u64::from(gpu.limits().min_uniform_buffer_offset_alignment.max(16));
        let mut offsets = Vec::with_capacity(self.dispatches.len());
        let mut blob: Vec<u8> = Vec::new();
        for d in &self.dispatches {
            let at = (blob.len() as u64).div_ceil(align) * align;
            blob.resize(at as usize, 0);
            offsets.push(at);
            blob.extend_from_slice(&d.params);
        }
        // Held until the work is submitted: the uniform buffer is shared by
        // every batch, and queue order keeps this write after the previous
        // submission's reads and before this one's.
        let mut cache = lock(&gpu.binds);
        let need = blob.len() as u64;
        if cache.uniforms.as_ref().is_none_or(|u| u.size() < need) {
            let size = need.next_power_of_two().max(4096);
            let buf = gpu.scoped("kernel parameters", size, || {
                gpu.device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some("params"),
                    size,
                    usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
                    mapped_at_creation: false,
                })
            })?;
            // Every cached group binds the old buffer.
            cache.groups.clear();
            cache.uniforms = Some(buf);
        }
        let Some(uniforms) = cache.uniforms.clone() else {
            return Err(GpuError::Validation {
                what: "kernel parameters".into(),
                message: "no parameter buffer".into(),
            });
        };
        gpu.queue.write_buffer(&uniforms, 0, &blob);
        cache.submission += 1;
        let now = cache.submission;
        let cache = &mut *cache;
        let started = self.started;
        let result = gpu.scoped("kernel dispatch", 0, || {
            let mut enc = gpu
                .device
                .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                    label: Some("batch"),
                });
            {
                let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
                    label: Some("batch"),
                    timestamp_writes: None,
                });
                for (d, &offset) in self.dispatches.iter().zip(&offsets) {
                    let key = BindKey {
                        pipeline: Arc::as_ptr(&d.pipeline) as usize,
                        bindings: d
                            .bindings
                            .iter()
                            .map(|b| (b.buf.clone(), b.offset, b.size))
                            .collect(),
                        params: (offset, d.params.len() as u64),
                    };
                    let group = match cache.groups.get_mut(&key) {
                        Some((group, used)) => {
                            *used = now;
                            cache.reused += 1;
                            group.clone()
                        }
                        None => {
                            let group = make_bind_group(gpu, d, &uniforms, offset);
                            cache.made += 1;
                            cache.groups.insert(key, (group.clone(), now));
                            group
                        }
                    };
                    if let Some(profile) = &gpu.profile {
                        let mut one =
                            gpu.device
                                .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                                    label: Some("profiled"),
                                });
                        {
                            let mut p = one.begin_compute_pass(&wgpu::ComputePassDescriptor {
                                label: Some("profiled"),
                                timestamp_writes: None,
                            });
                            d.encode(&mut p, &group);
                        }
                        let t = std::time::Instant::now();
                        gpu.queue.submit([one.finish()]);
                        let _ = gpu.device.poll(wgpu::PollType::wait_indefinitely());
                        let mut map = lock(profile);
                        let e = map.entry(d.pipeline.name.clone()).or_default();
                        e.0 += 1;
                        e.1 += t.elapsed().as_secs_f64();
                        continue;
                    }
                    d.encode(&mut pass, &group);
                }
            }
            for c in copies {
                if c.size > 0 {
                    enc.copy_buffer_to_buffer(&c.src, c.offset, &c.dst, c.dst_offset, c.size);
                }
            }
            gpu.queue.submit([enc.finish()]);
        });
        cache
            .groups
            .retain(|_, (_, used)| now - *used < BIND_GROUP_TTL);
        cache.host_ns += started.elapsed().as_nanos() as u64;
        result
    }
}

/// The bind group of dispatch `d`: its buffers, then its parameters at
/// `offset` of `uniforms`.
fn make_bind_group(
    gpu: &Gpu,
    d: &Dispatch,
    uniforms: &wgpu::Buffer,
    offset: u64,
) -> wgpu::BindGroup {
    let mut entries: Vec<wgpu::BindGroupEntry> = d
        .bindings
        .iter()
        .enumerate()
        .map(|(i, b)| wgpu::BindGroupEntry {
            binding: i as u32,
            resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                buffer: &b.buf,
                offset: b.offset,
                size: b.size.and_then(wgpu::BufferSize::new),
            }),
        })
        .collect();
    entries.push(wgpu::BindGroupEntry {
        binding: d.bindings.len() as u32,
        resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
            buffer: uniforms,
            offset,
            size: wgpu::BufferSize::new(d.params.len() as u64),
        }),
    });
    gpu.device.create_bind_group(&wgpu::BindGroupDescriptor {
        label: None,
        layout: &d.pipeline.layout,
        entries: &entries,
    })
}
