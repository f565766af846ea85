//! The constants of one layer's block, decided once per layer from the
//! [`Config`]: its RoPE, attention window and scale, activation and eps.
//! The block's steps and their order are its program
//! ([`crate::program::Program`], which holds a `Block`); the optional
//! weights are loaded by the same `Config` flags (`Weights::load`).

use crate::config::{Activation, Config};

/// Which cache positions a query sees.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Window {
    /// Every position up to its own.
    Full,
    /// Its own position and the `w - 1` before it (Gemma 3's local layers).
    Last(usize),
}

impl Window {
    /// The first cache position a query at `pos` attends to.
    pub fn first(self, pos: usize) -> usize {
        match self {
            Window::Full => 0,
            Window::Last(w) => (pos + 1).saturating_sub(w),
        }
    }

    /// The width the GPU attention kernel takes, 0 meaning none.
    pub fn kernel_width(self) -> usize {
        match self {
            Window::Full => 0,
            Window::Last(w) => w,
        }
    }
}

/// RoPE of one layer: the first `n_rot` dimensions of each head rotate.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RopeSpec {
    pub base: f32,
    pub n_rot: usize,
    /// NeoX pairs (`x[i]`, `x[i + d/2]`) rather than adjacent ones.
    pub neox: bool,
    /// Every angle times this (linear RoPE scaling; 1 without).
    pub scale: f32,
    /// Pair i's angle divided by factor i (the file's `rope_freqs`).
    pub factors: Option<crate::config::RopeFactors>,
    /// LongRoPE's divisors, chosen by the caches' context.
    pub long: Option<crate::config::LongRope>,
    /// Every cosine and sine times this (LongRoPE's attention factor).
    pub mscale: f32,
}

impl RopeSpec {
    /// The per-pair divisors for caches of `n_ctx` positions a sequence
    /// (see [`crate::config::Config::rope_factors_for`]).
    pub fn factors_for(&self, n_ctx: usize) -> Option<&crate::config::RopeFactors> {
        self.factors
            .as_ref()
            .or_else(|| self.long.as_ref().map(|l| l.for_ctx(n_ctx)))
    }
}

/// The architecture-dependent parts of layer `il`'s computation.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Block {
    pub il: usize,
    pub rope: RopeSpec,
    pub window: Window,
    /// Multiplies Q·K before the softmax.
    pub attn_scale: f32,
    pub activation: Activation,
    pub eps: f32,
}

impl Block {
    pub fn new(c: &Config, il: usize) -> Self {
        let window = match c.sliding_window {
            Some(w) if c.is_swa(il) => Window::Last(w),
            _ => Window::Full,
        };
        Block {
            il,
            rope: RopeSpec {
                base: c.rope_base_for(il),
                n_rot: c.rope_dim,
                neox: c.rope_neox,
                scale: c.rope_scale_for(il),
                factors: c.rope_factors,
                long: c.long_rope,
                mscale: c.rope_mscale,
            },
            window,
            attn_scale: c.attn_scale,
            activation: c.activation,
            eps: c.rms_eps,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_start_where_they_should() {
        assert_eq!(Window::Full.first(1000), 0);
        assert_eq!(Window::Last(512).first(10), 0);
        assert_eq!(Window::Last(512).first(511), 0);
        assert_eq!(Window::Last(512).first(512), 1);
        assert_eq!(Window::Last(4).first(9), 6);
        assert_eq!(Window::Full.kernel_width(), 0);
        assert_eq!(Window::Last(512).kernel_width(), 512);
    }

    #[test]
    fn gemma3_layers_alternate_local_and_global() {
        let c = Config {
            arch: crate::Arch::Gemma3,
            n_layer: 12,
            n_embd: 64,
            n_head: 4,
            n_head_kv: 1,
            head_dim: 16,
            n_ff: 128,
            n_vocab: 1000,
            context_length: 2048,
            rms_eps: 1e-6,
            rope_dim: 16,
            rope_base: 1e6,
            rope_neox: true,
            rope_scale: 0.125,
            rope_factors: None,
            long_rope: None,
            rope_mscale: 1.0,
            sliding_window: Some(512),
            rope_base_swa: 1e4,
            embed_scale: Some(8.0),
            qk_norm: true,
            post_norms: true,
            qkv_bias: false,
            activation: Activation::GeGlu,
            attn_scale: 0.25,
            kv: Default::default(),
            moe: None,
            recurrent: None,
            attn_gate: false,
            n_layer_nextn: 0,
        };
        let local = Block::new(&c, 4);
        assert_eq!(local.window, Window::Last(512));
        assert_eq!(local.rope.base, 1e4);
        let global = Block::new(&c, 5);
        assert_eq!(global.window, Window::Full);
        assert_eq!(global.rope.base, 1e6);
        assert!(global.rope.neox && global.activation == Activation::GeGlu);
        let llama = Config {
            sliding_window: None,
            ..c
        };
        assert_eq!(Block::new(&llama, 4).window, Window::Full);
        assert_eq!(Block::new(&llama, 4).rope.base, 1e6);
    }
}
