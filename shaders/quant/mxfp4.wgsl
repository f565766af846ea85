// MXFP4, 17 bytes per 32 weights: e (E8M0 exponent), qs[16] (nibbles
// ordered as Q4_0) indexing the E2M1 values, doubled to integers as in
// ggml's kvalues_mxfp4; w = kv[q] * 2^(e - 128), the half scale making up
// for the doubling, so every product is exact. Kept in the split layout
// (common/split.wgsl): qs[16] of every block, then the e bytes, since
// 17-byte blocks would put most quants and scales at odd offsets.

#include "common/split.wgsl"

#include "quant/e2m1.wgsl"

// 2^(e - 128) from its f32 bits (ggml_e8m0_to_fp32_half): e = 0 and 1 are
// the subnormals 2^-128 and 2^-127, e = 255 reads as 2^127.
fn e8m0_half(row: u32, u: u32) -> f32 {
    let e = wb_u8(row + 16u * split_nb() + u);
    return bitcast<f32>(select((e - 1u) << 23u, 0x00200000u << e, e < 2u));
}

fn dq16(row: u32, g: u32) -> array<vec4<f32>, 4> {
    let u = g >> 1u;
    let d = e8m0_half(row, u);
    let qs = v4(split_q(row, 16u, u, 0u));
    let shift = 4u * (g & 1u);
    var o: array<vec4<f32>, 4>;
    for (var i = 0u; i < 4u; i++) {
        o[i] = mxfp4_values(qs[i] >> shift) * d;
    }
    return o;
}

// Unit u with each byte loaded once; the same operations as dq16.
fn dq32(row: u32, u: u32) -> array<vec4<f32>, 8> {
    let d = e8m0_half(row, u);
    let qs = v4(split_q(row, 16u, u, 0u));
    var o: array<vec4<f32>, 8>;
    for (var i = 0u; i < 4u; i++) {
        o[i] = mxfp4_values(qs[i]) * d;
        o[i + 4u] = mxfp4_values(qs[i] >> 4u) * d;
    }
    return o;
}
