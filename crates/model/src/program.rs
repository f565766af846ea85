//! The block program: what one transformer block computes, as a list of
//! steps built once per layer from the [`Config`], and the only place
//! their order is written. The CPU runs it op by op
//! ([`crate::cpu`]); the GPU turns it into dispatches with their fusions
//! ([`crate::gpu::fusion`], a pure function of the program, the device's
//! kind and the weights' bindings) and records those.
//!
//! A new architecture adds a row to [`crate::arch`] and, where its block
//! does something no op here does, a new [`Op`] with an arm in each
//! executor (see `docs/dev/adding-an-architecture.md`).

use crate::block::Block;
use crate::config::{Activation, Config, Moe};

/// One step of a block. The hidden state `x` enters and leaves each block;
/// `h` is a normed copy of it, `y` a sub-layer's output before the residual
/// add.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Op {
    /// `h = rms_norm(x) · attn_norm`.
    AttnNorm,
    /// `q, k, v = h · W_q, h · W_k, h · W_v`, plus their biases (qwen2);
    /// where `gate`, Q's product holds each head's query then its output
    /// gate, split apart here (qwen35).
    Qkv { bias: bool, gate: bool },
    /// RMSNorm of every head of q and k (qwen3, gemma3).
    HeadNorms,
    /// RoPE of q and k at each token's position, then k and v into the
    /// token's cache rows.
    RopeStore,
    /// Each query over its window of the cache: `softmax(scale · q·Kᵀ) · V`.
    Attend,
    /// `attn *= sigmoid(gate)`, the gate [`Op::Qkv`] split off (qwen35).
    OutputGate,
    /// `x += post_norm?(attn · W_o)` (the post-norm: gemma3).
    AttnOut { post_norm: bool },
    /// A recurrent block in place of attention, over each sequence's state
    /// (`kv/state.rs`): `u = h · W_in`, a causal depthwise convolution of
    /// `u` over the sequence's last inputs, `c = silu(conv)`, a per-channel
    /// recurrence `s = sigmoid(a) · s + c`, then `x += post_norm?(s · W_out)`.
    Recurrent { post_norm: bool },
    /// Gated DeltaNet linear attention in place of attention, over each
    /// sequence's state (qwen35): `qkv = h · W_qkv`, a causal depthwise
    /// convolution over the sequence's last inputs then SiLU, q and k
    /// L2-normed, per value head `β = sigmoid(h · W_β)` and decay
    /// `g = softplus(h · W_α + dt) · a`; the delta rule over the head's
    /// state `S ← e^g S + k ⊗ β (v − Sᵀk)`, `o = Sᵀq / √d`; then
    /// `x += W_out · (rms_norm(o) · silu(h · W_z))`.
    DeltaNet,
    /// `h = rms_norm(x) · ffn_norm`.
    FfnNorm,
    /// `y = down(act(gate · h) · (up · h))`.
    GatedFfn(Activation),
    /// `y = Σ_chosen w · expert(h)`, plus a gated shared expert where the
    /// mixture has one.
    Experts(Moe),
    /// `x += post_norm?(y)`.
    FfnOut { post_norm: bool },
}

/// Layer `il`'s program: its ops in order, and the constants they take.
#[derive(Clone, Debug, PartialEq)]
pub struct Program {
    pub block: Block,
    pub ops: Vec<Op>,
}

impl Program {
    /// The program of layer `il`. The optional weights the ops name (biases,
    /// head norms, post-norms) are loaded by the same `Config` flags
    /// (`Weights::load`), so an op never meets a missing weight.
    pub fn new(c: &Config, il: usize) -> Self {
        let mut ops = vec![Op::AttnNorm];
        match c.recurrent {
            Some(r) if c.is_recurrent(il) => ops.push(match r.delta {
                Some(_) => Op::DeltaNet,
                None => Op::Recurrent {
                    post_norm: c.post_norms,
                },
            }),
            _ => {
                ops.push(Op::Qkv {
                    bias: c.qkv_bias,
                    gate: c.attn_gate,
                });
                if c.qk_norm {
                    ops.push(Op::HeadNorms);
                }
                ops.extend([Op::RopeStore, Op::Attend]);
                if c.attn_gate {
                    ops.push(Op::OutputGate);
                }
                ops.push(Op::AttnOut {
                    post_norm: c.post_norms,
                });
            }
        }
        ops.extend([
            Op::FfnNorm,
            match c.moe {
                Some(m) => Op::Experts(m),
                None => Op::GatedFfn(c.activation),
            },
            Op::FfnOut {
                post_norm: c.post_norms,
            },
        ]);
        Program {
            block: Block::new(c, il),
            ops,
        }
    }

    /// Every layer's program.
    pub fn all(c: &Config) -> Vec<Program> {
        (0..c.n_layer).map(|il| Program::new(c, il)).collect()
    }

    pub fn has(&self, op: impl Fn(&Op) -> bool) -> bool {
        self.ops.iter().any(op)
    }

    /// The QKV biases' op is there.
    pub fn qkv_bias(&self) -> bool {
        self.has(|o| matches!(o, Op::Qkv { bias: true, .. }))
    }

    pub fn head_norms(&self) -> bool {
        self.has(|o| matches!(o, Op::HeadNorms))
    }

    /// Either sub-layer normalises its output before the residual add.
    pub fn post_norms(&self) -> bool {
        self.has(|o| {
            matches!(
                o,
                Op::AttnOut { post_norm: true }
                    | Op::Recurrent { post_norm: true }
                    | Op::FfnOut { post_norm: true }
            )
        })
    }

    /// The block keeps a recurrent state per sequence.
    pub fn recurrent(&self) -> bool {
        self.has(|o| matches!(o, Op::Recurrent { .. } | Op::DeltaNet))
    }

    /// Every op has a GPU arm: all but the tests' stand-in recurrent
    /// block, which placement keeps on the CPU.
    pub fn runs_on_gpu(&self) -> bool {
        !self.has(|o| matches!(o, Op::Recurrent { .. }))
    }

    /// The feed-forward is a mixture of experts.
    pub fn moe(&self) -> Option<Moe> {
        self.ops.iter().find_map(|o| match o {
            Op::Experts(m) => Some(*m),
            _ => None,
        })
    }

    /// The gated feed-forward's activation (a mixture's experts: SwiGLU).
    pub fn activation(&self) -> Activation {
        self.ops
            .iter()
            .find_map(|o| match o {
                Op::GatedFfn(a) => Some(*a),
                _ => None,
            })
            .unwrap_or(Activation::SwiGlu)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arch::ARCHS;

    /// Each architecture's block, op by op: the order of the steps is
    /// written in `Program::new` alone, so these are its whole truth.
    #[test]
    fn every_architecture_has_its_program() {
        use Op::*;
        for row in ARCHS {
            let c = crate::arch::test_config(row.arch);
            let p = Program::new(&c, 0);
            let ffn = match c.moe {
                Some(m) => Experts(m),
                None => GatedFfn(c.activation),
            };
            let want: Vec<Op> = match row.name {
                "llama" | "phi3" => vec![
                    AttnNorm,
                    Qkv {
                        bias: false,
                        gate: false,
                    },
                    RopeStore,
                    Attend,
                    AttnOut { post_norm: false },
                    FfnNorm,
                    ffn,
                    FfnOut { post_norm: false },
                ],
                "qwen2" | "qwen2moe" => vec![
                    AttnNorm,
                    Qkv {
                        bias: true,
                        gate: false,
                    },
                    RopeStore,
                    Attend,
                    AttnOut { post_norm: false },
                    FfnNorm,
                    ffn,
                    FfnOut { post_norm: false },
                ],
                "qwen3" | "qwen3moe" => vec![
                    AttnNorm,
                    Qkv {
                        bias: false,
                        gate: false,
                    },
                    HeadNorms,
                    RopeStore,
                    Attend,
                    AttnOut { post_norm: false },
                    FfnNorm,
                    ffn,
                    FfnOut { post_norm: false },
                ],
                "gemma3" => vec![
                    AttnNorm,
                    Qkv {
                        bias: false,
                        gate: false,
                    },
                    HeadNorms,
                    RopeStore,
                    Attend,
                    AttnOut { post_norm: true },
                    FfnNorm,
                    GatedFfn(Activation::GeGlu),
                    FfnOut { post_norm: true },
                ],
                // Block 0 is recurrent; block 3 attends (below).
                "qwen35" | "qwen35moe" | "qwen3next" => vec![
                    AttnNorm,
                    DeltaNet,
                    FfnNorm,
                    ffn,
                    FfnOut { post_norm: false },
                ],
                "lamina-recurrent-test" => vec![
                    AttnNorm,
                    Recurrent { post_norm: false },
                    FfnNorm,
                    ffn,
                    FfnOut { post_norm: false },
                ],
                other => panic!("no expected program for {other}"),
            };
            assert_eq!(p.ops, want, "{}", row.name);
            if row.attn_gate {
                let attends = Program::new(&c, 3);
                assert_eq!(
                    attends.ops,
                    vec![
                        AttnNorm,
                        Qkv {
                            bias: false,
                            gate: true
                        },
                        HeadNorms,
                        RopeStore,
                        Attend,
                        OutputGate,
                        AttnOut { post_norm: false },
                        FfnNorm,
                        ffn,
                        FfnOut { post_norm: false },
                    ],
                    "{}",
                    row.name
                );
            }
            let mixture = row.name.ends_with("moe") || row.name == "qwen3next";
            assert_eq!(p.moe().is_some(), mixture, "{}", row.name);
        }
    }
}
