// Q6_K, 210 bytes per 256 weights: ql[128] (low 4 bits), qh[64] (high 2
// bits), scales[16] (int8), d (f16) at the end; w = d * sc * (q6 - 32).
// Group G, with n = G/8, t = (G%8)/2, l0 = 16*(G%2): ql bytes
// 64n + 32*(t%2) + l0 .. +16, nibble t/2; qh bytes 32n + l0 .. +16,
// bit pair t; scale G (ggml's is + 2t indexing, spelled out).
//
// Kept in the split row layout (crates/gpu/src/quant.rs `split_fields`): a
// row of NB super-blocks holds every block's ql, then every block's qh,
// then the scales, then the d values. ggml's 210-byte blocks leave every
// field but the first off a 4-byte boundary, so in place each word took two
// loads and a funnel shift; split, ql and qh are aligned vec4 loads (the
// kernel binds the weight a second time as `w4`) and the scales aligned
// words. The decoded values, and so every kernel's bits, are the same.

fn q6_nb() -> u32 {
    return p.k / 256u;
}

// Byte offsets of super-block `blk`'s fields in the row at byte `row`.
fn q6_ql(row: u32, blk: u32) -> u32 {
    return row + 128u * blk;
}

fn q6_qh(row: u32, blk: u32) -> u32 {
    return row + 128u * q6_nb() + 64u * blk;
}

fn q6_sc(row: u32, blk: u32) -> u32 {
    return row + 192u * q6_nb() + 16u * blk;
}

fn q6_d(row: u32, blk: u32) -> f32 {
    return wb_f16(row + 208u * q6_nb() + 2u * blk);
}

// The 4 (q6_w4) or 8 (q6_w8) little-endian words at the 16-byte aligned
// offset `b`, as one or two vec4 loads.
fn q6_w4(b: u32) -> array<u32, 4> {
    let v = w4[b >> 4u];
    return array<u32, 4>(v.x, v.y, v.z, v.w);
}

fn q6_w8(b: u32) -> array<u32, 8> {
    let a = w4[b >> 4u];
    let c = w4[(b >> 4u) + 1u];
    return array<u32, 8>(a.x, a.y, a.z, a.w, c.x, c.y, c.z, c.w);
}

fn dq16(row: u32, g: u32) -> array<vec4<f32>, 4> {
    let blk = g >> 4u;
    let G = g & 15u;
    let n = G >> 3u;
    let t = (G & 7u) >> 1u;
    let l0 = 16u * (G & 1u);
    let d = q6_d(row, blk);
    let sc = f32((bitcast<i32>(wb_u8(q6_sc(row, blk) + G)) << 24u) >> 24u);
    let dl = d * sc;
    let ql = q6_w4(q6_ql(row, blk) + 64u * n + 32u * (t & 1u) + l0);
    let qh = q6_w4(q6_qh(row, blk) + 32u * n + l0);
    let lshift = 4u * (t >> 1u);
    let hshift = 2u * t;
    var o: array<vec4<f32>, 4>;
    for (var i = 0u; i < 4u; i++) {
        let l = (ql[i] >> lshift) & 0x0f0f0f0fu;
        let h = (qh[i] >> hshift) & 0x03030303u;
        o[i] = dl * (u8x4(l | (h << 4u)) - 32.0);
    }
    return o;
}

// Unit u: groups 2(u % 8) and 2(u % 8) + 1 of super-block u / 8 (the same
// n and t, l0 0 and 16), their 32 ql and 32 qh bytes each loaded once; the
// same operations as dq16.
fn dq32(row: u32, u: u32) -> array<vec4<f32>, 8> {
    let blk = u >> 3u;
    let G = 2u * (u & 7u);
    let n = G >> 3u;
    let t = (G & 7u) >> 1u;
    let d = q6_d(row, blk);
    let scs = wb_u16(q6_sc(row, blk) + G);
    let dlo = d * f32((bitcast<i32>(scs) << 24u) >> 24u);
    let dhi = d * f32((bitcast<i32>(scs) << 16u) >> 24u);
    let ql = q6_w8(q6_ql(row, blk) + 64u * n + 32u * (t & 1u));
    let qh = q6_w8(q6_qh(row, blk) + 32u * n);
    let lshift = 4u * (t >> 1u);
    let hshift = 2u * t;
    var o: array<vec4<f32>, 8>;
    for (var i = 0u; i < 8u; i++) {
        let l = (ql[i] >> lshift) & 0x0f0f0f0fu;
        let h = (qh[i] >> hshift) & 0x03030303u;
        let dl = select(dlo, dhi, i >= 4u);
        o[i] = dl * (u8x4(l | (h << 4u)) - 32.0);
    }
    return o;
}

// Unit groups (common/walk_groups.wgsl, UG 4): units u0 .. u0 + 3 (u0 a
// multiple of 4) are the four units of half n = (u0 / 4) % 2 of super-block
// u0 / 8, t = 0 .. 3, which all read that half's 64 ql and 32 qh bytes. A
// group loads them, its 8 scale bytes and d once: 6 vec4 loads, 2 words and
// d for four units; `dqg_unit` then makes dq32's operations on them.
struct Group {
    ql: array<u32, 16>,
    qh: array<u32, 8>,
    sc: array<u32, 2>,
    d: f32,
}

fn dqg_load(row: u32, u0: u32) -> Group {
    let blk = u0 >> 3u;
    let n = (u0 >> 2u) & 1u;
    var g: Group;
    let lb = (q6_ql(row, blk) + 64u * n) >> 4u;
    for (var i = 0u; i < 4u; i++) {
        let v = w4[lb + i];
        g.ql[4u * i] = v.x;
        g.ql[4u * i + 1u] = v.y;
        g.ql[4u * i + 2u] = v.z;
        g.ql[4u * i + 3u] = v.w;
    }
    g.qh = q6_w8(q6_qh(row, blk) + 32u * n);
    let sb = (q6_sc(row, blk) + 8u * n) >> 2u;
    g.sc = array<u32, 2>(w[sb], w[sb + 1u]);
    g.d = q6_d(row, blk);
    return g;
}

// Unit u0 + t of the group: dq32's G = 8n + 2t, its ql bytes the t % 2'th
// 32 of the half, its scales bytes 2t and 2t + 1 of the group's eight.
fn dqg_unit(g: Group, t: u32) -> array<vec4<f32>, 8> {
    let scs = (g.sc[t >> 1u] >> (16u * (t & 1u))) & 0xffffu;
    let dlo = g.d * f32((bitcast<i32>(scs) << 24u) >> 24u);
    let dhi = g.d * f32((bitcast<i32>(scs) << 16u) >> 24u);
    let lshift = 4u * (t >> 1u);
    let hshift = 2u * t;
    var o: array<vec4<f32>, 8>;
    for (var i = 0u; i < 8u; i++) {
        let l = (g.ql[8u * (t & 1u) + i] >> lshift) & 0x0f0f0f0fu;
        let h = (g.qh[i] >> hshift) & 0x03030303u;
        let dl = select(dlo, dhi, i >= 4u);
        o[i] = dl * (u8x4(l | (h << 4u)) - 32.0);
    }
    return o;
}
