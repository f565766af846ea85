// Q3_K, 110 bytes per 256 weights: hmask[32] (third bits), qs[64] (low 2
// bits), scales[12] (16 six-bit scales, packed), d (f16) at the end;
// w = d * (sc - 32) * (q2 - (hbit ? 0 : 4)). Group G: qs bytes
// 32*(G/8) + 16*(G%2) .. +16 with bit pair 2*((G%8)/2); hmask bytes
// 16*(G%2) .. +16 with bit 4*(G/8) + (G%8)/2; scale G is the low nibble
// (G < 8) or high nibble (G >= 8) of scales[G % 8], with bits 4..5 taken
// from scales[8 + G % 4] >> 2*(G/4) (ggml's kmask unpacking, spelled out).

fn dq16(row: u32, g: u32) -> array<vec4<f32>, 4> {
    let b = row + 110u * (g >> 4u);
    let G = g & 15u;
    let d = wb_f16(b + 108u);
    let lo = (wb_u8(b + 96u + (G & 7u)) >> (4u * (G >> 3u))) & 0xfu;
    let hi = (wb_u8(b + 104u + (G & 3u)) >> (2u * (G >> 2u))) & 3u;
    let dl = d * f32(i32(lo | (hi << 4u)) - 32);
    let half = 16u * (G & 1u);
    let qb = b + 32u + 32u * (G >> 3u) + half;
    let shift = 2u * ((G & 7u) >> 1u);
    let hbit = 4u * (G >> 3u) + ((G & 7u) >> 1u);
    var o: array<vec4<f32>, 4>;
    for (var i = 0u; i < 4u; i++) {
        let q = (wb_u32(qb + 4u * i) >> shift) & 0x03030303u;
        let h = (wb_u32(b + half + 4u * i) >> hbit) & 0x01010101u;
        o[i] = dl * (u8x4(q | (h << 2u)) - 4.0);
    }
    return o;
}

#include "common/dq32_pair.wgsl"
