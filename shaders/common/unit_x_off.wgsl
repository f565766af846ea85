// The 32 activations of a unit from x[xb ..], each invocation loading all.

fn unit_x(xb: u32, lane: u32) -> array<vec4<f32>, 8> {
    var o: array<vec4<f32>, 8>;
    for (var i = 0u; i < 8u; i++) {
        o[i] = x4(xb + 4u * i);
    }
    return o;
}
