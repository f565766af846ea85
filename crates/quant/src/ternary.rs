//! The ternary types of BitNet-style models, weights in {−1, 0, +1}·d (ggml
//! `src/ggml-common.h` `block_tq1_0`, `block_tq2_0`; `dequantize_row_tq1_0` /
//! `dequantize_row_tq2_0` in `src/ggml-quants.c`).
//!
//! | type | bytes | layout (in order) |
//! | ---- | ----- | ----------------- |
//! | TQ1_0 | 54 | `qs[48]` (5 trits per byte), `qh[4]` (4 trits per byte), d: f16 |
//! | TQ2_0 | 66 | `qs[64]` (4 two-bit values per byte), d: f16 |
//!
//! TQ1_0 packs trits as a base-3 fixed-point fraction of 256: multiplying the byte by
//! 3ⁿ (mod 256) rotates trit n to the top, and `(q·3) >> 8` reads it.

use crate::block::{f16_at, for_blocks};

const POW3: [u8; 5] = [1, 3, 9, 27, 81];

#[inline(always)]
fn trit(byte: u8, n: usize) -> f32 {
    let q = byte.wrapping_mul(POW3[n]);
    ((i32::from(q) * 3) >> 8) as f32 - 1.0
}

pub(crate) fn tq1_0(src: &[u8], dst: &mut [f32]) {
    for_blocks::<54, 256>(src, dst, |b, y| {
        let d = f16_at(b, 52);
        let mut out = 0;
        // 160 weights from the first 32 bytes, 80 from the next 16, 16 from qh.
        for (bytes, trits) in [(&b[0..32], 5), (&b[32..48], 5), (&b[48..52], 4)] {
            for n in 0..trits {
                for &q in bytes {
                    y[out] = trit(q, n) * d;
                    out += 1;
                }
            }
        }
    });
}

pub(crate) fn tq2_0(src: &[u8], dst: &mut [f32]) {
    for_blocks::<66, 256>(src, dst, |b, y| {
        let d = f16_at(b, 64);
        let mut out = 0;
        for group in b[..64].chunks_exact(32) {
            for shift in [0, 2, 4, 6] {
                for &q in group {
                    y[out] = (i32::from((q >> shift) & 3) - 1) as f32 * d;
                    out += 1;
                }
            }
        }
    });
}
