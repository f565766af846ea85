// The step after the stacked QKV product, in one dispatch: RoPE on the
// query heads (into q, packed [token][n_head * head_dim]) and on the key
// heads (into the key cache at the token's position), and the values
// copied into the value cache. Token t's row of the product is `stride`
// values from element src_base + t * stride: n_head query heads, n_kv_head
// key heads, n_kv_head value heads. Queries and keys come from `qk` (after
// per-head norms, if any), values from `vs`. The rotation is rope.wgsl's,
// operation for operation. The caches store {{KV}} (f16: each value
// rounded to nearest as it is stored).
{{KV_ENABLE}}

#include "common/params.wgsl"

@group(0) @binding(0) var<storage, read> qk: array<f32>;
@group(0) @binding(1) var<storage, read> vs: array<f32>;
@group(0) @binding(2) var<storage, read_write> q: array<f32>;
@group(0) @binding(3) var<storage, read_write> kc: array<{{KV}}>;
@group(0) @binding(4) var<storage, read_write> vc: array<{{KV}}>;
@group(0) @binding(5) var<storage, read> tab: array<u32>;
@group(0) @binding(6) var<uniform> p: RopeKvParams;

#include "common/rope_rot.wgsl"

@compute @workgroup_size(256)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
) {
    let idx = (wid.x + wid.y * nwg.x) * 256u + li;
    let half = p.head_dim / 2u;
    let heads = p.n_head + 2u * p.n_kv_head;
    if (idx >= p.n_tokens * heads * half) {
        return;
    }
    let i = idx % half;
    let h = (idx / half) % heads;
    let t = idx / (half * heads);
    let src = p.src_base + t * p.stride + h * p.head_dim;
    let kvd = p.n_kv_head * p.head_dim;
    let row = tab[2u * (p.tab_first + t)];
    let cache_base = row * kvd;
    if (h >= p.n_head + p.n_kv_head) {
        // A value head: copied as it is.
        let dst = cache_base + (h - p.n_head - p.n_kv_head) * p.head_dim;
        vc[dst + 2u * i] = {{KV}}(vs[src + 2u * i]);
        vc[dst + 2u * i + 1u] = {{KV}}(vs[src + 2u * i + 1u]);
        return;
    }
    let is_q = h < p.n_head;
    var dst = cache_base + (h - p.n_head) * p.head_dim;
    if (is_q) {
        dst = p.q_base + t * p.n_head * p.head_dim + h * p.head_dim;
    }
    let ab = rope_pair(i, p.n_rot, p.neox != 0u);
    var y = vec2<f32>(qk[src + ab.x], qk[src + ab.y]);
    if (2u * i < p.n_rot) {
        let pos = tab[2u * (p.tab_first + t) + 1u];
        y = rope_rotate(y.x, y.y, pos, i, p.n_rot, p.freq_base, rope_factor(p.ff_at, i), p.freq_scale, p.mscale);
    }
    if (is_q) {
        q[dst + ab.x] = y.x;
        q[dst + ab.y] = y.y;
    } else {
        kc[dst + ab.x] = {{KV}}(y.x);
        kc[dst + ab.y] = {{KV}}(y.y);
    }
}
