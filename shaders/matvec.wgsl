// y[c][r] = sum_k W[r][k] * x[c][k] for p.ncols <= MAXC = {{MAXC}} activation
// columns (MAXC 1: the decode mat-vec; 8: the small-batch variant that
// decodes each weight once for all columns). W is type {{TYPE}}, kept in its
// ggml blocks.
//
// The canonical order (crates/gpu/src/ops/matmul.rs) has 32 lanes per
// output: lane l sums the 32-weight units l, l + 32, l + 64 ... in
// increasing order, each unit's partial an fma chain over its weights, and
// the pairwise tree (v[l] += v[l + s], s = 16 .. 1) combines the lanes.
// This kernel runs those 32 lanes on TPR =
// {{TPR}} threads per row: thread t holds lanes t, t + TPR, t + 2*TPR ...
// (V = 32 / TPR accumulators), walks units t, t + TPR, ... and adds unit u
// into the accumulator of lane u % 32. Any TPR gives the same bits, so the
// mapping is chosen per device and shape (ops/matmul.rs, MatvecShape):
//
// * TPR 1 (CPU-like devices such as lavapipe): a thread owns whole rows, so
//   every invocation loads the same activation at the same time. With XSRC
//   `uniform` the activations are bound as a uniform buffer, which a
//   software rasteriser reads once per SIMD lane group (a storage load costs
//   a gather per lane, whatever the index: several times slower on
//   lavapipe, docs/perf/kernels.md, 2026-12-03). No lane idles when a row
//   has fewer than 32 units (K = 576 is 18 units), and the tree runs in
//   registers: no workgroup memory, no barrier.
// * TPR 8..32 (GPUs): a team of threads per row. Thread t does the tree's
//   levels that stay within its own lanes (16 .. TPR), then the team's TPR
//   values meet in workgroup memory for the last levels.
//
// Each thread computes RPT = {{RPT}} rows: the activations of a unit are
// loaded once and feed RPT rows (and the weights of a unit feed MAXC
// columns).
//
// GLU = {{GLU}}: with an activation (silu, gelu_tanh) W is a stacked
// [gate; up] weight of p.rows = 2 * half rows, RPT is 2, and a thread's two
// rows are gate row r and up row r + half; the kernel writes
// y[r] = act(gate) * up, the bits glu_split.wgsl gives on the same products.

// With a RoPE epilogue into f16 caches: the directive they need.
{{KV_ENABLE}}

#include "common/params.wgsl"

@group(0) @binding(0) var<storage, read> w: array<u32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
#include "common/w4_{{W4}}.wgsl"
@group(0) @binding({{PB}}) var<uniform> params: MatParams;
// The dispatch's parameters, moved to run z with RUNS = on
// (common/runs_on.wgsl); every include reads `p`.
var<private> p: MatParams;

// x4(i): activations i .. i + 3 (i a multiple of 4 for `uniform`); x1(i).
#include "common/x_{{XSRC}}.wgsl"
#include "common/runs_{{RUNS}}.wgsl"
#include "common/xnorm_{{NORM}}.wgsl"
#include "common/rope_epi_{{ROPE}}.wgsl"
#include "common/bytes.wgsl"
#include "quant/{{TYPE}}.wgsl"
#include "common/act.wgsl"

// ADD = {{ADD}}: the product is added to what y holds (the residual add,
// y + v as binary.wgsl's a + b). NORM = {{NORM}}: the activations are
// normed in a prologue (common/xnorm_on.wgsl).
fn add_epilogue(i: u32, v: f32) -> f32 {
    if (ADD) {
        return y[i] + v;
    }
    return v;
}

// Weight j of a decoded unit, with selects rather than a
// run-time index into the arrays, so they can stay in registers.
fn pick(u: array<vec4<f32>, 8>, j: u32) -> f32 {
    let q = j >> 2u;
    var v = u[0];
    for (var i = 1u; i < 8u; i++) {
        v = select(v, u[i], q == i);
    }
    let e = j & 3u;
    return select(select(v.x, v.y, e == 1u), select(v.z, v.w, e == 3u), e >= 2u);
}

const MAXC: u32 = {{MAXC}}u;
const LANES: u32 = 32u;
const TPR: u32 = {{TPR}}u;
const RPT: u32 = {{RPT}}u;
const WG: u32 = {{WG}}u;
const V: u32 = LANES / TPR;
const TEAMS: u32 = WG / TPR;
const ROWS: u32 = TEAMS * RPT;
const NACC: u32 = RPT * MAXC * V;
const GLU_ON: bool = {{GLU_ON}};
const ADD: bool = {{ADD}};
// ROPE = {{ROPE}}: RPT is 2 and a team's rows are a rotation pair of the
// stacked QKV product, stored by common/rope_epi_on.wgsl.
const ROPE_ON: bool = {{ROPE_ON}};

// Team partials of output (local row, column) o at team_at(o, t) when
// TPR > 1, and first the norm prologue's partials (common/rms.wgsl, which
// names it): {{WGMEM}} values, 1 when unused.
var<workgroup> rms_red: array<f32, {{WGMEM}}>;


@compute @workgroup_size({{WG}})
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
) {
    p = params;
    let wshift = run_setup(wid.z);
    if (p.ncols == 0u) {
        return;
    }
    norm_prologue(li);
    let team = li / TPR;
    let t = li % TPR;
    let wg_id = wid.x + wid.y * nwg.x;
    let units = (p.k + 31u) / 32u;
    // Output rows: p.rows, or the `half` gate rows of a GLU.
    let half = p.rows / 2u;
    var r0 = wg_id * ROWS;
    if (GLU_ON || ROPE_ON) {
        r0 = wg_id * TEAMS;
    }
    // Local row of the thread's rr-th row: rr * TEAMS + team, so that
    // neighbouring teams hold neighbouring rows (for a GLU: gate row
    // r0 + team, then its up row `half` further).
    var rbase: array<u32, RPT>;
    for (var rr = 0u; rr < RPT; rr++) {
        // Rows past the end compute on the last row (in bounds) and are not
        // written: every invocation runs the same loop, with no divergence.
        if (ROPE_ON) {
            rbase[rr] = rope_rows(min(r0 + team, half - 1u))[rr] * p.row_bytes;
        } else if (GLU_ON) {
            rbase[rr] = (min(r0 + team, half - 1u) + rr * half) * p.row_bytes;
        } else {
            rbase[rr] = min(r0 + rr * TEAMS + team, p.rows - 1u) * p.row_bytes;
        }
        rbase[rr] += wshift;
    }
    var acc: array<f32, NACC>;
    var m = 0u;
    for (var u = t; u < units; u += TPR) {
        let lane_acc = m % V;
        m += 1u;
        // The unit's 32 weights of each row (dq32 reads each block byte once).
        var wv: array<array<vec4<f32>, 8>, RPT>;
        for (var rr = 0u; rr < RPT; rr++) {
            wv[rr] = dq32(rbase[rr], u);
        }
        let k0 = 32u * u;
        for (var c = 0u; c < MAXC; c++) {
            if (c >= p.ncols) {
                break;
            }
            let xb = p.x_offset + c * p.x_stride + k0;
            // The unit's partial per row: s = fma(w[j], x[j], s), j ascending.
            var s: array<f32, RPT>;
            if (k0 + 32u <= p.k) {
                for (var i = 0u; i < 8u; i++) {
                    let xv = xn4(xb + 4u * i, k0 + 4u * i, c);
                    for (var rr = 0u; rr < RPT; rr++) {
                        let v = wv[rr][i];
                        s[rr] = fma(v.x, xv.x, s[rr]);
                        s[rr] = fma(v.y, xv.y, s[rr]);
                        s[rr] = fma(v.z, xv.z, s[rr]);
                        s[rr] = fma(v.w, xv.w, s[rr]);
                    }
                }
            } else {
                // A float row's short last unit: its valid weights only.
                let n = p.k - k0;
                for (var j = 0u; j < n; j++) {
                    let xv = xn1(xb + j, k0 + j, c);
                    for (var rr = 0u; rr < RPT; rr++) {
                        s[rr] = fma(pick(wv[rr], j), xv, s[rr]);
                    }
                }
            }
            for (var rr = 0u; rr < RPT; rr++) {
                let a = (rr * MAXC + c) * V + lane_acc;
                acc[a] = acc[a] + s[rr];
            }
        }
    }

    // The canonical tree, v[l] = v[l] + v[l + s] for s = 16 .. 1: first the
    // levels s >= TPR, whose pairs lie within this thread (lane t + TPR * i
    // is accumulator i, its partner t + TPR * (i + s / TPR)).
    for (var o = 0u; o < RPT * MAXC; o++) {
        for (var h = V / 2u; h > 0u; h >>= 1u) {
            for (var i = 0u; i < h; i++) {
                acc[o * V + i] = acc[o * V + i] + acc[o * V + i + h];
            }
        }
    }
    if (TPR == 1u && ROPE_ON) {
        let pi = r0 + team;
        for (var c = 0u; c < MAXC; c++) {
            if (c < p.ncols && pi < half) {
                rope_store(pi, c, acc[c * V], acc[(MAXC + c) * V]);
            }
        }
    } else if (TPR == 1u && GLU_ON) {
        let r = r0 + team;
        for (var c = 0u; c < MAXC; c++) {
            if (c < p.ncols && r < half) {
                y[p.y_offset + c * p.y_stride + r] =
                    {{GLU}}(acc[c * V]) * acc[(MAXC + c) * V];
            }
        }
    } else if (TPR == 1u) {
        for (var rr = 0u; rr < RPT; rr++) {
            let r = r0 + rr * TEAMS + team;
            for (var c = 0u; c < MAXC; c++) {
                if (c < p.ncols && r < p.rows) {
                    let i = p.y_offset + c * p.y_stride + p.row_offset + r;
                    y[i] = add_epilogue(i, acc[(rr * MAXC + c) * V]);
                }
            }
        }
    } else {
        // Then the levels s < TPR across the team, by one invocation per output.
        for (var rr = 0u; rr < RPT; rr++) {
            for (var c = 0u; c < MAXC; c++) {
                let o = (rr * TEAMS + team) * MAXC + c;
                rms_red[team_at(o, t)] = acc[(rr * MAXC + c) * V];
            }
        }
        workgroupBarrier();
        if (ROPE_ON) {
            // Output o pairs with the second row's output o + TEAMS * MAXC.
            for (var o = li; o < TEAMS * MAXC; o += WG) {
                let pi = r0 + o / MAXC;
                let c = o % MAXC;
                if (c < p.ncols && pi < half) {
                    rope_store(pi, c, team_tree(o), team_tree(o + TEAMS * MAXC));
                }
            }
            return;
        }
        if (GLU_ON) {
            // Output o pairs with the up row's output o + TEAMS * MAXC.
            for (var o = li; o < TEAMS * MAXC; o += WG) {
                let r = r0 + o / MAXC;
                let c = o % MAXC;
                if (c < p.ncols && r < half) {
                    let g = team_tree(o);
                    let u = team_tree(o + TEAMS * MAXC);
                    y[p.y_offset + c * p.y_stride + r] = {{GLU}}(g) * u;
                }
            }
            return;
        }
        for (var o = li; o < ROWS * MAXC; o += WG) {
            let r = r0 + o / MAXC;
            let c = o % MAXC;
            if (c < p.ncols && r < p.rows) {
                let i = p.y_offset + c * p.y_stride + p.row_offset + r;
                y[i] = add_epilogue(i, team_tree(o));
            }
        }
    }
}

// Where output o's team partial l lies: its own TPR slots, the lanes
// XOR-swizzled by o. Unswizzled, the invocations of `team_tree` (one per
// output, o consecutive) would read addresses TPR apart, all in one or two
// banks of a GPU's workgroup memory (a 16- or 32-way conflict); swizzled,
// consecutive outputs read different banks, and a team's writes of one
// output still do. The values and the order they are summed in are the same.
fn team_at(o: u32, l: u32) -> u32 {
    return o * TPR + (l ^ (o % TPR));
}

// The tree's levels s < TPR over the team partials of output o.
fn team_tree(o: u32) -> f32 {
    var v: array<f32, TPR>;
    for (var l = 0u; l < TPR; l++) {
        v[l] = rms_red[team_at(o, l)];
    }
    for (var h = TPR / 2u; h > 0u; h >>= 1u) {
        for (var l = 0u; l < h; l++) {
            v[l] = v[l] + v[l + h];
        }
    }
    return v[0];
}
