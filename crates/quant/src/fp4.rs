//! Four-bit floating-point types: E2M1 values with a shared power-of-two (MXFP4) or
//! E4M3 (NVFP4) scale (ggml `src/ggml-common.h` `block_mxfp4`, `block_nvfp4`;
//! `dequantize_row_mxfp4` / `_nvfp4` in `src/ggml-quants.c`, scale decoders in
//! `src/ggml-impl.h`).
//!
//! | type | weights | bytes | layout (in order) |
//! | ---- | ------- | ----- | ----------------- |
//! | MXFP4 | 32 | 17 | e: E8M0 exponent, `qs[16]` (Q4_0 nibble order) |
//! | NVFP4 | 64 | 36 | `d[4]`: one unsigned E4M3 scale per 16 weights, `qs[32]` (per 16: 8 bytes, low nibbles first) |
//!
//! `kvalues_mxfp4` holds the E2M1 values doubled (so they are integers); both scale
//! decoders return half the true scale to compensate. Every product is exact.

use crate::block::for_blocks;
use crate::iq_tables::KVALUES_MXFP4;

/// 2^(x − 128), i.e. half of the E8M0 value 2^(x − 127) (ggml `ggml_e8m0_to_fp32_half`).
/// x = 0 and 1 land in the f32 subnormals; x = 255 (E8M0's NaN) reads as 2^127.
#[inline(always)]
fn e8m0_half(x: u8) -> f32 {
    let bits = if x < 2 {
        0x0020_0000u32 << x
    } else {
        u32::from(x - 1) << 23
    };
    f32::from_bits(bits)
}

/// Half of an unsigned E4M3 scale (bias 7; ggml `ggml_ue4m3_to_fp32`). 0x7F, E4M3's NaN,
/// reads as 0; bit 7 is not part of the format and is ignored.
#[inline(always)]
fn ue4m3_half(x: u8) -> f32 {
    if x == 0 || x == 0x7F {
        return 0.0;
    }
    let exp = u32::from((x >> 3) & 0xF);
    let man = f32::from(x & 7);
    let raw = if exp == 0 {
        man * f32::from_bits((127 - 9) << 23)
    } else {
        (1.0 + man / 8.0) * f32::from_bits((120 + exp) << 23)
    };
    raw * 0.5
}

pub(crate) fn mxfp4(src: &[u8], dst: &mut [f32]) {
    for_blocks::<17, 32>(src, dst, |b, y| {
        let d = e8m0_half(b[0]);
        for j in 0..16 {
            let q = b[1 + j];
            y[j] = f32::from(KVALUES_MXFP4[usize::from(q & 0xF)]) * d;
            y[j + 16] = f32::from(KVALUES_MXFP4[usize::from(q >> 4)]) * d;
        }
    });
}

pub(crate) fn nvfp4(src: &[u8], dst: &mut [f32]) {
    for_blocks::<36, 64>(src, dst, |b, y| {
        for s in 0..4 {
            let d = ue4m3_half(b[s]);
            let qs = &b[4 + 8 * s..12 + 8 * s];
            let out = &mut y[16 * s..16 * s + 16];
            for j in 0..8 {
                out[j] = f32::from(KVALUES_MXFP4[usize::from(qs[j] & 0xF)]) * d;
                out[j + 8] = f32::from(KVALUES_MXFP4[usize::from(qs[j] >> 4)]) * d;
            }
        }
    });
}
