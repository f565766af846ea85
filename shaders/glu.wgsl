// Gated activations: y = act(g) * u with act = {{ACT}}.
// (functions in common/act.wgsl)

#include "common/params.wgsl"

@group(0) @binding(0) var<storage, read> g: array<f32>;
@group(0) @binding(1) var<storage, read> u: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<uniform> p: EltParams;

#include "common/act.wgsl"

@compute @workgroup_size(256)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
) {
    let i = (wid.x + wid.y * nwg.x) * 256u + li;
    if (i < p.n) {
        y[i] = {{ACT}}(g[i]) * u[i];
    }
}
