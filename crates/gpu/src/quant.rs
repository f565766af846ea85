//! Which ggml types have GPU kernels, and their shader files.

use lamina_gguf::GgmlType;

/// Every type with a mat-vec, mat-mul and row-lookup kernel.
pub const SUPPORTED: [GgmlType; 26] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q2K,
    GgmlType::Q3K,
    GgmlType::Q4K,
    GgmlType::Q5K,
    GgmlType::Q6K,
    GgmlType::IQ4NL,
    GgmlType::IQ4XS,
    GgmlType::TQ2_0,
    GgmlType::TQ1_0,
    GgmlType::MXFP4,
    GgmlType::IQ2XXS,
    GgmlType::IQ2XS,
    GgmlType::IQ2S,
    GgmlType::IQ3XXS,
    GgmlType::IQ3S,
    GgmlType::IQ1S,
    GgmlType::IQ1M,
    GgmlType::NVFP4,
];

/// True if weights of this type can be placed on the GPU.
pub fn has_kernel(ty: GgmlType) -> bool {
    shader_file(ty).is_some()
}

/// The decoder under `shaders/quant/` (without `.wgsl`).
pub(crate) fn shader_file(ty: GgmlType) -> Option<&'static str> {
    use GgmlType::*;
    Some(match ty {
        F32 => "f32",
        F16 => "f16",
        BF16 => "bf16",
        Q4_0 => "q4_0",
        Q4_1 => "q4_1",
        Q5_0 => "q5_0",
        Q5_1 => "q5_1",
        Q8_0 => "q8_0",
        Q2K => "q2_k",
        Q3K => "q3_k",
        Q4K => "q4_k",
        Q5K => "q5_k",
        Q6K => "q6_k",
        IQ4NL => "iq4_nl",
        IQ4XS => "iq4_xs",
        TQ2_0 => "tq2_0",
        TQ1_0 => "tq1_0",
        MXFP4 => "mxfp4",
        IQ2XXS => "iq2_xxs",
        IQ2XS => "iq2_xs",
        IQ2S => "iq2_s",
        IQ3XXS => "iq3_xxs",
        IQ3S => "iq3_s",
        IQ1S => "iq1_s",
        IQ1M => "iq1_m",
        NVFP4 => "nvfp4",
        _ => return None,
    })
}

/// The definitions a weight kernel needs for `ty`: its decoder, and for a
/// type whose decoder loads vec4 words the second, vec4 view of the weight
/// buffer at binding 3 (the parameters then move to binding 4).
pub(crate) fn weight_defs(
    spec: crate::shader::KernelSpec,
    ty: GgmlType,
) -> crate::shader::KernelSpec {
    weight_defs_with(spec, ty, 0)
}

/// [`weight_defs`] for a kernel with `extra` more storage bindings after
/// the weight's (the mat-vec's norm weight): the first of them is `NB`, and
/// the parameters follow them.
pub(crate) fn weight_defs_with(
    spec: crate::shader::KernelSpec,
    ty: GgmlType,
    extra: usize,
) -> crate::shader::KernelSpec {
    let spec = spec.def("TYPE", shader_file(ty).unwrap_or("none"));
    let n = weight_bindings(ty);
    let spec = spec
        .def("W4", if binds_twice(ty) { "on" } else { "off" })
        .def("NB", n.to_string());
    spec.def("PB", (n + extra).to_string())
}

/// Whether dispatches of a `ty` weight bind its buffer a second time (as
/// binding 3, see [`weight_defs`]), so its decoder loads quants as vec4
/// words: Q4_K and Q5K, whose 144- and 176-byte super-blocks are 16-byte
/// aligned (faster Q4_K decoding: docs/perf/lavapipe.md, 2026-12-03), and
/// the types kept in the [`split_fields`] layout.
pub(crate) fn binds_twice(ty: GgmlType) -> bool {
    matches!(ty, GgmlType::Q4K | GgmlType::Q5K) || split_fields(ty).is_some()
}

/// One field of a ggml block: `len` bytes at byte `at` of the block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Field {
    pub at: usize,
    pub len: usize,
}

/// The types whose rows the GPU keeps in a split layout (the small-block
/// types and Q6_K): a row holds its blocks' quant bytes (16 or 32 per
/// block; Q6_K's low bits, then its high bits) one block after another,
/// then each header field of every block in turn (largest fields first, so
/// each run starts aligned to its field), zero-padded to a multiple of 16
/// bytes. The fields here are in that order, quants first.
///
/// The 17-, 18-, 20-, 22-, 24- and 34-byte ggml blocks put their quants off
/// any 16-byte boundary, so a decoder reading them in place gathers words one
/// by one and funnel-shifts unaligned ones (MXFP4's odd offsets are beyond
/// the byte helpers altogether); split, each unit's quants are one
/// or two aligned vec4 loads, and lanes reading adjacent units read adjacent
/// 16-byte pieces. The values decoded are the same, so every kernel keeps
/// its bits, and Q8_0's mat-vec got faster on lavapipe
/// (docs/perf/kernels.md, 2026-12-04). The layout costs under 2 % of
/// padding at the models' row lengths and one bounded bounce buffer at
/// upload (`Gpu::upload_stacked`).
pub(crate) fn split_fields(ty: GgmlType) -> Option<&'static [Field]> {
    use GgmlType::*;
    Some(match ty {
        // d, qs[16]
        Q4_0 | IQ4NL => &[Field { at: 2, len: 16 }, Field { at: 0, len: 2 }],
        // d, m, qs[16]: d and m stay one word
        Q4_1 => &[Field { at: 4, len: 16 }, Field { at: 0, len: 4 }],
        // d, qh[4], qs[16]
        Q5_0 => &[
            Field { at: 6, len: 16 },
            Field { at: 2, len: 4 },
            Field { at: 0, len: 2 },
        ],
        // d, m, qh[4], qs[16]
        Q5_1 => &[
            Field { at: 8, len: 16 },
            Field { at: 0, len: 4 },
            Field { at: 4, len: 4 },
        ],
        // d, qs[32]
        Q8_0 => &[Field { at: 2, len: 32 }, Field { at: 0, len: 2 }],
        // e, qs[16]: the 17-byte blocks leave most fields at odd offsets,
        // which the kernels' byte helpers do not read in place.
        MXFP4 => &[Field { at: 1, len: 16 }, Field { at: 0, len: 1 }],
        // ql[128], qh[64], scales[16], d: the 210-byte super-blocks leave
        // all but the first field off a 4-byte boundary.
        Q6K => &[
            Field { at: 0, len: 128 },
            Field { at: 128, len: 64 },
            Field { at: 192, len: 16 },
            Field { at: 208, len: 2 },
        ],
        _ => return None,
    })
}

/// Bytes of one GPU row of `blocks` blocks of `ty`: the ggml bytes, or for a
/// split type those rounded up to 16.
pub(crate) fn gpu_row_bytes(ty: GgmlType, blocks: usize) -> usize {
    let b = blocks * ty.type_size() as usize;
    if split_fields(ty).is_some() {
        b.div_ceil(16) * 16
    } else {
        b
    }
}

/// Appends one row of ggml blocks (`src`, whole blocks of a split type) to
/// `out` in the split layout, padding included.
pub(crate) fn split_row(ty: GgmlType, src: &[u8], out: &mut Vec<u8>) {
    let Some(fields) = split_fields(ty) else {
        out.extend_from_slice(src);
        return;
    };
    let bs = ty.type_size() as usize;
    let start = out.len();
    for fl in fields {
        for block in src.chunks_exact(bs) {
            out.extend_from_slice(&block[fl.at..fl.at + fl.len]);
        }
    }
    out.resize(start + gpu_row_bytes(ty, src.len() / bs), 0);
}

/// Adjacent 32-weight units that share their quant words, which the
/// one-thread-per-row kernel then decodes from one load
/// (`shaders/common/walk_groups.wgsl`): Q6_K's four units of a 128-weight
/// half read the same 96 bytes of low and high bits, Q4_K's and Q5_K's
/// sub-block pairs the same 32 bytes of nibbles. 1 for every other type. Every row of a
/// grouping type holds whole groups (its super-blocks hold 8 units).
pub(crate) fn unit_group(ty: GgmlType) -> u32 {
    match ty {
        GgmlType::Q6K => 4,
        GgmlType::Q4K | GgmlType::Q5K => 2,
        _ => 1,
    }
}

/// Storage bindings before the parameters in a weight kernel's dispatch:
/// weight, input, output, and the vec4 view where [`binds_twice`].
pub(crate) fn weight_bindings(ty: GgmlType) -> usize {
    3 + usize::from(binds_twice(ty))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_fields_cover_each_block_once() {
        for ty in SUPPORTED {
            let Some(fields) = split_fields(ty) else {
                continue;
            };
            let mut seen = vec![0u32; ty.type_size() as usize];
            for fl in fields {
                seen[fl.at..fl.at + fl.len].iter_mut().for_each(|s| *s += 1);
            }
            assert!(seen.iter().all(|&s| s == 1), "{ty}: {seen:?}");
            // Quants first, in 16-byte pieces; then runs that stay aligned.
            assert_eq!(fields[0].len % 16, 0, "{ty}");
            assert!(fields.windows(2).all(|w| w[0].len >= w[1].len), "{ty}");
        }
    }

    #[test]
    fn split_row_moves_fields_and_pads() {
        // Three Q5_0 blocks whose bytes are their own offsets.
        let ty = GgmlType::Q5_0;
        let src: Vec<u8> = (0..66u8).collect();
        let mut out = vec![0xee];
        split_row(ty, &src, &mut out);
        assert_eq!(out.len(), 1 + 80);
        let row = &out[1..];
        // qs of block 1 (bytes 22 + 6 ..), qh of block 2, d of block 0.
        assert_eq!(&row[16..32], &src[28..44]);
        assert_eq!(&row[48 + 8..48 + 12], &src[44 + 2..44 + 6]);
        assert_eq!(&row[60..62], &src[0..2]);
        assert!(row[66..].iter().all(|&b| b == 0));
        // A type kept as it is passes through.
        let mut same = Vec::new();
        split_row(GgmlType::Q4K, &[1, 2, 3], &mut same);
        assert_eq!(same, [1, 2, 3]);
    }

    #[test]
    fn supported_list_and_decoders_agree() {
        for ty in GgmlType::ALL {
            assert_eq!(has_kernel(ty), SUPPORTED.contains(&ty), "{ty}");
        }
        for ty in SUPPORTED {
            // Kernels rely on 32 | block size (or plain elements) and, for
            // blocks read in place, 2 | bytes per block (even row starts for
            // the 16-bit reads). A split type's rows are rewritten into
            // 16-byte-aligned runs, so its block size may be odd (MXFP4).
            assert!(ty.block_size() == 1 || ty.block_size() % 32 == 0, "{ty}");
            assert!(
                ty.block_size() == 1 || ty.type_size() % 2 == 0 || split_fields(ty).is_some(),
                "{ty}"
            );
        }
    }
}
