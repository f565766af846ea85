//! The f32 kernels around the mat-muls: RMSNorm, RoPE, softmax, attention,
//! gated activations, add, bias rows, scale and copy, and each row's argmax.

use super::{shape, to_u32, Batch, KvElem};
use crate::buffer::Tensor;
use crate::error::GpuError;
use crate::params::{
    ArgmaxParams, AttnParams, CopyParams, EltParams, NormParams, RopeParams, SoftmaxParams,
};
use crate::shader::KernelSpec;

const ELT_WG: u32 = 256;

/// Where one token of a step sits in the KV cache buffers: its keys and
/// values go to row `row`, it is at position `pos` (its RoPE angle and
/// causal limit), and its sequence's rows start at `row - pos`. A table of
/// these lets one RoPE + cache-write dispatch and one attention dispatch
/// serve the tokens of several sequences that share cache buffers, each at
/// its own position in its own rows.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct TokenRow {
    pub row: u32,
    pub pos: u32,
}

/// A token table: the entries on the host, where they are checked against
/// the caches, and the same entries in `gpu` from element 0 (two `u32`
/// each, as [`Gpu::write_u32`](crate::Gpu::write_u32) writes them). Token
/// `t` of a dispatch recorded at `first` is entry `first + t`.
#[derive(Clone, Copy, Debug)]
pub struct TokenTable<'a> {
    pub host: &'a [TokenRow],
    pub gpu: &'a Tensor,
}

impl TokenTable<'_> {
    /// Entries `first .. first + n`, if the table has them on both sides.
    pub(super) fn entries(&self, first: usize, n: usize) -> Option<&[TokenRow]> {
        let end = first.checked_add(n)?;
        (end.checked_mul(2)? <= self.gpu.len())
            .then(|| self.host.get(first..end))
            .flatten()
    }
}

/// A table for one sequence at positions `pos0..` in rows `pos0..` (the
/// unbatched calls): entries `first .. first + n`, those before `first`
/// unused.
pub(super) fn one_sequence_table(first: usize, n: usize, pos0: usize) -> Option<Vec<TokenRow>> {
    let mut v = vec![TokenRow::default(); first.checked_add(n)?];
    for (t, e) in v[first..].iter_mut().enumerate() {
        let p = u32::try_from(pos0.checked_add(t)?).ok()?;
        *e = TokenRow { row: p, pos: p };
    }
    Some(v)
}

/// Attention settings for [`Batch::attention`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Attention {
    pub n_tokens: usize,
    pub n_head: usize,
    /// KV heads; `n_head` must be a multiple (grouped-query attention).
    pub n_kv_head: usize,
    pub head_dim: usize,
    /// Position of the first token; the cache holds positions `0..pos0 + n_tokens`.
    pub pos0: usize,
    /// Sliding window (each token sees itself and the `window − 1` before it); 0: none.
    pub window: usize,
    /// Multiplier of `q·k` before the softmax (usually `1/√head_dim`).
    pub scale: f32,
    /// How the caches store keys and values.
    pub kv: KvElem,
    /// Rows per sequence when the caches are rings (a sliding-window
    /// layer's: position p in row `first + p mod ring`, the window within
    /// the ring); 0 for caches of every position.
    pub ring: usize,
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
    /// Every angle times this (linear RoPE scaling; 1 without).
    pub freq_scale: f32,
    /// Every cosine and sine times this (LongRoPE's attention factor; 1
    /// without).
    pub mscale: f32,
    /// Where the token table holds the `n_rot / 2` per-pair frequency
    /// divisors (f32 bits, one word each) after its entries; `None`: all 1.
    /// Only the kernels that read the table ([`Batch::rope_kv_rows`] and
    /// the QKV product's RoPE epilogue) take them.
    pub factors_at: Option<u32>,
}

impl Rope {
    /// The kernels' `ff_at`: the factors' table word, or `u32::MAX`.
    pub(crate) fn ff_at(&self) -> u32 {
        self.factors_at.unwrap_or(u32::MAX)
    }
}

fn glu_spec(act: &str) -> KernelSpec {
    KernelSpec::new("glu.wgsl").def("ACT", act)
}

/// Values one argmax workgroup reduces (`shaders/argmax.wgsl`): 16 per
/// invocation, so Gemma 3's 262144 logits take 64 workgroups per row, and
/// a second stage of one workgroup joins their 64 pairs.
const ARGMAX_CHUNK: usize = 4096;
/// The longest row [`Batch::argmax_rows`] takes in its two stages.
pub const ARGMAX_MAX_LEN: usize = ARGMAX_CHUNK * ARGMAX_CHUNK;
/// The index [`Batch::argmax_rows`] gives a row with no number in it.
pub const ARGMAX_NONE: u32 = u32::MAX;

/// Scratch words [`Batch::argmax_rows`] needs for `rows` rows of `len`.
pub fn argmax_scratch_len(rows: usize, len: usize) -> usize {
    rows.saturating_mul(len.div_ceil(ARGMAX_CHUNK))
        .saturating_mul(2)
}

fn argmax_spec() -> KernelSpec {
    KernelSpec::new("argmax.wgsl").def("CH", ARGMAX_CHUNK.to_string())
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
        glu_spec("sigmoid"),
        binary_spec("+"),
        binary_spec("*"),
        KernelSpec::new("scale.wgsl"),
        KernelSpec::new("copy.wgsl"),
        KernelSpec::new("copy_f32.wgsl"),
        KernelSpec::new("add_rows.wgsl"),
        argmax_spec(),
    ]
    .into_iter()
    .chain([32, 64, 80, 128, 256, 2048].into_iter().flat_map(|hd| {
        (1..=MAX_HEADS_PER_WG)
            .filter(move |&g| attention_shared(g, hd) <= ATTN_SHARED_VALUES)
            .map(move |g| attention_spec(g, hd, KvElem::F32))
    }))
    // q8_0 caches at the head sizes that take them (multiples of 32).
    .chain([32, 64, 128, 256].into_iter().flat_map(|hd| {
        (1..=MAX_HEADS_PER_WG)
            .filter(move |&g| attention_shared(g, hd) <= ATTN_SHARED_VALUES)
            .map(move |g| attention_spec(g, hd, KvElem::Q8_0))
    }))
    .chain([attention_combine_spec()])
    .collect()
}

/// The lanes attention over f32 and q8_0 caches (it needs `SUBGROUP`; the
/// f16 variants are in [`attention_f16_specs`]).
#[cfg(test)]
pub(crate) fn attention_lanes_specs() -> Vec<KernelSpec> {
    [32, 64, 96, 128]
        .map(|hd| attention_lanes_spec(hd, KvElem::F32))
        .into_iter()
        .chain([32, 64, 128].map(|hd| attention_lanes_spec(hd, KvElem::Q8_0)))
        .collect()
}

/// The attention variants over f16 caches (they need `SHADER_F16`).
#[cfg(test)]
pub(crate) fn attention_f16_specs() -> Vec<KernelSpec> {
    [64, 128, 256]
        .into_iter()
        .flat_map(|hd| {
            (1..=MAX_HEADS_PER_WG)
                .filter(move |&g| attention_shared(g, hd) <= ATTN_SHARED_VALUES)
                .map(move |g| attention_spec(g, hd, KvElem::F16))
        })
        .chain([64, 128].map(|hd| attention_lanes_spec(hd, KvElem::F16)))
        .collect()
}

/// Most query heads one attention workgroup serves (its accumulators are
/// registers: one per head).
const MAX_HEADS_PER_WG: usize = 8;
/// Workgroup memory for the served heads' queries (values).
const ATTN_Q_VALUES: usize = 2048;
/// Below this many workgroups an attention step would leave a GPU's cores
/// idle, so heads are not grouped further. A CPU-backed device (lavapipe)
/// runs a workgroup per CPU thread at a time and pays for every workgroup's
/// barriers, so there the floor is its thread count: serving all the query
/// heads of a KV group in one workgroup (9 workgroups per SmolLM2 token
/// become 3) decodes faster there (docs/perf/lavapipe.md, 2026-12-05).
const ATTN_MIN_WGS: usize = 16;
/// Positions per attention chunk (`shaders/attention.wgsl`). Each chunk of a
/// token is a workgroup, so a decoded token at position p spreads over
/// p / 256 + 1 workgroups per head group; the partials cost (head_dim + 4) /
/// 256 of the scores a whole-context softmax would keep. At least four times
/// the workgroup size, so the lanes' value sums fit where the scores were.
pub const ATTN_CHUNK: usize = 256;
/// Invocations per attention workgroup.
const ATTN_WG: usize = 64;
/// Workgroup memory an attention workgroup may use, in f32s (WebGPU's
/// guaranteed 16 KiB).
const ATTN_SHARED_VALUES: usize = 4096;

fn attention_spec(heads: usize, head_dim: usize, kv: KvElem) -> KernelSpec {
    let hd4 = head_dim / 4;
    KernelSpec::new("attention.wgsl")
        .def("KV", kv.wgsl())
        .def("KV_VEC", kv.wgsl_vec())
        .def("KV_LOAD", kv.load())
        .def("KV_ENABLE", kv.enable())
        .def("GC", heads.to_string())
        .def("HD", head_dim.to_string())
        .def("C", ATTN_CHUNK.to_string())
        .def("R", (ATTN_WG / hd4).max(1).to_string())
        .def("QS4", (heads * hd4).to_string())
        .def("ES", (heads * ATTN_CHUNK).to_string())
        .def("RED", (heads * ATTN_WG).to_string())
}

/// `shaders/attention_lanes.wgsl`, for heads of `head_dim`.
fn attention_lanes_spec(head_dim: usize, kv: KvElem) -> KernelSpec {
    KernelSpec::new("attention_lanes.wgsl")
        .def("KV", kv.wgsl())
        .def("KV_VEC", kv.wgsl_vec())
        .def("KV_LOAD", kv.load())
        .def("KV_ENABLE", kv.enable())
        .def("HD", head_dim.to_string())
        .def("C", ATTN_CHUNK.to_string())
}

/// Head sizes the lanes kernel takes: eight lanes load a row in whole
/// vec4s, and a lane's query, row and sums (4 × head_dim values) stay
/// small enough not to spill (heads of 256 ran slower than attention.wgsl;
/// see the shader's header).
fn lanes_head_dim(head_dim: usize) -> bool {
    head_dim % 32 == 0 && head_dim <= 128
}

/// Fewest tokens in a step for the lanes kernel: below, a subgroup's lanes
/// would be mostly idle, and decoding steps (a token per sequence) keep
/// attention.wgsl, whose lanes are positions.
const LANES_MIN_TOKENS: usize = 16;

/// Whether a step of `n_tokens` tokens whose furthest position is
/// `kv_len - 1` runs the lanes kernel (given the device and head size allow
/// it). Its grid is a workgroup per 64 tokens and head, each lane walking
/// its token's positions three times, where attention.wgsl spreads every
/// (token, head group, 256-position chunk) over a workgroup: a few tokens
/// over a long cache leave the lanes kernel too few, too long tasks. On
/// lavapipe it made prompts and filling a long cache faster but 16 tokens
/// at depth 4096 slower (docs/perf/lavapipe.md, 2026-12-06, "the q8_0 GPU
/// cache, …"). So: steps of a workgroup's 64 tokens or more, or whose
/// positions fit one chunk.
fn lanes_fit(n_tokens: usize, kv_len: usize) -> bool {
    n_tokens >= LANES_MIN_TOKENS && (n_tokens >= ATTN_WG || kv_len <= ATTN_CHUNK)
}

fn attention_combine_spec() -> KernelSpec {
    KernelSpec::new("attention_combine.wgsl").def("C", ATTN_CHUNK.to_string())
}

/// Workgroup memory (f32s) of an attention workgroup serving `heads` heads.
fn attention_shared(heads: usize, head_dim: usize) -> usize {
    heads * (head_dim + ATTN_CHUNK + ATTN_WG)
}

/// Chunks of the longest token range of a step whose furthest position is
/// `kv_len - 1`: the chunk index space of its partials.
fn attention_chunks(kv_len: usize) -> usize {
    kv_len.div_ceil(ATTN_CHUNK).max(1)
}

/// Elements of the scratch [`Batch::attention`] needs for `n_tokens` tokens
/// of `n_head` heads of `head_dim` whose positions are below `kv_len`: the
/// chunk partials, `head_dim + 4` values per (token, head, chunk).
pub fn attention_scratch_len(
    n_tokens: usize,
    n_head: usize,
    head_dim: usize,
    kv_len: usize,
) -> usize {
    n_tokens
        .saturating_mul(n_head)
        .saturating_mul(attention_chunks(kv_len))
        .saturating_mul(head_dim + 4)
}

/// Query heads per attention workgroup: a divisor of the group size (the
/// heads sharing a KV head), at most 8 and within the workgroup memory, as
/// large as still gives ATTN_MIN_WGS workgroups (more sharing of each key
/// and value load, enough workgroups to fill the device); 1 when nothing
/// larger fits. Every choice gives the same bits.
fn heads_per_wg(
    n_tokens: usize,
    n_head: usize,
    n_kv_head: usize,
    head_dim: usize,
    chunks: usize,
    min_wgs: usize,
) -> usize {
    let group = n_head / n_kv_head;
    (1..=group.min(MAX_HEADS_PER_WG))
        .rev()
        .filter(|&g| group % g == 0 && attention_shared(g, head_dim) <= ATTN_SHARED_VALUES)
        .find(|g| n_tokens * n_head / g * chunks >= min_wgs)
        .unwrap_or(1)
}

/// The fewest attention workgroups a step should spread over on `gpu` (see
/// [`ATTN_MIN_WGS`]).
fn attention_min_wgs(gpu: &crate::Gpu) -> usize {
    // Asked once: on Linux the answer reads the cgroup's CPU quota, and
    // this runs for every attention dispatch.
    static CPU_THREADS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    if gpu.adapter_info().device_type == "cpu" {
        *CPU_THREADS.get_or_init(|| std::thread::available_parallelism().map_or(2, |n| n.get()))
    } else {
        ATTN_MIN_WGS
    }
}

impl Batch<'_> {
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
        let per_token = rope.n_heads * rope.head_dim;
        let tokens = if per_token == 0 || x.len() % per_token != 0 {
            usize::MAX
        } else {
            x.len() / per_token
        };
        self.rope_tokens(x, y, rope, 0, tokens)
    }

    /// [`Batch::rope`] of tokens `first..first + n` only (one sequence of a
    /// batch); token `first` is at position `rope.pos_offset`.
    pub fn rope_tokens(
        &mut self,
        x: &Tensor,
        y: &Tensor,
        rope: &Rope,
        first: usize,
        n: usize,
    ) -> Result<(), GpuError> {
        const OP: &str = "rope";
        let per_token = rope.n_heads * rope.head_dim;
        let end = first.checked_add(n).and_then(|t| t.checked_mul(per_token));
        if per_token == 0
            || end.is_none_or(|e| e > x.len() || e > y.len())
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
        if rope.factors_at.is_some() || rope.freq_scale != 1.0 || rope.mscale != 1.0 {
            return Err(shape(
                OP,
                "the table-less RoPE kernel takes no frequency factors or scales".into(),
            ));
        }
        let params = RopeParams {
            head_dim: to_u32(OP, "head_dim", rope.head_dim)?,
            n_rot: to_u32(OP, "n_rot", rope.n_rot)?,
            n_heads: to_u32(OP, "n_heads", rope.n_heads)?,
            n_tokens: to_u32(OP, "tokens", n)?,
            pos_offset: rope.pos_offset,
            neox: u32::from(rope.neox),
            freq_base: rope.freq_base,
            base: to_u32(OP, "first element", first * per_token)?,
        };
        if n == 0 {
            return Ok(());
        }
        let pairs = to_u32(OP, "pairs", n * per_token / 2)?;
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

    /// Each row's argmax (ties to the lowest index, NaN never chosen, as
    /// lamina_sampling's `argmax`): row `r` is the `len` values of `x` from
    /// element `r * stride`. `out` gets two words per row, an order key
    /// and the index, which is [`ARGMAX_NONE`] for a row of NaN only.
    /// `scratch` holds the first stage's pairs when a row takes more than
    /// one workgroup: [`argmax_scratch_len`] words. Two dispatches at most:
    /// rows of up to [`ARGMAX_MAX_LEN`] values.
    pub fn argmax_rows(
        &mut self,
        x: &Tensor,
        rows: usize,
        len: usize,
        stride: usize,
        scratch: &Tensor,
        out: &Tensor,
    ) -> Result<(), GpuError> {
        const OP: &str = "argmax";
        let last = rows
            .checked_sub(1)
            .and_then(|r| r.checked_mul(stride))
            .and_then(|a| a.checked_add(len));
        let pairs = len.div_ceil(ARGMAX_CHUNK);
        if len == 0
            || len > ARGMAX_MAX_LEN
            || (rows > 1 && stride < len)
            || last.is_some_and(|end| end > x.len())
            || rows.checked_mul(2).is_none_or(|w| w > out.len())
            || (pairs > 1 && argmax_scratch_len(rows, len) > scratch.len())
        {
            return Err(shape(
                OP,
                format!(
                    "{rows} rows of {len} (stride {stride}) in {} values, scratch {}, out {}",
                    x.len(),
                    scratch.len(),
                    out.len()
                ),
            ));
        }
        Self::distinct(OP, out, &[x, scratch])?;
        Self::distinct(OP, scratch, &[x])?;
        if rows == 0 {
            return Ok(());
        }
        let rows32 = to_u32(OP, "rows", rows)?;
        if rows32 > self.gpu.limits().max_compute_workgroups_per_dimension {
            return Err(shape(OP, format!("{rows} rows in one dispatch")));
        }
        let stage =
            |len: usize, stride: usize, chunks: usize, pairs: bool| -> Result<_, GpuError> {
                Ok(ArgmaxParams {
                    rows: rows32,
                    len: to_u32(OP, "len", len)?,
                    stride: to_u32(OP, "stride", stride)?,
                    chunks: to_u32(OP, "chunks", chunks)?,
                    pairs: u32::from(pairs),
                    _pad: [0; 3],
                })
            };
        let spec = argmax_spec();
        let first_out = if pairs > 1 { scratch } else { out };
        self.push(
            &spec,
            &[(&x.buf, None), (&first_out.buf, None)],
            &stage(len, stride, pairs, false)?,
            [pairs as u32, rows32, 1],
        )?;
        if pairs > 1 {
            self.push(
                &spec,
                &[(&scratch.buf, None), (&out.buf, None)],
                &stage(pairs, pairs, 1, true)?,
                [1, rows32, 1],
            )?;
        }
        Ok(())
    }

    pub(super) fn elementwise(
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
            dim: 0,
            _pad: 0,
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

    /// `y[i] = x[i] + b[i % dim]`: the row `b` (length `dim`) added to every
    /// `dim`-row of `x` (biases).
    pub fn add_rows(
        &mut self,
        x: &Tensor,
        b: &Tensor,
        y: &Tensor,
        dim: usize,
    ) -> Result<(), GpuError> {
        const OP: &str = "add_rows";
        if dim == 0 || b.len() != dim || x.len() % dim != 0 || y.len() < x.len() {
            return Err(shape(
                OP,
                format!(
                    "x {} elements, row {}, y {}, dim {dim}",
                    x.len(),
                    b.len(),
                    y.len()
                ),
            ));
        }
        Self::distinct(OP, y, &[x, b])?;
        if x.is_empty() {
            return Ok(());
        }
        let n = to_u32(OP, "n", x.len())?;
        let params = EltParams {
            n,
            dim: to_u32(OP, "dim", dim)?,
            ..EltParams::default()
        };
        let (gx, gy) = self.gpu.grid(n.div_ceil(ELT_WG));
        self.push(
            &KernelSpec::new("add_rows.wgsl"),
            &[(&x.buf, None), (&b.buf, None), (&y.buf, None)],
            &params,
            [gx, gy, 1],
        )
    }

    /// Copies `len` elements from `src[src_offset..]` to `dst[dst_offset..]`
    /// inside the batch (e.g. new keys into a KV cache).
    pub fn copy(
        &mut self,
        src: &Tensor,
        src_offset: usize,
        dst: &Tensor,
        dst_offset: usize,
        len: usize,
    ) -> Result<(), GpuError> {
        const OP: &str = "copy";
        let fits = |off: usize, t: &Tensor| off.checked_add(len).is_some_and(|e| e <= t.len());
        if !fits(src_offset, src) || !fits(dst_offset, dst) {
            return Err(shape(
                OP,
                format!(
                    "{len} elements from {src_offset} of {} to {dst_offset} of {}",
                    src.len(),
                    dst.len()
                ),
            ));
        }
        Self::distinct(OP, dst, &[src])?;
        if len == 0 {
            return Ok(());
        }
        let params = CopyParams {
            n: to_u32(OP, "len", len)?,
            src_offset: to_u32(OP, "src_offset", src_offset)?,
            dst_offset: to_u32(OP, "dst_offset", dst_offset)?,
            _pad: 0,
        };
        let (gx, gy) = self.gpu.grid(params.n.div_ceil(ELT_WG));
        self.push(
            &KernelSpec::new("copy_f32.wgsl"),
            &[(&src.buf, None), (&dst.buf, None)],
            &params,
            [gx, gy, 1],
        )
    }

    /// Causal attention of `q` over the KV cache `k`, `v` into `out`, using
    /// `scratch` (≥ [`attention_scratch_len`] elements) for the partials of
    /// tokens whose positions span several chunks. Layouts: `q`, `out` =
    /// `[token][head][head_dim]`; `k`, `v` = `[position][kv_head][head_dim]`
    /// (see `shaders/attention.wgsl`); `head_dim` a multiple of 4.
    pub fn attention(
        &mut self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        scratch: &Tensor,
        out: &Tensor,
        a: &Attention,
    ) -> Result<(), GpuError> {
        self.attention_at(q, k, v, scratch, out, a, 0)
    }

    /// [`Batch::attention`] for tokens stored from token index `first` of
    /// `q` and `out` (one sequence of a batch, over its own cache).
    #[allow(clippy::too_many_arguments)]
    pub fn attention_at(
        &mut self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        scratch: &Tensor,
        out: &Tensor,
        a: &Attention,
        first: usize,
    ) -> Result<(), GpuError> {
        let host = one_sequence_table(first, a.n_tokens, a.pos0)
            .ok_or_else(|| shape("attention", format!("{a:?} from token {first}")))?;
        let gpu = self.gpu.upload_u32(bytemuck::cast_slice(&host))?;
        let table = TokenTable {
            host: &host,
            gpu: &gpu,
        };
        self.attention_rows(q, k, v, scratch, out, a, table, first)
    }

    /// Attention for tokens `first .. first + a.n_tokens` of `q` and `out`,
    /// each at the position and over the cache rows its entry of `table`
    /// gives (`a.pos0` is not used): tokens of several sequences sharing the
    /// cache buffers `k` and `v` in one dispatch, each with the bits it gets
    /// alone. `scratch` needs [`attention_scratch_len`] of (`n_tokens`,
    /// `n_head`, `head_dim`, largest position + 1) elements. One dispatch,
    /// and a second to join the chunks when some token spans more than one.
    #[allow(clippy::too_many_arguments)]
    pub fn attention_rows(
        &mut self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        scratch: &Tensor,
        out: &Tensor,
        a: &Attention,
        table: TokenTable<'_>,
        first: usize,
    ) -> Result<(), GpuError> {
        const OP: &str = "attention";
        let bad = |why: String| shape(OP, format!("{a:?} from token {first}: {why}"));
        let rows = table
            .entries(first, a.n_tokens)
            .ok_or_else(|| bad(format!("a table of {} entries", table.host.len())))?;
        let kvd = a.n_kv_head * a.head_dim;
        // Every token's rows (its sequence's, up to its own) inside the
        // caches; the partials as many chunks as the furthest position needs.
        let mut kv_len = 0usize;
        let mut split = false;
        // A ring holds each sequence's last `ring` positions: the window
        // must fit in it (the caller keeps each step within the ring too).
        let ring = if a.ring == 0 { usize::MAX } else { a.ring };
        if a.ring > 0 && (a.window == 0 || a.window > a.ring) {
            return Err(bad(format!(
                "a ring of {} rows for a window of {}",
                a.ring, a.window
            )));
        }
        for e in rows {
            // The sequence's rows: base .. base + min(ring, pos + 1).
            let at = e.pos as usize % ring;
            let base = (e.row as usize).checked_sub(at);
            let end = base
                .and_then(|b| b.checked_add(ring.min(e.pos as usize + 1)))
                .and_then(|r| r.checked_mul(kvd));
            let (kn, vn) = (a.kv.values(k.len()), a.kv.values(v.len()));
            if end.is_none_or(|end| end > kn || end > vn) {
                return Err(bad(format!(
                    "token at position {} in row {} of caches of {} and {} elements",
                    e.pos,
                    e.row,
                    k.len(),
                    v.len()
                )));
            }
            let pos = e.pos as usize;
            kv_len = kv_len.max(pos + 1);
            let lo = if a.window > 0 {
                (pos + 1).saturating_sub(a.window)
            } else {
                0
            };
            split |= lo / ATTN_CHUNK != pos / ATTN_CHUNK;
        }
        let q_offset = first * a.n_head * a.head_dim;
        let q_len = q_offset + a.n_tokens * a.n_head * a.head_dim;
        let chunks = attention_chunks(kv_len);
        if a.n_kv_head == 0
            || a.head_dim == 0
            || a.head_dim % 4 != 0
            || a.head_dim > ATTN_Q_VALUES
            || a.n_head % a.n_kv_head != 0
            || q.len() < q_len
            || out.len() < q_len
            || scratch.len() < attention_scratch_len(a.n_tokens, a.n_head, a.head_dim, kv_len)
        {
            return Err(bad(format!(
                "q {}, scratch {}, out {} elements (head_dim a multiple of 4 up to {ATTN_Q_VALUES})",
                q.len(),
                scratch.len(),
                out.len()
            )));
        }
        Self::distinct(OP, scratch, &[q, k, v, out, table.gpu])?;
        Self::distinct(OP, out, &[q, k, v, table.gpu])?;
        if a.n_tokens == 0 || a.n_head == 0 {
            return Ok(());
        }
        // The kernel and its grid: a workgroup per 64 tokens and head for
        // the lanes kernel, else per (token, head group, chunk).
        let lanes =
            self.gpu.attn_lanes() && lanes_fit(a.n_tokens, kv_len) && lanes_head_dim(a.head_dim);
        let (spec, groups) = if lanes {
            (
                attention_lanes_spec(a.head_dim, a.kv),
                a.n_tokens.div_ceil(ATTN_WG) * a.n_head,
            )
        } else {
            let heads = heads_per_wg(
                a.n_tokens,
                a.n_head,
                a.n_kv_head,
                a.head_dim,
                chunks,
                attention_min_wgs(self.gpu),
            );
            (
                attention_spec(heads, a.head_dim, a.kv),
                a.n_tokens * a.n_head / heads * chunks,
            )
        };
        let groups = to_u32(OP, "workgroups", groups)?;
        to_u32(OP, "scratch", scratch.len())?;
        to_u32(OP, "cache", a.kv.values(k.len().min(v.len())))?;
        to_u32(OP, "q", q_len)?;
        a.kv.check(self.gpu, OP, a.head_dim)?;
        let params = AttnParams {
            n_tokens: to_u32(OP, "n_tokens", a.n_tokens)?,
            n_head: to_u32(OP, "n_head", a.n_head)?,
            n_kv_head: to_u32(OP, "n_kv_head", a.n_kv_head)?,
            head_dim: to_u32(OP, "head_dim", a.head_dim)?,
            tab_first: to_u32(OP, "first", first)?,
            window: to_u32(OP, "window", a.window)?,
            n_chunks: to_u32(OP, "n_chunks", chunks)?,
            scale: a.scale,
            q_offset: to_u32(OP, "q_offset", q_offset)?,
            ring: if a.ring == 0 {
                u32::MAX
            } else {
                to_u32(OP, "ring", a.ring)?
            },
            _pad: [0; 2],
        };
        let (gx, gy) = self.gpu.grid(groups);
        self.push(
            &spec,
            &[
                (&q.buf, None),
                (&k.buf, None),
                (&v.buf, None),
                (&scratch.buf, None),
                (&out.buf, None),
                (&table.gpu.buf, None),
            ],
            &params,
            [gx, gy, 1],
        )?;
        if !split {
            return Ok(());
        }
        let columns = a.n_tokens * a.n_head * a.head_dim / 4;
        let (gx, gy) = self
            .gpu
            .grid(to_u32(OP, "columns", columns.div_ceil(ATTN_WG))?);
        self.push(
            &attention_combine_spec(),
            &[
                (&scratch.buf, None),
                (&out.buf, None),
                (&table.gpu.buf, None),
            ],
            &params,
            [gx, gy, 1],
        )
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
            ..EltParams::default()
        };
        let (gx, gy) = self.gpu.grid(words.div_ceil(ELT_WG));
        self.push(
            &KernelSpec::new("copy.wgsl"),
            &[(src, None), (dst, None)],
            &params,
            [gx, gy, 1],
        )
    }
}
