// Q5_0, 22 bytes per 32 weights: d (f16), qh (32 fifth bits, bit j is
// weight j), qs[16] (nibbles as Q4_0); w = (q5 - 16) * d.

fn dq16(row: u32, g: u32) -> array<vec4<f32>, 4> {
    let b = row + 22u * (g >> 1u);
    let d = wb_f16(b);
    let half = g & 1u;
    let qh = wb_u32(b + 2u) >> (16u * half);
    var o: array<vec4<f32>, 4>;
    for (var i = 0u; i < 4u; i++) {
        let q = (wb_u32(b + 6u + 4u * i) >> (4u * half)) & 0x0f0f0f0fu;
        let hb = qh >> (4u * i);
        let h = (hb & 1u) | ((hb & 2u) << 7u) | ((hb & 4u) << 14u) | ((hb & 8u) << 21u);
        o[i] = (u8x4(q | (h << 4u)) - 16.0) * d;
    }
    return o;
}

// Unit u with each byte loaded once; the same operations as dq16.
fn dq32(row: u32, u: u32) -> array<vec4<f32>, 8> {
    let b = row + 22u * u;
    let d = wb_f16(b);
    let qh = wb_u32(b + 2u);
    let qs = w4_at(b + 6u);
    var o: array<vec4<f32>, 8>;
    for (var half = 0u; half < 2u; half++) {
        let qhh = qh >> (16u * half);
        for (var i = 0u; i < 4u; i++) {
            let q = (qs[i] >> (4u * half)) & 0x0f0f0f0fu;
            let hb = qhh >> (4u * i);
            let h = (hb & 1u) | ((hb & 2u) << 7u) | ((hb & 4u) << 14u) | ((hb & 8u) << 21u);
            o[4u * half + i] = (u8x4(q | (h << 4u)) - 16.0) * d;
        }
    }
    return o;
}
