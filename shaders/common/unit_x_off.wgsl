// A unit's 32 activations (elements k0 .. of column c's row from x[xb ..],
// for the norm prologue), each invocation loading all; vec4 i of them.

alias XPart = array<vec4<f32>, 8>;

fn unit_x_part(xb: u32, k0: u32, c: u32, lane: u32) -> XPart {
    var o: XPart;
    for (var i = 0u; i < 8u; i++) {
        o[i] = xn4(xb + 4u * i, k0 + 4u * i, c);
    }
    return o;
}

fn unit_x_at(part: XPart, i: u32) -> vec4<f32> {
    return part[i];
}

fn unit_x_all(part: XPart) -> array<vec4<f32>, 8> {
    return part;
}
