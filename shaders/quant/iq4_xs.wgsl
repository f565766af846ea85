// IQ4_XS, 136 bytes per 256 weights: d (f16), scales_h (u16), scales_l[4],
// qs[128]. Sub-block S (32 weights): six-bit scale
// ls = (scales_l[S/2] >> 4*(S%2)) & 15 | ((scales_h >> 2S) & 3) << 4,
// qs bytes 16S .. +16 (low nibble weights 0..15, high 16..31) indexing
// kvalues_iq4nl; w = d * (ls - 32) * kv[q]. Word aligned.

const KV_IQ4NL = array<f32, 16>(
    -127.0, -104.0, -83.0, -65.0, -49.0, -35.0, -22.0, -10.0,
    1.0, 13.0, 25.0, 38.0, 53.0, 69.0, 89.0, 113.0
);

fn iq4_values(q: u32) -> vec4<f32> {
    return vec4<f32>(
        KV_IQ4NL[q & 0xfu],
        KV_IQ4NL[(q >> 8u) & 0xfu],
        KV_IQ4NL[(q >> 16u) & 0xfu],
        KV_IQ4NL[(q >> 24u) & 0xfu]
    );
}

fn dq16(row: u32, g: u32) -> array<vec4<f32>, 4> {
    let b = row + 136u * (g >> 4u);
    let S = (g & 15u) >> 1u;
    let head = w[b >> 2u];
    let d = unpack2x16float(head).x;
    let sh = head >> 16u;
    let ls = ((wb_u8(b + 4u + (S >> 1u)) >> (4u * (S & 1u))) & 0xfu) | (((sh >> (2u * S)) & 3u) << 4u);
    let dl = d * f32(i32(ls) - 32);
    let qw = (b + 8u + 16u * S) >> 2u;
    let shift = 4u * (g & 1u);
    var o: array<vec4<f32>, 4>;
    for (var i = 0u; i < 4u; i++) {
        o[i] = dl * iq4_values(w[qw + i] >> shift);
    }
    return o;
}

#include "common/dq32_pair.wgsl"
