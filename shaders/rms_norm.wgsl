// RMSNorm with weight, one workgroup per row:
// y = x * (1 / sqrt(mean(x^2) + eps)) * weight, as ggml's rms_norm then mul,
// in the canonical reduction order of common/rms.wgsl.

#include "common/params.wgsl"

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read> nw: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<uniform> p: NormParams;

var<workgroup> rms_red: array<f32, 64>;

#include "common/rms.wgsl"

@compute @workgroup_size(64)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
) {
    let row = wid.x + wid.y * nwg.x;
    if (row >= p.rows) {
        return;
    }
    let base = row * p.dim;
    var s = 0.0;
    for (var i = li; i < p.dim; i += RMS_P) {
        let v = x[base + i];
        s = fma(v, v, s);
    }
    rms_red[li] = s;
    rms_tree(li, 1u);
    let scale = rms_scale(0u, p.dim, p.eps);
    for (var i = li; i < p.dim; i += RMS_P) {
        y[base + i] = (x[base + i] * scale) * nw[i];
    }
}
