// The mat-vec's RoPE epilogue (ROPE = on), for the stacked QKV product: a
// thread's two rows are a rotation pair of one head (rope_rot.wgsl), the
// queries go to y rotated (packed [token][n_head * head_dim] from
// p.y_offset), the keys rotated and the values as they are into the
// caches at the token's row (the token table). rope_kv.wgsl's operations
// on the product's values, so the same bits, one dispatch and one round
// trip of the product fewer. Rows: n_head query heads, then n_kv_head key
// heads, then n_kv_head value heads, p.head_dim each; p.rows / 2 pairs.

// The caches store {{KV}} (the kernel's root starts with the f16 enable
// directive where that needs one).
@group(0) @binding({{KB}}) var<storage, read_write> kc: array<{{KV}}>;
@group(0) @binding({{VB}}) var<storage, read_write> vc: array<{{KV}}>;
@group(0) @binding({{TB}}) var<storage, read> tab: array<u32>;

#include "common/rope_rot.wgsl"

// The two product rows of pair `pi`.
fn rope_rows(pi: u32) -> vec2<u32> {
    let half = p.head_dim / 2u;
    let h = pi / half;
    let rotates = h < p.n_head + p.n_kv_head;
    return rope_pair(pi % half, p.n_rot, rotates && p.neox != 0u) + h * p.head_dim;
}

// Stores pair `pi` of column c, whose rows' products are v0 and v1.
fn rope_store(pi: u32, c: u32, v0: f32, v1: f32) {
    let half = p.head_dim / 2u;
    let h = pi / half;
    let i = pi % half;
    let rows = rope_rows(pi);
    let te = 2u * (p.tab_first + c);
    let kvd = p.n_kv_head * p.head_dim;
    let qd = p.n_head * p.head_dim;
    let cache = tab[te] * kvd;
    if (h >= p.n_head + p.n_kv_head) {
        vc[cache + rows.x - qd - kvd] = {{KV}}(v0);
        vc[cache + rows.y - qd - kvd] = {{KV}}(v1);
        return;
    }
    var o = vec2<f32>(v0, v1);
    if (2u * i < p.n_rot) {
        o = rope_rotate(
            v0,
            v1,
            tab[te + 1u],
            i,
            p.n_rot,
            p.freq_base,
            rope_factor(p.ff_at, i),
            p.freq_scale,
            p.mscale,
        );
    }
    if (h < p.n_head) {
        y[p.y_offset + c * p.y_stride + rows.x] = o.x;
        y[p.y_offset + c * p.y_stride + rows.y] = o.y;
    } else {
        kc[cache + rows.x - qd] = {{KV}}(o.x);
        kc[cache + rows.y - qd] = {{KV}}(o.y);
    }
}
