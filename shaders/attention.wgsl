// Causal (optionally sliding-window) grouped-query attention of a batch of
// query tokens against the KV cache, one workgroup per (token, head):
//   scores_j = (q · k_j) * scale            for keys j in [lo, p]
//   out      = Σ_j softmax(scores)_j * v_j
// where p = pos0 + t is the token's position and lo = p + 1 - window for
// sliding-window layers (0 otherwise). Keys and values of head h live in KV
// head h / (n_head / n_kv_head).
//
// The scores of a row go to a global scratch row (the context can exceed
// workgroup memory); storageBarrier orders the workgroup's own writes and
// reads of it between the three phases.

#include "common/params.wgsl"

@group(0) @binding(0) var<storage, read> q: array<f32>;
@group(0) @binding(1) var<storage, read> kc: array<f32>;
@group(0) @binding(2) var<storage, read> vc: array<f32>;
@group(0) @binding(3) var<storage, read_write> scores: array<f32>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;
@group(0) @binding(5) var<uniform> p: AttnParams;

var<workgroup> red: array<f32, 256>;

fn reduce_max(li: u32, v: f32) -> f32 {
    red[li] = v;
    workgroupBarrier();
    for (var k = 128u; k > 0u; k >>= 1u) {
        if (li < k) {
            red[li] = max(red[li], red[li + k]);
        }
        workgroupBarrier();
    }
    let r = red[0];
    workgroupBarrier();
    return r;
}

fn reduce_sum(li: u32, v: f32) -> f32 {
    red[li] = v;
    workgroupBarrier();
    for (var k = 128u; k > 0u; k >>= 1u) {
        if (li < k) {
            red[li] = red[li] + red[li + k];
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
    let idx = wid.x + wid.y * nwg.x;
    // Uniform across the workgroup, so the early return keeps barriers uniform.
    if (idx >= p.n_tokens * p.n_head) {
        return;
    }
    let t = idx / p.n_head;
    let h = idx % p.n_head;
    let pos = p.pos0 + t;
    var lo = 0u;
    if (p.window > 0u && pos + 1u > p.window) {
        lo = pos + 1u - p.window;
    }
    let hd = p.head_dim;
    let kv_dim = p.n_kv_head * hd;
    let kvh = h / (p.n_head / p.n_kv_head);
    let qb = idx * hd;
    let srow = idx * p.score_stride;

    var m = -3.4028235e38;
    for (var j = lo + li; j <= pos; j += 256u) {
        let kb = j * kv_dim + kvh * hd;
        var s = 0.0;
        for (var d = 0u; d < hd; d++) {
            s = fma(q[qb + d], kc[kb + d], s);
        }
        s = s * p.scale;
        scores[srow + j] = s;
        m = max(m, s);
    }
    storageBarrier();
    let mx = reduce_max(li, m);

    var l = 0.0;
    for (var j = lo + li; j <= pos; j += 256u) {
        let e = exp(scores[srow + j] - mx);
        scores[srow + j] = e;
        l += e;
    }
    storageBarrier();
    let total = reduce_sum(li, l);
    let inv = 1.0 / total;

    for (var d = li; d < hd; d += 256u) {
        var acc = 0.0;
        for (var j = lo; j <= pos; j++) {
            acc = fma(scores[srow + j], vc[j * kv_dim + kvh * hd + d], acc);
        }
        out[qb + d] = acc * inv;
    }
}
