// matvec_rows.wgsl's walk in unit groups (WALK = groups) for a type whose UG
// adjacent units share their quant words (quant/*.wgsl's `dqg_load` and
// `dqg_unit`: Q6_K's four units of a 128-weight half read the same 64 low
// and 32 high bytes, Q4_K's two sub-blocks of a pair the same 32 bytes of
// nibbles). Unit u belongs to lane u % 32, so the UG units u0 .. u0 + UG - 1
// (u0 a multiple of UG) are lanes UG·m + r for r < UG: the lanes fall into
// UG classes r, each holding 32 / UG lanes m. (UG is 2 or 4: the counter
// below has four levels.)
//
// The canonical tree (v[l] = v[l] + v[l + s], s = 16 .. 1) first pairs lanes
// of one class (s = 16 .. UG pair m with m + s / UG), and only its last
// steps (s = UG / 2 .. 1) combine the classes' roots. So each class folds its
// lanes into its own counter, in the order its 2^CLB-lane tree consumes them
// (the CLB-bit reversal of m), every class of a group at once; then the
// roots meet in the tree's own last steps. The same operations as
// walk_lanes.wgsl, in another order of evaluation: the same bits, with each
// shared word loaded once per group instead of once per unit.

    const CL: u32 = 32u / UG;
    const GO: u32 = UG * NO;
    var l0: array<f32, GO>;
    var l1: array<f32, GO>;
    var l2: array<f32, GO>;
    var l3: array<f32, GO>;
    var roots: array<f32, GO>;
    for (var j = 0u; j < CL; j++) {
        let m = reverseBits(j) >> (32u - CLB);
        // Class r's lane UG·m + r: its partial of output o at r * NO + o.
        // (Rows of a grouping type hold whole groups.)
        var t: array<f32, GO>;
        for (var u0 = UG * m; u0 < units; u0 += 32u) {
            var gw: array<Group, RPT>;
            for (var rr = 0u; rr < RPT; rr++) {
                gw[rr] = dqg_load(rbase[rr], u0);
            }
            for (var r = 0u; r < UG; r++) {
                var wv: array<array<vec4<f32>, 8>, RPT>;
                for (var rr = 0u; rr < RPT; rr++) {
                    wv[rr] = dqg_unit(gw[rr], r);
                }
                let s = unit_partials(wv, u0 + r, {{SG_LANE}});
                for (var o = 0u; o < NO; o++) {
                    t[r * NO + o] = t[r * NO + o] + s[o];
                }
            }
        }
        // Fold lane m of every class into its counter (j is uniform).
        if ((j & 1u) == 0u) {
            l0 = t;
            continue;
        }
        for (var o = 0u; o < GO; o++) {
            t[o] = l0[o] + t[o];
        }
        if ((j & 2u) == 0u) {
            l1 = t;
            continue;
        }
        for (var o = 0u; o < GO; o++) {
            t[o] = l1[o] + t[o];
        }
        if ((j & 4u) == 0u) {
            l2 = t;
            continue;
        }
        for (var o = 0u; o < GO; o++) {
            t[o] = l2[o] + t[o];
        }
        if (CL == 8u) {
            roots = t;
            continue;
        }
        if ((j & 8u) == 0u) {
            l3 = t;
            continue;
        }
        for (var o = 0u; o < GO; o++) {
            roots[o] = l3[o] + t[o];
        }
    }
    // The tree's last steps: v[r] = v[r] + v[r + s] for s = UG / 2 .. 1.
    for (var s = UG / 2u; s >= 1u; s /= 2u) {
        for (var r = 0u; r < s; r++) {
            for (var o = 0u; o < NO; o++) {
                roots[r * NO + o] = roots[r * NO + o] + roots[(r + s) * NO + o];
            }
        }
    }
    for (var o = 0u; o < NO; o++) {
        root[o] = roots[o];
    }
