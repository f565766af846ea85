// Q5_1, 24 bytes per 32 weights: d, m (f16), qh (u32 of fifth bits), qs[16];
// w = q5 * d + m. Blocks are word aligned.

fn dq16(row: u32, g: u32) -> array<vec4<f32>, 4> {
    let b = (row + 24u * (g >> 1u)) >> 2u;
    let dm = unpack2x16float(w[b]);
    let half = g & 1u;
    let qh = w[b + 1u] >> (16u * half);
    var o: array<vec4<f32>, 4>;
    for (var i = 0u; i < 4u; i++) {
        let q = (w[b + 2u + i] >> (4u * half)) & 0x0f0f0f0fu;
        let hb = qh >> (4u * i);
        let h = (hb & 1u) | ((hb & 2u) << 7u) | ((hb & 4u) << 14u) | ((hb & 8u) << 21u);
        o[i] = fma(u8x4(q | (h << 4u)), vec4<f32>(dm.x), vec4<f32>(dm.y));
    }
    return o;
}

// Unit u with each word loaded once; the same operations as dq16.
fn dq32(row: u32, u: u32) -> array<vec4<f32>, 8> {
    let b = (row + 24u * u) >> 2u;
    let dm = unpack2x16float(w[b]);
    let qh = w[b + 1u];
    var o: array<vec4<f32>, 8>;
    for (var half = 0u; half < 2u; half++) {
        let qhh = qh >> (16u * half);
        for (var i = 0u; i < 4u; i++) {
            let q = (w[b + 2u + i] >> (4u * half)) & 0x0f0f0f0fu;
            let hb = qhh >> (4u * i);
            let h = (hb & 1u) | ((hb & 2u) << 7u) | ((hb & 4u) << 14u) | ((hb & 8u) << 21u);
            o[4u * half + i] = fma(u8x4(q | (h << 4u)), vec4<f32>(dm.x), vec4<f32>(dm.y));
        }
    }
    return o;
}
