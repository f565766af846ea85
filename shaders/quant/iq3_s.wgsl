// IQ3_S, 110 bytes per 256 weights: d (f16), qs[64] (low 8 bits of the
// grid indices, one per 4 weights), qh[8] (bit j of qh[S] is bit 8 of index
// j of sub-block S), signs[32] (one bit per weight), scales[4] (a nibble s
// per 32 weights); w = d * (1 + 2s) * IQ3S_GRID[index], signed. Group G
// (16 weights) is indices 4*(G%2) .. +3 of sub-block G/2: qs bytes
// 2 + 8*(G/2) + 4*(G%2), sign bytes 74 + 4*(G/2) + 2*(G%2). Rows start at
// even offsets.

#include "gen/iq3s_grid.wgsl"
#include "quant/iq_signs.wgsl"

fn dq16(row: u32, g: u32) -> array<vec4<f32>, 4> {
    let b = row + 110u * (g >> 4u);
    let G = g & 15u;
    let S = G >> 1u;
    let h = G & 1u;
    let s = (wb_u8(b + 106u + (S >> 1u)) >> (4u * (S & 1u))) & 0xfu;
    // ggml forms the odd integer 1 + 2s first.
    let db = wb_f16(b) * f32(1u + 2u * s);
    let qh = wb_u8(b + 66u + S) >> (4u * h);
    let qs = wb_u32(b + 2u + 8u * S + 4u * h);
    let sg = wb_u16(b + 74u + 4u * S + 2u * h);
    var o: array<vec4<f32>, 4>;
    for (var k = 0u; k < 4u; k++) {
        let i = ((qs >> (8u * k)) & 0xffu) | (((qh >> k) & 1u) << 8u);
        o[k] = db * signed4(u8x4(IQ3S_GRID[i]), sg >> (4u * k));
    }
    return o;
}

#include "common/dq32_pair.wgsl"
