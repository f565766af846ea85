// y[j * dim + c] = x[table[table_at + j] * dim + c] for j < m: copies the
// columns a table names into its order (a step's inputs packed by expert,
// moe_pack.wgsl). Columns the table names past x read clamped, as every
// out-of-range load does.

#include "common/params.wgsl"

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read> table: array<u32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<uniform> p: GatherParams;

@compute @workgroup_size(256)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
) {
    let i = (wid.x + wid.y * nwg.x) * 256u + li;
    if (i >= p.m * p.dim) {
        return;
    }
    let j = i / p.dim;
    y[i] = x[table[p.table_at + j] * p.dim + i % p.dim];
}
