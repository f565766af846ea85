// Causal multi-head attention over a KV cache, one workgroup per
// (token, head): token t (position pos0 + t) attends to cache positions
// lo ..= pos0 + t, lo = 0 or the start of its sliding window; query head h
// reads KV head h / (n_head / n_kv_head) (grouped-query attention).
//
//     s_j = scale * q . k_j;   p_j = exp(s_j - max s) / sum;   out = sum_j p_j v_j
//
// Layouts: q and out [n_tokens][n_head][head_dim]; k and v
// [position][n_kv_head][head_dim]; scores [n_tokens][n_head][kv_len]
// (scratch holding s_j, then exp(s_j - max)). q and out start at element
// p.q_offset (one sequence of a batch of several, each with its own cache).

#include "common/params.wgsl"

@group(0) @binding(0) var<storage, read> q: array<f32>;
@group(0) @binding(1) var<storage, read> k: array<f32>;
@group(0) @binding(2) var<storage, read> v: array<f32>;
@group(0) @binding(3) var<storage, read_write> scores: array<f32>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;
@group(0) @binding(5) var<uniform> p: AttnParams;

const WG: u32 = 256u;
var<workgroup> red: array<f32, WG>;

// Tree reduction of red[] (max when `is_max`, else sum); all invocations
// must call it.
fn reduce(is_max: bool, li: u32) -> f32 {
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (li < s) {
            if (is_max) {
                red[li] = max(red[li], red[li + s]);
            } else {
                red[li] = red[li] + red[li + s];
            }
        }
        workgroupBarrier();
    }
    let r = red[0];
    workgroupBarrier();
    return r;
}

@compute @workgroup_size(256)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
) {
    let row = wid.x + wid.y * nwg.x;
    if (row >= p.n_tokens * p.n_head) {
        return;
    }
    let t = row / p.n_head;
    let h = row % p.n_head;
    let kvh = h / (p.n_head / p.n_kv_head);
    let hd = p.head_dim;
    let kv_stride = p.n_kv_head * hd;
    let pos = p.pos0 + t;
    var lo = 0u;
    if (p.window > 0u && pos + 1u > p.window) {
        lo = pos + 1u - p.window;
    }
    let qb = p.q_offset + row * hd;
    let sb = row * p.kv_len;

    var m = -3.4028235e38;
    for (var j = lo + li; j <= pos; j += WG) {
        let kb = j * kv_stride + kvh * hd;
        var d = 0.0;
        for (var i = 0u; i < hd; i++) {
            d = fma(q[qb + i], k[kb + i], d);
        }
        let s = d * p.scale;
        scores[sb + j] = s;
        m = max(m, s);
    }
    red[li] = m;
    workgroupBarrier();
    m = reduce(true, li);

    var sum = 0.0;
    for (var j = lo + li; j <= pos; j += WG) {
        let e = exp(scores[sb + j] - m);
        scores[sb + j] = e;
        sum += e;
    }
    red[li] = sum;
    workgroupBarrier();
    sum = reduce(false, li);
    // Make every invocation's scores visible to the whole workgroup.
    storageBarrier();

    let inv = 1.0 / sum;
    for (var i = li; i < hd; i += WG) {
        var o = 0.0;
        for (var j = lo; j <= pos; j++) {
            o = fma(scores[sb + j], v[j * kv_stride + kvh * hd + i], o);
        }
        out[qb + i] = o * inv;
    }
}
