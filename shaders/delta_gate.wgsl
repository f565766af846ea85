// Gated DeltaNet's output: each value head's outputs RMS-normed, times
// the norm's weight and silu of the gate z, in place; one workgroup per
// (token, head). The reduction is rms_norm.wgsl's (common/rms.wgsl).

#include "common/params.wgsl"

@group(0) @binding(0) var<storage, read_write> o: array<f32>;
@group(0) @binding(1) var<storage, read> z: array<f32>;
@group(0) @binding(2) var<storage, read> w: array<f32>;
@group(0) @binding(3) var<uniform> p: DeltaParams;

var<workgroup> rms_red: array<f32, 64>;

#include "common/rms.wgsl"
#include "common/act.wgsl"

@compute @workgroup_size(64)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
) {
    let row = wid.x + wid.y * nwg.x;
    if (row >= p.n * p.n_v) {
        return;
    }
    let base = p.first * p.n_v * p.head_v + row * p.head_v;
    var s = 0.0;
    for (var i = li; i < p.head_v; i += RMS_P) {
        let v = o[base + i];
        s = fma(v, v, s);
    }
    rms_red[li] = s;
    rms_tree(li, 1u);
    let scale = rms_scale(0u, p.head_v, p.eps);
    for (var i = li; i < p.head_v; i += RMS_P) {
        o[base + i] = ((o[base + i] * scale) * w[i]) * silu(z[base + i]);
    }
}
