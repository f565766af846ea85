// A unit's 32 activations (elements k0 .. of column c's row from x[xb ..],
// for the norm prologue) shared across a subgroup: each invocation loads
// one vec4 (its lane % 8), and vec4 i of the unit is invocation i's, handed
// to all. The same values as unit_x_off.wgsl, the norm applied once per
// value. Every invocation of the subgroup must call both together.

alias XPart = vec4<f32>;

fn unit_x_part(xb: u32, k0: u32, c: u32, lane: u32) -> XPart {
    let q = 4u * (lane & 7u);
    return xn4(xb + q, k0 + q, c);
}

fn unit_x_at(part: XPart, i: u32) -> vec4<f32> {
    return subgroupShuffle(part, i);
}

// All 8 vec4s of the unit from the parts, by constant broadcasts (which a
// CPU-backed device turns into one permute each).
fn unit_x_all(part: XPart) -> array<vec4<f32>, 8> {
    return array<vec4<f32>, 8>(
        subgroupBroadcast(part, 0u),
        subgroupBroadcast(part, 1u),
        subgroupBroadcast(part, 2u),
        subgroupBroadcast(part, 3u),
        subgroupBroadcast(part, 4u),
        subgroupBroadcast(part, 5u),
        subgroupBroadcast(part, 6u),
        subgroupBroadcast(part, 7u),
    );
}
