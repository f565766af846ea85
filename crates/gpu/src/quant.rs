//! Which ggml types have GPU kernels, and their shader files.

use lamina_gguf::GgmlType;

/// Every type with a mat-vec, mat-mul and row-lookup kernel.
pub const SUPPORTED: [GgmlType; 15] = [
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
    let spec = spec.def("TYPE", shader_file(ty).unwrap_or("none"));
    if binds_twice(ty) {
        spec.def("W4", "on").def("PB", "4")
    } else {
        spec.def("W4", "off").def("PB", "3")
    }
}

/// Whether dispatches of a `ty` weight bind its buffer a second time (as
/// binding 3, see [`weight_defs`]): Q4_K and Q5_K, whose 144- and 176-byte
/// super-blocks are 16-byte aligned, so their decoders load headers and
/// quants as vec4 words (Gemma 3 decode ~1.3x on lavapipe with Q4_K). The
/// 18-, 20- and 34-byte blocks of Q4_0, Q4_1 and Q8_0 are not aligned;
/// repacking them at upload (quants first, scales after) was tried and
/// measured no faster there.
pub(crate) fn binds_twice(ty: GgmlType) -> bool {
    matches!(ty, GgmlType::Q4K | GgmlType::Q5K)
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
    fn supported_list_and_decoders_agree() {
        for ty in GgmlType::ALL {
            assert_eq!(has_kernel(ty), SUPPORTED.contains(&ty), "{ty}");
        }
        for ty in SUPPORTED {
            // Kernels rely on 16 | block size (or plain elements) and 2 | bytes per block.
            assert!(ty.block_size() == 1 || ty.block_size() % 32 == 0, "{ty}");
            assert!(ty.block_size() == 1 || ty.type_size() % 2 == 0, "{ty}");
        }
    }
}
