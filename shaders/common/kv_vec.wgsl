// The attention kernels' cache loads for f32 and f16 caches: vec4 i of the
// keys or values (vec4 i holds values 4i .. 4i + 3), widened to f32.

fn k4(i: u32) -> vec4<f32> {
    return vec4<f32>(k[i]);
}

fn v4(i: u32) -> vec4<f32> {
    return vec4<f32>(v[i]);
}
