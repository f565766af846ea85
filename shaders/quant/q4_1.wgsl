// Q4_1, 20 bytes per 32 weights: d, m (f16), qs[16] (nibbles as Q4_0);
// w = q * d + m. Kept in the split layout (common/split.wgsl): qs[16] of
// every block, then the (d, m) words.

#include "common/split.wgsl"

fn dq16(row: u32, g: u32) -> array<vec4<f32>, 4> {
    let u = g >> 1u;
    let dm = unpack2x16float(split_u32(row, 16u * split_nb(), u));
    let qs = v4(split_q(row, 16u, u, 0u));
    let shift = 4u * (g & 1u);
    var o: array<vec4<f32>, 4>;
    for (var i = 0u; i < 4u; i++) {
        let q = (qs[i] >> shift) & 0x0f0f0f0fu;
        o[i] = fma(u8x4(q), vec4<f32>(dm.x), vec4<f32>(dm.y));
    }
    return o;
}

// Unit u with each word loaded once; the same operations as dq16.
fn dq32(row: u32, u: u32) -> array<vec4<f32>, 8> {
    let dm = unpack2x16float(split_u32(row, 16u * split_nb(), u));
    let qs = v4(split_q(row, 16u, u, 0u));
    var o: array<vec4<f32>, 8>;
    for (var i = 0u; i < 4u; i++) {
        let q = qs[i];
        o[i] = fma(u8x4(q & 0x0f0f0f0fu), vec4<f32>(dm.x), vec4<f32>(dm.y));
        o[i + 4u] = fma(u8x4((q >> 4u) & 0x0f0f0f0fu), vec4<f32>(dm.x), vec4<f32>(dm.y));
    }
    return o;
}
