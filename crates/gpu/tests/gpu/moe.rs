//! A mixture's experts on the device: the router kernel against the host's
//! routing, and products over runs (each column naming its matrix) against
//! the same products over each matrix alone, bit for bit.

use super::common;

use common::Rng;
use lamina_gguf::GgmlType;
use lamina_gpu::{
    Columns, Gate, MatmulKernel, MatvecShape, MoeRouting, Runs, Tensor, MAX_SMALL_COLS,
    MOE_ROUTE_MAX_EXPERTS,
};

/// The host's routing, written here from its definition (softmax with an
/// f64 sum, probability descending, ties to the lower index, then the
/// weights' sum and scale), independent of the kernel it checks.
fn host_route(r: &MoeRouting, logits: &[f32]) -> Vec<(usize, f32)> {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let e: Vec<f32> = logits.iter().map(|v| (v - max).exp()).collect();
    let inv = (1.0 / e.iter().map(|&v| f64::from(v)).sum::<f64>()) as f32;
    let p: Vec<f32> = e.iter().map(|v| v * inv).collect();
    let mut order: Vec<usize> = (0..p.len()).collect();
    order.sort_by(|&a, &b| p[b].total_cmp(&p[a]).then(a.cmp(&b)));
    let mut sel: Vec<(usize, f32)> = order[..r.k].iter().map(|&i| (i, p[i])).collect();
    if r.norm {
        let sum = sel.iter().map(|s| s.1).sum::<f32>().max(6.103_515_6e-5);
        sel.iter_mut().for_each(|s| s.1 /= sum);
    }
    if r.scale != 0.0 && r.scale != 1.0 {
        sel.iter_mut().for_each(|s| s.1 *= r.scale);
    }
    sel
}

#[test]
fn moe_route_chooses_and_weighs_as_the_host() {
    let (_turn, gpu) = common::gpu();
    let mut rng = Rng::new(91);
    for (n, n_expert, k, norm, scale) in [
        (1, 8, 2, false, 1.0),
        (5, 60, 8, true, 1.0),
        (3, 128, 8, true, 2.5),
        (2, 300, 1, false, 0.0),
        (4, 6, 6, true, 1.0),
        (2, MOE_ROUTE_MAX_EXPERTS, 4, false, 1.0),
    ] {
        let r = MoeRouting {
            n_expert,
            k,
            norm,
            scale,
        };
        // Rows two apart with a few spare values between and before them;
        // every third row has exact ties (its values from a handful).
        let (off, stride) = (3, n_expert + 2);
        let mut flat = rng.vec(off + n * stride);
        for t in (0..n).step_by(3) {
            for v in &mut flat[off + t * stride..][..n_expert] {
                *v = (*v * 3.0).round();
            }
        }
        let logits = gpu.upload_f32(&flat).unwrap();
        let out = common::poisoned(gpu, r.words(n));
        let mut b = gpu.batch();
        b.moe_route(&logits, off, stride, n, r, &out).unwrap();
        b.submit().unwrap();
        let got = gpu.read_u32(&out).unwrap();
        let nk = n * k;
        for t in 0..n {
            let want = host_route(&r, &flat[off + t * stride..][..n_expert]);
            for (s, &(id, w)) in want.iter().enumerate() {
                let i = t * k + s;
                let what = format!("{n_expert} experts, k {k}, token {t} slot {s}");
                assert_eq!(got[i], i as u32, "{what}: weigh row");
                let run = &got[r.runs_at(n) + 4 * i..][..4];
                assert_eq!(run, [id as u32, t as u32, i as u32, 1], "{what}: run");
                let down = &got[r.down_runs_at(n) + 4 * i..][..4];
                assert_eq!(down, [id as u32, i as u32, i as u32, 1], "{what}: down run");
                let g = f32::from_bits(got[nk + i]);
                assert!(
                    (g - w).abs() <= 2e-6 * w.abs().max(1e-3),
                    "{what}: weight {g} vs {w}"
                );
            }
        }
    }
    // What the kernel cannot hold, or a table too small, is refused.
    let logits = gpu.tensor(4096).unwrap();
    for (n_expert, k, words) in [(MOE_ROUTE_MAX_EXPERTS + 1, 2, 64), (8, 9, 64), (8, 4, 60)] {
        let r = MoeRouting {
            n_expert,
            k,
            norm: false,
            scale: 1.0,
        };
        let small = gpu.tensor(words).unwrap();
        let err = gpu.batch().moe_route(&logits, 0, n_expert, 2, r, &small);
        assert!(err.is_err(), "{n_expert} experts, k {k}, {words} words");
    }
}

/// Reads `y` after running `f` on a fresh batch.
fn after(
    gpu: &lamina_gpu::Gpu,
    y: &Tensor,
    f: impl FnOnce(&mut lamina_gpu::Batch<'_>),
) -> Vec<u32> {
    let mut b = gpu.batch();
    f(&mut b);
    b.submit().unwrap();
    gpu.read_u32(y).unwrap()
}

#[test]
fn runs_match_each_matrix_alone_bit_for_bit() {
    let (_turn, gpu) = common::gpu();
    let mut rng = Rng::new(93);
    let (n_mats, rows, nx) = (5, 40, 4);
    // A 32-block type, the two K types that walk in unit groups, a float.
    for ty in [GgmlType::Q4_0, GgmlType::Q4K, GgmlType::Q6K, GgmlType::F16] {
        let k = if ty.block_size() == 256 { 512 } else { 96 };
        let mats: Vec<Vec<u8>> = (0..n_mats)
            .map(|_| common::random_weight(&mut rng, ty, rows, k))
            .collect();
        let stacked = gpu
            .upload_weight(ty, n_mats * rows, k, &mats.concat())
            .unwrap();
        let alone: Vec<_> = mats
            .iter()
            .map(|m| gpu.upload_weight(ty, rows, k, m).unwrap())
            .collect();
        let x = rng.vec(nx * k);
        let xt = gpu.upload_f32(&x).unwrap();
        // (matrix, x column) pairs, the way a router lists (token, slot).
        let pairs = [(3, 0), (0, 0), (3, 1), (4, 2), (1, 3), (3, 3), (2, 1)];
        for glu in [None, Some(Gate::Silu)] {
            let out_rows = if glu.is_some() { rows / 2 } else { rows };
            // The products over each matrix alone, column by column.
            let want: Vec<u32> = pairs
                .iter()
                .flat_map(|&(m, c)| {
                    let y = common::poisoned(gpu, out_rows);
                    after(gpu, &y, |b| match glu {
                        Some(g) => {
                            let xc = gpu.upload_f32(&x[c * k..][..k]).unwrap();
                            let gu = gpu.tensor(rows).unwrap();
                            b.matmul_glu(&alone[m], &xc, &gu, &y, 1, g).unwrap();
                        }
                        None => {
                            let cols = Columns {
                                n: 1,
                                x_offset: c * k,
                                x_stride: k,
                                y_offset: 0,
                                y_stride: rows,
                            };
                            b.matmul_strided(MatmulKernel::MatVec, &alone[m], &xt, &y, cols)
                                .unwrap();
                        }
                    })
                })
                .collect();
            // One run per pair, as the router writes them.
            let one: Vec<u32> = pairs
                .iter()
                .enumerate()
                .flat_map(|(i, &(m, c))| [m as u32, c as u32, i as u32, 1])
                .collect();
            // Runs of packed columns, as the host writes them for a prompt:
            // the pairs sorted by matrix, their columns copied in order.
            let mut order: Vec<usize> = (0..pairs.len()).collect();
            order.sort_by_key(|&i| pairs[i].0);
            let packed: Vec<f32> = order
                .iter()
                .flat_map(|&i| x[pairs[i].1 * k..][..k].to_vec())
                .collect();
            let xp = gpu.upload_f32(&packed).unwrap();
            let mut grouped = Vec::new();
            let mut first = 0;
            for r in order.chunk_by(|&a, &b| pairs[a].0 == pairs[b].0) {
                grouped.extend([pairs[r[0]].0 as u32, first, first, r.len() as u32]);
                first += r.len() as u32;
            }
            let ngroups = grouped.len() / 4;
            // Two spare words first: the table is read from an offset.
            let mut table = vec![7u32, 7];
            table.extend(&one);
            table.extend(&grouped);
            let tt = gpu.upload_u32(&table).unwrap();
            // Every thread shape (the device's own is one of them).
            for shape in MatvecShape::CANDIDATES.map(Some) {
                let what = format!("{ty} glu {} shape {shape:?}", glu.is_some());
                let y = common::poisoned(gpu, pairs.len() * out_rows);
                let runs = Runs {
                    table: &tt,
                    at: 2,
                    count: pairs.len(),
                    n_mats,
                    maxc: 1,
                    indirect: None,
                };
                let got = after(gpu, &y, |b| {
                    b.matmul_runs_shaped(shape, &stacked, runs, &xt, k, &y, out_rows, glu)
                        .unwrap()
                });
                assert_eq!(got, want, "{what}: one column a run");
                let runs = Runs {
                    at: 2 + one.len(),
                    count: ngroups,
                    maxc: MAX_SMALL_COLS,
                    ..runs
                };
                let got = after(gpu, &y, |b| {
                    b.matmul_runs_shaped(shape, &stacked, runs, &xp, k, &y, out_rows, glu)
                        .unwrap()
                });
                // Packed outputs back in pair order.
                for (j, &i) in order.iter().enumerate() {
                    assert_eq!(
                        got[j * out_rows..][..out_rows],
                        want[i * out_rows..][..out_rows],
                        "{what}: packed runs, pair {i}"
                    );
                }
            }
        }
    }
}

#[test]
fn runs_refuse_what_does_not_fit() {
    let (_turn, gpu) = common::gpu();
    let mut rng = Rng::new(95);
    let ty = GgmlType::Q8_0;
    let w = gpu
        .upload_weight(ty, 12, 64, &common::random_weight(&mut rng, ty, 12, 64))
        .unwrap();
    let x = gpu.tensor(256).unwrap();
    let y = gpu.tensor(256).unwrap();
    let table = gpu.upload_u32(&[0, 0, 0, 1]).unwrap();
    let runs = Runs {
        table: &table,
        at: 0,
        count: 1,
        n_mats: 3,
        maxc: 1,
        indirect: None,
    };
    let bad = [
        Runs { n_mats: 5, ..runs },
        Runs { n_mats: 0, ..runs },
        Runs { count: 2, ..runs },
        Runs { maxc: 3, ..runs },
    ];
    for r in bad {
        assert!(
            gpu.batch().matmul_runs(&w, r, &x, 64, &y, 4, None).is_err(),
            "{r:?}"
        );
    }
    // A GLU over matrices of an odd row count, and a stride below k.
    let odd = Runs { n_mats: 4, ..runs };
    assert!(gpu
        .batch()
        .matmul_runs(&w, odd, &x, 64, &y, 4, Some(Gate::Silu))
        .is_err());
    assert!(gpu
        .batch()
        .matmul_runs(&w, runs, &x, 32, &y, 4, None)
        .is_err());
    assert!(gpu
        .batch()
        .matmul_runs(&w, runs, &x, 64, &y, 4, None)
        .is_ok());
}

/// A weight of matrices too large for one binding is split between them
/// (`upload_matrices`), one dispatch a binding: every run gets the bits of
/// the same weight in one binding, with packed runs and one-column runs
/// over matrices of every binding, and a run naming no matrix computes
/// nothing. A weight whose bindings split a matrix is refused, as is a
/// matrix larger than a binding.
#[test]
fn runs_over_matrices_split_between_bindings_give_one_bindings_bits() {
    let (_turn, gpu) = common::gpu();
    // Two matrices of about 5 KiB a binding: bindings of 2, 2, 2 and 1.
    const LIMIT: u64 = 12 << 10;
    let small = lamina_gpu::Gpu::new(lamina_gpu::GpuOptions {
        max_storage_buffer_binding_size: Some(LIMIT),
        ..lamina_gpu::GpuOptions::default()
    })
    .unwrap();
    let mut rng = Rng::new(99);
    let (n_mats, rows) = (7, 32);
    for (ty, k) in [(GgmlType::Q8_0, 160), (GgmlType::Q4K, 256)] {
        let data = common::random_weight(&mut rng, ty, n_mats * rows, k);
        let whole = gpu.upload_weight(ty, n_mats * rows, k, &data).unwrap();
        let split = small
            .upload_matrices(ty, k, &[(n_mats * rows, &data[..])], rows)
            .unwrap();
        assert_eq!((whole.chunk_count(), split.chunk_count()), (1, 4), "{ty}");
        let x = rng.vec(8 * k);
        // One-column runs over every binding's matrices, a run of matrix 9
        // (none), then packed runs: matrices 5, 0 (three columns) and 6.
        #[rustfmt::skip]
        let table: Vec<u32> = vec![
            6, 0, 0, 1,  1, 1, 1, 1,  3, 2, 2, 1,  4, 3, 3, 1,
            9, 4, 4, 1,
            5, 0, 0, 2,  0, 2, 2, 3,  6, 5, 5, 1,
        ];
        for glu in [None, Some(Gate::Silu)] {
            let out_rows = if glu.is_some() { rows / 2 } else { rows };
            let run = |g: &lamina_gpu::Gpu, w: &lamina_gpu::Weight| -> Vec<u32> {
                let xt = g.upload_f32(&x).unwrap();
                let tt = g.upload_u32(&table).unwrap();
                let y = common::poisoned(g, 8 * out_rows);
                let mut out = Vec::new();
                for (at, count, maxc) in [(0, 5, 1), (20, 3, MAX_SMALL_COLS)] {
                    let runs = Runs {
                        table: &tt,
                        at,
                        count,
                        n_mats,
                        maxc,
                        indirect: None,
                    };
                    out.extend(after(g, &y, |b| {
                        b.matmul_runs(w, runs, &xt, k, &y, out_rows, glu).unwrap()
                    }));
                }
                out
            };
            let (want, got) = (run(gpu, &whole), run(&small, &split));
            assert_eq!(got, want, "{ty} glu {}", glu.is_some());
            // Column 4 named matrix 9: still the poison.
            let poison = f32::NAN.to_bits();
            assert!(got[4 * out_rows..][..out_rows].iter().all(|&v| v == poison));
            assert!(got[..4 * out_rows].iter().all(|&v| v != poison));
        }
        // Bindings cut between rows, not matrices; a matrix past a binding.
        let cut = small.upload_weight(ty, n_mats * rows, k, &data).unwrap();
        assert!(cut.chunk_count() > 1);
        let (xt, y, tt) = (
            small.upload_f32(&x).unwrap(),
            small.tensor(8 * rows).unwrap(),
            small.upload_u32(&table).unwrap(),
        );
        let runs = Runs {
            table: &tt,
            at: 0,
            count: 5,
            n_mats,
            maxc: 1,
            indirect: None,
        };
        let e = small
            .batch()
            .matmul_runs(&cut, runs, &xt, k, &y, rows, None)
            .unwrap_err();
        assert!(e.to_string().contains("splits a matrix"), "{e}");
        let big = small.upload_matrices(ty, k, &[(n_mats * rows, &data[..])], n_mats * rows);
        assert!(matches!(big, Err(lamina_gpu::GpuError::TooLarge { .. })));
        let odd = small.upload_matrices(ty, k, &[(n_mats * rows, &data[..])], 3 * rows);
        assert!(odd.is_err());
    }
}

/// A step's pairs packed by expert on the device (moe_pack, gather_cols,
/// runs of up to 1, 2 and 8 columns) give the weighed sums of the router's
/// one-column runs bit for bit; the packed rows are a permutation of the
/// pairs, and every run names one expert's columns.
#[test]
fn pairs_packed_on_the_device_give_each_pair_its_bits() {
    let (_turn, gpu) = common::gpu();
    let mut rng = Rng::new(97);
    let ty = GgmlType::Q8_0;
    // Few experts and many tokens: most experts serve several pairs.
    let (n, n_expert, k, e, fe) = (6, 5, 3, 64, 32);
    let r = MoeRouting {
        n_expert,
        k,
        norm: true,
        scale: 1.0,
    };
    let nk = n * k;
    let gate_up = gpu
        .upload_weight(
            ty,
            n_expert * 2 * fe,
            e,
            &common::random_weight(&mut rng, ty, n_expert * 2 * fe, e),
        )
        .unwrap();
    let down = gpu
        .upload_weight(
            ty,
            n_expert * e,
            fe,
            &common::random_weight(&mut rng, ty, n_expert * e, fe),
        )
        .unwrap();
    let h = gpu.upload_f32(&rng.vec(n * e)).unwrap();
    let logits = gpu.upload_f32(&rng.vec(n * n_expert)).unwrap();
    let (ea, ys, xin) = (
        gpu.tensor(nk * fe).unwrap(),
        gpu.tensor(nk * e).unwrap(),
        gpu.tensor(nk * e).unwrap(),
    );
    fn runs(table: &Tensor, at: usize, count: usize, maxc: usize) -> Runs<'_> {
        Runs {
            table,
            at,
            count,
            n_mats: 5,
            maxc,
            indirect: None,
        }
    }
    // The router's one-column runs.
    let route = gpu.tensor(r.words(n)).unwrap();
    let out = common::poisoned(gpu, n * e);
    let want = after(gpu, &out, |b| {
        b.moe_route(&logits, 0, n_expert, n, r, &route).unwrap();
        let up = runs(&route, r.runs_at(n), nk, 1);
        b.matmul_runs(&gate_up, up, &h, e, &ea, fe, Some(Gate::Silu))
            .unwrap();
        let dn = runs(&route, r.down_runs_at(n), nk, 1);
        b.matmul_runs(&down, dn, &ea, fe, &ys, e, None).unwrap();
        b.moe_weigh(&ys, &route, &out, n, k, e, false).unwrap();
    });
    assert!(want.iter().all(|v| !f32::from_bits(*v).is_nan()));
    let args = gpu.tensor(6).unwrap();
    for maxc in [1, 2, MAX_SMALL_COLS] {
        let route = gpu.tensor(r.words(n)).unwrap();
        let out = common::poisoned(gpu, n * e);
        let got = after(gpu, &out, |b| {
            b.moe_route(&logits, 0, n_expert, n, r, &route).unwrap();
            let grids = [
                b.runs_grid(&gate_up, n_expert, true),
                b.runs_grid(&down, n_expert, false),
            ];
            let count = b.moe_pack(&route, &args, n, r, maxc, grids).unwrap();
            assert_eq!(count, r.max_runs(n, maxc));
            b.gather_cols(&h, &route, r.gather_at(n), &xin, nk, e)
                .unwrap();
            let packed = runs(&route, r.runs_at(n), count, maxc);
            let up = Runs {
                indirect: Some((&args, 0)),
                ..packed
            };
            b.matmul_runs(&gate_up, up, &xin, e, &ea, fe, Some(Gate::Silu))
                .unwrap();
            let dn = Runs {
                indirect: Some((&args, 3)),
                ..packed
            };
            b.matmul_runs(&down, dn, &ea, fe, &ys, e, None).unwrap();
            b.moe_weigh(&ys, &route, &out, n, k, e, false).unwrap();
        });
        assert_eq!(got, want, "runs of up to {maxc}");
        let words = gpu.read_u32(&route).unwrap();
        let mut rows: Vec<u32> = words[..nk].to_vec();
        rows.sort_unstable();
        assert_eq!(rows, (0..nk as u32).collect::<Vec<_>>(), "maxc {maxc}");
        // Every packed column's token, and the runs cover the columns once.
        let mut covered = vec![0; nk];
        for run in words[r.runs_at(n)..][..4 * r.max_runs(n, maxc)].chunks(4) {
            assert!(run[3] as usize <= maxc);
            assert_eq!(run[1], run[2]);
            for c in run[1]..run[1] + run[3] {
                covered[c as usize] += 1;
            }
        }
        assert_eq!(covered, vec![1; nk], "maxc {maxc}");
        // The dispatches took the runs that hold columns, no more.
        let a = gpu.read_u32(&args).unwrap();
        let held = words[r.runs_at(n)..][..4 * r.max_runs(n, maxc)]
            .chunks(4)
            .filter(|run| run[3] > 0)
            .count() as u32;
        assert_eq!((a[2], a[5]), (held, held), "maxc {maxc}");
        for (i, &col) in words[..nk].iter().enumerate() {
            assert_eq!(words[r.gather_at(n) + col as usize], (i / k) as u32);
        }
    }
}

/// A shared expert's gated output added on the device: the CPU's
/// `out + sy · sigmoid(h · g)` to a few ulps (the dot product's order is
/// the kernel's), from an offset into the shared outputs; and a gate of
/// the wrong length is refused.
#[test]
fn moe_shared_adds_the_gated_shared_output() {
    let (_turn, gpu) = common::gpu();
    let mut rng = Rng::new(99);
    for (n, dim, off) in [(1, 64, 0), (5, 300, 7), (3, 1024, 3)] {
        let (h, g, sy, out) = (
            rng.vec(n * dim),
            rng.vec(dim),
            rng.vec(off + n * dim),
            rng.vec(n * dim),
        );
        let (ht, gt, syt) = (
            gpu.upload_f32(&h).unwrap(),
            gpu.upload_f32(&g).unwrap(),
            gpu.upload_f32(&sy).unwrap(),
        );
        let ot = gpu.upload_f32(&out).unwrap();
        let mut b = gpu.batch();
        b.moe_shared(&ht, &gt, &syt, off, &ot, n, dim).unwrap();
        b.submit().unwrap();
        let got = gpu.read_f32(&ot).unwrap();
        for t in 0..n {
            let z: f64 = (0..dim)
                .map(|i| f64::from(h[t * dim + i]) * f64::from(g[i]))
                .sum();
            let gate = 1.0 / (1.0 + (-z).exp());
            for i in 0..dim {
                let want = f64::from(out[t * dim + i]) + f64::from(sy[off + t * dim + i]) * gate;
                let e = (f64::from(got[t * dim + i]) - want).abs();
                assert!(
                    e < 1e-5 * (1.0 + want.abs()),
                    "n {n} dim {dim} token {t} value {i}: {e}"
                );
            }
        }
    }
    let t = gpu.tensor(64).unwrap();
    let short = gpu.tensor(32).unwrap();
    let out = gpu.tensor(64).unwrap();
    assert!(gpu
        .batch()
        .moe_shared(&t, &short, &t, 0, &out, 1, 64)
        .is_err());
}
