// Q2_K, 84 bytes per 256 weights: scales[16] (per 16 weights: low nibble
// scale, high nibble min), qs[64] (2-bit), d, dmin (f16) at the end;
// w = d * sc * q - dmin * m. Group G of the super-block: qs bytes
// 32*(G/8) + 16*(G%2) .. +16, bit pair 2*((G%8)/2); scales[G]. Word aligned.

fn dq16(row: u32, g: u32) -> array<vec4<f32>, 4> {
    let b = row + 84u * (g >> 4u);
    let G = g & 15u;
    let dm = unpack2x16float(w[(b + 80u) >> 2u]);
    let sc = wb_u8(b + G);
    let dl = dm.x * f32(sc & 0xfu);
    let ml = dm.y * f32(sc >> 4u);
    let qw = (b + 16u + 32u * (G >> 3u) + 16u * (G & 1u)) >> 2u;
    let shift = 2u * ((G & 7u) >> 1u);
    var o: array<vec4<f32>, 4>;
    for (var i = 0u; i < 4u; i++) {
        let q = (w[qw + i] >> shift) & 0x03030303u;
        o[i] = fma(u8x4(q), vec4<f32>(dl), vec4<f32>(-ml));
    }
    return o;
}

#include "common/dq32_pair.wgsl"
