// qwen2moe's shared expert under its gate, added after the routed experts'
// sum: out[t] = out[t] + sigmoid(h[t] · g) * sy[t], per token (one
// workgroup each), as the CPU's add_shared computes it. The gate's dot
// product is summed in a fixed order of this kernel's (strided partials,
// then a tree), so a token's gate is the same in any step; its bits are
// the device's, as the router's softmax is.

#include "common/params.wgsl"

@group(0) @binding(0) var<storage, read> h: array<f32>;
@group(0) @binding(1) var<storage, read> g: array<f32>;
@group(0) @binding(2) var<storage, read> sy: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;
@group(0) @binding(4) var<uniform> p: MoeSharedParams;

const WG: u32 = 64u;

var<workgroup> red: array<f32, WG>;

@compute @workgroup_size(64)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
) {
    let t = wid.x + wid.y * nwg.x;
    if (t >= p.n) {
        return;
    }
    let base = t * p.dim;
    var z = 0.0;
    for (var i = li; i < p.dim; i += WG) {
        z = fma(h[base + i], g[i], z);
    }
    red[li] = z;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (li < s) {
            red[li] = red[li] + red[li + s];
        }
        workgroupBarrier();
    }
    let gate = 1.0 / (1.0 + exp(-red[0]));
    for (var i = li; i < p.dim; i += WG) {
        out[base + i] = out[base + i] + sy[p.sy_offset + base + i] * gate;
    }
}
