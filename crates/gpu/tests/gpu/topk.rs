//! Each row's best values on the GPU against a plain sort on the host:
//! the same indices, order and bits on rows full of ties, NaN, infinities,
//! signed zeros and subnormals, across one, two and three stages.

use lamina_gpu::{topk_scratch_len, topk_value, TOPK_MAX, TOPK_NONE};

use crate::common::{self, Rng};

/// The `k` best of `v` by sorting all of them: higher first in total
/// order, ties to the lower index, NaN left out. Written without the
/// sampler's heap, so the two do not share a mistake.
fn reference(v: &[f32], k: usize) -> Vec<(u32, u32)> {
    let mut all: Vec<(u32, f32)> = v
        .iter()
        .enumerate()
        .filter(|(_, x)| !x.is_nan())
        .map(|(i, &x)| (i as u32, x))
        .collect();
    all.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    all.into_iter()
        .take(k)
        .map(|(i, x)| (i, x.to_bits()))
        .collect()
}

/// A row of the given kind: values on a coarse grid (many ties), then a
/// case's special values.
fn row(rng: &mut Rng, kind: usize, len: usize) -> Vec<f32> {
    let mut v: Vec<f32> = (0..len)
        .map(|_| (rng.signed() * 16.0).round() / 4.0)
        .collect();
    match kind {
        // The best values spread over far chunks.
        0 => {
            for (n, i) in (0..len).step_by(len / 7 + 1).enumerate() {
                v[i] = 9.0 + (n % 3) as f32;
            }
        }
        // NaN everywhere, and at index 0.
        1 => {
            for x in v.iter_mut().step_by(3) {
                *x = f32::NAN;
            }
            v[0] = f32::NAN;
        }
        // -0 and +0 at the top: +0 ranks first.
        2 => {
            v.iter_mut().for_each(|x| *x = -x.abs() - 1.0);
            for i in (0..len).step_by(5) {
                v[i] = if i % 2 == 0 { -0.0 } else { 0.0 };
            }
        }
        // Subnormals only.
        3 => {
            for (i, x) in v.iter_mut().enumerate() {
                *x = f32::from_bits(1 + ((i as u32).wrapping_mul(2_654_435_761) % 1000));
            }
        }
        // All -inf but a few: the -inf fill the rest in index order.
        4 => {
            v.iter_mut().for_each(|x| *x = f32::NEG_INFINITY);
            v[len / 2] = 1.0;
        }
        // +inf beside NaN.
        5 => {
            v[len / 5] = f32::INFINITY;
            v[len - 1] = f32::INFINITY;
            if len > 1 {
                v[1] = f32::NAN;
            }
        }
        // Only NaN: no pairs at all.
        6 => v.iter_mut().for_each(|x| *x = f32::NAN),
        // Distinct random values.
        _ => v.iter_mut().for_each(|x| *x = rng.signed() * 30.0),
    }
    v
}

#[test]
fn topk_rows_gives_the_hosts_candidates_in_order() {
    let (_turn, gpu) = common::gpu();
    let mut rng = Rng::new(17);
    // (rows, len, stride, k): one chunk, a row just past one, strided rows
    // with other values between them, fewer values than k, SmolLM2's and
    // Gemma 3's vocabularies (two and three stages), and the largest k.
    for (rows, len, stride, k) in [
        (8, 1024, 1024, 40),
        (8, 1025, 1100, 40),
        (8, 5, 7, 40),
        (8, 49152, 49152, 40),
        (3, 262_144, 262_144, 64),
        (8, 70001, 70001, TOPK_MAX),
        (2, 3000, 3000, 1),
    ] {
        let mut x = vec![55.0f32; stride * (rows - 1) + len];
        let mut want = Vec::new();
        for r in 0..rows {
            let v = row(&mut rng, r % 8, len);
            x[r * stride..r * stride + len].copy_from_slice(&v);
            want.push(reference(&v, k));
        }
        let xt = gpu.upload_f32(&x).unwrap();
        let n = topk_scratch_len(rows, len, k).max(1);
        let (s0, s1) = (gpu.tensor(n).unwrap(), gpu.tensor(n).unwrap());
        let out = gpu.tensor(2 * k * rows).unwrap();
        let mut b = gpu.batch();
        b.topk_rows(&xt, rows, len, stride, k, [&s0, &s1], &out)
            .unwrap();
        b.submit().unwrap();
        let got = gpu.read_u32(&out).unwrap();
        for (r, want) in want.iter().enumerate() {
            let pairs = &got[r * 2 * k..(r + 1) * 2 * k];
            let have: Vec<(u32, u32)> = pairs
                .chunks(2)
                .filter(|p| p[1] != TOPK_NONE)
                .map(|p| (p[1], topk_value(p[0]).to_bits()))
                .collect();
            assert_eq!(&have, want, "row {r} of {rows}, len {len}, k {k}");
            // Empty pairs only after the values.
            let first_empty = pairs.chunks(2).position(|p| p[1] == TOPK_NONE);
            assert_eq!(first_empty.unwrap_or(k), want.len(), "row {r}");
        }
    }
}

#[test]
fn topk_values_round_trip_their_bits() {
    for bits in [
        0u32,
        0x8000_0000,
        1,
        0x8000_0001,
        0x7f80_0000,
        0xff80_0000,
        0x3f80_0000,
        0xbf80_0000,
        0x7f7f_ffff,
    ] {
        let key = if bits & 0x8000_0000 != 0 {
            !bits
        } else {
            bits | 0x8000_0000
        };
        assert_eq!(topk_value(key).to_bits(), bits);
    }
}

#[test]
fn topk_rows_refuses_what_does_not_fit() {
    let (_turn, gpu) = common::gpu();
    let x = gpu.tensor(64).unwrap();
    let s = [gpu.tensor(1).unwrap(), gpu.tensor(1).unwrap()];
    let out = gpu.tensor(2 * 40).unwrap();
    let mut b = gpu.batch();
    // Rows past the end of x; too little room for the pairs; an empty row;
    // k 0 and k past the largest.
    for (rows, len, stride, k) in [
        (2, 40, 40, 4),
        (3, 8, 8, 40),
        (1, 0, 0, 4),
        (1, 8, 8, 0),
        (1, 8, 8, TOPK_MAX + 1),
    ] {
        let err = b
            .topk_rows(&x, rows, len, stride, k, [&s[0], &s[1]], &out)
            .unwrap_err();
        assert!(err.to_string().contains("topk"), "{err}");
    }
    // More than one chunk needs scratch for the stages, and then runs.
    let long = gpu.tensor(5000).unwrap();
    let err = b
        .topk_rows(&long, 1, 5000, 5000, 40, [&s[0], &s[1]], &out)
        .unwrap_err();
    assert!(err.to_string().contains("topk"), "{err}");
    let n = topk_scratch_len(1, 5000, 40);
    let room = [gpu.tensor(n).unwrap(), gpu.tensor(n).unwrap()];
    b.topk_rows(&long, 1, 5000, 5000, 40, [&room[0], &room[1]], &out)
        .unwrap();
}
