// The 1-bit types' grid entries, shifted.

// ggml's IQ1S_DELTA and IQ1M_DELTA.
const IQ1_DELTA: f32 = 0.125;

// Grid entry i (8 int8 weights in {-1, 0, 1}, packed as 2-bit codes c with
// weight c - 1, crates/gpu/src/grids.rs IQ1_LEVELS) plus `delta`, as
// weights 0..3 and 4..7. The sums are exact, so dl * (g + delta) rounds
// once, as on the CPU.
fn iq1_entry(i: u32, delta: f32) -> array<vec4<f32>, 2> {
    let c = (IQ1S_GRID[i >> 1u] >> (16u * (i & 1u))) & 0xffffu;
    let lo = vec4<f32>((vec4<u32>(c) >> vec4<u32>(0u, 2u, 4u, 6u)) & vec4<u32>(3u));
    let hi = vec4<f32>((vec4<u32>(c) >> vec4<u32>(8u, 10u, 12u, 14u)) & vec4<u32>(3u));
    return array<vec4<f32>, 2>((lo - 1.0) + delta, (hi - 1.0) + delta);
}
