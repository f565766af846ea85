//! The GPU blocks' weights, uploaded straight from the mapped file.

use lamina_gpu::{Batch, Columns, Fuse, Gpu, KvElem, MatmulKernel, Tensor, Weight};

use super::fusion::WeightFacts;
use super::gpu_err;
use crate::error::ModelError;
use crate::weights::{Ffn, Layer, Matrix};

/// Weights whose products one step needs side by side (Q, K and V; gate
/// and up), stacked by rows so one dispatch streams them all: one weight
/// when the parts share a type, else one per part, each writing its rows of
/// the same stacked output.
pub(super) struct Stacked {
    pub(super) parts: Vec<Weight>,
    pub(super) rows: usize,
}

impl Stacked {
    /// No weights (a block without attention).
    pub(super) fn empty() -> Self {
        Stacked {
            parts: Vec::new(),
            rows: 0,
        }
    }

    pub(super) fn upload(gpu: &Gpu, ms: &[&Matrix<'_>]) -> Result<Self, ModelError> {
        let rows = ms.iter().map(|m| m.rows).sum();
        let (ty, cols) = (ms[0].ty, ms[0].cols);
        let parts = if ms.iter().all(|m| m.ty == ty && m.cols == cols) {
            let data: Vec<(usize, &[u8])> = ms.iter().map(|m| (m.rows, m.data)).collect();
            vec![gpu
                .upload_stacked(ty, cols, &data)
                .map_err(|source| ModelError::GpuTensor {
                    name: ms[0].name.clone(),
                    source,
                })?]
        } else {
            ms.iter()
                .map(|m| upload_matrix(gpu, m))
                .collect::<Result<_, _>>()?
        };
        Ok(Stacked { parts, rows })
    }

    /// `y = W x` for `n` packed columns of `x`; `y` gets `rows` values per
    /// column. With a `fuse`, each part's dispatch folds it in (only where
    /// [`Batch::fuses`]).
    pub(super) fn record(
        &self,
        b: &mut Batch<'_>,
        x: &Tensor,
        y: &Tensor,
        n: usize,
        fuse: Option<Fuse<'_>>,
    ) -> Result<(), lamina_gpu::GpuError> {
        self.record_from(b, x, y, 0, n, fuse)
    }

    /// [`Stacked::record`] for columns `first..first + n` of `x` and `y`.
    pub(super) fn record_from(
        &self,
        b: &mut Batch<'_>,
        x: &Tensor,
        y: &Tensor,
        first: usize,
        n: usize,
        fuse: Option<Fuse<'_>>,
    ) -> Result<(), lamina_gpu::GpuError> {
        let mut at = first * self.rows;
        for w in &self.parts {
            let cols = Columns {
                n,
                x_offset: first * w.cols(),
                x_stride: w.cols(),
                y_offset: at,
                y_stride: self.rows,
            };
            match fuse {
                Some(f) => b.matmul_fused(w, x, y, cols, f)?,
                None => b.matmul_strided(MatmulKernel::Auto, w, x, y, cols)?,
            }
            at += w.rows();
        }
        Ok(())
    }
}

pub(super) struct GpuLayer {
    /// What the block's weights allow its plan ([`super::fusion`]).
    pub(super) facts: WeightFacts,
    pub(super) attn_norm: Tensor,
    /// Q, K and V stacked: each token's product row is
    /// `[q (q_dim), k (kv_dim), v (kv_dim)]` (for a Gated DeltaNet block,
    /// which has none, an empty stack).
    pub(super) qkv: Stacked,
    /// The Q, K and V biases (qwen2), concatenated in the same order.
    pub(super) bqkv: Option<Tensor>,
    /// The attention's output product (a Gated DeltaNet block's: `ssm_out`).
    pub(super) wo: Weight,
    pub(super) q_norm: Option<Tensor>,
    pub(super) k_norm: Option<Tensor>,
    /// The output gate's product (qwen35): each head's gate rows of
    /// `attn_q`, gathered apart from its query rows.
    pub(super) gate: Option<Weight>,
    /// A Gated DeltaNet block's other weights.
    pub(super) delta: Option<Box<GpuDelta>>,
    pub(super) post_attn_norm: Option<Tensor>,
    pub(super) ffn_norm: Tensor,
    pub(super) ffn: GpuFfn,
    pub(super) post_ffn_norm: Option<Tensor>,
}

/// A GPU block's feed-forward part.
pub(super) enum GpuFfn {
    Dense {
        /// Gate and up stacked: `[gate (n_ff), up (n_ff)]` per token.
        gate_up: Stacked,
        down: Weight,
    },
    /// A mixture of experts: the router, the shared expert's gate/up and
    /// down (qwen2moe), and the routed experts where they are on the GPU
    /// (`--n-cpu-moe`; `None` where they run on the CPU, a split block).
    Split {
        router: Weight,
        shared: Option<(Stacked, Weight)>,
        /// The shared expert's gate vector (`ffn_gate_inp_shexp`), for
        /// its gate on the device (`moe_shared`).
        shared_gate: Option<Tensor>,
        experts: Option<Box<GpuExperts>>,
    },
}

/// A block's routed experts on the GPU, each kind one weight of every
/// expert's rows in expert order (lamina_gpu's `matmul_runs` picks an
/// expert per run of columns; a weight larger than a binding is split
/// between experts, a dispatch each): gate and up stacked per expert,
/// `[gate_x; up_x]`, so one product gives each pair its activation; then
/// down.
pub(super) struct GpuExperts {
    pub(super) gate_up: Weight,
    pub(super) down: Weight,
}

/// A Gated DeltaNet block's weights on the GPU, in the layout the CPU
/// computes in (`delta.rs`): q, k, v in one product (`ch` rows), the gate
/// z, beta and alpha each in their own, a fused file's rows gathered
/// apart by key head at upload.
pub(super) struct GpuDelta {
    pub(super) qkv: Weight,
    pub(super) z: Weight,
    pub(super) beta: Weight,
    pub(super) alpha: Weight,
    pub(super) conv: Tensor,
    pub(super) dt: Tensor,
    pub(super) a: Tensor,
    pub(super) norm: Tensor,
}

impl GpuLayer {
    pub(super) fn gpu_experts(&self) -> Option<&GpuExperts> {
        match &self.ffn {
            GpuFfn::Split { experts, .. } => experts.as_deref(),
            GpuFfn::Dense { .. } => None,
        }
    }
}

pub(super) struct GpuHead {
    pub(super) norm: Tensor,
    pub(super) weight: Weight,
}

pub(super) fn upload_matrix(gpu: &Gpu, m: &Matrix<'_>) -> Result<Weight, ModelError> {
    gpu.upload_weight(m.ty, m.rows, m.cols, m.data)
        .map_err(|source| ModelError::GpuTensor {
            name: m.name.clone(),
            source,
        })
}

pub(super) fn upload_vec(gpu: &Gpu, v: &[f32]) -> Result<Tensor, ModelError> {
    gpu.upload_f32(v).map_err(gpu_err)
}

pub(super) fn upload_opt(gpu: &Gpu, v: &Option<Vec<f32>>) -> Result<Option<Tensor>, ModelError> {
    v.as_deref().map(|v| upload_vec(gpu, v)).transpose()
}

/// Uploads a block's routed experts as two weights: `[gate_x; up_x]` for
/// every expert `x` in order, then the down projections, each split between
/// bindings only between experts where the device's largest binding does
/// not hold them all (`Gpu::upload_matrices`: a dispatch per binding). The
/// bytes go from the map to the device, expert by expert.
pub(super) fn upload_experts(
    gpu: &Gpu,
    ex: &crate::weights::Experts<'_>,
) -> Result<GpuExperts, ModelError> {
    // `per`: matrices an expert stacks (gate and up: 2).
    let stack = |ms: Vec<&Matrix<'_>>, per: usize| -> Result<Weight, ModelError> {
        let Some(first) = ms.first() else {
            return Err(ModelError::Placement("a mixture without experts".into()));
        };
        let (name, ty, cols) = (&first.name, first.ty, first.cols);
        let mat_rows = ms.iter().take(per).map(|m| m.rows).sum();
        if ms.len() % per != 0
            || ms
                .iter()
                .enumerate()
                .any(|(i, m)| m.ty != ty || m.cols != cols || m.rows != ms[i % per].rows)
        {
            return Err(ModelError::Placement(format!(
                "{name}: the routed experts on the GPU need one type and shape for their \
                 gate and up (or down) matrices; keep them on the CPU (--cpu-moe)"
            )));
        }
        let parts: Vec<(usize, &[u8])> = ms.iter().map(|m| (m.rows, m.data)).collect();
        gpu.upload_matrices(ty, cols, &parts, mat_rows)
            .map_err(|e| match e {
                lamina_gpu::GpuError::TooLarge { .. } => ModelError::Placement(format!(
                    "{name}: one expert exceeds the device's largest binding ({e}); keep \
                     the experts on the CPU (--cpu-moe or --n-cpu-moe)"
                )),
                source => ModelError::GpuTensor {
                    name: name.clone(),
                    source,
                },
            })
    };
    let gate_up = ex
        .gate
        .iter()
        .zip(&ex.up)
        .flat_map(|(g, u)| [g, u])
        .collect();
    Ok(GpuExperts {
        gate_up: stack(gate_up, 2)?,
        down: stack(ex.down.iter().collect(), 1)?,
    })
}

/// Uploads block `l`; a mixture's routed experts only with `experts` (else
/// they stay in the map, see the module header).
pub(super) fn upload_layer(
    gpu: &Gpu,
    l: &Layer<'_>,
    experts: bool,
    kv: KvElem,
    head_dim: Option<usize>,
    delta: Option<crate::config::DeltaNet>,
) -> Result<GpuLayer, ModelError> {
    let ffn = match &l.ffn {
        Ffn::Dense { gate, up, down } => GpuFfn::Dense {
            gate_up: Stacked::upload(gpu, &[gate, up])?,
            down: upload_matrix(gpu, down)?,
        },
        Ffn::Moe(ex) => GpuFfn::Split {
            router: upload_matrix(gpu, &ex.router)?,
            shared: match &ex.shared {
                Some((_, g, u, d)) => {
                    Some((Stacked::upload(gpu, &[g, u])?, upload_matrix(gpu, d)?))
                }
                None => None,
            },
            shared_gate: ex
                .shared
                .as_ref()
                .map(|(g, ..)| upload_vec(gpu, g))
                .transpose()?,
            experts: if experts {
                Some(Box::new(upload_experts(gpu, ex)?))
            } else {
                None
            },
        },
    };
    let (attn_norm, post_attn_norm) = (
        upload_vec(gpu, &l.attn_norm)?,
        upload_opt(gpu, &l.post_attn_norm)?,
    );
    let (ffn_norm, post_ffn_norm) = (
        upload_vec(gpu, &l.ffn_norm)?,
        upload_opt(gpu, &l.post_ffn_norm)?,
    );
    if let (crate::weights::Mixer::DeltaNet(w), Some(d)) = (&l.mixer, delta) {
        let (dw, out) = upload_delta(gpu, w, d)?;
        // Its output product's epilogue does not norm (the plan adds the
        // residual and the next norm apart, as after attention's Out).
        let mut facts = facts(gpu, &Stacked::empty(), &out, &ffn, kv);
        facts.wo_norm_after = false;
        return Ok(GpuLayer {
            facts,
            attn_norm,
            qkv: Stacked::empty(),
            bqkv: None,
            wo: out,
            q_norm: None,
            k_norm: None,
            gate: None,
            delta: Some(Box::new(dw)),
            post_attn_norm,
            ffn_norm,
            ffn,
            post_ffn_norm,
        });
    }
    // The stand-in recurrent block has no GPU arm: placement keeps it on
    // the CPU (plan.rs).
    let a = l.attention()?;
    let bqkv = match (&a.bq, &a.bk, &a.bv) {
        (Some(q), Some(k), Some(v)) => Some(upload_vec(gpu, &[&q[..], k, v].concat())?),
        _ => None,
    };
    let (qkv, gate) = match head_dim.filter(|_| a.wq.rows == 2 * a.wo.cols) {
        // Q's product interleaves each head's query and gate: the queries
        // stack with K and V as an ungated block's Q would, the gates go
        // to their own weight.
        Some(hd) => {
            let heads = a.wq.rows / (2 * hd);
            let pick = |off: usize| -> Vec<(usize, usize)> {
                (0..heads).map(|h| (2 * h * hd + off, hd)).collect()
            };
            let queries = rows_of(&a.wq, &pick(0));
            let mut parts: Vec<&Matrix<'_>> = queries.iter().collect();
            parts.extend([&a.wk, &a.wv]);
            let gates = rows_of(&a.wq, &pick(hd));
            (
                Stacked::upload(gpu, &parts)?,
                Some(upload_rows(gpu, &gates)?),
            )
        }
        None => (Stacked::upload(gpu, &[&a.wq, &a.wk, &a.wv])?, None),
    };
    let wo = upload_matrix(gpu, &a.wo)?;
    Ok(GpuLayer {
        facts: facts(gpu, &qkv, &wo, &ffn, kv),
        attn_norm,
        qkv,
        bqkv,
        wo,
        q_norm: upload_opt(gpu, &a.q_norm)?,
        k_norm: upload_opt(gpu, &a.k_norm)?,
        gate,
        delta: None,
        post_attn_norm,
        ffn_norm,
        ffn,
        post_ffn_norm,
    })
}

/// Views of row ranges `(first, count)` of `m` (rows are whole blocks, so
/// each is a range of its bytes).
fn rows_of<'a>(m: &Matrix<'a>, ranges: &[(usize, usize)]) -> Vec<Matrix<'a>> {
    let rb = m.data.len() / m.rows.max(1);
    ranges
        .iter()
        .map(|&(first, count)| Matrix {
            name: m.name.clone(),
            ty: m.ty,
            rows: count,
            cols: m.cols,
            data: &m.data[first * rb..(first + count) * rb],
        })
        .collect()
}

/// One weight of `parts`' rows in order, straight from the map.
fn upload_rows(gpu: &Gpu, parts: &[Matrix<'_>]) -> Result<Weight, ModelError> {
    let Some(first) = parts.first() else {
        return Err(ModelError::Placement("no rows to upload".into()));
    };
    let data: Vec<(usize, &[u8])> = parts.iter().map(|m| (m.rows, m.data)).collect();
    gpu.upload_stacked(first.ty, first.cols, &data)
        .map_err(|source| ModelError::GpuTensor {
            name: first.name.clone(),
            source,
        })
}

/// A Gated DeltaNet block's weights, and its output product.
fn upload_delta(
    gpu: &Gpu,
    w: &crate::weights::DeltaNetWeights<'_>,
    d: crate::config::DeltaNet,
) -> Result<(GpuDelta, Weight), ModelError> {
    use crate::weights::{BetaAlpha, DeltaInput};
    let (hk, hv, nk) = (d.head_k, d.head_v, d.n_k);
    let r = d.n_v / nk;
    let (qkv, z) = match &w.input {
        DeltaInput::Split { qkv, gate } => (upload_matrix(gpu, qkv)?, upload_matrix(gpu, gate)?),
        DeltaInput::Fused(m) => {
            // Per key head g: q (hk), k (hk), v (r·hv), z (r·hv).
            let group = 2 * hk + 2 * r * hv;
            let at = |off: usize, len: usize| -> Vec<(usize, usize)> {
                (0..nk).map(|g| (g * group + off, len)).collect()
            };
            let mut qkv = at(0, hk);
            qkv.extend(at(hk, hk));
            qkv.extend(at(2 * hk, r * hv));
            (
                upload_rows(gpu, &rows_of(m, &qkv))?,
                upload_rows(gpu, &rows_of(m, &at(2 * hk + r * hv, r * hv)))?,
            )
        }
    };
    let (beta, alpha) = match &w.beta_alpha {
        BetaAlpha::Split { beta, alpha } => (upload_matrix(gpu, beta)?, upload_matrix(gpu, alpha)?),
        BetaAlpha::Fused(m) => {
            // Per key head g: its value heads' betas, then their alphas.
            let at = |off: usize| -> Vec<(usize, usize)> {
                (0..nk).map(|g| (g * 2 * r + off, r)).collect()
            };
            (
                upload_rows(gpu, &rows_of(m, &at(0)))?,
                upload_rows(gpu, &rows_of(m, &at(r)))?,
            )
        }
    };
    Ok((
        GpuDelta {
            qkv,
            z,
            beta,
            alpha,
            conv: upload_vec(gpu, &w.conv)?,
            dt: upload_vec(gpu, &w.dt_bias)?,
            a: upload_vec(gpu, &w.a)?,
            norm: upload_vec(gpu, &w.norm)?,
        },
        upload_matrix(gpu, &w.out)?,
    ))
}

/// What a block's uploaded weights allow the fusion plan: the device's own
/// predicates, asked once per block for the conditions that do not depend
/// on a step's width (the plan adds those).
fn facts(gpu: &Gpu, qkv: &Stacked, wo: &Weight, ffn: &GpuFfn, kv: KvElem) -> WeightFacts {
    let probe = gpu.batch();
    fn one(s: &Stacked) -> Option<&Weight> {
        match &s.parts[..] {
            [w] => Some(w),
            _ => None,
        }
    }
    let (gate_up, down) = match ffn {
        GpuFfn::Dense { gate_up, down } => (one(gate_up), Some(down)),
        GpuFfn::Split { .. } => (None, None),
    };
    WeightFacts {
        qkv_rope: one(qkv).is_some_and(|w| probe.rope_fuses(w, 1, kv)),
        gate_up_glu: gate_up.is_some_and(|w| probe.glu_fuses(w, 1)),
        gate_up_one: gate_up.is_some(),
        wo_norm_after: probe.norm_epilogue_fuses(wo, 1),
        down_norm_after: down.is_some_and(|w| probe.norm_epilogue_fuses(w, 1)),
    }
}
