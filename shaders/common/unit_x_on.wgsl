// The 32 activations of a unit from x[xb ..], one vec4 per subgroup
// invocation (lane % 8) broadcast to all: the same values as unit_x_off.wgsl.
// Every invocation of the subgroup must call it together.

fn unit_x(xb: u32, lane: u32) -> array<vec4<f32>, 8> {
    let mine = x4(xb + 4u * (lane & 7u));
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
