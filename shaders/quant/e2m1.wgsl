// The E2M1 values of the FP4 types (MXFP4, NVFP4), doubled to integers as
// in ggml's kvalues_mxfp4; each type's scale decoder returns half its
// scale to make up for the doubling, so every product is exact.

const KV_MXFP4 = array<f32, 16>(
    0.0, 1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0,
    0.0, -1.0, -2.0, -3.0, -4.0, -6.0, -8.0, -12.0
);

// The values of the low nibbles of the four bytes of `q`.
fn mxfp4_values(q: u32) -> vec4<f32> {
    return vec4<f32>(
        KV_MXFP4[q & 0xfu],
        KV_MXFP4[(q >> 8u) & 0xfu],
        KV_MXFP4[(q >> 16u) & 0xfu],
        KV_MXFP4[(q >> 24u) & 0xfu]
    );
}
