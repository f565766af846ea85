// The mat-vec's RMSNorm prologue (NORM = on): the activations are the raw
// hidden state, and each column is normed as rms_norm.wgsl norms it (the
// canonical reduction of common/rms.wgsl), times the norm weight `nw`, as
// it is loaded: (x * scale) * nw, rms_norm.wgsl's operations, so the
// products get the bits they would get from a normed copy, one dispatch
// and one round trip of the activations fewer. Each workgroup computes its
// columns' scales itself: K values per column, beside the rows × K weights
// it streams.

@group(0) @binding({{NB}}) var<storage, read> nw: array<f32>;

// The kernel's workgroup array `rms_red` holds at least 64 * MAXC values
// (matvec.wgsl's team partials reuse it after the prologue).
var<private> nsc: array<f32, MAXC>;

#include "common/rms.wgsl"

// Every invocation calls it, in uniform control flow, before any product.
fn norm_prologue(li: u32) {
    if (li < RMS_P) {
        for (var c = 0u; c < MAXC; c++) {
            var t = 0.0;
            if (c < p.ncols) {
                let xb = p.x_offset + c * p.x_stride;
                for (var i = li; i < p.k; i += RMS_P) {
                    let v = x1(xb + i);
                    t = fma(v, v, t);
                }
            }
            rms_red[c * RMS_P + li] = t;
        }
    }
    rms_tree(li, MAXC);
    for (var c = 0u; c < MAXC; c++) {
        nsc[c] = rms_scale(c, p.k, p.eps);
    }
    // Every invocation has its scales before the memory is reused.
    workgroupBarrier();
}

// Activations i .. i + 3 of column c, elements k .. k + 3 of its row.
fn xn4(i: u32, k: u32, c: u32) -> vec4<f32> {
    let w = vec4<f32>(nw[k], nw[k + 1u], nw[k + 2u], nw[k + 3u]);
    return (x4(i) * nsc[c]) * w;
}

fn xn1(i: u32, k: u32, c: u32) -> f32 {
    return (x1(i) * nsc[c]) * nw[k];
}
