// Gated DeltaNet's L2 norm of the query and key heads, x / sqrt(sum x^2 +
// eps), in place: one workgroup per (token, head) of the 2 n_k heads that
// open each row of ch channels (queries, then keys).

#include "common/params.wgsl"

@group(0) @binding(0) var<storage, read_write> y: array<f32>;
@group(0) @binding(1) var<uniform> p: DeltaParams;

var<workgroup> red: array<f32, 64>;

@compute @workgroup_size(64)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
) {
    let heads = 2u * p.n_k;
    let row = wid.x + wid.y * nwg.x;
    if (row >= p.n * heads) {
        return;
    }
    let base = (p.first + row / heads) * p.ch + (row % heads) * p.head_k;
    var s = 0.0;
    for (var i = li; i < p.head_k; i += 64u) {
        let v = y[base + i];
        s = fma(v, v, s);
    }
    red[li] = s;
    workgroupBarrier();
    for (var st = 32u; st > 0u; st >>= 1u) {
        if (li < st) {
            red[li] = red[li] + red[li + st];
        }
        workgroupBarrier();
    }
    let scale = 1.0 / sqrt(red[0] + p.eps);
    for (var i = li; i < p.head_k; i += 64u) {
        y[base + i] = y[base + i] * scale;
    }
}
