//! The uniform structs handed to kernels, one Rust definition each. Their WGSL
//! twins live in `shaders/common/params.wgsl`; a test checks that naga lays
//! each out with the size given here.

use bytemuck::{Pod, Zeroable};

/// `MatParams`: weight × activations (mat-vec, small-N and tiled mat-mul).
/// Activation column `c` starts at `x_offset + c * x_stride`, output column
/// `c` at `y_offset + c * y_stride`; this dispatch covers weight rows
/// `row_offset .. row_offset + rows` (one binding chunk).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub(crate) struct MatParams {
    pub rows: u32,
    pub k: u32,
    pub row_bytes: u32,
    pub ncols: u32,
    pub row_offset: u32,
    pub x_offset: u32,
    pub x_stride: u32,
    pub y_offset: u32,
    pub y_stride: u32,
    /// The norm prologue's epsilon ([`crate::Fuse::norm`]).
    pub eps: f32,
    /// A dispatch over runs ([`crate::Runs`]): the run table's first word,
    /// and how many matrices of `rows` rows the weight holds.
    pub runs_at: u32,
    pub n_mats: u32,
    /// The RoPE epilogue ([`crate::Fuse::rope`]): the QKV layout, the
    /// token table entry of column 0, the rotation.
    pub head_dim: u32,
    pub n_rot: u32,
    pub n_head: u32,
    pub n_kv_head: u32,
    pub tab_first: u32,
    pub neox: u32,
    pub freq_base: f32,
    pub ff_at: u32,
    pub freq_scale: f32,
    pub mscale: f32,
    /// RUNS = on: the first matrix this dispatch's weight buffer holds
    /// (its `n_mats` matrices from here; runs naming others compute nothing).
    pub mat_first: u32,
    pub _pad3: u32,
}

/// `RowsParams`: row lookup from one weight chunk holding rows
/// `row_start .. row_start + rows`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub(crate) struct RowsParams {
    pub k: u32,
    pub row_bytes: u32,
    pub row_start: u32,
    pub rows: u32,
    pub n_ids: u32,
    pub _pad: [u32; 3],
}

/// `NormParams`: RMSNorm over `rows` rows of `dim` values.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub(crate) struct NormParams {
    pub dim: u32,
    pub rows: u32,
    pub eps: f32,
    pub _pad: u32,
}

/// `RopeParams`: rotary embedding of `n_tokens × n_heads` vectors of `head_dim`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub(crate) struct RopeParams {
    pub head_dim: u32,
    pub n_rot: u32,
    pub n_heads: u32,
    pub n_tokens: u32,
    pub pos_offset: u32,
    pub neox: u32,
    pub freq_base: f32,
    pub base: u32,
}

/// `SoftmaxParams`: row-wise softmax of `rows` rows of `cols` values,
/// inputs multiplied by `scale` first.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub(crate) struct SoftmaxParams {
    pub cols: u32,
    pub rows: u32,
    pub scale: f32,
    pub _pad: u32,
}

/// `EltParams`: element-wise ops over `n` values (`dim`: the broadcast row
/// length of `add_rows`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub(crate) struct EltParams {
    pub n: u32,
    pub scale: f32,
    pub dim: u32,
    pub _pad: u32,
}

/// `CopyParams`: `n` elements from `src_offset` to `dst_offset`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub(crate) struct CopyParams {
    pub n: u32,
    pub src_offset: u32,
    pub dst_offset: u32,
    pub _pad: u32,
}

/// `AttnParams`: see `shaders/attention.wgsl`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub(crate) struct AttnParams {
    pub n_tokens: u32,
    pub n_head: u32,
    pub n_kv_head: u32,
    pub head_dim: u32,
    /// The dispatch's first entry of the token table.
    pub tab_first: u32,
    pub window: u32,
    /// Chunks per (token, head) in the partials.
    pub n_chunks: u32,
    pub scale: f32,
    pub q_offset: u32,
    /// Rows per sequence of a ring cache (position p in row p mod ring);
    /// `u32::MAX` for a cache of every position.
    pub ring: u32,
    pub _pad: [u32; 2],
}

/// `HeadNormParams`: per-head RMSNorm of the query and key heads of a
/// stacked QKV product.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub(crate) struct HeadNormParams {
    pub head_dim: u32,
    pub n_tokens: u32,
    pub n_head: u32,
    pub n_kv_head: u32,
    pub stride: u32,
    pub base: u32,
    pub eps: f32,
    pub _pad: u32,
}

/// `RopeKvParams`: RoPE of the stacked QKV product's queries and keys, keys
/// and values into the cache.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub(crate) struct RopeKvParams {
    pub head_dim: u32,
    pub n_rot: u32,
    pub n_head: u32,
    pub n_kv_head: u32,
    pub n_tokens: u32,
    /// The dispatch's first entry of the token table.
    pub tab_first: u32,
    pub neox: u32,
    pub freq_base: f32,
    pub stride: u32,
    pub src_base: u32,
    pub q_base: u32,
    pub ff_at: u32,
    pub freq_scale: f32,
    pub mscale: f32,
    pub _pad: [u32; 2],
}

/// `MoePackParams`: a step's pairs packed by expert on the device
/// ([`crate::Batch::moe_pack`]).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub(crate) struct MoePackParams {
    pub nk: u32,
    pub k: u32,
    pub n_expert: u32,
    pub maxc: u32,
    pub runs_at: u32,
    pub down_at: u32,
    pub max_runs: u32,
    pub gather_at: u32,
    pub gxa: u32,
    pub gya: u32,
    pub gxb: u32,
    pub gyb: u32,
}

/// `MoeSharedParams`: a shared expert's gated output added
/// ([`crate::Batch::moe_shared`]).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub(crate) struct MoeSharedParams {
    pub n: u32,
    pub dim: u32,
    pub sy_offset: u32,
    pub _pad: u32,
}

/// `GatherParams`: columns copied into a table's order
/// ([`crate::Batch::gather_cols`]).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub(crate) struct GatherParams {
    pub m: u32,
    pub dim: u32,
    pub table_at: u32,
    pub _pad: u32,
}

/// `MoeRouteParams`: a mixture's router on the device
/// ([`crate::Batch::moe_route`]).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub(crate) struct MoeRouteParams {
    pub n: u32,
    pub n_expert: u32,
    /// Experts per token.
    pub k: u32,
    /// 1: the weights are divided by their sum.
    pub norm: u32,
    pub scale: f32,
    pub l_offset: u32,
    pub l_stride: u32,
    pub runs_at: u32,
}

/// `MoeWeighParams`: the routed experts' weighted sum
/// ([`crate::Batch::moe_weigh`]).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub(crate) struct MoeWeighParams {
    /// Outputs: tokens × dim.
    pub n: u32,
    pub dim: u32,
    /// Experts per token.
    pub k: u32,
    /// 1: add the sum to what the output holds.
    pub add: u32,
}

/// `ArgmaxParams`: one stage of each row's argmax
/// ([`crate::Batch::argmax_rows`]).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub(crate) struct ArgmaxParams {
    pub rows: u32,
    /// Items per row in this stage's input.
    pub len: u32,
    /// Items between the starts of two input rows.
    pub stride: u32,
    /// Workgroups (output pairs) per row.
    pub chunks: u32,
    /// 0: the input is f32 values; 1: (key, index) pairs.
    pub pairs: u32,
    pub _pad: [u32; 3],
}

/// `TopkParams`: one stage of each row's best values
/// ([`crate::Batch::topk_rows`]).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub(crate) struct TopkParams {
    pub rows: u32,
    /// Items per row in this stage's input.
    pub len: u32,
    /// Items between the starts of two input rows.
    pub stride: u32,
    /// Workgroups per row, each writing `k` pairs.
    pub chunks: u32,
    /// 0: the input is f32 values; 1: (key, index) pairs.
    pub pairs: u32,
    pub k: u32,
    pub _pad: [u32; 2],
}

/// `DeltaParams`: Gated DeltaNet's kernels over one sequence
/// ([`crate::ops::DeltaShape`]).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub(crate) struct DeltaParams {
    pub ch: u32,
    pub kernel: u32,
    pub first: u32,
    pub n: u32,
    pub state_at: u32,
    pub mat_at: u32,
    pub head_k: u32,
    pub head_v: u32,
    pub n_k: u32,
    pub n_v: u32,
    pub grouped: u32,
    pub eps: f32,
    pub scale: f32,
    pub _pad: [u32; 3],
}

/// Sizes naga must report for the WGSL structs of the same names.
#[cfg(test)]
pub(crate) const SIZES: &[(&str, usize)] = &[
    ("MatParams", std::mem::size_of::<MatParams>()),
    ("RowsParams", std::mem::size_of::<RowsParams>()),
    ("NormParams", std::mem::size_of::<NormParams>()),
    ("RopeParams", std::mem::size_of::<RopeParams>()),
    ("SoftmaxParams", std::mem::size_of::<SoftmaxParams>()),
    ("EltParams", std::mem::size_of::<EltParams>()),
    ("CopyParams", std::mem::size_of::<CopyParams>()),
    ("AttnParams", std::mem::size_of::<AttnParams>()),
    ("HeadNormParams", std::mem::size_of::<HeadNormParams>()),
    ("RopeKvParams", std::mem::size_of::<RopeKvParams>()),
    ("MoeWeighParams", std::mem::size_of::<MoeWeighParams>()),
    ("MoeRouteParams", std::mem::size_of::<MoeRouteParams>()),
    ("MoePackParams", std::mem::size_of::<MoePackParams>()),
    ("GatherParams", std::mem::size_of::<GatherParams>()),
    ("MoeSharedParams", std::mem::size_of::<MoeSharedParams>()),
    ("ArgmaxParams", std::mem::size_of::<ArgmaxParams>()),
    ("TopkParams", std::mem::size_of::<TopkParams>()),
    ("DeltaParams", std::mem::size_of::<DeltaParams>()),
];
