// Q8_0, 34 bytes per 32 weights: d (f16), qs[32] int8; w = q * d.

fn dq16(row: u32, g: u32) -> array<vec4<f32>, 4> {
    let b = row + 34u * (g >> 1u);
    let d = wb_f16(b);
    let qb = b + 2u + 16u * (g & 1u);
    var o: array<vec4<f32>, 4>;
    for (var i = 0u; i < 4u; i++) {
        o[i] = i8x4(wb_u32(qb + 4u * i)) * d;
    }
    return o;
}

// Unit u with each byte loaded once; the same operations as dq16.
fn dq32(row: u32, u: u32) -> array<vec4<f32>, 8> {
    let b = row + 34u * u;
    let d = wb_f16(b);
    let qs = w8_at(b + 2u);
    var o: array<vec4<f32>, 8>;
    for (var i = 0u; i < 8u; i++) {
        o[i] = i8x4(qs[i]) * d;
    }
    return o;
}
