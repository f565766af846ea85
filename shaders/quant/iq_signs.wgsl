// Signs and magnitudes of the IQ2/IQ3 lattice types.

// The 8 sign bits of a 7-bit sign index (ggml's ksigns_iq2xs): bit 7 is set
// where that makes the number of set bits even (the table is this rule;
// crates/gpu/src/grids.rs checks it).
fn ksigns(s: u32) -> u32 {
    return s | ((countOneBits(s) & 1u) << 7u);
}

// Magnitudes `m`, negated where bits 0..3 of `s` are set. d * (-m) has the
// bits of -(d * m), the CPU's order.
fn signed4(m: vec4<f32>, s: u32) -> vec4<f32> {
    let neg = (vec4<u32>(s) & vec4<u32>(1u, 2u, 4u, 8u)) != vec4<u32>(0u);
    return select(m, -m, neg);
}

// The 16-bit code of entry i of a packed 8-weight grid (crates/gpu/src/grids.rs:
// two entries per word, two bits per weight).
fn grid_code(word: u32, i: u32) -> u32 {
    return (word >> (16u * (i & 1u))) & 0xffffu;
}

// Four IQ2 magnitudes from 8 bits of a code: 2-bit codes 0, 1, 2 stand for
// 8, 25, 43 (grids.rs IQ2_LEVELS), which 8 + c * (16.5 + 0.5 c) gives
// exactly.
fn iq2_mags(code: u32) -> vec4<f32> {
    let c = vec4<f32>((vec4<u32>(code) >> vec4<u32>(0u, 2u, 4u, 6u)) & vec4<u32>(3u));
    return 8.0 + c * (16.5 + 0.5 * c);
}
