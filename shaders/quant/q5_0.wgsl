// Q5_0, 22 bytes per 32 weights: d (f16), qh (32 fifth bits, bit j is
// weight j), qs[16] (nibbles as Q4_0); w = (q5 - 16) * d. Kept in the split
// layout (common/split.wgsl): qs[16] of every block, then qh, then d.

#include "common/split.wgsl"

// The fifth bits of weights 4i .. 4i + 3 (bits 0..3 of `hb`) as bit 4 of
// each byte.
fn q5_high(hb: u32) -> u32 {
    let h = (hb & 1u) | ((hb & 2u) << 7u) | ((hb & 4u) << 14u) | ((hb & 8u) << 21u);
    return h << 4u;
}

fn dq16(row: u32, g: u32) -> array<vec4<f32>, 4> {
    let u = g >> 1u;
    let nb = split_nb();
    let d = split_f16(row, 20u * nb, u);
    let half = g & 1u;
    let qh = split_u32(row, 16u * nb, u) >> (16u * half);
    let qs = v4(split_q(row, 16u, u, 0u));
    var o: array<vec4<f32>, 4>;
    for (var i = 0u; i < 4u; i++) {
        let q = (qs[i] >> (4u * half)) & 0x0f0f0f0fu;
        o[i] = (u8x4(q | q5_high(qh >> (4u * i))) - 16.0) * d;
    }
    return o;
}

// Unit u with each byte loaded once; the same operations as dq16.
fn dq32(row: u32, u: u32) -> array<vec4<f32>, 8> {
    let nb = split_nb();
    let d = split_f16(row, 20u * nb, u);
    let qh = split_u32(row, 16u * nb, u);
    let qs = v4(split_q(row, 16u, u, 0u));
    var o: array<vec4<f32>, 8>;
    for (var half = 0u; half < 2u; half++) {
        let qhh = qh >> (16u * half);
        for (var i = 0u; i < 4u; i++) {
            let q = (qs[i] >> (4u * half)) & 0x0f0f0f0fu;
            o[4u * half + i] = (u8x4(q | q5_high(qhh >> (4u * i))) - 16.0) * d;
        }
    }
    return o;
}
