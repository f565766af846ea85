// Mat-vec activations from a storage buffer (any offset and stride).

@group(0) @binding(1) var<storage, read> x: array<f32>;

fn x4(i: u32) -> vec4<f32> {
    return vec4<f32>(x[i], x[i + 1u], x[i + 2u], x[i + 3u]);
}

fn x1(i: u32) -> f32 {
    return x[i];
}
