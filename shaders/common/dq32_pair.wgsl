// dq32 for a type without a whole-unit decoder of its own: the unit's two
// halves from dq16.

fn dq32(row: u32, u: u32) -> array<vec4<f32>, 8> {
    let a = dq16(row, 2u * u);
    let b = dq16(row, 2u * u + 1u);
    return array<vec4<f32>, 8>(a[0], a[1], a[2], a[3], b[0], b[1], b[2], b[3]);
}
