// The 32 activations of a unit from x[xb ..] (elements k0 .. of column
// c's row, for the norm prologue), each invocation loading all.

fn unit_x(xb: u32, k0: u32, c: u32, lane: u32) -> array<vec4<f32>, 8> {
    var o: array<vec4<f32>, 8>;
    for (var i = 0u; i < 8u; i++) {
        o[i] = xn4(xb + 4u * i, k0 + 4u * i, c);
    }
    return o;
}
