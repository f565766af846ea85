// NVFP4, 36 bytes per 64 weights: d[4] (one unsigned E4M3 scale per 16
// weights), qs[32] (per 16 weights 8 bytes: weights 0..7 in the low
// nibbles, 8..15 in the high ones) indexing the E2M1 values; w = kv[q] * d.
// Group g (16 weights) is scale byte g%4 and qs bytes 4 + 8*(g%4) .. +8 of
// block g/4: two aligned words, the blocks being 4-byte multiples.

#include "quant/e2m1.wgsl"

// Half an unsigned E4M3 scale, bias 7 (ggml_ue4m3_to_fp32, halved for the
// doubled E2M1 values): 0x7f, E4M3's NaN, reads as 0, and bit 7 is not part
// of the format (it falls outside the exponent mask). Every step is exact.
fn ue4m3_half(x: u32) -> f32 {
    let e = (x >> 3u) & 0xfu;
    let m = f32(x & 7u);
    // 2^(e - 7) and 2^-9 from their f32 bits, as on the CPU.
    let raw = select((1.0 + m / 8.0) * bitcast<f32>((120u + e) << 23u), m * bitcast<f32>(118u << 23u), e == 0u);
    return select(raw * 0.5, 0.0, x == 0u || x == 0x7fu);
}

fn dq16(row: u32, g: u32) -> array<vec4<f32>, 4> {
    let b = row + 36u * (g >> 2u);
    let s = g & 3u;
    let d = ue4m3_half(wb_u8(b + s));
    let qw = (b + 4u + 8u * s) >> 2u;
    let q0 = w[qw];
    let q1 = w[qw + 1u];
    return array<vec4<f32>, 4>(
        mxfp4_values(q0) * d,
        mxfp4_values(q1) * d,
        mxfp4_values(q0 >> 4u) * d,
        mxfp4_values(q1 >> 4u) * d
    );
}

#include "common/dq32_pair.wgsl"
