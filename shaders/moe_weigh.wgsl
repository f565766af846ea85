// The routed experts' weighted sum, per token: out[t] = sum over slots s
// (in slot order) of w[t][s] * ys[row[t][s]], then, with p.add, plus what
// out already holds (the qwen2moe shared expert's gated output, which the
// host put there); the CPU's weigh_experts then add_shared, operation for
// operation. The expert outputs `ys` are rows of p.dim packed in expert
// order; `route` holds the n_tokens * k packed row of each (token, slot),
// then the n_tokens * k weights as f32 bits.

#include "common/params.wgsl"

@group(0) @binding(0) var<storage, read> ys: array<f32>;
@group(0) @binding(1) var<storage, read> route: array<u32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;
@group(0) @binding(3) var<uniform> p: MoeWeighParams;

@compute @workgroup_size(256)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
) {
    let idx = (wid.x + wid.y * nwg.x) * 256u + li;
    if (idx >= p.n) {
        return;
    }
    let t = idx / p.dim;
    let i = idx % p.dim;
    let nk = p.n / p.dim * p.k;
    // Rows past the packed outputs (a table the host checked cannot hold
    // them) read the last row rather than out of bounds.
    let last = nk - 1u;
    var acc = ys[min(route[t * p.k], last) * p.dim + i] * bitcast<f32>(route[nk + t * p.k]);
    for (var s = 1u; s < p.k; s++) {
        let at = t * p.k + s;
        acc += ys[min(route[at], last) * p.dim + i] * bitcast<f32>(route[nk + at]);
    }
    if (p.add != 0u) {
        acc = out[idx] + acc;
    }
    out[idx] = acc;
}
