// Row lookup (token embedding): y[i][k] = W[ids[i]][k] dequantized to f32,
// for the ids that fall in this weight chunk (rows row_start .. +rows).
// W is type {{TYPE}}. One invocation per 16 weights of one looked-up row.

#include "common/params.wgsl"

@group(0) @binding(0) var<storage, read> w: array<u32>;
@group(0) @binding(1) var<storage, read> ids: array<u32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
#include "common/w4_{{W4}}.wgsl"
@group(0) @binding({{PB}}) var<uniform> p: RowsParams;

#include "common/bytes.wgsl"
#include "quant/{{TYPE}}.wgsl"

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let g = gid.x;
    let i = gid.y + 65535u * gid.z;
    if (i >= p.n_ids || 16u * g >= p.k) {
        return;
    }
    let id = ids[i];
    if (id < p.row_start || id - p.row_start >= p.rows) {
        return;
    }
    let v = dq16((id - p.row_start) * p.row_bytes, g);
    let base = i * p.k + 16u * g;
    let n = min(16u, p.k - 16u * g);
    for (var j = 0u; j < n; j++) {
        y[base + j] = v[j >> 2u][j & 3u];
    }
}
