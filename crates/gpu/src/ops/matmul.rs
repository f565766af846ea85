//! Mat-vec and mat-mul over quantized weights, and row lookup.
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
//! The mat-vec kernel runs the P lanes of a row on `tpr` threads (each holding
//! P / `tpr` lane accumulators, [`MatvecShape`]), and each thread computes
//! `rpt` rows so that an activation load feeds several rows; the small-N
//! kernel is the same kernel with N accumulators per lane; the tiled kernel
//! gives each thread one lane for a 4-row × 8-column block of outputs and
//! walks the row P units at a time, so the dequantized weights of a step are
//! shared by 64 columns while every output still sees exactly steps 1–3. All
//! multiply-adds are explicit `fma`, so no compiler contraction choice can
//! differ between kernels. Splitting a weight over several bindings changes
//! only which dispatch computes a row, never the order within it.
//!
//! # Why the lane tree does not use subgroups
//!
//! `subgroupAdd` would replace step 3 with one instruction where the adapter
//! has subgroups, but WGSL leaves the order of its additions to the driver,
//! and the subgroup size varies (8 on lavapipe, 32 or 64 on hardware). The
//! tiled kernel cannot use the same subgroup shape as the mat-vec kernel, so
//! a subgroup reduction would break the bit-identity between them — the
//! promise that a request's greedy output does not change with load. The
//! tree runs once per output after the whole row has been streamed, so its
//! cost is small beside the weight reads; the portable tree is used on every
//! adapter, and `SUBGROUP` is requested only so that later kernels whose
//! results do not need invariance (e.g. softmax maxima) can use it.

use lamina_gguf::GgmlType;

use super::{shape, to_u32, Batch, Gate, KvElem, QkvLayout, Rope, TokenTable};
use crate::buffer::{Tensor, Weight, TENSOR_SLACK};
use crate::error::GpuError;
use crate::params::{MatParams, RowsParams};
use crate::quant;
use crate::shader::KernelSpec;

/// Most activation columns the small-N kernel handles in one dispatch.
pub const MAX_SMALL_COLS: usize = 8;
/// Column chunks one small-N dispatch covers along the grid's z (the
/// portable limit of workgroups per dimension).
const MAX_GRID_Z: usize = 65535;
/// Lanes per output (P above).
pub const LANES: usize = 32;
/// Partials of the canonical RMSNorm reduction (`shaders/common/rms.wgsl`).
const NORM_PARTIALS: u32 = 64;
/// The tiled kernel's tile (`shaders/matmul_tiled.wgsl`).
const TILED_ROWS: u32 = 64;
const TILED_COLS: u32 = 64;

/// How the mat-vec (and small-N) kernel maps the canonical lanes onto
/// threads. Every shape computes every output with the same operations, so
/// the choice is free per device and weight shape; it changes speed only.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MatvecShape {
    /// Threads per row, a power of two dividing [`LANES`]: thread `t` holds
    /// lanes `t, t + tpr, …`.
    pub tpr: u32,
    /// Rows per thread (each activation load feeds this many rows).
    pub rpt: u32,
    /// Workgroup size, a multiple of `tpr`.
    pub wg: u32,
}

impl MatvecShape {
    /// Every shape the runtime may pick (validated by the shader test and
    /// compared bit for bit by the invariance test).
    pub const CANDIDATES: [MatvecShape; 4] = [
        MatvecShape {
            tpr: 1,
            rpt: 2,
            wg: 64,
        },
        MatvecShape {
            tpr: 8,
            rpt: 2,
            wg: 256,
        },
        MatvecShape {
            tpr: 16,
            rpt: 2,
            wg: 256,
        },
        MatvecShape {
            tpr: 32,
            rpt: 2,
            wg: 256,
        },
    ];

    /// Rows one workgroup computes.
    pub fn rows_per_wg(self) -> u32 {
        self.wg / self.tpr * self.rpt
    }

    /// The shape for a row of `units` 32-weight units on `gpu`.
    ///
    /// A CPU-backed device (lavapipe, SwiftShader) runs a workgroup's
    /// invocations as SIMD lanes of one CPU thread: there, one thread per row
    /// (two rows each) makes every activation load uniform (one load for the
    /// whole lane group) and leaves no lane idle, so `tpr` is 1. A GPU wants many threads
    /// per row to spread a short matrix over its cores and coalesce the reads:
    /// up to 32, but no more than the row has units (K = 576 has 18, so 16
    /// threads rather than 32 with 14 idle). `LAMINA_GPU_MATVEC=tpr,rpt,wg`
    /// overrides the choice (for tuning on a new device).
    pub fn choose(gpu: &crate::Gpu, units: usize) -> MatvecShape {
        if let Some(shape) = gpu.matvec_override() {
            return shape;
        }
        if gpu.adapter_info().device_type == "cpu" {
            // Two rows per thread: each (uniform) activation load feeds two
            // independent fma chains, faster than one row or four on
            // lavapipe (docs/perf/kernels.md, 2026-12-03).
            return MatvecShape {
                tpr: 1,
                rpt: 2,
                wg: 64,
            };
        }
        let tpr = if units >= 32 {
            32
        } else if units >= 16 {
            16
        } else {
            8
        };
        // Two rows per thread halve the activation loads; at 8 columns that
        // is 16 × 32/tpr accumulators, still within a GPU's register file.
        MatvecShape {
            tpr,
            rpt: 2,
            wg: 256,
        }
    }

    /// The shape for a GLU epilogue: the same threads, with the two rows of
    /// each thread the gate row and its up row.
    pub fn for_glu(self) -> MatvecShape {
        MatvecShape { rpt: 2, ..self }
    }

    /// Parses `tpr,rpt,wg`, accepting only shapes the kernel supports and that
    /// fit the portable limits (256 invocations, 16 KiB of workgroup memory).
    pub fn parse(s: &str) -> Option<MatvecShape> {
        let v: Vec<u32> = s
            .split(',')
            .map(|p| p.trim().parse().ok())
            .collect::<Option<_>>()?;
        let [tpr, rpt, wg] = v[..] else { return None };
        let shape = MatvecShape { tpr, rpt, wg };
        let ok = tpr.is_power_of_two()
            && tpr <= LANES as u32
            && (1..=4).contains(&rpt)
            && wg.is_power_of_two()
            && (tpr..=256).contains(&wg)
            && shape.wgmem(MAX_SMALL_COLS) * 4 <= 16384;
        ok.then_some(shape)
    }

    /// Workgroup memory (f32 values) the kernel declares for `maxc` columns.
    fn wgmem(self, maxc: usize) -> u32 {
        if self.tpr == 1 {
            1
        } else {
            self.rows_per_wg() * maxc as u32 * self.tpr
        }
    }
}

/// Which mat-mul kernel to run. All give bit-identical results.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MatmulKernel {
    /// Mat-vec for one column, small-N up to 8, tiled beyond (small-N at
    /// any width on a CPU-backed device).
    Auto,
    /// One mat-vec dispatch per column.
    MatVec,
    /// The small-N kernel, up to 8 columns per workgroup: one dispatch per
    /// 8 columns, or one for all of them in the one-thread-per-row shape
    /// (column chunks along the grid's z).
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

/// Products of a weight that holds `n_mats` matrices one after another
/// (a block's routed experts, `rows / n_mats` rows each, uploaded with
/// [`crate::Gpu::upload_matrices`] where they may exceed one binding) with
/// columns that each name their matrix: [`Batch::matmul_runs`]. Run `r` is the four
/// words of `table` from `at + 4r`: its matrix, its first column of `x`,
/// its first column of `y`, and its column count (0 ..= `maxc`; an empty
/// run computes nothing). A run's columns are consecutive in `x` and in
/// `y`.
#[derive(Clone, Copy, Debug)]
pub struct Runs<'t> {
    pub table: &'t Tensor,
    pub at: usize,
    /// Runs in the table (with `indirect`, the most there can be).
    pub count: usize,
    pub n_mats: usize,
    /// The most columns any run holds: 1, or up to [`MAX_SMALL_COLS`]
    /// (the compiled kernel's column count).
    pub maxc: usize,
    /// Where a kernel wrote the dispatch's workgroup counts (three words
    /// from this word of the tensor: [`Batch::runs_grid`]'s two, then the
    /// runs), so only the runs that hold columns are dispatched.
    pub indirect: Option<(&'t Tensor, usize)>,
}

/// What a mat-vec or small-N dispatch folds in around its product, with the
/// bits of the separate kernels (so a fused step equals an unfused one).
#[derive(Clone, Copy, Debug, Default)]
pub struct Fuse<'t> {
    /// `x` holds raw hidden states: each column is RMS-normed on load with
    /// this weight (length `k`) and epsilon, as [`Batch::rms_norm`] norms it.
    pub norm: Option<(&'t Tensor, f32)>,
    /// The product is added to what `y` holds (`y + W·x`, the residual add,
    /// [`Batch::add`]'s bits).
    pub add: bool,
    /// The product is a stacked QKV product: RoPE and the cache writes in
    /// its epilogue ([`RopeOut`]); `y` receives the rotated queries.
    pub rope: Option<RopeOut<'t>>,
    /// After the residual add (`add`), the whole new hidden state in `y`
    /// is RMS-normed into another tensor, as [`Batch::add_rms_norm`] norms
    /// it ([`NormAfter`]; only where [`Batch::norm_epilogue_fuses`]).
    pub norm_after: Option<NormAfter<'t>>,
}

/// The RMSNorm epilogue of a residual-add product
/// (`shaders/common/norm_epi_on.wgsl`): `out[c] = rms_norm(y[c]) * weight`
/// for each column, with `eps`; `counter` is a zeroed tensor of at least
/// one element that only these epilogues use (they leave it zeroed).
#[derive(Clone, Copy, Debug)]
pub struct NormAfter<'t> {
    pub weight: &'t Tensor,
    pub eps: f32,
    pub out: &'t Tensor,
    pub counter: &'t Tensor,
}

/// Where a stacked QKV product's RoPE epilogue puts keys and values, with
/// [`Batch::rope_kv_rows`]'s bits: column `c` of the product is token
/// `first + c` of `table`.
#[derive(Clone, Copy, Debug)]
pub struct RopeOut<'t> {
    pub k_cache: &'t Tensor,
    pub v_cache: &'t Tensor,
    pub layout: QkvLayout,
    pub rope: Rope,
    pub table: TokenTable<'t>,
    pub first: usize,
}

impl Fuse<'_> {
    fn kind(&self) -> FuseKind {
        FuseKind {
            norm: self.norm.is_some(),
            add: self.add,
            rope: self.rope.map(|r| r.layout.kv),
            norm_after: self.norm_after.is_some(),
            runs: false,
        }
    }
}

/// A product's first bindings: the weight chunk, x and y, then the chunk
/// again where its type's decoder reads it as vec4 words
/// (`quant::weight_bindings`).
fn product_ranges<'b>(
    ty: GgmlType,
    chunk: &'b wgpu::Buffer,
    x: &'b wgpu::Buffer,
    y: &'b wgpu::Buffer,
) -> Vec<(&'b wgpu::Buffer, u64, Option<u64>)> {
    let all = [
        (chunk, 0, None),
        (x, 0, None),
        (y, 0, None),
        (chunk, 0, None),
    ];
    all[..quant::weight_bindings(ty)].to_vec()
}

pub(crate) fn type_file(ty: GgmlType, op: &'static str) -> Result<&'static str, GpuError> {
    quant::shader_file(ty).ok_or(GpuError::NoKernel { ty, op })
}

/// The mat-vec kernel (`maxc` 1) or the small-N kernel (`maxc` 2, 4 or 8,
/// the smallest that holds the batch: its arrays stay smaller), in thread
/// shape `shape`, with
/// the activations from a storage buffer or (`uniform_vec4s`) a uniform
/// window of that many vec4s; with `sg` (one thread per row, subgroups of 8
/// or more) each unit's activations loaded once per subgroup.
#[cfg(test)]
pub(crate) fn matvec_spec(
    ty: GgmlType,
    maxc: usize,
    shape: MatvecShape,
    uniform_vec4s: Option<u64>,
    glu: Option<Gate>,
    sg: bool,
) -> KernelSpec {
    let x = uniform_vec4s.map_or(XSrc::Storage, XSrc::Uniform);
    matvec_spec_fused(ty, maxc, shape, x, glu, sg, FuseKind::default())
}

/// Where a mat-vec kernel reads its activations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum XSrc {
    /// A storage binding, element by element (any offset and stride).
    Storage,
    /// A storage binding viewed as vec4s (offsets, strides and `k` whole
    /// vec4s): one load per four values.
    Storage4,
    /// A uniform window of this many vec4s ([`uniform_window`]).
    Uniform(u64),
}

/// What a mat-vec dispatch folds in besides the product (see [`Fuse`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct FuseKind {
    pub norm: bool,
    pub add: bool,
    /// A RoPE epilogue, into caches of this element type.
    pub rope: Option<KvElem>,
    /// An RMSNorm epilogue (one-thread-per-row kernel only).
    pub norm_after: bool,
    /// Column chunks are runs of a table ([`Runs`]).
    pub runs: bool,
}

/// `matvec_spec` (the tests' form) with a norm prologue and / or an add
/// epilogue.
#[allow(clippy::too_many_arguments)]
pub(crate) fn matvec_spec_fused(
    ty: GgmlType,
    maxc: usize,
    shape: MatvecShape,
    x: XSrc,
    glu: Option<Gate>,
    sg: bool,
    fuse: FuseKind,
) -> KernelSpec {
    // One thread per row has its own kernel, which keeps the canonical tree
    // in registers (matvec_rows.wgsl); teams share matvec.wgsl.
    let file = if shape.tpr == 1 {
        "matvec_rows.wgsl"
    } else {
        "matvec.wgsl"
    };
    let wgmem = if fuse.norm {
        shape.wgmem(maxc).max(NORM_PARTIALS * maxc as u32)
    } else if fuse.norm_after {
        shape.wgmem(maxc).max(NORM_PARTIALS)
    } else {
        shape.wgmem(maxc)
    };
    // After the weight's bindings: the norm weight, then the caches and the
    // token table of the RoPE epilogue.
    let n_bind = quant::weight_bindings(ty) + usize::from(fuse.norm);
    let extra = usize::from(fuse.norm)
        + 3 * usize::from(fuse.rope.is_some())
        + 3 * usize::from(fuse.norm_after)
        + usize::from(fuse.runs);
    // The norm epilogue's weight, output and counter after those, then the
    // run table.
    let eb = n_bind + 3 * usize::from(fuse.rope.is_some());
    let rb = eb + 3 * usize::from(fuse.norm_after);
    let spec = quant::weight_defs_with(KernelSpec::new(file), ty, extra)
        .def("KB", n_bind.to_string())
        .def("VB", (n_bind + 1).to_string())
        .def("TB", (n_bind + 2).to_string())
        .def("NE", if fuse.norm_after { "on" } else { "off" })
        .def("EB", eb.to_string())
        .def("EB1", (eb + 1).to_string())
        .def("EB2", (eb + 2).to_string())
        .def("RB", rb.to_string())
        .def("RUNS", if fuse.runs { "on" } else { "off" })
        .def("MAXC", maxc.to_string())
        .def("TPR", shape.tpr.to_string())
        .def("RPT", shape.rpt.to_string())
        .def("WG", shape.wg.to_string())
        .def("WGMEM", wgmem.to_string())
        .def("GLU", glu.map_or("none", Gate::wgsl))
        .def("GLU_ON", if glu.is_some() { "true" } else { "false" })
        .def("NORM", if fuse.norm { "on" } else { "off" })
        .def("ADD", if fuse.add { "true" } else { "false" })
        .def("ROPE", if fuse.rope.is_some() { "on" } else { "off" })
        .def(
            "ROPE_ON",
            if fuse.rope.is_some() { "true" } else { "false" },
        )
        .def("KV_ENABLE", fuse.rope.unwrap_or_default().enable())
        .def("KV", fuse.rope.unwrap_or_default().wgsl());
    // One thread per row walks all 32 lanes itself, so it can decode a
    // group of units that share their words from one load.
    let ug = if shape.tpr == 1 {
        quant::unit_group(ty)
    } else {
        1
    };
    let spec = if ug > 1 {
        spec.def("WALK", "groups")
            .def("UG", ug.to_string())
            .def("CLB", (LANES as u32 / ug).trailing_zeros().to_string())
    } else {
        spec.def("WALK", "lanes").def("UG", "1").def("CLB", "5")
    };
    let spec = if sg && shape.tpr == 1 {
        spec.def("SG", "on")
            .def("SG_PARAM", "@builtin(subgroup_invocation_id) sgid: u32,")
            .def("SG_LANE", "sgid")
    } else {
        spec.def("SG", "off")
            .def("SG_PARAM", "")
            .def("SG_LANE", "0u")
    };
    match x {
        XSrc::Uniform(n) => spec.def("XSRC", "uniform").def("XU", n.to_string()),
        XSrc::Storage => spec.def("XSRC", "storage"),
        XSrc::Storage4 => spec.def("XSRC", "storage4"),
    }
}

/// Every mat-vec variant of `ty` the runtime can build, up to the uniform
/// window's length (the shader validation tests), with (`sg`) or without
/// subgroup broadcasts.
#[cfg(test)]
pub(crate) fn matvec_variants(ty: GgmlType, sg: bool) -> Vec<KernelSpec> {
    let mut v = Vec::new();
    for shape in MatvecShape::CANDIDATES {
        for maxc in [1, 2, 4, MAX_SMALL_COLS] {
            v.push(matvec_spec(ty, maxc, shape, None, None, sg));
            v.push(matvec_spec(ty, maxc, shape, Some(64), None, sg));
            for (norm, add, rope) in [
                (true, false, false),
                (false, true, false),
                (true, false, true),
                (false, false, true),
            ] {
                if rope && shape.rpt != 2 {
                    continue;
                }
                // The f16-cache variants need SHADER_F16: the f16 kernel
                // validation test builds those.
                let rope = rope.then_some(KvElem::F32);
                let fuse = FuseKind {
                    norm,
                    add,
                    rope,
                    ..FuseKind::default()
                };
                for x in [XSrc::Storage, XSrc::Storage4, XSrc::Uniform(64)] {
                    v.push(matvec_spec_fused(ty, maxc, shape, x, None, sg, fuse));
                }
            }
            if shape.tpr == 1 && shape.wg == NORM_PARTIALS {
                let fuse = FuseKind {
                    add: true,
                    norm_after: true,
                    ..FuseKind::default()
                };
                for x in [XSrc::Storage, XSrc::Storage4, XSrc::Uniform(64)] {
                    v.push(matvec_spec_fused(ty, maxc, shape, x, None, sg, fuse));
                }
            }
            let runs = FuseKind {
                runs: true,
                ..FuseKind::default()
            };
            for x in [XSrc::Storage, XSrc::Storage4] {
                v.push(matvec_spec_fused(ty, maxc, shape, x, None, sg, runs));
                let glu = Some(Gate::Silu);
                v.push(matvec_spec_fused(
                    ty,
                    maxc,
                    shape.for_glu(),
                    x,
                    glu,
                    sg,
                    runs,
                ));
            }
            let norm = FuseKind {
                norm: true,
                ..FuseKind::default()
            };
            for gate in [Gate::Silu, Gate::GeluTanh] {
                let shape = shape.for_glu();
                v.push(matvec_spec(ty, maxc, shape, None, Some(gate), sg));
                v.push(matvec_spec(ty, maxc, shape, Some(64), Some(gate), sg));
                for x in [XSrc::Storage, XSrc::Storage4] {
                    let glu = Some(gate);
                    v.push(matvec_spec_fused(
                        ty,
                        maxc,
                        shape,
                        x,
                        glu,
                        sg,
                        FuseKind::default(),
                    ));
                    v.push(matvec_spec_fused(ty, maxc, shape, x, glu, sg, norm));
                }
            }
        }
    }
    v
}

/// The mat-vec variants with a RoPE epilogue into f16 caches, over the
/// types the real models' QKV weights use.
#[cfg(test)]
pub(crate) fn rope_f16_specs() -> Vec<KernelSpec> {
    let mut v = Vec::new();
    for ty in [GgmlType::Q4_1, GgmlType::Q8_0, GgmlType::Q4K, GgmlType::F32] {
        for shape in MatvecShape::CANDIDATES.into_iter().filter(|s| s.rpt == 2) {
            for maxc in [1, MAX_SMALL_COLS] {
                for sg in [false, true] {
                    for norm in [false, true] {
                        let fuse = FuseKind {
                            norm,
                            rope: Some(KvElem::F16),
                            ..FuseKind::default()
                        };
                        let x = XSrc::Storage;
                        v.push(matvec_spec_fused(ty, maxc, shape, x, None, sg, fuse));
                    }
                }
            }
        }
    }
    v
}

/// Whether the columns from `c0` on start, step and end on whole vec4s of
/// `x` (their `k` values each), so a kernel may read them as vec4s.
fn vec4_columns(cols: &Columns, c0: usize, k: usize) -> bool {
    let x_offset = cols.x_offset + c0 * cols.x_stride;
    x_offset % 4 == 0 && cols.x_stride % 4 == 0 && k % 4 == 0
}

/// The uniform activation window for a mat-vec dispatch reading `span`
/// values from element `x_offset` of `x`: (byte offset, vec4 count, the
/// first value's index within the window). `None` when the activations must
/// come from the storage binding instead: offsets, strides or `k` not whole
/// vec4s, or a window larger than the device's uniform binding limit.
fn uniform_window(
    gpu: &crate::Gpu,
    x: &Tensor,
    cols: &Columns,
    c0: usize,
    nc: usize,
    k: usize,
) -> Option<(u64, u64, u32)> {
    if !vec4_columns(cols, c0, k) {
        return None;
    }
    let x_offset = cols.x_offset + c0 * cols.x_stride;
    let align = u64::from(gpu.limits().min_uniform_buffer_offset_alignment.max(16));
    let start = (x_offset as u64 * 4) / align * align;
    let rem = x_offset as u64 * 4 - start;
    let span = ((nc - 1) * cols.x_stride + k) as u64 * 4;
    let need = (rem + span).div_ceil(TENSOR_SLACK) * TENSOR_SLACK;
    let limit = gpu.limits().max_uniform_buffer_binding_size;
    // The tensor's slack (buffer::TENSOR_SLACK) keeps the needed window
    // inside it. The window's length is compiled into the kernel (its
    // uniform array's), so each length is a pipeline of its own: rounded
    // up to a power of two where the buffer has room, a product takes a
    // handful of them over every column count a server's steps bring
    // (decodes beside a prompt chunk: any count up to the window's limit),
    // not one each. Reading is the same; only the array's bound changes.
    let fits = |w: u64| w <= limit && start + w <= x.buf.size();
    let window = [need.next_power_of_two(), need]
        .into_iter()
        .find(|&w| fits(w))?;
    Some((start, window / 16, (rem / 4) as u32))
}

pub(crate) fn tiled_spec(ty: GgmlType) -> KernelSpec {
    let short = if ty.block_size() == 1 {
        "true"
    } else {
        "false"
    };
    quant::weight_defs(KernelSpec::new("matmul_tiled.wgsl"), ty).def("SHORT_UNITS", short)
}

pub(crate) fn get_rows_spec(ty: GgmlType) -> KernelSpec {
    quant::weight_defs(KernelSpec::new("get_rows.wgsl"), ty)
}

impl Batch<'_> {
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
        self.matmul_shaped(kernel, None, w, x, y, cols)
    }

    /// [`Batch::matmul_strided`] with the mat-vec kernel's thread shape
    /// forced (`None`: [`MatvecShape::choose`]); benchmarks and the
    /// invariance tests compare shapes.
    pub fn matmul_shaped(
        &mut self,
        kernel: MatmulKernel,
        forced: Option<MatvecShape>,
        w: &Weight,
        x: &Tensor,
        y: &Tensor,
        cols: Columns,
    ) -> Result<(), GpuError> {
        self.matmul_fused_shaped(kernel, forced, w, x, y, cols, Fuse::default())
    }

    /// The product with a norm prologue and / or an add epilogue
    /// ([`Fuse`]); only where [`Batch::fuses`] says the product runs the
    /// mat-vec or small-N kernel (the tiled kernel has neither).
    pub fn matmul_fused(
        &mut self,
        w: &Weight,
        x: &Tensor,
        y: &Tensor,
        cols: Columns,
        fuse: Fuse<'_>,
    ) -> Result<(), GpuError> {
        self.matmul_fused_shaped(MatmulKernel::Auto, None, w, x, y, cols, fuse)
    }

    /// [`Batch::matmul_fused`] with the kernel and thread shape forced (the
    /// invariance tests).
    #[allow(clippy::too_many_arguments)]
    pub fn matmul_fused_shaped(
        &mut self,
        kernel: MatmulKernel,
        forced: Option<MatvecShape>,
        w: &Weight,
        x: &Tensor,
        y: &Tensor,
        cols: Columns,
        fuse: Fuse<'_>,
    ) -> Result<(), GpuError> {
        self.matmul_any(kernel, forced, w, x, y, cols, None, fuse)
    }

    /// Whether an `n`-column product runs the mat-vec or small-N kernel,
    /// which take a [`Fuse`] prologue and epilogue.
    pub fn fuses(&self, n: usize) -> bool {
        n <= MAX_SMALL_COLS || self.small_n_everywhere()
    }

    /// Whether an `n`-column product of `w` can take a RoPE epilogue
    /// ([`Fuse::rope`]): the mat-vec or small-N kernel, and the weight in
    /// one binding (a rotation pair's rows must meet in one dispatch), into
    /// f32 or f16 caches: a q8_0 block's scale needs all 32 of its values,
    /// which the epilogue's threads hold two by two, so q8_0 caches take
    /// [`Batch::rope_kv_rows`] after the product.
    pub fn rope_fuses(&self, w: &Weight, n: usize, kv: KvElem) -> bool {
        self.fuses(n) && w.chunks.len() == 1 && kv != KvElem::Q8_0
    }

    /// Whether [`Batch::matmul_glu`] can run `w` as one fused dispatch per
    /// eight columns (rather than the product and a separate activation),
    /// and so take a norm prologue too.
    pub fn glu_fuses(&self, w: &Weight, n: usize) -> bool {
        (n <= MAX_SMALL_COLS || self.small_n_everywhere())
            && w.chunks.len() == 1
            && w.rows() % 2 == 0
    }

    /// Whether a residual-add product of `w` over `n` columns can norm its
    /// result in its epilogue ([`Fuse::norm_after`]): a CPU-backed device
    /// (see `shaders/common/norm_epi_on.wgsl` for why only there), the
    /// one-thread-per-row kernel in its 64-invocation shape, the weight in
    /// one binding and the columns in one dispatch.
    pub fn norm_epilogue_fuses(&self, w: &Weight, n: usize) -> bool {
        let s = MatvecShape::choose(self.gpu, w.cols().div_ceil(32));
        self.gpu.norm_epilogue()
            && s.tpr == 1
            && s.wg == NORM_PARTIALS
            && w.chunks.len() == 1
            && (1..=MAX_SMALL_COLS).contains(&n)
    }

    /// A CPU-backed device runs the one-thread-per-row small-N kernel faster
    /// than the tiled one at any width (its activation loads are uniform,
    /// the tiled kernel's are per lane: docs/perf/lavapipe.md, 2026-12-03).
    fn small_n_everywhere(&self) -> bool {
        self.gpu.adapter_info().device_type == "cpu"
    }

    /// `y[c] = act(g) * u` where `[g; u] = w · x[c]`, for a stacked
    /// [gate; up] weight `w` (`2·ff` rows) and `n` packed columns; `y`
    /// receives `ff` values per column. Up to eight columns (any number on a
    /// CPU-backed device), mat-vecs whose epilogue applies the activation;
    /// beyond, or when the weight spans several bindings, the product into
    /// `gu` (`2·ff` per column) and [`Batch::glu_stacked`]. The bits are the
    /// same either way.
    pub fn matmul_glu(
        &mut self,
        w: &Weight,
        x: &Tensor,
        gu: &Tensor,
        y: &Tensor,
        n: usize,
        gate: Gate,
    ) -> Result<(), GpuError> {
        self.matmul_glu_shaped(None, w, x, gu, y, n, gate, None)
    }

    /// [`Batch::matmul_glu`] over raw hidden states, each column RMS-normed
    /// on load with `norm` (weight, epsilon); only where
    /// [`Batch::glu_fuses`].
    #[allow(clippy::too_many_arguments)]
    pub fn matmul_glu_normed(
        &mut self,
        w: &Weight,
        x: &Tensor,
        gu: &Tensor,
        y: &Tensor,
        n: usize,
        gate: Gate,
        norm: (&Tensor, f32),
    ) -> Result<(), GpuError> {
        self.matmul_glu_shaped(None, w, x, gu, y, n, gate, Some(norm))
    }

    /// [`Batch::matmul_glu`] with the mat-vec thread shape forced (its
    /// `rpt` becomes 2: the gate row and its up row) and an optional norm
    /// prologue; the invariance tests.
    #[allow(clippy::too_many_arguments)]
    pub fn matmul_glu_shaped(
        &mut self,
        forced: Option<MatvecShape>,
        w: &Weight,
        x: &Tensor,
        gu: &Tensor,
        y: &Tensor,
        n: usize,
        gate: Gate,
        norm: Option<(&Tensor, f32)>,
    ) -> Result<(), GpuError> {
        let ff = w.rows() / 2;
        if !self.glu_fuses(w, n) {
            if norm.is_some() {
                return Err(shape(
                    "matmul_glu",
                    format!("no fused kernel for {n} columns to take the norm prologue"),
                ));
            }
            // The product checks that `gu` holds it.
            self.matmul(w, x, gu, n)?;
            return self.glu_stacked_n(gu, y, ff, n, gate);
        }
        let cols = Columns {
            n,
            x_offset: 0,
            x_stride: w.cols(),
            y_offset: 0,
            y_stride: ff,
        };
        let kernel = if n == 1 {
            MatmulKernel::MatVec
        } else {
            MatmulKernel::Small
        };
        let fuse = Fuse {
            norm,
            ..Fuse::default()
        };
        self.matmul_any(kernel, forced, w, x, y, cols, Some(gate), fuse)
    }

    #[allow(clippy::too_many_arguments)]
    fn matmul_any(
        &mut self,
        kernel: MatmulKernel,
        forced: Option<MatvecShape>,
        w: &Weight,
        x: &Tensor,
        y: &Tensor,
        cols: Columns,
        glu: Option<Gate>,
        fuse: Fuse<'_>,
    ) -> Result<(), GpuError> {
        const OP: &str = "matmul";
        type_file(w.ty(), OP)?;
        if let Some((nw, _)) = fuse.norm {
            if nw.len() != w.cols() {
                return Err(shape(
                    OP,
                    format!("norm weight of {} for rows of {}", nw.len(), w.cols()),
                ));
            }
            Self::distinct(OP, y, &[nw])?;
        }
        let n = cols.n;
        if n == 0 {
            return Ok(());
        }
        if let Some(r) = &fuse.rope {
            let (kc, vc) = (r.k_cache, r.v_cache);
            super::fused::check_rope_kv(OP, &r.layout, &r.rope, r.table, r.first, n, kc, vc)?;
            r.layout.kv.check(self.gpu, OP, r.layout.head_dim)?;
            if glu.is_some()
                || r.layout.kv == KvElem::Q8_0
                || fuse.add
                || w.chunks.len() != 1
                || w.rows() != r.layout.stride()
            {
                return Err(shape(
                    OP,
                    format!(
                        "a RoPE epilogue needs one stacked QKV weight of {} rows in one binding, \
                         without GLU or add, and f32 or f16 caches",
                        r.layout.stride()
                    ),
                ));
            }
            Self::distinct(OP, y, &[kc, vc, r.table.gpu])?;
            Self::distinct(OP, kc, &[x, vc, r.table.gpu])?;
            Self::distinct(OP, vc, &[x, r.table.gpu])?;
        }
        if let Some(na) = &fuse.norm_after {
            let rows = w.rows();
            if !self.norm_epilogue_fuses(w, cols.n)
                || !fuse.add
                || fuse.norm.is_some()
                || fuse.rope.is_some()
                || glu.is_some()
                || !matches!(
                    kernel,
                    MatmulKernel::Auto | MatmulKernel::MatVec | MatmulKernel::Small
                )
                || forced.is_some_and(|s| s.tpr != 1 || s.wg != NORM_PARTIALS)
                || na.weight.len() != rows
                || na.out.len() < cols.n * rows
                || na.counter.is_empty()
            {
                return Err(shape(
                    OP,
                    format!(
                        "a norm epilogue needs a CPU-backed device, at most {MAX_SMALL_COLS} \
                         columns, one binding, the residual add and nothing else fused, a \
                         weight of {rows} and an output of {} values",
                        cols.n * rows
                    ),
                ));
            }
            Self::distinct(OP, na.out, &[x, y, na.weight, na.counter])?;
            Self::distinct(OP, na.counter, &[x, y, na.weight])?;
        }
        // A GLU writes one value per gate row, a RoPE epilogue the queries.
        let k = w.cols();
        let rows = match (&fuse.rope, glu) {
            (Some(r), _) => r.layout.q_dim(),
            (None, Some(_)) => w.rows() / 2,
            (None, None) => w.rows(),
        };
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
            MatmulKernel::Auto if self.small_n_everywhere() => MatmulKernel::Small,
            MatmulKernel::Auto => MatmulKernel::Tiled,
            other => other,
        };
        if kernel == MatmulKernel::Tiled && (fuse.norm.is_some() || fuse.add) {
            return Err(shape(
                OP,
                "the tiled kernel has no norm prologue or add epilogue".into(),
            ));
        }
        // The one-thread-per-row kernel takes every column in one dispatch,
        // MAX_SMALL_COLS per workgroup along the grid's z (matvec_rows.wgsl).
        let thread_shape = forced.unwrap_or_else(|| MatvecShape::choose(self.gpu, k.div_ceil(32)));
        let per = match kernel {
            MatmulKernel::MatVec => 1,
            MatmulKernel::Small if thread_shape.tpr == 1 => MAX_SMALL_COLS * MAX_GRID_Z,
            MatmulKernel::Small => MAX_SMALL_COLS,
            _ => n,
        };
        let mut c0 = 0;
        while c0 < n {
            let mut nc = per.min(n - c0);
            // The one-thread-per-row kernel computes all MAX_SMALL_COLS
            // columns of a chunk, filled or not (matvec_rows.wgsl): a few
            // columns past the last full chunk go to a dispatch of their own
            // with a narrower kernel (a prompt chunk beside decodes, 9 to 12
            // columns: one column costs far less than a chunk of eight,
            // docs/perf/lavapipe.md, 2026-12-07).
            let rest = nc % MAX_SMALL_COLS;
            if kernel == MatmulKernel::Small
                && thread_shape.tpr == 1
                && nc > MAX_SMALL_COLS
                && (1..=MAX_SMALL_COLS / 2).contains(&rest)
            {
                nc -= rest;
            }
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
                    eps: match (fuse.norm, &fuse.norm_after) {
                        (Some((_, eps)), _) => eps,
                        (None, Some(na)) => na.eps,
                        (None, None) => 0.0,
                    },
                    ..MatParams::default()
                };
                let params = match &fuse.rope {
                    Some(r) => MatParams {
                        head_dim: to_u32(OP, "head_dim", r.layout.head_dim)?,
                        n_rot: to_u32(OP, "n_rot", r.rope.n_rot)?,
                        n_head: to_u32(OP, "n_head", r.layout.n_head)?,
                        n_kv_head: to_u32(OP, "n_kv_head", r.layout.n_kv_head)?,
                        tab_first: to_u32(OP, "first", r.first + c0)?,
                        neox: u32::from(r.rope.neox),
                        freq_base: r.rope.freq_base,
                        ff_at: r.rope.ff_at(),
                        freq_scale: r.rope.freq_scale,
                        mscale: r.rope.mscale,
                        ..params
                    },
                    None => params,
                };
                // The norm weight after the product's own bindings.
                let mut ranges = product_ranges(w.ty(), &chunk.buf, &x.buf, &y.buf);
                if let Some((nw, _)) = fuse.norm {
                    ranges.push((&nw.buf, 0, None));
                }
                if let Some(r) = &fuse.rope {
                    ranges.push((&r.k_cache.buf, 0, None));
                    ranges.push((&r.v_cache.buf, 0, None));
                    ranges.push((&r.table.gpu.buf, 0, None));
                }
                if let Some(na) = &fuse.norm_after {
                    ranges.push((&na.weight.buf, 0, None));
                    ranges.push((&na.out.buf, 0, None));
                    ranges.push((&na.counter.buf, 0, None));
                }
                if kernel == MatmulKernel::Tiled {
                    debug_assert!(glu.is_none(), "the tiled kernel has no GLU epilogue");
                    let (gx, gy) = self.gpu.grid(chunk.rows.div_ceil(TILED_ROWS));
                    let gz = (nc as u32).div_ceil(TILED_COLS);
                    self.push_ranges(&tiled_spec(w.ty()), &ranges, &params, [gx, gy, gz])?;
                } else {
                    // The smallest compiled column count that holds `nc`.
                    let maxc = nc.next_power_of_two().min(MAX_SMALL_COLS);
                    let gz = nc.div_ceil(maxc) as u32;
                    let ms = thread_shape;
                    // A GLU's threads hold a gate row and its up row, a RoPE
                    // epilogue's a rotation pair: one output (pair) each.
                    let paired = glu.is_some() || fuse.rope.is_some();
                    let (ms, wg_rows) = if paired {
                        (ms.for_glu(), ms.wg / ms.tpr)
                    } else {
                        (ms, ms.rows_per_wg())
                    };
                    let out_rows = if paired { chunk.rows / 2 } else { chunk.rows };
                    let (gx, gy) = self.gpu.grid(out_rows.div_ceil(wg_rows));
                    let sg = self.gpu.lane_broadcast();
                    // One thread per row reads activations in lockstep: from
                    // a uniform window where the layout allows.
                    let window = (ms.tpr == 1)
                        .then(|| uniform_window(self.gpu, x, &cols, c0, nc, k))
                        .flatten();
                    let kind = fuse.kind();
                    match window {
                        Some((start, vec4s, first)) => {
                            let src = XSrc::Uniform(vec4s);
                            let spec = matvec_spec_fused(w.ty(), maxc, ms, src, glu, sg, kind);
                            let params = MatParams {
                                x_offset: first,
                                ..params
                            };
                            ranges[1] = (&x.buf, start, Some(vec4s * 16));
                            self.push_ranges(&spec, &ranges, &params, [gx, gy, gz])?;
                        }
                        None => {
                            // No uniform window holds the columns (a whole
                            // prompt's, in one dispatch): vec4 loads where
                            // the layout allows.
                            let src = if vec4_columns(&cols, c0, k) {
                                XSrc::Storage4
                            } else {
                                XSrc::Storage
                            };
                            let spec = matvec_spec_fused(w.ty(), maxc, ms, src, glu, sg, kind);
                            self.push_ranges(&spec, &ranges, &params, [gx, gy, gz])?;
                        }
                    }
                }
            }
            c0 += nc;
        }
        Ok(())
    }

    /// `y = W_m x` for each run of `runs` (see [`Runs`]): matrix `m` of
    /// `w` over the run's columns of `x` (`x_stride` apart) into its
    /// columns of `y` (`y_stride` apart); with `glu`, each matrix is a
    /// stacked `[gate; up]` and a column gets `act(gate) · up`, as
    /// [`Batch::matmul_glu`]. One dispatch for all runs, whose table a
    /// kernel may have written: the host need not know which matrices they
    /// name. Every column's bits are those of the mat-vec kernel over that
    /// matrix alone (the run table changes which rows are read, not how).
    #[allow(clippy::too_many_arguments)]
    pub fn matmul_runs(
        &mut self,
        w: &Weight,
        runs: Runs<'_>,
        x: &Tensor,
        x_stride: usize,
        y: &Tensor,
        y_stride: usize,
        glu: Option<Gate>,
    ) -> Result<(), GpuError> {
        self.matmul_runs_shaped(None, w, runs, x, x_stride, y, y_stride, glu)
    }

    /// [`Batch::matmul_runs`] with the mat-vec thread shape forced (`None`:
    /// [`MatvecShape::choose`]); the tests run every shape.
    #[allow(clippy::too_many_arguments)]
    pub fn matmul_runs_shaped(
        &mut self,
        forced: Option<MatvecShape>,
        w: &Weight,
        runs: Runs<'_>,
        x: &Tensor,
        x_stride: usize,
        y: &Tensor,
        y_stride: usize,
        glu: Option<Gate>,
    ) -> Result<(), GpuError> {
        const OP: &str = "matmul_runs";
        type_file(w.ty(), OP)?;
        let k = w.cols();
        let n_mats = runs.n_mats;
        if n_mats == 0 || w.rows() % n_mats != 0 {
            return Err(shape(
                OP,
                format!("{} rows are not {n_mats} matrices", w.rows()),
            ));
        }
        let mat_rows = w.rows() / n_mats;
        // Each binding whole matrices (Gpu::upload_matrices).
        if let Some(c) = w
            .chunks
            .iter()
            .find(|c| c.first_row as usize % mat_rows != 0 || c.rows as usize % mat_rows != 0)
        {
            return Err(shape(
                OP,
                format!(
                    "a binding of rows {} .. {} splits a matrix of {mat_rows} rows",
                    c.first_row,
                    c.first_row + c.rows
                ),
            ));
        }
        let out_rows = if glu.is_some() {
            mat_rows / 2
        } else {
            mat_rows
        };
        if (glu.is_some() && mat_rows % 2 != 0)
            || !matches!(runs.maxc, 1 | 2 | 4 | MAX_SMALL_COLS)
            || x_stride < k
            || y_stride < out_rows
        {
            return Err(shape(
                OP,
                format!(
                    "matrices of {mat_rows}×{k}, glu {}, {} columns a run, strides {x_stride} \
                     and {y_stride}",
                    glu.is_some(),
                    runs.maxc
                ),
            ));
        }
        let table_end = runs
            .count
            .checked_mul(4)
            .and_then(|w| w.checked_add(runs.at));
        if table_end.is_none_or(|e| e > runs.table.len()) || runs.count > MAX_GRID_Z {
            return Err(shape(
                OP,
                format!(
                    "{} runs from word {} of a table of {} (at most {MAX_GRID_Z} runs)",
                    runs.count,
                    runs.at,
                    runs.table.len()
                ),
            ));
        }
        Self::distinct(OP, y, &[x, runs.table])?;
        if let Some((args, at)) = runs.indirect {
            if at.checked_add(3).is_none_or(|e| e > args.len()) {
                return Err(shape(
                    OP,
                    format!("workgroup counts at word {at} of {}", args.len()),
                ));
            }
            Self::distinct(OP, y, &[args])?;
        }
        self.check_binding(OP, x)?;
        self.check_binding(OP, y)?;
        if runs.count == 0 {
            return Ok(());
        }
        // Columns the table names beyond x or y are read and written
        // clamped to the bindings (WGSL's bounds rules): only this step's
        // values can be wrong, never another buffer.
        let params = MatParams {
            rows: to_u32(OP, "rows", mat_rows)?,
            k: to_u32(OP, "k", k)?,
            row_bytes: to_u32(OP, "row bytes", w.row_bytes() as usize)?,
            ncols: to_u32(OP, "columns", runs.maxc)?,
            x_stride: to_u32(OP, "x stride", x_stride)?,
            y_stride: to_u32(OP, "y stride", y_stride)?,
            runs_at: to_u32(OP, "table offset", runs.at)?,
            ..MatParams::default()
        };
        let ms = forced.unwrap_or_else(|| MatvecShape::choose(self.gpu, k.div_ceil(32)));
        let (gx, gy) = self.runs_grid_shaped(ms, out_rows, glu.is_some());
        let ms = if glu.is_some() { ms.for_glu() } else { ms };
        let src = if x_stride % 4 == 0 && k % 4 == 0 {
            XSrc::Storage4
        } else {
            XSrc::Storage
        };
        let kind = FuseKind {
            runs: true,
            ..FuseKind::default()
        };
        let sg = self.gpu.lane_broadcast();
        let spec = matvec_spec_fused(w.ty(), runs.maxc, ms, src, glu, sg, kind);
        let groups = [gx, gy, runs.count as u32];
        // One dispatch per binding, each over every run: a run whose matrix
        // another binding holds returns at once (common/runs_on.wgsl). A
        // binding's byte offsets fit the kernel's u32 (the upload bounds
        // every chunk).
        for chunk in &w.chunks {
            let params = MatParams {
                mat_first: chunk.first_row / params.rows,
                n_mats: chunk.rows / params.rows,
                ..params
            };
            let mut ranges = product_ranges(w.ty(), &chunk.buf, &x.buf, &y.buf);
            ranges.push((&runs.table.buf, 0, None));
            match runs.indirect {
                Some((args, at)) => {
                    self.push_ranges_indirect(&spec, &ranges, &params, groups, args, at)?
                }
                None => self.push_ranges(&spec, &ranges, &params, groups)?,
            }
        }
        Ok(())
    }

    /// The first two workgroup counts of [`Batch::matmul_runs`] over `w`'s
    /// `n_mats` matrices (the third is the runs): what a kernel that
    /// writes an indirect dispatch's counts ([`Runs::indirect`]) writes.
    pub fn runs_grid(&self, w: &Weight, n_mats: usize, glu: bool) -> (u32, u32) {
        let mat_rows = w.rows() / n_mats.max(1);
        let out_rows = if glu { mat_rows / 2 } else { mat_rows };
        let ms = MatvecShape::choose(self.gpu, w.cols().div_ceil(32));
        self.runs_grid_shaped(ms, out_rows, glu)
    }

    fn runs_grid_shaped(&self, ms: MatvecShape, out_rows: usize, glu: bool) -> (u32, u32) {
        let wg_rows = if glu {
            ms.wg / ms.tpr
        } else {
            ms.rows_per_wg()
        };
        self.gpu.grid((out_rows as u32).div_ceil(wg_rows))
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
            let all = [
                (&chunk.buf, None),
                (&ids.buf, None),
                (&y.buf, None),
                (&chunk.buf, None),
            ];
            let n_bind = quant::weight_bindings(w.ty());
            self.push(
                &get_rows_spec(w.ty()),
                &all[..n_bind],
                &params,
                [groups_x, n.min(65535), n.div_ceil(65535)],
            )?;
        }
        Ok(())
    }
}
