//! The legacy 32-weight quants (ggml `src/ggml-common.h` `block_q4_0` … `block_q8_1`,
//! decode rules `dequantize_row_q4_0` … in `src/ggml-quants.c`).
//!
//! | type | bytes | layout |
//! | ---- | ----- | ------ |
//! | Q4_0 | 18 | d: f16, `qs[16]` |
//! | Q4_1 | 20 | d: f16, m: f16, `qs[16]` |
//! | Q5_0 | 22 | d: f16, qh: u32, `qs[16]` |
//! | Q5_1 | 24 | d: f16, m: f16, qh: u32, `qs[16]` |
//! | Q8_0 | 34 | d: f16, `qs[32]` i8 |
//! | Q8_1 | 36 | d: f16, s: f16 (= d·Σq, unused here), `qs[32]` i8 |
//!
//! In the 4- and 5-bit types byte j holds weight j in its low nibble and weight
//! j+16 in its high nibble; bit j of `qh` is the fifth bit of weight j.
//!
//! The affine types compute `q·d + m` as a rounded product then a rounded sum, as the
//! C source reads. (A C compiler allowed to contract it into an FMA can differ in the
//! last bit; the numpy reference in `gguf` does not contract, and neither does Rust.)

use crate::block::{f16_at, for_blocks, u32_at};

pub(crate) fn q4_0(src: &[u8], dst: &mut [f32]) {
    for_blocks::<18, 32>(src, dst, |b, y| {
        let d = f16_at(b, 0);
        for j in 0..16 {
            let q = b[2 + j];
            y[j] = (i32::from(q & 0xF) - 8) as f32 * d;
            y[j + 16] = (i32::from(q >> 4) - 8) as f32 * d;
        }
    });
}

pub(crate) fn q4_1(src: &[u8], dst: &mut [f32]) {
    for_blocks::<20, 32>(src, dst, |b, y| {
        let d = f16_at(b, 0);
        let m = f16_at(b, 2);
        for j in 0..16 {
            let q = b[4 + j];
            y[j] = f32::from(q & 0xF) * d + m;
            y[j + 16] = f32::from(q >> 4) * d + m;
        }
    });
}

pub(crate) fn q5_0(src: &[u8], dst: &mut [f32]) {
    for_blocks::<22, 32>(src, dst, |b, y| {
        let d = f16_at(b, 0);
        let qh = u32_at(b, 2);
        for j in 0..16 {
            let q = b[6 + j];
            let h0 = ((qh >> j) << 4) & 0x10;
            let h1 = (qh >> (j + 12)) & 0x10;
            y[j] = ((u32::from(q & 0xF) | h0) as i32 - 16) as f32 * d;
            y[j + 16] = ((u32::from(q >> 4) | h1) as i32 - 16) as f32 * d;
        }
    });
}

pub(crate) fn q5_1(src: &[u8], dst: &mut [f32]) {
    for_blocks::<24, 32>(src, dst, |b, y| {
        let d = f16_at(b, 0);
        let m = f16_at(b, 2);
        let qh = u32_at(b, 4);
        for j in 0..16 {
            let q = b[8 + j];
            let h0 = ((qh >> j) << 4) & 0x10;
            let h1 = (qh >> (j + 12)) & 0x10;
            y[j] = (u32::from(q & 0xF) | h0) as f32 * d + m;
            y[j + 16] = (u32::from(q >> 4) | h1) as f32 * d + m;
        }
    });
}

pub(crate) fn q8_0(src: &[u8], dst: &mut [f32]) {
    for_blocks::<34, 32>(src, dst, |b, y| {
        let d = f16_at(b, 0);
        for j in 0..32 {
            y[j] = f32::from(b[2 + j] as i8) * d;
        }
    });
}

/// Q8_1 is ggml's activation partner of the legacy types; its weights read like
/// Q8_0's, the stored sum only speeds up integer dot products.
pub(crate) fn q8_1(src: &[u8], dst: &mut [f32]) {
    for_blocks::<36, 32>(src, dst, |b, y| {
        let d = f16_at(b, 0);
        for j in 0..32 {
            y[j] = f32::from(b[4 + j] as i8) * d;
        }
    });
}
