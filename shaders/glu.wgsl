// Gated activations: y = act(g) * u with act = {{ACT}}.
//   silu(v)      = v / (1 + exp(-v))
//   gelu_tanh(v) = 0.5 v (1 + tanh(sqrt(2/pi) (v + 0.044715 v^3)))
//                = v / (1 + exp(-2a)), a = sqrt(2/pi) (v + 0.044715 v^3)
// (the same function written without tanh, which overflows to NaN in naive
// implementations for large |a|).

#include "common/params.wgsl"

@group(0) @binding(0) var<storage, read> g: array<f32>;
@group(0) @binding(1) var<storage, read> u: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<uniform> p: EltParams;

fn silu(v: f32) -> f32 {
    return v / (1.0 + exp(-v));
}

fn gelu_tanh(v: f32) -> f32 {
    let a = 0.7978845608028654 * (v + 0.044715 * v * v * v);
    return v / (1.0 + exp(-2.0 * a));
}

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
