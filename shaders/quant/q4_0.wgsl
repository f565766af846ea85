// Q4_0, 18 bytes per 32 weights: d (f16), qs[16]. Byte j: low nibble is
// weight j, high nibble weight j+16; w = (q - 8) * d. Kept in the split
// layout (common/split.wgsl): qs[16] of every block, then d.

#include "common/split.wgsl"

fn dq16(row: u32, g: u32) -> array<vec4<f32>, 4> {
    let u = g >> 1u;
    let d = split_f16(row, 16u * split_nb(), u);
    let qs = v4(split_q(row, 16u, u, 0u));
    let shift = 4u * (g & 1u);
    var o: array<vec4<f32>, 4>;
    for (var i = 0u; i < 4u; i++) {
        o[i] = (u8x4((qs[i] >> shift) & 0x0f0f0f0fu) - 8.0) * d;
    }
    return o;
}

// Unit u (weights 0..31 of block u) with each byte loaded once; the same
// operations per weight as dq16.
fn dq32(row: u32, u: u32) -> array<vec4<f32>, 8> {
    let d = split_f16(row, 16u * split_nb(), u);
    let qs = v4(split_q(row, 16u, u, 0u));
    var o: array<vec4<f32>, 8>;
    for (var i = 0u; i < 4u; i++) {
        o[i] = (u8x4(qs[i] & 0x0f0f0f0fu) - 8.0) * d;
        o[i + 4u] = (u8x4((qs[i] >> 4u) & 0x0f0f0f0fu) - 8.0) * d;
    }
    return o;
}
