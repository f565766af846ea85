// The canonical partial of one 32-weight unit against one activation column.
// Every mat-vec and mat-mul variant computes each unit's contribution with
// exactly this sequence of operations, which is what makes column j of an
// N-column product bit-identical to the 1-column product (see
// crates/gpu/src/ops/matmul.rs for the whole reduction order):
//
//     s = 0;  for j in 0..32 (ascending): s = fma(w[j], x[j], s)
//
// `lo`/`hi` are weights 0..15 and 16..31 of the unit as `dq16` decodes them,
// `xb` the index of the column's first activation, `k0` the unit's first
// weight within the row. A row whose length is not a multiple of 32 (float
// types only) ends in a short unit, summed over its valid weights only.
// Explicit fma everywhere: no multiply feeds an add, so a compiler has no
// contraction choice to make differently in different kernels.

fn unit_dot(lo: array<vec4<f32>, 4>, hi: array<vec4<f32>, 4>, xb: u32, k0: u32) -> f32 {
    var s = 0.0;
    if (k0 + 32u <= p.k) {
        let a = xb + k0;
        for (var i = 0u; i < 4u; i++) {
            let v = lo[i];
            let b = a + 4u * i;
            s = fma(v.x, x[b], s);
            s = fma(v.y, x[b + 1u], s);
            s = fma(v.z, x[b + 2u], s);
            s = fma(v.w, x[b + 3u], s);
        }
        for (var i = 0u; i < 4u; i++) {
            let v = hi[i];
            let b = a + 16u + 4u * i;
            s = fma(v.x, x[b], s);
            s = fma(v.y, x[b + 1u], s);
            s = fma(v.z, x[b + 2u], s);
            s = fma(v.w, x[b + 3u], s);
        }
    } else {
        let n = p.k - k0;
        for (var j = 0u; j < n; j++) {
            var v = lo[(j >> 2u) & 3u];
            if (j >= 16u) {
                v = hi[(j >> 2u) & 3u];
            }
            s = fma(v[j & 3u], x[xb + k0 + j], s);
        }
    }
    return s;
}
