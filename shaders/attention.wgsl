// Causal multi-head attention over a KV cache, split over positions
// (flash-decoding): a workgroup serves GC = {{GC}} query heads of one token
// that share a KV head (grouped-query attention) over one chunk of the
// token's positions, so a single decoded token still spreads over many
// workgroups and no score leaves the workgroup.
//
// Token t is entry p.tab_first + t of the token table `tab`, (cache row,
// position) as two u32; position j of its sequence is in row base + j mod
// p.ring (base = row - pos mod p.ring, the sequence's first row; p.ring is
// u32::MAX except for a sliding-window layer's ring of rows), and it attends
// to positions lo ..= pos, lo = 0 or the start of its sliding window; query head h reads KV head
// h / (n_head / n_kv_head). Chunk c holds the absolute positions
// c * C .. c * C + C - 1 (C = {{C}}); token t's chunks are lo / C ..= pos / C,
// so how a token is split depends on its position and window only, never on
// the other tokens of its step. For the positions J of chunk c:
//
//     s_j = scale * q . k_j     (four fma chains over the head's dimensions,
//                                 one per vec4 lane, joined (x + y) + (z + w))
//     m_c = max_J s_j;  e_j = exp(s_j - m_c)
//     l_c = tree over the WG invocations of (each invocation's e_j summed in
//           increasing j, j = c * C + li, + WG, ...)
//     o_c = sum_J e_j v_j       (R position lanes, lane r taking j = r, r + R,
//                                 ... in increasing order, the lanes added in
//                                 increasing r)
//
// A token with one chunk writes out = o_c * (1 / l_c) here; otherwise the
// chunk's (o_c, m_c, l_c) go to the partials and attention_combine.wgsl joins
// them. GC divides the group size; the host picks it per step, and it never
// changes a head's bits.
//
// Layouts: q and out [n_tokens][n_head][HD]; k and v
// [position][n_kv_head][HD]; part [n_tokens][n_head][n_chunks] entries of
// HD / 4 + 1 vec4s (o_c, then (m_c, l_c, 0, 0)). q and out start at element
// p.q_offset. With the table, one dispatch serves the tokens of several
// sequences over one cache buffer. The caches hold {{KV}}, widened to f32
// as they are loaded.
{{KV_ENABLE}}

#include "common/params.wgsl"

#include "common/attn_io.wgsl"
@group(0) @binding(6) var<uniform> p: AttnParams;

const WG: u32 = 64u;
const GC: u32 = {{GC}}u;
const HD: u32 = {{HD}}u;
const HD4: u32 = HD / 4u;
const C: u32 = {{C}}u;
// Position lanes of the value pass: the invocations that share a column.
const R: u32 = {{R}}u;

// The GC heads' queries.
var<workgroup> qs: array<vec4<f32>, {{QS4}}>;
// The GC heads' scores, then their weights e_j, then the lanes' value sums
// (GC * R * HD4 vec4s, no more than GC * C floats).
var<workgroup> es: array<f32, {{ES}}>;
// One reduction slot per head and invocation.
var<workgroup> red: array<f32, {{RED}}>;

// The tree over red[g * WG ..][..WG] for every head g (max when `is_max`,
// else sum); all invocations must call it. Leaves red[g * WG] holding the
// result.
fn reduce(is_max: bool, li: u32) {
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (li < s) {
            for (var g = 0u; g < GC; g++) {
                let a = red[g * WG + li];
                let b = red[g * WG + li + s];
                red[g * WG + li] = select(a + b, max(a, b), is_max);
            }
        }
        workgroupBarrier();
    }
}

@compute @workgroup_size(64)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
) {
    let per_token = p.n_head / GC;
    let wgi = wid.x + wid.y * nwg.x;
    if (wgi >= p.n_tokens * per_token * p.n_chunks) {
        return;
    }
    let c = wgi % p.n_chunks;
    let th = wgi / p.n_chunks;
    let t = th / per_token;
    let h0 = (th % per_token) * GC;
    let pos = tab[2u * (p.tab_first + t) + 1u];
    var lo = 0u;
    if (p.window > 0u && pos + 1u > p.window) {
        lo = pos + 1u - p.window;
    }
    // Workgroup-uniform: the whole workgroup leaves or stays.
    if (c < lo / C || c > pos / C) {
        return;
    }
    let kvh = h0 / (p.n_head / p.n_kv_head);
    let kv_stride4 = p.n_kv_head * HD4;
    // Keys and values of position j sit at row base + j mod ring.
    let base = tab[2u * (p.tab_first + t)] - pos % p.ring;
    let c0 = c * C;
    let j_lo = max(lo, c0);
    let j_hi = min(pos, c0 + C - 1u);
    // The GC heads are contiguous in q and out.
    let qb4 = p.q_offset / 4u + (t * p.n_head + h0) * HD4;
    for (var i = li; i < GC * HD4; i += WG) {
        qs[i] = q[qb4 + i];
    }
    workgroupBarrier();

    // The passes below visit only the rounds u of WG positions that hold
    // some of j_lo ..= j_hi (workgroup-uniform bounds): the others would
    // score and weigh nothing (a short context leaves most of a chunk's
    // rounds empty).
    let u_lo = (j_lo - c0) / WG;
    let u_hi = (j_hi - c0) / WG;
    var m: array<f32, GC>;
    for (var g = 0u; g < GC; g++) {
        m[g] = -3.4028235e38;
    }
    for (var u = u_lo; u <= u_hi; u++) {
        let jj = u * WG + li;
        let j = c0 + jj;
        if (j >= j_lo && j <= j_hi) {
            let kb4 = (base + j % p.ring) * kv_stride4 + kvh * HD4;
            var d: array<vec4<f32>, GC>;
            for (var i = 0u; i < HD4; i++) {
                let kv = k4(kb4 + i);
                for (var g = 0u; g < GC; g++) {
                    d[g] = fma(qs[g * HD4 + i], kv, d[g]);
                }
            }
            for (var g = 0u; g < GC; g++) {
                let s = ((d[g].x + d[g].y) + (d[g].z + d[g].w)) * p.scale;
                es[g * C + jj] = s;
                m[g] = max(m[g], s);
            }
        }
    }
    for (var g = 0u; g < GC; g++) {
        red[g * WG + li] = m[g];
    }
    reduce(true, li);
    for (var g = 0u; g < GC; g++) {
        m[g] = red[g * WG];
    }
    workgroupBarrier();

    var l: array<f32, GC>;
    for (var u = u_lo; u <= u_hi; u++) {
        let jj = u * WG + li;
        let j = c0 + jj;
        let valid = j >= j_lo && j <= j_hi;
        for (var g = 0u; g < GC; g++) {
            // Positions outside the token's range weigh exactly 0.
            var e = 0.0;
            if (valid) {
                e = exp(es[g * C + jj] - m[g]);
                l[g] += e;
            }
            es[g * C + jj] = e;
        }
    }
    for (var g = 0u; g < GC; g++) {
        red[g * WG + li] = l[g];
    }
    // The tree's barriers also publish every invocation's e_j.
    reduce(false, li);
    for (var g = 0u; g < GC; g++) {
        l[g] = red[g * WG];
    }

    // Value pass: invocation li takes column li % HD4 (and every WG-th
    // column after it when HD4 > WG) over position lane li / HD4.
    let lane = li / HD4;
    let jj_lo = j_lo - c0;
    let jj_hi = j_hi - c0;
    // Columns this invocation finishes, at most ceil(HD4 / WG) of them: the
    // lane sums need a second pass only when R > 1, and then each
    // invocation has one column.
    var o: array<vec4<f32>, GC>;
    if (lane < R) {
        for (var cq = li % HD4; cq < HD4; cq += WG) {
            for (var g = 0u; g < GC; g++) {
                o[g] = vec4<f32>(0.0);
            }
            var jj = lane;
            // The first j of this lane at or after the range's start.
            if (jj < jj_lo) {
                jj += (jj_lo - jj + R - 1u) / R * R;
            }
            for (; jj <= jj_hi; jj += R) {
                let vv = v4((base + (c0 + jj) % p.ring) * kv_stride4 + kvh * HD4 + cq);
                for (var g = 0u; g < GC; g++) {
                    o[g] = fma(vec4<f32>(es[g * C + jj]), vv, o[g]);
                }
            }
            if (R == 1u) {
                finish(t, c, h0, cq, pos, lo, o, m, l, qb4);
            }
        }
    }
    if (R > 1u) {
        // Every e_j has been read before the lanes' sums overwrite them.
        workgroupBarrier();
        if (lane < R) {
            let cq = li % HD4;
            for (var g = 0u; g < GC; g++) {
                let at = ((g * R + lane) * HD4 + cq) * 4u;
                es[at] = o[g].x;
                es[at + 1u] = o[g].y;
                es[at + 2u] = o[g].z;
                es[at + 3u] = o[g].w;
            }
        }
        workgroupBarrier();
        if (li < HD4) {
            for (var g = 0u; g < GC; g++) {
                var sum = vec4<f32>(0.0);
                for (var r = 0u; r < R; r++) {
                    let at = ((g * R + r) * HD4 + li) * 4u;
                    let x = vec4<f32>(es[at], es[at + 1u], es[at + 2u], es[at + 3u]);
                    if (r == 0u) {
                        sum = x;
                    } else {
                        sum += x;
                    }
                }
                o[g] = sum;
            }
            finish(t, c, h0, li, pos, lo, o, m, l, qb4);
        }
    }
}

// Column cq of the GC heads' chunk results: the output itself when the
// token has this one chunk, else its partial (with m_c and l_c, written by
// the invocation of column 0).
fn finish(
    t: u32,
    c: u32,
    h0: u32,
    cq: u32,
    pos: u32,
    lo: u32,
    o: array<vec4<f32>, GC>,
    m: array<f32, GC>,
    l: array<f32, GC>,
    qb4: u32,
) {
    let single = lo / C == pos / C;
    for (var g = 0u; g < GC; g++) {
        if (single) {
            out[qb4 + g * HD4 + cq] = o[g] * (1.0 / l[g]);
        } else {
            let at = ((t * p.n_head + h0 + g) * p.n_chunks + c) * (HD4 + 1u);
            part[at + cq] = o[g];
            if (cq == 0u) {
                part[at + HD4] = vec4<f32>(m[g], l[g], 0.0, 0.0);
            }
        }
    }
}
