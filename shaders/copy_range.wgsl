// dst[dst_offset + i] = src[src_offset + i] for i < n (32-bit elements), so
// a copy can sit in the same compute pass as the kernels around it.

#include "common/params.wgsl"

@group(0) @binding(0) var<storage, read> src: array<u32>;
@group(0) @binding(1) var<storage, read_write> dst: array<u32>;
@group(0) @binding(2) var<uniform> p: CopyParams;

@compute @workgroup_size(256)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
) {
    let i = (wid.x + wid.y * nwg.x) * 256u + li;
    if (i < p.n) {
        dst[p.dst_offset + i] = src[p.src_offset + i];
    }
}
