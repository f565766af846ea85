// Mat-vec activations from a storage buffer viewed as vec4s: offsets,
// strides and row lengths are multiples of 4 (ops/matmul.rs checks), so
// four values are one load rather than four.

@group(0) @binding(1) var<storage, read> x: array<vec4<f32>>;

fn x4(i: u32) -> vec4<f32> {
    return x[i >> 2u];
}

fn x1(i: u32) -> f32 {
    return x[i >> 2u][i & 3u];
}
