//! The tensors an architecture needs, found by name and checked by shape.
//! Matrices stay as views of the mapped quantized blocks; only the small
//! norm and bias vectors are decoded to f32 at load.

use lamina_gguf::{GgmlType, Model, Tensor};

use crate::config::Config;
use crate::error::ModelError;

/// A weight matrix `W[rows, cols]` (ggml dims `[cols, rows]`), still quantized.
#[derive(Clone, Debug)]
pub struct Matrix<'a> {
    pub name: String,
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
    pub data: &'a [u8],
}

impl Matrix<'_> {
    /// `y[c] = W · x[c]` for `n` columns laid end to end.
    pub fn matmul(&self, x: &[f32], n: usize, y: &mut [f32]) -> Result<(), ModelError> {
        lamina_quant::matmul(self.ty, self.data, self.rows, self.cols, x, n, y)?;
        Ok(())
    }

    /// Row `r`, dequantized (the embedding lookup).
    pub fn row(&self, r: usize, out: &mut [f32]) -> Result<(), ModelError> {
        let rb = self.data.len() / self.rows.max(1);
        let bytes = self
            .data
            .get(r * rb..(r + 1) * rb)
            .ok_or(ModelError::BadToken {
                id: r as u32,
                n_vocab: self.rows,
            })?;
        lamina_quant::dequantize(self.ty, bytes, out)?;
        Ok(())
    }
}

#[derive(Debug)]
pub struct Layer<'a> {
    pub attn_norm: Vec<f32>,
    /// What mixes the positions: attention, or a hybrid's recurrent block.
    pub mixer: Mixer<'a>,
    pub post_attn_norm: Option<Vec<f32>>,
    pub ffn_norm: Vec<f32>,
    pub ffn: Ffn<'a>,
    pub post_ffn_norm: Option<Vec<f32>>,
}

/// A block's mixer.
#[derive(Debug)]
pub enum Mixer<'a> {
    Attention(Box<Attention<'a>>),
    Recurrent(Box<RecurrentWeights<'a>>),
    DeltaNet(Box<DeltaNetWeights<'a>>),
}

/// A Gated DeltaNet block's weights (llama.cpp's names): the q, k, v and
/// output-gate products, the per-head beta and decay logits, the
/// convolution's taps
/// (`ssm_conv1d`, `conv_kernel` per channel, oldest first), the decay's
/// bias and rate (`ssm_dt.bias`, `ssm_a` = −exp(A_log)), the per-head
/// output norm (`ssm_norm`) and the output product (`ssm_out`).
#[derive(Debug)]
pub struct DeltaNetWeights<'a> {
    pub input: DeltaInput<'a>,
    pub beta_alpha: BetaAlpha<'a>,
    pub conv: Vec<f32>,
    pub dt_bias: Vec<f32>,
    pub a: Vec<f32>,
    pub norm: Vec<f32>,
    pub out: Matrix<'a>,
}

/// An attention block's weights.
#[derive(Debug)]
pub struct Attention<'a> {
    pub wq: Matrix<'a>,
    pub wk: Matrix<'a>,
    pub wv: Matrix<'a>,
    pub wo: Matrix<'a>,
    pub bq: Option<Vec<f32>>,
    pub bk: Option<Vec<f32>>,
    pub bv: Option<Vec<f32>>,
    pub q_norm: Option<Vec<f32>>,
    pub k_norm: Option<Vec<f32>>,
}

/// The stand-in recurrent block's weights ([`crate::config::Recurrent`]):
/// the input product, the convolution's taps (`conv_kernel` per channel,
/// oldest first), each channel's decay logit and the output product.
#[derive(Debug)]
pub struct RecurrentWeights<'a> {
    pub w_in: Matrix<'a>,
    pub conv: Vec<f32>,
    pub decay: Vec<f32>,
    pub w_out: Matrix<'a>,
}

/// A Gated DeltaNet block's input products.
#[derive(Debug)]
pub enum DeltaInput<'a> {
    /// `attn_qkv` (q, k, v: the convolution's channels in order) and
    /// `attn_gate` (z).
    Split { qkv: Matrix<'a>, gate: Matrix<'a> },
    /// qwen3next's older `ssm_in`: per key head its q, its k, its value
    /// heads' v, then their z.
    Fused(Matrix<'a>),
}

/// A Gated DeltaNet block's beta and decay logits, one each per value head.
#[derive(Debug)]
pub enum BetaAlpha<'a> {
    /// `ssm_beta` and `ssm_alpha` (qwen35).
    Split { beta: Matrix<'a>, alpha: Matrix<'a> },
    /// qwen3next's `ssm_ba`: per key head its value heads' betas, then
    /// their alphas.
    Fused(Matrix<'a>),
}

impl<'a> Layer<'a> {
    /// The attention weights, where the block attends.
    pub fn attention(&self) -> Result<&Attention<'a>, ModelError> {
        match &self.mixer {
            Mixer::Attention(a) => Ok(a),
            Mixer::Recurrent(_) | Mixer::DeltaNet(_) => Err(ModelError::Placement(
                "a recurrent block has no attention weights".into(),
            )),
        }
    }
}

/// A block's feed-forward weights.
#[derive(Debug)]
pub enum Ffn<'a> {
    /// One gated feed-forward: `down(act(gate x) * up x)`.
    Dense {
        gate: Matrix<'a>,
        up: Matrix<'a>,
        down: Matrix<'a>,
    },
    /// A mixture of experts ([`crate::config::Moe`]).
    Moe(Box<Experts<'a>>),
}

/// A mixture of experts' weights: the router and each expert's matrices,
/// views into the 3-D `ffn_{gate,up,down}_exps` tensors (expert e is the
/// e-th slice of rows, still quantized).
#[derive(Debug)]
pub struct Experts<'a> {
    /// `ffn_gate_inp`: one logit per expert.
    pub router: Matrix<'a>,
    pub gate: Vec<Matrix<'a>>,
    pub up: Vec<Matrix<'a>>,
    pub down: Vec<Matrix<'a>>,
    /// The shared expert (qwen2moe): its gate vector (one logit) and its
    /// gate, up and down matrices.
    pub shared: Option<(Vec<f32>, Matrix<'a>, Matrix<'a>, Matrix<'a>)>,
}

#[derive(Debug)]
pub struct Weights<'a> {
    pub token_embd: Matrix<'a>,
    pub output_norm: Vec<f32>,
    /// `output.weight`, or `token_embd` when the file ties them.
    pub output: Matrix<'a>,
    pub layers: Vec<Layer<'a>>,
}

struct Finder<'a> {
    model: &'a Model,
}

impl<'a> Finder<'a> {
    fn get(&self, name: &str, want: &[usize]) -> Result<Tensor<'a>, ModelError> {
        let t = self
            .model
            .tensor(name)
            .ok_or_else(|| ModelError::MissingTensor {
                name: name.to_owned(),
            })?;
        let want: Vec<u64> = want.iter().map(|&d| d as u64).collect();
        if t.info.dims != want {
            return Err(ModelError::BadShape {
                name: name.to_owned(),
                got: t.info.dims.clone(),
                want,
            });
        }
        if !lamina_quant::supports(t.info.ty) {
            return Err(ModelError::NoKernel {
                name: name.to_owned(),
                ty: t.info.ty,
            });
        }
        Ok(t)
    }

    fn matrix(&self, name: &str, cols: usize, rows: usize) -> Result<Matrix<'a>, ModelError> {
        let t = self.get(name, &[cols, rows])?;
        Ok(Matrix {
            name: name.to_owned(),
            ty: t.info.ty,
            rows,
            cols,
            data: t.data,
        })
    }

    /// The `n` matrices `W_e[rows, cols]` of a 3-D tensor (ggml dims
    /// `[cols, rows, n]`), each a view of its own slice of rows.
    fn matrices(
        &self,
        name: &str,
        cols: usize,
        rows: usize,
        n: usize,
    ) -> Result<Vec<Matrix<'a>>, ModelError> {
        let t = self.get(name, &[cols, rows, n])?;
        let per = t.data.len() / n.max(1);
        Ok((0..n)
            .map(|e| Matrix {
                name: format!("{name}[{e}]"),
                ty: t.info.ty,
                rows,
                cols,
                data: &t.data[e * per..(e + 1) * per],
            })
            .collect())
    }

    /// Consecutive row ranges of one fused matrix (`attn_qkv`: Q, K, V;
    /// phi3's `ffn_up`: gate, up), each a view of its own rows: quantized
    /// rows are whole blocks, so a range of rows is a range of bytes, and
    /// the executors see the parts as separate matrices.
    fn split<const N: usize>(
        &self,
        name: &str,
        cols: usize,
        parts: [usize; N],
    ) -> Result<[Matrix<'a>; N], ModelError> {
        let rows: usize = parts.iter().sum();
        let m = self.matrix(name, cols, rows)?;
        let rb = m.data.len() / rows.max(1);
        Ok(std::array::from_fn(|i| {
            let at: usize = parts[..i].iter().sum();
            Matrix {
                name: format!("{name}[{i}]"),
                ty: m.ty,
                rows: parts[i],
                cols,
                data: &m.data[at * rb..(at + parts[i]) * rb],
            }
        }))
    }

    fn vector(&self, name: &str, len: usize) -> Result<Vec<f32>, ModelError> {
        let t = self.get(name, &[len])?;
        let mut v = vec![0.0; len];
        lamina_quant::dequantize(t.info.ty, t.data, &mut v)?;
        Ok(v)
    }

    /// A 2-D tensor of ggml dims `[inner, outer]` read whole, in order.
    fn vector2(&self, name: &str, inner: usize, outer: usize) -> Result<Vec<f32>, ModelError> {
        let t = self.get(name, &[inner, outer])?;
        let mut v = vec![0.0; inner * outer];
        lamina_quant::dequantize(t.info.ty, t.data, &mut v)?;
        Ok(v)
    }

    fn vector_if(&self, on: bool, name: &str, len: usize) -> Result<Option<Vec<f32>>, ModelError> {
        on.then(|| self.vector(name, len)).transpose()
    }
}

impl<'a> Weights<'a> {
    pub fn load(model: &'a Model, c: &Config) -> Result<Self, ModelError> {
        let f = Finder { model };
        let (e, q, kv, ff) = (c.n_embd, c.q_dim(), c.kv_dim(), c.n_ff);
        let token_embd = f.matrix("token_embd.weight", e, c.n_vocab)?;
        let output = if model.tensor("output.weight").is_some() {
            f.matrix("output.weight", e, c.n_vocab)?
        } else {
            token_embd.clone()
        };
        let mut layers = Vec::with_capacity(c.n_layer);
        for il in 0..c.n_layer {
            let n = |s: &str| format!("blk.{il}.{s}");
            let mixer = match c.recurrent {
                Some(r @ crate::config::Recurrent { delta: Some(d), .. }) if c.is_recurrent(il) => {
                    let (vd, nv) = (d.value_dim(), d.n_v);
                    let input = if model.tensor(&n("ssm_in.weight")).is_some() {
                        DeltaInput::Fused(f.matrix(&n("ssm_in.weight"), e, d.conv_dim() + vd)?)
                    } else {
                        DeltaInput::Split {
                            qkv: f.matrix(&n("attn_qkv.weight"), e, d.conv_dim())?,
                            gate: f.matrix(&n("attn_gate.weight"), e, vd)?,
                        }
                    };
                    let beta_alpha = if model.tensor(&n("ssm_ba.weight")).is_some() {
                        BetaAlpha::Fused(f.matrix(&n("ssm_ba.weight"), e, 2 * nv)?)
                    } else {
                        BetaAlpha::Split {
                            beta: f.matrix(&n("ssm_beta.weight"), e, nv)?,
                            alpha: f.matrix(&n("ssm_alpha.weight"), e, nv)?,
                        }
                    };
                    Mixer::DeltaNet(Box::new(DeltaNetWeights {
                        input,
                        beta_alpha,
                        conv: f.vector2(&n("ssm_conv1d.weight"), r.conv_kernel, d.conv_dim())?,
                        dt_bias: f.vector(&n("ssm_dt.bias"), nv)?,
                        a: f.vector(&n("ssm_a"), nv)?,
                        norm: f.vector(&n("ssm_norm.weight"), d.head_v)?,
                        out: f.matrix(&n("ssm_out.weight"), vd, e)?,
                    }))
                }
                Some(r) if c.is_recurrent(il) => {
                    let ch = r.channels;
                    Mixer::Recurrent(Box::new(RecurrentWeights {
                        w_in: f.matrix(&n("ssm_in.weight"), e, ch)?,
                        conv: f.vector2(&n("ssm_conv1d.weight"), r.conv_kernel, ch)?,
                        decay: f.vector(&n("ssm_a"), ch)?,
                        w_out: f.matrix(&n("ssm_out.weight"), ch, e)?,
                    }))
                }
                _ => {
                    // Q, K and V as one fused matrix (phi3, some
                    // converters) or three. With an output gate, Q's
                    // product holds each head's query then its gate.
                    let qr = c.q_rows();
                    let (wq, wk, wv) = if model.tensor(&n("attn_qkv.weight")).is_some() {
                        let [a, b, c] = f.split(&n("attn_qkv.weight"), e, [qr, kv, kv])?;
                        (a, b, c)
                    } else {
                        (
                            f.matrix(&n("attn_q.weight"), e, qr)?,
                            f.matrix(&n("attn_k.weight"), e, kv)?,
                            f.matrix(&n("attn_v.weight"), e, kv)?,
                        )
                    };
                    Mixer::Attention(Box::new(Attention {
                        wq,
                        wk,
                        wv,
                        wo: f.matrix(&n("attn_output.weight"), q, e)?,
                        bq: f.vector_if(c.qkv_bias, &n("attn_q.bias"), q)?,
                        bk: f.vector_if(c.qkv_bias, &n("attn_k.bias"), kv)?,
                        bv: f.vector_if(c.qkv_bias, &n("attn_v.bias"), kv)?,
                        q_norm: f.vector_if(c.qk_norm, &n("attn_q_norm.weight"), c.head_dim)?,
                        k_norm: f.vector_if(c.qk_norm, &n("attn_k_norm.weight"), c.head_dim)?,
                    }))
                }
            };
            layers.push(Layer {
                attn_norm: f.vector(&n("attn_norm.weight"), e)?,
                mixer,
                post_attn_norm: f.vector_if(c.post_norms, &n("post_attention_norm.weight"), e)?,
                ffn_norm: f.vector(
                    &n(&format!("{}.weight", crate::arch::row(c.arch).ffn_norm)),
                    e,
                )?,
                ffn: match c.moe {
                    // phi3's gate and up: one `ffn_up` of 2 · n_ff rows, the
                    // gate's first (ggml_swiglu's halves).
                    None if crate::arch::row(c.arch).fused_gate_up => {
                        let [gate, up] = f.split(&n("ffn_up.weight"), e, [ff, ff])?;
                        Ffn::Dense {
                            gate,
                            up,
                            down: f.matrix(&n("ffn_down.weight"), ff, e)?,
                        }
                    }
                    None => Ffn::Dense {
                        gate: f.matrix(&n("ffn_gate.weight"), e, ff)?,
                        up: f.matrix(&n("ffn_up.weight"), e, ff)?,
                        down: f.matrix(&n("ffn_down.weight"), ff, e)?,
                    },
                    Some(m) => {
                        let (x, fe) = (m.n_expert, m.n_ff_exp);
                        let shared = match m.n_ff_shared {
                            Some(fs) => Some((
                                f.vector(&n("ffn_gate_inp_shexp.weight"), e)?,
                                f.matrix(&n("ffn_gate_shexp.weight"), e, fs)?,
                                f.matrix(&n("ffn_up_shexp.weight"), e, fs)?,
                                f.matrix(&n("ffn_down_shexp.weight"), fs, e)?,
                            )),
                            None => None,
                        };
                        Ffn::Moe(Box::new(Experts {
                            router: f.matrix(&n("ffn_gate_inp.weight"), e, x)?,
                            gate: f.matrices(&n("ffn_gate_exps.weight"), e, fe, x)?,
                            up: f.matrices(&n("ffn_up_exps.weight"), e, fe, x)?,
                            down: f.matrices(&n("ffn_down_exps.weight"), fe, e, x)?,
                            shared,
                        }))
                    }
                },
                post_ffn_norm: f.vector_if(c.post_norms, &n("post_ffw_norm.weight"), e)?,
            });
        }
        Ok(Weights {
            token_embd,
            output_norm: f.vector("output_norm.weight", e)?,
            output,
            layers,
        })
    }
}
