// IQ4_NL, 18 bytes per 32 weights: d (f16), qs[16] (nibbles ordered as
// Q4_0) indexing the non-linear table kvalues_iq4nl; w = d * kv[q]. Kept in
// the split layout (common/split.wgsl): qs[16] of every block, then d.

#include "common/split.wgsl"

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
    let u = g >> 1u;
    let d = split_f16(row, 16u * split_nb(), u);
    let qs = v4(split_q(row, 16u, u, 0u));
    let shift = 4u * (g & 1u);
    var o: array<vec4<f32>, 4>;
    for (var i = 0u; i < 4u; i++) {
        o[i] = d * iq4_values(qs[i] >> shift);
    }
    return o;
}

// Unit u with each byte loaded once; the same operations as dq16.
fn dq32(row: u32, u: u32) -> array<vec4<f32>, 8> {
    let d = split_f16(row, 16u * split_nb(), u);
    let qs = v4(split_q(row, 16u, u, 0u));
    var o: array<vec4<f32>, 8>;
    for (var i = 0u; i < 4u; i++) {
        o[i] = d * iq4_values(qs[i]);
        o[i + 4u] = d * iq4_values(qs[i] >> 4u);
    }
    return o;
}
