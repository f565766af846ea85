// The 32 activations of a unit from x[xb ..] (elements k0 .. of column
// c's row, for the norm prologue), one vec4 per subgroup invocation
// (lane % 8) broadcast to all: the same values as unit_x_off.wgsl, and the
// norm applied before the broadcast, once per value. Every invocation of
// the subgroup must call it together.

fn unit_x(xb: u32, k0: u32, c: u32, lane: u32) -> array<vec4<f32>, 8> {
    let q = 4u * (lane & 7u);
    let mine = xn4(xb + q, k0 + q, c);
    return array<vec4<f32>, 8>(
        subgroupBroadcast(mine, 0u),
        subgroupBroadcast(mine, 1u),
        subgroupBroadcast(mine, 2u),
        subgroupBroadcast(mine, 3u),
        subgroupBroadcast(mine, 4u),
        subgroupBroadcast(mine, 5u),
        subgroupBroadcast(mine, 6u),
        subgroupBroadcast(mine, 7u),
    );
}
