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

var<workgroup> red: array<f32, 256>;

// The mean-square reduction of rms_norm.wgsl, over values `v` this
// invocation summed; returns 1 / sqrt(mean + eps) to every invocation.
fn inv_rms(partial: f32, li: u32) -> f32 {
    red[li] = partial;
    workgroupBarrier();
    for (var k = 128u; k > 0u; k >>= 1u) {
        if (li < k) {
            red[li] = red[li] + red[li + k];
        }
        workgroupBarrier();
    }
    let scale = 1.0 / sqrt(red[0] / f32(p.dim) + p.eps);
    // Every invocation has read red[0] before anyone reuses `red`.
    workgroupBarrier();
    return scale;
}

fn branch(base: u32, i: u32, pre_scale: f32) -> f32 {
    if ({{PRE}}u == 1u) {
        return (b[base + i] * pre_scale) * pw[i];
    }
    return b[base + i];
}

@compute @workgroup_size(256)
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
        for (var i = li; i < p.dim; i += 256u) {
            let v = b[base + i];
            t = fma(v, v, t);
        }
        pre_scale = inv_rms(t, li);
    }
    var t = 0.0;
    for (var i = li; i < p.dim; i += 256u) {
        let v = a[base + i] + branch(base, i, pre_scale);
        s_out[base + i] = v;
        t = fma(v, v, t);
    }
    let scale = inv_rms(t, li);
    for (var i = li; i < p.dim; i += 256u) {
        let v = a[base + i] + branch(base, i, pre_scale);
        y[base + i] = (v * scale) * nw[i];
    }
}
