//! Each row's argmax on the GPU against lamina_sampling's, the function
//! greedy decoding samples with: the same index on rows full of ties,
//! NaN, infinities, signed zeros and subnormals, across one and two stages.

use lamina_gpu::{argmax_scratch_len, ARGMAX_MAX_LEN, ARGMAX_NONE};

use crate::common::{self, Rng};

/// Values on a coarse grid, so that the maximum is shared by many indices.
fn tied_row(rng: &mut Rng, len: usize) -> Vec<f32> {
    (0..len)
        .map(|_| (rng.signed() * 16.0).round() / 4.0)
        .collect()
}

/// The rows a case tests, by kind; `len` values each.
fn row(rng: &mut Rng, kind: usize, len: usize) -> Vec<f32> {
    let mut v = tied_row(rng, len);
    match kind {
        // The maximum, twice, in two far chunks: the second stage must
        // keep the lower index.
        0 => {
            let (a, b) = (len * 3 / 4, len / 3);
            v[a] = 9.0;
            v[b] = 9.0;
        }
        // NaN everywhere it could win, and a NaN at index 0.
        1 => {
            for x in v.iter_mut().step_by(7) {
                *x = f32::NAN;
            }
            v[0] = f32::NAN;
        }
        // -0 before +0 as the maximum: equal, so the first wins.
        2 => {
            v.iter_mut().for_each(|x| *x = -x.abs() - 1.0);
            v[len / 2] = -0.0;
            v[len - 1] = 0.0;
        }
        // Subnormals only: a device that flushes them to zero in a float
        // compare would see all of them tied.
        3 => {
            for (i, x) in v.iter_mut().enumerate() {
                *x = f32::from_bits(1 + ((i as u32).wrapping_mul(2_654_435_761) % 1000));
            }
        }
        // All -inf: index 0, as the host's.
        4 => v.iter_mut().for_each(|x| *x = f32::NEG_INFINITY),
        // +inf twice beside NaN.
        5 => {
            v[len / 5] = f32::INFINITY;
            v[len - 1] = f32::INFINITY;
            if len > 1 {
                v[1] = f32::NAN;
            }
        }
        // Only NaN: no index.
        6 => v.iter_mut().for_each(|x| *x = f32::NAN),
        _ => {}
    }
    v
}

#[test]
fn argmax_rows_picks_the_hosts_index() {
    let (_turn, gpu) = common::gpu();
    let mut rng = Rng::new(91);
    // (rows, len, stride): one workgroup per row, two stages, a row just
    // past one chunk, strided rows with other values between them, and
    // Gemma 3's vocabulary.
    for (rows, len, stride) in [
        (8, 4096, 4096),
        (8, 4097, 5000),
        (8, 1, 3),
        (8, 49152, 49152),
        (3, 262_144, 262_144),
    ] {
        let mut x = vec![123.0f32; stride * (rows - 1) + len];
        let mut want = Vec::new();
        for r in 0..rows {
            let v = row(&mut rng, r % 8, len);
            x[r * stride..r * stride + len].copy_from_slice(&v);
            want.push(if v.iter().all(|x| x.is_nan()) {
                ARGMAX_NONE
            } else {
                lamina_sampling::argmax(&v)
            });
        }
        let xt = gpu.upload_f32(&x).unwrap();
        let scratch = gpu.tensor(argmax_scratch_len(rows, len).max(1)).unwrap();
        let out = gpu.tensor(2 * rows).unwrap();
        let mut b = gpu.batch();
        b.argmax_rows(&xt, rows, len, stride, &scratch, &out)
            .unwrap();
        b.submit().unwrap();
        let got = gpu.read_u32(&out).unwrap();
        let idx: Vec<u32> = got.chunks(2).map(|p| p[1]).collect();
        assert_eq!(idx, want, "{rows} rows of {len}, stride {stride}");
    }
}

#[test]
fn argmax_rows_refuses_what_does_not_fit() {
    let (_turn, gpu) = common::gpu();
    let x = gpu.tensor(64).unwrap();
    let scratch = gpu.tensor(1).unwrap();
    let out = gpu.tensor(4).unwrap();
    let mut b = gpu.batch();
    // Rows past the end of x; too little room for the pairs; an empty row;
    // a row longer than two stages reduce.
    for (rows, len, stride, out) in [
        (2, 40, 40, &out),
        (3, 8, 8, &out),
        (1, 0, 0, &out),
        (1, ARGMAX_MAX_LEN + 1, 0, &out),
    ] {
        let err = b
            .argmax_rows(&x, rows, len, stride, &scratch, out)
            .unwrap_err();
        assert!(err.to_string().contains("argmax"), "{err}");
    }
    // Two stages need scratch for the first one's pairs, and then run.
    let long = gpu.tensor(5000).unwrap();
    let err = b
        .argmax_rows(&long, 1, 5000, 5000, &scratch, &out)
        .unwrap_err();
    assert!(err.to_string().contains("argmax"), "{err}");
    let room = gpu.tensor(argmax_scratch_len(1, 5000)).unwrap();
    b.argmax_rows(&long, 1, 5000, 5000, &room, &out).unwrap();
}
