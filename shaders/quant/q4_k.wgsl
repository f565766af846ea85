// Q4_K, 144 bytes per 256 weights: d, dmin (f16), scales[12] (8 six-bit
// scales and 8 six-bit mins, ggml get_scale_min_k4 packing), qs[128].
// Sub-block S (32 weights): qs bytes 32*(S/2) .. +32, low nibble for even S,
// high for odd; w = d * sc[S] * q - dmin * m[S]. Super-blocks are 16-byte
// aligned; the kernel binds the buffer a second time as `w4` (vec4 words).

// get_scale_min_k4: (scale, min) of sub-block `s`, scales starting at byte `sb`.
fn scale_min_k4(sb: u32, s: u32) -> vec2<f32> {
    if (s < 4u) {
        return vec2<f32>(f32(wb_u8(sb + s) & 63u), f32(wb_u8(sb + s + 4u) & 63u));
    }
    let a = wb_u8(sb + s + 4u);
    let sc = (a & 0xfu) | ((wb_u8(sb + s - 4u) >> 6u) << 4u);
    let m = (a >> 4u) | ((wb_u8(sb + s) >> 6u) << 4u);
    return vec2<f32>(f32(sc), f32(m));
}

#include "quant/k4_scales.wgsl"

fn dq16(row: u32, g: u32) -> array<vec4<f32>, 4> {
    let b = row + 144u * (g >> 4u);
    let S = (g & 15u) >> 1u;
    let dm = unpack2x16float(w[b >> 2u]);
    let sm = scale_min_k4(b + 4u, S);
    let dl = dm.x * sm.x;
    let ml = dm.y * sm.y;
    // The 16 quant bytes: one vec4 load (see dq32).
    let qs = w4[(b + 16u + 32u * (S >> 1u) + 16u * (g & 1u)) >> 4u];
    let shift = 4u * (S & 1u);
    var o: array<vec4<f32>, 4>;
    for (var i = 0u; i < 4u; i++) {
        let q = (qs[i] >> shift) & 0x0f0f0f0fu;
        o[i] = fma(u8x4(q), vec4<f32>(dl), vec4<f32>(-ml));
    }
    return o;
}

// Unit groups (common/walk_groups.wgsl, UG 2): sub-blocks S and S + 1 (S
// even) take the low and high nibbles of the same 32 quant bytes, so a group
// loads the header and those bytes once (four loads for two units where
// dq32 makes eight); `dqg_unit` then makes dq32's operations on them.
struct Group {
    hd: vec4<u32>,
    dm: vec2<f32>,
    qa: vec4<u32>,
    qb: vec4<u32>,
    s0: u32,
}

fn dqg_load(row: u32, u0: u32) -> Group {
    let b = row + 144u * (u0 >> 3u);
    var g: Group;
    g.s0 = u0 & 7u;
    g.hd = w4[b >> 4u];
    // d and dmin through `w`, so every kernel uses both views of the buffer
    // (an unused binding would leave the kernel's derived layout).
    g.dm = unpack2x16float(w[b >> 2u]);
    let qv = (b + 16u + 32u * (g.s0 >> 1u)) >> 4u;
    g.qa = w4[qv];
    g.qb = w4[qv + 1u];
    return g;
}

fn dqg_unit(g: Group, r: u32) -> array<vec4<f32>, 8> {
    let sm = scale_min_hd(g.hd, g.s0 + r);
    let dl = g.dm.x * sm.x;
    let ml = g.dm.y * sm.y;
    let shift = 4u * r;
    var o: array<vec4<f32>, 8>;
    for (var i = 0u; i < 4u; i++) {
        o[i] = fma(u8x4((g.qa[i] >> shift) & 0x0f0f0f0fu), vec4<f32>(dl), vec4<f32>(-ml));
        o[i + 4u] = fma(u8x4((g.qb[i] >> shift) & 0x0f0f0f0fu), vec4<f32>(dl), vec4<f32>(-ml));
    }
    return o;
}

// Sub-block u % 8 of super-block u / 8, its group of one: the header (d,
// dmin and the 12 scale bytes) is one vec4 load and the sub-block's 32 quant
// bytes two (super-blocks are 144 = 9 * 16 bytes, so rows of them stay
// 16-byte aligned; the kernel binds the buffer a second time as `w4`), four
// loads instead of twelve on a device that loads lane by lane. The same
// operations as dq16.
fn dq32(row: u32, u: u32) -> array<vec4<f32>, 8> {
    return dqg_unit(dqg_load(row, u & ~1u), u & 1u);
}
