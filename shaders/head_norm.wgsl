// Per-head RMSNorm of the query and key heads of the stacked QKV product
// (qwen3, gemma3), one workgroup per head: token t's row of `stride` values
// holds n_head query heads, then n_kv_head key heads, then the values
// (not touched). Query heads are scaled by qw, key heads by kw; y has the
// same layout as x. The reduction is rms_norm.wgsl's (common/rms.wgsl).

#include "common/params.wgsl"

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read> qw: array<f32>;
@group(0) @binding(2) var<storage, read> kw: array<f32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
@group(0) @binding(4) var<uniform> p: HeadNormParams;

var<workgroup> rms_red: array<f32, 64>;

#include "common/rms.wgsl"

@compute @workgroup_size(64)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
) {
    let heads = p.n_head + p.n_kv_head;
    let row = wid.x + wid.y * nwg.x;
    if (row >= p.n_tokens * heads) {
        return;
    }
    let t = row / heads;
    let h = row % heads;
    let base = p.base + t * p.stride + h * p.head_dim;
    var s = 0.0;
    for (var i = li; i < p.head_dim; i += RMS_P) {
        let v = x[base + i];
        s = fma(v, v, s);
    }
    rms_red[li] = s;
    rms_tree(li, 1u);
    let scale = rms_scale(0u, p.head_dim, p.eps);
    for (var i = li; i < p.head_dim; i += RMS_P) {
        var w = kw[i];
        if (h < p.n_head) {
            w = qw[i];
        }
        y[base + i] = (x[base + i] * scale) * w;
    }
}
