//! A model's hyper-parameters, read from the metadata keys of its
//! architecture (`{arch}.block_count`, …), with the flags and defaults of
//! its row in [`crate::arch::ARCHS`].

use lamina_gguf::{Model, Value};

use crate::error::ModelError;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    /// Llama 2/3, Mistral-7B-style files, SmolLM.
    Llama,
    /// Qwen2/2.5: QKV biases, NeoX RoPE.
    Qwen2,
    /// Qwen3: per-head Q/K RMSNorm before RoPE, head dim from key_length.
    Qwen3,
    /// Gemma 3: √n_embd embedding scale, Q/K norms, post-norms, GELU-tanh,
    /// sliding-window layers with their own RoPE base.
    Gemma3,
    /// Qwen2-MoE (Qwen1.5-MoE, Qwen2-57B-A14B): qwen2's attention, a
    /// mixture of experts plus a sigmoid-gated shared expert.
    Qwen2Moe,
    /// Qwen3-MoE (Qwen3-30B-A3B, 235B-A22B): qwen3's attention, a mixture
    /// of experts whose chosen weights are renormalised.
    Qwen3Moe,
    /// Phi-3 / Phi-3.5 / Phi-4-mini: llama's block with NeoX RoPE, Q, K and V
    /// in one fused matrix and gate and up in another.
    Phi3,
    /// The tests' stand-in recurrent hybrid ([`crate::arch`]).
    RecurrentTest,
    /// Qwen3.5 / 3.6 / 3.8 dense: Gated DeltaNet blocks between gated
    /// full-attention blocks.
    Qwen35,
    /// Qwen3.5 / 3.6 MoE: qwen35's blocks with a mixture of experts and a
    /// gated shared expert.
    Qwen35Moe,
    /// Qwen3-Next: qwen35moe's blocks, NeoX RoPE, value heads grouped by
    /// key head.
    Qwen3Next,
}

/// Recurrent blocks of a hybrid: each keeps, per sequence, the last
/// `conv_kernel − 1` inputs of its causal convolution over `channels`
/// channels and a recurrence's state (`kv/state.rs`): `channels` values
/// for the tests' stand-in, a matrix per head for Gated DeltaNet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Recurrent {
    /// Block `il` attends when `(il + 1) % interval == 0`, as llama.cpp's
    /// `full_attention_interval`.
    pub interval: usize,
    pub conv_kernel: usize,
    pub channels: usize,
    /// Gated DeltaNet's heads (qwen35); `None` for the stand-in.
    pub delta: Option<DeltaNet>,
}

/// The heads of a Gated DeltaNet block (llama.cpp's `ssm.*` keys): `n_k`
/// key heads of `head_k` dims (`ssm.group_count`, `ssm.state_size`) and
/// `n_v` value heads (`ssm.time_step_rank`) of `head_v` dims, value head
/// `h` reading key head `h mod n_k`. Each value head keeps a
/// `head_k × head_v` state per sequence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeltaNet {
    pub head_k: usize,
    pub n_k: usize,
    pub n_v: usize,
    pub head_v: usize,
    /// Value head `h` reads key head `h / (n_v / n_k)` (qwen3next), not
    /// `h mod n_k` (qwen35).
    pub grouped: bool,
}

impl DeltaNet {
    pub fn key_dim(&self) -> usize {
        self.head_k * self.n_k
    }

    pub fn value_dim(&self) -> usize {
        self.head_v * self.n_v
    }

    /// The convolution's channels: q, k and v side by side.
    pub fn conv_dim(&self) -> usize {
        2 * self.key_dim() + self.value_dim()
    }

    /// Values of the recurrence's state per sequence.
    pub fn state_len(&self) -> usize {
        self.n_v * self.head_k * self.head_v
    }

    /// The key head value head `h` reads.
    pub fn key_head(&self, h: usize) -> usize {
        if self.grouped {
            h / (self.n_v / self.n_k)
        } else {
            h % self.n_k
        }
    }
}

/// Bounds on a recurrent block's shape: a hostile header must not size
/// the state.
const MAX_CONV_KERNEL: usize = 16;
const MAX_CHANNELS: usize = 1 << 16;
const MAX_DELTA_HEAD: usize = 1024;
const MAX_DELTA_HEADS: usize = 1024;

impl Arch {
    pub fn from_name(name: &str) -> Option<Self> {
        crate::arch::find(name).map(|r| r.arch)
    }

    pub fn name(self) -> &'static str {
        crate::arch::row(self).name
    }
}

/// A mixture-of-experts feed-forward block (llama.cpp's `build_moe_ffn`
/// with softmax gating): the router's softmax over `n_expert` experts, the
/// `n_used` most probable run (SwiGLU, `n_ff_exp` wide) and are summed
/// weighted by their probabilities.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Moe {
    pub n_expert: usize,
    pub n_used: usize,
    pub n_ff_exp: usize,
    /// The chosen experts' weights divided by their sum (qwen3moe).
    pub norm_weights: bool,
    /// `{arch}.expert_weights_scale`; 0 or 1: none.
    pub weights_scale: f32,
    /// A shared expert of this width runs on every token, its output
    /// scaled by sigmoid(x · ffn_gate_inp_shexp) (qwen2moe).
    pub n_ff_shared: Option<usize>,
}

/// Experts per layer Lamina accepts: every released MoE has at most 512; a
/// bound keeps a hostile header from sizing allocations.
pub const MAX_EXPERTS: usize = 4096;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    /// silu(gate) · up
    SwiGlu,
    /// gelu_tanh(gate) · up
    GeGlu,
}

/// Most rotated pairs per head that [`RopeFactors`] holds (heads of up to
/// 512 rotated dimensions).
pub const MAX_ROPE_PAIRS: usize = 256;

/// Per-pair divisors of the RoPE frequencies, from the file's
/// `rope_freqs.weight` (Llama 3.1 and later: the "llama3" scaling that
/// stretches the low frequencies): pair i turns by θᵢ / fᵢ, as ggml's
/// `ggml_rope_ext` with freq_factors. Fixed-size so a block's description
/// stays `Copy`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RopeFactors {
    len: usize,
    v: [f32; MAX_ROPE_PAIRS],
}

/// Phi-3's LongRoPE: two sets of per-pair divisors, the long ones for a
/// context past the one the model was trained at (`orig_ctx`), as
/// llama.cpp's `get_rope_factors` chooses them by the context of a
/// sequence.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LongRope {
    pub long: RopeFactors,
    pub short: RopeFactors,
    pub orig_ctx: usize,
}

impl LongRope {
    /// The set for caches of `n_ctx` positions a sequence: the long one
    /// past the trained context, the short one within it.
    pub fn for_ctx(&self, n_ctx: usize) -> &RopeFactors {
        if n_ctx > self.orig_ctx {
            &self.long
        } else {
            &self.short
        }
    }
}

impl RopeFactors {
    /// One factor per rotated pair; `None` beyond [`MAX_ROPE_PAIRS`].
    pub fn new(f: &[f32]) -> Option<Self> {
        let mut v = [1.0; MAX_ROPE_PAIRS];
        v.get_mut(..f.len())?.copy_from_slice(f);
        Some(Self { len: f.len(), v })
    }

    pub fn get(&self) -> &[f32] {
        &self.v[..self.len]
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    pub arch: Arch,
    pub n_layer: usize,
    pub n_embd: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    pub n_ff: usize,
    pub n_vocab: usize,
    pub context_length: usize,
    pub rms_eps: f32,
    /// Dimensions of each head that RoPE rotates (the rest pass through).
    pub rope_dim: usize,
    pub rope_base: f32,
    /// NeoX pairs (`x[i]`, `x[i + d/2]`) rather than adjacent pairs (`x[2i]`, `x[2i+1]`).
    pub rope_neox: bool,
    /// Linear RoPE scaling of the full-attention layers (1 / the file's
    /// `rope.scaling.factor`): every angle times this. Sliding-window
    /// layers keep 1, as llama.cpp's `rope_freq_scale_train_swa`.
    pub rope_scale: f32,
    /// Per-pair frequency divisors for every layer: the file's
    /// `rope_freqs.weight`, with YaRN's blend folded in where the file
    /// scales by YaRN.
    pub rope_factors: Option<RopeFactors>,
    /// Phi-3's LongRoPE divisors (with `rope_factors` absent).
    pub long_rope: Option<LongRope>,
    /// Every cosine and sine times this (`rope.scaling.attn_factor`:
    /// LongRoPE's attention scale; with YaRN also its magnitude
    /// correction; 1 without).
    pub rope_mscale: f32,
    /// Sliding window width, for the layers [`Config::is_swa`] says use one.
    pub sliding_window: Option<usize>,
    /// RoPE base of sliding-window layers (Gemma 3 hard-codes 10000).
    pub rope_base_swa: f32,
    /// Input embeddings multiplied by this (Gemma: √n_embd).
    pub embed_scale: Option<f32>,
    pub qk_norm: bool,
    pub post_norms: bool,
    pub qkv_bias: bool,
    pub activation: Activation,
    /// Multiplies Q·K before softmax.
    pub attn_scale: f32,
    /// The mixture of experts in every block's feed-forward, for MoE
    /// architectures.
    pub moe: Option<Moe>,
    /// The recurrent blocks of a hybrid architecture.
    pub recurrent: Option<Recurrent>,
    /// Attention's output times `sigmoid(gate)`, the gate projected with
    /// Q (interleaved per head in `attn_q`: qwen35).
    pub attn_gate: bool,
    /// Blocks after the trunk for multi-token prediction
    /// (`nextn_predict_layers`): in `block_count`, not run by a forward pass.
    pub n_layer_nextn: usize,
    /// The KV cache's element types: not from the file but the loader's
    /// choice (`-ctk` / `-ctv`), kept here because every cache and every
    /// count of its bytes is made from the config.
    pub kv: crate::kv::KvTypes,
}

struct Keys<'a> {
    model: &'a Model,
    arch: &'a str,
}

impl Keys<'_> {
    fn raw(&self, key: &str) -> Option<(String, &Value)> {
        let full = format!("{}.{key}", self.arch);
        self.model.get(&full).map(|v| (full, v))
    }

    /// An integer key, coerced from any integer width as llama.cpp's readers
    /// would need to be. A per-layer array is accepted when all its entries are
    /// equal (per-layer variation is not modelled yet).
    fn usize_opt(&self, key: &str) -> Result<Option<usize>, ModelError> {
        let Some((full, v)) = self.raw(key) else {
            return Ok(None);
        };
        let bad = |why: &str| ModelError::BadKey {
            key: full.clone(),
            reason: why.to_owned(),
        };
        let n = match v {
            Value::Array(a) => {
                let vals: Vec<u64> = (0..a.len())
                    .map(|i| a.get(i).and_then(|x| x.as_u64()))
                    .collect::<Option<_>>()
                    .ok_or_else(|| bad("is an array of non-integers"))?;
                match vals.split_first() {
                    Some((first, rest)) if rest.iter().all(|x| x == first) => *first,
                    Some(_) => return Err(bad("varies per layer, which is not supported yet")),
                    None => return Err(bad("is an empty array")),
                }
            }
            v => v.as_u64().ok_or_else(|| {
                bad(&format!(
                    "is {} {v}, expected an unsigned integer",
                    v.value_type()
                ))
            })?,
        };
        usize::try_from(n)
            .ok()
            .filter(|n| *n <= 1 << 24)
            .map(Some)
            .ok_or_else(|| bad(&format!("{n} is out of range")))
    }

    fn usize(&self, key: &str) -> Result<usize, ModelError> {
        self.usize_opt(key)?.ok_or_else(|| ModelError::MissingKey {
            key: format!("{}.{key}", self.arch),
        })
    }

    fn f32_opt(&self, key: &str) -> Result<Option<f32>, ModelError> {
        let Some((full, v)) = self.raw(key) else {
            return Ok(None);
        };
        v.as_f64()
            .map(|x| Some(x as f32))
            .ok_or(ModelError::BadKey {
                key: full,
                reason: format!("is {}, expected a number", v.value_type()),
            })
    }
}

impl Config {
    pub fn from_gguf(model: &Model) -> Result<Self, ModelError> {
        let arch_name = model
            .get("general.architecture")
            .ok_or(ModelError::MissingKey {
                key: "general.architecture".into(),
            })?
            .as_str()
            .ok_or(ModelError::BadKey {
                key: "general.architecture".into(),
                reason: "is not a string".into(),
            })?;
        let arch = Arch::from_name(arch_name)
            .ok_or_else(|| ModelError::UnsupportedArch(arch_name.to_owned()))?;
        let k = Keys {
            model,
            arch: arch_name,
        };
        let n_embd = k.usize("embedding_length")?;
        let n_head = k.usize("attention.head_count")?;
        let n_head_kv = k.usize_opt("attention.head_count_kv")?.unwrap_or(n_head);
        let head_dim = match k.usize_opt("attention.key_length")? {
            Some(d) => d,
            None if n_head > 0 => n_embd / n_head,
            None => 0,
        };
        if n_head == 0 || n_head_kv == 0 || n_head % n_head_kv != 0 || head_dim == 0 {
            return Err(ModelError::BadKey {
                key: format!("{arch_name}.attention.head_count_kv"),
                reason: format!(
                    "{n_head} query heads cannot be shared by {n_head_kv} KV heads of dim {head_dim}"
                ),
            });
        }
        let n_vocab = match k.usize_opt("vocab_size")? {
            Some(v) => v,
            None => model
                .get("tokenizer.ggml.tokens")
                .and_then(|v| v.as_array())
                .map(|a| a.len())
                .ok_or(ModelError::MissingKey {
                    key: format!("{arch_name}.vocab_size"),
                })?,
        };
        let rope_dim = k.usize_opt("rope.dimension_count")?.unwrap_or(head_dim);
        if rope_dim > head_dim || rope_dim % 2 != 0 {
            return Err(ModelError::BadKey {
                key: format!("{arch_name}.rope.dimension_count"),
                reason: format!("{rope_dim} must be even and at most the head dim {head_dim}"),
            });
        }
        let row = crate::arch::row(arch);
        let default_base = row.default_rope_base;
        // Phi-3's 128k variants rotate with per-pair LongRoPE factors (one
        // set for each of all layers); a file with per-layer copies only
        // is refused rather than run without them.
        if model.tensor("blk.0.rope_factors_long.weight").is_some()
            && model.tensor("rope_factors_long.weight").is_none()
        {
            return Err(ModelError::UnsupportedArch(format!(
                "{arch_name} with per-layer LongRoPE factors"
            )));
        }
        let long_rope = match (
            model.tensor("rope_factors_long.weight"),
            model.tensor("rope_factors_short.weight"),
        ) {
            (None, None) => None,
            (Some(l), Some(s)) => Some(LongRope {
                long: rope_factors(&l, rope_dim)?,
                short: rope_factors(&s, rope_dim)?,
                orig_ctx: k
                    .usize_opt("rope.scaling.original_context_length")?
                    .unwrap_or(k.usize_opt("context_length")?.unwrap_or(2048)),
            }),
            _ => {
                return Err(ModelError::BadKey {
                    key: "rope_factors_long.weight".into(),
                    reason: "LongRoPE needs both the long and the short factors".into(),
                })
            }
        };
        let attn_factor = k.f32_opt("rope.scaling.attn_factor")?.unwrap_or(1.0);
        if !(attn_factor.is_finite() && attn_factor > 0.0) {
            return Err(ModelError::BadKey {
                key: format!("{arch_name}.rope.scaling.attn_factor"),
                reason: format!("{attn_factor} is not a positive scale"),
            });
        }
        let rope_base = k.f32_opt("rope.freq_base")?.unwrap_or(default_base);
        let file_factors = match model.tensor("rope_freqs.weight") {
            None => None,
            Some(t) => Some(rope_factors(&t, rope_dim)?),
        };
        let (rope_scale, rope_factors, rope_mscale) = match rope_scaling(&k, arch_name)? {
            Scaling::Linear(scale) => (scale, file_factors, attn_factor),
            Scaling::Yarn { freq_scale } => {
                // YaRN's blend is folded into per-pair divisors for every
                // layer, which a sliding-window layer (unscaled in
                // llama.cpp) or a second set of divisors would contradict.
                if row.swa.is_some() || long_rope.is_some() {
                    return Err(ModelError::UnsupportedArch(format!(
                        "{arch_name} with YaRN RoPE scaling beside sliding-window layers or \
                         LongRoPE factors"
                    )));
                }
                let n_ctx_orig = k
                    .usize_opt("rope.scaling.original_context_length")?
                    .unwrap_or(k.usize_opt("context_length")?.unwrap_or(2048));
                let yarn = Yarn {
                    n_rot: rope_dim,
                    n_ctx_orig,
                    base: rope_base,
                    freq_scale,
                    attn_factor,
                };
                let (factors, mscale) =
                    yarn.factors(file_factors.as_ref())
                        .ok_or_else(|| ModelError::BadKey {
                            key: format!("{arch_name}.rope.dimension_count"),
                            reason: format!("{rope_dim} is more than {} pairs", MAX_ROPE_PAIRS),
                        })?;
                (1.0, Some(factors), mscale)
            }
        };
        let moe = match row.moe {
            Some(kind) => {
                let n_expert = k.usize("expert_count")?;
                let n_used = k.usize("expert_used_count")?;
                if n_expert == 0 || n_expert > MAX_EXPERTS || n_used == 0 || n_used > n_expert {
                    return Err(ModelError::BadKey {
                        key: format!("{arch_name}.expert_used_count"),
                        reason: format!(
                            "{n_used} of {n_expert} experts (at most {MAX_EXPERTS}, at least one used)"
                        ),
                    });
                }
                let n_ff_exp = match k.usize_opt("expert_feed_forward_length")? {
                    Some(f) => f,
                    None => k.usize("feed_forward_length")? / n_used,
                };
                Some(Moe {
                    n_expert,
                    n_used,
                    n_ff_exp,
                    norm_weights: matches!(
                        kind,
                        crate::arch::MoeKind::Renormalised
                            | crate::arch::MoeKind::RenormalisedShared
                    ),
                    weights_scale: k.f32_opt("expert_weights_scale")?.unwrap_or(0.0),
                    n_ff_shared: match kind {
                        crate::arch::MoeKind::SharedExpert
                        | crate::arch::MoeKind::RenormalisedShared => Some(
                            k.usize_opt("expert_shared_feed_forward_length")?
                                .unwrap_or(k.usize("feed_forward_length")?),
                        ),
                        crate::arch::MoeKind::Renormalised => None,
                    },
                })
            }
            None => None,
        };
        let recurrent = match row.recurrent {
            Some(kind) => Some(recurrent(&k, arch_name, kind)?),
            None => None,
        };
        if row.rope_sections {
            check_rope_sections(&k, arch_name, rope_dim)?;
        }
        let block_count = k.usize("block_count")?;
        let n_layer_nextn = k.usize_opt("nextn_predict_layers")?.unwrap_or(0);
        if n_layer_nextn >= block_count {
            return Err(ModelError::BadKey {
                key: format!("{arch_name}.nextn_predict_layers"),
                reason: format!("{n_layer_nextn} of {block_count} blocks leaves no trunk"),
            });
        }
        Ok(Config {
            recurrent,
            attn_gate: row.attn_gate,
            n_layer_nextn,
            arch,
            n_layer: block_count - n_layer_nextn,
            n_embd,
            n_head,
            n_head_kv,
            head_dim,
            // A MoE file's dense width is informational (its experts'
            // is `expert_feed_forward_length`).
            n_ff: match moe {
                Some(m) => k.usize_opt("feed_forward_length")?.unwrap_or(m.n_ff_exp),
                None => k.usize("feed_forward_length")?,
            },
            n_vocab,
            context_length: k.usize_opt("context_length")?.unwrap_or(2048),
            rms_eps: k
                .f32_opt("attention.layer_norm_rms_epsilon")?
                .unwrap_or(row.default_rms_eps),
            rope_dim,
            rope_base,
            rope_neox: row.rope_neox,
            rope_scale,
            rope_factors,
            long_rope,
            rope_mscale,
            sliding_window: match row.swa {
                Some(swa) => Some(
                    k.usize_opt("attention.sliding_window")?
                        .unwrap_or(swa.default_window),
                ),
                None => None,
            },
            rope_base_swa: row.swa.map_or(10_000.0, |s| s.rope_base as f32),
            embed_scale: row.embed_scale.then(|| (n_embd as f32).sqrt()),
            qk_norm: row.qk_norm,
            post_norms: row.post_norms,
            qkv_bias: row.qkv_bias,
            activation: row.activation,
            // Gemma 3 27B scales by 1/√(n_embd/n_head) instead (its
            // query_pre_attn_scalar); the sizes here all use the head dim.
            attn_scale: 1.0 / (head_dim as f32).sqrt(),
            kv: crate::kv::KvTypes::default(),
            moe,
        })
    }

    /// Whether layer `il` attends through a sliding window, by its
    /// architecture's pattern (Gemma 3: five local layers then one global).
    pub fn is_swa(&self, il: usize) -> bool {
        match (self.sliding_window, crate::arch::row(self.arch).swa) {
            (Some(_), Some(p)) => il % p.period < p.local,
            _ => false,
        }
    }

    pub fn rope_base_for(&self, il: usize) -> f32 {
        if self.is_swa(il) {
            self.rope_base_swa
        } else {
            self.rope_base
        }
    }

    /// The per-pair RoPE divisors for caches of `n_ctx` positions a
    /// sequence: the file's `rope_freqs`, or LongRoPE's long set past the
    /// trained context and its short set within it.
    pub fn rope_factors_for(&self, n_ctx: usize) -> Option<&RopeFactors> {
        self.rope_factors
            .as_ref()
            .or_else(|| self.long_rope.as_ref().map(|l| l.for_ctx(n_ctx)))
    }

    /// The linear RoPE scale of layer `il` (sliding-window layers: 1).
    pub fn rope_scale_for(&self, il: usize) -> f32 {
        if self.is_swa(il) {
            1.0
        } else {
            self.rope_scale
        }
    }

    /// Whether block `il` is recurrent (its mixer keeps a state, not KV
    /// rows).
    pub fn is_recurrent(&self, il: usize) -> bool {
        self.recurrent.is_some_and(|r| (il + 1) % r.interval != 0)
    }

    /// Values of block `il`'s recurrent state per sequence (0 for an
    /// attention block): the convolution's window, then the recurrence's
    /// state.
    pub fn state_len(&self, il: usize) -> usize {
        match self.recurrent {
            Some(r) if self.is_recurrent(il) => {
                let state = r.delta.map_or(r.channels, |d| d.state_len());
                (r.conv_kernel - 1) * r.channels + state
            }
            _ => 0,
        }
    }

    /// Rows of the Q product: with an output gate, each head's query then
    /// its gate.
    pub fn q_rows(&self) -> usize {
        if self.attn_gate {
            2 * self.q_dim()
        } else {
            self.q_dim()
        }
    }

    pub fn q_dim(&self) -> usize {
        self.n_head * self.head_dim
    }

    pub fn kv_dim(&self) -> usize {
        self.n_head_kv * self.head_dim
    }
}

/// A hybrid's recurrent blocks, from the `ssm.*` keys, each count bounded
/// before it sizes a state.
fn recurrent(
    k: &Keys<'_>,
    arch_name: &str,
    kind: crate::arch::RecurrentKind,
) -> Result<Recurrent, ModelError> {
    let conv_kernel = k.usize_opt("ssm.conv_kernel")?.unwrap_or(4);
    let inner = k.usize("ssm.inner_size")?;
    let interval = k.usize_opt("full_attention_interval")?.unwrap_or(4);
    let bad = |key: &str, reason: String| ModelError::BadKey {
        key: format!("{arch_name}.{key}"),
        reason,
    };
    if !(2..=MAX_CONV_KERNEL).contains(&conv_kernel) || interval == 0 {
        return Err(bad(
            "ssm.conv_kernel",
            format!(
                "a kernel of {conv_kernel} every {interval} blocks (kernels 2..={MAX_CONV_KERNEL})"
            ),
        ));
    }
    let delta = match kind {
        crate::arch::RecurrentKind::StandIn => None,
        crate::arch::RecurrentKind::GatedDeltaNet { grouped } => {
            let head_k = k.usize("ssm.state_size")?;
            let n_k = k.usize("ssm.group_count")?;
            let n_v = k.usize("ssm.time_step_rank")?;
            let ok = (1..=MAX_DELTA_HEAD).contains(&head_k)
                && (1..=MAX_DELTA_HEADS).contains(&n_k)
                && (1..=MAX_DELTA_HEADS).contains(&n_v)
                && n_v % n_k == 0
                && inner == head_k * n_v;
            if !ok {
                // llama.cpp's kernels take square states (head_k = head_v)
                // and value heads that share key heads evenly.
                return Err(bad(
                    "ssm.inner_size",
                    format!(
                        "{inner} values over {n_v} value heads and {n_k} key heads of                          {head_k} dims (want inner = heads × dims, value heads a multiple of                          key heads, at most {MAX_DELTA_HEADS} heads of {MAX_DELTA_HEAD})"
                    ),
                ));
            }
            Some(DeltaNet {
                head_k,
                n_k,
                n_v,
                head_v: head_k,
                grouped,
            })
        }
    };
    let channels = delta.map_or(inner, |d| d.conv_dim());
    if !(1..=MAX_CHANNELS).contains(&channels) {
        return Err(bad(
            "ssm.inner_size",
            format!("{channels} convolution channels (at most {MAX_CHANNELS})"),
        ));
    }
    if let Some((full, v)) = k.raw("attention.recurrent_layers") {
        // The per-layer list llama.cpp prefers to the interval: taken where
        // it says what the interval says, refused where it differs.
        let n = k.usize("block_count")?;
        let listed: Option<Vec<bool>> = v.as_array().and_then(|a| {
            (0..a.len())
                .map(|i| a.get(i).and_then(|x| x.as_u64().map(|b| b != 0)))
                .collect()
        });
        let want: Vec<bool> = (0..n).map(|il| (il + 1) % interval != 0).collect();
        match listed {
            Some(l) if l.len() >= n && l[..n] == want[..] => {}
            _ => {
                return Err(ModelError::BadKey {
                    key: full,
                    reason: format!(
                        "lists recurrent blocks other than every block but each {interval}th,                          which is not supported yet"
                    ),
                })
            }
        }
    }
    Ok(Recurrent {
        interval,
        conv_kernel,
        channels,
        delta,
    })
}

/// Qwen3.5's multi-section RoPE (IMROPE): pair `i` of the rotated dims
/// turns by the time, height or width position by `i mod 3` within the
/// sections, or by a fourth (always 0 for text) outside them. Text
/// tokens have all three positions equal, so where every pair falls in a
/// section it is plain NeoX RoPE over `rope.dimension_count` dims; a file
/// whose sections leave pairs unturned is refused rather than run wrong.
fn check_rope_sections(k: &Keys<'_>, arch_name: &str, rope_dim: usize) -> Result<(), ModelError> {
    let key = format!("{arch_name}.rope.dimension_sections");
    let Some((_, v)) = k.raw("rope.dimension_sections") else {
        return Err(ModelError::MissingKey { key });
    };
    let s: Vec<u64> = v
        .as_array()
        .and_then(|a| {
            (0..a.len().min(4))
                .map(|i| a.get(i).and_then(|x| x.as_u64()))
                .collect()
        })
        .unwrap_or_default();
    let bad = |reason: String| ModelError::BadKey {
        key: key.clone(),
        reason,
    };
    if s.len() < 3 {
        return Err(bad("is not an array of 3 or 4 integers".into()));
    }
    let total: u64 = s.iter().sum();
    let pairs = (rope_dim / 2) as u64;
    if total == 0 || total > rope_dim as u64 {
        return Err(bad(format!("sums to {total}, not 1..={rope_dim}")));
    }
    for i in 0..pairs {
        let sector = i % total;
        let turned = match sector % 3 {
            0 => sector < 3 * s[0],
            1 => sector < 3 * s[1],
            _ => sector < 3 * s[2],
        };
        if !turned {
            return Err(bad(format!(
                "{s:?} leaves rotated pair {i} to the fourth position, which is not supported"
            )));
        }
    }
    Ok(())
}

/// How `{arch}.rope.scaling.*` turns the angles.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Scaling {
    /// Every angle times this (1: unscaled).
    Linear(f32),
    /// YaRN with this interpolation scale (1 / the factor).
    Yarn { freq_scale: f32 },
}

/// `{arch}.rope.scaling.*` as llama.cpp reads it: the type defaults to
/// linear, a factor f (or the older `rope.scale_linear`) scales every angle
/// by 1 / f, type `none` never scales, `yarn` blends the interpolated and
/// the original frequencies ([`Yarn`]). LongRoPE's factor is its divisors'
/// business (the scale stays linear). Other types are refused rather than
/// run as plain linear scaling.
fn rope_scaling(k: &Keys<'_>, arch_name: &str) -> Result<Scaling, ModelError> {
    let ty = match k.model.get(&format!("{arch_name}.rope.scaling.type")) {
        None => "linear".to_string(),
        Some(v) => v
            .as_str()
            .ok_or_else(|| ModelError::BadKey {
                key: format!("{arch_name}.rope.scaling.type"),
                reason: "not a string".into(),
            })?
            .to_string(),
    };
    let factor = match k.f32_opt("rope.scaling.factor")? {
        Some(f) => Some(f),
        None => k.f32_opt("rope.scale_linear")?,
    }
    .filter(|&f| f != 0.0);
    let Some(factor) = factor else {
        return Ok(Scaling::Linear(1.0));
    };
    match ty.as_str() {
        "none" => Ok(Scaling::Linear(1.0)),
        "linear" | "longrope" if factor.is_finite() && factor > 0.0 => {
            Ok(Scaling::Linear(1.0 / factor))
        }
        "yarn" if factor.is_finite() && factor > 0.0 => Ok(Scaling::Yarn {
            freq_scale: 1.0 / factor,
        }),
        "linear" | "longrope" | "yarn" => Err(ModelError::BadKey {
            key: format!("{arch_name}.rope.scaling.factor"),
            reason: format!("{factor} is not a positive scale"),
        }),
        other => Err(ModelError::UnsupportedArch(format!(
            "{arch_name} with RoPE scaling `{other}` (factor {factor}); linear scaling and \
             per-pair frequency factors are supported"
        ))),
    }
}

/// YaRN ("Yet another RoPE extensioN"), as ggml's `rope_yarn` with
/// llama.cpp's defaults for the architectures here (ext_factor 1, beta_fast
/// 32, beta_slow 1; no per-architecture keys are read):
///
/// - pair i's angle θᵢ (position times base^(−2i/n_rot), over the file's
///   divisor) becomes θᵢ · (s · (1 − mᵢ) + mᵢ), where s is the
///   interpolation scale and mᵢ ramps from 1 (pairs below the correction
///   dimension of beta_fast: fast pairs keep their frequency) to 0 (pairs
///   above beta_slow's: slow ones are interpolated);
/// - cosines and sines are multiplied by llama.cpp's yarn_attn_factor times
///   ggml's magnitude correction 1 + 0.1 ln(1 / s), both in f32 as there.
///
/// The blend is linear in θᵢ, so it folds into per-pair divisors that the
/// CPU and GPU kernels already apply: fᵢ / (s · (1 − mᵢ) + mᵢ). (ggml adds
/// the two terms separately; the results differ by an f32 rounding.)
#[derive(Clone, Copy, Debug, PartialEq)]
struct Yarn {
    n_rot: usize,
    n_ctx_orig: usize,
    base: f32,
    freq_scale: f32,
    /// `rope.scaling.attn_factor` (1 without).
    attn_factor: f32,
}

impl Yarn {
    const BETA_FAST: f32 = 32.0;
    const BETA_SLOW: f32 = 1.0;

    /// ggml's `ggml_rope_yarn_corr_dim`: the pair index whose wavelength
    /// fits `n_rot` turns into the original context.
    fn corr_dim(&self, n_rot: f32) -> f32 {
        let d = self.n_rot as f32;
        d * (self.n_ctx_orig as f32 / (n_rot * 2.0 * std::f32::consts::PI)).ln()
            / (2.0 * self.base.ln())
    }

    /// The divisors (the file's, if any, blended) and the cos/sin scale;
    /// `None` past [`MAX_ROPE_PAIRS`].
    fn factors(&self, file: Option<&RopeFactors>) -> Option<(RopeFactors, f32)> {
        let low = self.corr_dim(Self::BETA_FAST).floor().max(0.0);
        let high = self
            .corr_dim(Self::BETA_SLOW)
            .ceil()
            .min(self.n_rot as f32 - 1.0);
        let s = self.freq_scale;
        let f: Vec<f32> = (0..self.n_rot / 2)
            .map(|i| {
                let y = (i as f32 - low) / (high - low).max(0.001);
                let mix = 1.0 - y.clamp(0.0, 1.0);
                let base = file.and_then(|f| f.get().get(i)).copied().unwrap_or(1.0);
                base / (s * (1.0 - mix) + mix)
            })
            .collect();
        // llama.cpp's context parameters: get_mscale(factor) cancelled by
        // 1 / (1 + 0.1 ln factor), times the file's attn_factor; then
        // ggml's rope multiplies by 1 + 0.1 ln(1 / freq_scale).
        let factor = 1.0 / s;
        let get_mscale = if factor <= 1.0 {
            1.0
        } else {
            0.1 * factor.ln() + 1.0
        };
        let attn = get_mscale * (1.0 / (1.0 + 0.1 * factor.ln())) * self.attn_factor;
        let mscale = attn * (1.0 + 0.1 * (1.0 / s).ln());
        Some((RopeFactors::new(&f)?, mscale))
    }
}

/// `rope_freqs.weight` or a LongRoPE set: one positive f32 divisor per
/// rotated pair.
fn rope_factors(t: &lamina_gguf::Tensor<'_>, rope_dim: usize) -> Result<RopeFactors, ModelError> {
    let bad = |reason: String| ModelError::BadKey {
        key: t.info.name.clone(),
        reason,
    };
    if t.info.ty != lamina_gguf::GgmlType::F32 || t.info.dims != [rope_dim as u64 / 2] {
        return Err(bad(format!(
            "{} {:?}, expected F32 [{}] (half the rotated dimensions)",
            t.info.ty.name(),
            t.info.dims,
            rope_dim / 2
        )));
    }
    let v: Vec<f32> = t
        .data
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    if v.len() != rope_dim / 2 || v.iter().any(|f| !(f.is_finite() && *f > 0.0)) {
        return Err(bad("every factor must be a positive finite number".into()));
    }
    RopeFactors::new(&v).ok_or_else(|| bad(format!("more than {MAX_ROPE_PAIRS} pairs")))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// ggml's `rope_yarn` for pair `i` at angle `theta_extrap`, written out
    /// as ggml writes it (ext_factor 1): the blend of the two terms, and
    /// the magnitude correction on top of llama.cpp's yarn_attn_factor.
    fn ggml_yarn(y: &Yarn, i: usize, theta_extrap: f32) -> (f32, f32) {
        let corr = |beta: f32| {
            y.n_rot as f32 * (y.n_ctx_orig as f32 / (beta * 2.0 * std::f32::consts::PI)).ln()
                / (2.0 * y.base.ln())
        };
        let low = corr(32.0).floor().max(0.0);
        let high = corr(1.0).ceil().min(y.n_rot as f32 - 1.0);
        let ramp = 1.0 - ((i as f32 - low) / (high - low).max(0.001)).clamp(0.0, 1.0);
        let theta_interp = y.freq_scale * theta_extrap;
        let theta = theta_interp * (1.0 - ramp) + theta_extrap * ramp;
        let factor = 1.0 / y.freq_scale;
        let attn = (0.1 * factor.ln() + 1.0) / (1.0 + 0.1 * factor.ln()) * y.attn_factor;
        (theta, attn * (1.0 + 0.1 * (1.0 / y.freq_scale).ln()))
    }

    #[test]
    fn yarn_divisors_turn_each_pair_as_ggml_blends_it() {
        let y = Yarn {
            n_rot: 64,
            n_ctx_orig: 4096,
            base: 10_000.0,
            freq_scale: 0.25,
            attn_factor: 1.0,
        };
        let file = RopeFactors::new(&[1.0; 32]).unwrap();
        let (f, mscale) = y.factors(Some(&file)).unwrap();
        let f = f.get();
        assert_eq!(f.len(), 32);
        // Fast pairs keep their frequency, slow ones are interpolated by
        // the whole factor, and the pairs between blend monotonically.
        assert_eq!(f[0], 1.0);
        assert_eq!(f[31], 4.0);
        assert!(f.windows(2).all(|w| w[0] <= w[1]), "{f:?}");
        assert!(f.iter().any(|&v| v > 1.0 && v < 4.0), "{f:?}");
        for pos in [1.0f32, 37.0, 1000.0] {
            for (i, &fi) in f.iter().enumerate() {
                let theta_extrap = pos * 10_000f32.powf(-2.0 * i as f32 / 64.0);
                let (want, want_mscale) = ggml_yarn(&y, i, theta_extrap);
                let got = theta_extrap / fi;
                assert!(
                    (got - want).abs() <= 4.0 * f32::EPSILON * want.abs(),
                    "pair {i} at {pos}: {got} against ggml's {want}"
                );
                assert_eq!(mscale, want_mscale);
            }
        }
        assert!((mscale - (1.0 + 0.1 * 4f32.ln())).abs() < 1e-5, "{mscale}");
        // The file's own divisors are kept under the blend.
        let twice = RopeFactors::new(&[2.0; 32]).unwrap();
        let (g, _) = y.factors(Some(&twice)).unwrap();
        assert!(g.get().iter().zip(f).all(|(a, b)| *a == 2.0 * b));
    }
}
