// matvec_rows.wgsl's walk over the 32 canonical lanes one at a time (WALK =
// lanes), in the order the tree consumes them, each lane's partial folded
// into a five-level binary counter (see the kernel's header). Sets `root`.

    var l0: array<f32, NO>;
    var l1: array<f32, NO>;
    var l2: array<f32, NO>;
    var l3: array<f32, NO>;
    var l4: array<f32, NO>;
    for (var j = 0u; j < 32u; j++) {
        let lane = reverseBits(j) >> 27u;
        // Lane `lane`'s partial of each output: its units in increasing order.
        var t: array<f32, NO>;
        for (var u = lane; u < units; u += 32u) {
            var wv: array<array<vec4<f32>, 8>, RPT>;
            for (var rr = 0u; rr < RPT; rr++) {
                wv[rr] = dq32(rbase[rr], u);
            }
            let s = unit_partials(wv, u, {{SG_LANE}});
            for (var o = 0u; o < NO; o++) {
                t[o] = t[o] + s[o];
            }
        }
        // Fold lane j into the counter (j is uniform: no divergence).
#include "common/lane_fold.wgsl"
        root = t;
    }
