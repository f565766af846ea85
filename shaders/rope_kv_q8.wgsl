// rope_kv.wgsl for q8_0 caches: RoPE on the query heads (into q), RoPE on
// the key heads and the values, each quantized into its cache row as
// llama.cpp's q8_0 (see KvElem in ops/fused.rs for the 9-word block).
//
// A workgroup is one 32-value block of one head of one token: block
// `blk` of head h of token t, h over the n_head query heads, then the
// n_kv_head key heads, then the value heads, as in rope_kv.wgsl. Each of
// its 32 invocations makes one value with rope_kv.wgsl's operations
// (a rotated value's invocation rotates its whole pair and keeps its own
// half, so both halves get rope_kv.wgsl's bits), then the block is
// quantized as the CPU's cache does (lamina_quant::kv::q8_0_row, ggml's
// quantize_row_q8_0_ref): d = max|x| / 127, stored as f16; id = 1 / d
// from the f32 d; q = round(x · id), ties away from zero. WGSL lets a
// device divide within 2.5 ULP: lavapipe divides exactly (the tests
// compare the stored bytes with the CPU's); where a device does not, a
// value within an ulp of a rounding edge may land one step off the CPU's,
// and every step on that device still agrees with every other (one kernel
// writes every block).

#include "common/params.wgsl"

@group(0) @binding(0) var<storage, read> qk: array<f32>;
@group(0) @binding(1) var<storage, read> vs: array<f32>;
@group(0) @binding(2) var<storage, read_write> q: array<f32>;
@group(0) @binding(3) var<storage, read_write> kc: array<u32>;
@group(0) @binding(4) var<storage, read_write> vc: array<u32>;
@group(0) @binding(5) var<storage, read> tab: array<u32>;
@group(0) @binding(6) var<uniform> p: RopeKvParams;

#include "common/rope_rot.wgsl"

var<workgroup> xs: array<f32, 32>;

// x rounded to an integer, ties away from zero (Rust's f32::round; WGSL's
// round() ties to even). x - trunc(x) is exact.
fn round_away(x: f32) -> f32 {
    let t = trunc(x);
    return select(t, t + sign(x), abs(x - t) >= 0.5);
}

@compute @workgroup_size(32)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
) {
    let idx = wid.x + wid.y * nwg.x;
    let blocks = p.head_dim / 32u;
    let heads = p.n_head + 2u * p.n_kv_head;
    // Workgroup-uniform: every branch below on it keeps the barrier in
    // uniform control flow.
    if (idx >= p.n_tokens * heads * blocks) {
        return;
    }
    let blk = idx % blocks;
    let h = (idx / blocks) % heads;
    let t = idx / (blocks * heads);
    let src = p.src_base + t * p.stride + h * p.head_dim;
    let e = blk * 32u + li;
    var y: f32;
    if (h >= p.n_head + p.n_kv_head) {
        y = vs[src + e];
    } else if (e < p.n_rot) {
        // The pair holding element e, as rope_kv.wgsl numbers them.
        let i = select(e / 2u, e % (p.n_rot / 2u), p.neox != 0u);
        let ab = rope_pair(i, p.n_rot, p.neox != 0u);
        let pos = tab[2u * (p.tab_first + t) + 1u];
        let r = rope_rotate(qk[src + ab.x], qk[src + ab.y], pos, i, p.n_rot, p.freq_base, rope_factor(p.ff_at, i), p.freq_scale, p.mscale);
        y = select(r.y, r.x, e == ab.x);
    } else {
        y = qk[src + e];
    }
    if (h < p.n_head) {
        q[p.q_base + t * p.n_head * p.head_dim + h * p.head_dim + e] = y;
        return;
    }
    xs[li] = y;
    workgroupBarrier();
    if (li > 8u) {
        return;
    }
    // max is exact, so any order gives the CPU's amax.
    var amax = 0.0;
    for (var j = 0u; j < 32u; j++) {
        amax = max(amax, abs(xs[j]));
    }
    let d = amax / 127.0;
    let kvd = p.n_kv_head * p.head_dim;
    let is_v = h >= p.n_head + p.n_kv_head;
    let head = select(h - p.n_head, h - p.n_head - p.n_kv_head, is_v);
    let row = tab[2u * (p.tab_first + t)];
    let at = ((row * kvd + head * p.head_dim) / 32u + blk) * 9u + li;
    var word = 0u;
    if (li == 8u) {
        word = pack2x16float(vec2<f32>(d, 0.0)) & 0xffffu;
    } else {
        let id = select(0.0, 1.0 / d, d != 0.0);
        for (var b = 0u; b < 4u; b++) {
            let qv = i32(round_away(xs[4u * li + b] * id));
            word |= (bitcast<u32>(qv) & 0xffu) << (8u * b);
        }
    }
    if (is_v) {
        vc[at] = word;
    } else {
        kc[at] = word;
    }
}
