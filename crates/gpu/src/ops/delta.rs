//! Gated DeltaNet's kernels (qwen35, qwen3next): the causal convolution,
//! the L2 norm of q and k, the delta rule over each value head's state,
//! and the gated norm of its output. Each takes one sequence's tokens
//! in order, from and onto that sequence's state: a word range of a state
//! buffer laid out as the CPU lays it out (`lamina-model`'s `delta.rs`),
//! so a state moves between the devices as bytes.

use super::{shape, to_u32, Batch};
use crate::buffer::Tensor;
use crate::error::GpuError;
use crate::params::DeltaParams;
use crate::shader::KernelSpec;

/// The largest key head the scan keeps in workgroup memory
/// (`shaders/delta_scan.wgsl`).
pub const DELTA_MAX_HEAD: usize = 256;

/// One sequence's part of a Gated DeltaNet step: tokens `first..first + n`
/// of rows of `ch` channels (q, k, v), its state at word `state_at` (the
/// convolution's window of `kernel − 1` rows) and `mat_at` (a
/// `head_v × head_k` matrix per value head).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DeltaShape {
    pub kernel: usize,
    pub head_k: usize,
    pub head_v: usize,
    pub n_k: usize,
    pub n_v: usize,
    /// Value head `h` reads key head `h / (n_v / n_k)`; else `h mod n_k`.
    pub grouped: bool,
    pub eps: f32,
    pub first: usize,
    pub n: usize,
    pub state_at: usize,
}

impl DeltaShape {
    /// The convolution's channels: q, k, v.
    pub fn ch(&self) -> usize {
        2 * self.n_k * self.head_k + self.n_v * self.head_v
    }

    /// Words of one sequence's state.
    pub fn state_len(&self) -> usize {
        (self.kernel - 1) * self.ch() + self.n_v * self.head_v * self.head_k
    }

    fn params(&self, op: &'static str) -> Result<DeltaParams, GpuError> {
        let ok = self.kernel >= 2
            && self.head_k > 0
            && self.head_k <= DELTA_MAX_HEAD
            && self.head_v > 0
            && self.n_k > 0
            && self.n_v % self.n_k == 0;
        if !ok {
            return Err(shape(op, format!("{self:?}")));
        }
        Ok(DeltaParams {
            ch: to_u32(op, "channels", self.ch())?,
            kernel: to_u32(op, "kernel", self.kernel)?,
            first: to_u32(op, "first", self.first)?,
            n: to_u32(op, "tokens", self.n)?,
            state_at: to_u32(op, "state", self.state_at)?,
            mat_at: to_u32(op, "state", self.state_at + (self.kernel - 1) * self.ch())?,
            head_k: to_u32(op, "head_k", self.head_k)?,
            head_v: to_u32(op, "head_v", self.head_v)?,
            n_k: to_u32(op, "n_k", self.n_k)?,
            n_v: to_u32(op, "n_v", self.n_v)?,
            grouped: u32::from(self.grouped),
            eps: self.eps,
            scale: 1.0 / (self.head_k as f32).sqrt(),
            _pad: [0; 3],
        })
    }

    fn check(&self, op: &'static str, t: &Tensor, per_token: usize) -> Result<(), GpuError> {
        let end = (self.first + self.n).checked_mul(per_token);
        if end.is_none_or(|e| e > t.len()) {
            return Err(shape(
                op,
                format!("{} values for {self:?} ({per_token} a token)", t.len()),
            ));
        }
        Ok(())
    }

    fn check_state(&self, op: &'static str, state: &Tensor) -> Result<(), GpuError> {
        if self.state_at + self.state_len() > state.len() {
            return Err(shape(
                op,
                format!("a state of {} words for {self:?}", state.len()),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
pub(crate) fn delta_specs() -> Vec<KernelSpec> {
    [
        "delta_conv.wgsl",
        "delta_norm.wgsl",
        "delta_scan.wgsl",
        "delta_gate.wgsl",
    ]
    .into_iter()
    .map(KernelSpec::new)
    .collect()
}

impl Batch<'_> {
    /// The causal convolution then SiLU of one sequence's q, k, v products
    /// `x` into `y` (the same places), from and onto its window in `state`;
    /// then the L2 norm of every query and key head of `y`, in place.
    pub fn delta_conv(
        &mut self,
        x: &Tensor,
        taps: &Tensor,
        state: &Tensor,
        y: &Tensor,
        s: &DeltaShape,
    ) -> Result<(), GpuError> {
        const OP: &str = "delta_conv";
        let p = s.params(OP)?;
        s.check(OP, x, s.ch())?;
        s.check(OP, y, s.ch())?;
        s.check_state(OP, state)?;
        if taps.len() != s.ch() * s.kernel {
            return Err(shape(OP, format!("{} taps for {s:?}", taps.len())));
        }
        Self::distinct(OP, y, &[x, taps, state])?;
        if s.n == 0 {
            return Ok(());
        }
        let (gx, gy) = self.gpu.grid(p.ch.div_ceil(64));
        self.push(
            &KernelSpec::new("delta_conv.wgsl"),
            &[
                (&x.buf, None),
                (&taps.buf, None),
                (&state.buf, None),
                (&y.buf, None),
            ],
            &p,
            [gx, gy, 1],
        )?;
        let heads = to_u32(OP, "heads", s.n * 2 * s.n_k)?;
        let (gx, gy) = self.gpu.grid(heads);
        self.push(
            &KernelSpec::new("delta_norm.wgsl"),
            &[(&y.buf, None)],
            &p,
            [gx, gy, 1],
        )
    }

    /// The delta rule over one sequence's tokens: `y` holds their
    /// convolved q, k, v (after [`Batch::delta_conv`]), `beta` and `alpha`
    /// their `n_v` logits each; each value head's matrix in `state` is
    /// carried through the tokens and `out` gets their `n_v · head_v`
    /// outputs.
    #[allow(clippy::too_many_arguments)]
    pub fn delta_scan(
        &mut self,
        y: &Tensor,
        beta: &Tensor,
        alpha: &Tensor,
        dt_bias: &Tensor,
        a: &Tensor,
        state: &Tensor,
        out: &Tensor,
        s: &DeltaShape,
    ) -> Result<(), GpuError> {
        const OP: &str = "delta_scan";
        let p = s.params(OP)?;
        s.check(OP, y, s.ch())?;
        s.check(OP, beta, s.n_v)?;
        s.check(OP, alpha, s.n_v)?;
        s.check(OP, out, s.n_v * s.head_v)?;
        s.check_state(OP, state)?;
        if dt_bias.len() != s.n_v || a.len() != s.n_v {
            return Err(shape(
                OP,
                format!("dt {} and a {} for {s:?}", dt_bias.len(), a.len()),
            ));
        }
        Self::distinct(OP, out, &[y, beta, alpha, dt_bias, a, state])?;
        if s.n == 0 {
            return Ok(());
        }
        self.push(
            &KernelSpec::new("delta_scan.wgsl"),
            &[
                (&y.buf, None),
                (&beta.buf, None),
                (&alpha.buf, None),
                (&dt_bias.buf, None),
                (&a.buf, None),
                (&state.buf, None),
                (&out.buf, None),
            ],
            &p,
            [p.n_v, 1, 1],
        )
    }

    /// Each value head's outputs in `out` RMS-normed, times `weight` and
    /// silu of the gate `z` (the same places), in place, for one sequence's
    /// tokens.
    pub fn delta_gate(
        &mut self,
        out: &Tensor,
        z: &Tensor,
        weight: &Tensor,
        s: &DeltaShape,
    ) -> Result<(), GpuError> {
        const OP: &str = "delta_gate";
        let p = s.params(OP)?;
        s.check(OP, out, s.n_v * s.head_v)?;
        s.check(OP, z, s.n_v * s.head_v)?;
        if weight.len() != s.head_v {
            return Err(shape(OP, format!("a weight of {} for {s:?}", weight.len())));
        }
        Self::distinct(OP, out, &[z, weight])?;
        if s.n == 0 {
            return Ok(());
        }
        let rows = to_u32(OP, "heads", s.n * s.n_v)?;
        let (gx, gy) = self.gpu.grid(rows);
        self.push(
            &KernelSpec::new("delta_gate.wgsl"),
            &[(&out.buf, None), (&z.buf, None), (&weight.buf, None)],
            &p,
            [gx, gy, 1],
        )
    }

    /// `y = sigmoid(g) · u` element-wise (attention's output gate, qwen35).
    pub fn sigmoid_mul(&mut self, g: &Tensor, u: &Tensor, y: &Tensor) -> Result<(), GpuError> {
        self.elementwise(
            "sigmoid_mul",
            KernelSpec::new("glu.wgsl").def("ACT", "sigmoid"),
            &[g, u],
            y,
            0.0,
        )
    }
}
