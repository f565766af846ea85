// Gated activation over the stacked gate/up product: each token's row is
// [gate (dim values), up (dim values)] and y = act(gate) * up, packed
// [token][dim]. The same functions as glu.wgsl.

#include "common/params.wgsl"

@group(0) @binding(0) var<storage, read> gu: array<f32>;
@group(0) @binding(1) var<storage, read_write> y: array<f32>;
@group(0) @binding(2) var<uniform> p: EltParams;

#include "common/act.wgsl"

@compute @workgroup_size(256)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
) {
    let i = (wid.x + wid.y * nwg.x) * 256u + li;
    if (i < p.n) {
        let at = (i / p.dim) * 2u * p.dim + i % p.dim;
        y[i] = {{ACT}}(gu[at]) * gu[at + p.dim];
    }
}
