// Signs and magnitudes of the IQ2/IQ3 lattice types.

// The 8 sign bits of a 7-bit sign index (ggml's ksigns_iq2xs): bit 7 is set
// where that makes the number of set bits even (the table is this rule;
// crates/gpu/src/grids.rs checks it).
fn ksigns(s: u32) -> u32 {
    return s | ((countOneBits(s) & 1u) << 7u);
}

// The four unsigned magnitudes in the bytes of grid word `g`, negated where
// bits 0..3 of `s` are set. d * (-m) has the bits of -(d * m), the CPU's
// order.
fn signed4(g: u32, s: u32) -> vec4<f32> {
    let m = u8x4(g);
    let neg = (vec4<u32>(s) & vec4<u32>(1u, 2u, 4u, 8u)) != vec4<u32>(0u);
    return select(m, -m, neg);
}
