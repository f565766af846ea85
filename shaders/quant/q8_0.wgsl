// Q8_0, 34 bytes per 32 weights: d (f16), qs[32] int8; w = q * d. Kept in
// the split layout (common/split.wgsl): qs[32] of every block, then d.

#include "common/split.wgsl"

fn dq16(row: u32, g: u32) -> array<vec4<f32>, 4> {
    let u = g >> 1u;
    let d = split_f16(row, 32u * split_nb(), u);
    let qs = v4(split_q(row, 32u, u, g & 1u));
    var o: array<vec4<f32>, 4>;
    for (var i = 0u; i < 4u; i++) {
        o[i] = i8x4(qs[i]) * d;
    }
    return o;
}

// Unit u with each byte loaded once; the same operations as dq16.
fn dq32(row: u32, u: u32) -> array<vec4<f32>, 8> {
    let d = split_f16(row, 32u * split_nb(), u);
    var o: array<vec4<f32>, 8>;
    for (var h = 0u; h < 2u; h++) {
        let qs = v4(split_q(row, 32u, u, h));
        for (var i = 0u; i < 4u; i++) {
            o[4u * h + i] = i8x4(qs[i]) * d;
        }
    }
    return o;
}
