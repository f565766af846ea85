//! Mixtures of experts on the GPU: the router and shared expert in the
//! step, the routed experts on the device or on the host (see the
//! module header of `gpu`).

use lamina_gpu::{Batch, Columns, Gate, Gpu, MatmulKernel, Runs, Weight};

use super::scratch::Scratch;
use super::upload::{GpuExperts, GpuFfn, GpuLayer};
use super::{gpu_err, HybridModel};
use crate::config::Config;
use crate::error::ModelError;
use crate::weights::Ffn;

/// Most tokens a step runs its experts for straight from the device's
/// router's one-column runs: each (token, slot) pair then streams its
/// expert's weights by itself, which costs a GPU no more than packing
/// while the pairs are few (decoding); more tokens are packed by expert,
/// so each expert streams once for all its tokens. On a CPU-backed device,
/// whose products are bound by arithmetic rather than by the weight reads,
/// two pairs that chose one expert cost twice its work unless packed
/// together: there only a lone token (whose experts are distinct) skips
/// the packing (docs/perf/moe.md, 2026-12-06, "four sequences on
/// lavapipe"). Either way the bits are the same.
pub(super) fn route_on_device_tokens(g: &Gpu) -> usize {
    if g.adapter_info().device_type == "cpu" {
        1
    } else {
        lamina_gpu::MAX_SMALL_COLS
    }
}

/// How a block that routes on the device runs its experts in a step.
///
/// A larger step packs its pairs by expert on the device, on a CPU-backed
/// device too: there a packed product's workgroup skips the columns its run
/// lacks (`matvec_rows.wgsl`), so the device's runs cost what the host's
/// exact runs cost without the readback (docs/perf/moe.md, 2026-12-06,
/// "experts weighed and routed on the GPU"). The host packs only what the
/// packing kernel cannot hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum DeviceExperts {
    /// Each (token, slot) pair from the router's own one-column runs.
    Pairs,
    /// The pairs packed by expert on the device (`moe_pack`), in runs of
    /// at most this many columns.
    Packed(usize),
}

impl DeviceExperts {
    /// The way for `n` tokens routed as `r`; `None` where only the host can
    /// pack them (more pairs or runs than the packing kernel holds), or
    /// where `host_packs` asks for the host's packing.
    pub(super) fn choose(
        g: &Gpu,
        r: &lamina_gpu::MoeRouting,
        n: usize,
        host_packs: bool,
    ) -> Option<Self> {
        if n <= route_on_device_tokens(g) {
            return Some(DeviceExperts::Pairs);
        }
        if host_packs {
            return None;
        }
        // Runs of eight: a workgroup skips the columns a run lacks.
        let (nk, maxc) = (n * r.k, lamina_gpu::MAX_SMALL_COLS);
        (nk < 1 << 21 && r.max_runs(n, maxc) <= u16::MAX as usize)
            .then_some(DeviceExperts::Packed(maxc))
    }
}

/// Values per token a split block reads back (see `Scratch::moe_io`).
pub(super) fn moe_io_width(c: &Config, m: &crate::config::Moe) -> usize {
    let shared = if m.n_ff_shared.is_some() { c.n_embd } else { 0 };
    c.n_embd + m.n_expert + shared
}

impl HybridModel<'_> {
    /// A mixture's GPU part before its routed experts, from the normed
    /// input in `s.h`: `s.moe_io` gets that input, the router's logits and
    /// the shared expert's output (qwen2moe, before its gate) side by side.
    pub(super) fn record_router(
        &self,
        b: &mut Batch<'_>,
        l: &GpuLayer,
        s: &Scratch,
        n: usize,
    ) -> Result<(), lamina_gpu::GpuError> {
        let GpuFfn::Split { router, shared, .. } = &l.ffn else {
            return Ok(());
        };
        let e = self.cpu.config.n_embd;
        let nx = router.rows();
        let device = self.device_routing(l);
        // The host reads the input back unless the experts follow on the
        // device in this submission.
        if self.device_experts(b.gpu(), l, n).is_none() {
            b.copy(&s.h, 0, &s.moe_io, 0, n * e)?;
        }
        let at = |y_offset, w: &Weight| Columns {
            n,
            x_offset: 0,
            x_stride: w.cols(),
            y_offset,
            y_stride: w.rows(),
        };
        b.matmul_strided(
            MatmulKernel::Auto,
            router,
            &s.h,
            &s.moe_io,
            at(n * e, router),
        )?;
        if let Some((gate_up, down)) = shared {
            match &gate_up.parts[..] {
                [w] => b.matmul_glu(w, &s.h, &s.sgu, &s.sa, n, Gate::Silu)?,
                _ => {
                    gate_up.record(b, &s.h, &s.sgu, n, None)?;
                    b.glu_stacked_n(&s.sgu, &s.sa, down.cols(), n, Gate::Silu)?;
                }
            }
            let y = at(n * (e + nx), down);
            b.matmul_strided(MatmulKernel::Auto, down, &s.sa, &s.moe_io, y)?;
        }
        if let Some(r) = device {
            b.moe_route(&s.moe_io, n * e, nx, n, r, &s.route)?;
        }
        Ok(())
    }

    /// Packs a larger step's routed experts on the host from the device's
    /// choices (read back), where the device packs them (`moe_pack`)
    /// unless the packing kernel cannot hold them: the tests run every way
    /// a step can take, and measurements compare them.
    pub fn pack_experts_on_host(&mut self, on: bool) {
        self.host_packs = on;
    }

    /// How block `l` runs its experts on the device for a step of `n`
    /// tokens, where they follow in the step's submission; `None` where the
    /// host routes or packs them between two submissions. Recording the
    /// block and running its experts ask the same question.
    pub(super) fn device_experts(
        &self,
        g: &Gpu,
        l: &GpuLayer,
        n: usize,
    ) -> Option<(lamina_gpu::MoeRouting, DeviceExperts)> {
        let r = self.device_routing(l)?;
        Some((r, DeviceExperts::choose(g, &r, n, self.host_packs)?))
    }

    /// How block `l` routes on the device, where it can: its experts are
    /// on the GPU (with a shared expert, its gate too) and the device's
    /// router holds its experts. Every step of such a block routes with the
    /// device's router and gates the shared expert on the device, whatever
    /// its size, so a token's experts and weights never depend on how many
    /// others share its step.
    pub(super) fn device_routing(&self, l: &GpuLayer) -> Option<lamina_gpu::MoeRouting> {
        let m = self.cpu.config.moe?;
        let GpuFfn::Split {
            shared,
            shared_gate,
            experts: Some(_),
            ..
        } = &l.ffn
        else {
            return None;
        };
        if shared.is_some() && shared_gate.is_none() {
            return None;
        }
        (m.n_expert <= lamina_gpu::MOE_ROUTE_MAX_EXPERTS && m.n_used <= m.n_expert).then_some(
            lamina_gpu::MoeRouting {
                n_expert: m.n_expert,
                k: m.n_used,
                norm: m.norm_weights,
                scale: m.weights_scale,
            },
        )
    }

    /// The routed experts of a block that routes on the device: each
    /// (token, slot) pair's gate/up and down products over its expert, from
    /// the router's one-column runs ([`DeviceExperts::Pairs`]) or from the
    /// pairs packed by expert on the device, their inputs gathered into that
    /// order ([`DeviceExperts::Packed`]); then their weighed sum into
    /// `s.o`. All in the step's submission: no wait for the host.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn record_device_experts(
        &self,
        b: &mut Batch<'_>,
        l: &GpuLayer,
        gx: &GpuExperts,
        r: lamina_gpu::MoeRouting,
        how: DeviceExperts,
        s: &Scratch,
        n: usize,
    ) -> Result<(), lamina_gpu::GpuError> {
        let c = &self.cpu.config;
        let (e, fe) = (c.n_embd, c.moe.map_or(0, |m| m.n_ff_exp));
        let runs = Runs {
            table: &s.route,
            at: r.runs_at(n),
            count: n * r.k,
            n_mats: r.n_expert,
            maxc: 1,
            indirect: None,
        };
        let (up, down, x) = match how {
            DeviceExperts::Pairs => {
                let down = Runs {
                    at: r.down_runs_at(n),
                    ..runs
                };
                (runs, down, &s.h)
            }
            DeviceExperts::Packed(maxc) => {
                let grids = [
                    b.runs_grid(&gx.gate_up, r.n_expert, true),
                    b.runs_grid(&gx.down, r.n_expert, false),
                ];
                let count = b.moe_pack(&s.route, &s.moe_args, n, r, maxc, grids)?;
                b.gather_cols(&s.h, &s.route, r.gather_at(n), &s.xin, n * r.k, e)?;
                // Only the runs that hold columns are dispatched.
                let packed = |at| Runs {
                    count,
                    maxc,
                    indirect: Some((&s.moe_args, at)),
                    ..runs
                };
                (packed(0), packed(3), &s.xin)
            }
        };
        b.matmul_runs(&gx.gate_up, up, x, e, &s.ea, fe, Some(Gate::Silu))?;
        b.matmul_runs(&gx.down, down, &s.ea, fe, &s.ys, e, None)?;
        b.moe_weigh(&s.ys, &s.route, &s.o, n, r.k, e, false)?;
        self.record_shared_gate(b, l, r, s, n)
    }

    /// A shared expert's output under its gate, added to the routed sum in
    /// `s.o` on the device (qwen2moe; nothing without one): the output is
    /// where [`Self::record_router`] put it, after the input and the
    /// router's logits in `s.moe_io`.
    pub(super) fn record_shared_gate(
        &self,
        b: &mut Batch<'_>,
        l: &GpuLayer,
        r: lamina_gpu::MoeRouting,
        s: &Scratch,
        n: usize,
    ) -> Result<(), lamina_gpu::GpuError> {
        let GpuFfn::Split {
            shared_gate: Some(gate),
            ..
        } = &l.ffn
        else {
            return Ok(());
        };
        let e = self.cpu.config.n_embd;
        b.moe_shared(&s.h, gate, &s.moe_io, n * (e + r.n_expert), &s.o, n, e)
    }

    /// The host part of split block `il` over the `n` tokens of a step whose
    /// submission [`Self::record_router`] ended: from `io`, that
    /// submission's readback of the normed input, the router's logits and
    /// the shared expert's output (`Scratch::moe_io`), routes
    /// the tokens, and leaves the block's feed-forward output in `s.o`:
    /// computed here when the routed experts are on the CPU, recorded into
    /// `b` (the step's next submission) when they are on the GPU, so such
    /// a block waits for the device once, not twice.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn run_split_experts(
        &self,
        g: &Gpu,
        b: &mut Batch<'_>,
        il: usize,
        l: &GpuLayer,
        s: &Scratch,
        n: usize,
        mut io: Vec<f32>,
    ) -> Result<(), ModelError> {
        let c = &self.cpu.config;
        let e = c.n_embd;
        let (Ffn::Moe(ex), Some(m)) = (&self.cpu.weights.layers[il].ffn, c.moe) else {
            return Err(ModelError::Placement(format!(
                "blk.{il} was split but has no experts"
            )));
        };
        if io.len() != n * moe_io_width(c, &m) {
            return Err(ModelError::Step(format!(
                "blk.{il}: {} values read back for {n} tokens",
                io.len()
            )));
        }
        let (h, rest) = io.split_at_mut(n * e);
        let (logits, sy) = rest.split_at_mut(n * m.n_expert);
        match l.gpu_experts() {
            None => {
                let mut out = vec![0.0f32; n * e];
                crate::moe::routed_experts(ex, &m, e, h, n, logits, &mut out)?;
                if let Some((gate_inp, ..)) = &ex.shared {
                    crate::moe::add_shared(gate_inp, e, h, sy, &mut out);
                }
                g.write_f32(&s.o, &out).map_err(gpu_err)
            }
            Some(gx) => {
                let device = self.device_routing(l);
                // Routed on the host: the shared expert's gated output goes
                // into `o` first, and the GPU's weighted sum adds itself to
                // it (add_shared's order: the routed sum, plus the gated
                // shared output).
                let shared =
                    ex.shared
                        .as_ref()
                        .filter(|_| device.is_none())
                        .map(|(gate_inp, ..)| {
                            let mut sh = vec![0.0f32; n * e];
                            crate::moe::add_shared(gate_inp, e, h, sy, &mut sh);
                            sh
                        });
                if let Some(sh) = &shared {
                    g.write_f32(&s.o, sh).map_err(gpu_err)?;
                }
                // The device's router chose where it could (the same
                // choices a small step makes without the host).
                let chosen = match device {
                    Some(r) => {
                        let words = g.read_u32(&s.route).map_err(gpu_err)?;
                        let nk = n * m.n_used;
                        (0..nk)
                            .map(|i| {
                                let id = words.get(r.runs_at(n) + 4 * i).copied().unwrap_or(0);
                                let w = words.get(nk + i).copied().unwrap_or(0);
                                (id as usize, f32::from_bits(w))
                            })
                            .collect()
                    }
                    None => crate::moe::route(&m, n, logits),
                };
                self.host_routed_experts(g, b, gx, &m, s, h, n, &chosen, shared.is_some())?;
                // Routed on the device: its gate too, as a step that does
                // not wait gates it.
                match device {
                    Some(r) => self.record_shared_gate(b, l, r, s, n).map_err(gpu_err),
                    None => Ok(()),
                }
            }
        }
    }

    /// The routed experts of a block that has them on the GPU, for the
    /// normed input `h` of `n` tokens routed as `chosen` says (each (token,
    /// slot)'s expert and weight), recorded into `b`: every pair's input
    /// goes up packed in expert order, so each chosen expert's tokens are
    /// runs of up to eight columns of one `matmul_runs` per product (each
    /// expert's weights streamed once for all its tokens); the outputs are
    /// weighed in slot order on the GPU into `s.o` (added to what it holds
    /// with `add`), as [`crate::cpu`]'s `weigh_experts` weighs its own.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn host_routed_experts(
        &self,
        g: &Gpu,
        b: &mut Batch<'_>,
        gx: &GpuExperts,
        m: &crate::config::Moe,
        s: &Scratch,
        h: &[f32],
        n: usize,
        chosen: &[(usize, f32)],
        add: bool,
    ) -> Result<(), ModelError> {
        let (e, k, fe) = (self.cpu.config.n_embd, m.n_used, m.n_ff_exp);
        if chosen.len() != n * k || chosen.iter().any(|c| c.0 >= m.n_expert) {
            return Err(ModelError::Step(format!(
                "{} routed pairs for {n} tokens of {k} of {} experts",
                chosen.len(),
                m.n_expert
            )));
        }
        // A stable sort: within an expert, the tokens in order.
        let mut order: Vec<usize> = (0..n * k).collect();
        order.sort_by_key(|&i| chosen[i].0);
        let mut xin = Vec::with_capacity(n * k * e);
        for &i in &order {
            let t = i / k;
            xin.extend_from_slice(&h[t * e..(t + 1) * e]);
        }
        g.write_f32(&s.xin, &xin).map_err(gpu_err)?;
        // The weighted sum's table (each (token, slot)'s packed row, then
        // its weight), then the runs: each expert's packed columns, eight
        // at most a run, the same columns of x and y.
        let mut words = vec![0u32; 2 * n * k];
        for (j, &i) in order.iter().enumerate() {
            words[i] = j as u32;
        }
        for (i, c) in chosen.iter().enumerate() {
            words[n * k + i] = c.1.to_bits();
        }
        let (mut first, mut longest) = (0, 1);
        for run in order.chunk_by(|&a, &b| chosen[a].0 == chosen[b].0) {
            for part in run.chunks(lamina_gpu::MAX_SMALL_COLS) {
                let x = chosen[part[0]].0 as u32;
                words.extend([x, first, first, part.len() as u32]);
                first += part.len() as u32;
                longest = longest.max(part.len());
            }
        }
        g.write_u32(&s.route, &words).map_err(gpu_err)?;
        let runs = Runs {
            table: &s.route,
            at: 2 * n * k,
            count: (words.len() - 2 * n * k) / 4,
            n_mats: m.n_expert,
            // The kernel's compiled column count: no more than the longest
            // run needs (its arrays stay smaller).
            maxc: longest.next_power_of_two(),
            indirect: None,
        };
        b.matmul_runs(&gx.gate_up, runs, &s.xin, e, &s.ea, fe, Some(Gate::Silu))
            .map_err(gpu_err)?;
        b.matmul_runs(&gx.down, runs, &s.ea, fe, &s.ys, e, None)
            .map_err(gpu_err)?;
        b.moe_weigh(&s.ys, &s.route, &s.o, n, k, e, add)
            .map_err(gpu_err)
    }
}
