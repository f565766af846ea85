// TQ1_0, 54 bytes per 256 weights: qs[48] (5 trits per byte), qh[4] (4
// trits per byte), d (f16) at the end; w = (t - 1) * d. A byte holds its
// trits as a base-3 fraction of 256: trit n of byte q is
// ((q * 3^n mod 256) * 3) >> 8. Weights 0..159 are trit n = w/32 of qs
// byte w%32, 160..239 trit n = (w-160)/16 of qs byte 32 + w%16, 240..255
// trit n = (w-240)/4 of qh byte w%4. So group G < 10 reads qs bytes
// 16*(G%2) .. +16 at trit G/2, 10 <= G < 15 bytes 32 .. 48 at trit G-10,
// and G = 15 qh's four bytes at trit i for its weights 4i .. 4i+3. Rows
// start at even offsets (54-byte blocks).

const POW3 = array<u32, 5>(1u, 3u, 9u, 27u, 81u);

// Trit n (multiplier p = 3^n) of each byte of `q`, minus 1.
fn trits(q: u32, p: u32) -> vec4<f32> {
    let b = vec4<u32>(q & 0xffu, (q >> 8u) & 0xffu, (q >> 16u) & 0xffu, q >> 24u);
    let r = (b * p) & vec4<u32>(0xffu);
    return vec4<f32>((r * 3u) >> vec4<u32>(8u)) - 1.0;
}

fn dq16(row: u32, g: u32) -> array<vec4<f32>, 4> {
    let b = row + 54u * (g >> 4u);
    let G = g & 15u;
    let d = wb_f16(b + 52u);
    var o: array<vec4<f32>, 4>;
    if G == 15u {
        let qh = wb_u32(b + 48u);
        for (var i = 0u; i < 4u; i++) {
            o[i] = trits(qh, POW3[i]) * d;
        }
        return o;
    }
    let hi = G >= 10u;
    let qs = w4_at(b + select(16u * (G & 1u), 32u, hi));
    let p = POW3[select(G >> 1u, G - 10u, hi)];
    for (var i = 0u; i < 4u; i++) {
        o[i] = trits(qs[i], p) * d;
    }
    return o;
}

#include "common/dq32_pair.wgsl"
