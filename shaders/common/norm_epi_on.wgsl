// The mat-vec's RMSNorm epilogue (NE = on), for CPU-backed devices: the
// product was added to y (the residual add, ADD), and the workgroup that
// finishes last norms the whole new hidden state into `ne_out`, with
// add_rms_norm.wgsl's operations (the canonical reduction of
// common/rms.wgsl over the 64 invocations of this workgroup), so the next
// product reads it as it would after the separate add + norm kernel: the
// same bits, one dispatch fewer. A CPU-backed device pays tens of
// microseconds per dispatch; a hardware GPU folds the norm into the
// consumer's prologue instead (xnorm_on.wgsl).
//
// Which workgroup is last: each one, after its rows are stored, counts
// itself in `ne_count[0]`; the one that reads n_wg - 1 has every other
// workgroup's rows before it, norms, and sets the count back to zero for
// the next dispatch. Nothing waits on another workgroup, so no forward
// progress between workgroups is assumed. WGSL's atomics are relaxed and
// its barriers workgroup-wide, so seeing the other workgroups' stores here
// rests on the device: ops/matmul.rs enables this only on CPU-backed
// devices, whose workgroups are threads of one process sharing memory and
// whose atomic read-modify-writes are full fences (lavapipe compiles them
// sequentially consistent); the fused tests check the bits there.

@group(0) @binding({{EB}}) var<storage, read> ne_w: array<f32>;
@group(0) @binding({{EB1}}) var<storage, read_write> ne_out: array<f32>;
@group(0) @binding({{EB2}}) var<storage, read_write> ne_count: array<atomic<u32>>;

var<workgroup> ne_last: u32;

#include "common/rms.wgsl"

// Every invocation calls it, in uniform control flow, after its stores.
fn norm_epilogue(li: u32, n_wg: u32) {
    storageBarrier();
    if (li == 0u) {
        ne_last = u32(atomicAdd(&ne_count[0], 1u) == n_wg - 1u);
    }
    if (workgroupUniformLoad(&ne_last) == 0u) {
        return;
    }
    let dim = p.rows;
    for (var c = 0u; c < p.ncols; c++) {
        let base = p.y_offset + c * p.y_stride;
        var t = 0.0;
        for (var i = li; i < dim; i += RMS_P) {
            let v = y[base + i];
            t = fma(v, v, t);
        }
        rms_red[li] = t;
        rms_tree(li, 1u);
        let scale = rms_scale(0u, dim, p.eps);
        // Every invocation has read the root before `rms_red` is reused.
        workgroupBarrier();
        for (var i = li; i < dim; i += RMS_P) {
            ne_out[c * dim + i] = (y[base + i] * scale) * ne_w[i];
        }
    }
    if (li == 0u) {
        atomicStore(&ne_count[0], 0u);
    }
}
