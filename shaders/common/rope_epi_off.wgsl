// No RoPE epilogue (ROPE = off): see rope_epi_on.wgsl.

fn rope_rows(pi: u32) -> vec2<u32> {
    return vec2<u32>(0u, 0u);
}

fn rope_store(pi: u32, c: u32, v0: f32, v1: f32) {}
