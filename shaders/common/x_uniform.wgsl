// Mat-vec activations from a uniform buffer of {{XU}} vec4s, bound from an
// aligned offset of the activation tensor (ops/matmul.rs): for kernels in
// which every invocation reads the same activation at the same time, which
// a CPU-backed device then loads once for all its SIMD lanes. Offsets,
// strides and row lengths are multiples of 4 here.

@group(0) @binding(1) var<uniform> x: array<vec4<f32>, {{XU}}>;

fn x4(i: u32) -> vec4<f32> {
    return x[i >> 2u];
}

fn x1(i: u32) -> f32 {
    return x[i >> 2u][i & 3u];
}
