//! The fused kernels give the bits of the unfused chains they replace, on
//! random data: residual add + RMSNorm (with and without a branch
//! post-norm), the gated activation over a stacked gate/up product,
//! per-head norms and RoPE + cache writes over a stacked QKV product, the
//! mat-vec's GLU epilogue, and a stacked weight upload.

use super::common;

use common::Rng;
use lamina_gguf::GgmlType;
use lamina_gpu::{Columns, Gate, Gpu, KvElem, QkvLayout, Rope, Tensor};

fn bits(gpu: &Gpu, t: &Tensor) -> Vec<u32> {
    gpu.read_u32(t).unwrap()
}

fn same(what: &str, got: &[u32], want: &[u32]) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    let diff = got.iter().zip(want).filter(|(a, b)| a != b).count();
    assert_eq!(diff, 0, "{what}: {diff} of {} values differ", want.len());
}

#[test]
fn add_rms_norm_equals_add_then_norm() {
    let (_turn, gpu) = common::gpu();
    let mut rng = Rng::new(0xadd);
    // 640 (gemma3) is more than one pass of 256 invocations; 3 rows.
    for (dim, rows) in [(640, 3), (64, 5)] {
        let n = dim * rows;
        let a = gpu.upload_f32(&rng.vec(n)).unwrap();
        let b = gpu.upload_f32(&rng.vec(n)).unwrap();
        let w = gpu.upload_f32(&rng.vec(dim)).unwrap();
        let pw = gpu.upload_f32(&rng.vec(dim)).unwrap();
        for pre in [None, Some(&pw)] {
            let (s1, y1, tmp) = (
                common::poisoned(gpu, n),
                common::poisoned(gpu, n),
                common::poisoned(gpu, n),
            );
            let mut batch = gpu.batch();
            let branch = match pre {
                Some(p) => {
                    batch.rms_norm(&b, p, &tmp, dim, 1e-6).unwrap();
                    &tmp
                }
                None => &b,
            };
            batch.add(&a, branch, &s1).unwrap();
            batch.rms_norm(&s1, &w, &y1, dim, 1e-6).unwrap();
            batch.submit().unwrap();
            let (s2, y2) = (common::poisoned(gpu, n), common::poisoned(gpu, n));
            let mut batch = gpu.batch();
            batch
                .add_rms_norm(&a, &b, pre, &w, &s2, &y2, dim, 1e-6)
                .unwrap();
            batch.submit().unwrap();
            let what = format!("dim {dim}, post-norm {}", pre.is_some());
            same(&format!("{what}: sum"), &bits(gpu, &s2), &bits(gpu, &s1));
            same(&format!("{what}: norm"), &bits(gpu, &y2), &bits(gpu, &y1));
        }
    }
}

#[test]
fn stacked_gate_equals_the_separate_one() {
    let (_turn, gpu) = common::gpu();
    let mut rng = Rng::new(0x61);
    let (ff, tokens) = (300, 3);
    let g: Vec<f32> = (0..ff * tokens).map(|_| rng.signed() * 8.0).collect();
    let u = rng.vec(ff * tokens);
    let mut gu = Vec::new();
    for t in 0..tokens {
        gu.extend_from_slice(&g[t * ff..(t + 1) * ff]);
        gu.extend_from_slice(&u[t * ff..(t + 1) * ff]);
    }
    let (gt, ut, gut) = (
        gpu.upload_f32(&g).unwrap(),
        gpu.upload_f32(&u).unwrap(),
        gpu.upload_f32(&gu).unwrap(),
    );
    for gate in [Gate::Silu, Gate::GeluTanh] {
        let (y1, y2) = (
            common::poisoned(gpu, ff * tokens),
            common::poisoned(gpu, ff * tokens),
        );
        let mut b = gpu.batch();
        match gate {
            Gate::Silu => b.silu_mul(&gt, &ut, &y1).unwrap(),
            Gate::GeluTanh => b.gelu_mul(&gt, &ut, &y1).unwrap(),
        }
        b.glu_stacked(&gut, &y2, ff, gate).unwrap();
        b.submit().unwrap();
        same(&format!("{gate:?}"), &bits(gpu, &y2), &bits(gpu, &y1));
    }
}

/// The mat-vec with the activation in its epilogue gives the bits of the
/// product followed by the stacked activation, for every thread shape, at
/// 1 to 8 columns, for a float, a legacy and a K-quant type; past eight
/// columns `matmul_glu` takes the unfused path on a GPU and the fused one in
/// chunks of eight on a CPU-backed device, which must agree too.
#[test]
fn glu_epilogue_equals_product_then_activation() {
    use lamina_gpu::{MatmulKernel, MatvecShape};
    let (_turn, gpu) = common::gpu();
    let mut rng = Rng::new(0x91e);
    // ff = 200 is not a multiple of any workgroup's rows.
    for (ty, ff, k) in [
        (GgmlType::F32, 200, 96),
        (GgmlType::Q4_1, 200, 576),
        (GgmlType::Q4K, 72, 512),
    ] {
        let data = common::random_weight(&mut rng, ty, 2 * ff, k);
        let w = gpu.upload_weight(ty, 2 * ff, k, &data).unwrap();
        for n in [1, 3, 11] {
            let x = gpu.upload_f32(&rng.vec(n * k)).unwrap();
            for gate in [Gate::Silu, Gate::GeluTanh] {
                let gu = common::poisoned(gpu, n * 2 * ff);
                let want = common::poisoned(gpu, n * ff);
                let mut b = gpu.batch();
                b.matmul_with(MatmulKernel::MatVec, &w, &x, &gu, n).unwrap();
                b.glu_stacked(&gu, &want, ff, gate).unwrap();
                b.submit().unwrap();
                let want = bits(gpu, &want);
                // Every shape with one activation, the default with the other
                // (each variant is a shader compile: this keeps the test short).
                let shapes: Vec<Option<MatvecShape>> = match gate {
                    Gate::Silu => MatvecShape::CANDIDATES.map(Some).into_iter().collect(),
                    Gate::GeluTanh => vec![None],
                };
                for shape in shapes {
                    let (gu2, y) = (
                        common::poisoned(gpu, n * 2 * ff),
                        common::poisoned(gpu, n * ff),
                    );
                    let mut b = gpu.batch();
                    b.matmul_glu_shaped(shape, &w, &x, &gu2, &y, n, gate, None)
                        .unwrap();
                    b.submit().unwrap();
                    same(
                        &format!("{ty} ff {ff} n {n} {gate:?} {shape:?}"),
                        &bits(gpu, &y),
                        &want,
                    );
                }
            }
        }
    }
}

/// Head norms and RoPE + cache writes over a stacked QKV product equal
/// rms_norm, rope and copies over separate Q, K and V, for a sequence that
/// starts mid-batch and mid-cache, in both pair orderings and with part of
/// each head left unrotated.
#[test]
fn qkv_epilogue_equals_norms_rope_and_copies() {
    let (_turn, gpu) = common::gpu();
    let mut rng = Rng::new(0x9c7);
    let layout = QkvLayout {
        n_head: 4,
        n_kv_head: 2,
        head_dim: 32,
        kv: KvElem::F32,
    };
    let (hd, qd, kvd) = (32, 4 * 32, 2 * 32);
    let stride = layout.stride();
    let (tokens, first, n, pos0, ctx) = (5, 1, 3, 7, 16);
    let (q, k, v) = (
        rng.vec(tokens * qd),
        rng.vec(tokens * kvd),
        rng.vec(tokens * kvd),
    );
    let mut qkv = Vec::new();
    for t in 0..tokens {
        qkv.extend_from_slice(&q[t * qd..(t + 1) * qd]);
        qkv.extend_from_slice(&k[t * kvd..(t + 1) * kvd]);
        qkv.extend_from_slice(&v[t * kvd..(t + 1) * kvd]);
    }
    let (qt, kt, vt, qkvt) = (
        gpu.upload_f32(&q).unwrap(),
        gpu.upload_f32(&k).unwrap(),
        gpu.upload_f32(&v).unwrap(),
        gpu.upload_f32(&qkv).unwrap(),
    );
    let qn = gpu.upload_f32(&rng.vec(hd)).unwrap();
    let kn = gpu.upload_f32(&rng.vec(hd)).unwrap();
    let cache = rng.vec(ctx * kvd);
    for (neox, n_rot) in [(false, 32), (true, 32), (false, 16), (true, 16)] {
        let rope = |heads| common::rope(hd, n_rot, heads, pos0, neox);
        // Unfused: norms over whole tensors, RoPE of the sequence's tokens,
        // copies into the caches.
        let (q2, k2) = (
            common::poisoned(gpu, tokens * qd),
            common::poisoned(gpu, tokens * kvd),
        );
        let (q3, k3) = (
            common::poisoned(gpu, tokens * qd),
            common::poisoned(gpu, tokens * kvd),
        );
        let (kc1, vc1) = (
            gpu.upload_f32(&cache).unwrap(),
            gpu.upload_f32(&cache).unwrap(),
        );
        let mut b = gpu.batch();
        b.rms_norm(&qt, &qn, &q2, hd, 1e-6).unwrap();
        b.rms_norm(&kt, &kn, &k2, hd, 1e-6).unwrap();
        b.rope_tokens(&q2, &q3, &rope(4), first, n).unwrap();
        b.rope_tokens(&k2, &k3, &rope(2), first, n).unwrap();
        b.copy(&k3, first * kvd, &kc1, pos0 * kvd, n * kvd).unwrap();
        b.copy(&vt, first * kvd, &vc1, pos0 * kvd, n * kvd).unwrap();
        b.submit().unwrap();
        // Fused.
        let normed = common::poisoned(gpu, tokens * stride);
        let qf = common::poisoned(gpu, tokens * qd);
        let (kc2, vc2) = (
            gpu.upload_f32(&cache).unwrap(),
            gpu.upload_f32(&cache).unwrap(),
        );
        let mut b = gpu.batch();
        b.head_norms(&qkvt, &qn, &kn, &normed, &layout, tokens, 1e-6)
            .unwrap();
        b.rope_kv(&normed, &qkvt, &qf, &kc2, &vc2, &layout, &rope(4), first, n)
            .unwrap();
        b.submit().unwrap();
        let what = format!("neox {neox}, n_rot {n_rot}");
        let rows = first * qd..(first + n) * qd;
        same(
            &format!("{what}: queries"),
            &bits(gpu, &qf)[rows.clone()],
            &bits(gpu, &q3)[rows],
        );
        same(
            &format!("{what}: key cache"),
            &bits(gpu, &kc2),
            &bits(gpu, &kc1),
        );
        same(
            &format!("{what}: value cache"),
            &bits(gpu, &vc2),
            &bits(gpu, &vc1),
        );
    }
}

/// A stacked upload holds each part's rows where a separate upload would
/// put them: the product with the stack equals the products with the
/// parts, bit for bit, including parts whose bytes end off a 4-byte
/// boundary (Q8_0 rows of an odd number of 34-byte blocks). A stack split
/// over several buffers is in `split.rs`.
#[test]
fn stacked_weights_equal_their_parts() {
    let (_turn, gpu) = common::gpu();
    let mut rng = Rng::new(0x57ac);
    for (ty, cols, rows) in [
        (GgmlType::Q8_0, 32 * 3, [5usize, 3, 3]),
        (GgmlType::Q4K, 256, [64, 16, 16]),
    ] {
        let datas: Vec<Vec<u8>> = rows
            .iter()
            .map(|&r| common::random_weight(&mut rng, ty, r, cols))
            .collect();
        let parts: Vec<(usize, &[u8])> = rows
            .iter()
            .zip(&datas)
            .map(|(&r, d)| (r, d.as_slice()))
            .collect();
        let stacked = gpu.upload_stacked(ty, cols, &parts).unwrap();
        let total: usize = rows.iter().sum();
        assert_eq!(stacked.rows(), total);
        let x = gpu.upload_f32(&rng.vec(cols * 2)).unwrap();
        let y = common::poisoned(gpu, total * 2);
        let mut b = gpu.batch();
        b.matmul(&stacked, &x, &y, 2).unwrap();
        let mut singles = Vec::new();
        let mut at = 0;
        for (&r, d) in rows.iter().zip(&datas) {
            let w = gpu.upload_weight(ty, r, cols, d).unwrap();
            let ys = common::poisoned(gpu, total * 2);
            b.matmul_strided(
                lamina_gpu::MatmulKernel::Auto,
                &w,
                &x,
                &ys,
                Columns {
                    n: 2,
                    x_offset: 0,
                    x_stride: cols,
                    y_offset: at,
                    y_stride: total,
                },
            )
            .unwrap();
            singles.push((at, r, ys, w));
            at += r;
        }
        b.submit().unwrap();
        let want = bits(gpu, &y);
        for (at, r, ys, _) in &singles {
            let got = bits(gpu, ys);
            for c in 0..2 {
                let span = c * total + at..c * total + at + r;
                same(
                    &format!("{ty} part at row {at}, column {c}"),
                    &got[span.clone()],
                    &want[span],
                );
            }
        }
    }
}

/// The mat-vec's norm prologue gives the bits of rms_norm then the product,
/// and its add epilogue those of the product then add, for every thread
/// shape, at 1 to 8 columns (and 11 where the small-N kernel runs in
/// chunks), with the activations from a uniform window (k a multiple of 4)
/// and from the storage binding (strided columns at an odd offset), for a
/// float, a legacy and a K-quant type; also with the GLU epilogue.
#[test]
fn norm_prologue_and_add_epilogue_equal_the_separate_kernels() {
    use lamina_gpu::{Fuse, MatmulKernel, MatvecShape};
    let (_turn, gpu) = common::gpu();
    let mut rng = Rng::new(0x4e0);
    let eps = 1e-5;
    for (ty, rows, k) in [
        (GgmlType::F32, 70, 96),
        (GgmlType::Q4_1, 130, 576),
        (GgmlType::Q4K, 40, 512),
    ] {
        let data = common::random_weight(&mut rng, ty, rows, k);
        let w = gpu.upload_weight(ty, rows, k, &data).unwrap();
        let nw = gpu.upload_f32(&rng.vec(k)).unwrap();
        // Each (columns, layout) pair compiles its own variants: the whole
        // cross product would take minutes on a software device. Column c
        // at 1 + c * (k + 3) is not a uniform window. Eleven columns are
        // two small-N dispatches on a CPU-backed device; a GPU would run
        // the tiled kernel, which takes no prologue.
        // The float and K-quant types take the two paths' simplest cases.
        let full = ty == GgmlType::Q4_1;
        let mut cases = vec![(1, 0, k), (3, 1, k + 3)];
        if full {
            cases.extend([(1, 1, k + 3), (8, 0, k)]);
            if gpu.adapter_info().device_type == "cpu" {
                cases.push((11, 0, k));
            }
        }
        for (n, x_offset, x_stride) in cases {
            {
                let xs = rng.vec(x_offset + n * x_stride);
                let x = gpu.upload_f32(&xs).unwrap();
                let mut packed = Vec::new();
                for c in 0..n {
                    let at = x_offset + c * x_stride;
                    packed.extend_from_slice(&xs[at..at + k]);
                }
                let xp = gpu.upload_f32(&packed).unwrap();
                let base = rng.vec(n * rows);
                // Separate kernels: norm, product, add.
                let (h, p, want_norm, want_add) = (
                    common::poisoned(gpu, n * k),
                    common::poisoned(gpu, n * rows),
                    common::poisoned(gpu, n * rows),
                    common::poisoned(gpu, n * rows),
                );
                let bt = gpu.upload_f32(&base).unwrap();
                let mut b = gpu.batch();
                b.rms_norm(&xp, &nw, &h, k, eps).unwrap();
                b.matmul_with(MatmulKernel::MatVec, &w, &h, &want_norm, n)
                    .unwrap();
                b.matmul_with(MatmulKernel::MatVec, &w, &xp, &p, n).unwrap();
                b.add(&bt, &p, &want_add).unwrap();
                b.submit().unwrap();
                let (want_norm, want_add) = (bits(gpu, &want_norm), bits(gpu, &want_add));
                let cols = Columns {
                    n,
                    x_offset,
                    x_stride,
                    y_offset: 0,
                    y_stride: rows,
                };
                let kernel = if n == 1 {
                    MatmulKernel::MatVec
                } else {
                    MatmulKernel::Small
                };
                // Every thread shape for the mat-vec from the uniform window;
                // the device's own and a team shape otherwise.
                let shapes: Vec<Option<MatvecShape>> = if full && n == 1 && x_offset == 0 {
                    MatvecShape::CANDIDATES.map(Some).into_iter().collect()
                } else if full {
                    vec![None, Some(MatvecShape::CANDIDATES[2])]
                } else {
                    vec![None]
                };
                for shape in shapes {
                    let what =
                        format!("{ty} {rows}x{k} n {n} x at {x_offset}+{x_stride} {shape:?}");
                    let (normed, added) = (
                        common::poisoned(gpu, n * rows),
                        gpu.upload_f32(&base).unwrap(),
                    );
                    let mut b = gpu.batch();
                    let norm = Fuse {
                        norm: Some((&nw, eps)),
                        ..Fuse::default()
                    };
                    b.matmul_fused_shaped(kernel, shape, &w, &x, &normed, cols, norm)
                        .unwrap();
                    let add = Fuse {
                        add: true,
                        ..Fuse::default()
                    };
                    b.matmul_fused_shaped(kernel, shape, &w, &x, &added, cols, add)
                        .unwrap();
                    b.submit().unwrap();
                    same(&format!("norm {what}"), &bits(gpu, &normed), &want_norm);
                    same(&format!("add {what}"), &bits(gpu, &added), &want_add);
                }
            }
        }
    }
    // The GLU epilogue behind the norm prologue.
    let (ff, k) = (100, 576);
    let data = common::random_weight(&mut rng, GgmlType::Q8_0, 2 * ff, k);
    let w = gpu.upload_weight(GgmlType::Q8_0, 2 * ff, k, &data).unwrap();
    let nw = gpu.upload_f32(&rng.vec(k)).unwrap();
    for n in [1, 5] {
        let x = gpu.upload_f32(&rng.vec(n * k)).unwrap();
        let (h, gu, want, got) = (
            common::poisoned(gpu, n * k),
            common::poisoned(gpu, n * 2 * ff),
            common::poisoned(gpu, n * ff),
            common::poisoned(gpu, n * ff),
        );
        let mut b = gpu.batch();
        b.rms_norm(&x, &nw, &h, k, eps).unwrap();
        b.matmul_glu(&w, &h, &gu, &want, n, Gate::Silu).unwrap();
        b.matmul_glu_normed(&w, &x, &gu, &got, n, Gate::Silu, (&nw, eps))
            .unwrap();
        b.submit().unwrap();
        same(&format!("glu n {n}"), &bits(gpu, &got), &bits(gpu, &want));
    }
}

/// The tiled kernel has no prologue: a fused product it would run is an
/// error, not a silently unnormed result.
#[test]
fn a_fused_product_refuses_the_tiled_kernel() {
    use lamina_gpu::{Fuse, MatmulKernel};
    let (_turn, gpu) = common::gpu();
    let mut rng = Rng::new(0x4e1);
    let (rows, k, n) = (16, 64, 9);
    let data = common::random_weight(&mut rng, GgmlType::Q8_0, rows, k);
    let w = gpu.upload_weight(GgmlType::Q8_0, rows, k, &data).unwrap();
    let nw = gpu.upload_f32(&rng.vec(k)).unwrap();
    let x = gpu.upload_f32(&rng.vec(n * k)).unwrap();
    let y = common::poisoned(gpu, n * rows);
    let mut b = gpu.batch();
    let fuse = Fuse {
        norm: Some((&nw, 1e-5)),
        ..Fuse::default()
    };
    let cols = Columns::packed(n, &w);
    let err = b
        .matmul_fused_shaped(MatmulKernel::Tiled, None, &w, &x, &y, cols, fuse)
        .unwrap_err();
    assert!(err.to_string().contains("tiled"), "{err}");
}

/// The QKV mat-vec's RoPE epilogue gives the bits of the product followed
/// by rope_kv_rows: the rotated queries, and the keys and values in the
/// cache rows the token table names (tokens of two sequences at scattered
/// positions, starting mid-table), in both pair orderings, with part of
/// each head unrotated, at 1, 3 and 8 columns, for every thread shape of
/// the mat-vec, and with the norm prologue in front.
#[test]
fn rope_epilogue_equals_product_then_rope_kv() {
    let (_turn, gpu) = common::gpu();
    // Into f32 caches, and into f16 caches where the device has f16.
    let mut elems = vec![KvElem::F32];
    if gpu.has_f16() {
        elems.push(KvElem::F16);
    }
    for kv in elems {
        rope_epilogue_case(gpu, kv);
    }
}

fn rope_epilogue_case(gpu: &lamina_gpu::Gpu, kv: KvElem) {
    use lamina_gpu::{Fuse, MatmulKernel, MatvecShape, RopeOut, TokenRow, TokenTable};
    let mut rng = Rng::new(0x907e);
    let layout = QkvLayout {
        n_head: 4,
        n_kv_head: 2,
        head_dim: 32,
        kv,
    };
    let (hd, qd, kvd, stride) = (32, 128, 64, layout.stride());
    let (k, ctx) = (96, 40);
    let ty = GgmlType::Q8_0;
    let data = common::random_weight(&mut rng, ty, stride, k);
    let w = gpu.upload_weight(ty, stride, k, &data).unwrap();
    let nw = gpu.upload_f32(&rng.vec(k)).unwrap();
    let cache = rng.vec(ctx * kvd);
    // Entries 0 and 1 belong to no token of the product (it starts at 2);
    // then a sequence in rows 20.. at positions 9.., another in rows 3..
    // at positions 30...
    let mut host = vec![TokenRow { row: 0, pos: 0 }; 2];
    for t in 0..4u32 {
        host.push(TokenRow {
            row: 20 + t,
            pos: 9 + t,
        });
    }
    for t in 0..4u32 {
        host.push(TokenRow {
            row: 3 + t,
            pos: 30 + 7 * t,
        });
    }
    let mut flat: Vec<u32> = host.iter().flat_map(|e| [e.row, e.pos]).collect();
    // Per-pair frequency divisors after the entries, as the model's tables
    // carry a file's `rope_freqs` (Llama 3.x).
    let ff_at = flat.len() as u32;
    let factors: Vec<f32> = (0..16).map(|i| 1.0 + 0.7 * i as f32).collect();
    flat.extend(factors.iter().map(|f| f.to_bits()));
    let tab = gpu.upload_u32(&flat).unwrap();
    let table = TokenTable {
        host: &host,
        gpu: &tab,
    };
    let first = 2;
    for (neox, n_rot, n, scaled) in [
        (false, 32, 1, false),
        (true, 32, 3, false),
        (false, 16, 8, false),
        (true, 16, 1, false),
        (true, 32, 3, true),
        (false, 16, 1, true),
    ] {
        let rope = Rope {
            freq_scale: if scaled { 0.25 } else { 1.0 },
            mscale: if scaled { 1.19 } else { 1.0 },
            factors_at: scaled.then_some(ff_at),
            ..common::rope(hd, n_rot, layout.n_head, 0, neox)
        };
        let x = gpu.upload_f32(&rng.vec(n * k)).unwrap();
        for norm in [false, true] {
            // Unfused: (norm,) product, RoPE + cache writes.
            // rope_kv_rows reads token `first + t` of the product and
            // writes query row `first + t`: the product lands there.
            let (h, qkv, q1) = (
                common::poisoned(gpu, n * k),
                common::poisoned(gpu, (first + n) * stride),
                common::poisoned(gpu, (first + n) * qd),
            );
            let (kc1, vc1) = (
                gpu.upload_f32(&cache).unwrap(),
                gpu.upload_f32(&cache).unwrap(),
            );
            let mut b = gpu.batch();
            let input = if norm {
                b.rms_norm(&x, &nw, &h, k, 1e-5).unwrap();
                &h
            } else {
                &x
            };
            let at = Columns {
                n,
                x_offset: 0,
                x_stride: k,
                y_offset: first * stride,
                y_stride: stride,
            };
            b.matmul_strided(MatmulKernel::MatVec, &w, input, &qkv, at)
                .unwrap();
            b.rope_kv_rows(&qkv, &qkv, &q1, &kc1, &vc1, &layout, &rope, table, first, n)
                .unwrap();
            b.submit().unwrap();
            // The queries against an f64 rotation of the product by
            // scale · (pos · base^(-2i/n_rot) / factor_i), cosine and sine
            // times mscale.
            let (prod, qs) = (gpu.read_f32(&qkv).unwrap(), gpu.read_f32(&q1).unwrap());
            for (t, e) in host.iter().enumerate().skip(first).take(n) {
                let pos = f64::from(e.pos);
                for h in 0..layout.n_head {
                    for (i, &ff) in factors.iter().enumerate().take(hd / 2) {
                        let (a, b) = if neox && 2 * i < n_rot {
                            (i, i + n_rot / 2)
                        } else {
                            (2 * i, 2 * i + 1)
                        };
                        let src = t * stride + h * hd;
                        let (x0, x1) = (f64::from(prod[src + a]), f64::from(prod[src + b]));
                        let (y0, y1) = if 2 * i < n_rot {
                            let mut theta = pos * 10000f64.powf(-2.0 * i as f64 / n_rot as f64);
                            if scaled {
                                theta = theta / f64::from(ff) * 0.25;
                            }
                            let (s, c) = theta.sin_cos();
                            let m = f64::from(rope.mscale);
                            let (s, c) = (s * m, c * m);
                            (x0 * c - x1 * s, x0 * s + x1 * c)
                        } else {
                            (x0, x1)
                        };
                        let dst = t * qd + h * hd;
                        for (got, want) in [(qs[dst + a], y0), (qs[dst + b], y1)] {
                            let err = (f64::from(got) - want).abs();
                            assert!(
                                err <= 1e-4 * (1.0 + x0.abs() + x1.abs()),
                                "{rope:?} token {t} head {h} pair {i}: {got} against {want}"
                            );
                        }
                    }
                }
            }
            let want = [
                bits(gpu, &q1)[first * qd..].to_vec(),
                bits(gpu, &kc1),
                bits(gpu, &vc1),
            ];
            if kv == KvElem::F16 {
                // The f16 caches hold the f32 caches' values, rounded to
                // nearest: the same steps into f32 caches, then compared.
                let f32_layout = QkvLayout {
                    kv: KvElem::F32,
                    ..layout
                };
                let (kr, vr) = (
                    common::poisoned(gpu, ctx * kvd),
                    common::poisoned(gpu, ctx * kvd),
                );
                let q0 = common::poisoned(gpu, (first + n) * qd);
                let mut b = gpu.batch();
                b.rope_kv_rows(
                    &qkv,
                    &qkv,
                    &q0,
                    &kr,
                    &vr,
                    &f32_layout,
                    &rope,
                    table,
                    first,
                    n,
                )
                .unwrap();
                b.submit().unwrap();
                for (half_words, full) in [(&want[1], &kr), (&want[2], &vr)] {
                    let full = gpu.read_f32(full).unwrap();
                    let halves: Vec<u16> = half_words
                        .iter()
                        .flat_map(|w| [*w as u16, (*w >> 16) as u16])
                        .collect();
                    for e in &host[first..first + n] {
                        for i in e.row as usize * kvd..(e.row as usize + 1) * kvd {
                            let want = half::f16::from_f32(full[i]).to_bits();
                            assert_eq!(halves[i], want, "{kv:?} cache value {i}");
                        }
                    }
                }
            }
            let shapes: Vec<Option<MatvecShape>> = if n == 1 && !norm {
                MatvecShape::CANDIDATES.map(Some).into_iter().collect()
            } else {
                vec![None]
            };
            for shape in shapes {
                let q2 = common::poisoned(gpu, n * qd);
                let (kc2, vc2) = (
                    gpu.upload_f32(&cache).unwrap(),
                    gpu.upload_f32(&cache).unwrap(),
                );
                let fuse = Fuse {
                    norm: norm.then_some((&nw, 1e-5)),
                    add: false,
                    rope: Some(RopeOut {
                        k_cache: &kc2,
                        v_cache: &vc2,
                        layout,
                        rope,
                        table,
                        first,
                    }),
                    norm_after: None,
                };
                let cols = Columns {
                    n,
                    x_offset: 0,
                    x_stride: k,
                    y_offset: 0,
                    y_stride: qd,
                };
                let kernel = if n == 1 {
                    MatmulKernel::MatVec
                } else {
                    MatmulKernel::Small
                };
                let mut b = gpu.batch();
                b.matmul_fused_shaped(kernel, shape, &w, &x, &q2, cols, fuse)
                    .unwrap();
                b.submit().unwrap();
                let what = format!("{kv:?} neox {neox} n_rot {n_rot} n {n} norm {norm} {shape:?}");
                same(&format!("{what}: queries"), &bits(gpu, &q2), &want[0]);
                same(&format!("{what}: key cache"), &bits(gpu, &kc2), &want[1]);
                same(&format!("{what}: value cache"), &bits(gpu, &vc2), &want[2]);
            }
        }
    }
}

#[test]
fn norm_epilogue_equals_add_then_add_rms_norm() {
    use lamina_gpu::{Fuse, NormAfter};
    let (_turn, gpu) = common::gpu();
    let mut rng = Rng::new(0x4e1);
    let eps = 1e-6;
    // More rows than one workgroup holds (128 on a CPU-backed device), and
    // row counts that leave the last workgroup part empty.
    for (ty, rows, k) in [
        (GgmlType::Q4_1, 576, 576),
        (GgmlType::Q8_0, 200, 1536),
        (GgmlType::Q4K, 130, 512),
    ] {
        let data = common::random_weight(&mut rng, ty, rows, k);
        let w = gpu.upload_weight(ty, rows, k, &data).unwrap();
        let nw = gpu.upload_f32(&rng.vec(rows)).unwrap();
        let counter = gpu.tensor(1).unwrap();
        for n in [1, 3, 8, 9] {
            let x = gpu.upload_f32(&rng.vec(n * k)).unwrap();
            let base = rng.vec(n * rows);
            let fuse = |out| Fuse {
                add: true,
                norm_after: Some(NormAfter {
                    weight: &nw,
                    eps,
                    out,
                    counter: &counter,
                }),
                ..Fuse::default()
            };
            let cols = Columns::packed(n, &w);
            let (y, out) = (
                gpu.upload_f32(&base).unwrap(),
                common::poisoned(gpu, n * rows),
            );
            let mut b = gpu.batch();
            if !b.norm_epilogue_fuses(&w, n) {
                // A hardware GPU, or too many columns for one dispatch.
                assert!(b.matmul_fused(&w, &x, &y, cols, fuse(&out)).is_err());
                continue;
            }
            // The separate kernels: product, then add + norm.
            let (p, want_sum, want_h) = (
                common::poisoned(gpu, n * rows),
                common::poisoned(gpu, n * rows),
                common::poisoned(gpu, n * rows),
            );
            let bt = gpu.upload_f32(&base).unwrap();
            b.matmul(&w, &x, &p, n).unwrap();
            b.add_rms_norm(&bt, &p, None, &nw, &want_sum, &want_h, rows, eps)
                .unwrap();
            // Twice, back to back: the first must leave the counter zeroed
            // for the second.
            let (y2, out2) = (
                gpu.upload_f32(&base).unwrap(),
                common::poisoned(gpu, n * rows),
            );
            b.matmul_fused(&w, &x, &y, cols, fuse(&out)).unwrap();
            b.matmul_fused(&w, &x, &y2, cols, fuse(&out2)).unwrap();
            b.submit().unwrap();
            let what = format!("{ty} {rows}x{k} n {n}");
            let (want_sum, want_h) = (bits(gpu, &want_sum), bits(gpu, &want_h));
            same(&format!("sum {what}"), &bits(gpu, &y), &want_sum);
            same(&format!("norm {what}"), &bits(gpu, &out), &want_h);
            same(&format!("sum again {what}"), &bits(gpu, &y2), &want_sum);
            same(&format!("norm again {what}"), &bits(gpu, &out2), &want_h);
            assert_eq!(gpu.read_u32(&counter).unwrap()[0], 0, "{what}");
        }
    }
}

/// The routed experts' weighted sum on the GPU: each token's slots summed
/// in slot order from rows packed in another order, with and without a
/// vector already in the output (the shared expert's), against the CPU's
/// f32 sums in that order; rows the route does not name are never read
/// into a token.
#[test]
fn moe_weigh_sums_each_tokens_slots_in_order() {
    let (_turn, gpu) = common::gpu();
    let mut rng = Rng::new(47);
    for (n, k, dim) in [(1, 8, 96), (5, 2, 64), (3, 4, 300)] {
        let rows = n * k;
        let ys = rng.vec(rows * dim);
        // Packed row of (token, slot) i: a rotation of the identity, so no
        // row is where the slot order would put it (when rows > 1).
        let packed: Vec<usize> = (0..rows).map(|i| (i * 7 + 3) % rows).collect();
        let weights: Vec<f32> = (0..rows).map(|_| rng.signed().abs()).collect();
        let shared = rng.vec(n * dim);
        let mut table: Vec<u32> = packed.iter().map(|&r| r as u32).collect();
        table.extend(weights.iter().map(|w| w.to_bits()));
        let yt = gpu.upload_f32(&ys).unwrap();
        let route = gpu.upload_u32(&table).unwrap();
        for add in [false, true] {
            let out = gpu.upload_f32(&shared).unwrap();
            let mut b = gpu.batch();
            b.moe_weigh(&yt, &route, &out, n, k, dim, add).unwrap();
            b.submit().unwrap();
            let got = gpu.read_f32(&out).unwrap();
            for t in 0..n {
                for i in 0..dim {
                    let y = |s: usize| ys[packed[t * k + s] * dim + i];
                    let mut want = y(0) * weights[t * k];
                    for s in 1..k {
                        want += y(s) * weights[t * k + s];
                    }
                    if add {
                        want += shared[t * dim + i];
                    }
                    let g = got[t * dim + i];
                    // One rounding per slot apart at most, where the device
                    // fuses a product into its sum.
                    let tol = 4.0 * f32::EPSILON * (k as f32 + 1.0) * (want.abs() + 1.0);
                    assert!(
                        (g - want).abs() <= tol,
                        "n {n}, k {k}, add {add}: token {t} value {i}: {g} vs {want}"
                    );
                }
            }
        }
        // A route too short for its tokens is refused.
        let short = gpu.upload_u32(&table[..rows]).unwrap();
        let out = gpu.tensor(n * dim).unwrap();
        let err = gpu
            .batch()
            .moe_weigh(&yt, &short, &out, n, k, dim, false)
            .unwrap_err();
        assert!(err.to_string().contains("route"), "{err}");
    }
}
