// TQ2_0, 66 bytes per 256 weights: qs[64] (2-bit), d (f16) at the end;
// w = (q - 1) * d, q in 0..2 for ternary weights (3 decodes as 2 * d, as
// ggml's does). The 2-bit fields are ordered as Q2_K's: group G of the
// super-block reads qs bytes 32*(G/8) + 16*(G%2) .. +16, bit pair
// 2*((G%8)/2). Rows start at even offsets (66-byte blocks).

fn dq16(row: u32, g: u32) -> array<vec4<f32>, 4> {
    let b = row + 66u * (g >> 4u);
    let G = g & 15u;
    let d = wb_f16(b + 64u);
    let qs = w4_at(b + 32u * (G >> 3u) + 16u * (G & 1u));
    let shift = 2u * ((G & 7u) >> 1u);
    var o: array<vec4<f32>, 4>;
    for (var i = 0u; i < 4u; i++) {
        o[i] = (u8x4((qs[i] >> shift) & 0x03030303u) - 1.0) * d;
    }
    return o;
}

// Unit u: weights 32*(u%8) .. +32 of super-block u/8 are bit pair u%4 of
// the 32 qs bytes 32*((u%8)/4) .. +32, each loaded once; the same
// operations per weight as dq16.
fn dq32(row: u32, u: u32) -> array<vec4<f32>, 8> {
    let b = row + 66u * (u >> 3u);
    let U = u & 7u;
    let d = wb_f16(b + 64u);
    let qs = w8_at(b + 32u * (U >> 2u));
    let shift = 2u * (U & 3u);
    var o: array<vec4<f32>, 8>;
    for (var i = 0u; i < 8u; i++) {
        o[i] = (u8x4((qs[i] >> shift) & 0x03030303u) - 1.0) * d;
    }
    return o;
}
