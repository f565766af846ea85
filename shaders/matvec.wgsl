// y[c][r] = sum_k W[r][k] * x[c][k] for NCOLS = {{NCOLS}} activation columns
// (1: decode mat-vec; 2..8: the small-batch variant that decodes each weight
// once for all columns). W is type {{TYPE}}, kept in its ggml blocks.
//
// A workgroup owns ROWS rows; each row has LANES lanes. Lane l sums the
// 32-weight units l, l + LANES, l + 2*LANES ... in increasing order, each
// unit's partial computed by unit_dot; then the lanes are combined by the
// fixed tree v[l] += v[l + s] for s = LANES/2 .. 1. This is the canonical
// order that matmul_tiled.wgsl reproduces (crates/gpu/src/ops.rs).

#include "common/params.wgsl"

@group(0) @binding(0) var<storage, read> w: array<u32>;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<uniform> p: MatParams;

#include "common/bytes.wgsl"
#include "quant/{{TYPE}}.wgsl"
#include "common/unit_dot.wgsl"

const NCOLS: u32 = {{NCOLS}}u;
const LANES: u32 = 32u;
const WG: u32 = 256u;
const ROWS: u32 = WG / LANES;

var<workgroup> red: array<f32, WG * NCOLS>;

@compute @workgroup_size(256)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
) {
    let lane = li % LANES;
    let r = (wid.x + wid.y * nwg.x) * ROWS + li / LANES;
    var acc: array<f32, NCOLS>;
    if (r < p.rows) {
        let row = r * p.row_bytes;
        let units = (p.k + 31u) / 32u;
        for (var u = lane; u < units; u += LANES) {
            let lo = dq16(row, 2u * u);
            let hi = dq16(row, 2u * u + 1u);
            for (var c = 0u; c < NCOLS; c++) {
                acc[c] = acc[c] + unit_dot(lo, hi, p.x_offset + c * p.x_stride, 32u * u);
            }
        }
    }
    for (var c = 0u; c < NCOLS; c++) {
        red[c * WG + li] = acc[c];
    }
    workgroupBarrier();
    for (var s = LANES / 2u; s > 0u; s >>= 1u) {
        if (lane < s) {
            for (var c = 0u; c < NCOLS; c++) {
                let i = c * WG + li;
                red[i] = red[i] + red[i + s];
            }
        }
        workgroupBarrier();
    }
    if (lane == 0u && r < p.rows) {
        for (var c = 0u; c < NCOLS; c++) {
            y[p.y_offset + c * p.y_stride + p.row_offset + r] = red[c * WG + li];
        }
    }
}
