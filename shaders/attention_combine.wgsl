// Joins the chunk results of attention.wgsl for the tokens whose positions
// span more than one chunk (C = {{C}} positions each). One invocation per
// (token, head, vec4 column of the head), over the token's chunks
// c = lo / C ..= pos / C in increasing order:
//
//     M = max_c m_c;  w_c = exp(m_c - M)
//     L = sum_c l_c * w_c;  O = sum_c o_c * w_c   (fma chains)
//     out = O * (1 / L)
//
// so a token's bits depend on its position, window and cache only, as in
// the chunk pass. Tokens with one chunk were written by the chunk pass and
// are left alone. Layouts as in attention.wgsl.

#include "common/params.wgsl"

@group(0) @binding(0) var<storage, read> part: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read_write> out: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> tab: array<u32>;
@group(0) @binding(3) var<uniform> p: AttnParams;

const C: u32 = {{C}}u;

@compute @workgroup_size(64)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
) {
    let hd4 = p.head_dim / 4u;
    let gi = (wid.x + wid.y * nwg.x) * 64u + li;
    if (gi >= p.n_tokens * p.n_head * hd4) {
        return;
    }
    let cq = gi % hd4;
    let th = gi / hd4;
    let t = th / p.n_head;
    let pos = tab[2u * (p.tab_first + t) + 1u];
    var lo = 0u;
    if (p.window > 0u && pos + 1u > p.window) {
        lo = pos + 1u - p.window;
    }
    let c_lo = lo / C;
    let c_hi = pos / C;
    if (c_lo == c_hi) {
        return;
    }
    let stride = hd4 + 1u;
    let at0 = th * p.n_chunks * stride;
    var mx = -3.4028235e38;
    for (var c = c_lo; c <= c_hi; c++) {
        mx = max(mx, part[at0 + c * stride + hd4].x);
    }
    var sl = 0.0;
    var so = vec4<f32>(0.0);
    for (var c = c_lo; c <= c_hi; c++) {
        let ml = part[at0 + c * stride + hd4];
        let w = exp(ml.x - mx);
        sl = fma(ml.y, w, sl);
        so = fma(part[at0 + c * stride + cq], vec4<f32>(w), so);
    }
    out[p.q_offset / 4u + th * hd4 + cq] = so * (1.0 / sl);
}
