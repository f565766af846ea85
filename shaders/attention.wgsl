// Causal multi-head attention over a KV cache. A workgroup serves GC =
// {{GC}} query heads of one token that share a KV head (grouped-query
// attention): token t is entry p.tab_first + t of the token table `tab`,
// (cache row, position) as two u32; at position pos in rows base ..= row
// (base = row - pos, its sequence's first row), it attends to positions
// lo ..= pos, lo = 0 or the start of its sliding window; query head h
// reads KV head h / (n_head / n_kv_head). Each key and value is loaded once
// for the GC heads. GC divides the group size; the host picks it per step
// (more heads per workgroup when there are enough workgroups to fill the
// device), and it never changes a head's bits:
//
//     s_j = scale * q . k_j   (an fma chain over the head's dimensions)
//     m = max s_j;  e_j = exp(s_j - m)
//     l = tree over the WG invocations of (each invocation's e_j summed in
//         increasing j, j = lo + li, lo + li + WG, ...)
//     out = (sum_j e_j v_j, an fma chain in increasing j) * (1 / l)
//
// all of which depend on the head, its token's position and the cache only.
// Layouts: q and out [n_tokens][n_head][head_dim]; k and v
// [position][n_kv_head][head_dim]; scores [n_tokens][n_head][kv_len]
// (scratch holding s_j, then e_j; kv_len is more than every token's
// position). q and out start at element p.q_offset. With the table, one
// dispatch serves the tokens of several sequences over one cache buffer.

#include "common/params.wgsl"

@group(0) @binding(0) var<storage, read> q: array<f32>;
@group(0) @binding(1) var<storage, read> k: array<f32>;
@group(0) @binding(2) var<storage, read> v: array<f32>;
@group(0) @binding(3) var<storage, read_write> scores: array<f32>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;
@group(0) @binding(5) var<storage, read> tab: array<u32>;
@group(0) @binding(6) var<uniform> p: AttnParams;

const WG: u32 = 64u;
const GC: u32 = {{GC}}u;
// The GC query heads (GC * head_dim <= 2048, checked by the host).
var<workgroup> qs: array<f32, 2048>;
// One reduction slot per head and invocation.
var<workgroup> red: array<f32, {{RED}}>;

// The tree over red[g * WG ..][..WG] for every head g (max when `is_max`,
// else sum); all invocations must call it. Leaves red[g * WG] holding the
// result.
fn reduce(is_max: bool, li: u32) {
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (li < s) {
            for (var g = 0u; g < GC; g++) {
                let a = red[g * WG + li];
                let b = red[g * WG + li + s];
                red[g * WG + li] = select(a + b, max(a, b), is_max);
            }
        }
        workgroupBarrier();
    }
}

@compute @workgroup_size(64)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
) {
    let per_token = p.n_head / GC;
    let wgi = wid.x + wid.y * nwg.x;
    if (wgi >= p.n_tokens * per_token) {
        return;
    }
    let t = wgi / per_token;
    let h0 = (wgi % per_token) * GC;
    let kvh = h0 / (p.n_head / p.n_kv_head);
    let hd = p.head_dim;
    let kv_stride = p.n_kv_head * hd;
    let pos = tab[2u * (p.tab_first + t) + 1u];
    // Keys and values of position j sit at row base + j.
    let base = tab[2u * (p.tab_first + t)] - pos;
    var lo = 0u;
    if (p.window > 0u && pos + 1u > p.window) {
        lo = pos + 1u - p.window;
    }
    // The GC heads are contiguous in q and out, and in scores.
    let qb = p.q_offset + (t * p.n_head + h0) * hd;
    let sb = (t * p.n_head + h0) * p.kv_len;
    for (var i = li; i < GC * hd; i += WG) {
        qs[i] = q[qb + i];
    }
    workgroupBarrier();

    var m: array<f32, GC>;
    for (var g = 0u; g < GC; g++) {
        m[g] = -3.4028235e38;
    }
    for (var j = lo + li; j <= pos; j += WG) {
        let kb = (base + j) * kv_stride + kvh * hd;
        var d: array<f32, GC>;
        for (var i = 0u; i < hd; i++) {
            let kv = k[kb + i];
            for (var g = 0u; g < GC; g++) {
                d[g] = fma(qs[g * hd + i], kv, d[g]);
            }
        }
        for (var g = 0u; g < GC; g++) {
            let s = d[g] * p.scale;
            scores[sb + g * p.kv_len + j] = s;
            m[g] = max(m[g], s);
        }
    }
    for (var g = 0u; g < GC; g++) {
        red[g * WG + li] = m[g];
    }
    reduce(true, li);
    for (var g = 0u; g < GC; g++) {
        m[g] = red[g * WG];
    }
    workgroupBarrier();

    var l: array<f32, GC>;
    for (var j = lo + li; j <= pos; j += WG) {
        for (var g = 0u; g < GC; g++) {
            let at = sb + g * p.kv_len + j;
            let e = exp(scores[at] - m[g]);
            scores[at] = e;
            l[g] += e;
        }
    }
    for (var g = 0u; g < GC; g++) {
        red[g * WG + li] = l[g];
    }
    reduce(false, li);
    var inv: array<f32, GC>;
    for (var g = 0u; g < GC; g++) {
        inv[g] = 1.0 / red[g * WG];
    }
    // Make every invocation's e_j visible to the whole workgroup.
    storageBarrier();

    for (var i = li; i < hd; i += WG) {
        var o: array<f32, GC>;
        for (var j = lo; j <= pos; j++) {
            let vv = v[(base + j) * kv_stride + kvh * hd + i];
            for (var g = 0u; g < GC; g++) {
                o[g] = fma(scores[sb + g * p.kv_len + j], vv, o[g]);
            }
        }
        for (var g = 0u; g < GC; g++) {
            out[qb + g * hd + i] = o[g] * inv[g];
        }
    }
}
