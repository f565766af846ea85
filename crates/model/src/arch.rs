//! One table of architecture facts: an architecture Lamina runs is a row
//! here. [`crate::config::Config`] reads its flags and defaults from the
//! row, [`crate::program::Program`] turns the flags into a block's ops,
//! and everything that lists or tells architectures apart (the
//! unsupported-architecture error, `lamina synth`, the synthetic tests,
//! the reranking head) reads the table instead of repeating names.

use crate::config::{Activation, Arch};

/// How a mixture-of-experts architecture weighs and adds its experts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MoeKind {
    /// The chosen experts' weights renormalised to sum 1 (qwen3moe).
    Renormalised,
    /// A sigmoid-gated shared expert beside the routed ones (qwen2moe).
    SharedExpert,
    /// Both: renormalised chosen weights and a gated shared expert
    /// (qwen35moe).
    RenormalisedShared,
}

/// What a hybrid's recurrent blocks compute.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecurrentKind {
    /// The tests' stand-in: a convolution and a per-channel recurrence.
    StandIn,
    /// Gated DeltaNet linear attention (qwen35, qwen35moe, qwen3next).
    /// Value head `h` reads key head `h / (n_v / n_k)` where `grouped`
    /// (qwen3next keeps each key head's value heads together), else
    /// `h mod n_k` (qwen35's converter tiles them).
    GatedDeltaNet { grouped: bool },
}

/// Sliding-window attention on some layers (Gemma 3).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Swa {
    /// Layer `il` is local when `il % period < local`.
    pub period: usize,
    pub local: usize,
    /// The window when the file does not say.
    pub default_window: usize,
    /// The local layers' RoPE base.
    pub rope_base: u32,
}

/// What distinguishes one architecture, as data.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ArchRow {
    pub arch: Arch,
    /// `general.architecture`, and the prefix of its keys.
    pub name: &'static str,
    /// Biases on the Q, K and V products (`attn_{q,k,v}.bias`).
    pub qkv_bias: bool,
    /// Per-head RMSNorm of q and k (`attn_{q,k}_norm`).
    pub qk_norm: bool,
    /// Each sub-layer's output normed before its residual add
    /// (`post_attention_norm`, `post_ffw_norm`).
    pub post_norms: bool,
    /// NeoX RoPE pairs (`x[i]`, `x[i + d/2]`) rather than adjacent ones.
    pub rope_neox: bool,
    pub activation: Activation,
    /// Embeddings times √n_embd.
    pub embed_scale: bool,
    pub swa: Option<Swa>,
    /// `rope.freq_base` and `layer_norm_rms_epsilon` when the file has none.
    pub default_rope_base: f32,
    pub default_rms_eps: f32,
    pub moe: Option<MoeKind>,
    /// Gate and up in one `ffn_up` of twice the width, the gate's rows
    /// first (phi3).
    pub fused_gate_up: bool,
    /// A reranker of this architecture turns its `cls.output` scores into
    /// probabilities (llama.cpp's rank pooling for qwen3).
    pub rank_softmax: bool,
    /// Some blocks are recurrent (a [`crate::config::Recurrent`] mixer in
    /// place of attention): every `full_attention_interval`-th block
    /// attends, the others keep a state per sequence.
    pub recurrent: Option<RecurrentKind>,
    /// Attention's output gated by a sigmoid of a per-head gate projected
    /// with Q (qwen35).
    pub attn_gate: bool,
    /// RoPE positions by sections (`rope.dimension_sections`, Qwen's
    /// IMROPE), checked to reduce to NeoX RoPE for text.
    pub rope_sections: bool,
    /// The feed-forward's input norm: `ffn_norm`, or qwen35's
    /// `post_attention_norm` (the same step under another name).
    pub ffn_norm: &'static str,
    /// For the tests only: no released model has it, so it is left out of
    /// the names Lamina says it runs.
    pub test_only: bool,
}

const LLAMA: ArchRow = ArchRow {
    arch: Arch::Llama,
    name: "llama",
    qkv_bias: false,
    qk_norm: false,
    post_norms: false,
    rope_neox: false,
    activation: Activation::SwiGlu,
    embed_scale: false,
    swa: None,
    default_rope_base: 10_000.0,
    default_rms_eps: 1e-5,
    moe: None,
    fused_gate_up: false,
    rank_softmax: false,
    recurrent: None,
    attn_gate: false,
    rope_sections: false,
    ffn_norm: "ffn_norm",
    test_only: false,
};

// Qwen3.5 / 3.6 / 3.8 dense: three Gated DeltaNet blocks to each
// gated full-attention block (Q/K norms, partial NeoX RoPE by
// sections, the output times sigmoid of a gate projected with Q);
// the feed-forward's norm is named `post_attention_norm`.
const QWEN35: ArchRow = ArchRow {
    arch: Arch::Qwen35,
    name: "qwen35",
    qk_norm: true,
    rope_neox: true,
    recurrent: Some(RecurrentKind::GatedDeltaNet { grouped: false }),
    attn_gate: true,
    rope_sections: true,
    ffn_norm: "post_attention_norm",
    ..LLAMA
};

/// Every architecture Lamina runs.
pub const ARCHS: &[ArchRow] = &[
    // Llama 2/3, Mistral-7B-style files, SmolLM.
    LLAMA,
    // Qwen2/2.5: QKV biases, NeoX RoPE.
    ArchRow {
        arch: Arch::Qwen2,
        name: "qwen2",
        qkv_bias: true,
        rope_neox: true,
        ..LLAMA
    },
    // Qwen3: per-head Q/K RMSNorm before RoPE, head dim from key_length.
    ArchRow {
        arch: Arch::Qwen3,
        name: "qwen3",
        qk_norm: true,
        rope_neox: true,
        rank_softmax: true,
        ..LLAMA
    },
    // Gemma 3: √n_embd embedding scale, Q/K norms, post-norms, GELU-tanh,
    // five sliding-window layers then one global, each kind with its own
    // RoPE base.
    ArchRow {
        arch: Arch::Gemma3,
        name: "gemma3",
        qk_norm: true,
        post_norms: true,
        rope_neox: true,
        activation: Activation::GeGlu,
        embed_scale: true,
        swa: Some(Swa {
            period: 6,
            local: 5,
            default_window: 512,
            rope_base: 10_000,
        }),
        default_rope_base: 1_000_000.0,
        default_rms_eps: 1e-6,
        ..LLAMA
    },
    // Qwen2-MoE (Qwen1.5-MoE, Qwen2-57B-A14B): qwen2's attention, a
    // mixture of experts plus a sigmoid-gated shared expert.
    ArchRow {
        arch: Arch::Qwen2Moe,
        name: "qwen2moe",
        qkv_bias: true,
        rope_neox: true,
        moe: Some(MoeKind::SharedExpert),
        ..LLAMA
    },
    // Qwen3-MoE (Qwen3-30B-A3B, 235B-A22B): qwen3's attention, a mixture
    // of experts whose chosen weights are renormalised.
    ArchRow {
        arch: Arch::Qwen3Moe,
        name: "qwen3moe",
        qk_norm: true,
        rope_neox: true,
        moe: Some(MoeKind::Renormalised),
        ..LLAMA
    },
    // Phi-3 / Phi-3.5 / Phi-4-mini: llama's block with NeoX RoPE, Q, K and
    // V in one fused matrix and gate and up in another.
    ArchRow {
        arch: Arch::Phi3,
        name: "phi3",
        rope_neox: true,
        fused_gate_up: true,
        ..LLAMA
    },
    // A stand-in recurrent block for the tests of a sequence's state
    // (`kv/state.rs`) until the first real one: llama's block with some
    // attentions replaced by a causal depthwise convolution (a window of
    // past inputs per sequence) and a per-channel linear recurrence (a
    // state vector per sequence), the two kinds of state Gated DeltaNet
    // keeps.
    ArchRow {
        arch: Arch::RecurrentTest,
        name: "lamina-recurrent-test",
        recurrent: Some(RecurrentKind::StandIn),
        test_only: true,
        ..LLAMA
    },
    QWEN35,
    // Qwen3.5 / 3.6 MoE (Qwen3.6-35B-A3B): qwen35's blocks, experts with
    // renormalised weights and a gated shared expert.
    ArchRow {
        arch: Arch::Qwen35Moe,
        name: "qwen35moe",
        moe: Some(MoeKind::RenormalisedShared),
        ..QWEN35
    },
    // Qwen3-Next (80B-A3B): qwen35moe's blocks with plain NeoX RoPE, each
    // key head's value heads kept together, beta and alpha in one
    // product (`ssm_ba`), and in older files q, k, v and z in one
    // (`ssm_in`).
    ArchRow {
        arch: Arch::Qwen3Next,
        name: "qwen3next",
        recurrent: Some(RecurrentKind::GatedDeltaNet { grouped: true }),
        rope_sections: false,
        moe: Some(MoeKind::RenormalisedShared),
        ..QWEN35
    },
];

/// The row of `general.architecture = name`, if Lamina runs it.
pub fn find(name: &str) -> Option<&'static ArchRow> {
    ARCHS.iter().find(|r| r.name == name)
}

/// The row of `arch` (every [`Arch`] has one).
pub fn row(arch: Arch) -> &'static ArchRow {
    ARCHS.iter().find(|r| r.arch == arch).unwrap_or(&ARCHS[0])
}

/// The names Lamina runs, for messages: "llama, qwen2, …".
pub fn supported() -> String {
    ARCHS
        .iter()
        .filter(|r| !r.test_only)
        .map(|r| r.name)
        .collect::<Vec<_>>()
        .join(", ")
}

/// A small config of `arch` read from a file of keys alone, for unit
/// tests of what builds on the config (programs, fusion plans).
#[cfg(test)]
pub(crate) fn test_config(arch: Arch) -> crate::config::Config {
    use lamina_gguf::{File, Model, Value, Writer};
    let a = row(arch).name;
    let mut w = Writer::new().kv("general.architecture", Value::String(a.into()));
    for (k, v) in [
        ("block_count", 12),
        ("embedding_length", 64),
        ("feed_forward_length", 128),
        ("attention.head_count", 4),
        ("attention.head_count_kv", 2),
        ("context_length", 256),
        ("vocab_size", 100),
        ("expert_count", 8),
        ("expert_used_count", 2),
        ("expert_feed_forward_length", 32),
        ("ssm.inner_size", 48),
        ("ssm.state_size", 16),
        ("ssm.group_count", 1),
        ("ssm.time_step_rank", 3),
        ("rope.dimension_count", 8),
    ] {
        w = w.kv(format!("{a}.{k}"), Value::U32(v));
    }
    w = w.kv(
        format!("{a}.rope.dimension_sections"),
        Value::Array(lamina_gguf::Array::U32(vec![2, 1, 1, 0])),
    );
    let file = File::from_bytes(w.to_bytes()).expect("a file of keys");
    let model = Model::from_shards(vec![file]).expect("one shard");
    crate::config::Config::from_gguf(&model).expect("a config from the table's row")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_archs_are_one_to_one() {
        for r in ARCHS {
            assert_eq!(find(r.name), Some(r));
            assert_eq!(row(r.arch), r);
            assert_eq!(Arch::from_name(r.name), Some(r.arch));
            assert_eq!(r.arch.name(), r.name);
        }
        assert!(find("gemma4").is_none());
        assert_eq!(
            supported(),
            "llama, qwen2, qwen3, gemma3, qwen2moe, qwen3moe, phi3, qwen35, qwen35moe, qwen3next"
        );
    }

    /// The config takes each flag from its row.
    #[test]
    fn configs_follow_their_rows() {
        for r in ARCHS {
            let c = test_config(r.arch);
            assert_eq!(c.qkv_bias, r.qkv_bias, "{}", r.name);
            assert_eq!(c.qk_norm, r.qk_norm, "{}", r.name);
            assert_eq!(c.post_norms, r.post_norms, "{}", r.name);
            assert_eq!(c.rope_neox, r.rope_neox, "{}", r.name);
            assert_eq!(c.activation, r.activation, "{}", r.name);
            assert_eq!(c.embed_scale.is_some(), r.embed_scale, "{}", r.name);
            assert_eq!(c.sliding_window.is_some(), r.swa.is_some(), "{}", r.name);
            assert_eq!(c.moe.is_some(), r.moe.is_some(), "{}", r.name);
            assert_eq!(c.rope_base, r.default_rope_base, "{}", r.name);
            assert_eq!(c.rms_eps, r.default_rms_eps, "{}", r.name);
            assert_eq!(c.recurrent.is_some(), r.recurrent.is_some(), "{}", r.name);
            assert_eq!(
                c.recurrent.and_then(|x| x.delta).is_some(),
                matches!(r.recurrent, Some(RecurrentKind::GatedDeltaNet { .. })),
                "{}",
                r.name
            );
            assert_eq!(c.attn_gate, r.attn_gate, "{}", r.name);
        }
    }
}
