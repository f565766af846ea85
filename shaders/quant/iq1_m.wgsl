// IQ1_M, 56 bytes per 256 weights: qs[32] (low 8 bits of the grid indices,
// one per 8 weights), qh[16] (a nibble per index: bits 0..2 are index bits
// 8..10, bit 3 the sign of delta = ±1/8), scales: four u16 holding 3-bit
// scales s (per 16 weights: bits 6*(S%2) + 3*(G%2) of word S/2 for group G
// of sub-block S) under top nibbles that together are the f16 d (word j's
// nibble is bits 4j .. 4j+3 of d); w = d * (2s + 1) * (IQ1S_GRID[index] +
// delta). Group G (16 weights) is indices 2G and 2G + 1, with the nibbles of
// qh[G]. Rows start at even offsets.

#include "gen/iq1s_grid.wgsl"
#include "quant/iq1_grid.wgsl"

fn dq16(row: u32, g: u32) -> array<vec4<f32>, 4> {
    let b = row + 56u * (g >> 4u);
    let G = g & 15u;
    let sa = wb_u32(b + 48u);
    let sb = wb_u32(b + 52u);
    let d_bits = ((sa >> 12u) & 0xfu) | ((sa >> 24u) & 0xf0u)
        | ((sb >> 4u) & 0xf00u) | ((sb >> 16u) & 0xf000u);
    let d = unpack2x16float(d_bits).x;
    let S = G >> 1u;
    let word = select(sa, sb, S >= 4u) >> (16u * ((S >> 1u) & 1u));
    let s = (word >> (6u * (S & 1u) + 3u * (G & 1u))) & 7u;
    let dl = d * f32(2u * s + 1u);
    let qs = wb_u16(b + 2u * G);
    let qh = wb_u8(b + 32u + G);
    var o: array<vec4<f32>, 4>;
    for (var k = 0u; k < 2u; k++) {
        let nib = (qh >> (4u * k)) & 0xfu;
        let i = ((qs >> (8u * k)) & 0xffu) | ((nib & 7u) << 8u);
        let e = iq1_entry(i, select(IQ1_DELTA, -IQ1_DELTA, (nib & 8u) != 0u));
        o[2u * k] = dl * e[0];
        o[2u * k + 1u] = dl * e[1];
    }
    return o;
}

#include "common/dq32_pair.wgsl"
