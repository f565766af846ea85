// RMSNorm with weight, one workgroup per row:
// y = x * (1 / sqrt(mean(x^2) + eps)) * weight, as ggml's rms_norm then mul.

#include "common/params.wgsl"

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read> nw: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<uniform> p: NormParams;

var<workgroup> red: array<f32, 256>;

@compute @workgroup_size(256)
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
    for (var i = li; i < p.dim; i += 256u) {
        let v = x[base + i];
        s = fma(v, v, s);
    }
    red[li] = s;
    workgroupBarrier();
    for (var k = 128u; k > 0u; k >>= 1u) {
        if (li < k) {
            red[li] = red[li] + red[li + k];
        }
        workgroupBarrier();
    }
    let scale = 1.0 / sqrt(red[0] / f32(p.dim) + p.eps);
    for (var i = li; i < p.dim; i += 256u) {
        y[base + i] = (x[base + i] * scale) * nw[i];
    }
}
