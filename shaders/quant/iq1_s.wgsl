// IQ1_S, 50 bytes per 256 weights: d (f16), qs[32] (low 8 bits of the grid
// indices, one per 8 weights), qh[8] u16 (per 32 weights: bits 3l .. 3l+2
// are bits 8..10 of index l, bits 12..14 the scale s, bit 15 the sign of
// the shift delta = ±1/8); w = d * (2s + 1) * (IQ1S_GRID[index] + delta),
// the grid holding int8 weights in {-1, 0, 1}. Group G (16 weights) is
// indices 4*(G/2) + 2*(G%2) and the next. Rows start at even offsets.

#include "gen/iq1s_grid.wgsl"
#include "quant/iq1_grid.wgsl"

fn dq16(row: u32, g: u32) -> array<vec4<f32>, 4> {
    let b = row + 50u * (g >> 4u);
    let G = g & 15u;
    let qh = wb_u16(b + 34u + 2u * (G >> 1u));
    let dl = wb_f16(b) * f32(2u * ((qh >> 12u) & 7u) + 1u);
    let delta = select(IQ1_DELTA, -IQ1_DELTA, (qh & 0x8000u) != 0u);
    let qs = wb_u16(b + 2u + 2u * G);
    let hi = qh >> (6u * (G & 1u));
    var o: array<vec4<f32>, 4>;
    for (var k = 0u; k < 2u; k++) {
        let i = ((qs >> (8u * k)) & 0xffu) | (((hi >> (3u * k)) & 7u) << 8u);
        let e = iq1_entry(i, delta);
        o[2u * k] = dl * e[0];
        o[2u * k + 1u] = dl * e[1];
    }
    return o;
}

#include "common/dq32_pair.wgsl"
