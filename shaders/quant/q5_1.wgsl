// Q5_1, 24 bytes per 32 weights: d, m (f16), qh (u32 of fifth bits), qs[16];
// w = q5 * d + m. Kept in the split layout (common/split.wgsl): qs[16] of
// every block, then the (d, m) words, then qh.

#include "common/split.wgsl"

fn q5_high(hb: u32) -> u32 {
    let h = (hb & 1u) | ((hb & 2u) << 7u) | ((hb & 4u) << 14u) | ((hb & 8u) << 21u);
    return h << 4u;
}

fn dq16(row: u32, g: u32) -> array<vec4<f32>, 4> {
    let u = g >> 1u;
    let nb = split_nb();
    let dm = unpack2x16float(split_u32(row, 16u * nb, u));
    let half = g & 1u;
    let qh = split_u32(row, 20u * nb, u) >> (16u * half);
    let qs = v4(split_q(row, 16u, u, 0u));
    var o: array<vec4<f32>, 4>;
    for (var i = 0u; i < 4u; i++) {
        let q = (qs[i] >> (4u * half)) & 0x0f0f0f0fu;
        o[i] = fma(u8x4(q | q5_high(qh >> (4u * i))), vec4<f32>(dm.x), vec4<f32>(dm.y));
    }
    return o;
}

// Unit u with each word loaded once; the same operations as dq16.
fn dq32(row: u32, u: u32) -> array<vec4<f32>, 8> {
    let nb = split_nb();
    let dm = unpack2x16float(split_u32(row, 16u * nb, u));
    let qh = split_u32(row, 20u * nb, u);
    let qs = v4(split_q(row, 16u, u, 0u));
    var o: array<vec4<f32>, 8>;
    for (var half = 0u; half < 2u; half++) {
        let qhh = qh >> (16u * half);
        for (var i = 0u; i < 4u; i++) {
            let q = (qs[i] >> (4u * half)) & 0x0f0f0f0fu;
            o[4u * half + i] = fma(u8x4(q | q5_high(qhh >> (4u * i))), vec4<f32>(dm.x), vec4<f32>(dm.y));
        }
    }
    return o;
}
