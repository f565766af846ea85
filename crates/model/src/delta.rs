//! Gated DeltaNet's recurrence on the CPU ([`crate::program::Op::DeltaNet`]):
//! one sequence's tokens through a block's causal convolution and the
//! delta rule, from the state its earlier tokens left.
//!
//! A sequence's state is the convolution's window (the last
//! `conv_kernel − 1` inputs, oldest first, `conv_dim` values each), then
//! one `head_v × head_k` matrix per value head, row `j` holding
//! `S[·][j]` (llama.cpp's layout: every product below reads a row
//! contiguously). Tokens run in order and each head alone, so a token's
//! bits do not depend on how its sequence was cut into steps or what else
//! shared the step.

use rayon::prelude::*;

use crate::config::DeltaNet;
use crate::error::ModelError;
use crate::weights::{BetaAlpha, DeltaInput, DeltaNetWeights};

/// The block's input products for `n` tokens of `h`, in the layout
/// [`scan`] reads: each token's q, k and v (the convolution's channels)
/// in `qkv`, its gate in `z`, its value heads' beta and alpha logits.
/// Fused products (qwen3next's `ssm_in`, `ssm_ba`) run into `tmp` and
/// `tmp2` and are taken apart by key head.
#[allow(clippy::too_many_arguments)]
pub(crate) fn project(
    w: &DeltaNetWeights<'_>,
    d: DeltaNet,
    h: &[f32],
    n: usize,
    qkv: &mut [f32],
    z: &mut [f32],
    beta: &mut [f32],
    alpha: &mut [f32],
    tmp: &mut Vec<f32>,
    tmp2: &mut Vec<f32>,
) -> Result<(), ModelError> {
    let (hk, hv, nk, nv) = (d.head_k, d.head_v, d.n_k, d.n_v);
    let (kd, vd, ch) = (d.key_dim(), d.value_dim(), d.conv_dim());
    let r = nv / nk;
    match &w.input {
        DeltaInput::Split { qkv: m, gate } => {
            m.matmul(h, n, qkv)?;
            gate.matmul(h, n, z)?;
        }
        DeltaInput::Fused(m) => {
            tmp.resize(n * (ch + vd), 0.0);
            m.matmul(h, n, tmp)?;
            // Per key head g: q (hk), k (hk), v (r·hv), z (r·hv).
            let group = 2 * hk + 2 * r * hv;
            for t in 0..n {
                let src = &tmp[t * (ch + vd)..(t + 1) * (ch + vd)];
                let (dst, zt) = (&mut qkv[t * ch..(t + 1) * ch], &mut z[t * vd..(t + 1) * vd]);
                for g in 0..nk {
                    let s = &src[g * group..(g + 1) * group];
                    dst[g * hk..(g + 1) * hk].copy_from_slice(&s[..hk]);
                    dst[kd + g * hk..kd + (g + 1) * hk].copy_from_slice(&s[hk..2 * hk]);
                    let vs = 2 * kd + g * r * hv;
                    dst[vs..vs + r * hv].copy_from_slice(&s[2 * hk..2 * hk + r * hv]);
                    zt[g * r * hv..(g + 1) * r * hv].copy_from_slice(&s[2 * hk + r * hv..]);
                }
            }
        }
    }
    match &w.beta_alpha {
        BetaAlpha::Split { beta: b, alpha: a } => {
            b.matmul(h, n, beta)?;
            a.matmul(h, n, alpha)?;
        }
        BetaAlpha::Fused(m) => {
            tmp2.resize(n * 2 * nv, 0.0);
            m.matmul(h, n, tmp2)?;
            // Per key head g: its value heads' betas, then their alphas.
            for t in 0..n {
                let src = &tmp2[t * 2 * nv..(t + 1) * 2 * nv];
                for g in 0..nk {
                    let s = &src[g * 2 * r..(g + 1) * 2 * r];
                    beta[t * nv + g * r..t * nv + (g + 1) * r].copy_from_slice(&s[..r]);
                    alpha[t * nv + g * r..t * nv + (g + 1) * r].copy_from_slice(&s[r..]);
                }
            }
        }
    }
    Ok(())
}

/// ggml's softplus: `ln(1 + eˣ)`, `x` itself past 20.
fn softplus(x: f32) -> f32 {
    if x > 20.0 {
        x
    } else {
        x.exp().ln_1p()
    }
}

fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// `x / √(Σx² + eps)`: llama.cpp's L2 norm of q and k.
fn l2_norm(x: &mut [f32], eps: f32) {
    let ss: f32 = x.iter().map(|v| v * v).sum();
    let s = 1.0 / (ss + eps).sqrt();
    x.iter_mut().for_each(|v| *v *= s);
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    // Eight running sums in a fixed order: vectorises, and the same bits
    // for any batch.
    let mut acc = [0.0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for l in 0..8 {
            acc[l] += x[l] * y[l];
        }
    }
    let mut s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for (x, y) in ra.iter().zip(rb) {
        s += x * y;
    }
    s
}

/// One sequence's `n` tokens through a Gated DeltaNet block. `qkv` holds
/// each token's `conv_dim` projected inputs and is overwritten with the
/// convolved, activated and normed q, k, v; `beta` and `alpha` each
/// token's `n_v` raw logits; `y` gets each token's `value_dim` outputs
/// (before the gated norm). `state` is left after the last token.
#[allow(clippy::too_many_arguments)]
pub(crate) fn scan(
    w: &DeltaNetWeights<'_>,
    d: DeltaNet,
    kernel: usize,
    eps: f32,
    state: &mut [f32],
    qkv: &mut [f32],
    beta: &[f32],
    alpha: &[f32],
    y: &mut [f32],
) {
    let ch = d.conv_dim();
    let n = qkv.len() / ch;
    let (window, s) = state.split_at_mut((kernel - 1) * ch);
    convolve(&w.conv, kernel, ch, window, qkv);
    let (kd, hk) = (d.key_dim(), d.head_k);
    for row in qkv.chunks_exact_mut(ch) {
        let (q, rest) = row.split_at_mut(kd);
        let k = &mut rest[..kd];
        q.chunks_exact_mut(hk).for_each(|h| l2_norm(h, eps));
        k.chunks_exact_mut(hk).for_each(|h| l2_norm(h, eps));
    }
    let scale = 1.0 / (hk as f32).sqrt();
    let (hv, vd) = (d.head_v, d.value_dim());
    // Each value head over all the tokens, the heads in parallel; each
    // writes its own outputs, gathered below.
    let heads: Vec<Vec<f32>> = s
        .par_chunks_exact_mut(hk * hv)
        .enumerate()
        .map(|(h, m)| {
            let kh = d.key_head(h);
            let mut out = vec![0.0f32; n * hv];
            let mut delta = vec![0.0f32; hv];
            for t in 0..n {
                let row = &qkv[t * ch..(t + 1) * ch];
                let q = &row[kh * hk..(kh + 1) * hk];
                let k = &row[kd + kh * hk..kd + (kh + 1) * hk];
                let v = &row[2 * kd + h * hv..2 * kd + (h + 1) * hv];
                let b = sigmoid(beta[t * d.n_v + h]);
                let g = softplus(alpha[t * d.n_v + h] + w.dt_bias[h]) * w.a[h];
                let decay = g.exp();
                m.iter_mut().for_each(|x| *x *= decay);
                for (j, r) in m.chunks_exact(hk).enumerate() {
                    delta[j] = (v[j] - dot(r, k)) * b;
                }
                for (j, r) in m.chunks_exact_mut(hk).enumerate() {
                    let dj = delta[j];
                    r.iter_mut().zip(k).for_each(|(x, kk)| *x += dj * kk);
                }
                for (j, r) in m.chunks_exact(hk).enumerate() {
                    out[t * hv + j] = dot(r, q) * scale;
                }
            }
            out
        })
        .collect();
    for (h, out) in heads.iter().enumerate() {
        for t in 0..n {
            y[t * vd + h * hv..t * vd + (h + 1) * hv].copy_from_slice(&out[t * hv..(t + 1) * hv]);
        }
    }
}

/// The causal depthwise convolution then SiLU, in place over the tokens'
/// rows of `ch` channels, from and onto the window of past inputs
/// (ggml's `ssm_conv`: taps oldest first, summed in that order).
fn convolve(taps: &[f32], kernel: usize, ch: usize, window: &mut [f32], rows: &mut [f32]) {
    let mut out = vec![0.0f32; ch];
    for row in rows.chunks_exact_mut(ch) {
        for (c, o) in out.iter_mut().enumerate() {
            let t = &taps[c * kernel..(c + 1) * kernel];
            let mut acc = 0.0f32;
            for (j, tap) in t[..kernel - 1].iter().enumerate() {
                acc += tap * window[j * ch + c];
            }
            acc += t[kernel - 1] * row[c];
            *o = acc / (1.0 + (-acc).exp());
        }
        if kernel > 1 {
            window.copy_within(ch.., 0);
            let last = window.len() - ch;
            window[last..].copy_from_slice(row);
        }
        row.copy_from_slice(&out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The scan against a float64 evaluation of the same recurrence on
    /// random data, and cut into steps anywhere with the same bits.
    #[test]
    fn scan_matches_float64_and_any_cut() {
        for grouped in [false, true] {
            scan_case(grouped);
        }
    }

    fn scan_case(grouped: bool) {
        let d = DeltaNet {
            head_k: 8,
            n_k: 2,
            n_v: 4,
            head_v: 8,
            grouped,
        };
        let (kernel, ch, n, nv) = (4, d.conv_dim(), 7, d.n_v);
        let mut seed = 7u64;
        let mut rnd = move || {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((seed >> 33) as f32 / (1u64 << 31) as f32) * 2.0 - 1.0
        };
        let conv: Vec<f32> = (0..ch * kernel).map(|_| rnd() * 0.5).collect();
        let dt: Vec<f32> = (0..nv).map(|_| rnd() * 0.1).collect();
        let a: Vec<f32> = (0..nv).map(|_| -(rnd().abs() + 0.1)).collect();
        let qkv0: Vec<f32> = (0..n * ch).map(|_| rnd()).collect();
        let beta: Vec<f32> = (0..n * nv).map(|_| rnd()).collect();
        let alpha: Vec<f32> = (0..n * nv).map(|_| rnd()).collect();
        let empty = crate::weights::Matrix {
            name: String::new(),
            ty: lamina_gguf::GgmlType::F32,
            rows: 0,
            cols: 0,
            data: &[],
        };
        let w = DeltaNetWeights {
            input: crate::weights::DeltaInput::Split {
                qkv: empty.clone(),
                gate: empty.clone(),
            },
            beta_alpha: crate::weights::BetaAlpha::Split {
                beta: empty.clone(),
                alpha: empty.clone(),
            },
            conv: conv.clone(),
            dt_bias: dt.clone(),
            a: a.clone(),
            norm: vec![],
            out: empty,
        };
        let state_len = (kernel - 1) * ch + d.state_len();
        let eps = 1e-6;
        let run = |cuts: &[usize]| {
            let mut state = vec![0.0f32; state_len];
            let mut y = vec![0.0f32; n * d.value_dim()];
            let mut at = 0;
            for &e in cuts.iter().chain([n].iter()) {
                let mut part = qkv0[at * ch..e * ch].to_vec();
                scan(
                    &w,
                    d,
                    kernel,
                    eps,
                    &mut state,
                    &mut part,
                    &beta[at * nv..e * nv],
                    &alpha[at * nv..e * nv],
                    &mut y[at * d.value_dim()..e * d.value_dim()],
                );
                at = e;
            }
            y
        };
        let whole = run(&[]);
        assert_eq!(whole, run(&[1, 2, 5]));
        assert_eq!(whole, run(&[3]));

        // float64, written from the definition.
        let (hk, kd) = (d.head_k, d.key_dim());
        let mut conv_out = vec![0.0f64; n * ch];
        for t in 0..n {
            for c in 0..ch {
                let mut acc = 0.0f64;
                for j in 0..kernel {
                    let src = t as isize + j as isize - (kernel as isize - 1);
                    if src >= 0 {
                        acc += conv[c * kernel + j] as f64 * qkv0[src as usize * ch + c] as f64;
                    }
                }
                conv_out[t * ch + c] = acc / (1.0 + (-acc).exp());
            }
        }
        let norm = |x: &[f64]| {
            let s = (x.iter().map(|v| v * v).sum::<f64>() + eps as f64).sqrt();
            x.iter().map(|v| v / s).collect::<Vec<f64>>()
        };
        for h in 0..nv {
            let kh = if grouped { h / (nv / d.n_k) } else { h % d.n_k };
            let mut st = vec![0.0f64; hk * hk]; // st[i][j]: key i, value j
            for t in 0..n {
                let row = &conv_out[t * ch..(t + 1) * ch];
                let q = norm(&row[kh * hk..(kh + 1) * hk]);
                let k = norm(&row[kd + kh * hk..kd + (kh + 1) * hk]);
                let v = &row[2 * kd + h * hk..2 * kd + (h + 1) * hk];
                let b = 1.0 / (1.0 + (-(beta[t * nv + h] as f64)).exp());
                let x = alpha[t * nv + h] as f64 + dt[h] as f64;
                let g = (x.exp().ln_1p()) * a[h] as f64;
                st.iter_mut().for_each(|s| *s *= g.exp());
                for j in 0..hk {
                    let sk: f64 = (0..hk).map(|i| st[i * hk + j] * k[i]).sum();
                    let dj = (v[j] - sk) * b;
                    for i in 0..hk {
                        st[i * hk + j] += k[i] * dj;
                    }
                }
                for j in 0..hk {
                    let o: f64 =
                        (0..hk).map(|i| st[i * hk + j] * q[i]).sum::<f64>() / (hk as f64).sqrt();
                    let got = whole[t * d.value_dim() + h * hk + j] as f64;
                    assert!(
                        (got - o).abs() < 1e-5,
                        "t {t} head {h} dim {j}: {got} vs {o}"
                    );
                }
            }
        }
    }
}
