// attention.wgsl's results, bit for bit, for the many tokens of a prompt on
// a CPU-backed device: one invocation per (token, head), the lanes of a
// subgroup the consecutive tokens of one head.
//
// Why: a software device (lavapipe) runs a subgroup as the SIMD lanes of
// one CPU thread and loads storage lane by lane, bounds-checked, even where
// every lane reads the same address. attention.wgsl gives each lane its own
// position, so each lane gathers its own key row, and it pays a dozen
// workgroup barriers (coroutine switches there) per token. Here the lanes
// are tokens of one sequence, so at position j they all want the same key
// and value row: each of the first eight lanes loads an eighth of it and
// subgroupBroadcast hands the row to every lane, 8 times fewer loads, and
// no barrier is needed. (When a subgroup's tokens belong to different
// sequences, as in a step that mixes sequences, each lane loads its own row
// instead: the same values, the old cost.)
//
// The same operations as attention.wgsl, evaluated in another order:
//   s_j   the same four fma chains over the head's dimensions, joined
//         (x + y) + (z + w), times scale (pass 1, recomputed in passes 2
//         and 3: the same operations on the same values give the same bits);
//   m_c   the maximum of the chunk's s_j (exact in any order);
//   l_c   the tree of 64 partials (partial i: e_j for j = c0 + i, + 64, ...
//         in increasing j), built as matvec_rows.wgsl's walk builds its lane
//         tree: the partials in the order the tree consumes them (the 6-bit
//         reversal of 0 .. 63), folded into a binary counter (pass 2);
//   o_c   R position lanes, lane r the fma chain of e_j v_j over j = c0 + r,
//         + R, ... in increasing j, the lanes added in increasing r (pass 3).
// Chunks (C = {{C}} positions), the partials' layout and the single-chunk
// output are attention.wgsl's; attention_combine.wgsl joins the chunks.
//
// HD = {{HD}} is a multiple of 32 (eight lanes load HD / 32 vec4s each) and
// at most 128 (ops/elementwise.rs): a lane holds its query, the broadcast
// row and two sets of value sums, 4 * HD values, and Gemma 3's heads of 256
// spilled enough of them to run slower than attention.wgsl, whose
// workgroups also share each key among the four query heads of the group
// (measured on lavapipe: docs/perf/lavapipe.md, 2026-12-06).
{{KV_ENABLE}}

#include "common/params.wgsl"

#include "common/attn_io.wgsl"
@group(0) @binding(6) var<uniform> params: AttnParams;

const WG: u32 = 64u;
const HD: u32 = {{HD}}u;
const HD4: u32 = HD / 4u;
// The vec4s of a row each of the first eight lanes loads.
const PER: u32 = HD4 / 8u;
const C: u32 = {{C}}u;
// attention.wgsl's partials of l (its workgroup size) and value lanes.
const LP: u32 = 64u;
const R: u32 = LP / HD4;
const BIG: u32 = 0xffffffffu;

var<private> p: AttnParams;
var<private> qv: array<vec4<f32>, HD4>;
// The row broadcast to every lane.
var<private> row: array<vec4<f32>, HD4>;

// Loads cache row `rw` (this lane's own) of `which` (0: keys, 1: values)
// into `row`. `same_row` (subgroup-uniform): every lane's `rw` is the same,
// so eight lanes load it and broadcast it.
fn load_row(which: u32, rw: u32, kvh: u32, same_row: bool, sgl: u32) {
    let b = rw * p.n_kv_head * HD4 + kvh * HD4;
    if (same_row) {
        var mine: array<vec4<f32>, PER>;
        let l8 = sgl & 7u;
        for (var m = 0u; m < PER; m++) {
            let at = b + m * 8u + l8;
            if (which == 0u) {
                mine[m] = k4(at);
            } else {
                mine[m] = v4(at);
            }
        }
        for (var m = 0u; m < PER; m++) {
            row[m * 8u] = subgroupBroadcast(mine[m], 0u);
            row[m * 8u + 1u] = subgroupBroadcast(mine[m], 1u);
            row[m * 8u + 2u] = subgroupBroadcast(mine[m], 2u);
            row[m * 8u + 3u] = subgroupBroadcast(mine[m], 3u);
            row[m * 8u + 4u] = subgroupBroadcast(mine[m], 4u);
            row[m * 8u + 5u] = subgroupBroadcast(mine[m], 5u);
            row[m * 8u + 6u] = subgroupBroadcast(mine[m], 6u);
            row[m * 8u + 7u] = subgroupBroadcast(mine[m], 7u);
        }
    } else {
        for (var i = 0u; i < HD4; i++) {
            if (which == 0u) {
                row[i] = k4(b + i);
            } else {
                row[i] = v4(b + i);
            }
        }
    }
}

// s_j for the key in `row`.
fn score() -> f32 {
    var d = vec4<f32>(0.0);
    for (var i = 0u; i < HD4; i++) {
        d = fma(qv[i], row[i], d);
    }
    return ((d.x + d.y) + (d.z + d.w)) * p.scale;
}

@compute @workgroup_size(64)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
    @builtin(subgroup_invocation_id) sgl: u32,
) {
    p = params;
    let tiles = (p.n_tokens + WG - 1u) / WG;
    let wgi = wid.x + wid.y * nwg.x;
    // Workgroup-uniform: past the grid's end the whole workgroup leaves.
    if (wgi >= tiles * p.n_head) {
        return;
    }
    let h = wgi / tiles;
    let t_own = (wgi % tiles) * WG + li;
    // Lanes past the last token compute on it and store nothing, so every
    // lane takes part in the broadcasts.
    let live = t_own < p.n_tokens;
    let t = min(t_own, p.n_tokens - 1u);
    let pos = tab[2u * (p.tab_first + t) + 1u];
    var lo = 0u;
    if (p.window > 0u && pos + 1u > p.window) {
        lo = pos + 1u - p.window;
    }
    let kvh = h / (p.n_head / p.n_kv_head);
    let base = tab[2u * (p.tab_first + t)] - pos % p.ring;
    let same_row = subgroupAll(base == subgroupBroadcastFirst(base));
    let qb4 = p.q_offset / 4u + (t * p.n_head + h) * HD4;
    for (var i = 0u; i < HD4; i++) {
        qv[i] = q[qb4 + i];
    }
    let c_first = subgroupMin(lo / C);
    let c_last = subgroupMax(pos / C);
    let single = lo / C == pos / C;
    for (var c = c_first; c <= c_last; c++) {
        let c0 = c * C;
        let mine = c >= lo / C && c <= pos / C;
        // This lane's positions in the chunk (none: an empty range), and
        // the subgroup's span of them: every loop below runs over the span
        // with the same trip count in every lane.
        var j_lo = BIG;
        var j_hi = 0u;
        if (mine) {
            j_lo = max(lo, c0);
            j_hi = min(pos, c0 + C - 1u);
        }
        let s_lo = subgroupMin(j_lo);
        let s_hi = subgroupMax(j_hi);

        // Pass 1: m_c.
        var m = -3.4028235e38;
        for (var j = s_lo; j <= s_hi; j++) {
            load_row(0u, base + j % p.ring, kvh, same_row, sgl);
            let s = score();
            if (j >= j_lo && j <= j_hi) {
                m = max(m, s);
            }
        }

        // Pass 2: l_c, partial i of 64 for i in the tree's order.
        var l0 = 0.0;
        var l1 = 0.0;
        var l2 = 0.0;
        var l3 = 0.0;
        var l4 = 0.0;
        var l = 0.0;
        for (var jb = 0u; jb < LP; jb++) {
            let i = reverseBits(jb) >> 26u;
            var t_i = 0.0;
            for (var j = c0 + i; j < c0 + C; j += LP) {
                if (j >= s_lo && j <= s_hi) {
                    load_row(0u, base + j % p.ring, kvh, same_row, sgl);
                    let s = score();
                    if (j >= j_lo && j <= j_hi) {
                        t_i += exp(s - m);
                    }
                }
            }
            if ((jb & 1u) == 0u) {
                l0 = t_i;
                continue;
            }
            t_i = l0 + t_i;
            if ((jb & 2u) == 0u) {
                l1 = t_i;
                continue;
            }
            t_i = l1 + t_i;
            if ((jb & 4u) == 0u) {
                l2 = t_i;
                continue;
            }
            t_i = l2 + t_i;
            if ((jb & 8u) == 0u) {
                l3 = t_i;
                continue;
            }
            t_i = l3 + t_i;
            if ((jb & 16u) == 0u) {
                l4 = t_i;
                continue;
            }
            t_i = l4 + t_i;
            if ((jb & 32u) == 0u) {
                l = t_i;
                continue;
            }
            l = l + t_i;
        }

        // Pass 3: o_c, position lane r over j = c0 + r, + R, ...
        var acc: array<vec4<f32>, HD4>;
        for (var r = 0u; r < R; r++) {
            var o: array<vec4<f32>, HD4>;
            for (var j = c0 + r; j < c0 + C; j += R) {
                if (j >= s_lo && j <= s_hi) {
                    load_row(0u, base + j % p.ring, kvh, same_row, sgl);
                    let s = score();
                    load_row(1u, base + j % p.ring, kvh, same_row, sgl);
                    if (j >= j_lo && j <= j_hi) {
                        let e = vec4<f32>(exp(s - m));
                        for (var i = 0u; i < HD4; i++) {
                            o[i] = fma(e, row[i], o[i]);
                        }
                    }
                }
            }
            for (var i = 0u; i < HD4; i++) {
                if (r == 0u) {
                    acc[i] = o[i];
                } else {
                    acc[i] += o[i];
                }
            }
        }

        if (live && mine) {
            if (single) {
                for (var i = 0u; i < HD4; i++) {
                    out[qb4 + i] = acc[i] * (1.0 / l);
                }
            } else {
                let at = ((t * p.n_head + h) * p.n_chunks + c) * (HD4 + 1u);
                for (var i = 0u; i < HD4; i++) {
                    part[at + i] = acc[i];
                }
                part[at + HD4] = vec4<f32>(m, l, 0.0, 0.0);
            }
        }
    }
}
