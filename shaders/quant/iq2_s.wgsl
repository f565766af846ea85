// IQ2_S, 82 bytes per 256 weights: d (f16), qs[32] (low 8 bits of the grid
// indices, one per 8 weights), signs[32] (one bit per weight), qh[8] (bits
// 2l, 2l+1 of qh[S] are bits 8, 9 of index l of sub-block S), scales[8]
// (per 32 weights, low nibble s for the first 16, high for the rest);
// w = d * (0.5 + s) * 0.25 * IQ2S_GRID[index], signed. Group G (16 weights)
// is indices and sign bytes 4*(G/2) + 2*(G%2) and the next. Rows start at
// even offsets.

#include "gen/iq2s_grid.wgsl"
#include "quant/iq_signs.wgsl"

fn dq16(row: u32, g: u32) -> array<vec4<f32>, 4> {
    let b = row + 82u * (g >> 4u);
    let G = g & 15u;
    let S = G >> 1u;
    let h = G & 1u;
    let s = (wb_u8(b + 74u + S) >> (4u * h)) & 0xfu;
    let db = wb_f16(b) * (0.5 + f32(s)) * 0.25;
    let qs = wb_u16(b + 2u + 2u * G);
    let sg = wb_u16(b + 34u + 2u * G);
    let qh = wb_u8(b + 66u + S) >> (4u * h);
    var o: array<vec4<f32>, 4>;
    for (var k = 0u; k < 2u; k++) {
        let i = ((qs >> (8u * k)) & 0xffu) | (((qh >> (2u * k)) & 3u) << 8u);
        let signs = sg >> (8u * k);
        let c = grid_code(IQ2S_GRID[i >> 1u], i);
        o[2u * k] = db * signed4(iq2_mags(c), signs);
        o[2u * k + 1u] = db * signed4(iq2_mags(c >> 8u), signs >> 4u);
    }
    return o;
}

#include "common/dq32_pair.wgsl"
