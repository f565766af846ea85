//! The i-quants: weights taken from fixed grids of 4 or 8 magnitudes, with signs and
//! scales per 32 weights (ggml `src/ggml-common.h` `block_iq2_xxs` … `block_iq4_xs`,
//! decode rules `dequantize_row_iq*` in `src/ggml-quants.c`; grids in [`crate::iq_tables`]).
//!
//! | type | bytes | layout (in order) |
//! | ---- | ----- | ----------------- |
//! | IQ2_XXS | 66  | d: f16, `qs[64]`: per 32 weights two u32: 4 grid bytes, then 4 × 7-bit sign index + 4-bit scale |
//! | IQ2_XS  | 74  | d: f16, `qs[32]` u16 (9-bit grid index + 7-bit sign index), `scales[8]` (two nibbles per 32) |
//! | IQ2_S   | 82  | d: f16, `qs[32]` grid index low bits, `signs[32]`, `qh[8]` (2 high index bits each), `scales[8]` |
//! | IQ3_XXS | 98  | d: f16, `qs[64]` grid indices, 8 × u32 (4 × 7-bit sign index + 4-bit scale) |
//! | IQ3_S   | 110 | d: f16, `qs[64]` (low 8 index bits), `qh[8]` (9th bits), `signs[32]`, `scales[4]` |
//! | IQ1_S   | 50  | d: f16, `qs[32]` (low 8 index bits), `qh[8]` u16 (4 × 3 high bits, 3-bit scale, delta sign) |
//! | IQ1_M   | 56  | `qs[32]`, `qh[16]` (3 high bits + delta sign per nibble), `scales[8]`: 4 × u16 of 3-bit scales whose top nibbles form the f16 d |
//! | IQ4_NL  | 18  | d: f16, `qs[16]` nibbles into `kvalues_iq4nl` (Q4_0 nibble order) |
//! | IQ4_XS  | 136 | d: f16, scales_h: u16, `scales_l[4]`, `qs[128]` |
//!
//! Signs are applied by negating the scaled magnitude, which is what ggml's
//! `· (mask ? -1.f : 1.f)` computes exactly.

use crate::block::{f16_at, for_blocks, u16_at, u32_at};
use crate::iq_tables::{
    IQ1S_GRID, IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3S_GRID, IQ3XXS_GRID, KSIGNS_IQ2XS,
    KVALUES_IQ4NL,
};

/// ggml's `IQ1S_DELTA` / `IQ1M_DELTA`: the grid of the 1-bit types is shifted by ±1/8.
const IQ1_DELTA: f32 = 0.125;

/// Writes `db · grid[j]`, negated where bit j of `signs` is set.
#[inline(always)]
fn signed(y: &mut [f32], db: f32, grid: &[u8], signs: u8) {
    for (j, (o, &g)) in y.iter_mut().zip(grid).enumerate() {
        // Flipping the sign bit is exactly ggml's `· -1.f`, without a branch.
        let flip = u32::from((signs >> j) & 1) << 31;
        *o = f32::from_bits((db * f32::from(g)).to_bits() ^ flip);
    }
}

pub(crate) fn iq2_xxs(src: &[u8], dst: &mut [f32]) {
    for_blocks::<66, 256>(src, dst, |b, y| {
        let d = f16_at(b, 0);
        for ib32 in 0..8 {
            let base = 2 + 8 * ib32;
            let aux1 = u32_at(b, base + 4);
            let db = d * (0.5 + (aux1 >> 28) as f32) * 0.25;
            for l in 0..4 {
                let grid = IQ2XXS_GRID[usize::from(b[base + l])].to_le_bytes();
                let signs = KSIGNS_IQ2XS[((aux1 >> (7 * l)) & 127) as usize];
                let o = 32 * ib32 + 8 * l;
                signed(&mut y[o..o + 8], db, &grid, signs);
            }
        }
    });
}

pub(crate) fn iq2_xs(src: &[u8], dst: &mut [f32]) {
    for_blocks::<74, 256>(src, dst, |b, y| {
        let d = f16_at(b, 0);
        for ib32 in 0..8 {
            let sc = b[66 + ib32];
            let db = [
                d * (0.5 + f32::from(sc & 0xF)) * 0.25,
                d * (0.5 + f32::from(sc >> 4)) * 0.25,
            ];
            for l in 0..4 {
                let q = u16_at(b, 2 + 2 * (4 * ib32 + l));
                let grid = IQ2XS_GRID[usize::from(q & 511)].to_le_bytes();
                let signs = KSIGNS_IQ2XS[usize::from(q >> 9)];
                let o = 32 * ib32 + 8 * l;
                signed(&mut y[o..o + 8], db[l / 2], &grid, signs);
            }
        }
    });
}

pub(crate) fn iq2_s(src: &[u8], dst: &mut [f32]) {
    for_blocks::<82, 256>(src, dst, |b, y| {
        let d = f16_at(b, 0);
        for ib32 in 0..8 {
            let sc = b[74 + ib32];
            let db = [
                d * (0.5 + f32::from(sc & 0xF)) * 0.25,
                d * (0.5 + f32::from(sc >> 4)) * 0.25,
            ];
            let qh = usize::from(b[66 + ib32]);
            for l in 0..4 {
                let idx = usize::from(b[2 + 4 * ib32 + l]) | ((qh << (8 - 2 * l)) & 0x300);
                let grid = IQ2S_GRID[idx].to_le_bytes();
                let signs = b[34 + 4 * ib32 + l];
                let o = 32 * ib32 + 8 * l;
                signed(&mut y[o..o + 8], db[l / 2], &grid, signs);
            }
        }
    });
}

pub(crate) fn iq3_xxs(src: &[u8], dst: &mut [f32]) {
    for_blocks::<98, 256>(src, dst, |b, y| {
        let d = f16_at(b, 0);
        for ib32 in 0..8 {
            let aux = u32_at(b, 66 + 4 * ib32);
            let db = d * (0.5 + (aux >> 28) as f32) * 0.5;
            for l in 0..4 {
                let signs = KSIGNS_IQ2XS[((aux >> (7 * l)) & 127) as usize];
                let q = 2 + 8 * ib32 + 2 * l;
                let g1 = IQ3XXS_GRID[usize::from(b[q])].to_le_bytes();
                let g2 = IQ3XXS_GRID[usize::from(b[q + 1])].to_le_bytes();
                let o = 32 * ib32 + 8 * l;
                signed(&mut y[o..o + 4], db, &g1, signs);
                signed(&mut y[o + 4..o + 8], db, &g2, signs >> 4);
            }
        }
    });
}

pub(crate) fn iq3_s(src: &[u8], dst: &mut [f32]) {
    for_blocks::<110, 256>(src, dst, |b, y| {
        let d = f16_at(b, 0);
        for ib32 in 0..8 {
            let sc = b[106 + ib32 / 2];
            let s = if ib32 % 2 == 0 { sc & 0xF } else { sc >> 4 };
            // ggml: d * (1 + 2*s) with the integer formed first.
            let db = d * f32::from(1 + 2 * s);
            let qh = usize::from(b[66 + ib32]);
            for l in 0..4 {
                let q = 2 + 8 * ib32 + 2 * l;
                let i1 = usize::from(b[q]) | ((qh << (8 - 2 * l)) & 256);
                let i2 = usize::from(b[q + 1]) | ((qh << (7 - 2 * l)) & 256);
                let signs = b[74 + 4 * ib32 + l];
                let o = 32 * ib32 + 8 * l;
                signed(&mut y[o..o + 4], db, &IQ3S_GRID[i1].to_le_bytes(), signs);
                signed(
                    &mut y[o + 4..o + 8],
                    db,
                    &IQ3S_GRID[i2].to_le_bytes(),
                    signs >> 4,
                );
            }
        }
    });
}

/// Writes `dl · (grid[j] + delta)` for one 8-weight IQ1 grid entry.
#[inline(always)]
fn iq1_group(y: &mut [f32], dl: f32, idx: usize, delta: f32) {
    let grid = IQ1S_GRID[idx].to_le_bytes();
    for (o, &g) in y.iter_mut().zip(&grid) {
        *o = dl * (f32::from(g as i8) + delta);
    }
}

pub(crate) fn iq1_s(src: &[u8], dst: &mut [f32]) {
    for_blocks::<50, 256>(src, dst, |b, y| {
        let d = f16_at(b, 0);
        for ib in 0..8 {
            let qh = u16_at(b, 34 + 2 * ib);
            let dl = d * f32::from(2 * ((qh >> 12) & 7) + 1);
            let delta = if qh & 0x8000 != 0 {
                -IQ1_DELTA
            } else {
                IQ1_DELTA
            };
            for l in 0..4 {
                let idx = usize::from(b[2 + 4 * ib + l]) | (usize::from((qh >> (3 * l)) & 7) << 8);
                let o = 32 * ib + 8 * l;
                iq1_group(&mut y[o..o + 8], dl, idx, delta);
            }
        }
    });
}

pub(crate) fn iq1_m(src: &[u8], dst: &mut [f32]) {
    for_blocks::<56, 256>(src, dst, |b, y| {
        let sc = [u16_at(b, 48), u16_at(b, 50), u16_at(b, 52), u16_at(b, 54)];
        // The block has no d field: its f16 bits are the top nibbles of the four scale words.
        let d_bits =
            (sc[0] >> 12) | ((sc[1] >> 8) & 0x00F0) | ((sc[2] >> 4) & 0x0F00) | (sc[3] & 0xF000);
        let d = half::f16::from_bits(d_bits).to_f32();
        for ib in 0..8 {
            let s = sc[ib / 2] >> (6 * (ib % 2));
            let dl = [
                d * f32::from(2 * (s & 7) + 1),
                d * f32::from(2 * ((s >> 3) & 7) + 1),
            ];
            for l in 0..4 {
                let qh = b[32 + 2 * ib + l / 2];
                let nib = if l % 2 == 0 { qh & 0xF } else { qh >> 4 };
                let idx = usize::from(b[4 * ib + l]) | (usize::from(nib & 7) << 8);
                let delta = if nib & 8 != 0 { -IQ1_DELTA } else { IQ1_DELTA };
                let o = 32 * ib + 8 * l;
                iq1_group(&mut y[o..o + 8], dl[l / 2], idx, delta);
            }
        }
    });
}

pub(crate) fn iq4_nl(src: &[u8], dst: &mut [f32]) {
    for_blocks::<18, 32>(src, dst, |b, y| {
        let d = f16_at(b, 0);
        for j in 0..16 {
            let q = b[2 + j];
            y[j] = d * f32::from(KVALUES_IQ4NL[usize::from(q & 0xF)]);
            y[j + 16] = d * f32::from(KVALUES_IQ4NL[usize::from(q >> 4)]);
        }
    });
}

pub(crate) fn iq4_xs(src: &[u8], dst: &mut [f32]) {
    for_blocks::<136, 256>(src, dst, |b, y| {
        let d = f16_at(b, 0);
        let scales_h = u16_at(b, 2);
        for ib in 0..8 {
            let low = (b[4 + ib / 2] >> (4 * (ib % 2))) & 0xF;
            let high = ((scales_h >> (2 * ib)) & 3) as u8;
            let dl = d * (i32::from(low | (high << 4)) - 32) as f32;
            let qs = &b[8 + 16 * ib..24 + 16 * ib];
            let out = &mut y[32 * ib..32 * ib + 32];
            for j in 0..16 {
                out[j] = dl * f32::from(KVALUES_IQ4NL[usize::from(qs[j] & 0xF)]);
                out[j + 16] = dl * f32::from(KVALUES_IQ4NL[usize::from(qs[j] >> 4)]);
            }
        }
    });
}
