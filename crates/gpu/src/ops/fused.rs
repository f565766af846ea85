//! The decode path's fused kernels. Each replaces a chain of the kernels in
//! `elementwise` with one dispatch that performs the same operations in the
//! same order, so a fused step gives the bits of the unfused one (the tests
//! compare them): fusion saves dispatches, host work and round trips of the
//! activations through memory, and changes no result.
//!
//! They work on the layouts the stacked weights produce: one QKV product
//! row per token (`n_head` query heads, then `n_kv_head` key heads, then
//! `n_kv_head` value heads) and one gate/up row per token (gate, then up).

use super::elementwise::{one_sequence_table, TokenTable};
use super::{shape, to_u32, Batch};
use crate::buffer::Tensor;
use crate::error::GpuError;
use crate::params::{
    EltParams, GatherParams, HeadNormParams, MoePackParams, MoeRouteParams, MoeSharedParams,
    MoeWeighParams, NormParams, RopeKvParams,
};
use crate::shader::KernelSpec;
use crate::Rope;

const ELT_WG: u32 = 256;

/// The activation of a gated feed-forward block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gate {
    Silu,
    GeluTanh,
}

impl Gate {
    pub(crate) fn wgsl(self) -> &'static str {
        match self {
            Gate::Silu => "silu",
            Gate::GeluTanh => "gelu_tanh",
        }
    }
}

/// How a KV cache buffer stores its values: f32, f16 (half the bytes, on
/// devices with `SHADER_F16`; written with WGSL's f32 → f16 conversion,
/// which rounds to nearest on every device Lamina has met, as the CPU's
/// cache does), or q8_0 (llama.cpp's `-ctk q8_0`: 36 bytes per 32 values).
///
/// A q8_0 block on the GPU is 9 words: the 32 quants as i8, value 4w + b
/// in byte b of word w, then the f16 scale in the low half of word 8. The
/// host's 34-byte blocks would put every other block's quants off a word
/// boundary; two more bytes a block keep each block's words its own, so
/// the invocations quantizing neighbouring blocks never share a word. The
/// values the kernels widen (`q · d`) are the bits the CPU's q8_0 cache
/// widens.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum KvElem {
    #[default]
    F32,
    F16,
    Q8_0,
}

/// Values per q8_0 block (ggml's, as the CPU cache's), and its 32-bit
/// words on the GPU.
pub const KV_Q8_BLOCK: usize = lamina_quant::kv::Q8_0_BLOCK;
pub const KV_Q8_WORDS: usize = 9;

/// Most experts [`Batch::moe_route`] routes among (its workgroup holds a
/// key per expert); a larger mixture is routed on the host.
pub const MOE_ROUTE_MAX_EXPERTS: usize = 2048;

/// How a mixture weighs its experts ([`Batch::moe_route`]): `k` of
/// `n_expert` per token, their softmax probabilities divided by their sum
/// with `norm`, then times `scale` unless it is 0 or 1.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MoeRouting {
    pub n_expert: usize,
    pub k: usize,
    pub norm: bool,
    pub scale: f32,
}

impl MoeRouting {
    /// Words of [`Batch::moe_route`]'s output for `n` tokens: the weighed
    /// sum's table (`2·n·k`), then the gate/up product's run table
    /// (`4·n·k`, from [`MoeRouting::runs_at`]) and the down product's
    /// (`4·n·k`, from [`MoeRouting::down_runs_at`]), then room for
    /// [`Batch::moe_pack`]'s gather table (`n·k`).
    pub fn words(&self, n: usize) -> usize {
        11 * n * self.k
    }

    /// Where [`Batch::moe_pack`] puts each packed column's token.
    pub fn gather_at(&self, n: usize) -> usize {
        10 * n * self.k
    }

    /// Runs [`Batch::moe_pack`] may write for `n` tokens in runs of at
    /// most `maxc` columns: one per pair at most, and no more than a run
    /// of `maxc` per `maxc` pairs plus one per expert.
    pub fn max_runs(&self, n: usize, maxc: usize) -> usize {
        let nk = n * self.k;
        nk.min(nk / maxc.max(1) + self.n_expert.min(nk))
    }

    /// Where the gate/up product's run table starts, for `n` tokens.
    pub fn runs_at(&self, n: usize) -> usize {
        2 * n * self.k
    }

    /// Where the down product's run table starts, for `n` tokens.
    pub fn down_runs_at(&self, n: usize) -> usize {
        6 * n * self.k
    }
}

impl KvElem {
    /// Values a cache tensor of `words` 32-bit elements holds.
    pub fn values(self, words: usize) -> usize {
        match self {
            KvElem::F32 => words,
            KvElem::F16 => words.saturating_mul(2),
            KvElem::Q8_0 => (words / KV_Q8_WORDS).saturating_mul(KV_Q8_BLOCK),
        }
    }

    /// 32-bit elements to allocate for `values` values.
    pub fn words(self, values: usize) -> usize {
        match self {
            KvElem::F32 => values,
            KvElem::F16 => values.div_ceil(2),
            KvElem::Q8_0 => values.div_ceil(KV_Q8_BLOCK).saturating_mul(KV_Q8_WORDS),
        }
    }

    /// The WGSL element type of the cache's bindings as the attention
    /// kernels read them: vec4s, or q8_0's words.
    pub(crate) fn wgsl_vec(self) -> &'static str {
        match self {
            KvElem::F32 => "vec4<f32>",
            KvElem::F16 => "vec4<f16>",
            KvElem::Q8_0 => "u32",
        }
    }

    /// `common/kv_{load}.wgsl`: the attention kernels' row loads.
    pub(crate) fn load(self) -> &'static str {
        match self {
            KvElem::F32 | KvElem::F16 => "vec",
            KvElem::Q8_0 => "q8",
        }
    }

    /// The WGSL scalar type of the cache's bindings (q8_0: its words; its
    /// writer, rope_kv_q8.wgsl, names them itself).
    pub(crate) fn wgsl(self) -> &'static str {
        match self {
            KvElem::F32 => "f32",
            KvElem::F16 => "f16",
            KvElem::Q8_0 => "u32",
        }
    }

    /// The directive a kernel binding the cache starts with.
    pub(crate) fn enable(self) -> &'static str {
        match self {
            KvElem::F32 | KvElem::Q8_0 => "",
            KvElem::F16 => "enable f16;",
        }
    }

    /// Fails for f16 on a device without `SHADER_F16`, and for q8_0 blocks
    /// that would straddle heads.
    pub(crate) fn check(
        self,
        gpu: &crate::Gpu,
        op: &'static str,
        head_dim: usize,
    ) -> Result<(), GpuError> {
        if self == KvElem::F16 && !gpu.features().contains(wgpu::Features::SHADER_F16) {
            return Err(shape(
                op,
                "an f16 cache on a device without SHADER_F16".to_string(),
            ));
        }
        if self == KvElem::Q8_0 && head_dim % KV_Q8_BLOCK != 0 {
            return Err(shape(
                op,
                format!("a q8_0 cache needs heads of a multiple of 32 values, not {head_dim}"),
            ));
        }
        Ok(())
    }
}

/// Heads of a stacked QKV product row, and how the caches its keys and
/// values go to store them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QkvLayout {
    pub n_head: usize,
    pub n_kv_head: usize,
    pub head_dim: usize,
    pub kv: KvElem,
}

impl QkvLayout {
    /// Values per token: queries, keys, values.
    pub fn stride(&self) -> usize {
        (self.n_head + 2 * self.n_kv_head) * self.head_dim
    }

    pub(crate) fn q_dim(&self) -> usize {
        self.n_head * self.head_dim
    }

    pub(crate) fn kv_dim(&self) -> usize {
        self.n_kv_head * self.head_dim
    }
}

fn rope_kv_spec(kv: KvElem) -> KernelSpec {
    if kv == KvElem::Q8_0 {
        return KernelSpec::new("rope_kv_q8.wgsl");
    }
    KernelSpec::new("rope_kv.wgsl")
        .def("KV", kv.wgsl())
        .def("KV_ENABLE", kv.enable())
}

fn add_norm_spec(pre: bool) -> KernelSpec {
    KernelSpec::new("add_rms_norm.wgsl").def("PRE", if pre { "1" } else { "0" })
}

fn glu_split_spec(gate: Gate) -> KernelSpec {
    KernelSpec::new("glu_split.wgsl").def("ACT", gate.wgsl())
}

#[cfg(test)]
pub(crate) fn fused_specs() -> Vec<KernelSpec> {
    vec![
        add_norm_spec(false),
        add_norm_spec(true),
        glu_split_spec(Gate::Silu),
        glu_split_spec(Gate::GeluTanh),
        KernelSpec::new("head_norm.wgsl"),
        rope_kv_spec(KvElem::F32),
        rope_kv_spec(KvElem::Q8_0),
        KernelSpec::new("moe_weigh.wgsl"),
    ]
}

/// Every kernel that writes or reads an f16 cache (they need `SHADER_F16`):
/// rope_kv, the mat-vecs' RoPE epilogues and attention.
#[cfg(test)]
pub(crate) fn f16_cache_specs() -> Vec<KernelSpec> {
    let mut v = vec![rope_kv_spec(KvElem::F16)];
    v.extend(super::elementwise::attention_f16_specs());
    v.extend(super::matmul::rope_f16_specs());
    v
}

/// The checks RoPE + cache writes make before a dispatch (rope_kv.wgsl and
/// the mat-vec's RoPE epilogue): tokens `first .. first + n` of `table`
/// exist, their cache rows fit both caches, and the rotation fits the
/// heads.
#[allow(clippy::too_many_arguments)]
pub(crate) fn check_rope_kv(
    op: &'static str,
    layout: &QkvLayout,
    rope: &Rope,
    table: TokenTable<'_>,
    first: usize,
    n: usize,
    k_cache: &Tensor,
    v_cache: &Tensor,
) -> Result<(), GpuError> {
    let hd = layout.head_dim;
    let kvd = layout.kv_dim();
    let fits = |t: &Tensor, row: usize| {
        (row + 1)
            .checked_mul(kvd)
            .is_some_and(|e| e <= layout.kv.values(t.len()))
    };
    let bad = |why: String| shape(op, format!("tokens {first}..+{n} of {layout:?}: {why}"));
    let rows = table
        .entries(first, n)
        .ok_or_else(|| bad(format!("a table of {} entries", table.host.len())))?;
    if let Some(e) = rows
        .iter()
        .find(|e| !fits(k_cache, e.row as usize) || !fits(v_cache, e.row as usize))
    {
        return Err(bad(format!(
            "row {} of caches of {} and {} elements",
            e.row,
            k_cache.len(),
            v_cache.len()
        )));
    }
    if hd == 0 || hd % 2 != 0 || rope.n_rot % 2 != 0 || rope.n_rot > hd || rope.head_dim != hd {
        return Err(bad(format!("rotating {} of heads of {hd}", rope.n_rot)));
    }
    // The factors lie in the table's buffer, past the entries the step
    // reads (the kernels read words ff_at .. ff_at + n_rot / 2).
    if let Some(at) = rope.factors_at {
        let end = (at as usize).checked_add(rope.n_rot / 2);
        if at == u32::MAX || end.is_none_or(|e| e > table.gpu.len()) {
            return Err(bad(format!(
                "RoPE factors at word {at} of a table of {} words",
                table.gpu.len()
            )));
        }
    }
    to_u32(
        op,
        "cache",
        layout.kv.values(k_cache.len().min(v_cache.len())),
    )?;
    Ok(())
}

impl Batch<'_> {
    /// The residual add and the RMSNorm after it: `sum = a + b` (or, with
    /// `pre`, `a + rms_norm(b) * pre`, a post-norm on the branch), then
    /// `y = rms_norm(sum) * weight`, over rows of `dim`. The bits of
    /// [`Batch::rms_norm`] and [`Batch::add`] run one after the other.
    #[allow(clippy::too_many_arguments)]
    pub fn add_rms_norm(
        &mut self,
        a: &Tensor,
        b: &Tensor,
        pre: Option<&Tensor>,
        weight: &Tensor,
        sum: &Tensor,
        y: &Tensor,
        dim: usize,
        eps: f32,
    ) -> Result<(), GpuError> {
        const OP: &str = "add_rms_norm";
        let n = a.len();
        if dim == 0
            || n % dim != 0
            || b.len() != n
            || weight.len() != dim
            || pre.is_some_and(|p| p.len() != dim)
            || sum.len() < n
            || y.len() < n
        {
            return Err(shape(
                OP,
                format!(
                    "a {n}, b {}, weight {}, sum {}, y {}, dim {dim}",
                    b.len(),
                    weight.len(),
                    sum.len(),
                    y.len()
                ),
            ));
        }
        Self::distinct(OP, sum, &[a, b, weight])?;
        Self::distinct(OP, y, &[a, b, weight, sum])?;
        let rows = to_u32(OP, "rows", n / dim)?;
        let params = NormParams {
            dim: to_u32(OP, "dim", dim)?,
            rows,
            eps,
            _pad: 0,
        };
        let (gx, gy) = self.gpu.grid(rows);
        let pw = pre.unwrap_or(weight);
        self.push(
            &add_norm_spec(pre.is_some()),
            &[
                (&a.buf, None),
                (&b.buf, None),
                (&pw.buf, None),
                (&weight.buf, None),
                (&sum.buf, None),
                (&y.buf, None),
            ],
            &params,
            [gx, gy, 1],
        )
    }

    /// `y = act(gate) * up` over a stacked gate/up product `gu` (each token's
    /// row: `dim` gate values, then `dim` up values); `y` is packed
    /// `[token][dim]`. The bits of [`Batch::silu_mul`] / [`Batch::gelu_mul`].
    pub fn glu_stacked(
        &mut self,
        gu: &Tensor,
        y: &Tensor,
        dim: usize,
        gate: Gate,
    ) -> Result<(), GpuError> {
        if dim == 0 || gu.len() % (2 * dim) != 0 {
            return Err(shape(
                "glu_stacked",
                format!("gu {} elements, dim {dim}", gu.len()),
            ));
        }
        self.glu_stacked_n(gu, y, dim, gu.len() / (2 * dim), gate)
    }

    /// [`Batch::glu_stacked`] over the first `n_tokens` rows of `gu` only
    /// (`gu` may be larger than the step's product).
    pub fn glu_stacked_n(
        &mut self,
        gu: &Tensor,
        y: &Tensor,
        dim: usize,
        n_tokens: usize,
        gate: Gate,
    ) -> Result<(), GpuError> {
        const OP: &str = "glu_stacked";
        let need = n_tokens.checked_mul(2 * dim);
        if dim == 0 || need.is_none_or(|e| e > gu.len() || e / 2 > y.len()) {
            return Err(shape(
                OP,
                format!(
                    "{n_tokens} tokens of {dim}: gu {} elements, y {}",
                    gu.len(),
                    y.len()
                ),
            ));
        }
        if n_tokens == 0 {
            return Ok(());
        }
        Self::distinct(OP, y, &[gu])?;
        let n = to_u32(OP, "n", n_tokens * dim)?;
        let params = EltParams {
            n,
            scale: 0.0,
            dim: to_u32(OP, "dim", dim)?,
            _pad: 0,
        };
        let (gx, gy) = self.gpu.grid(n.div_ceil(ELT_WG));
        self.push(
            &glu_split_spec(gate),
            &[(&gu.buf, None), (&y.buf, None)],
            &params,
            [gx, gy, 1],
        )
    }

    /// Per-head RMSNorm of the query heads (times `q_weight`) and key heads
    /// (times `k_weight`) of `n_tokens` stacked QKV rows of `x`, into the
    /// same places of `y`; the value heads of `y` are not written. The bits
    /// of [`Batch::rms_norm`] over each head.
    #[allow(clippy::too_many_arguments)]
    pub fn head_norms(
        &mut self,
        x: &Tensor,
        q_weight: &Tensor,
        k_weight: &Tensor,
        y: &Tensor,
        layout: &QkvLayout,
        n_tokens: usize,
        eps: f32,
    ) -> Result<(), GpuError> {
        const OP: &str = "head_norms";
        let hd = layout.head_dim;
        let need = n_tokens.checked_mul(layout.stride());
        if hd == 0
            || need.is_none_or(|e| e > x.len() || e > y.len())
            || q_weight.len() != hd
            || k_weight.len() != hd
        {
            return Err(shape(
                OP,
                format!(
                    "x {}, y {}, {n_tokens} tokens of {layout:?}, weights {} and {}",
                    x.len(),
                    y.len(),
                    q_weight.len(),
                    k_weight.len()
                ),
            ));
        }
        Self::distinct(OP, y, &[x, q_weight, k_weight])?;
        if n_tokens == 0 {
            return Ok(());
        }
        let rows = to_u32(OP, "heads", n_tokens * (layout.n_head + layout.n_kv_head))?;
        let params = HeadNormParams {
            head_dim: to_u32(OP, "head_dim", hd)?,
            n_tokens: to_u32(OP, "tokens", n_tokens)?,
            n_head: to_u32(OP, "n_head", layout.n_head)?,
            n_kv_head: to_u32(OP, "n_kv_head", layout.n_kv_head)?,
            stride: to_u32(OP, "stride", layout.stride())?,
            base: 0,
            eps,
            _pad: 0,
        };
        let (gx, gy) = self.gpu.grid(rows);
        self.push(
            &KernelSpec::new("head_norm.wgsl"),
            &[
                (&x.buf, None),
                (&q_weight.buf, None),
                (&k_weight.buf, None),
                (&y.buf, None),
            ],
            &params,
            [gx, gy, 1],
        )
    }

    /// For tokens `first..first + n` of stacked QKV rows (queries and keys
    /// read from `qk`, values from `vs`, which may be the same tensor): RoPE
    /// of the queries into `q` (packed `[token][n_head * head_dim]`, token
    /// `first` at its row `first`), RoPE of the keys into `k_cache` and the
    /// values into `v_cache`, token `first` at position and cache row
    /// `rope.pos_offset` (one sequence).
    /// The bits of [`Batch::rope_tokens`] and [`Batch::copy`].
    #[allow(clippy::too_many_arguments)]
    pub fn rope_kv(
        &mut self,
        qk: &Tensor,
        vs: &Tensor,
        q: &Tensor,
        k_cache: &Tensor,
        v_cache: &Tensor,
        layout: &QkvLayout,
        rope: &Rope,
        first: usize,
        n: usize,
    ) -> Result<(), GpuError> {
        let host = one_sequence_table(first, n, rope.pos_offset as usize)
            .ok_or_else(|| shape("rope_kv", format!("tokens {first}..+{n}")))?;
        let gpu = self.gpu.upload_u32(bytemuck::cast_slice(&host))?;
        let table = TokenTable {
            host: &host,
            gpu: &gpu,
        };
        self.rope_kv_rows(qk, vs, q, k_cache, v_cache, layout, rope, table, first, n)
    }

    /// [`Batch::rope_kv`] with each token at the position and cache row its
    /// entry of `table` gives (`rope.pos_offset` is not used): the tokens of
    /// several sequences sharing the cache buffers in one dispatch.
    #[allow(clippy::too_many_arguments)]
    pub fn rope_kv_rows(
        &mut self,
        qk: &Tensor,
        vs: &Tensor,
        q: &Tensor,
        k_cache: &Tensor,
        v_cache: &Tensor,
        layout: &QkvLayout,
        rope: &Rope,
        table: TokenTable<'_>,
        first: usize,
        n: usize,
    ) -> Result<(), GpuError> {
        const OP: &str = "rope_kv";
        let hd = layout.head_dim;
        let (qd, stride) = (layout.q_dim(), layout.stride());
        let end = first.checked_add(n);
        let fits = |t: &Tensor, rows: Option<usize>, per: usize| {
            rows.and_then(|r| r.checked_mul(per))
                .is_some_and(|e| e <= t.len())
        };
        let bad = |why: String| shape(OP, format!("tokens {first}..+{n} of {layout:?}: {why}"));
        check_rope_kv(OP, layout, rope, table, first, n, k_cache, v_cache)?;
        if !fits(qk, end, stride) || !fits(vs, end, stride) || !fits(q, end, qd) {
            return Err(bad(format!(
                "rotating {}: qk {}, v {}, q {}",
                rope.n_rot,
                qk.len(),
                vs.len(),
                q.len()
            )));
        }
        Self::distinct(OP, q, &[qk, vs, k_cache, v_cache, table.gpu])?;
        Self::distinct(OP, k_cache, &[qk, vs, v_cache, table.gpu])?;
        Self::distinct(OP, v_cache, &[qk, vs, table.gpu])?;
        if n == 0 {
            return Ok(());
        }
        layout.kv.check(self.gpu, OP, hd)?;
        let params = RopeKvParams {
            head_dim: to_u32(OP, "head_dim", hd)?,
            n_rot: to_u32(OP, "n_rot", rope.n_rot)?,
            n_head: to_u32(OP, "n_head", layout.n_head)?,
            n_kv_head: to_u32(OP, "n_kv_head", layout.n_kv_head)?,
            n_tokens: to_u32(OP, "tokens", n)?,
            tab_first: to_u32(OP, "first", first)?,
            neox: u32::from(rope.neox),
            freq_base: rope.freq_base,
            stride: to_u32(OP, "stride", stride)?,
            src_base: to_u32(OP, "first element", first * stride)?,
            q_base: to_u32(OP, "first query", first * qd)?,
            ff_at: rope.ff_at(),
            freq_scale: rope.freq_scale,
            mscale: rope.mscale,
            _pad: [0; 2],
        };
        // rope_kv.wgsl: an invocation per value pair; rope_kv_q8.wgsl: a
        // workgroup per 32-value block.
        let (gx, gy) = if layout.kv == KvElem::Q8_0 {
            self.gpu
                .grid(to_u32(OP, "blocks", n * stride / KV_Q8_BLOCK)?)
        } else {
            let pairs = to_u32(OP, "pairs", n * stride / 2)?;
            self.gpu.grid(pairs.div_ceil(ELT_WG))
        };
        self.push(
            &rope_kv_spec(layout.kv),
            &[
                (&qk.buf, None),
                (&vs.buf, None),
                (&q.buf, None),
                (&k_cache.buf, None),
                (&v_cache.buf, None),
                (&table.gpu.buf, None),
            ],
            &params,
            [gx, gy, 1],
        )
    }

    /// A mixture's router on the device (`shaders/moe_route.wgsl`): from
    /// token `t`'s `r.n_expert` logits at `logits[l_offset + t·l_stride ..]`,
    /// its `r.k` experts and their weights as the CPU's `route` chooses and
    /// weighs them (ties to the lower index; the weights to the last bits
    /// of the device's exp). Writes into `out` ([`MoeRouting::words`]) the
    /// table [`Batch::moe_weigh`] reads, each (token, slot)'s row its own
    /// index, and the one-column runs [`crate::Batch::matmul_runs`] reads
    /// (its expert, x column `t` for the gate/up product and the pair's
    /// index for the down product, y column the pair's index), so the
    /// experts run in the same submission without the host learning which.
    pub fn moe_route(
        &mut self,
        logits: &Tensor,
        l_offset: usize,
        l_stride: usize,
        n_tokens: usize,
        r: MoeRouting,
        out: &Tensor,
    ) -> Result<(), GpuError> {
        const OP: &str = "moe_route";
        let end = n_tokens.checked_sub(1).map(|last| {
            last.checked_mul(l_stride)
                .and_then(|v| v.checked_add(l_offset + r.n_expert))
        });
        if r.n_expert == 0
            || r.n_expert > MOE_ROUTE_MAX_EXPERTS
            || r.k == 0
            || r.k > r.n_expert
            || l_stride < r.n_expert
            || end.is_some_and(|e| e.is_none_or(|e| e > logits.len()))
            || r.words(n_tokens) > out.len()
        {
            return Err(shape(
                OP,
                format!(
                    "{n_tokens} tokens choosing {} of {} experts (at most \
                     {MOE_ROUTE_MAX_EXPERTS}) from logits at {l_offset} every {l_stride} of {}, \
                     into {} words",
                    r.k,
                    r.n_expert,
                    logits.len(),
                    out.len()
                ),
            ));
        }
        Self::distinct(OP, out, &[logits])?;
        if n_tokens == 0 {
            return Ok(());
        }
        to_u32(OP, "words", r.words(n_tokens))?;
        let params = MoeRouteParams {
            n: to_u32(OP, "tokens", n_tokens)?,
            n_expert: to_u32(OP, "experts", r.n_expert)?,
            k: to_u32(OP, "k", r.k)?,
            norm: u32::from(r.norm),
            scale: r.scale,
            l_offset: to_u32(OP, "logits offset", l_offset)?,
            l_stride: to_u32(OP, "logits stride", l_stride)?,
            runs_at: to_u32(OP, "runs", r.runs_at(n_tokens))?,
        };
        let (gx, gy) = self.gpu.grid(params.n);
        self.push(
            &KernelSpec::new("moe_route.wgsl"),
            &[(&logits.buf, None), (&out.buf, None)],
            &params,
            [gx, gy, 1],
        )
    }

    /// The routed experts' weighted sum: for each of `n_tokens` tokens,
    /// `out[t] = Σ_s w[t][s] · ys[row[t][s]]` over its `k` slots in slot
    /// order (then, with `add`, plus what `out` holds), rows of `dim`.
    /// `ys` holds `n_tokens · k` rows packed in any order; `route` holds
    /// each (token, slot)'s packed row (`n_tokens · k` words), then the
    /// weights as f32 bits. The CPU's weighing, operation for operation,
    /// where the device does not contract a product and a sum into an fma.
    /// Packs the pairs [`Batch::moe_route`] routed in `out` by expert
    /// (`shaders/moe_pack.wgsl`): each pair's weighed-sum row becomes its
    /// packed column, the run tables become each expert's packed columns
    /// in runs of at most `maxc` (then empty runs up to
    /// [`MoeRouting::max_runs`]), and [`MoeRouting::gather_at`] says each
    /// packed column's token, for [`Batch::gather_cols`]. The products over
    /// these runs read each expert once for all its tokens, and nothing
    /// waits for the host. `args` gets the indirect dispatch arguments of
    /// the two products ([`crate::Runs::indirect`], from words 0 and 3),
    /// their grids over rows from `grids` ([`Batch::runs_grid`]). Returns
    /// the most runs there can be.
    #[allow(clippy::too_many_arguments)]
    pub fn moe_pack(
        &mut self,
        out: &Tensor,
        args: &Tensor,
        n_tokens: usize,
        r: MoeRouting,
        maxc: usize,
        grids: [(u32, u32); 2],
    ) -> Result<usize, GpuError> {
        const OP: &str = "moe_pack";
        let nk = n_tokens.saturating_mul(r.k);
        // The kernel keeps a pair's slot in 21 bits beside its expert.
        if r.n_expert == 0
            || r.n_expert > MOE_ROUTE_MAX_EXPERTS
            || !matches!(maxc, 1 | 2 | 4 | 8)
            || nk >= 1 << 21
            || r.words(n_tokens) > out.len()
            || args.len() < 6
        {
            return Err(shape(
                OP,
                format!(
                    "{n_tokens} tokens of {} of {} experts in runs of {maxc}, into {} words",
                    r.k,
                    r.n_expert,
                    out.len()
                ),
            ));
        }
        Self::distinct(OP, args, &[out])?;
        let max_runs = r.max_runs(n_tokens, maxc);
        if nk == 0 {
            return Ok(0);
        }
        let params = MoePackParams {
            nk: to_u32(OP, "pairs", nk)?,
            k: to_u32(OP, "k", r.k)?,
            n_expert: to_u32(OP, "experts", r.n_expert)?,
            maxc: maxc as u32,
            runs_at: to_u32(OP, "runs", r.runs_at(n_tokens))?,
            down_at: to_u32(OP, "down runs", r.down_runs_at(n_tokens))?,
            max_runs: to_u32(OP, "runs", max_runs)?,
            gather_at: to_u32(OP, "gather", r.gather_at(n_tokens))?,
            gxa: grids[0].0,
            gya: grids[0].1,
            gxb: grids[1].0,
            gyb: grids[1].1,
        };
        self.push(
            &KernelSpec::new("moe_pack.wgsl"),
            &[(&out.buf, None), (&args.buf, None)],
            &params,
            [1, 1, 1],
        )?;
        Ok(max_runs)
    }

    /// A shared expert's output under its gate, added to the routed
    /// experts' sum (`shaders/moe_shared.wgsl`, qwen2moe): for each of
    /// `n_tokens` tokens, `out[t] += sigmoid(h[t] · gate) · sy[t]`, with
    /// token `t`'s shared output at `sy[sy_offset + t·dim ..]`. The gate's
    /// dot product has a fixed order of the device's own.
    #[allow(clippy::too_many_arguments)]
    pub fn moe_shared(
        &mut self,
        h: &Tensor,
        gate: &Tensor,
        sy: &Tensor,
        sy_offset: usize,
        out: &Tensor,
        n_tokens: usize,
        dim: usize,
    ) -> Result<(), GpuError> {
        const OP: &str = "moe_shared";
        let n = n_tokens.checked_mul(dim);
        if dim == 0
            || gate.len() != dim
            || n.is_none_or(|n| n > h.len() || n > out.len())
            || n.and_then(|n| n.checked_add(sy_offset))
                .is_none_or(|e| e > sy.len())
        {
            return Err(shape(
                OP,
                format!(
                    "{n_tokens} tokens of {dim}: h {}, gate {}, shared output {} from {sy_offset}, \
                     out {}",
                    h.len(),
                    gate.len(),
                    sy.len(),
                    out.len()
                ),
            ));
        }
        Self::distinct(OP, out, &[h, gate, sy])?;
        if n_tokens == 0 {
            return Ok(());
        }
        let params = MoeSharedParams {
            n: to_u32(OP, "tokens", n_tokens)?,
            dim: to_u32(OP, "dim", dim)?,
            sy_offset: to_u32(OP, "offset", sy_offset)?,
            _pad: 0,
        };
        let (gx, gy) = self.gpu.grid(params.n);
        self.push(
            &KernelSpec::new("moe_shared.wgsl"),
            &[
                (&h.buf, None),
                (&gate.buf, None),
                (&sy.buf, None),
                (&out.buf, None),
            ],
            &params,
            [gx, gy, 1],
        )
    }

    /// `y[j] = x[table[table_at + j]]` for `m` columns of `dim` values: the
    /// columns a table names, in its order (`shaders/gather_cols.wgsl`).
    pub fn gather_cols(
        &mut self,
        x: &Tensor,
        table: &Tensor,
        table_at: usize,
        y: &Tensor,
        m: usize,
        dim: usize,
    ) -> Result<(), GpuError> {
        const OP: &str = "gather_cols";
        let n = m.checked_mul(dim);
        if dim == 0
            || n.is_none_or(|n| n > y.len())
            || table_at.checked_add(m).is_none_or(|e| e > table.len())
        {
            return Err(shape(
                OP,
                format!(
                    "{m} columns of {dim} from word {table_at} of a table of {} into {}",
                    table.len(),
                    y.len()
                ),
            ));
        }
        Self::distinct(OP, y, &[x, table])?;
        if m == 0 {
            return Ok(());
        }
        let params = GatherParams {
            m: to_u32(OP, "columns", m)?,
            dim: to_u32(OP, "dim", dim)?,
            table_at: to_u32(OP, "table offset", table_at)?,
            _pad: 0,
        };
        let (gx, gy) = self
            .gpu
            .grid(to_u32(OP, "values", m * dim)?.div_ceil(ELT_WG));
        self.push(
            &KernelSpec::new("gather_cols.wgsl"),
            &[(&x.buf, None), (&table.buf, None), (&y.buf, None)],
            &params,
            [gx, gy, 1],
        )
    }

    #[allow(clippy::too_many_arguments)]
    pub fn moe_weigh(
        &mut self,
        ys: &Tensor,
        route: &Tensor,
        out: &Tensor,
        n_tokens: usize,
        k: usize,
        dim: usize,
        add: bool,
    ) -> Result<(), GpuError> {
        const OP: &str = "moe_weigh";
        let rows = n_tokens.checked_mul(k);
        let fits = |t: &Tensor, n: Option<usize>| n.is_some_and(|n| n <= t.len());
        if k == 0
            || dim == 0
            || !fits(ys, rows.and_then(|r| r.checked_mul(dim)))
            || !fits(route, rows.and_then(|r| r.checked_mul(2)))
            || !fits(out, n_tokens.checked_mul(dim))
        {
            return Err(shape(
                OP,
                format!(
                    "{n_tokens} tokens of {k} experts of {dim}: ys {}, route {}, out {}",
                    ys.len(),
                    route.len(),
                    out.len()
                ),
            ));
        }
        Self::distinct(OP, out, &[ys, route])?;
        if n_tokens == 0 {
            return Ok(());
        }
        let n = to_u32(OP, "outputs", n_tokens * dim)?;
        to_u32(OP, "expert rows", n_tokens * k * dim)?;
        let params = MoeWeighParams {
            n,
            dim: to_u32(OP, "dim", dim)?,
            k: to_u32(OP, "k", k)?,
            add: u32::from(add),
        };
        let (gx, gy) = self.gpu.grid(n.div_ceil(ELT_WG));
        self.push(
            &KernelSpec::new("moe_weigh.wgsl"),
            &[(&ys.buf, None), (&route.buf, None), (&out.buf, None)],
            &params,
            [gx, gy, 1],
        )
    }
}
