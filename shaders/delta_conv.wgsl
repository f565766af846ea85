// Gated DeltaNet's causal depthwise convolution then SiLU, over one
// sequence's tokens in order, one invocation per channel: each output is
// the channel's taps (oldest first) times its window of past inputs then
// the token's own input, summed in that order as the CPU sums them; the
// window moves on by the token's input. x holds the q, k, v products
// (ch per token), y gets the activations at the same places.

#include "common/params.wgsl"

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read> taps: array<f32>;
@group(0) @binding(2) var<storage, read_write> state: array<f32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
@group(0) @binding(4) var<uniform> p: DeltaParams;

@compute @workgroup_size(64)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
) {
    let c = (wid.x + wid.y * nwg.x) * 64u + li;
    if (c >= p.ch) {
        return;
    }
    let k = p.kernel;
    let w = p.state_at + c;
    for (var t = 0u; t < p.n; t++) {
        let at = (p.first + t) * p.ch + c;
        let xv = x[at];
        var acc = 0.0;
        for (var j = 0u; j + 1u < k; j++) {
            acc = acc + taps[c * k + j] * state[w + j * p.ch];
        }
        acc = acc + taps[c * k + k - 1u] * xv;
        for (var j = 0u; j + 2u < k; j++) {
            state[w + j * p.ch] = state[w + (j + 1u) * p.ch];
        }
        state[w + (k - 2u) * p.ch] = xv;
        y[at] = acc / (1.0 + exp(-acc));
    }
}
