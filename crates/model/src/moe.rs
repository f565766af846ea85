//! Mixtures of experts on the CPU, and the routing both executors use:
//! the GPU's host-routed blocks run `route`, `routed_experts` and
//! `add_shared` on what the device read back.

use rayon::prelude::*;

use crate::config::Moe;
use crate::error::ModelError;
use crate::ops::{self, sized};
use crate::weights::{Experts, Matrix};
use lamina_quant::act::Glu;

/// Values of the gated activation per rayon task: a few microseconds of work.
const GLU_CHUNK: usize = 8192;

/// `out = down(act(gate · x) * (up · x))` for `n` columns of `x`, with `g`
/// and `u` as the gate's and up's buffers.
#[allow(clippy::too_many_arguments)]
pub(crate) fn gated(
    gate: &Matrix<'_>,
    up: &Matrix<'_>,
    down: &Matrix<'_>,
    x: &[f32],
    n: usize,
    g: &mut Vec<f32>,
    u: &mut Vec<f32>,
    out: &mut [f32],
    glu: Glu,
) -> Result<(), ModelError> {
    let ff = gate.rows;
    let g = sized(g, n * ff);
    let u = sized(u, n * ff);
    gate.matmul(x, n, g)?;
    up.matmul(x, n, u)?;
    // Element-wise, so the split changes no bits; on both cores, since a
    // prompt's gate holds n · n_ff values.
    g.par_chunks_mut(GLU_CHUNK)
        .zip(u.par_chunks(GLU_CHUNK))
        .for_each(|(g, u)| lamina_quant::act::glu(glu, g, u));
    down.matmul(g, n, &mut out[..n * down.rows])?;
    Ok(())
}

/// A mixture of experts over `n` tokens of width `e` in `h` (normed), into
/// `out`, as llama.cpp's `build_moe_ffn` with softmax gating: per token the
/// router's softmax, the `n_used` most probable experts (ties to the lower
/// index), their probabilities as weights (renormalised to sum 1 for
/// qwen3moe, then scaled where the file says), and
/// `out = Σ_slot w · expert(h)` summed in slot order, product then add.
/// Each expert runs once over all the tokens that chose it (its weights
/// read once a step); every product is batch invariant, so a token's
/// result does not depend on the others. A qwen2moe shared expert adds
/// `sigmoid(h · gate_inp_shexp) · shared(h)`.
pub(crate) fn experts(
    ex: &Experts<'_>,
    m: &Moe,
    e: usize,
    h: &[f32],
    n: usize,
    out: &mut [f32],
) -> Result<(), ModelError> {
    let mut logits = vec![0.0f32; n * m.n_expert];
    ex.router.matmul(h, n, &mut logits)?;
    routed_experts(ex, m, e, h, n, &mut logits, out)?;
    if let Some((gate_inp, sg, su, sd)) = &ex.shared {
        let mut sy = vec![0.0f32; n * e];
        let (mut g, mut u) = (Vec::new(), Vec::new());
        gated(sg, su, sd, h, n, &mut g, &mut u, &mut sy, Glu::Silu)?;
        add_shared(gate_inp, e, h, &sy, out);
    }
    Ok(())
}

/// The routed part of [`experts`] from the router's `logits` (`n_expert`
/// per token, softmaxed in place): `out = Σ_slot w · expert(h)`. What a
/// block split between the devices runs on the CPU, its router's logits
/// computed on the GPU.
pub(crate) fn routed_experts(
    ex: &Experts<'_>,
    m: &Moe,
    e: usize,
    h: &[f32],
    n: usize,
    logits: &mut [f32],
    out: &mut [f32],
) -> Result<(), ModelError> {
    let (nx, k) = (m.n_expert, m.n_used);
    let chosen = route(m, n, logits);
    // Each expert over the tokens that chose it; outputs by (token, slot).
    let mut ys = vec![0.0f32; n * k * e];
    let (mut xin, mut y, mut g, mut u) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut who: Vec<usize> = Vec::new();
    for x in 0..nx {
        who.clear();
        who.extend((0..n * k).filter(|&i| chosen[i].0 == x));
        if who.is_empty() {
            continue;
        }
        let mm = who.len();
        xin.clear();
        for &i in &who {
            let t = i / k;
            xin.extend_from_slice(&h[t * e..(t + 1) * e]);
        }
        let y = sized(&mut y, mm * e);
        gated(
            &ex.gate[x],
            &ex.up[x],
            &ex.down[x],
            &xin,
            mm,
            &mut g,
            &mut u,
            y,
            Glu::Silu,
        )?;
        for (j, &i) in who.iter().enumerate() {
            ys[i * e..(i + 1) * e].copy_from_slice(&y[j * e..(j + 1) * e]);
        }
    }
    weigh_experts(&chosen, k, e, &ys, &mut out[..n * e]);
    Ok(())
}

/// Routing from the router's `logits` (`n_expert` per token, softmaxed in
/// place): each token's `n_used` (expert, weight) pairs in slot order.
pub(crate) fn route(m: &Moe, n: usize, logits: &mut [f32]) -> Vec<(usize, f32)> {
    let (nx, k) = (m.n_expert, m.n_used);
    let mut chosen = vec![(0usize, 0.0f32); n * k];
    let mut order: Vec<usize> = Vec::with_capacity(nx);
    for (row, sel) in logits[..n * nx].chunks_mut(nx).zip(chosen.chunks_mut(k)) {
        ops::softmax(row);
        order.clear();
        order.extend(0..nx);
        order.sort_by(|&a, &b| row[b].total_cmp(&row[a]).then(a.cmp(&b)));
        for (s, &i) in sel.iter_mut().zip(&order) {
            *s = (i, row[i]);
        }
        if m.norm_weights {
            // llama.cpp clamps the sum to f16's smallest normal.
            let sum = sel.iter().map(|s| s.1).sum::<f32>().max(6.103_515_6e-5);
            sel.iter_mut().for_each(|s| s.1 /= sum);
        }
        if m.weights_scale != 0.0 && m.weights_scale != 1.0 {
            sel.iter_mut().for_each(|s| s.1 *= m.weights_scale);
        }
    }
    chosen
}

/// `out = Σ_slot w · y` per token, in slot order, product then add: the
/// experts' outputs `ys` by (token, slot), `k` slots a token.
pub(crate) fn weigh_experts(
    chosen: &[(usize, f32)],
    k: usize,
    e: usize,
    ys: &[f32],
    out: &mut [f32],
) {
    for (t, o) in out.chunks_mut(e).enumerate() {
        for s in 0..k {
            let w = chosen[t * k + s].1;
            let y = &ys[(t * k + s) * e..][..e];
            if s == 0 {
                o.iter_mut().zip(y).for_each(|(o, y)| *o = y * w);
            } else {
                o.iter_mut().zip(y).for_each(|(o, y)| *o += y * w);
            }
        }
    }
}

/// `out += sigmoid(h · gate_inp) · sy` per token: the qwen2moe shared
/// expert's output `sy` under its gate, added after the routed experts.
pub(crate) fn add_shared(gate_inp: &[f32], e: usize, h: &[f32], sy: &[f32], out: &mut [f32]) {
    for (t, (o, y)) in out.chunks_mut(e).zip(sy.chunks(e)).enumerate() {
        let z = lamina_quant::dot_f32(&h[t * e..(t + 1) * e], gate_inp);
        let gate = 1.0 / (1.0 + (-z).exp());
        o.iter_mut().zip(y).for_each(|(o, y)| *o += y * gate);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lamina_gguf::GgmlType;

    fn noise(n: usize, seed: &mut u64) -> Vec<f32> {
        (0..n)
            .map(|_| {
                *seed ^= *seed << 13;
                *seed ^= *seed >> 7;
                *seed ^= *seed << 17;
                ((*seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.6
            })
            .collect()
    }

    fn matrix(name: &str, rows: usize, cols: usize, vals: &[f32]) -> Matrix<'static> {
        let bytes: Vec<u8> = vals.iter().flat_map(|v| v.to_le_bytes()).collect();
        Matrix {
            name: name.into(),
            ty: GgmlType::F32,
            rows,
            cols,
            data: Box::leak(bytes.into_boxed_slice()),
        }
    }

    fn mv(w: &[f32], rows: usize, cols: usize, x: &[f32]) -> Vec<f64> {
        (0..rows)
            .map(|r| {
                (0..cols)
                    .map(|c| f64::from(w[r * cols + c]) * f64::from(x[c]))
                    .sum()
            })
            .collect()
    }

    /// The mixture against a float64 reference on random weights: the
    /// router's softmax and top-k, the qwen3moe renormalisation, the
    /// weighted sum and the qwen2moe shared expert with its sigmoid gate.
    #[test]
    fn experts_match_a_float64_reference() {
        let (e, nx, k, fe, fs, n) = (48, 7, 3, 40, 24, 5);
        let mut seed = 0x5eed_u64;
        let router = noise(nx * e, &mut seed);
        let gates: Vec<Vec<f32>> = (0..nx).map(|_| noise(fe * e, &mut seed)).collect();
        let ups: Vec<Vec<f32>> = (0..nx).map(|_| noise(fe * e, &mut seed)).collect();
        let downs: Vec<Vec<f32>> = (0..nx).map(|_| noise(e * fe, &mut seed)).collect();
        let (sgi, sg, su, sd) = (
            noise(e, &mut seed),
            noise(fs * e, &mut seed),
            noise(fs * e, &mut seed),
            noise(e * fs, &mut seed),
        );
        let h = noise(n * e, &mut seed);
        let silu = |v: f64| v / (1.0 + (-v).exp());
        for (norm, shared) in [(true, false), (false, true)] {
            let ex = Experts {
                router: matrix("router", nx, e, &router),
                gate: gates.iter().map(|g| matrix("g", fe, e, g)).collect(),
                up: ups.iter().map(|u| matrix("u", fe, e, u)).collect(),
                down: downs.iter().map(|d| matrix("d", e, fe, d)).collect(),
                shared: shared.then(|| {
                    (
                        sgi.clone(),
                        matrix("sg", fs, e, &sg),
                        matrix("su", fs, e, &su),
                        matrix("sd", e, fs, &sd),
                    )
                }),
            };
            let m = Moe {
                n_expert: nx,
                n_used: k,
                n_ff_exp: fe,
                norm_weights: norm,
                weights_scale: 0.0,
                n_ff_shared: shared.then_some(fs),
            };
            let mut out = vec![0.0f32; n * e];
            experts(&ex, &m, e, &h, n, &mut out).unwrap();
            for t in 0..n {
                let x = &h[t * e..(t + 1) * e];
                let logits = mv(&router, nx, e, x);
                let mx = logits.iter().cloned().fold(f64::MIN, f64::max);
                let z: f64 = logits.iter().map(|l| (l - mx).exp()).sum();
                let p: Vec<f64> = logits.iter().map(|l| (l - mx).exp() / z).collect();
                let mut order: Vec<usize> = (0..nx).collect();
                order.sort_by(|&a, &b| p[b].total_cmp(&p[a]));
                let chosen = &order[..k];
                let sum: f64 = chosen.iter().map(|&i| p[i]).sum();
                let mut want = vec![0.0f64; e];
                for &i in chosen {
                    let w = if norm { p[i] / sum } else { p[i] };
                    let g = mv(&gates[i], fe, e, x);
                    let u = mv(&ups[i], fe, e, x);
                    let a: Vec<f32> = g
                        .iter()
                        .zip(&u)
                        .map(|(g, u)| (silu(*g) * u) as f32)
                        .collect();
                    let y = mv(&downs[i], e, fe, &a);
                    want.iter_mut().zip(&y).for_each(|(o, y)| *o += w * y);
                }
                if shared {
                    let gl: f64 = x
                        .iter()
                        .zip(&sgi)
                        .map(|(a, b)| f64::from(*a) * f64::from(*b))
                        .sum();
                    let gate = 1.0 / (1.0 + (-gl).exp());
                    let g = mv(&sg, fs, e, x);
                    let u = mv(&su, fs, e, x);
                    let a: Vec<f32> = g
                        .iter()
                        .zip(&u)
                        .map(|(g, u)| (silu(*g) * u) as f32)
                        .collect();
                    let y = mv(&sd, e, fs, &a);
                    want.iter_mut().zip(&y).for_each(|(o, y)| *o += gate * y);
                }
                let got = &out[t * e..(t + 1) * e];
                let scale = want.iter().map(|v| v.abs()).fold(0.0, f64::max);
                for (j, (g, w)) in got.iter().zip(&want).enumerate() {
                    assert!(
                        (f64::from(*g) - w).abs() <= 1e-5 * scale.max(1e-3),
                        "norm {norm} shared {shared} token {t} value {j}: {g} vs {w}"
                    );
                }
            }
        }
    }
}
