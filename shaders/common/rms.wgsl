// The canonical RMSNorm reduction, shared by every kernel that norms
// (rms_norm, add_rms_norm, head_norm and the mat-vecs' norm prologue), so a
// fused norm gives the bits of rms_norm.wgsl. RMS_P = 64 partials: partial
// j is the fma chain of v * v over elements j, j + 64, j + 128 ... in
// increasing order; a tree v[j] = v[j] + v[j + s] for s = 32 .. 1 joins
// them; the scale is 1 / sqrt(v[0] / dim + eps). 64 rather than a
// workgroup of 256: the mat-vec workgroups that fold the norm into their
// prologue have 64 invocations on CPU-backed devices, and a 64-element
// tree costs two barriers fewer.
//
// The includer declares `var<workgroup> rms_red: array<f32, 64 * C>` for
// C columns; invocations 0 .. 63 store column c's partial j at c * 64 + j,
// then every invocation calls rms_tree (a barrier inside: uniform control
// flow) and reads rms_scale.

const RMS_P: u32 = 64u;

fn rms_tree(li: u32, cols: u32) {
    workgroupBarrier();
    for (var s = 32u; s > 0u; s >>= 1u) {
        if (li < s) {
            for (var c = 0u; c < cols; c++) {
                let j = c * RMS_P + li;
                rms_red[j] = rms_red[j] + rms_red[j + s];
            }
        }
        workgroupBarrier();
    }
}

fn rms_scale(c: u32, dim: u32, eps: f32) -> f32 {
    return 1.0 / sqrt(rms_red[c * RMS_P] / f32(dim) + eps);
}
