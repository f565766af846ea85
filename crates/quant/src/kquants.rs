//! The k-quants: 256-weight super-blocks split into sub-blocks with their own small
//! scales (ggml `src/ggml-common.h` `block_q2_K` … `block_q8_K`, decode rules
//! `dequantize_row_q2_K` … in `src/ggml-quants.c`).
//!
//! | type | bytes | layout (in order) |
//! | ---- | ----- | ----------------- |
//! | Q2_K | 84  | `scales[16]` (low nibble scale, high nibble min), `qs[64]`, d: f16, dmin: f16 |
//! | Q3_K | 110 | `hmask[32]`, `qs[64]`, `scales[12]` (16 × 6 bits), d: f16 |
//! | Q4_K | 144 | d: f16, dmin: f16, `scales[12]` (8 scales + 8 mins, 6 bits each), `qs[128]` |
//! | Q5_K | 176 | d: f16, dmin: f16, `scales[12]`, `qh[32]`, `qs[128]` |
//! | Q6_K | 210 | `ql[128]`, `qh[64]`, `scales[16]` i8, d: f16 |
//! | Q8_K | 292 | d: f32, `qs[256]` i8, `bsums[16]` i16 |
//!
//! The 2- and 3-bit types walk each 128-weight half as four passes over the same 32
//! bytes, taking bits 0–1, 2–3, 4–5, 6–7 in turn; the 4- and 5-bit types take low then
//! high nibbles of 32 bytes per 64 weights. Scales are combined with `d` first and then
//! applied to each quant, in ggml's order, so rounding matches. As in the legacy types,
//! `d·q − m` is a rounded product then a rounded difference (no FMA).

use crate::block::{f16_at, for_blocks};

pub(crate) fn q2_k(src: &[u8], dst: &mut [f32]) {
    for_blocks::<84, 256>(src, dst, |b, y| {
        let d = f16_at(b, 80);
        let min = f16_at(b, 82);
        let mut out = 0;
        let mut is = 0;
        for n in 0..2 {
            let q = &b[16 + 32 * n..48 + 32 * n];
            for shift in [0, 2, 4, 6] {
                for half in 0..2 {
                    let sc = b[is];
                    is += 1;
                    let dl = d * f32::from(sc & 0xF);
                    let ml = min * f32::from(sc >> 4);
                    for &qb in &q[16 * half..16 * half + 16] {
                        y[out] = dl * f32::from((qb >> shift) & 3) - ml;
                        out += 1;
                    }
                }
            }
        }
    });
}

/// The sixteen 6-bit Q3_K scales, unbiased: scale k keeps its low four bits in a
/// nibble of `sc[k % 8]` (low nibble for k < 8) and its high two bits in `sc[8 + k % 4]`
/// at bit `2·(k / 4)` (ggml unpacks the same with the `kmask1`/`kmask2` word trick).
fn q3_k_scales(sc: &[u8]) -> [i32; 16] {
    let mut out = [0; 16];
    for (k, o) in out.iter_mut().enumerate() {
        let low = if k < 8 { sc[k] & 0xF } else { sc[k - 8] >> 4 };
        let high = (sc[8 + k % 4] >> (2 * (k / 4))) & 3;
        *o = i32::from(low | (high << 4)) - 32;
    }
    out
}

pub(crate) fn q3_k(src: &[u8], dst: &mut [f32]) {
    for_blocks::<110, 256>(src, dst, |b, y| {
        let d_all = f16_at(b, 108);
        let scales = q3_k_scales(&b[96..108]);
        let hmask = &b[0..32];
        let mut out = 0;
        let mut is = 0;
        for n in 0..2 {
            let q = &b[32 + 32 * n..64 + 32 * n];
            for j in 0..4 {
                let shift = 2 * j;
                // hmask bit (4n + j) of byte l is the high bit of the weight read from
                // q[l] in this pass; a clear bit means "subtract 4".
                let m = 1u8 << (4 * n + j);
                for half in 0..2 {
                    let dl = d_all * scales[is] as f32;
                    is += 1;
                    for l in 16 * half..16 * half + 16 {
                        let low = i32::from((q[l] >> shift) & 3);
                        let sub = if hmask[l] & m != 0 { 0 } else { 4 };
                        y[out] = dl * (low - sub) as f32;
                        out += 1;
                    }
                }
            }
        }
    });
}

/// Scale and min of sub-block `j` (0..8) of Q4_K/Q5_K (ggml `get_scale_min_k4`): the
/// first four keep 6 bits in bytes 0–3 / 4–7; the last four split 4 low bits in
/// bytes 8–11 and 2 high bits in the top of bytes 0–7.
#[inline(always)]
fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

pub(crate) fn q4_k(src: &[u8], dst: &mut [f32]) {
    for_blocks::<144, 256>(src, dst, |b, y| {
        let d = f16_at(b, 0);
        let min = f16_at(b, 2);
        let scales = &b[4..16];
        for p in 0..4 {
            let q = &b[16 + 32 * p..48 + 32 * p];
            let (sc1, m1) = scale_min_k4(2 * p, scales);
            let (sc2, m2) = scale_min_k4(2 * p + 1, scales);
            let (d1, m1) = (d * f32::from(sc1), min * f32::from(m1));
            let (d2, m2) = (d * f32::from(sc2), min * f32::from(m2));
            let out = &mut y[64 * p..64 * p + 64];
            for l in 0..32 {
                out[l] = d1 * f32::from(q[l] & 0xF) - m1;
                out[l + 32] = d2 * f32::from(q[l] >> 4) - m2;
            }
        }
    });
}

pub(crate) fn q5_k(src: &[u8], dst: &mut [f32]) {
    for_blocks::<176, 256>(src, dst, |b, y| {
        let d = f16_at(b, 0);
        let min = f16_at(b, 2);
        let scales = &b[4..16];
        let qh = &b[16..48];
        for p in 0..4 {
            let ql = &b[48 + 32 * p..80 + 32 * p];
            let (sc1, m1) = scale_min_k4(2 * p, scales);
            let (sc2, m2) = scale_min_k4(2 * p + 1, scales);
            let (d1, m1) = (d * f32::from(sc1), min * f32::from(m1));
            let (d2, m2) = (d * f32::from(sc2), min * f32::from(m2));
            // qh bit 2p is the fifth bit of the low-nibble weights of this pass, 2p+1 of the high.
            let (u1, u2) = (1u8 << (2 * p), 2u8 << (2 * p));
            let out = &mut y[64 * p..64 * p + 64];
            for l in 0..32 {
                let h1 = if qh[l] & u1 != 0 { 16 } else { 0 };
                let h2 = if qh[l] & u2 != 0 { 16 } else { 0 };
                out[l] = d1 * f32::from((ql[l] & 0xF) + h1) - m1;
                out[l + 32] = d2 * f32::from((ql[l] >> 4) + h2) - m2;
            }
        }
    });
}

pub(crate) fn q6_k(src: &[u8], dst: &mut [f32]) {
    for_blocks::<210, 256>(src, dst, |b, y| {
        let d = f16_at(b, 208);
        for n in 0..2 {
            let ql = &b[64 * n..64 * n + 64];
            let qh = &b[128 + 32 * n..160 + 32 * n];
            let sc = &b[192 + 8 * n..200 + 8 * n];
            let out = &mut y[128 * n..128 * n + 128];
            for l in 0..32 {
                let is = l / 16;
                let q1 = i32::from((ql[l] & 0xF) | ((qh[l] & 3) << 4)) - 32;
                let q2 = i32::from((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
                let q3 = i32::from((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                let q4 = i32::from((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                // ggml: d * sc * q, left to right: the scale is applied to d first.
                out[l] = d * f32::from(sc[is] as i8) * q1 as f32;
                out[l + 32] = d * f32::from(sc[is + 2] as i8) * q2 as f32;
                out[l + 64] = d * f32::from(sc[is + 4] as i8) * q3 as f32;
                out[l + 96] = d * f32::from(sc[is + 6] as i8) * q4 as f32;
            }
        }
    });
}

/// Q8_K is ggml's activation partner of the k-quants; its weights are `d·q` with an f32 `d`.
pub(crate) fn q8_k(src: &[u8], dst: &mut [f32]) {
    for_blocks::<292, 256>(src, dst, |b, y| {
        let d = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        for (o, &q) in y.iter_mut().zip(&b[4..260]) {
            *o = d * f32::from(q as i8);
        }
    });
}
