//! Plain element types: F32, F16 (IEEE half) and BF16 (ggml `ggml_fp16_t`,
//! `ggml_bf16_t`). Widening to f32 is exact for both 16-bit formats, so these
//! decoders agree with ggml's `ggml_fp16_to_fp32_row` / `ggml_bf16_to_fp32_row`
//! bit for bit, NaN payloads included.

pub(crate) fn f32_le(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(4).zip(dst.iter_mut()) {
        *y = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    }
}

pub(crate) fn f16_le(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(2).zip(dst.iter_mut()) {
        *y = half::f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32();
    }
}

/// bf16 is the top half of an f32, so widening is a shift (ggml `ggml_bf16_to_fp32`).
pub(crate) fn bf16_le(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(2).zip(dst.iter_mut()) {
        *y = f32::from_bits(u32::from(u16::from_le_bytes([b[0], b[1]])) << 16);
    }
}
