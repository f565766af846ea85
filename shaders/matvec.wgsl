// y[c][r] = sum_k W[r][k] * x[c][k] for p.ncols <= MAXC = {{MAXC}} activation
// columns (MAXC 1: the decode mat-vec; 8: the small-batch variant that
// decodes each weight once for all columns). W is type {{TYPE}}, kept in its
// ggml blocks.
//
// A workgroup owns ROWS rows; each row has LANES lanes. Lane l sums the
// 32-weight units l, l + LANES, l + 2*LANES ... in increasing order, each
// unit's partial computed by unit_dot; then the lanes are combined by
// lane_tree. This is the canonical order that matmul_tiled.wgsl reproduces
// (crates/gpu/src/ops.rs).

#include "common/params.wgsl"

@group(0) @binding(0) var<storage, read> w: array<u32>;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<uniform> p: MatParams;

#include "common/bytes.wgsl"
#include "quant/{{TYPE}}.wgsl"
#include "common/unit_dot.wgsl"
#include "common/lane_tree.wgsl"

const MAXC: u32 = {{MAXC}}u;
const LANES: u32 = 32u;
const WG: u32 = 256u;
const ROWS: u32 = WG / LANES;

// Lane partials: column c of local row rl, lane l at c * WG + rl * LANES + l.
var<workgroup> wgmem: array<f32, WG * MAXC>;

@compute @workgroup_size(256)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
) {
    let lane = li % LANES;
    let r = (wid.x + wid.y * nwg.x) * ROWS + li / LANES;
    var acc: array<f32, MAXC>;
    if (r < p.rows) {
        let row = r * p.row_bytes;
        let units = (p.k + 31u) / 32u;
        for (var u = lane; u < units; u += LANES) {
            let lo = dq16(row, 2u * u);
            let hi = dq16(row, 2u * u + 1u);
            for (var c = 0u; c < MAXC; c++) {
                if (c < p.ncols) {
                    acc[c] = acc[c] + unit_dot(lo, hi, p.x_offset + c * p.x_stride, 32u * u);
                }
            }
        }
    }
    for (var c = 0u; c < MAXC; c++) {
        if (c < p.ncols) {
            wgmem[c * WG + li] = acc[c];
        }
    }
    workgroupBarrier();
    // Lane c of each row combines column c.
    if (lane < p.ncols && r < p.rows) {
        let v = lane_tree(lane * WG + li - lane);
        y[p.y_offset + lane * p.y_stride + p.row_offset + r] = v;
    }
}
