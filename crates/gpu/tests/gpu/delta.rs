//! Gated DeltaNet's kernels against a CPU evaluation of the same steps
//! on random data (two sequences' states in one buffer, grouped and tiled
//! value heads), and a sequence cut into steps anywhere gives the bits of
//! its tokens in one step.

use super::common;

use common::Rng;
use lamina_gpu::{DeltaShape, Gpu, Tensor};

/// The CPU's steps over one sequence, from its state: the outputs before
/// the gated norm, and after it.
#[allow(clippy::too_many_arguments)]
fn reference(
    s: &DeltaShape,
    x: &[f32],
    taps: &[f32],
    beta: &[f32],
    alpha: &[f32],
    dt: &[f32],
    a: &[f32],
    z: &[f32],
    w: &[f32],
    state: &mut [f32],
) -> Vec<f64> {
    let (ch, k, hk, hv) = (s.ch(), s.kernel, s.head_k, s.head_v);
    let kd = s.n_k * hk;
    let (window, mats) = state.split_at_mut((k - 1) * ch);
    let mut out = Vec::new();
    for t in 0..s.n {
        let row = &x[t * ch..(t + 1) * ch];
        let mut y: Vec<f64> = (0..ch)
            .map(|c| {
                let mut acc = 0.0f64;
                for j in 0..k - 1 {
                    acc += taps[c * k + j] as f64 * window[j * ch + c] as f64;
                }
                acc += taps[c * k + k - 1] as f64 * row[c] as f64;
                acc / (1.0 + (-acc).exp())
            })
            .collect();
        window.copy_within(ch.., 0);
        let last = window.len() - ch;
        window[last..].copy_from_slice(row);
        for h in 0..2 * s.n_k {
            let head = &mut y[h * hk..(h + 1) * hk];
            let n = (head.iter().map(|v| v * v).sum::<f64>() + s.eps as f64).sqrt();
            head.iter_mut().for_each(|v| *v /= n);
        }
        let mut o = vec![0.0f64; s.n_v * hv];
        for h in 0..s.n_v {
            let kh = if s.grouped {
                h / (s.n_v / s.n_k)
            } else {
                h % s.n_k
            };
            let q = &y[kh * hk..(kh + 1) * hk];
            let kk = &y[kd + kh * hk..kd + (kh + 1) * hk];
            let v = &y[2 * kd + h * hv..2 * kd + (h + 1) * hv];
            let b = 1.0 / (1.0 + (-(beta[t * s.n_v + h] as f64)).exp());
            let xg = alpha[t * s.n_v + h] as f64 + dt[h] as f64;
            let decay = (xg.exp().ln_1p() * a[h] as f64).exp();
            let m = &mut mats[h * hv * hk..(h + 1) * hv * hk];
            for j in 0..hv {
                let r = &mut m[j * hk..(j + 1) * hk];
                r.iter_mut().for_each(|e| *e = (*e as f64 * decay) as f32);
                let sk: f64 = r.iter().zip(kk).map(|(e, k)| *e as f64 * k).sum();
                let d = (v[j] - sk) * b;
                r.iter_mut()
                    .zip(kk)
                    .for_each(|(e, k)| *e = (*e as f64 + d * k) as f32);
                o[h * hv + j] =
                    r.iter().zip(q).map(|(e, q)| *e as f64 * q).sum::<f64>() / (hk as f64).sqrt();
            }
        }
        for h in 0..s.n_v {
            let oh = &mut o[h * hv..(h + 1) * hv];
            let ms = oh.iter().map(|v| v * v).sum::<f64>() / hv as f64;
            let sc = 1.0 / (ms + s.eps as f64).sqrt();
            for (i, e) in oh.iter_mut().enumerate() {
                let zz = z[t * s.n_v * hv + h * hv + i] as f64;
                *e = *e * sc * w[i] as f64 * (zz / (1.0 + (-zz).exp()));
            }
        }
        out.extend(o);
    }
    out
}

struct Run {
    out: Tensor,
    state: Tensor,
}

/// The kernels over tokens `0..n` of one sequence whose state starts at
/// `state_at`, in steps cut at `cuts`.
#[allow(clippy::too_many_arguments)]
fn run(
    gpu: &Gpu,
    s: DeltaShape,
    cuts: &[usize],
    x: &Tensor,
    taps: &Tensor,
    beta: &Tensor,
    alpha: &Tensor,
    dt: &Tensor,
    a: &Tensor,
    z: &Tensor,
    w: &Tensor,
    state0: &[f32],
) -> Run {
    let n = s.n;
    let state = gpu.upload_f32(state0).unwrap();
    let y = common::poisoned(gpu, n * s.ch());
    let out = common::poisoned(gpu, n * s.n_v * s.head_v);
    let mut at = 0;
    for &e in cuts.iter().chain([n].iter()) {
        let part = DeltaShape {
            first: at,
            n: e - at,
            ..s
        };
        let mut b = gpu.batch();
        b.delta_conv(x, taps, &state, &y, &part).unwrap();
        b.delta_scan(&y, beta, alpha, dt, a, &state, &out, &part)
            .unwrap();
        b.delta_gate(&out, z, w, &part).unwrap();
        b.submit().unwrap();
        at = e;
    }
    Run { out, state }
}

#[test]
fn gated_delta_net_matches_the_cpu_and_any_cut() {
    let (_turn, gpu) = common::gpu();
    let mut rng = Rng::new(0xde17a);
    for grouped in [false, true] {
        let s0 = DeltaShape {
            kernel: 4,
            head_k: 16,
            head_v: 16,
            n_k: 2,
            n_v: 4,
            grouped,
            eps: 1e-6,
            first: 0,
            n: 7,
            state_at: 0,
        };
        let (n, ch, nv, hv) = (s0.n, s0.ch(), s0.n_v, s0.head_v);
        let x = rng.vec(n * ch);
        let taps: Vec<f32> = rng.vec(ch * s0.kernel).iter().map(|v| v * 0.5).collect();
        let beta = rng.vec(n * nv);
        let alpha = rng.vec(n * nv);
        let dt: Vec<f32> = rng.vec(nv).iter().map(|v| v * 0.1).collect();
        let a: Vec<f32> = rng.vec(nv).iter().map(|v| -(v.abs() + 0.1)).collect();
        let z = rng.vec(n * nv * hv);
        let w: Vec<f32> = rng.vec(hv).iter().map(|v| 1.0 + 0.1 * v).collect();
        let up = |v: &[f32]| gpu.upload_f32(v).unwrap();
        let (tx, ttaps, tb, ta, tdt, tav, tz, tw) = (
            up(&x),
            up(&taps),
            up(&beta),
            up(&alpha),
            up(&dt),
            up(&a),
            up(&z),
            up(&w),
        );
        // A second sequence's state sits before this one's and is left
        // alone.
        let len = s0.state_len();
        let other: Vec<f32> = rng.vec(len);
        let mine: Vec<f32> = rng.vec(len).iter().map(|v| v * 0.1).collect();
        let state0 = [other.clone(), mine.clone()].concat();
        let s = DeltaShape {
            state_at: len,
            ..s0
        };
        let whole = run(
            gpu,
            s,
            &[],
            &tx,
            &ttaps,
            &tb,
            &ta,
            &tdt,
            &tav,
            &tz,
            &tw,
            &state0,
        );
        let mut cpu_state = mine.clone();
        let want = reference(
            &s,
            &x,
            &taps,
            &beta,
            &alpha,
            &dt,
            &a,
            &z,
            &w,
            &mut cpu_state,
        );
        let got = gpu.read_f32(&whole.out).unwrap();
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!(
                (*g as f64 - w).abs() < 1e-4 * (1.0 + w.abs()),
                "grouped {grouped}: output {i}: {g} vs {w}"
            );
        }
        let st = gpu.read_f32(&whole.state).unwrap();
        assert_eq!(&st[..len], &other[..], "the other sequence's state moved");
        for (i, (g, w)) in st[len..].iter().zip(&cpu_state).enumerate() {
            assert!(
                (g - w).abs() < 1e-4 * (1.0 + w.abs()),
                "state {i}: {g} vs {w}"
            );
        }
        for cuts in [&[3usize][..], &[1, 2, 6]] {
            let cut = run(
                gpu, s, cuts, &tx, &ttaps, &tb, &ta, &tdt, &tav, &tz, &tw, &state0,
            );
            assert_eq!(
                gpu.read_u32(&cut.out).unwrap(),
                gpu.read_u32(&whole.out).unwrap(),
                "grouped {grouped}, cut at {cuts:?}"
            );
            assert_eq!(
                gpu.read_u32(&cut.state).unwrap(),
                gpu.read_u32(&whole.state).unwrap()
            );
        }
    }
}

#[test]
fn the_output_gate_is_sigmoid_times_the_value() {
    let (_turn, gpu) = common::gpu();
    let mut rng = Rng::new(0x9a7e);
    let n = 300;
    let g: Vec<f32> = rng.vec(n).iter().map(|v| v * 8.0).collect();
    let u = rng.vec(n);
    let (tg, tu, y) = (
        gpu.upload_f32(&g).unwrap(),
        gpu.upload_f32(&u).unwrap(),
        common::poisoned(gpu, n),
    );
    let mut b = gpu.batch();
    b.sigmoid_mul(&tg, &tu, &y).unwrap();
    b.submit().unwrap();
    for (i, got) in gpu.read_f32(&y).unwrap().iter().enumerate() {
        let want = u[i] as f64 / (1.0 + (-(g[i] as f64)).exp());
        assert!((*got as f64 - want).abs() < 1e-6, "{i}: {got} vs {want}");
    }
}
