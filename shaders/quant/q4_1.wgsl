// Q4_1, 20 bytes per 32 weights: d, m (f16), qs[16] (nibbles as Q4_0);
// w = q * d + m. Blocks are word aligned.

fn dq16(row: u32, g: u32) -> array<vec4<f32>, 4> {
    let b = row + 20u * (g >> 1u);
    let dm = unpack2x16float(w[b >> 2u]);
    let shift = 4u * (g & 1u);
    var o: array<vec4<f32>, 4>;
    for (var i = 0u; i < 4u; i++) {
        let q = (w[(b >> 2u) + 1u + i] >> shift) & 0x0f0f0f0fu;
        o[i] = fma(u8x4(q), vec4<f32>(dm.x), vec4<f32>(dm.y));
    }
    return o;
}

// Unit u with each word loaded once; the same operations as dq16.
fn dq32(row: u32, u: u32) -> array<vec4<f32>, 8> {
    let b = (row + 20u * u) >> 2u;
    let dm = unpack2x16float(w[b]);
    var o: array<vec4<f32>, 8>;
    for (var i = 0u; i < 4u; i++) {
        let q = w[b + 1u + i];
        o[i] = fma(u8x4(q & 0x0f0f0f0fu), vec4<f32>(dm.x), vec4<f32>(dm.y));
        o[i + 4u] = fma(u8x4((q >> 4u) & 0x0f0f0f0fu), vec4<f32>(dm.x), vec4<f32>(dm.y));
    }
    return o;
}
