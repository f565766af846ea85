//! The f32 element-wise kernels against f64 references.

use super::common;

use common::Rng;
use lamina_gpu::{attention_scratch_len, Attention, Gpu, KvElem, Rope, Tensor};

/// RMSNorm: a 1000-term f32 sum of squares (relative error ≲ 1000·ε/√3 in
/// the worst order, far less in a tree), a divide, a square root and two
/// products per element; 1e-6 is ~10 ε of headroom over what that costs.
const RMS_NORM_REL_TOL: f64 = 1e-6;
/// RoPE: the angle pos·base^(−2i/n) is formed in f32 (positions ≤ 104
/// here, so ≈ 104·ε ≈ 1e-5 rad), plus exp2/log2 and cos/sin in WGSL
/// precision. The bound is on the vector norm.
const ROPE_REL_TOL: f64 = 2e-5;
/// Softmax: exp in WGSL precision (≈ 2 ulp for the small arguments here) and a
/// 1000-term f32 sum.
const SOFTMAX_REL_TOL: f64 = 1e-6;
/// SiLU / GELU gating: one exp, one divide and two products per element.
const GLU_REL_TOL: f64 = 1e-6;

fn run(gpu: &Gpu, n: usize, record: impl FnOnce(&mut lamina_gpu::Batch, &Tensor)) -> Vec<f32> {
    let y = common::poisoned(gpu, n);
    let mut b = gpu.batch();
    record(&mut b, &y);
    b.submit().unwrap();
    gpu.read_f32(&y).unwrap()
}

fn check(what: &str, got: &[f32], want: &[f64], tol: f64) {
    let err = common::rel_err(got, want);
    assert!(
        common::within(err, tol),
        "{what}: relative error {err:e} ≥ {tol:e}"
    );
}

#[test]
fn rms_norm_matches_reference() {
    let (_turn, gpu) = common::gpu();
    let mut rng = Rng::new(11);
    let (rows, dim, eps) = (3, 1000, 1e-6f32);
    let x: Vec<f32> = rng.vec(rows * dim).iter().map(|v| v * 3.0).collect();
    let w = rng.vec(dim);
    let mut want = Vec::new();
    for r in 0..rows {
        let row = &x[r * dim..(r + 1) * dim];
        let ms = row.iter().map(|&v| v as f64 * v as f64).sum::<f64>() / dim as f64;
        let scale = 1.0 / (ms + eps as f64).sqrt();
        want.extend(
            row.iter()
                .zip(&w)
                .map(|(&v, &g)| v as f64 * scale * g as f64),
        );
    }
    let (xt, wt) = (gpu.upload_f32(&x).unwrap(), gpu.upload_f32(&w).unwrap());
    let got = run(gpu, x.len(), |b, y| {
        b.rms_norm(&xt, &wt, y, dim, eps).unwrap()
    });
    check("rms_norm", &got, &want, RMS_NORM_REL_TOL);
}

fn rope_reference(x: &[f32], r: &Rope) -> Vec<f64> {
    let mut y: Vec<f64> = x.iter().map(|&v| v as f64).collect();
    let per_token = r.n_heads * r.head_dim;
    for (t, token) in x.chunks(per_token).enumerate() {
        let pos = (r.pos_offset as usize + t) as f64;
        for h in 0..r.n_heads {
            let base = t * per_token + h * r.head_dim;
            let head = &token[h * r.head_dim..(h + 1) * r.head_dim];
            for i in 0..r.n_rot / 2 {
                let theta = pos * (r.freq_base as f64).powf(-2.0 * i as f64 / r.n_rot as f64);
                let (a, b) = if r.neox {
                    (i, i + r.n_rot / 2)
                } else {
                    (2 * i, 2 * i + 1)
                };
                let (x0, x1) = (head[a] as f64, head[b] as f64);
                y[base + a] = x0 * theta.cos() - x1 * theta.sin();
                y[base + b] = x0 * theta.sin() + x1 * theta.cos();
            }
        }
    }
    y
}

#[test]
fn rope_matches_reference_in_both_orderings() {
    let (_turn, gpu) = common::gpu();
    let mut rng = Rng::new(12);
    let (tokens, n_heads, head_dim) = (5, 3, 64);
    let x = rng.vec(tokens * n_heads * head_dim);
    let xt = gpu.upload_f32(&x).unwrap();
    for neox in [false, true] {
        // Full and partial rotation (the rest passes through).
        for n_rot in [64, 32] {
            let rope = common::rope(head_dim, n_rot, n_heads, 100, neox);
            let got = run(gpu, x.len(), |b, y| b.rope(&xt, y, &rope).unwrap());
            let want = rope_reference(&x, &rope);
            check(
                &format!("rope neox={neox} n_rot={n_rot}"),
                &got,
                &want,
                ROPE_REL_TOL,
            );
            // Pass-through dimensions are copied exactly.
            for (i, (&g, &v)) in got.iter().zip(&x).enumerate() {
                if i % head_dim >= n_rot {
                    assert_eq!(g, v, "element {i}");
                }
            }
        }
    }
}

#[test]
fn softmax_matches_reference_and_is_stable() {
    let (_turn, gpu) = common::gpu();
    let mut rng = Rng::new(13);
    let (rows, cols, scale) = (4, 1000, 0.125f32);
    // Large logits: a naive exp would overflow.
    let mut x: Vec<f32> = rng.vec(rows * cols).iter().map(|v| v * 200.0).collect();
    x[7] = 1000.0;
    let mut want = Vec::new();
    for row in x.chunks(cols) {
        let s: Vec<f64> = row.iter().map(|&v| v as f64 * scale as f64).collect();
        let m = s.iter().cloned().fold(f64::MIN, f64::max);
        let sum: f64 = s.iter().map(|v| (v - m).exp()).sum();
        want.extend(s.iter().map(|v| (v - m).exp() / sum));
    }
    let xt = gpu.upload_f32(&x).unwrap();
    let got = run(gpu, x.len(), |b, y| b.softmax(&xt, y, cols, scale).unwrap());
    check("softmax", &got, &want, SOFTMAX_REL_TOL);
    for row in got.chunks(cols) {
        let total: f32 = row.iter().sum();
        assert!((total - 1.0).abs() < 1e-4, "row sums to {total}");
    }
}

#[test]
fn gated_activations_match_reference() {
    let (_turn, gpu) = common::gpu();
    let mut rng = Rng::new(14);
    let n = 1000;
    let mut g: Vec<f32> = rng.vec(n).iter().map(|v| v * 10.0).collect();
    // Far tails, where a naive tanh or exp overflows.
    g[0] = 90.0;
    g[1] = -90.0;
    let u = rng.vec(n);
    let (gt, ut) = (gpu.upload_f32(&g).unwrap(), gpu.upload_f32(&u).unwrap());
    let silu: Vec<f64> = g
        .iter()
        .zip(&u)
        .map(|(&g, &u)| {
            let g = g as f64;
            g / (1.0 + (-g).exp()) * u as f64
        })
        .collect();
    let gelu: Vec<f64> = g
        .iter()
        .zip(&u)
        .map(|(&g, &u)| {
            let g = g as f64;
            let a = (2.0 / std::f64::consts::PI).sqrt() * (g + 0.044715 * g * g * g);
            0.5 * g * (1.0 + a.tanh()) * u as f64
        })
        .collect();
    let got = run(gpu, n, |b, y| b.silu_mul(&gt, &ut, y).unwrap());
    check("silu_mul", &got, &silu, GLU_REL_TOL);
    let got = run(gpu, n, |b, y| b.gelu_mul(&gt, &ut, y).unwrap());
    check("gelu_mul", &got, &gelu, GLU_REL_TOL);
}

#[test]
fn add_mul_and_scale_are_exact() {
    let (_turn, gpu) = common::gpu();
    let mut rng = Rng::new(15);
    // Not a multiple of the workgroup size.
    let n = 70_001;
    let (a, c) = (rng.vec(n), rng.vec(n));
    let (at, ct) = (gpu.upload_f32(&a).unwrap(), gpu.upload_f32(&c).unwrap());
    let got = run(gpu, n, |b, y| b.add(&at, &ct, y).unwrap());
    assert!(got
        .iter()
        .zip(a.iter().zip(&c))
        .all(|(g, (a, c))| *g == a + c));
    let got = run(gpu, n, |b, y| b.mul(&at, &ct, y).unwrap());
    assert!(got
        .iter()
        .zip(a.iter().zip(&c))
        .all(|(g, (a, c))| *g == a * c));
    let got = run(gpu, n, |b, y| b.scale(&at, y, -0.37).unwrap());
    assert!(got.iter().zip(&a).all(|(g, a)| *g == a * -0.37));
}

#[test]
fn many_kernels_in_one_batch() {
    // A decode-like chain recorded into one submission: norm, mat-vec, gate.
    let (_turn, gpu) = common::gpu();
    let mut rng = Rng::new(16);
    let dim = 256;
    let x = gpu.upload_f32(&rng.vec(dim)).unwrap();
    let nw = gpu.upload_f32(&vec![1.0; dim]).unwrap();
    let normed = gpu.tensor(dim).unwrap();
    let wdata = common::random_weight(&mut rng, lamina_gguf::GgmlType::Q8_0, 2 * dim, dim);
    let w = gpu
        .upload_weight(lamina_gguf::GgmlType::Q8_0, 2 * dim, dim, &wdata)
        .unwrap();
    let h = gpu.tensor(2 * dim).unwrap();
    let out = common::poisoned(gpu, 2 * dim);
    let mut b = gpu.batch();
    b.rms_norm(&x, &nw, &normed, dim, 1e-5).unwrap();
    b.matmul(&w, &normed, &h, 1).unwrap();
    b.scale(&h, &out, 0.5).unwrap();
    assert_eq!(b.len(), 3);
    b.submit().unwrap();
    let (hv, ov) = (gpu.read_f32(&h).unwrap(), gpu.read_f32(&out).unwrap());
    assert!(hv.iter().zip(&ov).all(|(h, o)| *o == h * 0.5));
}

/// Attention: f32 dot products of ≤ 128 terms, exp, and sums of ≤ 301
/// probabilities and weighted values: ≈ 1e-7 relative in practice; the bound
/// leaves two orders of magnitude.
const ATTN_REL_TOL: f64 = 1e-5;

/// The CPU model's attention in f64: causal, optional sliding window, GQA.
fn attention_reference(q: &[f32], k: &[f32], v: &[f32], a: &Attention) -> Vec<f64> {
    let (hd, kvd) = (a.head_dim, a.n_kv_head * a.head_dim);
    let group = a.n_head / a.n_kv_head;
    let mut out = vec![0f64; a.n_tokens * a.n_head * hd];
    for t in 0..a.n_tokens {
        let p = a.pos0 + t;
        let lo = if a.window > 0 {
            (p + 1).saturating_sub(a.window)
        } else {
            0
        };
        for h in 0..a.n_head {
            let qh = &q[(t * a.n_head + h) * hd..][..hd];
            let kvh = h / group;
            let s: Vec<f64> = (lo..=p)
                .map(|j| {
                    let kj = &k[j * kvd + kvh * hd..][..hd];
                    qh.iter()
                        .zip(kj)
                        .map(|(&x, &y)| x as f64 * y as f64)
                        .sum::<f64>()
                        * a.scale as f64
                })
                .collect();
            let m = s.iter().cloned().fold(f64::MIN, f64::max);
            let e: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
            let sum: f64 = e.iter().sum();
            let o = &mut out[(t * a.n_head + h) * hd..][..hd];
            for (j, w) in (lo..=p).zip(&e) {
                let vj = &v[j * kvd + kvh * hd..][..hd];
                for (o, &x) in o.iter_mut().zip(vj) {
                    *o += w / sum * x as f64;
                }
            }
        }
    }
    out
}

#[test]
fn attention_matches_reference() {
    let (_turn, gpu) = common::gpu();
    let mut rng = Rng::new(17);
    // Prefill with GQA and a window; decode with a long cache (more cache
    // positions than a chunk: partials joined by the second pass), also
    // with a window that starts inside a chunk; a prompt across a chunk
    // boundary (tokens with one chunk and with two in one step).
    let cases = [
        (3, 5, 4, 2, 64, 0),
        (3, 5, 4, 2, 64, 4),
        (1, 300, 2, 1, 128, 0),
        (1, 900, 4, 2, 64, 333),
        (12, 250, 6, 3, 80, 0),
        (6, 0, 2, 2, 32, 0),
        // Enough tokens that a workgroup serves several heads of a group
        // (gemma3's head_dim 256, four heads on one KV head).
        (20, 3, 8, 2, 64, 0),
        (20, 3, 4, 1, 256, 5),
    ];
    for (n_tokens, pos0, n_head, n_kv_head, head_dim, window) in cases {
        let a = Attention {
            n_tokens,
            n_head,
            n_kv_head,
            head_dim,
            pos0,
            window,
            scale: 1.0 / (head_dim as f32).sqrt(),
            kv: KvElem::F32,
            ring: 0,
        };
        let kv_len = pos0 + n_tokens;
        let q: Vec<f32> = rng
            .vec(n_tokens * n_head * head_dim)
            .iter()
            .map(|v| v * 4.0)
            .collect();
        let k = rng.vec(kv_len * n_kv_head * head_dim);
        let v = rng.vec(kv_len * n_kv_head * head_dim);
        let [qt, kt, vt, scores] = attention_buffers(gpu, &a, &q, &k, &v);
        let got = run(gpu, q.len(), |b, y| {
            b.attention(&qt, &kt, &vt, &scores, y, &a).unwrap()
        });
        check(
            &format!("attention {a:?}"),
            &got,
            &attention_reference(&q, &k, &v, &a),
            ATTN_REL_TOL,
        );
    }
}

/// Over f16 caches, attention gives the bits it gives over f32 caches
/// holding the same (rounded) values: the kernel widens each load exactly.
#[test]
fn attention_over_f16_caches_equals_f32_caches_of_the_rounded_values() {
    let (_turn, gpu) = common::gpu();
    if !gpu.has_f16() {
        eprintln!("skipped: the device has no SHADER_F16");
        return;
    }
    let mut rng = Rng::new(23);
    for (n_tokens, pos0, n_head, n_kv_head, head_dim, window) in [
        (3, 5, 4, 2, 64, 0),
        (1, 300, 9, 3, 64, 0),
        (20, 3, 4, 1, 256, 5),
    ] {
        let a = Attention {
            n_tokens,
            n_head,
            n_kv_head,
            head_dim,
            pos0,
            window,
            scale: 1.0 / (head_dim as f32).sqrt(),
            kv: KvElem::F32,
            ring: 0,
        };
        let kv_len = pos0 + n_tokens;
        let q = rng.vec(n_tokens * n_head * head_dim);
        let round = |x: Vec<f32>| -> Vec<f32> {
            x.iter()
                .map(|&v| half::f16::from_f32(v * 3.0).to_f32())
                .collect()
        };
        let k = round(rng.vec(kv_len * n_kv_head * head_dim));
        let v = round(rng.vec(kv_len * n_kv_head * head_dim));
        let [qt, kt, vt, scores] = attention_buffers(gpu, &a, &q, &k, &v);
        let want = run(gpu, q.len(), |b, y| {
            b.attention(&qt, &kt, &vt, &scores, y, &a).unwrap()
        });
        let pack = |x: &[f32]| -> Tensor {
            let words: Vec<u32> = x
                .chunks(2)
                .map(|p| {
                    let lo = half::f16::from_f32(p[0]).to_bits() as u32;
                    let hi = p
                        .get(1)
                        .map_or(0, |&h| half::f16::from_f32(h).to_bits() as u32);
                    lo | hi << 16
                })
                .collect();
            gpu.upload_u32(&words).unwrap()
        };
        let (kh, vh) = (pack(&k), pack(&v));
        let a16 = Attention {
            kv: KvElem::F16,
            ..a
        };
        let got = run(gpu, q.len(), |b, y| {
            b.attention(&qt, &kh, &vh, &scores, y, &a16).unwrap()
        });
        let diff = (0..q.len())
            .filter(|&i| got[i].to_bits() != want[i].to_bits())
            .count();
        assert_eq!(diff, 0, "{a16:?}: {diff} of {} outputs differ", q.len());
        // And an f32 attention call over the f16 buffers is refused by size
        // when they are too small for f32 rows, never read out of bounds.
        if kv_len > 1 {
            let err = gpu
                .batch()
                .attention(&qt, &kh, &vh, &scores, &qt, &a)
                .unwrap_err();
            assert!(err.to_string().contains("caches of"), "{err}");
        }
    }
}

/// A sliding-window layer's ring cache (position p in row p mod ring,
/// only the last `ring` positions kept) gives the bits of a cache of every
/// position, for tokens whose windows and step fit the ring, with f32 and
/// (where the device has it) f16 caches.
#[test]
fn attention_over_a_ring_equals_attention_over_every_position() {
    use lamina_gpu::{TokenRow, TokenTable};
    let (_turn, gpu) = common::gpu();
    let mut rng = Rng::new(29);
    let (n_head, n_kv_head, hd) = (4, 1, 64);
    let kvd = n_kv_head * hd;
    // Window 40, ring 64: a step of up to 25 tokens; the ring wraps
    // inside the step and inside a 256-position chunk.
    for (pos0, n_tokens, window, ring) in [(100, 20, 40, 64), (7, 3, 40, 64), (250, 1, 512, 1024)] {
        let kv_len = pos0 + n_tokens;
        let q = rng.vec(n_tokens * n_head * hd);
        let (k, v) = (rng.vec(kv_len * kvd), rng.vec(kv_len * kvd));
        let full = Attention {
            n_tokens,
            n_head,
            n_kv_head,
            head_dim: hd,
            pos0,
            window,
            scale: 0.125,
            kv: KvElem::F32,
            ring: 0,
        };
        let [qt, kt, vt, scores] = attention_buffers(gpu, &full, &q, &k, &v);
        let want = run(gpu, q.len(), |b, y| {
            b.attention(&qt, &kt, &vt, &scores, y, &full).unwrap()
        });
        // The ring: the last `ring` positions at rows p mod ring.
        let (mut kr, mut vr) = (vec![f32::NAN; ring * kvd], vec![f32::NAN; ring * kvd]);
        for p in kv_len.saturating_sub(ring)..kv_len {
            let (src, dst) = (p * kvd..(p + 1) * kvd, p % ring * kvd..(p % ring + 1) * kvd);
            kr[dst.clone()].copy_from_slice(&k[src.clone()]);
            vr[dst].copy_from_slice(&v[src]);
        }
        let host: Vec<TokenRow> = (pos0..kv_len)
            .map(|p| TokenRow {
                row: (p % ring) as u32,
                pos: p as u32,
            })
            .collect();
        let flat: Vec<u32> = host.iter().flat_map(|e| [e.row, e.pos]).collect();
        let tab = gpu.upload_u32(&flat).unwrap();
        let table = TokenTable {
            host: &host,
            gpu: &tab,
        };
        let a = Attention { ring, ..full };
        let (krt, vrt) = (gpu.upload_f32(&kr).unwrap(), gpu.upload_f32(&vr).unwrap());
        let got = run(gpu, q.len(), |b, y| {
            b.attention_rows(&qt, &krt, &vrt, &scores, y, &a, table, 0)
                .unwrap()
        });
        let diff = (0..q.len())
            .filter(|&i| got[i].to_bits() != want[i].to_bits())
            .count();
        assert_eq!(diff, 0, "{a:?}: {diff} of {} outputs differ", q.len());
        // A ring smaller than the window is refused.
        let small = Attention {
            ring: window - 1,
            ..full
        };
        assert!(gpu
            .batch()
            .attention_rows(&qt, &krt, &vrt, &scores, &scores, &small, table, 0)
            .is_err());
    }
}

/// The query, key and value tensors of `a` on the GPU, and its (poisoned)
/// chunk partials.
fn attention_buffers(gpu: &Gpu, a: &Attention, q: &[f32], k: &[f32], v: &[f32]) -> [Tensor; 4] {
    let kv_len = a.pos0 + a.n_tokens;
    [
        gpu.upload_f32(q).unwrap(),
        gpu.upload_f32(k).unwrap(),
        gpu.upload_f32(v).unwrap(),
        common::poisoned(
            gpu,
            attention_scratch_len(a.n_tokens, a.n_head, a.head_dim, kv_len),
        ),
    ]
}

/// A token's attention has the same bits whether its step holds one token
/// (one head per workgroup) or twenty (a workgroup serves four heads), also
/// when its positions span several chunks and others' do not.
#[test]
fn attention_is_the_same_for_a_token_alone_and_in_a_batch() {
    let (_turn, gpu) = common::gpu();
    let mut rng = Rng::new(19);
    for (n_tokens, pos0, window) in [(20, 3, 0), (20, 245, 0), (9, 500, 300)] {
        let (n_head, n_kv_head, head_dim) = (8, 2, 64);
        let a = Attention {
            n_tokens,
            n_head,
            n_kv_head,
            head_dim,
            pos0,
            window,
            scale: 0.125,
            kv: KvElem::F32,
            ring: 0,
        };
        let kv_len = pos0 + n_tokens;
        let q = rng.vec(n_tokens * n_head * head_dim);
        let (k, v) = (
            rng.vec(kv_len * n_kv_head * head_dim),
            rng.vec(kv_len * n_kv_head * head_dim),
        );
        let [qt, kt, vt, scores] = attention_buffers(gpu, &a, &q, &k, &v);
        let batch = run(gpu, q.len(), |b, y| {
            b.attention(&qt, &kt, &vt, &scores, y, &a).unwrap()
        });
        let alone = run(gpu, q.len(), |b, y| {
            for t in 0..n_tokens {
                let one = Attention {
                    n_tokens: 1,
                    pos0: pos0 + t,
                    ..a
                };
                b.attention_at(&qt, &kt, &vt, &scores, y, &one, t).unwrap();
            }
        });
        let diff = (0..q.len())
            .filter(|&i| batch[i].to_bits() != alone[i].to_bits())
            .count();
        assert_eq!(diff, 0, "{a:?}: {diff} of {} outputs differ", q.len());
    }
}

#[test]
fn bias_rows_and_copies() {
    let (_turn, gpu) = common::gpu();
    let mut rng = Rng::new(18);
    let (rows, dim) = (5, 300);
    let (x, bias) = (rng.vec(rows * dim), rng.vec(dim));
    let (xt, bt) = (gpu.upload_f32(&x).unwrap(), gpu.upload_f32(&bias).unwrap());
    let got = run(gpu, x.len(), |b, y| b.add_rows(&xt, &bt, y, dim).unwrap());
    assert!(got
        .iter()
        .enumerate()
        .all(|(i, g)| *g == x[i] + bias[i % dim]));
    // A slice of x into the middle of a poisoned buffer; the rest untouched.
    let got = run(gpu, 1000, |b, y| b.copy(&xt, 17, y, 400, 333).unwrap());
    for (i, g) in got.iter().enumerate() {
        if (400..733).contains(&i) {
            assert_eq!(g.to_bits(), x[i - 400 + 17].to_bits());
        } else {
            assert!(g.is_nan(), "element {i} written");
        }
    }
    let y = gpu.tensor(10).unwrap();
    assert!(gpu.batch().copy(&xt, 0, &y, 5, 6).is_err());
}

/// A prompt's attention (on a CPU-backed device, 64 tokens or more or a
/// short cache: the kernel with its tokens across the lanes,
/// shaders/attention_lanes.wgsl)
/// gives every token the bits it gets alone (attention.wgsl, its lanes the
/// positions): head sizes 32 to 128, grouped heads, windows, tokens with one
/// chunk and with several in one step, steps that interleave two sequences
/// (subgroups whose lanes read different rows), and f16 caches.
#[test]
fn a_prompts_attention_equals_each_token_alone() {
    use lamina_gpu::{TokenRow, TokenTable};
    let (_turn, gpu) = common::gpu();
    if !gpu.attn_lanes() {
        eprintln!("note: this device runs attention.wgsl for prompts too");
    }
    let mut rng = Rng::new(31);
    // (head_dim, n_head, n_kv_head, window, f16, [(first position, tokens)]
    // of each sequence, in the order their tokens sit in the step).
    type Case = (usize, usize, usize, usize, bool, &'static [(usize, usize)]);
    let cases: [Case; 7] = [
        (64, 9, 3, 0, false, &[(0, 40)]),
        (64, 4, 2, 0, true, &[(230, 70)]),
        (32, 2, 1, 100, false, &[(280, 64)]),
        (96, 3, 3, 0, false, &[(5, 16)]),
        (128, 4, 1, 0, true, &[(0, 10), (3, 12), (13, 9)]),
        (64, 6, 2, 0, false, &[(250, 11), (0, 60)]),
        // A few tokens deep in the cache: attention.wgsl's grid.
        (64, 3, 1, 0, false, &[(400, 20)]),
    ];
    for (hd, n_head, n_kv_head, window, f16, seqs) in cases {
        if f16 && !gpu.has_f16() {
            continue;
        }
        let kvd = n_kv_head * hd;
        // Each sequence's rows: its own stretch of the caches, room for 600
        // positions.
        let span = 600;
        let mut host = Vec::new();
        for (s, &(first, n)) in seqs.iter().enumerate() {
            for p in first..first + n {
                host.push(TokenRow {
                    row: (s * span + p) as u32,
                    pos: p as u32,
                });
            }
        }
        let n_tokens = host.len();
        let kv_len = seqs.iter().map(|&(f, n)| f + n).max().unwrap_or(0);
        let rows = seqs.len() * span;
        let scale = 1.0 / (hd as f32).sqrt();
        let q: Vec<f32> = rng
            .vec(n_tokens * n_head * hd)
            .iter()
            .map(|v| v * 4.0)
            .collect();
        let round = |x: Vec<f32>| -> Vec<f32> {
            x.iter().map(|&v| half::f16::from_f32(v).to_f32()).collect()
        };
        let (k, v) = (round(rng.vec(rows * kvd)), round(rng.vec(rows * kvd)));
        let kv = if f16 { KvElem::F16 } else { KvElem::F32 };
        let caches = |x: &[f32]| -> Tensor {
            if !f16 {
                return gpu.upload_f32(x).unwrap();
            }
            let words: Vec<u32> = x
                .chunks(2)
                .map(|p| {
                    let lo = half::f16::from_f32(p[0]).to_bits() as u32;
                    lo | (half::f16::from_f32(p[1]).to_bits() as u32) << 16
                })
                .collect();
            gpu.upload_u32(&words).unwrap()
        };
        let (kt, vt) = (caches(&k), caches(&v));
        let qt = gpu.upload_f32(&q).unwrap();
        let flat: Vec<u32> = host.iter().flat_map(|e| [e.row, e.pos]).collect();
        let tab = gpu.upload_u32(&flat).unwrap();
        let table = TokenTable {
            host: &host,
            gpu: &tab,
        };
        let scores = common::poisoned(gpu, attention_scratch_len(n_tokens, n_head, hd, kv_len));
        let a = Attention {
            n_tokens,
            n_head,
            n_kv_head,
            head_dim: hd,
            pos0: 0,
            window,
            scale,
            kv,
            ring: 0,
        };
        let step = run(gpu, q.len(), |b, y| {
            b.attention_rows(&qt, &kt, &vt, &scores, y, &a, table, 0)
                .unwrap()
        });
        let alone = run(gpu, q.len(), |b, y| {
            for t in 0..n_tokens {
                let one = Attention { n_tokens: 1, ..a };
                b.attention_rows(&qt, &kt, &vt, &scores, y, &one, table, t)
                    .unwrap();
            }
        });
        let what =
            format!("head {hd}, {n_head}/{n_kv_head} heads, window {window}, f16 {f16}, {seqs:?}");
        assert!(
            alone.iter().all(|x| x.is_finite()),
            "{what}: unwritten outputs"
        );
        let diff = (0..q.len())
            .filter(|&i| step[i].to_bits() != alone[i].to_bits())
            .count();
        assert_eq!(diff, 0, "{what}: {diff} of {} outputs differ", q.len());
    }
}
