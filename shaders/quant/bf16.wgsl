// BF16 rows: 2 bytes per weight, the upper half of an f32 (widening is exact).

fn dq16(row: u32, g: u32) -> array<vec4<f32>, 4> {
    let b = row + 32u * g;
    var o: array<vec4<f32>, 4>;
    for (var i = 0u; i < 4u; i++) {
        let a = wb_u32(b + 8u * i);
        let c = wb_u32(b + 8u * i + 4u);
        o[i] = vec4<f32>(
            bitcast<f32>(a << 16u),
            bitcast<f32>(a & 0xffff0000u),
            bitcast<f32>(c << 16u),
            bitcast<f32>(c & 0xffff0000u)
        );
    }
    return o;
}

#include "common/dq32_pair.wgsl"
