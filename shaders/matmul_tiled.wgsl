// Y = W X for many activation columns (prompt batches); W is type {{TYPE}}.
//
// A workgroup owns a tile of TR rows x TC columns and walks the row in steps
// of LANES units (32 weights each). Each step, the workgroup dequantizes the
// TR x LANES units into workgroup memory once; then thread (lane l, column
// group cg) takes unit l of the step for all TR rows and its CPT columns, so
// every dequantized weight is reused by TC columns. Per output, lane l sees
// units l, l + LANES, ... in increasing order, each unit summed as
// fma(w[j], x[j], s) for j ascending, and the lanes are combined by
// lane_tree as in matvec.wgsl: the result is bit-identical to the mat-vec
// product.

#include "common/params.wgsl"

@group(0) @binding(0) var<storage, read> w: array<u32>;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
#include "common/w4_{{W4}}.wgsl"
@group(0) @binding({{PB}}) var<uniform> p: MatParams;

#include "common/bytes.wgsl"
#include "quant/{{TYPE}}.wgsl"
#include "common/lane_tree.wgsl"

const LANES: u32 = 32u;
const WG: u32 = 256u;
const TR: u32 = 4u;                  // rows per tile
const CG: u32 = WG / LANES;          // column groups
const CPT: u32 = 8u;                 // columns per thread
const TC: u32 = CG * CPT;            // columns per tile (64)
const ACC: u32 = TR * CPT;

// TR x LANES units x 32 weights during the walk (16 KiB); reused for the
// lane partials of two tile rows at the end (2 x TC x LANES values).
var<workgroup> wgmem: array<f32, 4096>;

@compute @workgroup_size(256)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
) {
    let rt = wid.x + wid.y * nwg.x;
    if (rt * TR >= p.rows) {
        return;
    }
    let r0 = rt * TR;
    let c0 = wid.z * TC + (li / LANES) * CPT;
    let lane = li % LANES;
    let units = (p.k + 31u) / 32u;
    let steps = (units + LANES - 1u) / LANES;

    // Column bases, clamped so idle columns read valid memory.
    var xb: array<u32, CPT>;
    for (var i = 0u; i < CPT; i++) {
        xb[i] = p.x_offset + min(c0 + i, p.ncols - 1u) * p.x_stride;
    }

    var acc: array<f32, ACC>;
    for (var st = 0u; st < steps; st++) {
        // Dequantize: thread li decodes half (li % 2) of unit (li / 2) % 32 of tile row li / 64.
        {
            let tr = li / 64u;
            let ul = (li >> 1u) & 31u;
            let h = li & 1u;
            let u = st * LANES + ul;
            if (r0 + tr < p.rows && u < units) {
                let v = dq16((r0 + tr) * p.row_bytes, 2u * u + h);
                let base = (tr * LANES + ul) * 32u + 16u * h;
                for (var i = 0u; i < 4u; i++) {
                    wgmem[base + 4u * i] = v[i].x;
                    wgmem[base + 4u * i + 1u] = v[i].y;
                    wgmem[base + 4u * i + 2u] = v[i].z;
                    wgmem[base + 4u * i + 3u] = v[i].w;
                }
            }
        }
        workgroupBarrier();
        let u = st * LANES + lane;
        // Column groups wholly past the last column have nothing to compute.
        if (u < units && c0 < p.ncols) {
            let k0 = 32u * u;
            let n = min(32u, p.k - k0);
            var s: array<f32, ACC>;
            for (var j = 0u; j < n; j++) {
                var wr: array<f32, TR>;
                for (var t = 0u; t < TR; t++) {
                    wr[t] = wgmem[(t * LANES + lane) * 32u + j];
                }
                for (var i = 0u; i < CPT; i++) {
                    let xv = x[xb[i] + k0 + j];
                    for (var t = 0u; t < TR; t++) {
                        s[t * CPT + i] = fma(wr[t], xv, s[t * CPT + i]);
                    }
                }
            }
            for (var q = 0u; q < ACC; q++) {
                acc[q] = acc[q] + s[q];
            }
        }
        workgroupBarrier();
    }

    // Lane partials of two tile rows at a time; then invocation o < 2 * TC
    // combines output (row o / TC, column o % TC) with lane_tree.
    let slot = (li / LANES) * CPT;
    for (var h = 0u; h < TR; h += 2u) {
        for (var t = 0u; t < 2u; t++) {
            for (var i = 0u; i < CPT; i++) {
                wgmem[(t * TC + slot + i) * LANES + lane] = acc[(h + t) * CPT + i];
            }
        }
        workgroupBarrier();
        let row = r0 + h + li / TC;
        let col = wid.z * TC + li % TC;
        if (li < 2u * TC && row < p.rows && col < p.ncols) {
            y[p.y_offset + col * p.y_stride + p.row_offset + row] = lane_tree(li * LANES);
        }
        workgroupBarrier();
    }
}
