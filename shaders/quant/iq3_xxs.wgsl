// IQ3_XXS, 98 bytes per 256 weights: d (f16), qs[64] (grid indices, one per
// 4 weights, into IQ3XXS_GRID), then per 32 weights a u32 whose bits
// 7l .. 7l+6 are the sign index of weights 8l .. 8l+7 and bits 28..31 the
// scale s; w = d * (0.5 + s) * 0.5 * grid, signed. Group G (16 weights) is
// qs bytes 2 + 8*(G/2) + 4*(G%2) .. +3, with sign indices l = 2*(G%2) and
// 2*(G%2) + 1. Rows start at even offsets.

#include "gen/iq3xxs_grid.wgsl"
#include "quant/iq_signs.wgsl"

fn dq16(row: u32, g: u32) -> array<vec4<f32>, 4> {
    let b = row + 98u * (g >> 4u);
    let G = g & 15u;
    let S = G >> 1u;
    let h = G & 1u;
    let aux = wb_u32(b + 66u + 4u * S);
    let db = wb_f16(b) * (0.5 + f32(aux >> 28u)) * 0.5;
    let qs = wb_u32(b + 2u + 8u * S + 4u * h);
    var o: array<vec4<f32>, 4>;
    for (var k = 0u; k < 4u; k++) {
        let signs = ksigns((aux >> (7u * (2u * h + (k >> 1u)))) & 127u);
        let grid = IQ3XXS_GRID[(qs >> (8u * k)) & 0xffu];
        o[k] = db * signed4(u8x4(grid), signs >> (4u * (k & 1u)));
    }
    return o;
}

#include "common/dq32_pair.wgsl"
