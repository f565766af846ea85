//! The device: adapter listing, a first kernel, and errors as values.

use super::common;

use lamina_gguf::GgmlType;
use lamina_gpu::buffer::{COPY_PIECE, STAGING_KEPT_BYTES};
use lamina_gpu::{list_adapters, GpuError, WordCopy};

#[test]
fn adapters_are_listed_with_their_limits() {
    let adapters = list_adapters();
    assert!(
        !adapters.is_empty(),
        "no adapter: install mesa-vulkan-drivers"
    );
    for (i, a) in adapters.iter().enumerate() {
        assert_eq!(a.index, i);
        assert!(!a.name.is_empty());
        assert!(a.max_storage_buffer_binding_size > 0);
        let text = a.to_string();
        assert!(
            text.contains(&a.name) && text.contains("max storage binding"),
            "{text}"
        );
        if a.subgroups {
            assert!(a.subgroup_min_size >= 1 && a.subgroup_min_size <= a.subgroup_max_size);
        }
    }
    let (_turn, gpu) = common::gpu();
    let info = gpu.adapter_info();
    assert!(info.compute);
    // The device runs with the adapter's own limits, not wgpu's defaults.
    assert_eq!(
        gpu.limits().max_storage_buffer_binding_size,
        info.max_storage_buffer_binding_size
    );
    eprintln!("{info}");
}

#[test]
fn smoke_a_kernel_doubles_an_array() {
    let (_turn, gpu) = common::gpu();
    let x: Vec<f32> = (0..1000).map(|i| i as f32 - 500.5).collect();
    let xt = gpu.upload_f32(&x).unwrap();
    let y = common::poisoned(gpu, x.len());
    let mut b = gpu.batch();
    b.scale(&xt, &y, 2.0).unwrap();
    b.submit().unwrap();
    let got = gpu.read_f32(&y).unwrap();
    let want: Vec<f32> = x.iter().map(|v| v * 2.0).collect();
    assert_eq!(got, want);
}

#[test]
fn types_without_kernels_are_named() {
    let (_turn, gpu) = common::gpu();
    // ggml's activation types, and Q1_0 and Q2_0, which the CPU does not
    // decode either: every weight type the CPU decodes has a kernel.
    for ty in [
        GgmlType::Q8_1,
        GgmlType::Q8K,
        GgmlType::Q1_0,
        GgmlType::Q2_0,
    ] {
        let bytes = vec![0u8; ty.type_size() as usize];
        let err = gpu
            .upload_weight(ty, 1, ty.block_size() as usize, &bytes)
            .unwrap_err();
        assert!(
            matches!(err, GpuError::NoKernel { ty: t, .. } if t == ty),
            "{err}"
        );
        assert!(err.to_string().contains(ty.name()), "{err}");
    }
}

#[test]
fn bad_shapes_and_oversized_buffers_are_errors() {
    let (_turn, gpu) = common::gpu();
    // Columns that are not whole blocks.
    let err = gpu
        .upload_weight(GgmlType::Q4_0, 2, 48, &[0u8; 54])
        .unwrap_err();
    assert!(matches!(err, GpuError::Shape { .. }), "{err}");
    // Byte count that does not match the shape.
    let err = gpu
        .upload_weight(GgmlType::F32, 2, 4, &[0u8; 31])
        .unwrap_err();
    assert!(matches!(err, GpuError::Shape { .. }), "{err}");
    // A buffer beyond max_buffer_size is an error value, not a panic.
    let too_big = (gpu.limits().max_buffer_size / 4 + 1) as usize;
    let err = gpu.tensor(too_big).unwrap_err();
    assert!(matches!(err, GpuError::TooLarge { .. }), "{err}");
    // Mismatched operands.
    let w = gpu.upload_weight(GgmlType::F32, 3, 4, &[0u8; 48]).unwrap();
    let x = gpu.tensor(4).unwrap();
    let y = gpu.tensor(2).unwrap();
    let err = gpu.batch().matmul(&w, &x, &y, 1).unwrap_err();
    assert!(matches!(err, GpuError::Shape { .. }), "{err}");
    let err = gpu.batch().add(&x, &y, &x).unwrap_err();
    assert!(matches!(err, GpuError::Shape { .. }), "{err}");
    // The device is still healthy.
    let t = gpu.upload_f32(&[3.0]).unwrap();
    assert_eq!(gpu.read_f32(&t).unwrap(), [3.0]);
}

/// A batch's readback is copied in its own submission, after its kernels:
/// the values a kernel just wrote, the range asked for and no more, through
/// readback buffers the device keeps between reads (a smaller read after a
/// larger one gets its own values only), with or without kernels before it.
#[test]
fn a_batch_reads_back_what_its_kernels_wrote() {
    let (_turn, gpu) = common::gpu();
    let mut rng = common::Rng::new(17);
    let a = rng.vec(5000);
    let src = gpu.upload_f32(&a).unwrap();
    let dst = common::poisoned(gpu, 5000);
    for (at, len) in [(0, 5000), (3, 7), (4000, 1000), (9, 1)] {
        let mut b = gpu.batch();
        b.copy(&src, at, &dst, at, len).unwrap();
        let got = b.submit_read_f32(&dst, at, len).unwrap();
        let want = &a[at..at + len];
        assert_eq!(got.len(), len);
        assert!(got
            .iter()
            .zip(want)
            .all(|(x, y)| x.to_bits() == y.to_bits()));
    }
    // No kernels: the copy alone; u32 words as written.
    let words = gpu.upload_u32(&[1, 2, 3, 0xdead_beef]).unwrap();
    // Ranges of two tensors, after kernels and without them, each part in
    // its place; an empty part; a range past its tensor refused.
    let bits: Vec<u32> = a.iter().map(|x| x.to_bits()).collect();
    for kernels in [true, false] {
        let mut b = gpu.batch();
        if kernels {
            b.copy(&src, 0, &dst, 0, 5000).unwrap();
        }
        let parts = b
            .submit_read_u32_parts(&[(&words, 1, 3), (&dst, 10, 6), (&words, 0, 0)])
            .unwrap();
        assert_eq!(parts[0], [2, 3, 0xdead_beef]);
        assert_eq!(parts[1], bits[10..16]);
        assert!(parts[2].is_empty());
    }
    let e = gpu
        .batch()
        .submit_read_u32_parts(&[(&words, 0, 1), (&words, 3, 2)])
        .unwrap_err();
    assert!(matches!(e, GpuError::Shape { .. }), "{e}");
    assert_eq!(
        gpu.batch().submit_read_u32(&words, 2, 2).unwrap(),
        [3, 0xdead_beef]
    );
    assert!(gpu
        .batch()
        .submit_read_u32(&words, 0, 0)
        .unwrap()
        .is_empty());
    let e = gpu.batch().submit_read_u32(&words, 3, 2).unwrap_err();
    assert!(matches!(e, GpuError::Shape { .. }), "{e}");
    // The plain reads share the kept buffers and agree.
    assert_eq!(gpu.read_u32(&words).unwrap(), [1, 2, 3, 0xdead_beef]);
    // A few small buffers are kept; a readback past 64 MiB (a slot's saved
    // cache) gets its own buffer, read right and not kept.
    let kept = gpu.readback_bytes_kept();
    assert!(kept > 0 && kept <= 4 << 26, "{kept}");
    let n = (65 << 20) / 4;
    let big = gpu.upload_u32(&(0..n as u32).collect::<Vec<_>>()).unwrap();
    let back = gpu.read_u32(&big).unwrap();
    assert!(back.len() == n && back.iter().enumerate().all(|(i, &v)| v == i as u32));
    assert_eq!(gpu.readback_bytes_kept(), kept);
}

/// Device copies move exactly the runs asked for, in order: between
/// tensors, and within one (through the scratch, in pieces when a run is
/// longer than one), leaving every other element as it was; overlapping
/// or out-of-range runs are refused before anything is copied.
#[test]
fn device_copies_move_runs_within_and_between_tensors() {
    let (_turn, gpu) = common::gpu();
    // Longer than a scratch piece, so the copy within takes two.
    let piece = (COPY_PIECE / 4) as usize;
    let n = 2 * piece + 3000;
    let mut rng = common::Rng::new(41);
    let a_host: Vec<u32> = (0..n).map(|_| rng.next_u64() as u32).collect();
    let b_host: Vec<u32> = (0..100).map(|i| 7 * i).collect();
    let a = gpu.upload_u32(&a_host).unwrap();
    let b = gpu.upload_u32(&b_host).unwrap();
    let (len, src_at, dst_at) = (piece + 1000, 5, piece + 2000);
    gpu.copy_words(&[
        WordCopy {
            src: &a,
            src_at,
            dst: &a,
            dst_at,
            len,
        },
        // In order: this one reads what the first wrote.
        WordCopy {
            src: &a,
            src_at: dst_at + 10,
            dst: &b,
            dst_at: 50,
            len: 20,
        },
        WordCopy {
            src: &a,
            src_at: 0,
            dst: &a,
            dst_at: 1,
            len: 0,
        },
    ])
    .unwrap();
    let mut want = a_host.clone();
    want.copy_within(src_at..src_at + len, dst_at);
    assert!(
        gpu.read_u32(&a).unwrap() == want,
        "the copy within one tensor"
    );
    let mut want_b = b_host.clone();
    want_b[50..70].copy_from_slice(&want[dst_at + 10..dst_at + 30]);
    assert_eq!(gpu.read_u32(&b).unwrap(), want_b);
    // Refused, and nothing moved: an overlap, then a run past the end
    // after a good one.
    for runs in [
        vec![WordCopy {
            src: &b,
            src_at: 0,
            dst: &b,
            dst_at: 10,
            len: 11,
        }],
        vec![
            WordCopy {
                src: &b,
                src_at: 0,
                dst: &b,
                dst_at: 10,
                len: 10,
            },
            WordCopy {
                src: &a,
                src_at: 0,
                dst: &b,
                dst_at: 95,
                len: 6,
            },
        ],
    ] {
        let err = gpu.copy_words(&runs).unwrap_err();
        assert!(matches!(err, GpuError::Shape { op: "copy", .. }), "{err}");
        assert_eq!(gpu.read_u32(&b).unwrap(), want_b);
    }
}

/// Runs read back together give what each gives read alone, in order:
/// across two tensors, empty runs, and more bytes than one readback group
/// holds (so they take two); a run outside its tensor is refused.
#[test]
fn runs_read_back_together_as_each_read_alone() {
    let (_turn, gpu) = common::gpu();
    let group = (STAGING_KEPT_BYTES / 4) as usize;
    let mut rng = common::Rng::new(43);
    let a_host: Vec<u32> = (0..group + 5000).map(|_| rng.next_u64() as u32).collect();
    let b_host: Vec<u32> = (0..300).map(|_| rng.next_u64() as u32).collect();
    let a = gpu.upload_u32(&a_host).unwrap();
    let b = gpu.upload_u32(&b_host).unwrap();
    let runs = [
        (&b, 7, 100),
        (&a, 3, 2000),
        (&b, 0, 0),
        // With the runs before it, past one group: it starts the next.
        (&a, 4000, group - 1000),
        (&b, 200, 100),
        (&a, 0, group + 5000),
    ];
    let got = gpu.read_runs(&runs).unwrap();
    assert_eq!(got.len(), runs.len());
    for (&(t, at, len), bytes) in runs.iter().zip(&got) {
        let host = if std::ptr::eq(t, &a) {
            &a_host
        } else {
            &b_host
        };
        let want: Vec<u8> = host[at..at + len]
            .iter()
            .flat_map(|w| w.to_le_bytes())
            .collect();
        assert!(*bytes == want, "run {at}..+{len}");
        assert!(*bytes == gpu.read_words(t, at, len).unwrap());
    }
    let err = gpu.read_runs(&[(&b, 0, 10), (&b, 250, 51)]).unwrap_err();
    assert!(matches!(err, GpuError::Shape { op: "read", .. }), "{err}");
}
