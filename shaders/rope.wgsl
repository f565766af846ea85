// Rotary position embedding over x[token][head][head_dim]. Token t has
// position pos_offset + t; pair i (i < n_rot/2) turns by
// theta = pos * freq_base^(-2i/n_rot). Normal ordering rotates
// (x[2i], x[2i+1]); NeoX ordering rotates (x[i], x[i + n_rot/2]).
// Dimensions from n_rot on are copied unchanged. Token 0 starts at element
// p.base of x and y (one sequence of a batch of several).

#include "common/params.wgsl"

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> y: array<f32>;
@group(0) @binding(2) var<uniform> p: RopeParams;

const TAU: f32 = 6.283185307179586;

@compute @workgroup_size(256)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
) {
    let idx = (wid.x + wid.y * nwg.x) * 256u + li;
    let half = p.head_dim / 2u;
    let rows = p.n_tokens * p.n_heads;
    if (idx >= rows * half) {
        return;
    }
    let row = idx / half;
    let i = idx % half;
    let base = p.base + row * p.head_dim;
    if (2u * i >= p.n_rot) {
        y[base + 2u * i] = x[base + 2u * i];
        y[base + 2u * i + 1u] = x[base + 2u * i + 1u];
        return;
    }
    let pos = f32(p.pos_offset + row / p.n_heads);
    let inv_freq = exp2(-2.0 * f32(i) / f32(p.n_rot) * log2(p.freq_base));
    var theta = pos * inv_freq;
    // Keep the argument in [-pi, pi], where WGSL bounds the error of cos/sin.
    theta = theta - TAU * round(theta / TAU);
    let c = cos(theta);
    let s = sin(theta);
    var a = base + 2u * i;
    var b = a + 1u;
    if (p.neox != 0u) {
        a = base + i;
        b = base + i + p.n_rot / 2u;
    }
    let x0 = x[a];
    let x1 = x[b];
    y[a] = x0 * c - x1 * s;
    y[b] = x0 * s + x1 * c;
}
