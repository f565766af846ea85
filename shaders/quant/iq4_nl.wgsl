// IQ4_NL, 18 bytes per 32 weights: d (f16), qs[16] (nibbles ordered as
// Q4_0) indexing the non-linear table kvalues_iq4nl; w = d * kv[q].

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
    let b = row + 18u * (g >> 1u);
    let d = wb_f16(b);
    let shift = 4u * (g & 1u);
    var o: array<vec4<f32>, 4>;
    for (var i = 0u; i < 4u; i++) {
        o[i] = d * iq4_values(wb_u32(b + 2u + 4u * i) >> shift);
    }
    return o;
}

#include "common/dq32_pair.wgsl"
