// IQ2_XXS, 66 bytes per 256 weights: d (f16), then per 32 weights 8 bytes:
// four grid indices (one per 8 weights, into IQ2XXS_GRID, packed as
// grids.rs describes) and a u32 whose
// bits 7l .. 7l+6 are the sign index of entry l and bits 28..31 the scale s;
// w = d * (0.5 + s) * 0.25 * grid, signed. Group G (16 weights) is entries
// 2*(G%2) and 2*(G%2) + 1 of sub-block G/2. Rows start at even offsets.

#include "gen/iq2xxs_grid.wgsl"
#include "quant/iq_signs.wgsl"

fn dq16(row: u32, g: u32) -> array<vec4<f32>, 4> {
    let b = row + 66u * (g >> 4u);
    let G = g & 15u;
    let h = G & 1u;
    let q = b + 2u + 8u * (G >> 1u);
    let idx = wb_u16(q + 2u * h);
    let aux = wb_u32(q + 4u);
    let db = wb_f16(b) * (0.5 + f32(aux >> 28u)) * 0.25;
    var o: array<vec4<f32>, 4>;
    for (var k = 0u; k < 2u; k++) {
        let i = (idx >> (8u * k)) & 0xffu;
        let c = grid_code(IQ2XXS_GRID[i >> 1u], i);
        let s = ksigns((aux >> (7u * (2u * h + k))) & 127u);
        o[2u * k] = db * signed4(iq2_mags(c), s);
        o[2u * k + 1u] = db * signed4(iq2_mags(c >> 8u), s >> 4u);
    }
    return o;
}

#include "common/dq32_pair.wgsl"
