//! Recording kernels into a [`Batch`] and submitting them in one command
//! buffer.
//!
//! # Canonical reduction order (batch invariance)
//!
//! Column `j` of an N-column product `Y = W·X` is bit-identical to the
//! 1-column product `W·x_j`, for every N and every kernel variant (mat-vec,
//! small-N, tiled), because all of them compute each output `y[r]` with the
//! same sequence of f32 operations:
//!
//! 1. The row is cut into *units* of 32 consecutive weights (every supported
//!    block holds 1, 32 or 256 weights, so units never straddle blocks in an
//!    awkward way; a float row whose length is not a multiple of 32 ends in a
//!    short unit). Each weight is dequantized to f32 by the type's `dq16`
//!    (`shaders/quant/*.wgsl`), and the unit's partial is
//!    `s = 0; for j ascending: s = fma(w_j, x_j, s)` (`shaders/common/unit_dot.wgsl`).
//! 2. There are `P = 32` lanes. Lane `l` sums the partials of units
//!    `l, l+P, l+2P, …` in increasing order: `acc = 0; acc = acc + s_u`.
//! 3. The lanes are combined by a fixed tree: `v[l] = v[l] + v[l+s]` for
//!    `s = 16, 8, 4, 2, 1`; the output is `v[0]`.
//!
//! The mat-vec kernel gives each row P threads (one per lane); the small-N
//! kernel is the same kernel with N accumulators per thread; the tiled kernel
//! gives each thread one lane for a 4-row × 8-column block of outputs and
//! walks the row P units at a time, so the dequantized weights of a step are
//! shared by 64 columns while every output still sees exactly steps 1–3. All
//! multiply-adds are explicit `fma`, so no compiler contraction choice can
//! differ between kernels. Splitting a weight over several bindings changes
//! only which dispatch computes a row, never the order within it.

use bytemuck::Pod;
use lamina_gguf::GgmlType;

use crate::buffer::{Tensor, Weight};
use crate::device::Gpu;
use crate::error::GpuError;
use crate::params::{EltParams, MatParams, NormParams, RopeParams, RowsParams, SoftmaxParams};
use crate::quant;
use crate::shader::{KernelSpec, Pipeline};

use std::sync::Arc;

/// Most activation columns the small-N kernel handles in one dispatch.
pub const MAX_SMALL_COLS: usize = 8;
/// Lanes per output (P above).
pub const LANES: usize = 32;
const MATVEC_ROWS_PER_WG: u32 = 256 / LANES as u32;
const TILED_ROWS: u32 = 4;
const TILED_COLS: u32 = 64;
const ELT_WG: u32 = 256;

/// Which mat-mul kernel to run. All give bit-identical results.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MatmulKernel {
    /// Mat-vec for one column, small-N up to 8, tiled beyond.
    Auto,
    /// One mat-vec dispatch per column.
    MatVec,
    /// Small-N dispatches of up to 8 columns each.
    Small,
    /// The tiled kernel for any number of columns.
    Tiled,
}

/// The activation columns of a mat-mul: column `c` is read from
/// `x[x_offset + c·x_stride ..][..k]` and written to
/// `y[y_offset + c·y_stride ..][..rows]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Columns {
    pub n: usize,
    pub x_offset: usize,
    pub x_stride: usize,
    pub y_offset: usize,
    pub y_stride: usize,
}

impl Columns {
    /// `n` columns stored one after another in both `x` and `y`.
    pub fn packed(n: usize, w: &Weight) -> Self {
        Columns {
            n,
            x_offset: 0,
            x_stride: w.cols(),
            y_offset: 0,
            y_stride: w.rows(),
        }
    }
}

/// Rotary embedding settings for [`Batch::rope`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Rope {
    pub head_dim: usize,
    /// Leading dimensions of each head that rotate (`rope.dimension_count`).
    pub n_rot: usize,
    pub n_heads: usize,
    /// Position of the first token; token t is at `pos_offset + t`.
    pub pos_offset: u32,
    pub freq_base: f32,
    /// NeoX pair ordering (`x[i]`, `x[i + n_rot/2]`) instead of (`x[2i]`, `x[2i+1]`).
    pub neox: bool,
}

pub(crate) fn type_file(ty: GgmlType, op: &'static str) -> Result<&'static str, GpuError> {
    quant::shader_file(ty).ok_or(GpuError::NoKernel { ty, op })
}

/// The mat-vec kernel (`maxc` 1) or the small-N kernel (`maxc` 8, any
/// column count up to 8 chosen at run time).
pub(crate) fn matvec_spec(ty: GgmlType, maxc: usize) -> KernelSpec {
    KernelSpec::new("matvec.wgsl")
        .def("TYPE", quant::shader_file(ty).unwrap_or("none"))
        .def("MAXC", maxc.to_string())
}

pub(crate) fn tiled_spec(ty: GgmlType) -> KernelSpec {
    KernelSpec::new("matmul_tiled.wgsl").def("TYPE", quant::shader_file(ty).unwrap_or("none"))
}

pub(crate) fn get_rows_spec(ty: GgmlType) -> KernelSpec {
    KernelSpec::new("get_rows.wgsl").def("TYPE", quant::shader_file(ty).unwrap_or("none"))
}

fn glu_spec(act: &str) -> KernelSpec {
    KernelSpec::new("glu.wgsl").def("ACT", act)
}

fn binary_spec(op: &str) -> KernelSpec {
    KernelSpec::new("binary.wgsl").def("OP", op)
}

#[cfg(test)]
pub(crate) fn elementwise_specs() -> Vec<KernelSpec> {
    vec![
        KernelSpec::new("rms_norm.wgsl"),
        KernelSpec::new("rope.wgsl"),
        KernelSpec::new("softmax.wgsl"),
        glu_spec("silu"),
        glu_spec("gelu_tanh"),
        binary_spec("+"),
        binary_spec("*"),
        KernelSpec::new("scale.wgsl"),
        KernelSpec::new("copy.wgsl"),
    ]
}

/// A buffer range bound at one binding slot.
struct Binding {
    buf: wgpu::Buffer,
    size: Option<u64>,
}

/// One recorded dispatch.
struct Dispatch {
    pipeline: Arc<Pipeline>,
    bindings: Vec<Binding>,
    params: Vec<u8>,
    groups: [u32; 3],
}

/// Kernels recorded for one submission. Nothing runs until [`Batch::submit`],
/// which encodes every dispatch into one compute pass, with all parameters in
/// one uniform buffer.
pub struct Batch<'g> {
    gpu: &'g Gpu,
    dispatches: Vec<Dispatch>,
}

fn shape(op: &'static str, message: String) -> GpuError {
    GpuError::Shape { op, message }
}

fn to_u32(op: &'static str, what: &str, v: usize) -> Result<u32, GpuError> {
    u32::try_from(v).map_err(|_| shape(op, format!("{what} = {v} exceeds u32")))
}

impl Gpu {
    /// An empty batch of kernels.
    pub fn batch(&self) -> Batch<'_> {
        Batch {
            gpu: self,
            dispatches: Vec::new(),
        }
    }

    /// Splits `n` workgroups over x and y so neither exceeds the device's
    /// per-dimension limit; kernels linearise `wid.x + wid.y * nwg.x` and skip
    /// the excess.
    fn grid(&self, n: u32) -> (u32, u32) {
        let max = self.limits().max_compute_workgroups_per_dimension.max(1);
        if n <= max {
            return (n.max(1), 1);
        }
        let y = n.div_ceil(max);
        (n.div_ceil(y), y)
    }
}

impl<'g> Batch<'g> {
    fn push<P: Pod>(
        &mut self,
        spec: &KernelSpec,
        buffers: &[(&wgpu::Buffer, Option<u64>)],
        params: &P,
        groups: [u32; 3],
    ) -> Result<(), GpuError> {
        let pipeline = self.gpu.pipeline(spec)?;
        self.dispatches.push(Dispatch {
            pipeline,
            bindings: buffers
                .iter()
                .map(|(b, size)| Binding {
                    buf: (*b).clone(),
                    size: *size,
                })
                .collect(),
            params: bytemuck::bytes_of(params).to_vec(),
            groups,
        });
        Ok(())
    }

    fn check_binding(&self, op: &'static str, t: &Tensor) -> Result<(), GpuError> {
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

    fn distinct(op: &'static str, out: &Tensor, ins: &[&Tensor]) -> Result<(), GpuError> {
        if ins.iter().any(|t| t.buf == out.buf) {
            return Err(shape(op, "the output must not be one of the inputs".into()));
        }
        Ok(())
    }

    /// `y[c] = w · x[c]` for `n` columns: `x` holds `n` vectors of `w.cols()`
    /// values one after another, `y` receives `n` vectors of `w.rows()`.
    pub fn matmul(&mut self, w: &Weight, x: &Tensor, y: &Tensor, n: usize) -> Result<(), GpuError> {
        self.matmul_with(MatmulKernel::Auto, w, x, y, n)
    }

    /// [`Batch::matmul`] with a chosen kernel (benchmarks and invariance tests).
    pub fn matmul_with(
        &mut self,
        kernel: MatmulKernel,
        w: &Weight,
        x: &Tensor,
        y: &Tensor,
        n: usize,
    ) -> Result<(), GpuError> {
        self.matmul_strided(kernel, w, x, y, Columns::packed(n, w))
    }

    /// The general mat-mul: `y[y_offset + c·y_stride + r] = Σ_k w[r][k] ·
    /// x[x_offset + c·x_stride + k]` for `c < cols.n` (e.g. to write a
    /// projection straight into a slice of a larger buffer).
    pub fn matmul_strided(
        &mut self,
        kernel: MatmulKernel,
        w: &Weight,
        x: &Tensor,
        y: &Tensor,
        cols: Columns,
    ) -> Result<(), GpuError> {
        const OP: &str = "matmul";
        type_file(w.ty(), OP)?;
        let n = cols.n;
        if n == 0 {
            return Ok(());
        }
        let (k, rows) = (w.cols(), w.rows());
        let end = |offset: usize, stride: usize, len: usize| {
            offset
                .saturating_add((n - 1).saturating_mul(stride))
                .saturating_add(len)
        };
        let x_end = end(cols.x_offset, cols.x_stride, k);
        let y_end = end(cols.y_offset, cols.y_stride, rows);
        if x_end > x.len() || y_end > y.len() || (n > 1 && cols.y_stride < rows) {
            return Err(shape(
                OP,
                format!(
                    "{rows}×{k} weight with {cols:?} needs x ≥ {x_end} and y ≥ {y_end} elements \
                     and y_stride ≥ {rows}, got x {} and y {}",
                    x.len(),
                    y.len()
                ),
            ));
        }
        Self::distinct(OP, y, &[x])?;
        self.check_binding(OP, x)?;
        self.check_binding(OP, y)?;
        to_u32(OP, "x elements", x_end)?;
        to_u32(OP, "y elements", y_end)?;
        let kernel = match kernel {
            MatmulKernel::Auto if n == 1 => MatmulKernel::MatVec,
            MatmulKernel::Auto if n <= MAX_SMALL_COLS => MatmulKernel::Small,
            MatmulKernel::Auto => MatmulKernel::Tiled,
            other => other,
        };
        let per = match kernel {
            MatmulKernel::MatVec => 1,
            MatmulKernel::Small => MAX_SMALL_COLS,
            _ => n,
        };
        let mut c0 = 0;
        while c0 < n {
            let nc = per.min(n - c0);
            for chunk in &w.chunks {
                let params = MatParams {
                    rows: chunk.rows,
                    k: k as u32,
                    row_bytes: w.row_bytes() as u32,
                    ncols: nc as u32,
                    row_offset: chunk.first_row,
                    x_offset: (cols.x_offset + c0 * cols.x_stride) as u32,
                    x_stride: cols.x_stride as u32,
                    y_offset: (cols.y_offset + c0 * cols.y_stride) as u32,
                    y_stride: cols.y_stride as u32,
                    _pad: [0; 3],
                };
                let buffers = [(&chunk.buf, None), (&x.buf, None), (&y.buf, None)];
                if kernel == MatmulKernel::Tiled {
                    let (gx, gy) = self.gpu.grid(chunk.rows.div_ceil(TILED_ROWS));
                    let gz = (nc as u32).div_ceil(TILED_COLS);
                    self.push(&tiled_spec(w.ty()), &buffers, &params, [gx, gy, gz])?;
                } else {
                    let (gx, gy) = self.gpu.grid(chunk.rows.div_ceil(MATVEC_ROWS_PER_WG));
                    let maxc = if nc == 1 { 1 } else { MAX_SMALL_COLS };
                    self.push(&matvec_spec(w.ty(), maxc), &buffers, &params, [gx, gy, 1])?;
                }
            }
            c0 += nc;
        }
        Ok(())
    }

    /// Row lookup: `y[i] = w[ids[i]]` dequantized to f32 (`w.cols()` values each).
    /// Ids outside `0..w.rows()` leave their output row untouched.
    pub fn get_rows(&mut self, w: &Weight, ids: &Tensor, y: &Tensor) -> Result<(), GpuError> {
        const OP: &str = "get_rows";
        type_file(w.ty(), OP)?;
        let n = ids.len();
        if n == 0 {
            return Ok(());
        }
        let k = w.cols();
        if y.len() < n * k {
            return Err(shape(
                OP,
                format!(
                    "{n} rows of {k} need y ≥ {} elements, got {}",
                    n * k,
                    y.len()
                ),
            ));
        }
        Self::distinct(OP, y, &[ids])?;
        self.check_binding(OP, y)?;
        to_u32(OP, "y elements", n * k)?;
        let groups_x = (k as u32).div_ceil(16).div_ceil(64);
        let n = n as u32;
        for chunk in &w.chunks {
            let params = RowsParams {
                k: k as u32,
                row_bytes: w.row_bytes() as u32,
                row_start: chunk.first_row,
                rows: chunk.rows,
                n_ids: n,
                _pad: [0; 3],
            };
            self.push(
                &get_rows_spec(w.ty()),
                &[(&chunk.buf, None), (&ids.buf, None), (&y.buf, None)],
                &params,
                [groups_x, n.min(65535), n.div_ceil(65535)],
            )?;
        }
        Ok(())
    }

    /// RMSNorm of each `dim`-row of `x`, times `weight` (length `dim`).
    pub fn rms_norm(
        &mut self,
        x: &Tensor,
        weight: &Tensor,
        y: &Tensor,
        dim: usize,
        eps: f32,
    ) -> Result<(), GpuError> {
        const OP: &str = "rms_norm";
        if dim == 0 || x.len() % dim != 0 || weight.len() != dim || y.len() < x.len() {
            return Err(shape(
                OP,
                format!(
                    "x {} elements, weight {}, y {}, dim {dim}",
                    x.len(),
                    weight.len(),
                    y.len()
                ),
            ));
        }
        Self::distinct(OP, y, &[x, weight])?;
        let rows = to_u32(OP, "rows", x.len() / dim)?;
        let params = NormParams {
            dim: to_u32(OP, "dim", dim)?,
            rows,
            eps,
            _pad: 0,
        };
        let (gx, gy) = self.gpu.grid(rows);
        self.push(
            &KernelSpec::new("rms_norm.wgsl"),
            &[(&x.buf, None), (&weight.buf, None), (&y.buf, None)],
            &params,
            [gx, gy, 1],
        )
    }

    /// Rotary embedding of `x` = `[tokens][n_heads][head_dim]` into `y`.
    pub fn rope(&mut self, x: &Tensor, y: &Tensor, rope: &Rope) -> Result<(), GpuError> {
        const OP: &str = "rope";
        let per_token = rope.n_heads * rope.head_dim;
        if per_token == 0
            || x.len() % per_token != 0
            || y.len() < x.len()
            || rope.head_dim % 2 != 0
            || rope.n_rot % 2 != 0
            || rope.n_rot > rope.head_dim
        {
            return Err(shape(
                OP,
                format!(
                    "x {} elements, y {}, {} heads of {} with {} rotated (both even, rotated ≤ head)",
                    x.len(),
                    y.len(),
                    rope.n_heads,
                    rope.head_dim,
                    rope.n_rot
                ),
            ));
        }
        Self::distinct(OP, y, &[x])?;
        let params = RopeParams {
            head_dim: to_u32(OP, "head_dim", rope.head_dim)?,
            n_rot: to_u32(OP, "n_rot", rope.n_rot)?,
            n_heads: to_u32(OP, "n_heads", rope.n_heads)?,
            n_tokens: to_u32(OP, "tokens", x.len() / per_token)?,
            pos_offset: rope.pos_offset,
            neox: u32::from(rope.neox),
            freq_base: rope.freq_base,
            _pad: 0,
        };
        let pairs = to_u32(OP, "pairs", x.len() / 2)?;
        let (gx, gy) = self.gpu.grid(pairs.div_ceil(ELT_WG));
        self.push(
            &KernelSpec::new("rope.wgsl"),
            &[(&x.buf, None), (&y.buf, None)],
            &params,
            [gx, gy, 1],
        )
    }

    /// Row-wise softmax of `scale * x` over rows of `cols` values.
    pub fn softmax(
        &mut self,
        x: &Tensor,
        y: &Tensor,
        cols: usize,
        scale: f32,
    ) -> Result<(), GpuError> {
        const OP: &str = "softmax";
        if cols == 0 || x.len() % cols != 0 || y.len() < x.len() {
            return Err(shape(
                OP,
                format!("x {} elements, y {}, cols {cols}", x.len(), y.len()),
            ));
        }
        Self::distinct(OP, y, &[x])?;
        let rows = to_u32(OP, "rows", x.len() / cols)?;
        let params = SoftmaxParams {
            cols: to_u32(OP, "cols", cols)?,
            rows,
            scale,
            _pad: 0,
        };
        let (gx, gy) = self.gpu.grid(rows);
        self.push(
            &KernelSpec::new("softmax.wgsl"),
            &[(&x.buf, None), (&y.buf, None)],
            &params,
            [gx, gy, 1],
        )
    }

    fn elementwise(
        &mut self,
        op: &'static str,
        spec: KernelSpec,
        ins: &[&Tensor],
        y: &Tensor,
        scale: f32,
    ) -> Result<(), GpuError> {
        let n = ins.first().map_or(0, |t| t.len());
        if ins.iter().any(|t| t.len() != n) || y.len() < n {
            let lens: Vec<usize> = ins.iter().map(|t| t.len()).collect();
            return Err(shape(
                op,
                format!(
                    "input lengths {lens:?} must be equal and ≤ output {}",
                    y.len()
                ),
            ));
        }
        Self::distinct(op, y, ins)?;
        if n == 0 {
            return Ok(());
        }
        let params = EltParams {
            n: to_u32(op, "n", n)?,
            scale,
            _pad: [0; 2],
        };
        let mut buffers: Vec<(&wgpu::Buffer, Option<u64>)> =
            ins.iter().map(|t| (&t.buf, None)).collect();
        buffers.push((&y.buf, None));
        let (gx, gy) = self.gpu.grid((n as u32).div_ceil(ELT_WG));
        self.push(&spec, &buffers, &params, [gx, gy, 1])
    }

    /// `y = silu(g) * u`.
    pub fn silu_mul(&mut self, g: &Tensor, u: &Tensor, y: &Tensor) -> Result<(), GpuError> {
        self.elementwise("silu_mul", glu_spec("silu"), &[g, u], y, 0.0)
    }

    /// `y = gelu_tanh(g) * u`.
    pub fn gelu_mul(&mut self, g: &Tensor, u: &Tensor, y: &Tensor) -> Result<(), GpuError> {
        self.elementwise("gelu_mul", glu_spec("gelu_tanh"), &[g, u], y, 0.0)
    }

    /// `y = a + b`.
    pub fn add(&mut self, a: &Tensor, b: &Tensor, y: &Tensor) -> Result<(), GpuError> {
        self.elementwise("add", binary_spec("+"), &[a, b], y, 0.0)
    }

    /// `y = a * b` element-wise.
    pub fn mul(&mut self, a: &Tensor, b: &Tensor, y: &Tensor) -> Result<(), GpuError> {
        self.elementwise("mul", binary_spec("*"), &[a, b], y, 0.0)
    }

    /// `y = x * s`.
    pub fn scale(&mut self, x: &Tensor, y: &Tensor, s: f32) -> Result<(), GpuError> {
        self.elementwise("scale", KernelSpec::new("scale.wgsl"), &[x], y, s)
    }

    /// Copies `words` 16-byte words from `src` to `dst` (bandwidth yardstick).
    pub(crate) fn copy_words(
        &mut self,
        src: &wgpu::Buffer,
        dst: &wgpu::Buffer,
        words: u32,
    ) -> Result<(), GpuError> {
        let params = EltParams {
            n: words,
            scale: 0.0,
            _pad: [0; 2],
        };
        let (gx, gy) = self.gpu.grid(words.div_ceil(ELT_WG));
        self.push(
            &KernelSpec::new("copy.wgsl"),
            &[(src, None), (dst, None)],
            &params,
            [gx, gy, 1],
        )
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
        let gpu = self.gpu;
        if self.dispatches.is_empty() {
            return Ok(());
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
        let uniforms = gpu.scoped("kernel parameters", blob.len() as u64, || {
            let buf = gpu.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("params"),
                size: blob.len() as u64,
                usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            });
            gpu.queue.write_buffer(&buf, 0, &blob);
            buf
        })?;
        gpu.scoped("kernel dispatch", 0, || {
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
                    let mut entries: Vec<wgpu::BindGroupEntry> = d
                        .bindings
                        .iter()
                        .enumerate()
                        .map(|(i, b)| wgpu::BindGroupEntry {
                            binding: i as u32,
                            resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                                buffer: &b.buf,
                                offset: 0,
                                size: b.size.and_then(wgpu::BufferSize::new),
                            }),
                        })
                        .collect();
                    entries.push(wgpu::BindGroupEntry {
                        binding: d.bindings.len() as u32,
                        resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                            buffer: &uniforms,
                            offset,
                            size: wgpu::BufferSize::new(d.params.len() as u64),
                        }),
                    });
                    let group = gpu.device.create_bind_group(&wgpu::BindGroupDescriptor {
                        label: None,
                        layout: &d.pipeline.layout,
                        entries: &entries,
                    });
                    pass.set_pipeline(&d.pipeline.pipeline);
                    pass.set_bind_group(0, &group, &[]);
                    let [x, y, z] = d.groups;
                    pass.dispatch_workgroups(x, y, z);
                }
            }
            gpu.queue.submit([enc.finish()]);
        })
    }
}
