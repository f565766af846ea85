// F32 rows: 4 bytes per weight. Every quant/*.wgsl file defines
//     fn dq16(row: u32, g: u32) -> array<vec4<f32>, 4>
// returning weights 16g .. 16g+15 of the row whose first byte is `row`.
// Float rows may end inside a group; the lanes past the end hold whatever
// follows and are never used.

fn dq16(row: u32, g: u32) -> array<vec4<f32>, 4> {
    let i0 = (row >> 2u) + 16u * g;
    var o: array<vec4<f32>, 4>;
    for (var i = 0u; i < 4u; i++) {
        let j = i0 + 4u * i;
        o[i] = vec4<f32>(
            bitcast<f32>(w[j]),
            bitcast<f32>(w[j + 1u]),
            bitcast<f32>(w[j + 2u]),
            bitcast<f32>(w[j + 3u])
        );
    }
    return o;
}

#include "common/dq32_pair.wgsl"
