// The RoPE rotation, shared by rope_kv.wgsl and the mat-vec's RoPE epilogue
// (common/rope_epi_on.wgsl) so both give the same bits: pair i of a head
// (elements a, b: 2i and 2i + 1, or i and i + n_rot / 2 for neox) turns by
// pos * base^(-2i / n_rot) when 2i < n_rot; the rest pass through.

const TAU: f32 = 6.283185307179586;

// The pair's elements within its head.
fn rope_pair(i: u32, n_rot: u32, neox: bool) -> vec2<u32> {
    if (neox && 2u * i < n_rot) {
        return vec2<u32>(i, i + n_rot / 2u);
    }
    return vec2<u32>(2u * i, 2u * i + 1u);
}

// Pair i's frequency divisor: word ff_at + i of the token table `tab` (the
// includer's binding) holds it as f32 bits; ff_at = 0xffffffff: none (1).
fn rope_factor(ff_at: u32, i: u32) -> f32 {
    if (ff_at == 0xffffffffu) {
        return 1.0;
    }
    return bitcast<f32>(tab[ff_at + i]);
}

// (x0, x1) rotated for pair i at position pos: by scale * (pos * base^(-2i /
// n_rot) / ff), ggml's order for linear scaling and per-pair factors, with
// the cosine and sine times mscale (LongRoPE's attention factor); a scale,
// a factor and an mscale of 1 change no bit.
fn rope_rotate(
    x0: f32,
    x1: f32,
    pos: u32,
    i: u32,
    n_rot: u32,
    freq_base: f32,
    ff: f32,
    scale: f32,
    mscale: f32,
) -> vec2<f32> {
    let inv_freq = exp2(-2.0 * f32(i) / f32(n_rot) * log2(freq_base));
    var theta = scale * (f32(pos) * inv_freq / ff);
    // Keep the argument in [-pi, pi], where WGSL bounds the error of cos/sin.
    theta = theta - TAU * round(theta / TAU);
    let c = cos(theta) * mscale;
    let s = sin(theta) * mscale;
    return vec2<f32>(x0 * c - x1 * s, x0 * s + x1 * c);
}
