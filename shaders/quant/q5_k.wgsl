// Q5_K, 176 bytes per 256 weights: d, dmin (f16), scales[12] (as Q4_K),
// qh[32] (fifth bits: bit S of byte l belongs to weight l of sub-block S),
// qs[128] (nibbles as Q4_K); w = d * sc[S] * q5 - dmin * m[S]. Word aligned.

fn scale_min_k4(sb: u32, s: u32) -> vec2<f32> {
    if (s < 4u) {
        return vec2<f32>(f32(wb_u8(sb + s) & 63u), f32(wb_u8(sb + s + 4u) & 63u));
    }
    let a = wb_u8(sb + s + 4u);
    let sc = (a & 0xfu) | ((wb_u8(sb + s - 4u) >> 6u) << 4u);
    let m = (a >> 4u) | ((wb_u8(sb + s) >> 6u) << 4u);
    return vec2<f32>(f32(sc), f32(m));
}

fn dq16(row: u32, g: u32) -> array<vec4<f32>, 4> {
    let b = row + 176u * (g >> 4u);
    let S = (g & 15u) >> 1u;
    let half = 16u * (g & 1u);
    let dm = unpack2x16float(w[b >> 2u]);
    let sm = scale_min_k4(b + 4u, S);
    let dl = dm.x * sm.x;
    let ml = dm.y * sm.y;
    let qw = (b + 48u + 32u * (S >> 1u) + half) >> 2u;
    let hw = (b + 16u + half) >> 2u;
    let shift = 4u * (S & 1u);
    var o: array<vec4<f32>, 4>;
    for (var i = 0u; i < 4u; i++) {
        let q = (w[qw + i] >> shift) & 0x0f0f0f0fu;
        let h = (w[hw + i] >> S) & 0x01010101u;
        o[i] = fma(u8x4(q | (h << 4u)), vec4<f32>(dl), vec4<f32>(-ml));
    }
    return o;
}

#include "common/dq32_pair.wgsl"
