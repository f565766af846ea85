// The residual add fused with the RMSNorm that follows it, one workgroup per
// row:
//   s = a + b            (PRE = 0)
//   s = a + rms(b) * pw  (PRE = 1: a post-norm of the branch, gemma3)
//   y = rms(s) * nw
// writing both s (the new hidden state) and y (the next op's input). Every
// value is computed with the same operations as rms_norm.wgsl then
// binary.wgsl, so the fusion changes no bit.

#include "common/params.wgsl"

@group(0) @binding(0) var<storage, read> a: array<f32>;
@group(0) @binding(1) var<storage, read> b: array<f32>;
@group(0) @binding(2) var<storage, read> pw: array<f32>;
@group(0) @binding(3) var<storage, read> nw: array<f32>;
@group(0) @binding(4) var<storage, read_write> s_out: array<f32>;
@group(0) @binding(5) var<storage, read_write> y: array<f32>;
@group(0) @binding(6) var<uniform> p: NormParams;

var<workgroup> rms_red: array<f32, 64>;

#include "common/rms.wgsl"

// The canonical reduction (common/rms.wgsl) of this invocation's partial;
// returns 1 / sqrt(mean + eps) to every invocation.
fn inv_rms(partial: f32, li: u32) -> f32 {
    rms_red[li] = partial;
    rms_tree(li, 1u);
    let scale = rms_scale(0u, p.dim, p.eps);
    // Every invocation has read the root before anyone reuses `rms_red`.
    workgroupBarrier();
    return scale;
}

fn branch(base: u32, i: u32, pre_scale: f32) -> f32 {
    if ({{PRE}}u == 1u) {
        return (b[base + i] * pre_scale) * pw[i];
    }
    return b[base + i];
}

@compute @workgroup_size(64)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
) {
    let row = wid.x + wid.y * nwg.x;
    // Uniform per workgroup, so the barriers below stay in uniform control
    // flow.
    if (row >= p.rows) {
        return;
    }
    let base = row * p.dim;
    var pre_scale = 1.0;
    if ({{PRE}}u == 1u) {
        var t = 0.0;
        for (var i = li; i < p.dim; i += RMS_P) {
            let v = b[base + i];
            t = fma(v, v, t);
        }
        pre_scale = inv_rms(t, li);
    }
    var t = 0.0;
    for (var i = li; i < p.dim; i += RMS_P) {
        let v = a[base + i] + branch(base, i, pre_scale);
        s_out[base + i] = v;
        t = fma(v, v, t);
    }
    let scale = inv_rms(t, li);
    for (var i = li; i < p.dim; i += RMS_P) {
        let v = a[base + i] + branch(base, i, pre_scale);
        y[base + i] = (v * scale) * nw[i];
    }
}
