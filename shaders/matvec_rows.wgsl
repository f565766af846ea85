// The mat-vec / small-N kernel with one thread per row (TPR 1: CPU-backed
// devices such as lavapipe, see matvec.wgsl for the layout and why), for
// p.ncols <= MAXC = {{MAXC}} columns and RPT = {{RPT}} rows per thread. W is
// type {{TYPE}}.
//
// It produces the canonical order's bits (crates/gpu/src/ops/matmul.rs)
// without holding the 32 lane partials of every output: it walks the lanes
// in the order the canonical tree consumes them, 0, 16, 8, 24, 4, ... (the
// 5-bit reversal of 0 .. 31), and folds each finished lane into a binary
// counter of five levels. Level b holds the left half of the next pair at
// that height, so lane j's partial t becomes
//   t = level[0] + t, then level[1] + t, ... for each trailing one bit of j,
// and is stored at the first zero bit: exactly v[l] = v[l] + v[l + s] for
// s = 16 .. 1, with 6 values per output in registers instead of 32 in
// per-invocation memory (which a software rasteriser indexes lane by lane).
//
// NORM = {{NORM}}: the activations are normed in a prologue
// (common/xnorm_on.wgsl).
//
// NE = {{NE}}: after the residual add, the last workgroup norms the new
// hidden state (common/norm_epi_on.wgsl).
//
// GLU = {{GLU}}: with an activation (silu, gelu_tanh) W is a stacked
// [gate; up] weight of p.rows = 2 * half rows, RPT is 2, and a thread's two
// rows are gate row r and up row r + half; it writes y[r] = act(gate) * up,
// the bits glu_split.wgsl gives on the same products, one dispatch fewer.
//
// SG = {{SG}}: with subgroups of at least 8 invocations, a unit's 32
// activations are loaded once per subgroup, a vec4 per invocation, and
// handed to every invocation by subgroupBroadcast: a CPU-backed device
// gathers a storage or uniform load lane by lane even when every lane reads
// the same address, so this is 8 times fewer loads for the same values.
// Control flow is uniform wherever it runs (rows past the end compute on
// the last row), so every invocation takes part. (Naga takes subgroup
// operations without an `enable` directive when the device has them.)

// With a RoPE epilogue into f16 caches: the directive they need.
{{KV_ENABLE}}

#include "common/params.wgsl"

@group(0) @binding(0) var<storage, read> w: array<u32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
#include "common/w4_{{W4}}.wgsl"
@group(0) @binding({{PB}}) var<uniform> params: MatParams;
// The parameters of this workgroup's columns: the dispatch's, moved to
// column chunk wid.z (MAXC columns each), so one dispatch covers a whole
// prompt's columns instead of one dispatch per MAXC (a CPU-backed device
// pays tens of microseconds per dispatch). Every include reads `p`.
var<private> p: MatParams;

#include "common/x_{{XSRC}}.wgsl"
#include "common/runs_{{RUNS}}.wgsl"
#include "common/xnorm_{{NORM}}.wgsl"
#include "common/rope_epi_{{ROPE}}.wgsl"
#include "common/norm_epi_{{NE}}.wgsl"
#include "common/bytes.wgsl"
#include "quant/{{TYPE}}.wgsl"
#include "common/act.wgsl"
#include "common/unit_x_{{SG}}.wgsl"

// ADD = {{ADD}}: the product is added to what y holds (the residual add
// after the attention output and down projections, y + v as binary.wgsl's
// a + b), one dispatch fewer.
fn add_epilogue(i: u32, v: f32) -> f32 {
    if (ADD) {
        return y[i] + v;
    }
    return v;
}

fn pick(u: array<vec4<f32>, 8>, j: u32) -> f32 {
    let q = j >> 2u;
    var v = u[0];
    for (var i = 1u; i < 8u; i++) {
        v = select(v, u[i], q == i);
    }
    let e = j & 3u;
    return select(select(v.x, v.y, e == 1u), select(v.z, v.w, e == 3u), e >= 2u);
}

// The norm prologue's partials ({{WGMEM}} values, 1 when unused).
var<workgroup> rms_red: array<f32, {{WGMEM}}>;

const MAXC: u32 = {{MAXC}}u;
const RPT: u32 = {{RPT}}u;
const WG: u32 = {{WG}}u;
const ROWS: u32 = WG * RPT;
const NO: u32 = RPT * MAXC;
const GLU_ON: bool = {{GLU_ON}};
const ADD: bool = {{ADD}};
// ROPE = {{ROPE}}: RPT is 2 and a thread's rows are a rotation pair of the
// stacked QKV product, stored by common/rope_epi_on.wgsl.
const ROPE_ON: bool = {{ROPE_ON}};
// Unit groups (WALK = groups): UG adjacent units decoded from one load of
// their shared words; CLB = log2(32 / UG).
const UG: u32 = {{UG}}u;
const CLB: u32 = {{CLB}}u;

// Canonical step 1 for unit `u` of every output this thread holds: the
// partial of row rr (weights `wv[rr]`) and column c at rr * MAXC + c
// (columns past p.ncols hold values never written). `sgl` is the subgroup
// invocation (SG on).
//
// A unit's fma chains run interleaved: weight by weight, every column's
// and row's chain takes its next step. Each chain is 32 dependent steps
// (the canonical order allows no other), and a CPU-backed device runs them
// as written: one column at a time leaves it waiting on each add's latency
// with only RPT chains to overlap, all columns at once give it RPT * MAXC.
// Each chain's own steps are unchanged, so are the bits. Columns past
// p.ncols compute on the last column, so no branch splits the block: a step
// of fewer than 8 columns picks the smallest compiled MAXC (1, 2, 4, 8)
// that holds them, a remainder of 1-4 columns past full chunks gets a
// narrower dispatch (ops/matmul.rs), so a chunk computes at most 3 columns
// it does not have. Runs (RUNS = on), whose column counts vary from
// chunk to chunk, and the one-column kernel take unit_partials_cols.
fn unit_partials(wv: array<array<vec4<f32>, 8>, RPT>, u: u32, sgl: u32) -> array<f32, NO> {
    var o: array<f32, NO>;
    let k0 = 32u * u;
    if (MAXC == 1u || RUNS_ON) {
        return unit_partials_cols(wv, u, sgl);
    }
    if (k0 + 32u <= p.k) {
        var xp: array<XPart, MAXC>;
        for (var c = 0u; c < MAXC; c++) {
            let cc = min(c, p.ncols - 1u);
            xp[c] = unit_x_part(p.x_offset + cc * p.x_stride + k0, k0, cc, sgl);
        }
        // Written out: `i` a constant in each, so nothing below indexes
        // private memory at run time.
        o = unit_vec4(o, wv, xp, 0u);
        o = unit_vec4(o, wv, xp, 1u);
        o = unit_vec4(o, wv, xp, 2u);
        o = unit_vec4(o, wv, xp, 3u);
        o = unit_vec4(o, wv, xp, 4u);
        o = unit_vec4(o, wv, xp, 5u);
        o = unit_vec4(o, wv, xp, 6u);
        o = unit_vec4(o, wv, xp, 7u);
        return o;
    }
    for (var c = 0u; c < MAXC; c++) {
        if (c >= p.ncols) {
            break;
        }
        let s = short_unit(wv, k0, c);
        for (var rr = 0u; rr < RPT; rr++) {
            o[rr * MAXC + c] = s[rr];
        }
    }
    return o;
}

// A float row's short last unit against column c: its valid weights only,
// one chain per row.
fn short_unit(wv: array<array<vec4<f32>, 8>, RPT>, k0: u32, c: u32) -> array<f32, RPT> {
    var s: array<f32, RPT>;
    let xb = p.x_offset + c * p.x_stride + k0;
    let n = p.k - k0;
    for (var jj = 0u; jj < n; jj++) {
        let xv = xn1(xb + jj, k0 + jj, c);
        for (var rr = 0u; rr < RPT; rr++) {
            s[rr] = fma(pick(wv[rr], jj), xv, s[rr]);
        }
    }
    return s;
}

// unit_partials column by column, only the RPT row chains interleaved: for
// the one-column kernel (the interleaved form is slower there on lavapipe,
// its code otherwise the same but laid out differently:
// docs/perf/lavapipe.md, 2026-12-07), and for runs, which skip the
// columns they do not have.
fn unit_partials_cols(wv: array<array<vec4<f32>, 8>, RPT>, u: u32, sgl: u32) -> array<f32, NO> {
    var o: array<f32, NO>;
    let k0 = 32u * u;
    for (var c = 0u; c < MAXC; c++) {
        if (c >= p.ncols) {
            break;
        }
        let xb = p.x_offset + c * p.x_stride + k0;
        var s: array<f32, RPT>;
        if (k0 + 32u <= p.k) {
            let xs = unit_x_all(unit_x_part(xb, k0, c, sgl));
            for (var i = 0u; i < 8u; i++) {
                let xv = xs[i];
                for (var rr = 0u; rr < RPT; rr++) {
                    let v = wv[rr][i];
                    s[rr] = fma(v.x, xv.x, s[rr]);
                    s[rr] = fma(v.y, xv.y, s[rr]);
                    s[rr] = fma(v.z, xv.z, s[rr]);
                    s[rr] = fma(v.w, xv.w, s[rr]);
                }
            }
        } else {
            s = short_unit(wv, k0, c);
        }
        for (var rr = 0u; rr < RPT; rr++) {
            o[rr * MAXC + c] = s[rr];
        }
    }
    return o;
}

// Steps 4i .. 4i + 3 of every chain of unit_partials.
fn unit_vec4(
    o_in: array<f32, NO>,
    wv: array<array<vec4<f32>, 8>, RPT>,
    xp: array<XPart, MAXC>,
    i: u32,
) -> array<f32, NO> {
    var o = o_in;
    var xv: array<vec4<f32>, MAXC>;
    for (var c = 0u; c < MAXC; c++) {
        xv[c] = unit_x_at(xp[c], i);
    }
    for (var c = 0u; c < MAXC; c++) {
        for (var rr = 0u; rr < RPT; rr++) {
            o[rr * MAXC + c] = fma(wv[rr][i].x, xv[c].x, o[rr * MAXC + c]);
        }
    }
    for (var c = 0u; c < MAXC; c++) {
        for (var rr = 0u; rr < RPT; rr++) {
            o[rr * MAXC + c] = fma(wv[rr][i].y, xv[c].y, o[rr * MAXC + c]);
        }
    }
    for (var c = 0u; c < MAXC; c++) {
        for (var rr = 0u; rr < RPT; rr++) {
            o[rr * MAXC + c] = fma(wv[rr][i].z, xv[c].z, o[rr * MAXC + c]);
        }
    }
    for (var c = 0u; c < MAXC; c++) {
        for (var rr = 0u; rr < RPT; rr++) {
            o[rr * MAXC + c] = fma(wv[rr][i].w, xv[c].w, o[rr * MAXC + c]);
        }
    }
    return o;
}

@compute @workgroup_size({{WG}})
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
    {{SG_PARAM}}
) {
    p = params;
    let first = wid.z * MAXC;
    p.ncols = min(params.ncols - first, MAXC);
    p.x_offset = params.x_offset + first * params.x_stride;
    p.y_offset = params.y_offset + first * params.y_stride;
    p.tab_first = params.tab_first + first;
    // RUNS = on: chunk z is a run of the table instead (its own matrix).
    let wshift = run_setup(wid.z);
    if (p.ncols == 0u) {
        return;
    }
    norm_prologue(li);
    let wg_id = wid.x + wid.y * nwg.x;
    let units = (p.k + 31u) / 32u;
    // Output rows: p.rows, or the `half` gate rows of a GLU.
    let half = p.rows / 2u;
    var r0 = wg_id * ROWS;
    if (GLU_ON || ROPE_ON) {
        r0 = wg_id * WG;
    }
    var rbase: array<u32, RPT>;
    for (var rr = 0u; rr < RPT; rr++) {
        // Rows past the end compute on the last row and are not written.
        if (ROPE_ON) {
            rbase[rr] = rope_rows(min(r0 + li, half - 1u))[rr] * p.row_bytes;
        } else if (GLU_ON) {
            rbase[rr] = (min(r0 + li, half - 1u) + rr * half) * p.row_bytes;
        } else {
            rbase[rr] = min(r0 + rr * WG + li, p.rows - 1u) * p.row_bytes;
        }
        rbase[rr] += wshift;
    }
    var root: array<f32, NO>;
#include "common/walk_{{WALK}}.wgsl"
    if (ROPE_ON) {
        let pi = r0 + li;
        for (var c = 0u; c < MAXC; c++) {
            if (c < p.ncols && pi < half) {
                rope_store(pi, c, root[c], root[MAXC + c]);
            }
        }
        return;
    }
    if (GLU_ON) {
        let r = r0 + li;
        for (var c = 0u; c < MAXC; c++) {
            if (c < p.ncols && r < half) {
                y[p.y_offset + c * p.y_stride + r] = {{GLU}}(root[c]) * root[MAXC + c];
            }
        }
        return;
    }
    for (var rr = 0u; rr < RPT; rr++) {
        let r = r0 + rr * WG + li;
        for (var c = 0u; c < MAXC; c++) {
            if (c < p.ncols && r < p.rows) {
                let i = p.y_offset + c * p.y_stride + p.row_offset + r;
                y[i] = add_epilogue(i, root[rr * MAXC + c]);
            }
        }
    }
    norm_epilogue(li, nwg.x * nwg.y);
}
