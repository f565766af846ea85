// Gated DeltaNet's delta rule over one sequence's tokens in order, one
// workgroup per value head h: its state M (head_v rows of head_k, row j
// holding S[.][j]) decays by exp(g), row j learns (v_j - M_j . k) beta
// along k, and output j is M_j . q / sqrt(head_k). Each invocation owns
// rows j, j + 64, ...: no row is shared, so the only barriers guard the
// token's q and k in workgroup memory. beta and alpha hold each token's
// n_v logits; g = softplus(alpha + dt) * a.

#include "common/params.wgsl"

@group(0) @binding(0) var<storage, read> y: array<f32>;
@group(0) @binding(1) var<storage, read> beta: array<f32>;
@group(0) @binding(2) var<storage, read> alpha: array<f32>;
@group(0) @binding(3) var<storage, read> dt: array<f32>;
@group(0) @binding(4) var<storage, read> a: array<f32>;
@group(0) @binding(5) var<storage, read_write> state: array<f32>;
@group(0) @binding(6) var<storage, read_write> out: array<f32>;
@group(0) @binding(7) var<uniform> p: DeltaParams;

const MAX_HEAD: u32 = 256u;
var<workgroup> qs: array<f32, MAX_HEAD>;
var<workgroup> ks: array<f32, MAX_HEAD>;

fn softplus(v: f32) -> f32 {
    if (v > 20.0) {
        return v;
    }
    return log(1.0 + exp(v));
}

@compute @workgroup_size(64)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
) {
    let h = wid.x;
    var kh = h % p.n_k;
    if (p.grouped != 0u) {
        kh = h / (p.n_v / p.n_k);
    }
    let hk = p.head_k;
    let hv = p.head_v;
    let kd = p.n_k * hk;
    let m0 = p.mat_at + h * hv * hk;
    let bias = dt[h];
    let rate = a[h];
    for (var t = 0u; t < p.n; t++) {
        let row = (p.first + t) * p.ch;
        workgroupBarrier();
        for (var i = li; i < hk; i += 64u) {
            qs[i] = y[row + kh * hk + i];
            ks[i] = y[row + kd + kh * hk + i];
        }
        workgroupBarrier();
        let tv = (p.first + t) * p.n_v + h;
        let b = 1.0 / (1.0 + exp(-beta[tv]));
        let decay = exp(softplus(alpha[tv] + bias) * rate);
        for (var j = li; j < hv; j += 64u) {
            let base = m0 + j * hk;
            var sk = 0.0;
            for (var i = 0u; i < hk; i++) {
                let m = state[base + i] * decay;
                state[base + i] = m;
                sk = sk + m * ks[i];
            }
            let d = (y[row + 2u * kd + h * hv + j] - sk) * b;
            var o = 0.0;
            for (var i = 0u; i < hk; i++) {
                let m = state[base + i] + d * ks[i];
                state[base + i] = m;
                o = o + m * qs[i];
            }
            out[(p.first + t) * p.n_v * hv + h * hv + j] = o * p.scale;
        }
    }
}
