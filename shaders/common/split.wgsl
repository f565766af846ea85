// The split row layout of the small-block types (crates/gpu/src/quant.rs,
// `split_fields`): a row at byte `row` (a multiple of 16) holds its NB
// blocks' quant bytes first, QB per block, then each header field of every
// block in turn. The including kernel's parameters `p` give the row length
// p.k, hence NB.

fn split_nb() -> u32 {
    return p.k / 32u;
}

// The vec4 word `i` of block u's quants (QB = 16 or 32 bytes per block).
fn split_q(row: u32, qb: u32, u: u32, i: u32) -> vec4<u32> {
    return w4[((row + qb * u) >> 4u) + i];
}

// Block u's 4-byte field of the run starting `run` bytes into the row.
fn split_u32(row: u32, run: u32, u: u32) -> u32 {
    return w[((row + run) >> 2u) + u];
}

// Block u's f16 field of the run starting `run` bytes into the row.
fn split_f16(row: u32, run: u32, u: u32) -> f32 {
    return wb_f16(row + run + 2u * u);
}

fn v4(q: vec4<u32>) -> array<u32, 4> {
    return array<u32, 4>(q.x, q.y, q.z, q.w);
}
