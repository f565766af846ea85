// F16 rows: 2 bytes per weight (rows of odd length start at 2 mod 4).

fn dq16(row: u32, g: u32) -> array<vec4<f32>, 4> {
    let b = row + 32u * g;
    var o: array<vec4<f32>, 4>;
    for (var i = 0u; i < 4u; i++) {
        let a = wb_u32(b + 8u * i);
        let c = wb_u32(b + 8u * i + 4u);
        o[i] = vec4<f32>(unpack2x16float(a), unpack2x16float(c));
    }
    return o;
}

#include "common/dq32_pair.wgsl"
