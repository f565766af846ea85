//! Small readers shared by the block decoders. ggml stores every multi-byte field
//! little-endian (GGUF is little-endian only), and blocks are packed without padding,
//! so fields are read by byte offset rather than through a `#[repr(C)]` cast.

/// Calls `f` on each block of `src` and the matching `BS` weights of `dst`. The
/// caller has checked that both hold the same whole number of blocks; fixed-size
/// arrays let the per-block code index without bounds checks.
#[inline(always)]
pub(crate) fn for_blocks<const TS: usize, const BS: usize>(
    src: &[u8],
    dst: &mut [f32],
    mut f: impl FnMut(&[u8; TS], &mut [f32; BS]),
) {
    for (b, y) in src.chunks_exact(TS).zip(dst.chunks_exact_mut(BS)) {
        // chunks_exact guarantees the lengths, so these conversions always succeed.
        if let (Ok(b), Ok(y)) = (<&[u8; TS]>::try_from(b), <&mut [f32; BS]>::try_from(y)) {
            f(b, y);
        }
    }
}

#[inline(always)]
pub(crate) fn u16_at<const N: usize>(b: &[u8; N], off: usize) -> u16 {
    u16::from_le_bytes([b[off], b[off + 1]])
}

#[inline(always)]
pub(crate) fn u32_at<const N: usize>(b: &[u8; N], off: usize) -> u32 {
    u32::from_le_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]])
}

/// An IEEE half at `off`, widened exactly (ggml `GGML_FP16_TO_FP32`).
#[inline(always)]
pub(crate) fn f16_at<const N: usize>(b: &[u8; N], off: usize) -> f32 {
    half::f16::from_bits(u16_at(b, off)).to_f32()
}
