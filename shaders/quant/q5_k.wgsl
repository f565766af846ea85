// Q5_K, 176 bytes per 256 weights: d, dmin (f16), scales[12] (as Q4_K),
// qh[32] (fifth bits: bit S of byte l belongs to weight l of sub-block S),
// qs[128] (nibbles as Q4_K); w = d * sc[S] * q5 - dmin * m[S]. Super-blocks
// are 176 = 11 * 16 bytes, so the header (d, dmin, scales), qh and every
// sub-block pair's qs are whole vec4 words: the kernel binds the buffer a
// second time as `w4` (quant::binds_twice) and the decoders load those.

#include "quant/k4_scales.wgsl"

// Sixteen weights from their qs word `q` (nibble at `shift`) and qh word
// `h` (bit S): d * sc * q5 - dmin * m as one fma per weight.
fn q5k_four(q: u32, h: u32, shift: u32, S: u32, dl: f32, ml: f32) -> vec4<f32> {
    let lo = (q >> shift) & 0x0f0f0f0fu;
    let hi = (h >> S) & 0x01010101u;
    return fma(u8x4(lo | (hi << 4u)), vec4<f32>(dl), vec4<f32>(-ml));
}

fn dq16(row: u32, g: u32) -> array<vec4<f32>, 4> {
    let b = row + 176u * (g >> 4u);
    let S = (g & 15u) >> 1u;
    let hd = w4[b >> 4u];
    // d and dmin through `w`, so every kernel uses both views of the buffer.
    let dm = unpack2x16float(w[b >> 2u]);
    let sm = scale_min_hd(hd, S);
    let dl = dm.x * sm.x;
    let ml = dm.y * sm.y;
    let qs = w4[((b + 48u + 32u * (S >> 1u)) >> 4u) + (g & 1u)];
    let qh = w4[((b + 16u) >> 4u) + (g & 1u)];
    let shift = 4u * (S & 1u);
    var o: array<vec4<f32>, 4>;
    for (var i = 0u; i < 4u; i++) {
        o[i] = q5k_four(qs[i], qh[i], shift, S, dl, ml);
    }
    return o;
}

// Unit groups (common/walk_groups.wgsl, UG 2): sub-blocks S and S + 1 (S
// even) share their 32 qs bytes, and every sub-block reads the same 32 qh
// bytes, so a group loads the header, qh and its qs once: six loads for two
// units where two dq16 calls apiece made eighteen.
struct Group {
    hd: vec4<u32>,
    dm: vec2<f32>,
    qh: array<vec4<u32>, 2>,
    qs: array<vec4<u32>, 2>,
    s0: u32,
}

fn dqg_load(row: u32, u0: u32) -> Group {
    let b = row + 176u * (u0 >> 3u);
    var g: Group;
    g.s0 = u0 & 7u;
    g.hd = w4[b >> 4u];
    g.dm = unpack2x16float(w[b >> 2u]);
    let hv = (b + 16u) >> 4u;
    g.qh = array<vec4<u32>, 2>(w4[hv], w4[hv + 1u]);
    let qv = (b + 48u + 32u * (g.s0 >> 1u)) >> 4u;
    g.qs = array<vec4<u32>, 2>(w4[qv], w4[qv + 1u]);
    return g;
}

fn dqg_unit(g: Group, r: u32) -> array<vec4<f32>, 8> {
    let S = g.s0 + r;
    let sm = scale_min_hd(g.hd, S);
    let dl = g.dm.x * sm.x;
    let ml = g.dm.y * sm.y;
    let shift = 4u * r;
    var o: array<vec4<f32>, 8>;
    for (var i = 0u; i < 4u; i++) {
        o[i] = q5k_four(g.qs[0][i], g.qh[0][i], shift, S, dl, ml);
        o[i + 4u] = q5k_four(g.qs[1][i], g.qh[1][i], shift, S, dl, ml);
    }
    return o;
}

// A whole unit: its group of one.
fn dq32(row: u32, u: u32) -> array<vec4<f32>, 8> {
    return dqg_unit(dqg_load(row, u & ~1u), u & 1u);
}
