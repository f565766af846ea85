// Sub-block S's (scale, min) from a super-block's first vec4 word `hd`
// (d, dmin, then the 12 scale bytes: ggml's get_scale_min_k4 packing).
fn scale_min_hd(hd: vec4<u32>, S: u32) -> vec2<f32> {
    let sh = 8u * (S & 3u);
    if (S < 4u) {
        return vec2<f32>(f32((hd.y >> sh) & 63u), f32((hd.z >> sh) & 63u));
    }
    let a = (hd.w >> sh) & 0xffu;
    let sc = (a & 0xfu) | ((((hd.y >> sh) & 0xffu) >> 6u) << 4u);
    let m = (a >> 4u) | ((((hd.z >> sh) & 0xffu) >> 6u) << 4u);
    return vec2<f32>(f32(sc), f32(m));
}
