// Row-wise softmax of scale * x, one workgroup per row, stable form:
// y = exp(scale*x - m) / sum(exp(scale*x - m)) with m the row maximum.

#include "common/params.wgsl"

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> y: array<f32>;
@group(0) @binding(2) var<uniform> p: SoftmaxParams;

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
    let base = row * p.cols;
    var m = -3.4028235e38;
    for (var i = li; i < p.cols; i += 256u) {
        m = max(m, p.scale * x[base + i]);
    }
    red[li] = m;
    workgroupBarrier();
    for (var k = 128u; k > 0u; k >>= 1u) {
        if (li < k) {
            red[li] = max(red[li], red[li + k]);
        }
        workgroupBarrier();
    }
    m = red[0];
    workgroupBarrier();
    var s = 0.0;
    for (var i = li; i < p.cols; i += 256u) {
        s += exp(p.scale * x[base + i] - m);
    }
    red[li] = s;
    workgroupBarrier();
    for (var k = 128u; k > 0u; k >>= 1u) {
        if (li < k) {
            red[li] = red[li] + red[li + k];
        }
        workgroupBarrier();
    }
    let inv = 1.0 / red[0];
    for (var i = li; i < p.cols; i += 256u) {
        y[base + i] = exp(p.scale * x[base + i] - m) * inv;
    }
}
