// Y = W X for many activation columns (prompt batches); W is type {{TYPE}}.
//
// A workgroup owns a tile of TR = 64 rows x TC = 64 columns. Thread
// (row group g = li / 32, lane c = li % 32) computes RT = 8 rows
// (g * RT ..) for the two columns c and c + 32: 16 outputs, each walked
// through the canonical lanes as matvec_rows.wgsl walks them (the 5-bit
// reversal of 0 .. 31, each finished lane folded into a binary counter of
// five levels), so every output gets the mat-vec kernel's bits without
// holding 32 lane partials (common/lane_fold.wgsl, the fold they share).
//
// The walk is uniform, so the workgroup stages each unit together: the 64
// rows' 32 weights, dequantized once (`ws`, 8 KiB), and the 64 columns'
// 32 activations (`xs`, 8 KiB), both in workgroup memory. Then every
// weight a thread loads feeds its two columns and every activation its
// eight rows: per 4 weights, 8 + 2 vec4 loads for 64 fmas. The 32 threads
// of a subgroup (one row group) load the same weights, a broadcast; the
// activations are stored vec4-major (`xs[i * TC + col]`), so consecutive
// threads read consecutive vec4s without bank conflicts. 16 KiB in all:
// within every Vulkan device's guaranteed workgroup storage. A tile whose
// second 32 columns are past the end (a step of 9 to 32 columns, or a
// prompt's last tile) skips their fmas.
//
// Why not keep a lane per thread (32 partials per output, combined at the
// end): the threads of a subgroup then walk 32 different units, so their
// activation loads are 128 bytes apart and their weight loads hit one
// memory bank, and nothing of the activations can be staged (a step spans
// 1024 values per column).

#include "common/params.wgsl"

@group(0) @binding(0) var<storage, read> w: array<u32>;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
#include "common/w4_{{W4}}.wgsl"
@group(0) @binding({{PB}}) var<uniform> p: MatParams;

#include "common/bytes.wgsl"
#include "quant/{{TYPE}}.wgsl"

const WG: u32 = 256u;
const RT: u32 = 8u;                  // rows per thread
const TR: u32 = (WG / 32u) * RT;     // rows per tile (64)
const TC: u32 = 64u;                 // columns per tile (two per thread)
const NO: u32 = 2u * RT;             // outputs per thread: o = cc * RT + rr
// Whether a row can end in a short unit (float types, K not a multiple of
// 32): for the block types the short path below is dead code, dropped
// before the driver compiles it.
const SHORT_UNITS: bool = {{SHORT_UNITS}};

// Unit u's weights of the tile's rows (row t at t * 8 .. t * 8 + 7) and its
// activations of the tile's columns (vec4 i of column c at i * TC + c).
var<workgroup> ws: array<vec4<f32>, 512>;
var<workgroup> xs: array<vec4<f32>, 512>;

// Stages unit u: threads 0 .. 127 dequantize half (li % 2) of row li / 2,
// threads 128 .. 255 load half (q / 64) of column q % 64 (q = li - 128).
// Rows and columns past the end read the last ones (valid memory, never
// written back); activations past k read as zero.
fn stage(li: u32, r0: u32, c0: u32, u: u32) {
    if (li < 128u) {
        let t = li >> 1u;
        let h = li & 1u;
        let r = min(r0 + t, p.rows - 1u);
        let v = dq16(r * p.row_bytes, 2u * u + h);
        for (var i = 0u; i < 4u; i++) {
            ws[t * 8u + 4u * h + i] = v[i];
        }
    } else {
        let q = li - 128u;
        let c = q % TC;
        let h = q / TC;
        let xb = p.x_offset + min(c0 + c, p.ncols - 1u) * p.x_stride;
        for (var i = 4u * h; i < 4u * h + 4u; i++) {
            var v: vec4<f32>;
            for (var e = 0u; e < 4u; e++) {
                let kk = 32u * u + 4u * i + e;
                v[e] = select(0.0, x[xb + min(kk, p.k - 1u)], kk < p.k);
            }
            xs[i * TC + c] = v;
        }
    }
}

@compute @workgroup_size(256)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
) {
    // Whole workgroups leave together, so the barriers below stay uniform.
    let rt = wid.x + wid.y * nwg.x;
    if (rt * TR >= p.rows) {
        return;
    }
    let r0 = rt * TR;
    let c0 = wid.z * TC;
    let g = li / 32u;
    let lane = li % 32u;
    let units = (p.k + 31u) / 32u;
    // Whether the tile's second 32 columns hold any (uniform): a step of up
    // to 32 columns (decodes beside a prompt chunk) skips their fmas.
    let second = c0 + 32u < p.ncols;

    var l0: array<f32, NO>;
    var l1: array<f32, NO>;
    var l2: array<f32, NO>;
    var l3: array<f32, NO>;
    var l4: array<f32, NO>;
    // Lane m's partial; after the last lane (j = 31, which folds through
    // every level), the root. (Declared here rather than a `root` array
    // that would hold 16 more registers through the whole walk.)
    var t: array<f32, NO>;
    for (var j = 0u; j < 32u; j++) {
        let m = reverseBits(j) >> 27u;
        // Canonical lane m's partial of each output: its units in
        // increasing order, each an fma chain over its weights.
        t = array<f32, NO>();
        for (var u = m; u < units; u += 32u) {
            stage(li, r0, c0, u);
            workgroupBarrier();
            var s: array<f32, NO>;
            let n = min(32u, p.k - 32u * u);
            // 8 in the whole-unit paths (there p.k >= 32), as a bound the
            // compiler cannot fold: the vec4 loop stays a loop of 8 (64
            // fmas each, the rows unrolled), where unrolled it tripled the
            // kernel's compile time on lavapipe for nothing a GPU needs.
            let nv = min(8u, p.k);
            if ((!SHORT_UNITS || n == 32u) && second) {
                for (var i = 0u; i < nv; i++) {
                    let xa = xs[i * TC + lane];
                    let xb = xs[i * TC + lane + 32u];
                    for (var rr = 0u; rr < RT; rr++) {
                        let wv = ws[(g * RT + rr) * 8u + i];
                        s[rr] = fma(wv.x, xa.x, s[rr]);
                        s[rr] = fma(wv.y, xa.y, s[rr]);
                        s[rr] = fma(wv.z, xa.z, s[rr]);
                        s[rr] = fma(wv.w, xa.w, s[rr]);
                        s[RT + rr] = fma(wv.x, xb.x, s[RT + rr]);
                        s[RT + rr] = fma(wv.y, xb.y, s[RT + rr]);
                        s[RT + rr] = fma(wv.z, xb.z, s[RT + rr]);
                        s[RT + rr] = fma(wv.w, xb.w, s[RT + rr]);
                    }
                }
            } else if (!SHORT_UNITS || n == 32u) {
                // The first 32 columns only (the same chains as above).
                for (var i = 0u; i < nv; i++) {
                    let xa = xs[i * TC + lane];
                    for (var rr = 0u; rr < RT; rr++) {
                        let wv = ws[(g * RT + rr) * 8u + i];
                        s[rr] = fma(wv.x, xa.x, s[rr]);
                        s[rr] = fma(wv.y, xa.y, s[rr]);
                        s[rr] = fma(wv.z, xa.z, s[rr]);
                        s[rr] = fma(wv.w, xa.w, s[rr]);
                    }
                }
            } else {
                // A float row's short last unit: its valid weights only.
                for (var jj = 0u; jj < n; jj++) {
                    let i = jj / 4u;
                    let e = jj % 4u;
                    let xa = xs[i * TC + lane][e];
                    let xb = xs[i * TC + lane + 32u][e];
                    for (var rr = 0u; rr < RT; rr++) {
                        let wv = ws[(g * RT + rr) * 8u + i][e];
                        s[rr] = fma(wv, xa, s[rr]);
                        if (second) {
                            s[RT + rr] = fma(wv, xb, s[RT + rr]);
                        }
                    }
                }
            }
            for (var o = 0u; o < NO; o++) {
                t[o] = t[o] + s[o];
            }
            // The next unit's staging overwrites what this one read.
            workgroupBarrier();
        }
        // Fold lane j into the counter (j is uniform: no divergence).
#include "common/lane_fold.wgsl"
    }

    for (var cc = 0u; cc < 2u; cc++) {
        let col = c0 + lane + 32u * cc;
        for (var rr = 0u; rr < RT; rr++) {
            let row = r0 + g * RT + rr;
            if (col < p.ncols && row < p.rows) {
                y[p.y_offset + col * p.y_stride + p.row_offset + row] = t[cc * RT + rr];
            }
        }
    }
}
