// IQ2_XS, 74 bytes per 256 weights: d (f16), qs[32] u16 (per 8 weights: a
// 9-bit index into IQ2XS_GRID, then a 7-bit sign index), scales[8] (per 32
// weights, the low nibble s for its first 16 weights and the high nibble
// for the rest); w = d * (0.5 + s) * 0.25 * grid, signed. Group G (16
// weights) is qs entries 4*(G/2) + 2*(G%2) and the next, with nibble G%2 of
// scales[G/2]. Rows start at even offsets.

#include "gen/iq2xs_grid.wgsl"
#include "quant/iq_signs.wgsl"

fn dq16(row: u32, g: u32) -> array<vec4<f32>, 4> {
    let b = row + 74u * (g >> 4u);
    let G = g & 15u;
    let s = (wb_u8(b + 66u + (G >> 1u)) >> (4u * (G & 1u))) & 0xfu;
    let db = wb_f16(b) * (0.5 + f32(s)) * 0.25;
    let qs = wb_u32(b + 2u + 4u * G);
    var o: array<vec4<f32>, 4>;
    for (var k = 0u; k < 2u; k++) {
        let q = (qs >> (16u * k)) & 0xffffu;
        let c = grid_code(IQ2XS_GRID[(q & 511u) >> 1u], q);
        let signs = ksigns(q >> 9u);
        o[2u * k] = db * signed4(iq2_mags(c), signs);
        o[2u * k + 1u] = db * signed4(iq2_mags(c >> 8u), signs >> 4u);
    }
    return o;
}

#include "common/dq32_pair.wgsl"
