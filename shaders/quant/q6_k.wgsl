// Q6_K, 210 bytes per 256 weights: ql[128] (low 4 bits), qh[64] (high 2
// bits), scales[16] (int8), d (f16) at the end; w = d * sc * (q6 - 32).
// Group G, with n = G/8, t = (G%8)/2, l0 = 16*(G%2): ql bytes
// 64n + 32*(t%2) + l0 .. +16, nibble t/2; qh bytes 128 + 32n + l0 .. +16,
// bit pair t; scale G (ggml's is + 2t indexing, spelled out).

fn dq16(row: u32, g: u32) -> array<vec4<f32>, 4> {
    let b = row + 210u * (g >> 4u);
    let G = g & 15u;
    let n = G >> 3u;
    let t = (G & 7u) >> 1u;
    let l0 = 16u * (G & 1u);
    let d = wb_f16(b + 208u);
    let sc = f32((bitcast<i32>(wb_u8(b + 192u + G)) << 24u) >> 24u);
    let dl = d * sc;
    let lb = b + 64u * n + 32u * (t & 1u) + l0;
    let hb = b + 128u + 32u * n + l0;
    let lshift = 4u * (t >> 1u);
    let hshift = 2u * t;
    var o: array<vec4<f32>, 4>;
    for (var i = 0u; i < 4u; i++) {
        let ql = (wb_u32(lb + 4u * i) >> lshift) & 0x0f0f0f0fu;
        let qh = (wb_u32(hb + 4u * i) >> hshift) & 0x03030303u;
        o[i] = dl * (u8x4(ql | (qh << 4u)) - 32.0);
    }
    return o;
}

// Unit u: groups 2(u % 8) and 2(u % 8) + 1 of super-block u / 8 (the same
// n and t, l0 0 and 16), their 32 ql and 32 qh bytes each loaded once; the
// same operations as dq16.
fn dq32(row: u32, u: u32) -> array<vec4<f32>, 8> {
    let b = row + 210u * (u >> 3u);
    let G = 2u * (u & 7u);
    let n = G >> 3u;
    let t = (G & 7u) >> 1u;
    let d = wb_f16(b + 208u);
    let scs = wb_u16(b + 192u + G);
    let dlo = d * f32((bitcast<i32>(scs) << 24u) >> 24u);
    let dhi = d * f32((bitcast<i32>(scs) << 16u) >> 24u);
    let ql = w8_at(b + 64u * n + 32u * (t & 1u));
    let qh = w8_at(b + 128u + 32u * n);
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
// group loads them, its 8 scale bytes and d once: 30 loads for four units
// where dq32 makes 80; `dqg_unit` then makes dq32's operations on them.
struct Group {
    ql: array<u32, 16>,
    qh: array<u32, 8>,
    sc: array<u32, 2>,
    d: f32,
}

fn dqg_load(row: u32, u0: u32) -> Group {
    let b = row + 210u * (u0 >> 3u);
    let n = (u0 >> 2u) & 1u;
    var g: Group;
    g.ql = w16_at(b + 64u * n);
    g.qh = w8_at(b + 128u + 32u * n);
    g.sc = w2_at(b + 192u + 8u * n);
    g.d = wb_f16(b + 208u);
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
