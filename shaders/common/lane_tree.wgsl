// The canonical combination of the 32 lane partials of one output, read
// from workgroup memory `wgmem[base .. base + 32]`: the pairwise tree
//     v[l] = v[l] + v[l + s]  for s = 16, 8, 4, 2, 1 (all l < s),  result v[0]
// evaluated by one invocation, so a reduction needs one barrier instead of
// one per level. Every mat-vec and mat-mul variant ends with this function.

fn lane_tree(base: u32) -> f32 {
    var v: array<f32, 16>;
    for (var l = 0u; l < 16u; l++) {
        v[l] = wgmem[base + l] + wgmem[base + l + 16u];
    }
    for (var s = 8u; s > 0u; s >>= 1u) {
        for (var l = 0u; l < s; l++) {
            v[l] = v[l] + v[l + s];
        }
    }
    return v[0];
}
