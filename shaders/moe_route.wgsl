// A mixture's router on the device, one workgroup per token: what the CPU's
// `route` (crates/model/src/cpu.rs) computes from the same logits. The
// softmax of the token's p.n_expert logits; the p.k most probable experts in
// the host's order (probability descending, ties to the lower index,
// compared as order keys so NaN sorts as total_cmp sorts it); their
// probabilities as weights, divided by their sum with p.norm (the sum
// clamped to f16's smallest normal, as llama.cpp clamps it) and times
// p.scale unless that is 0 or 1. The softmax sums in f32 where the host
// sums in f64, and exp is the device's: a weight can differ from the host's
// in its last bits, and only an exact tie can choose differently.
//
// For (token t, slot s), i = t * k + s, it writes moe_weigh's table with
// the rows by pair (out[i] = i, out[nk + i] = the weight's bits) and two
// tables of matmul_runs' one-column runs: the gate/up product's, from the
// token's column (out[runs_at + 4i ..] = expert, t, i, 1), and the down
// product's, from the pair's own (out[runs_at + 4nk + 4i ..] = expert, i,
// i, 1); so the experts' products and their sum follow in the same
// submission.

#include "common/params.wgsl"

@group(0) @binding(0) var<storage, read> logits: array<f32>;
@group(0) @binding(1) var<storage, read_write> out: array<u32>;
@group(0) @binding(2) var<uniform> p: MoeRouteParams;

const WG: u32 = 64u;
// Experts a token may have (the host routes larger mixtures itself).
const MAX_EXPERTS: u32 = 2048u;

var<workgroup> keys: array<u32, MAX_EXPERTS>;
var<workgroup> red_f: array<f32, WG>;
var<workgroup> red_k: array<u32, WG>;
var<workgroup> red_i: array<u32, WG>;

// Order-preserving integer key of a float (total_cmp's order).
fn key(v: f32) -> u32 {
    let b = bitcast<u32>(v);
    return select(b | 0x80000000u, ~b, (b & 0x80000000u) != 0u);
}

fn unkey(k: u32) -> f32 {
    return bitcast<f32>(select(~k, k & 0x7fffffffu, (k & 0x80000000u) != 0u));
}

@compute @workgroup_size(64)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
) {
    // Uniform per workgroup: every invocation leaves together or stays.
    let t = wid.x + wid.y * nwg.x;
    if (t >= p.n) {
        return;
    }
    let ne = min(p.n_expert, MAX_EXPERTS);
    let base = p.l_offset + t * p.l_stride;

    // The maximum (exact in any order).
    var m = -3.4028235e38;
    for (var i = li; i < ne; i += WG) {
        m = max(m, logits[base + i]);
    }
    red_f[li] = m;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (li < s) {
            red_f[li] = max(red_f[li], red_f[li + s]);
        }
        workgroupBarrier();
    }
    let mx = red_f[0];
    workgroupBarrier();

    // The sum of exponentials: each invocation's strided partial, then a
    // fixed tree (deterministic for a token, whatever else the step holds).
    var sum = 0.0;
    for (var i = li; i < ne; i += WG) {
        sum += exp(logits[base + i] - mx);
    }
    red_f[li] = sum;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (li < s) {
            red_f[li] = red_f[li] + red_f[li + s];
        }
        workgroupBarrier();
    }
    let inv = 1.0 / red_f[0];
    for (var i = li; i < ne; i += WG) {
        keys[i] = key(exp(logits[base + i] - mx) * inv);
    }
    workgroupBarrier();

    // k rounds of an argmax over the keys, ties to the lower index; the
    // winner's key is then cleared to 0, below every probability's.
    let nk = p.n * p.k;
    for (var s = 0u; s < p.k; s++) {
        var bk = 0u;
        var bi = 0xffffffffu;
        for (var i = li; i < ne; i += WG) {
            let kv = keys[i];
            if (bi == 0xffffffffu || kv > bk) {
                bk = kv;
                bi = i;
            }
        }
        red_k[li] = bk;
        red_i[li] = bi;
        workgroupBarrier();
        for (var h = WG / 2u; h > 0u; h >>= 1u) {
            if (li < h) {
                let ok = red_k[li + h];
                let oi = red_i[li + h];
                let mine = red_i[li];
                if (oi != 0xffffffffu
                    && (mine == 0xffffffffu || ok > red_k[li] || (ok == red_k[li] && oi < mine))) {
                    red_k[li] = ok;
                    red_i[li] = oi;
                }
            }
            workgroupBarrier();
        }
        if (li == 0u) {
            let e = min(red_i[0], ne - 1u);
            let i = t * p.k + s;
            out[i] = i;
            out[nk + i] = bitcast<u32>(unkey(red_k[0]));
            let r = p.runs_at + 4u * i;
            out[r] = e;
            out[r + 1u] = t;
            out[r + 2u] = i;
            out[r + 3u] = 1u;
            let d = r + 4u * nk;
            out[d] = e;
            out[d + 1u] = i;
            out[d + 2u] = i;
            out[d + 3u] = 1u;
            keys[e] = 0u;
        }
        workgroupBarrier();
    }

    if (li == 0u && (p.norm != 0u || (p.scale != 0.0 && p.scale != 1.0))) {
        let first = nk + t * p.k;
        if (p.norm != 0u) {
            var total = 0.0;
            for (var s = 0u; s < p.k; s++) {
                total += bitcast<f32>(out[first + s]);
            }
            total = max(total, 6.1035156e-5);
            for (var s = 0u; s < p.k; s++) {
                out[first + s] = bitcast<u32>(bitcast<f32>(out[first + s]) / total);
            }
        }
        if (p.scale != 0.0 && p.scale != 1.0) {
            for (var s = 0u; s < p.k; s++) {
                out[first + s] = bitcast<u32>(bitcast<f32>(out[first + s]) * p.scale);
            }
        }
    }
}
